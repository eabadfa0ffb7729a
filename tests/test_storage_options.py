"""Opening an object store: URLs, ``storage_options`` and the client they make (no server needed).

The behaviour against real servers is in tests/test_s3*.py and tests/test_object_store*.py; here,
without a server: which URLs each store takes, how each option reaches its SDK's client, and that
every option's bad value is refused at open, by name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainstatus import TrainingStatusTypeError, TrainingStatusValueError
from trainstatus._remote.s3 import S3Object, is_s3_url

# Nothing listens here: opening reads the object, so these tests build the storage alone.
URL = "s3://bucket-name/run/run_logs/training_status.json"


def client_for(options: dict[str, object]) -> object:
    return S3Object(URL, options)._make_client()


def test_s3_urls_are_recognised_case_insensitively() -> None:
    assert is_s3_url("s3://b/k") and is_s3_url("S3://b/k")
    assert not is_s3_url("/tmp/s3://b/k") and not is_s3_url("s3:/b/k") and not is_s3_url("gs://b/k")


def test_options_reach_the_client_under_boto3_names() -> None:
    client = client_for({
        "endpoint_url": "http://127.0.0.1:9", "key": "AKIDEXAMPLE", "secret": "s3cr3t", "token": "tok",
        "region_name": "eu-west-3",
    })
    meta = client.meta  # type: ignore[attr-defined]
    assert meta.endpoint_url == "http://127.0.0.1:9"
    assert meta.region_name == "eu-west-3"
    credentials = client._request_signer._credentials  # type: ignore[attr-defined]
    assert (credentials.access_key, credentials.secret_key, credentials.token) == ("AKIDEXAMPLE", "s3cr3t", "tok")


def test_client_kwargs_and_config_kwargs_pass_through_and_explicit_options_win() -> None:
    client = client_for({
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:1", "region_name": "us-west-2"},
        "region_name": "ap-south-1",
        "config_kwargs": {"connect_timeout": 1.5, "retries": {"max_attempts": 7, "mode": "standard"}},
        "key": "k", "secret": "s",
    })
    meta = client.meta  # type: ignore[attr-defined]
    assert meta.endpoint_url == "http://127.0.0.1:1"
    assert meta.region_name == "ap-south-1"
    assert meta.config.connect_timeout == 1.5
    assert meta.config.retries == {"total_max_attempts": 8, "mode": "standard"}  # botocore: 7 retries


@pytest.mark.parametrize(("options", "expected"), [
    ({"endpoint_url": 9000}, "storage_options['endpoint_url'] must be a str or None, not 'int' (9000)"),
    ({"anon": "yes"}, "storage_options['anon'] must be True or False or None, not 'str' ('yes')"),
    ({"client_kwargs": 5}, "storage_options['client_kwargs'] must be a dict or None, not 'int' (5)"),
])
def test_an_option_of_the_wrong_type_is_refused_at_open(options: dict[str, object], expected: str) -> None:
    with pytest.raises(TrainingStatusTypeError) as caught:
        S3Object(URL, options)
    assert isinstance(caught.value, TypeError) and caught.value.path == URL
    assert str(caught.value) == f"{expected}, for {URL}."


def test_config_kwargs_botocore_refuses_are_refused_at_open() -> None:
    with pytest.raises(TrainingStatusValueError) as caught:
        S3Object(URL, {"config_kwargs": {"bogus": 1}})
    assert isinstance(caught.value, ValueError) and caught.value.path == URL
    assert str(caught.value) == (
        f"storage_options['config_kwargs'] {{'bogus': 1}} for {URL} is refused by botocore.config.Config: "
        "Got unexpected keyword argument 'bogus'. Give the arguments botocore.config.Config takes."
    )


@pytest.mark.parametrize(("options", "cause"), [
    ({"endpoint_url": "not a url"}, "Invalid endpoint: not a url"),
    ({"client_kwargs": {"bogus": 1}}, "Session.client() got an unexpected keyword argument 'bogus'"),
])
def test_client_arguments_boto3_refuses_raise_a_trainstatus_error(options: dict[str, object], cause: str) -> None:
    with pytest.raises(TrainingStatusValueError) as caught:
        client_for(options)
    assert caught.value.path == URL
    assert f"boto3 refused the storage_options of {URL} (" in str(caught.value)
    assert f"): {cause}. Fix them: endpoint_url is a URL such as 'http://localhost:9000'" in str(caught.value)


# -- gs:// ---------------------------------------------------------------------------------------------

GS_URL = "gs://bucket-name/run/run_logs/training_status.json"


def test_gcs_options_reach_the_client() -> None:
    import google.auth.credentials

    from trainstatus._remote.gcs import GCSObject

    storage = GCSObject(GS_URL, {"endpoint_url": "http://127.0.0.1:9", "project": "my-project", "token": "anon"})
    client = storage._make_client()
    assert client._connection.API_BASE_URL == "http://127.0.0.1:9"
    assert client.project == "my-project"
    assert isinstance(client._credentials, google.auth.credentials.AnonymousCredentials)
    assert (storage.container, storage.name, storage.url_of("x.corrupt")) == (
        "bucket-name", "run/run_logs/training_status.json", "gs://bucket-name/x.corrupt")
    assert GCSObject("GCS://b/k", {}).url_of("k2") == "gcs://b/k2"  # the scheme as the user spells it


def test_gcs_token_of_a_service_account_file_and_dict(tmp_path: Path) -> None:
    from trainstatus._remote.gcs import GCSObject

    info = {"type": "service_account", "project_id": "p", "private_key_id": "1", "private_key": _private_key(),
            "client_email": "sa@p.iam.gserviceaccount.com", "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token"}
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(info))
    for token in (str(key_file), key_file, info):
        credentials = GCSObject(GS_URL, {"token": token})._credentials
        assert credentials.service_account_email == "sa@p.iam.gserviceaccount.com"


GCS_BAD = [
    ({"key": "x"}, TrainingStatusValueError,
     f"Unknown storage option(s) 'key' for {GS_URL}; the options understood are conditional_writes, endpoint_url, project, token "
     "(named as in gcsfs)."),
    ({"project": 5}, TrainingStatusTypeError, f"storage_options['project'] must be a str or None, not 'int' (5), for {GS_URL}."),
    ({"endpoint_url": 4443}, TrainingStatusTypeError,
     f"storage_options['endpoint_url'] must be a str or None, not 'int' (4443), for {GS_URL}."),
    ({"endpoint_url": "localhost:4443"}, TrainingStatusValueError,
     f"storage_options['endpoint_url'] 'localhost:4443' for {GS_URL} is not an http:// or https:// URL; give one "
     "such as 'http://localhost:4443', or leave it out for Google Cloud Storage itself."),
    ({"token": 5}, TrainingStatusTypeError,
     "storage_options['token'] must be one of 'google_default', 'anon', 'cloud', the path of a credentials file, "
     f"a dict of one, or google-auth credentials, not 'int', for {GS_URL}."),
    ({"token": "browser"}, TrainingStatusValueError,
     f"storage_options['token'] 'browser' for {GS_URL} is neither one of 'google_default', 'anon', 'cloud' nor a "
     "credentials file that exists. Give the path of a service account's JSON key, or 'google_default' for the "
     "environment's credentials."),
]


@pytest.mark.parametrize(("options", "error", "message"), GCS_BAD, ids=[next(iter(o)) + "=" + repr(next(iter(o.values())))
                                                                         for o, _, _ in GCS_BAD])
def test_a_bad_gcs_option_is_refused_at_open_by_name(options: dict[str, object], error: type[Exception], message: str) -> None:
    from trainstatus._remote.gcs import GCSObject

    with pytest.raises(error) as caught:
        GCSObject(GS_URL, options)
    assert str(caught.value) == message
    assert caught.value.path == GS_URL  # type: ignore[attr-defined]


def test_a_gcs_token_google_auth_refuses_is_named_without_its_secret() -> None:
    from trainstatus._remote.gcs import GCSObject

    with pytest.raises(TrainingStatusValueError) as caught:
        GCSObject(GS_URL, {"token": {"type": "service_account", "private_key": "SECRET-VALUE"}})
    message = str(caught.value)
    assert message.startswith(f"storage_options['token'] for {GS_URL} is refused by google-auth: ")
    assert message.endswith("Give a service account's JSON key (its path or its parsed dict), or 'google_default'.")
    assert "SECRET-VALUE" not in message


@pytest.mark.parametrize("url", ["gs://", "gs://bucket", "gs://bucket/", "gcs:///key", "gs://bucket/dir/"])
def test_a_gcs_url_without_bucket_or_object_is_refused(url: str) -> None:
    from trainstatus._remote.gcs import GCSObject

    with pytest.raises(TrainingStatusValueError) as caught:
        GCSObject(url, {})
    assert str(caught.value) == (
        f"{url!r} does not name an object: use gs://<bucket>/<object>, e.g. gs://my-bucket/run/run_logs/training_status.json.")


# -- az://, abfs://, abfss:// --------------------------------------------------------------------------

AZ_URL = "az://container/run/run_logs/training_status.json"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="  # Azurite's


@pytest.mark.parametrize(("url", "options", "account_url", "name"), [
    (AZ_URL, {"account_name": "acct", "account_key": KEY}, "https://acct.blob.core.windows.net/", "run/run_logs/training_status.json"),
    ("abfs://container@acct.dfs.core.windows.net/a/ts.json", {}, "https://acct.blob.core.windows.net/", "a/ts.json"),
    ("abfss://container@acct.dfs.core.windows.net/a/ts.json", {"account_key": KEY}, "https://acct.blob.core.windows.net/", "a/ts.json"),
    ("abfs://container/ts.json", {"account_name": "acct", "sas_token": "?sv=2024&sig=abc"}, "https://acct.blob.core.windows.net/", "ts.json"),
    ("az://container/ts.json", {"account_name": "acct", "account_host": "acct.blob.core.chinacloudapi.cn"},
     "https://acct.blob.core.chinacloudapi.cn/", "ts.json"),
    (AZ_URL, {"connection_string": f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
                                   "BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;"},
     "http://127.0.0.1:9/devstoreaccount1/", "run/run_logs/training_status.json"),
])
def test_azure_urls_and_options_reach_the_client(url: str, options: dict[str, object], account_url: str, name: str) -> None:
    from trainstatus._remote.azure import AzureBlob

    storage = AzureBlob(url, options)
    assert storage._client.url.partition("?")[0] == account_url
    assert (storage.container, storage.name) == ("container", name)
    assert storage.url_of("x") == url[:url.index("/", url.index("://") + 3)] + "/x"  # the URL's form kept


def test_azure_credentials_take_the_kind_given() -> None:
    from azure.core.credentials import AzureSasCredential

    from trainstatus._remote.azure import AzureBlob

    with_key = AzureBlob(AZ_URL, {"account_name": "acct", "account_key": KEY})._client.credential
    assert (with_key.account_name, with_key.account_key) == ("acct", KEY)  # the SDK's shared-key policy
    sas = AzureSasCredential("sv=1&sig=x")
    assert AzureBlob(AZ_URL, {"account_name": "acct", "credential": sas})._client.credential is sas


def test_without_options_azure_takes_adlfs_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainstatus._remote.azure import AzureBlob

    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "envacct")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
    storage = AzureBlob(AZ_URL)
    assert storage._client.url == "https://envacct.blob.core.windows.net/"
    assert (storage._client.credential.account_name, storage._client.credential.account_key) == ("envacct", KEY)


AZ_BAD = [
    ({"account_url": "x"}, TrainingStatusValueError,
     f"Unknown storage option(s) 'account_url' for {AZ_URL}; the options understood are account_host, account_key, "
     "account_name, conditional_writes, connection_string, credential, sas_token (named as in adlfs)."),
    ({"account_name": 5}, TrainingStatusTypeError,
     f"storage_options['account_name'] must be a str or None, not 'int' (5), for {AZ_URL}."),
    ({"account_name": "acct", "account_key": "not base64!"}, TrainingStatusValueError,
     f"storage_options['account_key'] for {AZ_URL} is not a base64 account key; copy key1 or key2 from the storage "
     "account's Access keys."),
    ({"account_name": "acct", "sas_token": "sv=2024-01-01"}, TrainingStatusValueError,
     f"storage_options['sas_token'] for {AZ_URL} is not a SAS token (it has no sig= field); give the query string "
     "the portal or az storage container generate-sas prints."),
    ({"connection_string": "AccountKey=secret-part"}, TrainingStatusValueError,
     f"storage_options['connection_string'] for {AZ_URL} is refused by azure-storage-blob: Connection string missing "
     "required connection details.. Copy it whole from the portal (Access keys), as "
     "'DefaultEndpointsProtocol=https;AccountName=...;AccountKey=...;EndpointSuffix=core.windows.net'."),
    ({"account_name": "acct", "credential": 5}, TrainingStatusTypeError,
     "storage_options['credential'] must be a token credential (azure.identity's DefaultAzureCredential()...), an "
     f"AzureNamedKeyCredential, an AzureSasCredential or a str, not 'int', for {AZ_URL}."),
    ({"account_host": 5}, TrainingStatusTypeError,
     f"storage_options['account_host'] must be a str or None, not 'int' (5), for {AZ_URL}."),
    ({}, TrainingStatusValueError,
     f"{AZ_URL} names no storage account: give storage_options account_name (or connection_string), or write the "
     "URL as abfs://<container>@<account>.dfs.core.windows.net/<blob>."),
]


@pytest.mark.parametrize(("options", "error", "message"), AZ_BAD, ids=[",".join(o) or "none" for o, _, _ in AZ_BAD])
def test_a_bad_azure_option_is_refused_at_open_by_name(options: dict[str, object], error: type[Exception], message: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from trainstatus._remote.azure import AzureBlob

    for variable in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
                     "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(error) as caught:
        AzureBlob(AZ_URL, options)
    assert str(caught.value) == message
    assert caught.value.path == AZ_URL  # type: ignore[attr-defined]
    assert "secret-part" not in str(caught.value)


def test_an_account_in_the_url_and_another_in_the_options_is_refused() -> None:
    from trainstatus._remote.azure import AzureBlob

    url = "abfs://container@acct.dfs.core.windows.net/ts.json"
    with pytest.raises(TrainingStatusValueError) as caught:
        AzureBlob(url, {"account_name": "other"})
    assert str(caught.value) == (
        f"storage_options['account_name'] 'other' is not the account 'acct' that {url} names; give one of them, or "
        "the same in both.")


@pytest.mark.parametrize("url", ["az://", "az://container", "abfs://container/", "abfss:///blob", "az://c/dir/",
                                 "abfs://@acct.dfs.core.windows.net/ts.json", "abfs://c@/ts.json"])
def test_an_azure_url_without_container_or_blob_is_refused(url: str) -> None:
    from trainstatus._remote.azure import AzureBlob

    with pytest.raises(TrainingStatusValueError) as caught:
        AzureBlob(url, {"account_name": "acct"})
    assert str(caught.value) == (
        f"{url!r} does not name a blob: use az://<container>/<blob> with the account in storage_options "
        "(account_name or connection_string), or abfs://<container>@<account>.dfs.core.windows.net/<blob>.")


# -- each SDK only when its URL is opened ---------------------------------------------------------------

_WITHOUT_SDK = """
import sys
sys.modules[sys.argv[2]] = None  # importing it raises ImportError, as when the extra is not installed
from trainstatus import StatusStore, TrainingStatusDependencyError
try:
    StatusStore(sys.argv[3], storage_options={})
except TrainingStatusDependencyError as exc:
    assert isinstance(exc, ImportError) and isinstance(exc.__cause__, ImportError) and exc.path == sys.argv[3]
    print(exc)
store = StatusStore(sys.argv[1])  # a local path needs none of them
store.set("a", "x", 1)
print(sorted(m for m in ("boto3", "google.cloud.storage", "azure.storage.blob") if sys.modules.get(m)))
"""


@pytest.mark.parametrize(("module", "url", "package", "extra"), [
    ("google.cloud.storage", "gs://bucket/run/status.json", "google-cloud-storage", "gcs"),
    ("azure.storage.blob", "az://container/run/status.json", "azure-storage-blob", "azure"),
])
def test_without_its_sdk_a_url_says_which_extra_and_nothing_else_is_imported(
    tmp_path: Path, module: str, url: str, package: str, extra: str
) -> None:
    done = subprocess.run([sys.executable, "-c", _WITHOUT_SDK, str(tmp_path / "status.json"), module, url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f'Opening {url} needs {package}, which is not installed: pip install "trainstatus[{extra}]".\n[]\n'


def _private_key() -> str:
    """A throwaway RSA key made now (google-auth parses one when it builds service account
    credentials); cryptography comes with moto, in the test extra."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()
