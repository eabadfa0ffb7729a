"""Opening an ``s3://`` store: URLs, ``storage_options`` and the client they make (no server needed).

The behaviour against a real S3-compatible server, option errors included, is in tests/test_s3*.py;
here, without a server: which URLs are S3's and how each option reaches boto3's client.
"""

from __future__ import annotations

import pytest

from trainstatus import TrainingStatusTypeError, TrainingStatusValueError
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
