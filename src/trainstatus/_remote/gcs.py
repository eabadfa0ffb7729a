"""The status document as one Google Cloud Storage object: the google-cloud-storage adapter of ``_remote.object_store``.

Each write is an upload with ``ifGenerationMatch=<generation last read or written>``, or
``ifGenerationMatch=0`` (only if there is no object); a lost race is ``412 Precondition Failed``.
A read takes the object's generation from the same response as its bytes (``x-goog-generation``),
so bytes and version always belong together.

Uploads are sent once (``retry=None``): google-cloud-storage would retry a conditional upload
whose answer was lost, and a retry refused because its own first try landed looks like a lost
race, whose merge would apply this change twice. Reads are retried for a few seconds.

google-cloud-storage is imported only when a ``gs://`` store is opened (``pip install "trainstatus[gcs]"``).
"""

from __future__ import annotations

import json
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

__all__ = ["GCSObject"]

# storage_options, named as gcsfs names them. token is checked by _credentials.
_KINDS: dict[str, Any] = {"project": str, "token": None, "endpoint_url": str}
_TOKEN_WORDS = ("google_default", "anon", "cloud")
_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write"]
_TIMEOUT = (5, 30)  # connect, read (s): the SDK's 60 s would make a set hang on an unreachable endpoint
_READ_RETRY_S = 5.0  # how long a read retries transient errors (a 503, a reset)


def _split(url: str) -> tuple[str, str, str]:
    scheme, _, rest = url.partition("://")
    bucket, _, name = rest.partition("/")
    if not bucket or not name or name.endswith("/"):
        raise TrainingStatusValueError(
            f"{url!r} does not name an object: use gs://<bucket>/<object>, e.g. "
            "gs://my-bucket/run/run_logs/training_status.json.",
            path=url,
        )
    return scheme.lower(), bucket, name


def _credentials(url: str, token: Any) -> Any:
    """google-auth credentials for gcsfs's ``token`` (None: the client's default)."""
    import google.auth
    import google.auth.credentials

    if token is None or token == "google_default":
        return None  # google.auth.default(), or none at all under STORAGE_EMULATOR_HOST
    if token == "anon":
        return google.auth.credentials.AnonymousCredentials()
    if token == "cloud":
        import google.auth.compute_engine

        return google.auth.compute_engine.Credentials()
    if isinstance(token, google.auth.credentials.Credentials):
        return token
    try:
        if isinstance(token, (str, os.PathLike)):
            path = os.fspath(token)
            if not os.path.isfile(path):
                raise TrainingStatusValueError(
                    f"storage_options['token'] {path!r} for {url} is neither one of "
                    f"{', '.join(map(repr, _TOKEN_WORDS))} nor a credentials file that exists. Give the path "
                    "of a service account's JSON key, or 'google_default' for the environment's credentials.",
                    path=url,
                )
            with open(path, encoding="utf-8") as f:
                token = json.load(f)
        if isinstance(token, Mapping):
            info = dict(token)
            # Only the two kinds gcsfs takes from a file or dict: google-auth's generic loader
            # would also run the commands an external-account file names.
            if info.get("type") == "authorized_user":
                import google.oauth2.credentials

                return google.oauth2.credentials.Credentials.from_authorized_user_info(info, _SCOPES)
            import google.oauth2.service_account

            return google.oauth2.service_account.Credentials.from_service_account_info(info, scopes=_SCOPES)
    except (ValueError, KeyError, google.auth.exceptions.GoogleAuthError) as exc:
        if isinstance(exc, TrainingStatusValueError):
            raise
        # The value itself is a secret: named by its kind only.
        raise TrainingStatusValueError(
            f"storage_options['token'] for {url} is refused by google-auth: {type(exc).__name__}: {exc}. "
            "Give a service account's JSON key (its path or its parsed dict), or 'google_default'.",
            path=url,
        ) from exc
    raise TrainingStatusTypeError(
        f"storage_options['token'] must be one of {', '.join(map(repr, _TOKEN_WORDS))}, the path of a "
        f"credentials file, a dict of one, or google-auth credentials, not {type(token).__name__!r}, for {url}.",
        path=url,
    )


class GCSObject(ObjectStorage):
    """A JSON document stored as one Google Cloud Storage object."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        self.scheme, self.container, self.name = _split(url)
        options = dict(storage_options or {})
        check_options(url, options, _KINDS, "gcsfs")
        import_sdk(url, "google.cloud.storage", "google-cloud-storage", "gcs")
        endpoint = options.get("endpoint_url")
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise TrainingStatusValueError(
                f"storage_options['endpoint_url'] {endpoint!r} for {url} is not an http:// or https:// URL; "
                "give one such as 'http://localhost:4443', or leave it out for Google Cloud Storage itself.",
                path=url,
            )
        self._project = options.get("project")
        self._endpoint_url = endpoint
        self._credentials = _credentials(url, options.get("token"))
        self.endpoint = (endpoint or os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com")

    def _make_client(self) -> Any:
        from google.cloud import storage

        client_options = {"api_endpoint": self._endpoint_url} if self._endpoint_url else None
        return storage.Client(project=self._project, credentials=self._credentials, client_options=client_options)

    def _blob(self, client: Any, name: str) -> Any:
        return client.bucket(self.container).blob(name)

    def _get(self, client: Any) -> tuple[bytes, str]:
        blob = self._blob(client, self.name)
        data: bytes = blob.download_as_bytes(retry=_read_retry(), timeout=_TIMEOUT)
        return data, str(blob.generation)

    def _head(self, client: Any) -> str:
        blob = self._blob(client, self.name)
        blob.reload(retry=_read_retry(), timeout=_TIMEOUT)
        return str(blob.generation)

    def _put(self, client: Any, name: str, data: bytes, version: str | None) -> str:
        blob = self._blob(client, name)
        blob.upload_from_string(data, content_type="application/json", timeout=_TIMEOUT, retry=None,
                                if_generation_match=0 if version is None else int(version))
        return str(blob.generation)

    def _delete(self, client: Any, name: str) -> None:
        self._blob(client, name).delete(timeout=_TIMEOUT, retry=None)

    def _classify(self, exc: BaseException, *, writing: bool) -> Failure:
        import google.auth.exceptions
        from google.api_core import exceptions

        if isinstance(exc, exceptions.PreconditionFailed):
            return Failure(CONFLICT, 412, "PreconditionFailed")
        if isinstance(exc, exceptions.NotFound):
            # An upload's 404 (a generation condition on a missing object is a 412) and GCS's
            # "The specified bucket does not exist." name the bucket; a read's 404 the object.
            if writing or "bucket does not exist" in str(exc).lower():
                return Failure(CONTAINER, 404, "NotFound")
            return Failure(MISSING, 404, "NotFound")
        if isinstance(exc, (exceptions.Unauthorized, exceptions.Forbidden, google.auth.exceptions.GoogleAuthError)):
            return Failure(DENIED, getattr(exc, "code", None), type(exc).__name__)
        if isinstance(exc, exceptions.GoogleAPICallError):
            return Failure(ERROR, exc.code if isinstance(exc.code, int) else None, type(exc).__name__)
        if isinstance(exc, exceptions.RetryError) or _is_transport_error(exc):
            return Failure(ERROR)
        return Failure(FOREIGN)

    def _create_advice(self) -> str:
        return f"create it (gcloud storage buckets create gs://{self.container}) or fix the URL"

    def _credentials_advice(self) -> str:
        return ("check the credentials (storage_options token, GOOGLE_APPLICATION_CREDENTIALS or "
                "gcloud auth application-default login) and the bucket's permissions")


def _read_retry() -> Any:
    from google.cloud.storage.retry import DEFAULT_RETRY

    # with_timeout is google-api-core 2.17's name for with_deadline (deprecated since).
    with_timeout = getattr(DEFAULT_RETRY, "with_timeout", None) or DEFAULT_RETRY.with_deadline
    return with_timeout(_READ_RETRY_S)


def _is_transport_error(exc: BaseException) -> bool:
    return (type(exc).__module__.split(".")[0] in ("requests", "urllib3", "google")
            or isinstance(exc, (ConnectionError, TimeoutError)))
