"""The command line on s3://, gs:// and az:// URLs: show, get, set, delete and check, with
``--storage-option NAME=VALUE``, against the real servers of tests/conftest.py's ``bucket`` fixture.

Run in this process through ``_cli_main.main`` (test_cli.py runs the console script itself; here
each subprocess would import an SDK again, a second each).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainstatus import StatusStore
from trainstatus._cli.main import main

KEY = "run/run_logs/training_status.json"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def options(bucket: Any) -> list[str]:
    """The bucket's storage_options as --storage-option arguments."""
    return [arg for name, value in bucket.storage_options.items()
            for arg in ("--storage-option", f"{name}={value}")]


def test_the_server_refuses_a_stale_condition(bucket: Any) -> None:
    assert bucket.put_if(b"first", None) and not bucket.put_if(b"again", None)
    version = bucket.etag()
    assert bucket.put_if(b"second", version) and not bucket.put_if(b"stale", version)


def test_set_get_show_delete_check_on_a_url(bucket: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = bucket.url()
    assert cli(capsys, "set", url, "wall_height", "lesson_num", "3", *options(bucket)) == (
        0, f"created {url}\nwall_height/lesson_num: (not set) -> 3\n", "")
    assert cli(capsys, "set", url, "Walker", "reward", "NaN", *options(bucket))[1] == "Walker/reward: (not set) -> NaN\n"
    assert json.loads(bucket.read())["wall_height"] == {"lesson_num": 3}  # Python's json reads NaN
    assert cli(capsys, "get", url, "wall_height", "lesson_num", *options(bucket)) == (0, "3\n", "")
    code, out, _ = cli(capsys, "show", url, *options(bucket))
    assert code == 0 and "wall_height" in out and "lesson_num: 3" in out
    assert cli(capsys, "delete", url, "wall_height", "lesson_num", *options(bucket)) == (
        0, "deleted wall_height/lesson_num (was 3)\n", "")
    assert cli(capsys, "get", url, "wall_height", "lesson_num", *options(bucket)) == (
        1, "", f"trainstatus: error: wall_height/lesson_num is not set in {url}\n")
    code, out, _ = cli(capsys, "check", url, *options(bucket))
    assert code == 0 and out.endswith(f"{url}: sound\n")
    assert "an object store takes no lock: each write is conditional on the version it read" in out
    # What the command line wrote, a store reads, and the other way round.
    with StatusStore(url, storage_options=bucket.storage_options) as store:  # type: ignore[call-arg]
        assert store.get("wall_height", "lesson_num") is None and store.to_dict()["Walker"].keys() == {"reward"}
        store.set("c", "k", [1, 2])
    assert cli(capsys, "get", url, "c", "k", "--compact", *options(bucket)) == (0, "[1, 2]\n", "")


def test_a_missing_object_and_a_damaged_one(bucket: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = bucket.url()
    for command in (["show"], ["get", "c", "k"], ["delete", "c", "k"]):
        assert cli(capsys, command[0], url, *command[1:], *options(bucket)) == (
            2, "", f"trainstatus: error: no status file at {url}\n")
    assert bucket.read() is None  # delete created nothing
    bucket.write(b'{"c": ')
    code, out, _ = cli(capsys, "check", url, *options(bucket))
    assert code == 2 and out.endswith(f"{url}: corrupt\n")
    assert cli(capsys, "show", url, *options(bucket))[2].startswith(f"trainstatus: error: {url} is damaged: ")
    assert bucket.read() == b'{"c": '  # reading commands leave it as it is


def test_storage_option_values_are_json_only_where_json_is_meant(capsys: pytest.CaptureFixture[str]) -> None:
    from trainstatus._cli.base import storage_options
    from trainstatus._cli.parser import _parser

    args = _parser().parse_args(["show", "s3://b/k", "--storage-option", "anon=true", "--storage-option", "project=123",
                                 "--storage-option", 'config_kwargs={"connect_timeout": 2}',
                                 "--storage-option", "connection_string=A=1;B=2"])
    assert storage_options(args) == {"anon": True, "project": "123", "config_kwargs": {"connect_timeout": 2},
                                     "connection_string": "A=1;B=2"}


@pytest.mark.parametrize(("args", "message"), [
    (["show", "gs://b/k", "--storage-option", "token"],
     "--storage-option 'token' is not NAME=VALUE (e.g. --storage-option endpoint_url=http://localhost:9000)"),
    (["show", "gs://b/k", "--storage-option", "config={oops"],
     "--storage-option config: '{oops' is not valid JSON (Expecting property name enclosed in double quotes: line 1 "
     "column 2 (char 1)); quote it for the shell, as in --storage-option 'config={\"key\": 1}'"),
    (["show", "ts.json", "--storage-option", "token=anon"],
     "--storage-option is for s3://, gs:// and az:// URLs; ts.json is a local path, which takes none"),
    (["history", "gs://b/run/ts.json"],
     "gs://b/run/ts.json: history works on local files only (show, get, set, delete and check also work on s3://, "
     "gs:// and az:// URLs). Copy the object down and give its local path."),
    (["corrupt", "list", "az://c/ts.json"],
     "az://c/ts.json: corrupt works on local files only (show, get, set, delete and check also work on s3://, "
     "gs:// and az:// URLs). Copy the object down and give its local path."),
    (["show", "gs://b/k", "--storage-option", "bogus=1"],
     "unknown storage option(s) 'bogus' for gs://b/k; the options understood are conditional_writes, endpoint_url, project, token "
     "(named as in gcsfs)"),
])
def test_url_usage_errors_are_one_line_before_any_request(capsys: pytest.CaptureFixture[str], args: list[str],
                                                          message: str) -> None:
    assert cli(capsys, *args) == (2, "", f"trainstatus: error: {message}\n")
