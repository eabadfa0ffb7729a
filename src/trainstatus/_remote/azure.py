"""The status document as one Azure blob: the azure-storage-blob adapter of ``_remote.object_store``.

Each write is a Put Blob with ``If-Match: <ETag last read or written>``, or ``If-None-Match: *``
(only if there is no blob). A stale ``If-Match`` is ``412``; a create over an existing blob is
``409 BlobAlreadyExists`` (as on real Azure and Azurite): both are a lost race. Uploads are sent
once (``retry_total=0``): a retry refused because its own first try landed would look like a lost
race, whose merge would apply the change twice. Reads keep a few retries.

URLs as adlfs takes them: ``az://<container>/<blob>`` and ``abfs[s]://<container>/<blob>`` with
the account in ``storage_options`` (``account_name`` or ``connection_string``), or
``abfs[s]://<container>@<account>.dfs.core.windows.net/<blob>`` with the account in the URL.
Without options, adlfs's environment applies: ``AZURE_STORAGE_CONNECTION_STRING``,
``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``, ``AZURE_STORAGE_SAS_TOKEN``.

azure-storage-blob is imported only when such a store is opened (``pip install "trainstatus[azure]"``).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from typing import Any

from .._errors import TrainingStatusTypeError, TrainingStatusValueError
from .object_store import (
    CONFLICT,
    CONTAINER,
    DENIED,
    ERROR,
    FOREIGN,
    MISSING,
    Failure,
    ObjectStorage,
    check_options,
    import_sdk,
)

__all__ = ["AzureBlob"]

# storage_options, named as adlfs names them; credential is checked below.
_KINDS: dict[str, Any] = {"account_name": str, "account_key": str, "connection_string": str, "sas_token": str,
                          "credential": None, "account_host": str}
_ENVIRONMENT = {"connection_string": "AZURE_STORAGE_CONNECTION_STRING", "account_name": "AZURE_STORAGE_ACCOUNT_NAME",
                "account_key": "AZURE_STORAGE_ACCOUNT_KEY", "sas_token": "AZURE_STORAGE_SAS_TOKEN"}
# azure-storage-blob's default retries wait 15 s, then 18 s, 24 s... (about 90 s before an
# unreachable endpoint is reported) after a connection timeout of 300 s.
_CLIENT_ARGS: dict[str, Any] = {"connection_timeout": 5, "read_timeout": 30}
_READ_RETRIES = 2  # after about 1 s, then 3 s (uploads are never retried: see the module doc)


def _split(url: str) -> tuple[str, str, str, str | None]:
    """(scheme, container, blob name, host or None) of an az://, abfs:// or abfss:// URL."""
    scheme, _, rest = url.partition("://")
    container, _, name = rest.partition("/")
    container, _, host = container.partition("@")
    if not container or not name or name.endswith("/") or "@" in rest.partition("/")[0] and not host:
        raise TrainingStatusValueError(
            f"{url!r} does not name a blob: use az://<container>/<blob> with the account in storage_options "
            "(account_name or connection_string), or abfs://<container>@<account>.dfs.core.windows.net/<blob>.",
            path=url,
        )
    return scheme.lower(), container, name, host or None


class AzureBlob(ObjectStorage):
    """A JSON document stored as one Azure blob (block blob)."""

    container_word = "container"

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        self.scheme, self.container, self.name, host = _split(url)
        self._prefix = url[:len(self.scheme) + 3 + len(url.partition("://")[2].partition("/")[0])]
        given = dict(storage_options or {})
        check_options(url, given, _KINDS, "adlfs")
        import_sdk(url, "azure.storage.blob", "azure-storage-blob", "azure")
        options = dict(given)
        if not given:
            options = {name: os.environ[variable] for name, variable in _ENVIRONMENT.items() if os.environ.get(variable)}
        self._client = self._make_client_from(url, options, host)
        self._client_pid = os.getpid()
        self.endpoint = self._client.url.partition('?')[0]  # no SAS token in it

    def _make_client_from(self, url: str, options: Mapping[str, Any], host: str | None) -> Any:
        from azure.storage.blob import BlobServiceClient

        self._options, self._host = options, host
        if options.get("connection_string") is not None:
            try:
                return BlobServiceClient.from_connection_string(options["connection_string"], **_client_args())
            except ValueError as exc:
                # The value holds the account key: named, never shown.
                raise TrainingStatusValueError(
                    f"storage_options['connection_string'] for {url} is refused by azure-storage-blob: {exc}. "
                    "Copy it whole from the portal (Access keys), as "
                    "'DefaultEndpointsProtocol=https;AccountName=...;AccountKey=...;EndpointSuffix=core.windows.net'.",
                    path=url,
                ) from exc
        account = options.get("account_name")
        url_account = host.split(".")[0] if host else None
        if account is not None and url_account is not None and account != url_account:
            raise TrainingStatusValueError(
                f"storage_options['account_name'] {account!r} is not the account {url_account!r} that {url} names; "
                "give one of them, or the same in both.",
                path=url,
            )
        account = account or url_account
        if options.get("account_host") is not None:
            account_url = f"https://{options['account_host']}"
        elif host is not None:
            account_url = f"https://{host.replace('.dfs.', '.blob.', 1)}"
        elif account is not None:
            account_url = f"https://{account}.blob.core.windows.net"
        else:
            raise TrainingStatusValueError(
                f"{url} names no storage account: give storage_options account_name (or connection_string), "
                "or write the URL as abfs://<container>@<account>.dfs.core.windows.net/<blob>.",
                path=url,
            )
        return BlobServiceClient(account_url, credential=self._credential(url, options, account), **_client_args())

    def _credential(self, url: str, options: Mapping[str, Any], account: str | None) -> Any:
        credential = options.get("credential")
        if credential is not None:
            from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

            if not (isinstance(credential, (str, AzureNamedKeyCredential, AzureSasCredential))
                    or callable(getattr(credential, "get_token", None))):
                raise TrainingStatusTypeError(
                    f"storage_options['credential'] must be a token credential (azure.identity's "
                    f"DefaultAzureCredential()...), an AzureNamedKeyCredential, an AzureSasCredential or a str, "
                    f"not {type(credential).__name__!r}, for {url}.",
                    path=url,
                )
            return credential
        key = options.get("account_key")
        if key is not None:
            try:
                base64.b64decode(key, validate=True)
            except (binascii.Error, ValueError):
                raise TrainingStatusValueError(
                    f"storage_options['account_key'] for {url} is not a base64 account key; copy key1 or key2 "
                    "from the storage account's Access keys.",
                    path=url,
                ) from None
            from azure.core.credentials import AzureNamedKeyCredential

            return AzureNamedKeyCredential(account or "", key)
        sas = options.get("sas_token")
        if sas is not None:
            if "sig=" not in sas:
                raise TrainingStatusValueError(
                    f"storage_options['sas_token'] for {url} is not a SAS token (it has no sig= field); give the "
                    "query string the portal or az storage container generate-sas prints.",
                    path=url,
                )
            return sas.lstrip("?")
        return None  # anonymous: a public container

    def _make_client(self) -> Any:
        return self._make_client_from(self.location, self._options, self._host)

    def url_of(self, name: str) -> str:
        return f"{self._prefix}/{name}"

    def _blob(self, client: Any, name: str) -> Any:
        return client.get_blob_client(self.container, name)

    def _get(self, client: Any) -> tuple[bytes, str]:
        downloader = self._blob(client, self.name).download_blob()
        data: bytes = downloader.readall()
        return data, str(downloader.properties.etag)

    def _head(self, client: Any) -> str:
        return str(self._blob(client, self.name).get_blob_properties().etag)

    def _put(self, client: Any, name: str, data: bytes, version: str | None) -> str:
        from azure.core import MatchConditions
        from azure.storage.blob import ContentSettings

        settings = ContentSettings(content_type="application/json")
        blob = self._blob(client, name)
        if version is None:
            answer = blob.upload_blob(data, overwrite=False, content_settings=settings, retry_total=0)
        else:
            answer = blob.upload_blob(data, overwrite=True, etag=version, match_condition=MatchConditions.IfNotModified,
                                      content_settings=settings, retry_total=0)
        return str(answer["etag"])

    def _delete(self, client: Any, name: str) -> None:
        self._blob(client, name).delete_blob(retry_total=0)

    def _classify(self, exc: BaseException, *, writing: bool) -> Failure:
        from azure.core import exceptions

        if isinstance(exc, exceptions.HttpResponseError):
            status = exc.status_code
            raw = getattr(exc, "error_code", None)
            code = str(getattr(raw, "value", raw) or "")
            if status == 412 or (writing and isinstance(exc, exceptions.ResourceExistsError)):
                return Failure(CONFLICT, status, code or "ConditionNotMet")
            if isinstance(exc, exceptions.ResourceNotFoundError):
                if code == "ContainerNotFound":
                    return Failure(CONTAINER, status, code)
                return Failure(MISSING, status, code)
            if isinstance(exc, exceptions.ClientAuthenticationError) or status in (401, 403):
                return Failure(DENIED, status, code or type(exc).__name__)
            return Failure(ERROR, status, code)
        if isinstance(exc, exceptions.ClientAuthenticationError):
            return Failure(DENIED, None, type(exc).__name__)
        if isinstance(exc, exceptions.AzureError) or isinstance(exc, (ConnectionError, TimeoutError)):
            return Failure(ERROR)
        return Failure(FOREIGN)

    def _create_advice(self) -> str:
        return f"create it (az storage container create --name {self.container}) or fix the URL"

    def _credentials_advice(self) -> str:
        return ("check the credentials (storage_options account_key, sas_token, connection_string or "
                "credential, or the AZURE_STORAGE_* environment) and the container's access policy")


def _client_args() -> dict[str, Any]:
    from azure.storage.blob import ExponentialRetry

    retry = ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=_READ_RETRIES, random_jitter_range=1)
    return {**_CLIENT_ARGS, "retry_policy": retry}
