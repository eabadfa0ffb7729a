"""Which locations a store opens: object stores' URLs (s3://, gs://, az://...) and local paths; every
other ``scheme://`` is refused before anything is read or created (it used to become a local file
under ``./hdfs:/...``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainstatus import StatusStore, TrainingStatusValueError
from trainstatus._remote.location import check_location, object_store, url_scheme

SUPPORTED = "trainstatus opens s3://, gs:// and az:// URLs and local paths"

REFUSED = [
    "http://example.com/ts.json",
    "https://example.com/ts.json",
    "hdfs://namenode/ts.json",
    "s3a://bucket/ts.json",  # Hadoop's name for S3, which boto3 does not take
    "HDFS://namenode/ts.json",
    "x+y.z-1://a/b",
    "hdfs://",
    "adl://store/ts.json",  # Azure Data Lake Gen1 (retired), not Blob Storage
]


NOT_UTF8 = os.fsdecode(b"/tmp/\xff.json")  # the str os.fsencode turns back into those bytes


def _other_scheme_message(url: str, scheme: str) -> str:
    return (
        f"Cannot open {url!r}: {scheme}:// URLs are not supported; {SUPPORTED}. Nothing was read "
        f"or created; copy the file to a local path or to an object store trainstatus opens, or, for a "
        f"local directory named '{scheme}:', write './{url}'."
    )


@pytest.mark.parametrize("url", REFUSED)
def test_an_unsupported_scheme_is_refused_naming_what_is_supported(url: str) -> None:
    scheme = url.split("://")[0]
    with pytest.raises(TrainingStatusValueError) as caught:
        check_location(url)
    assert str(caught.value) == _other_scheme_message(url, scheme)
    assert caught.value.path == url
    assert isinstance(caught.value, ValueError)


def test_a_bytes_path_is_checked_like_its_text() -> None:
    with pytest.raises(TrainingStatusValueError) as caught:
        check_location(b"hdfs://namenode/ts.json")
    assert caught.value.path == "hdfs://namenode/ts.json"
    check_location(b"runs/ts.json")


@pytest.mark.parametrize(("url", "advice"), [
    ("file:///tmp/run/ts.json", "give the local path it names instead: '/tmp/run/ts.json'"),
    ("file:///tmp/my%20run/ts%2Ejson", "give the local path it names instead: '/tmp/my run/ts.json'"),
    ("file://localhost/tmp/ts.json", "give the local path it names instead: '/tmp/ts.json'"),
    ("FILE:///tmp/ts.json", "give the local path it names instead: '/tmp/ts.json'"),
    ("file:///tmp/%FF.json", f"give the local path it names instead: {NOT_UTF8!r}"),
    ("file://localhost", "give the local path of the file instead"),
    ("file://nas/share/ts.json", "it names a file on the host 'nas', which trainstatus cannot reach; "
                                 "mount that filesystem here and give the local path"),
])
def test_a_file_url_is_refused_with_the_local_path_it_names(url: str, advice: str) -> None:
    scheme = url.split("://")[0]
    with pytest.raises(TrainingStatusValueError) as caught:
        check_location(url)
    assert str(caught.value) == (
        f"Cannot open {url!r}: {scheme}:// URLs are not supported; {SUPPORTED}. Nothing was read or "
        f"created; {advice}."
    )
    assert caught.value.path == url


@pytest.mark.parametrize("path", [
    "s3://bucket/run/ts.json",
    "S3://bucket/run/ts.json",
    "gs://bucket/run/ts.json",
    "GCS://bucket/run/ts.json",
    "az://container/run/ts.json",
    "abfs://container@account.dfs.core.windows.net/ts.json",
    "abfss://container/ts.json",
    "/abs/run/ts.json",
    "run/ts.json",
    "ts.json",
    "",
    "runs/a://b/ts.json",  # "://" further down: a directory named "a:"
    "./gs://bucket/ts.json",  # the way to name a local directory "gs:"
    "C:/run/ts.json",
    "C:ts.json",
    "gs:/bucket/ts.json",  # one slash: a local directory "gs:" (what pathlib makes of a URL)
    "1gs://bucket/ts.json",  # a scheme starts with a letter
    "-x://y",
    "g_s://bucket/ts.json",  # "_" is not allowed in a scheme
    " gs://bucket/ts.json",
])
def test_local_paths_and_object_store_urls_are_accepted(path: str) -> None:
    check_location(path)


@pytest.mark.parametrize(("url", "store"), [
    ("s3://b/k", "s3"), ("S3://b/k", "s3"), ("gs://b/k", "gcs"), ("gcs://b/k", "gcs"), ("az://c/k", "azure"),
    ("abfs://c/k", "azure"), ("ABFSS://c@a.dfs.core.windows.net/k", "azure"), ("s3a://b/k", None),
    ("runs/gs://b/k", None), ("/tmp/x", None),
])
def test_object_store_names_the_adapter_of_a_url(url: str, store: str | None) -> None:
    assert object_store(url) == store


def test_url_scheme_is_the_scheme_as_written() -> None:
    assert url_scheme("GS://b/k") == "GS"
    assert url_scheme("s3://b/k") == "s3"
    assert url_scheme("runs/a://b") is None
    assert url_scheme("C:/x") is None


# -- the store: refused before anything is created (the lead wires check_location into it) ----------


@pytest.mark.parametrize("url", ["hdfs://namenode/run/run_logs/training_status.json", "file:///tmp/ts.json",
                                 "s3a://b/ts.json", "http://example.com/ts.json"])
@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
def test_a_store_refuses_an_unsupported_scheme_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, as_bytes: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    given: str | bytes = os.fsencode(url) if as_bytes else url
    with pytest.raises(TrainingStatusValueError) as caught:
        StatusStore(given)  # type: ignore[arg-type]  # bytes paths are accepted like open()'s
    assert caught.value.path == url
    assert f"Cannot open {url!r}: " in str(caught.value) and SUPPORTED in str(caught.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options", [{"resume": True}, {"lock": "soft"}, {"strict": True}])
def test_a_store_refuses_the_scheme_whatever_the_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, object]
) -> None:
    monkeypatch.chdir(tmp_path)
    url = "hdfs://namenode/run/ts.json"
    with pytest.raises(TrainingStatusValueError) as caught:
        StatusStore(url, **options)  # type: ignore[arg-type]
    assert str(caught.value) == _other_scheme_message(url, "hdfs")
    assert list(tmp_path.iterdir()) == []


def test_a_store_still_opens_a_local_path_with_colon_slashes_further_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "a:").mkdir(parents=True)
    store = StatusStore("runs/a://ts.json")
    try:
        store.set("c", "k", 1)
    finally:
        store.close()
    assert (tmp_path / "runs" / "a:" / "ts.json").is_file()
