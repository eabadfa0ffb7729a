"""Opening an ``s3://`` store: URLs, ``storage_options`` and the client they make (no server needed).

The behaviour against a real S3-compatible server, option errors included, is in tests/test_s3*.py;
here, without a server: which URLs are S3's and how each option reaches boto3's client.
"""

from __future__ import annotations

from trainstatus._s3 import S3Object, is_s3_url

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
