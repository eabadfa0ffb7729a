"""The command line, driven as a person would: the installed ``trainstatus`` script in a subprocess,
on real files. Checks stdout, stderr (word for word where the text is ours) and the exit status,
and, for every command that must not change anything, that the directory is byte for byte as it
was (no lock file, no kept-aside copy, no temp file created, nothing removed).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _helpers import read_fresh, same, soft_holder, soft_message

from trainstatus import StatusStore, TrainingStatusVersionWarning, __version__
from trainstatus._load import Corrupt, check_metadata, load_document

DATA = Path(__file__).parent / "data" / "mlagents_training_status.json"
TEMP = ".ts.json.trainstatus-0123456789abcdef.tmp"
TEMP2 = ".ts.json.trainstatus-fedcba9876543210.tmp"
WAIT = 60  # seconds a child may take before the test fails instead of hanging


def _script() -> str | None:
    """The console script installed with the package in this interpreter's environment."""
    directories = [os.path.join(sys.prefix, "bin"), sysconfig.get_path("scripts")]
    return shutil.which("trainstatus", path=os.pathsep.join(directories))


SCRIPT = _script()


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    return env


def run(*args: str | Path, command: list[str] | None = None, cwd: Path | None = None) -> Result:
    if command is None:
        assert SCRIPT is not None, (
            f"no trainstatus console script next to {sys.executable}; install the package "
            "(pip install -e '.[test]') so the tests can run it as a user would"
        )
        command = [SCRIPT]
    done = subprocess.run(
        [*command, *map(str, args)], capture_output=True, text=True, timeout=WAIT, env=_env(), check=False,
        cwd=cwd,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return Result(done.returncode, done.stdout, done.stderr)


def error(message: str) -> str:
    return f"trainstatus: error: {message}\n"


def cli_style(message: str) -> str:
    """A library message as the command line prints it: in lower case at first, no final period."""
    first = message.split(" ", 1)[0]
    if first.isalpha() and first[1:].islower():
        message = message[0].lower() + message[1:]
    return message.removesuffix(".")


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every name in ``directory`` (dot files included) with its bytes."""
    return {p.name: p.read_bytes() if p.is_file() else b"<dir>" for p in directory.iterdir()}


def status_file(tmp_path: Path, content: bytes | None = None) -> Path:
    """``ts.json`` in a fresh folder of its own (so snapshots see only what concerns it)."""
    folder = tmp_path.resolve() / "run"
    folder.mkdir()
    path = folder / "ts.json"
    path.write_bytes(DATA.read_bytes() if content is None else content)
    return path


HOLDER = """\
import sys
from trainstatus import StatusStore

store = StatusStore(sys.argv[1], durable=False)
with store.transaction():
    store.set("holder", "key", 1)
    print("held", flush=True)
    sys.stdin.readline()
store.close()
"""


@dataclasses.dataclass
class Holder:
    pid: int
    cmdline: str


@contextmanager
def holding(path: Path) -> Iterator[Holder]:
    """A child process holding a transaction (so the lock) on ``path`` until the block ends."""
    script = path.parent.parent / "holder.py"
    script.write_text(HOLDER)
    child = subprocess.Popen(
        [sys.executable, str(script), str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        yield Holder(child.pid, f"{sys.executable} {script} {path}")
    finally:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        code = child.wait(WAIT)
        child.stdout.close()
        assert code == 0


# -- the program as a whole -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [[], ["show"], ["get"], ["set"], ["delete"], ["check"], ["corrupt"], ["corrupt", "list"], ["corrupt", "restore"]],
    ids=lambda c: " ".join(c) or "trainstatus",
)
def test_every_command_has_help_with_an_example(command: list[str]) -> None:
    result = run(*command, "--help")
    assert result.code == 0 and result.err == ""
    assert result.out.startswith(f"usage: {' '.join(['trainstatus', *command])}")
    assert "example" in result.out
    assert "trainstatus " + " ".join(command) in result.out.split("example", 1)[1]


def test_python_dash_m_is_the_same_program(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    assert run("--version", command=[sys.executable, "-m", "trainstatus"]) == Result(0, f"trainstatus {__version__}\n", "")
    assert run("get", path, "wall_height", "lesson_num", command=[sys.executable, "-m", "trainstatus"]) == Result(0, "3\n", "")


def test_importing_the_command_line_does_not_import_numpy() -> None:
    code = ("import sys, trainstatus._cli.write, trainstatus._cli.check, trainstatus._cli.corrupt; "
            "print('numpy' in sys.modules)")
    assert run(command=[sys.executable, "-c", code]) == Result(0, "False\n", "")


def test_bad_usage_is_a_usage_message_and_exit_2(tmp_path: Path) -> None:
    for args in [(), ("get", tmp_path / "ts.json", "only-category"), ("set", tmp_path / "x", "c", "k", "1", "--lock-timeout", "-1")]:
        result = run(*args)
        assert result.code == 2 and result.out == ""
        assert result.err.startswith("usage: trainstatus")
    assert list(tmp_path.iterdir()) == []


# -- show -----------------------------------------------------------------------------------------


def test_show_puts_metadata_first_and_summarises_checkpoint_lists(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    before = snapshot(path.parent)
    result = run("show", path)
    assert result == Result(0, """\
metadata:
  stats_format_version: "0.3.0"
  mlagents_version: "1.1.0"
  torch_version: "2.2.2"
Walker:
  checkpoints: 5 checkpoints, newest step 2500000: results/walker_run/Walker/Walker-2500000.onnx
  final_checkpoint: {"steps": 2512345, "file_path": "results/walker_run/Walker.onnx", "reward": 320.5, \
"creation_time": 1764685123.45, "auxillary_file_paths": ["results/walker_run/Walker/Walker-2512345.pt"]}
SoccerTwos?team=0:
  elo: 1278.4
  checkpoints: []
wall_height:
  lesson_num: 3
big_wall_height:
  lesson_num: 1
""", "")
    assert snapshot(path.parent) == before


def test_show_finds_the_newest_checkpoint_by_step_and_warns_in_one_line(tmp_path: Path) -> None:
    document = {
        "B": {"checkpoints": [{"steps": 30, "file_path": "b30"}, {"steps": 10, "file_path": "b10"}],
              "one": [{"steps": 5, "file_path": "only"}],
              # a NaN step orders nothing: the newest is the last entry, as listed
              "nan": [{"steps": 30, "file_path": "n30"}, {"steps": math.nan, "file_path": "nnan"},
                      {"steps": 10, "file_path": "n10"}],
              "not checkpoints": [{"steps": 1}], "line\nbreak": 1},
        "empty": {},
    }
    path = status_file(tmp_path, json.dumps(document).encode())
    result = run("show", path)
    assert result == Result(0, """\
metadata: none (the file has no metadata block)
B:
  checkpoints: 2 checkpoints, newest step 30: b30
  one: 1 checkpoint, newest step 5: only
  nan: 3 checkpoints, newest step 10: n10
  not checkpoints: [{"steps": 1}]
  "line\\nbreak": 1
empty: (no keys)
""", f"trainstatus: warning: {library_warning(None, path)}\n")
    assert result.err.startswith(f"trainstatus: warning: {path} has no metadata block")


def test_show_json_prints_the_whole_document_for_scripts(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    result = run("show", "--json", path)
    assert result.code == 0 and result.err == ""
    assert '"reward": NaN' in result.out
    assert same(json.loads(result.out), json.loads(DATA.read_bytes()))


# -- get ----------------------------------------------------------------------------------------


def test_get_prints_the_value_as_json(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    expected = json.loads(DATA.read_bytes())
    result = run("get", path, "Walker", "checkpoints")
    assert result.code == 0 and result.err == ""
    assert same(json.loads(result.out), expected["Walker"]["checkpoints"])
    assert "NaN" in result.out
    final = expected["Walker"]["final_checkpoint"]
    assert run("get", "--compact", path, "Walker", "final_checkpoint") == Result(0, json.dumps(final) + "\n", "")
    assert run("get", path, "metadata", "mlagents_version") == Result(0, '"1.1.0"\n', "")


def test_get_of_a_key_not_set_exits_1(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    assert run("get", path, "wall_height", "nope") == Result(1, "", error(f"wall_height/nope is not set in {path}"))
    assert run("get", path, "nope", "lesson_num") == Result(1, "", error(f"nope/lesson_num is not set in {path}"))
    assert run("get", path, "metadata", "nope") == Result(1, "", error(f"metadata/nope is not set in {path}"))


@pytest.mark.parametrize("command", [["show"], ["get"], ["delete"]])
def test_a_missing_file_is_a_one_line_error_and_creates_nothing(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "sub" / "ts.json"
    extra = ["c", "k"] if command != ["show"] else []
    assert run(*command, path, *extra) == Result(2, "", error(f"no status file at {path}"))
    assert list(tmp_path.iterdir()) == []


PATH_COMMANDS = [
    (["show"], []), (["show", "--json"], []), (["get"], ["c", "k"]), (["set"], ["c", "k", "1"]),
    (["delete"], ["c", "k"]), (["check"], []), (["corrupt", "list"], []),
    (["corrupt", "restore"], ["ts.json.corrupt-20250101T000000.000000Z"]),
]


@pytest.mark.parametrize(("url", "advice"), [
    ("hdfs://namenode/run/run_logs/training_status.json",
     "Copy the file down and give its local path, or, for a local directory named 'hdfs:', write "
     "./hdfs://namenode/run/run_logs/training_status.json"),
    ("HTTP://example.com/ts.json",
     "Copy the file down and give its local path, or, for a local directory named 'HTTP:', write "
     "./HTTP://example.com/ts.json"),
    ("file:///tmp/my%20run/ts.json", "Give the local path it names instead: '/tmp/my run/ts.json'"),
])
@pytest.mark.parametrize(("before", "after"), PATH_COMMANDS, ids=lambda c: " ".join(c))
def test_other_url_schemes_are_refused_before_anything_is_read_or_created(
    tmp_path: Path, url: str, advice: str, before: list[str], after: list[str]
) -> None:
    scheme = url.split("://")[0]
    result = run(*before, url, *after, cwd=tmp_path)
    assert result == Result(2, "", error(
        f"{url}: {scheme}:// URLs are not supported; the command line works on local files and s3://, gs:// and az:// "
        f"URLs. {advice}."))
    assert list(tmp_path.iterdir()) == []  # no ./hdfs:/namenode/... directory, no lock file


def test_a_local_path_with_colon_slashes_further_down_is_still_a_path(tmp_path: Path) -> None:
    (tmp_path / "runs" / "a:").mkdir(parents=True)
    assert run("set", "runs/a://ts.json", "c", "k", "1", cwd=tmp_path).code == 0
    assert read_fresh(tmp_path / "runs" / "a:" / "ts.json")["c"] == {"k": 1}
    (tmp_path / "gs:").mkdir()
    assert run("set", "./gs://ts.json", "c", "k", "2", cwd=tmp_path).code == 0  # the way the error shows
    assert read_fresh(tmp_path / "gs:" / "ts.json")["c"] == {"k": 2}


@pytest.mark.parametrize("command", [["show"], ["get", "c", "k"]])
def test_reading_a_damaged_file_is_an_error_and_leaves_it_in_place(tmp_path: Path, command: list[str]) -> None:
    path = status_file(tmp_path, b"[1, 2]")
    before = snapshot(path.parent)
    assert run(command[0], path, *command[1:]) == Result(2, "", error(
        f"{path} is damaged: its top level is an array, not an object; it was left as it is "
        "(`trainstatus check` tells more)"))
    assert snapshot(path.parent) == before


# -- set, delete --------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("2", 2),
    ("-2.5", -2.5),
    ("true", True),
    ("null", None),
    ("NaN", math.nan),
    ("-Infinity", -math.inf),
    ('"3"', "3"),
    ('[1, {"steps": 10, "file_path": "a.onnx"}]', [1, {"steps": 10, "file_path": "a.onnx"}]),
    ("Infinity", math.inf),
    (" 3 ", 3),
    ("false", False),
    ("Walker-500000.onnx", "Walker-500000.onnx"),
    ("hello", "hello"),
    ("hello world", "hello world"),
    ("results/run1/Walker.onnx", "results/run1/Walker.onnx"),
    ("nulls", "nulls"),
    ("", ""),
])
def test_set_parses_json_else_stores_the_text(tmp_path: Path, text: str, value: Any) -> None:
    path = tmp_path / "ts.json"
    result = run("set", path, "c", "k", "--", text)  # "--": VALUE may start with "-"
    shown = json.dumps(value)
    assert result == Result(0, f"created {path}\nc/k: (not set) -> {shown}\n", "")
    assert same(read_fresh(path)["c"], {"k": value})


@pytest.mark.parametrize(("text", "message"), [
    ('[{"steps": 10,}]', "VALUE '[{\"steps\": 10,}]' looks like JSON but is not: Expecting property name "
                         "enclosed in double quotes at column 15"),
    ('{"steps": 10', "VALUE '{\"steps\": 10' looks like JSON but is not: Expecting ',' delimiter at column 13"),
    ('"unterminated', "VALUE '\"unterminated' looks like JSON but is not: Unterminated string starting at "
                      "column 1"),
    ("[1, 2]]", "VALUE '[1, 2]]' looks like JSON but is not: Extra data at column 7"),
    ("[True]", "VALUE '[True]' looks like JSON but is not: Expecting value at column 2"),
    ("12abc", "VALUE '12abc' looks like JSON but is not: Extra data at column 3"),
    ("[1,\n 2,]", "VALUE '[1,\\n 2,]' looks like JSON but is not: Expecting value at line 2 column 4"),
    ("  [1,", "VALUE '  [1,' looks like JSON but is not: Expecting value at column 6"),
])
def test_set_of_a_value_that_looks_like_json_but_is_not_is_an_error(tmp_path: Path, text: str, message: str) -> None:
    path = status_file(tmp_path)
    before = snapshot(path.parent)
    assert run("set", path, "Walker", "checkpoints", "--", text) == Result(2, "", error(
        f"{message}; nothing was changed. Fix it, or pass --string to store the text as it is"))
    assert snapshot(path.parent) == before


@pytest.mark.parametrize(("text", "spelling"), [
    ("True", "true"), ("False", "false"), ("None", "null"), ("TRUE", "true"), ("Null", "null"), ("NULL", "null"),
    ("nan", "NaN"), ("NAN", "NaN"), ("inf", "Infinity"), ("Inf", "Infinity"), ("infinity", "Infinity"),
    ("+inf", "Infinity"), ("+Infinity", "Infinity"), ("-infinity", "-Infinity"), ("-inf", "-Infinity"),
    ("-Inf", "-Infinity"), (" nan", "NaN"),
])
def test_set_of_a_python_spelling_says_the_json_one(tmp_path: Path, text: str, spelling: str) -> None:
    path = tmp_path / "ts.json"
    assert run("set", path, "c", "k", "--", text) == Result(2, "", error(
        f"VALUE {text!r} is Python's spelling; JSON's is {spelling}; nothing was changed. Pass {spelling}, or "
        f"pass --string to store the text {text!r}"))
    assert not path.exists()
    assert run("set", path, "c", "k", "--string", "--", text).code == 0
    assert read_fresh(path)["c"] == {"k": text}


@pytest.mark.parametrize(("text", "number"), [
    ("+5", "5"), (".5", "0.5"), ("5.", "5.0"), ("1_000", "1000"), ("007", "7"), ("-.5e1", "-5.0"), ("-.5", "-0.5"), ("0x10", None),
])
def test_set_of_a_number_json_does_not_write_that_way_is_an_error(tmp_path: Path, text: str, number: str | None) -> None:
    path = tmp_path / "ts.json"
    result = run("set", path, "c", "k", "--", text)
    if number is None:  # not a number to Python either: the JSON parser's words
        assert result.code == 2 and result.err.startswith(f"trainstatus: error: VALUE {text!r} looks like JSON but is not: ")
    else:
        assert result == Result(2, "", error(
            f"VALUE {text!r} is a number JSON does not write that way; nothing was changed. Write {number}, or "
            f"pass --string to store the text {text!r}"))
    assert not path.exists()


def test_set_of_an_object_with_a_key_twice_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "ts.json"
    text = '[{"steps": 10, "file_path": "a", "steps": 20}]'
    assert run("set", path, "c", "k", text) == Result(2, "", error(
        f"VALUE {text!r} gives the key \"steps\" twice in one object ([0]/steps: 10, then 20), and JSON keeps "
        "only the last; nothing was changed. Give each key once"))
    assert not path.exists()


def test_set_help_explains_how_values_are_read() -> None:
    out = run("set", "--help").out
    for words in ["true, false, null", "NaN, Infinity, -Infinity", "True, None, nan, inf", "--string",
                  "hello", "starts with [, {, \", a digit or -", "--allow-downgrade", "after --",
                  "VALUE - reads the value from standard input", '--string - stores "-"']:
        assert words in " ".join(out.split()), words


def test_set_of_a_value_starting_with_a_dash_says_to_pass_it_after_double_dash(tmp_path: Path) -> None:
    path = tmp_path / "ts.json"
    for value in ["-x", "-Infinity", "-1e5"]:
        result = run("set", path, "a", "j", value)
        assert result.code == 2 and result.out == ""
        assert result.err.splitlines()[-1] == (
            f"trainstatus set: error: VALUE {value!r} starts with '-': pass it after --, as in: "
            f"trainstatus set {path} a j -- {value}")
        assert run("set", path, "a", "j", "--", value).code == (2 if value == "-x" else 0)
    result = run("set", "--lock", "soft", path, "a", "j", "-x")
    assert result.err.splitlines()[-1] == (
        f"trainstatus set: error: VALUE '-x' starts with '-': pass it after --, as in: "
        f"trainstatus set --lock soft {path} a j -- -x")
    assert not Path(f"{path}.softlock").exists()


@pytest.mark.parametrize(("text", "value"), [("-3", -3), ("-2.5", -2.5), ("-0.5", -0.5)])
def test_set_of_a_negative_number_works_without_double_dash(tmp_path: Path, text: str, value: Any) -> None:
    path = tmp_path / "ts.json"
    assert run("set", path, "a", "j", text) == Result(0, f"created {path}\na/j: (not set) -> {json.dumps(value)}\n", "")
    assert same(read_fresh(path)["a"], {"j": value})


NEWER_FORMAT = b'{"a": {"b": 1}, "new": [1], "metadata": {"stats_format_version": "1.0.0"}}'


@pytest.mark.parametrize("command", [["set", "a", "b", "2"], ["delete", "a", "b"]])
def test_a_newer_format_is_refused_with_the_flag_to_pass(tmp_path: Path, command: list[str]) -> None:
    path = status_file(tmp_path, NEWER_FORMAT)
    before = snapshot(path.parent)
    result = run(command[0], path, *command[1:])
    assert result.code == 2 and result.out == ""
    assert "allow_downgrade=True" not in result.err
    warning, err = result.err.splitlines()
    assert warning == "trainstatus: warning: " + library_warning({"stats_format_version": "1.0.0"}, path).replace(
        "unless the store is opened with allow_downgrade=True", "unless set or delete is given --allow-downgrade")
    assert err == (
        f"trainstatus: error: refusing to write {path}: it has format version '1.0.0', newer than the "
        "'0.3.0' this trainstatus writes, and rewriting it would drop what this version does not "
        "understand; nothing was changed. Upgrade trainstatus, or pass --allow-downgrade to rewrite it in "
        "format 0.3.0")
    assert snapshot(path.parent) == {**before, "ts.json.lock": b""}
    result = run(command[0], "--allow-downgrade", path, *command[1:])
    assert result.code == 0, result
    after = read_fresh(path)
    assert after["metadata"]["stats_format_version"] == "0.3.0" and "new" not in after
    assert after.get("a") == ({"b": 2} if command[0] == "set" else None)


def test_set_string_stores_json_looking_text_as_a_string(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    assert run("set", path, "Walker", "note", "--string", "42") == Result(0, 'Walker/note: (not set) -> "42"\n', "")
    assert read_fresh(path)["Walker"]["note"] == "42"


def test_set_shows_the_old_value_and_keeps_everything_else(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    expected = json.loads(DATA.read_bytes())
    assert run("set", path, "wall_height", "lesson_num", "1") == Result(0, "wall_height/lesson_num: 3 -> 1\n", "")
    expected["wall_height"]["lesson_num"] = 1
    expected["metadata"]["trainstatus_version"] = __version__
    assert same(read_fresh(path), expected)
    assert not any(p.name.endswith(".tmp") for p in path.parent.iterdir())


def test_set_of_the_reserved_metadata_category_is_one_line(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    before = path.read_bytes()
    message = (f"cannot change metadata/torch_version in {path}: the category 'metadata' is the metadata "
               "block, which trainstatus and the trainer write; nothing was changed")
    assert run("set", path, "metadata", "torch_version", "3.0") == Result(2, "", error(message))
    message = message.replace("torch_version", "stats_format_version")
    assert run("delete", path, "metadata", "stats_format_version") == Result(2, "", error(message))
    assert path.read_bytes() == before


def test_set_of_an_integer_beyond_64_bits_is_one_line(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    before = path.read_bytes()
    big = 2**64
    assert run("set", path, "c", "k", str(big)) == Result(2, "", error(
        f"cannot store c/k in {path}: the integer {big} is outside the 64-bit range that JSON readers "
        "keep exactly; pass --string to store VALUE as text instead. Nothing was written"))
    assert path.read_bytes() == before


def test_set_creates_a_missing_file_but_not_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "ts.json"
    assert run("set", path, "c", "k", "1") == Result(2, "", error(
        f"cannot create {path}: the directory {path.parent} does not exist; create it first (mkdir -p)"))
    assert list(tmp_path.iterdir()) == []


def test_set_on_a_damaged_file_keeps_it_aside_and_warns_in_one_line(tmp_path: Path) -> None:
    damaged = b'{"Walker": [1, 2]}'
    path = status_file(tmp_path, damaged)
    result = run("set", path, "wall_height", "lesson_num", "2")
    (aside,) = [p for p in path.parent.iterdir() if ".corrupt-" in p.name]
    assert aside.read_bytes() == damaged
    assert result == Result(
        0,
        f"created {path}\nwall_height/lesson_num: (not set) -> 2\n",
        f"trainstatus: warning: {path} was damaged (category 'Walker' is an array, not an object); it "
        f"was kept, byte for byte, as {aside} and the store starts empty. Inspect that file to recover "
        "anything newer\n",
    )
    assert read_fresh(path)["wall_height"] == {"lesson_num": 2}


def test_set_while_another_process_holds_a_transaction_fails_in_one_line(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    before = path.read_bytes()
    with holding(path) as holder:
        result = run("set", "--lock-timeout", "0.5", path, "wall_height", "lesson_num", "0")
        assert path.read_bytes() == before
    assert result == Result(2, "", error(
        f"could not lock {path} within 0.5 s: {path}.lock is held by pid {holder.pid} ({holder.cmdline}); "
        "let that write or transaction finish, or pass a longer --lock-timeout"))
    after = read_fresh(path)
    assert after["holder"] == {"key": 1} and after["wall_height"] == {"lesson_num": 3}


def test_set_with_a_soft_lock_waits_for_a_lease_held_on_another_machine(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    before = path.read_bytes()
    with soft_holder(path, remote=True) as holder:  # only the lease file, as a remote writer holds it
        result = run("set", "--lock", "soft", "--lock-timeout", "0.5", path, "wall_height", "lesson_num", "0")
        assert path.read_bytes() == before
        expected = soft_message(path, 0.5, holder.pid)
        expected = expected.replace("open the store with a longer lock_timeout=", "pass a longer --lock-timeout")
        assert "pass a longer --lock-timeout" in expected
        assert result == Result(2, "", error(cli_style(expected)))
    assert run("set", "--lock", "soft", path, "wall_height", "lesson_num", "0").code == 0
    assert read_fresh(path)["wall_height"] == {"lesson_num": 0}
    assert not Path(f"{path}.softlock").exists()  # the lease is given back


def test_set_waits_for_a_transaction_and_keeps_its_changes(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    script = SCRIPT or "trainstatus"
    with holding(path):
        waiting = subprocess.Popen([script, "set", str(path), "wall_height", "lesson_num", "0"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    out, err = waiting.communicate(timeout=WAIT)
    assert (waiting.returncode, out, err) == (0, "wall_height/lesson_num: 3 -> 0\n", "")
    after = read_fresh(path)
    assert after["holder"] == {"key": 1} and after["wall_height"] == {"lesson_num": 0}


def test_delete_removes_the_key_and_an_emptied_category(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    assert run("delete", path, "wall_height", "lesson_num") == Result(0, "deleted wall_height/lesson_num (was 3)\n", "")
    after = read_fresh(path)
    assert "wall_height" not in after and after["big_wall_height"] == {"lesson_num": 1}


def test_delete_of_a_key_not_set_exits_1_and_writes_nothing(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    st = path.stat()
    assert run("delete", path, "wall_height", "nope") == Result(
        1, "", error(f"wall_height/nope is not set in {path}; nothing was changed"))
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert path.read_bytes() == DATA.read_bytes()


# -- check ----------------------------------------------------------------------------------------


def test_check_of_a_sound_file(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    before = snapshot(path.parent)
    assert run("check", path) == Result(0, f"""\
ok: parses as a status document: 4 categories, 6 keys, {len(DATA.read_bytes())} bytes
ok: format version 0.3.0
ok: the lock is free (no lock file yet)
{path}: sound
""", "")
    (path.parent / "ts.json.lock").touch()
    assert "ok: the lock is free (nobody holds it)\n" in run("check", path).out
    before["ts.json.lock"] = b""
    assert snapshot(path.parent) == before


def test_check_names_the_process_holding_the_lock(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    with holding(path) as holder:
        (path.parent / TEMP).write_bytes(b"{")  # after the holder opened: opening removes stale ones
        before = snapshot(path.parent)
        result = run("check", path)
        assert snapshot(path.parent) == before
    assert result == Result(0, f"""\
ok: parses as a status document: 4 categories, 6 keys, {len(DATA.read_bytes())} bytes
ok: format version 0.3.0
info: a write or a transaction is in progress: the lock is held by pid {holder.pid} ({holder.cmdline})
info: temp file {path.parent / TEMP} (1 byte): probably the write in progress
{path}: sound
""", "")


def _host() -> str:
    from filelock._identity import host_name  # what filelock records as the holder's machine

    return host_name()


def _marker(pid: int, host: str, duration: float = 10.0) -> bytes:
    """A lease marker as filelock's SoftFileLease writes it (see filelock/_soft/_records.py)."""
    return f"filelock/2\npid={pid}\nhost={host}\nmode=lease\ntoken=0123abcd\nduration={duration!r}\n".encode()


def test_check_names_the_holder_of_a_soft_lock_lease(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    with soft_holder(path) as holder:  # a lock="soft" store in a transaction, in another process
        (path.parent / TEMP).write_bytes(b"{")
        before = snapshot(path.parent)
        result = run("check", path)
        assert snapshot(path.parent) == before
    assert result.code == 0 and result.err == ""
    lines = result.out.splitlines()
    assert lines[2].startswith(f"info: a write or a transaction is in progress: the lock is held by pid {holder.pid} (")
    assert re.fullmatch(
        re.escape(f"info: a write or a transaction is in progress: the soft lock {path}.softlock is held by "
                  f"process {holder.pid} on {_host()} (renewed ") + r"\d+\.\d s ago; its lease is 10 s\)",
        lines[3]), lines[3]
    assert lines[4:] == [f"info: temp file {path.parent / TEMP} (1 byte): probably the write in progress",
                         f"{path}: sound"]


def test_check_names_a_lease_held_from_another_machine(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    (path.parent / "ts.json.softlock").write_bytes(_marker(4242, "node7", 30.0))
    result = run("check", path)
    assert result.code == 0
    assert re.fullmatch(
        re.escape(f"info: a write or a transaction is in progress: the soft lock {path}.softlock is held by "
                  "process 4242 on node7 (renewed ") + r"\d+\.\d s ago; its lease is 30 s\)",
        result.out.splitlines()[3]), result.out


def test_check_warns_about_a_lease_left_by_a_killed_holder(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    with soft_holder(path) as holder:
        holder.kill()
        holder.wait()
    lease = path.parent / "ts.json.softlock"
    assert lease.exists()  # killed: nobody gave it back
    before = snapshot(path.parent)
    result = run("check", path)
    assert snapshot(path.parent) == before
    assert result.code == 1 and result.err == ""
    assert result.out.splitlines()[2:] == [
        "ok: the lock is free (nobody holds it)",
        f"warning: the soft lock {lease} names process {holder.pid} on {_host()}, this machine, which no longer "
        "runs: a killed writer left it; the next writer with the soft lock takes it over at once",
        f"{path}: sound, with 1 warning",
    ]


def test_check_warns_about_a_lease_not_renewed_for_longer_than_its_duration(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    lease = path.parent / "ts.json.softlock"
    lease.write_bytes(_marker(4242, "node7"))
    old = time.time() - 600
    os.utime(lease, (old, old))
    (path.parent / TEMP).write_bytes(b"{")
    result = run("check", path)
    assert result.code == 1 and result.err == ""
    lines = result.out.splitlines()
    assert re.fullmatch(
        re.escape(f"warning: the soft lock {lease} names process 4242 on node7, but it was last renewed ")
        + r"60\d\.\d" + re.escape(" s ago, longer than its 10 s lease: its holder is probably gone; the next "
                                   "writer with the soft lock takes it over"), lines[3]), lines[3]
    assert lines[4].startswith(f"warning: temp file {path.parent / TEMP} (1 byte) left by a killed writer")
    assert lines[5] == f"{path}: sound, with 2 warnings"


def test_check_of_a_lease_marker_it_cannot_read(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    (path.parent / "ts.json.softlock").write_bytes(b"garbage")
    assert result_line(run("check", path), 3) == (
        f"info: a write or a transaction may be in progress: {path}.softlock exists but names no holder "
        "(a marker being written, or not filelock's)")


def result_line(result: Result, index: int) -> str:
    assert result.err == "", result.err
    return result.out.splitlines()[index]


def test_check_warns_about_temp_files_left_by_a_killed_writer(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    (path.parent / TEMP).write_bytes(b'{"a"')
    (path.parent / TEMP2).write_bytes(b"")
    (path.parent / ".ts.json.trainstatus-nothex.tmp").write_bytes(b"")  # not ours: not reported
    before = snapshot(path.parent)
    result = run("check", path)
    assert result.code == 1 and result.err == ""
    left = "left by a killed writer; the next store to open or write this file removes it"
    assert result.out.splitlines()[3:] == [
        f"warning: temp file {path.parent / TEMP} (4 bytes) {left}",
        f"warning: temp file {path.parent / TEMP2} (0 bytes) {left}",
        f"{path}: sound, with 2 warnings",
    ]
    assert snapshot(path.parent) == before


DOUBLED = b"""{
  "wall_height": {
    "lesson_num": 1,
    "lesson_num": 3
  },
  "Walker": {"elo": 1200.0},
  "Walker": {"elo": 1300.5, "steps": 7},
  "metadata": {"stats_format_version": "0.3.0"}
}
"""
DOUBLED_PROBLEMS = [
    "problem: wall_height/lesson_num appears 2 times (1, then 3); the last, 3, is the one read; edit the "
    "file so it appears once, with the value to keep",
    'problem: the category Walker appears 2 times ({"elo": 1200.0}, then {"elo": 1300.5, "steps": 7}); the '
    'last, {"elo": 1300.5, "steps": 7}, is the one read; edit the file so it appears once, with the value to keep',
]


def test_check_reports_every_key_given_twice_and_which_value_wins(tmp_path: Path) -> None:
    path = status_file(tmp_path, DOUBLED)
    before = snapshot(path.parent)
    assert run("check", path) == Result(2, "\n".join([
        f"ok: parses as a status document: 2 categories, 3 keys, {len(DOUBLED)} bytes",
        *DOUBLED_PROBLEMS,
        "ok: format version 0.3.0",
        "ok: the lock is free (no lock file yet)",
        f"{path}: not sound: 2 names given more than once",
    ]) + "\n", "")
    assert snapshot(path.parent) == before


def test_show_and_get_warn_about_keys_given_twice(tmp_path: Path) -> None:
    path = status_file(tmp_path, DOUBLED)
    warned = "".join(f"trainstatus: warning: {path}: {line.removeprefix('problem: ')}\n" for line in DOUBLED_PROBLEMS)
    assert run("get", path, "wall_height", "lesson_num") == Result(0, "3\n", warned)
    shown = run("show", path)
    assert shown.code == 0 and shown.err == warned and "  lesson_num: 3\n" in shown.out
    assert run("show", "--json", path).err == warned


DAMAGED = {
    "empty": b"",
    "whitespace": b" \n\t",
    "truncated": DATA.read_bytes()[:200],
    "not json": b"lesson_num = 3\n",
    "not utf-8": b'{"a": {"b": "\xff"}}',
    "top level array": b"[]",
    "top level string": b'"x"',
    "category not object": b'{"Walker": 1, "metadata": {}}',
    "metadata not object": b'{"Walker": {}, "metadata": null}',
}


def _reason(data: bytes) -> str:
    with pytest.raises(Corrupt) as caught:
        load_document(data)
    return caught.value.reason


@pytest.mark.parametrize("kind", DAMAGED)
def test_check_of_a_damaged_file_changes_nothing(tmp_path: Path, kind: str) -> None:
    path = status_file(tmp_path, DAMAGED[kind])
    before = snapshot(path.parent)
    result = run("check", path)
    assert result == Result(2, f"""\
corrupt: {_reason(DAMAGED[kind])}
ok: the lock is free (no lock file yet)
{path}: corrupt
""", "")
    assert snapshot(path.parent) == before  # byte for byte; no .corrupt-, .lock or temp file


def test_check_reasons_are_the_loaders_words() -> None:
    assert _reason(DAMAGED["empty"]) == "it is empty"
    assert _reason(DAMAGED["category not object"]) == "category 'Walker' is a number, not an object"
    assert _reason(DAMAGED["metadata not object"]) == "the metadata block is null, not an object"


def library_warning(metadata: Any, path: Path) -> str:
    """The loader's own words for this metadata, as the command line prints them (``cli_style``)."""
    with pytest.warns(TrainingStatusVersionWarning) as caught:
        check_metadata(metadata, {}, location=str(path))
    (warning,) = caught
    return cli_style(str(warning.message))


@pytest.mark.parametrize(("metadata", "start"), [
    (None, "{path} has no metadata block"),
    ({"stats_format_version": "0.2.0"}, "{path} has format version '0.2.0'"),
    ({"stats_format_version": "1.0.0"}, "{path} has format version '1.0.0'"),
])
def test_check_warns_about_the_format_version(tmp_path: Path, metadata: Any, start: str) -> None:
    document: dict[str, Any] = {"wall_height": {"lesson_num": 2}}
    if metadata is not None:
        document["metadata"] = metadata
    path = status_file(tmp_path, json.dumps(document).encode())
    result = run("check", path)
    assert result.code == 1 and result.err == ""
    lines = result.out.splitlines()
    assert lines[1].startswith("warning: " + start.format(path=path))
    assert lines[1] == "warning: " + library_warning(metadata, path).replace(
        "unless the store is opened with allow_downgrade=True", "unless set or delete is given --allow-downgrade")
    assert "allow_downgrade=True" not in result.out
    assert lines[-1] == f"{path}: sound, with 1 warning"


def test_a_newer_format_is_a_warning_and_shown_whole(tmp_path: Path) -> None:
    document = {"a": {"b": 1}, "new": [1], "metadata": {"stats_format_version": "1.0.0"}}
    path = status_file(tmp_path, json.dumps(document).encode())
    result = run("check", path)
    assert result.code == 1
    assert result.out.splitlines()[1:3] == [
        "warning: " + library_warning(document["metadata"], path).replace(
            "unless the store is opened with allow_downgrade=True", "unless set or delete is given --allow-downgrade"),
        "info: not read by this version (entries of the newer format): new",
    ]
    assert run("show", path).out.endswith("new: (an entry of a newer format, not read by this trainstatus)\n")
    shown = run("show", "--json", path)
    assert shown.code == 0 and shown.err == "" and json.loads(shown.out) == document


def test_check_of_a_missing_file_or_a_directory_is_unreadable(tmp_path: Path) -> None:
    missing = tmp_path / "ts.json"
    assert run("check", missing) == Result(2, f"""\
error: no status file at {missing}
ok: the lock is free (no lock file yet)
{missing}: unreadable
""", "")
    missing.mkdir()
    (tmp_path / "ts.json.lock").write_bytes(b"")  # beside it, as if it were a status file: not looked at
    assert run("check", missing) == Result(2, f"""\
error: cannot read {missing}: it is a directory, not a status file
{missing}: unreadable
""", "")
    assert run("check", "--files", missing) == Result(2, f"""\
error: cannot read {missing}: it is a directory, not a status file
info: checkpoint files not checked (--files): the file is not a readable status document
{missing}: unreadable
""", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ts.json", "ts.json.lock"]


# -- corrupt list, corrupt restore ------------------------------------------------------------------

OLD = "ts.json.corrupt-20240101T000000.000000Z"
NEW = "ts.json.corrupt-20250601T120000.500000Z"
NEWER = NEW + "-1"  # a second copy in the same microsecond
RESTORABLE = b'{\n    "wall_height": {"lesson_num": 7},\n    "metadata": {"stats_format_version": "0.3.0", "x": NaN}\n}\n'


def test_corrupt_list_newest_first_with_size_and_whether_it_parses(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    assert run("corrupt", "list", path) == Result(0, f"no copies of {path} are kept aside\n", "")
    (path.parent / OLD).write_bytes(RESTORABLE)
    (path.parent / NEW).write_bytes(b"")
    (path.parent / NEWER).write_bytes(b'{"a": ')
    (path.parent / "ts.json.corrupt-yesterday").write_bytes(b"{}")  # not a name the store gives
    (path.parent / "other.json.corrupt-20250601T120000.500000Z").write_bytes(b"{}")
    before = snapshot(path.parent)
    result = run("corrupt", "list", path)
    d = path.parent
    width = len(str(d / NEWER))
    assert len(RESTORABLE) > 99  # so the size column is as wide as below
    assert result == Result(0, f"""\
{d / NEWER}    6 bytes  damaged: {_reason(b'{"a": ')}
{d / NEW!s:<{width}}    0 bytes  damaged: it is empty
{d / OLD!s:<{width}}  {len(RESTORABLE)} bytes  parses: 1 category, 1 key
""", "")
    assert snapshot(path.parent) == before
    assert f"info: 3 copies kept aside (damaged, or replaced by a restore), newest {d / NEWER}; " \
           "see `trainstatus corrupt list`\n" in run("check", path).out


def test_restore_round_trip_keeps_the_current_file_aside(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    path.chmod(0o640)
    current = path.read_bytes()
    (path.parent / OLD).write_bytes(RESTORABLE)
    names = set(os.listdir(path.parent))
    result = run("corrupt", "restore", path, OLD)
    (kept,) = set(os.listdir(path.parent)) - names - {"ts.json.lock"}
    kept_path = path.parent / kept
    assert result == Result(0, f"""\
kept the current {path} aside as {kept_path}
restored {path} from {path.parent / OLD} ({len(RESTORABLE)} bytes)
to undo: trainstatus corrupt restore {path} {kept_path}
""", "")
    assert path.read_bytes() == RESTORABLE and (path.parent / OLD).read_bytes() == RESTORABLE
    assert kept_path.read_bytes() == current
    assert path.stat().st_mode & 0o777 == 0o640
    assert read_fresh(path)["wall_height"] == {"lesson_num": 7}
    # Undo, with the command it printed (the copy given as a path this time).
    undo = run("corrupt", "restore", path, kept_path)
    assert undo.code == 0 and undo.err == "" and undo.out.startswith(f"kept the current {path} aside as ")
    assert path.read_bytes() == current
    assert sorted(p.read_bytes() for p in path.parent.iterdir() if ".corrupt-" in p.name) == sorted(
        [current, RESTORABLE, RESTORABLE])
    assert not any(p.name.endswith(".tmp") for p in path.parent.iterdir())


def test_restore_without_a_current_file_keeps_nothing_aside(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    (path.parent / NEW).write_bytes(RESTORABLE)
    path.unlink()
    assert run("corrupt", "restore", path, NEW) == Result(
        0, f"restored {path} from {path.parent / NEW} ({len(RESTORABLE)} bytes)\n", "")
    assert path.read_bytes() == RESTORABLE
    assert sorted(os.listdir(path.parent)) == sorted(["ts.json", "ts.json.lock", NEW])


def test_restore_refuses_a_copy_that_does_not_parse(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    (path.parent / NEW).write_bytes(b"[]")
    before = snapshot(path.parent)
    assert run("corrupt", "restore", path, NEW) == Result(2, "", error(
        f"cannot restore {NEW}: it does not parse as a status document either (its top level is an "
        "array, not an object); nothing was changed"))
    assert snapshot(path.parent) == before


def test_restore_refuses_what_is_not_a_copy_kept_aside(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    elsewhere = tmp_path / OLD
    elsewhere.write_bytes(RESTORABLE)
    before = snapshot(path.parent)
    for copy in [path, "ts.json.corrupt-yesterday", elsewhere]:
        assert run("corrupt", "restore", path, copy) == Result(2, "", error(
            f"{copy} is not a copy of {path} kept aside (expected ts.json.corrupt-<time> in "
            f"{path.parent}); `trainstatus corrupt list {path}` lists them"))
    assert run("corrupt", "restore", path, OLD) == Result(2, "", error(f"no kept-aside copy at {OLD}"))
    assert snapshot(path.parent) == before


def test_restore_waits_for_the_lock(tmp_path: Path) -> None:
    path = status_file(tmp_path)
    (path.parent / OLD).write_bytes(RESTORABLE)
    with holding(path) as holder:
        copies = {p.name for p in path.parent.iterdir() if ".corrupt-" in p.name}
        result = run("corrupt", "restore", "--lock-timeout", "0.2", path, OLD)
        assert path.read_bytes() == DATA.read_bytes()
    assert result == Result(2, "", error(
        f"could not lock {path} within 0.2 s: {path}.lock is held by pid {holder.pid} ({holder.cmdline}); "
        "let that write or transaction finish, or pass a longer --lock-timeout"))
    assert {p.name for p in path.parent.iterdir() if ".corrupt-" in p.name} == copies == {OLD}
    assert read_fresh(path)["holder"] == {"key": 1}


def test_a_symlinked_status_file_keeps_its_copies_beside_the_target(tmp_path: Path) -> None:
    path = status_file(tmp_path)  # the target, in run/
    link = tmp_path.resolve() / "link.json"
    link.symlink_to(path)
    (path.parent / OLD).write_bytes(RESTORABLE)
    assert run("corrupt", "list", link).out.startswith(f"{path.parent / OLD}  ")
    result = run("corrupt", "restore", link, OLD)
    assert result.code == 0 and result.err == ""
    assert link.is_symlink() and path.read_bytes() == RESTORABLE
    (kept,) = [p for p in path.parent.iterdir() if ".corrupt-" in p.name and p.name != OLD]
    assert kept.read_bytes() == DATA.read_bytes()
    assert result.out.splitlines()[0] == f"kept the current {link} aside as {kept}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "run"]


def test_check_of_a_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "ts.json"
    os.mkfifo(fifo)
    result = run("check", fifo)
    assert result.code == 2
    assert result.out.splitlines()[0] == f"error: cannot read {fifo}: not a regular file"
    assert run("get", fifo, "c", "k") == Result(2, "", error(f"cannot read {fifo}: not a regular file"))


# -- issue 13: the parser answers without loading the store -------------------------------------


def test_help_and_usage_errors_load_no_store_and_the_lock_modes_agree() -> None:
    from trainstatus._cli import main as _cli_main
    from trainstatus._lock import path_lock as _locking

    assert _cli_main.LOCK_MODES == _locking.LOCK_MODES
    code = (
        "import sys\n"
        "from trainstatus._cli.main import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as exc:\n"
        "    status = exc.code\n"
        "heavy = sorted(m for m in ('orjson', 'filelock', 'trainstatus._store', 'trainstatus._cli.write', "
        "'trainstatus._cli.check', 'trainstatus._cli.corrupt', 'trainstatus._cli.target', 'trainstatus._cli.values') "
        "if m in sys.modules)\n"
        "print(status, heavy)\n"
    )
    for argv, status in ((["--help"], 0), (["show", "--help"], 0), (["diff", "--help"], 0), (["nosuch"], 2)):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        assert done.stdout.strip().splitlines()[-1] == f"{status} []", (argv, done.stdout, done.stderr)


def test_show_and_get_read_with_json_alone(tmp_path: Path) -> None:
    """show and get load neither the codec nor orjson (their start-up was mostly that import)."""
    status = tmp_path / "status.json"
    with StatusStore(status) as store:
        store.set("Walker", "lesson", 3)
    code = (
        "import contextlib, io, sys\n"
        "from trainstatus._cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    status = main(sys.argv[1:])\n"
        "heavy = sorted(m for m in ('orjson', 'filelock', 'trainstatus._codec.values', 'trainstatus._store', "
        "'trainstatus._cli.write', 'trainstatus._cli.check', 'trainstatus._cli.corrupt', 'trainstatus._cli.target', "
        "'trainstatus._cli.values') if m in sys.modules)\n"
        "print(status, heavy, out.getvalue().count('lesson'))\n"
    )
    for argv, expected in ((["show", str(status)], "0 [] 1"), (["get", str(status), "Walker", "lesson"], "0 [] 0"),
                           (["show", "--json", str(status)], "0 [] 1")):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == expected, (argv, done.stdout, done.stderr)



def test_a_value_nested_at_the_stacks_limit_is_a_one_line_error() -> None:
    """set's VALUE is parsed, then parsed again to find repeated keys, two frames deeper: a value
    that fits the first parse but not the second is the same error as one that fits neither."""
    from trainstatus._cli import base as _cli_base, values as _cli_values

    def nested(depth: int) -> str:
        return "[" * depth + "]" * depth

    limit = next(d for d in range(100, 100_000, 1) if _raises_recursion(nested(d)))
    outcomes = set()
    for depth in range(limit - 12, limit + 1):
        try:
            _cli_values._parse_value(nested(depth))
            outcomes.add("parsed")
        except _cli_base._Fail as exc:
            assert exc.message == "VALUE is nested too deeply to be stored"
            outcomes.add("refused")
    assert outcomes == {"parsed", "refused"}


def _raises_recursion(text: str) -> bool:
    try:
        json.loads(text)
    except RecursionError:
        return True
    return False
