"""The command line's words: help and manual agree with what the commands do, errors name the
problem and the way out. In-process ``main`` (fast); ``test_cli.py`` runs the installed script.
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainstatus import CheckpointList, StatusStore
from trainstatus._storage import atomic as _atomic, history as _history
from trainstatus._storage.closer import _closer
from trainstatus._cli import base as _cli_base, main as _cli_main, parser as _cli_parser

ROOT = Path(__file__).resolve().parent.parent


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command (``corrupt restore`` included) with its parser."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[prefix + name] = sub
                found.update(_commands(sub, f"{prefix}{name} "))
    return found


def _writers() -> list[str]:
    """The commands that write the file: those that wait for its lock."""
    return sorted(name for name, sub in _commands(_cli_parser._parser()).items()
                  if "--lock-timeout" in sub._option_string_actions)


def test_the_commands_that_write_are_the_ones_help_and_manual_name() -> None:
    assert _writers() == ["corrupt restore", "delete", "prune-missing", "restore", "set"]
    top = _cli_parser._parser().format_help()
    named = re.search(r"commands that change the file \(([^)]*)\)", " ".join(top.split()))
    assert named is not None and sorted(named.group(1).split(", ")) == _writers()
    manual = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    listed = re.search(r"Python\. ((?:`[a-z -]+`(?:, | and ))+`[a-z -]+`) take the lock", manual)
    assert listed is not None and sorted(re.findall(r"`([a-z -]+)`", listed.group(1))) == _writers()
    lock = re.search(r"((?:`[a-z -]+`(?:, | and ))+`[a-z -]+`) take `--lock-timeout SECONDS`", manual)
    assert lock is not None and sorted(re.findall(r"`([a-z -]+)`", lock.group(1))) == _writers()


@pytest.mark.parametrize("where", ["src", "docs"])
def test_a_damaged_file_is_never_said_to_start_empty_without_its_history(where: str) -> None:
    # A local store starts from the newest intact version in its history; "empty" only without one
    # (an s3:// object has no history: there the store does start empty).
    for path in sorted((ROOT / where).rglob("*.*")):
        if path.suffix not in (".py", ".md") or path.name == "changelog.md":
            continue
        text = " ".join(path.read_text().split())
        for found in re.finditer(r"(?:damaged|corrupt)[^.]*?(?:starts? empty|starts? from an empty)[^.;]*", text):
            sentence = found.group(0)
            assert "history" in sentence or "damaged object" in sentence or "s3:" in sentence, f"{path}: {sentence}"


# -- history, corrupt list, diff, restore: what they say of a missing or damaged file --------------


def lessons(path: Path, count: int) -> None:
    with StatusStore(path) as store:
        for lesson in range(count):
            store.set("wall_height", "lesson_num", lesson)


def versions(path: Path) -> list[_history.Version]:
    _closer.wait()
    return _history.versions(str(path.parent), path.name)


def test_history_after_a_damaged_version_does_not_call_the_next_one_the_oldest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    lessons(path, 4)  # versions 1 to 3
    Path(versions(path)[1].path).write_bytes(b"[1,")  # version 2 damaged
    assert _cli_main.main(["history", str(path)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["1"].endswith("(the oldest kept)")
    assert "damaged: " in rows["2"]
    assert rows["3"].endswith("(the version before is damaged: nothing to compare with)")
    assert rows["current"].endswith("wall_height/lesson_num")


@pytest.mark.parametrize("command", [["history"], ["corrupt", "list"], ["diff"]])
def test_a_missing_file_without_versions_or_copies_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    path = tmp_path / "status.json"
    assert _cli_main.main([*command, str(path)]) == 2
    assert capsys.readouterr() == ("", f"trainstatus: error: no status file at {path}\n")
    assert list(tmp_path.iterdir()) == []


# A file that is gone but left versions or copies (a store moved it aside as damaged and has not
# written since): what is left is listed, with how to put it back; not an error.


def test_history_of_a_missing_file_lists_what_is_left_and_says_how_to_put_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    lessons(path, 3)
    path.unlink()
    assert _cli_main.main(["history", str(path)]) == 0
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()[:-1]] == ["VERSION", "2", "1"]
    assert out.splitlines()[-1] == (f"(no status file at {path} now; `trainstatus restore {path} 2` puts the "
                                    "newest version back, as a store opened with resume=True does)")
    assert err == ""


def test_corrupt_list_of_a_missing_file_lists_the_copies_and_says_how_to_put_one_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    copy = tmp_path / "status.json.corrupt-20250101T120000.000000Z"
    copy.write_bytes(b"[1,")
    assert _cli_main.main(["corrupt", "list", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(str(copy)) and err == ""
    assert out.splitlines()[-1] == (f"(no status file at {path} now; `trainstatus corrupt restore {path} COPY` puts "
                                    "a copy back)")


def test_restore_of_what_is_not_a_number_suggests_only_what_restore_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    lessons(path, 3)
    assert _cli_main.main(["restore", str(path), "abc"]) == 2
    assert capsys.readouterr().err == (
        f"trainstatus: error: 'abc' is not a version: give a number from `trainstatus history {path}`\n")
    assert _cli_main.main(["diff", str(path), "abc"]) == 2  # diff does take current
    assert capsys.readouterr().err == (f"trainstatus: error: 'abc' is not a version: give a number from "
                                       f"`trainstatus history {path}`, or 'current' for the file itself\n")


@pytest.mark.parametrize("command", [["show"], ["get", "c", "k"], ["set", "c", "k", "1"], ["delete", "c", "k"],
                                     ["history"], ["diff"], ["corrupt", "list"]])
def test_a_parent_that_is_a_file_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    blocking = tmp_path / "run.json"
    blocking.write_text("{}")
    path = blocking / "deeper" / "status.json"
    assert _cli_main.main([*command, str(path)] if len(command) < 2 or command[0] == "corrupt"
                     else [command[0], str(path), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{blocking} is a file, not a directory" in err, err
    assert "does not exist" not in err and blocking.read_text() == "{}"


# -- set: numbers a float cannot hold, integers beyond 64 bits, values from standard input ----------


def status(tmp_path: Path) -> Path:
    path = tmp_path / "status.json"
    with StatusStore(path) as store:
        store.set("c", "k", 1)
    return path


@pytest.mark.parametrize(("value", "problem", "meant"), [
    ("1e400", "is a number too large for a float: it would be stored as Infinity", "Infinity"),
    ("-1E+400", "is a number too large for a float: it would be stored as -Infinity", "-Infinity"),
    ("[1, 2.5e999]", "holds 2.5e999, a number too large for a float: it would be stored as Infinity", "Infinity"),
    ("1e-400", "is a number too small for a float: it would be stored as 0", "0"),
    ('{"reward": -0.5e-999}', "holds -0.5e-999, a number too small for a float: it would be stored as 0", "0"),
])
def test_set_of_a_number_a_float_cannot_hold_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, problem: str, meant: str
) -> None:
    path = status(tmp_path)
    before = path.read_bytes()
    assert _cli_main.main(["set", str(path), "c", "k", "--", value]) == 2
    assert capsys.readouterr().err == (
        f"trainstatus: error: VALUE {value!r} {problem}; nothing was changed. Write {meant} if that is what you "
        "mean, or pass --string to store the text as it is\n")
    assert path.read_bytes() == before


@pytest.mark.parametrize(("value", "stored"), [("Infinity", math.inf), ("-Infinity", -math.inf), ("0e-400", 0.0),
                                               ("1.5e300", 1.5e300), ("5e-324", 5e-324)])
def test_set_of_infinity_spelled_out_and_of_numbers_a_float_holds_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, stored: float
) -> None:
    path = status(tmp_path)
    assert _cli_main.main(["set", str(path), "c", "k", "--", value]) == 0
    with StatusStore(path) as store:
        assert store.get("c", "k") == stored


def test_set_of_an_integer_beyond_64_bits_says_to_pass_string(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = status(tmp_path)
    assert _cli_main.main(["set", str(path), "c", "k", "[18446744073709551616]"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("is outside the 64-bit range that JSON readers keep exactly; pass --string to store VALUE "
                        "as text instead. Nothing was written\n") and "str(value)" not in err


def stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_set_reads_a_value_of_a_megabyte_from_standard_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = status(tmp_path)
    checkpoints = [{"steps": n, "file_path": f"results/run/Walker-{n:012d}.onnx"} for n in range(20000)]
    text = json.dumps(checkpoints)
    assert len(text) > 2**20  # beyond what a command line takes (about 128 KB for one argument)
    stdin(monkeypatch, text.encode() + b"\n")
    assert _cli_main.main(["set", str(path), "Walker", "checkpoints", "-"]) == 0
    with StatusStore(path) as store:
        assert store.get("Walker", "checkpoints") == checkpoints
    stdin(monkeypatch, "Walker-5.onnx\r\n".encode())  # plain text, stored as a string as on the command line
    assert _cli_main.main(["set", str(path), "Walker", "note", "-"]) == 0
    stdin(monkeypatch, b"[1,\n")
    assert _cli_main.main(["set", str(path), "Walker", "bad", "-"]) == 2
    assert "VALUE '[1,' looks like JSON but is not" in capsys.readouterr().err
    with StatusStore(path) as store:
        assert store.get("Walker", "note") == "Walker-5.onnx" and store.get("Walker", "bad", None) is None


def test_set_string_dash_stores_the_text_dash_and_does_not_wait_for_standard_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As before VALUE - read standard input: "-" is then the text, as any other VALUE with --string.
    path = status(tmp_path)
    stdin(monkeypatch, b'"from standard input"\n')
    assert _cli_main.main(["set", str(path), "c", "dash", "--string", "-"]) == 0
    assert sys.stdin.read() == '"from standard input"\n'  # left unread: nothing waits on it
    stdin(monkeypatch, b'"from standard input"\n')
    assert _cli_main.main(["set", str(path), "c", "read", "-"]) == 0  # without --string, - reads it
    with StatusStore(path) as store:
        assert store.get("c", "dash") == "-" and store.get("c", "read") == "from standard input"
    assert capsys.readouterr().out.splitlines() == ['c/dash: (not set) -> "-"',
                                                    'c/read: (not set) -> "from standard input"']


def test_set_refuses_standard_input_that_is_not_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = status(tmp_path)
    stdin(monkeypatch, b'"caf\xe9"')
    assert _cli_main.main(["set", str(path), "c", "k", "-"]) == 2
    assert capsys.readouterr().err == ("trainstatus: error: VALUE - (standard input) is not UTF-8 text: invalid "
                                       "continuation byte at byte 4; nothing was changed\n")


def test_set_reads_standard_input_in_a_real_pipe(tmp_path: Path) -> None:
    path = status(tmp_path)
    value = "x" * (2**20)
    done = subprocess.run([sys.executable, "-m", "trainstatus", "set", str(path), "c", "k", "-"],
                          input=json.dumps(value), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    with StatusStore(path) as store:
        assert store.get("c", "k") == value


# -- show: long values cut, names that hold the output's separators quoted -------------------------


def test_show_cuts_a_long_value_and_says_how_to_get_all_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    big = "x" * 5_000_000
    with StatusStore(path) as store:
        store.set("Walker", "notes", big)
        store.set("Walker", "elo", 1200.0)
    assert _cli_main.main(["show", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    notes = next(line for line in lines if line.startswith("  notes: "))
    text = json.dumps(big)
    assert notes == (f"  notes: {text[:300]}... (cut: {len(text):,} characters; "
                     f"`trainstatus get {path} Walker notes` prints it whole)")
    assert "  elo: 1200.0" in lines
    assert _cli_main.main(["get", "--compact", str(path), "Walker", "notes"]) == 0
    assert capsys.readouterr().out == text + "\n"  # get prints it whole


def test_set_and_delete_cut_long_values_they_print(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = status(tmp_path)
    big = list(range(1000))
    assert _cli_main.main(["set", str(path), "c", "k", json.dumps(big)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("c/k: 1 -> [0, 1, 2,") and out.endswith(
        f"... (cut: {len(json.dumps(big)):,} characters; `trainstatus get {path} c k` prints it whole)\n")
    assert len(out) < 500
    assert _cli_main.main(["delete", str(path), "c", "k"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("deleted c/k (was [0, 1, 2,") and out.endswith(
        f"... cut: {len(json.dumps(big)):,} characters; `trainstatus diff {path}` shows it whole)\n")


@pytest.mark.parametrize(("category", "key", "category_shown", "key_shown"), [
    ("a/b", "c", '"a/b"', "c"),
    ("a", "b/c", "a", '"b/c"'),
    ("run:1", "lesson: 2", '"run:1"', '"lesson: 2"'),
    ('"quoted"', "k", '"\\"quoted\\""', "k"),
])
def test_names_holding_the_outputs_separators_are_quoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], category: str, key: str, category_shown: str, key_shown: str
) -> None:
    path = status(tmp_path)
    assert _cli_main.main(["set", str(path), category, key, "3"]) == 0
    assert capsys.readouterr().out == f"{category_shown}/{key_shown}: (not set) -> 3\n"
    assert _cli_main.main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"\n{category_shown}:\n  {key_shown}: 3\n" in out


# -- check --files and prune-missing -----------------------------------------------------------------


def checkpoint(steps: int, name: str) -> dict[str, object]:
    return {"steps": steps, "file_path": f"results/run1/Walker/{name}.onnx", "reward": 1.0,
            "creation_time": 1.0, "auxillary_file_paths": [f"results/run1/Walker/{name}.pt"]}


def run_with_checkpoints(tmp_path: Path) -> Path:
    """Three checkpoints (the second one's .pt gone) and a final one whose files are all gone."""
    models = tmp_path / "results" / "run1" / "Walker"
    models.mkdir(parents=True)
    for name in ("Walker-100.onnx", "Walker-100.pt", "Walker-200.onnx", "Walker-300.onnx", "Walker-300.pt"):
        (models / name).write_bytes(b"model")
    status = tmp_path / "results" / "run1" / "status.json"
    with StatusStore(status) as store:
        store.set("Walker", "checkpoints", [checkpoint(100, "Walker-100"), checkpoint(200, "Walker-200"),
                                            checkpoint(300, "Walker-300")])
        store.set("Walker", "final_checkpoint", checkpoint(400, "Walker"))
    return status


def test_check_files_suggests_the_commands_that_fix_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = run_with_checkpoints(tmp_path)
    assert _cli_main.main(["check", "--files", "--root", str(tmp_path), str(status)]) == 1
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: Walker/checkpoints lists results/run1/Walker/Walker-200.pt, which does not exist (under "
        f"{tmp_path}); a resume from it fails: put the file back, or `trainstatus prune-missing --root {tmp_path} "
        f"{status}` removes such entries",
        *(f"warning: Walker/final_checkpoint lists results/run1/Walker/Walker.{ext}, which does not exist (under "
          f"{tmp_path}); a resume from it fails: put the file back, or `trainstatus delete {status} Walker "
          "final_checkpoint` removes it" for ext in ("onnx", "pt")),
    ]


def test_prune_missing_drops_the_entries_check_files_warns_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run_with_checkpoints(tmp_path)
    assert _cli_main.main(["prune-missing", "--root", str(tmp_path), str(status)]) == 0
    assert capsys.readouterr().out == (
        "removed from Walker/checkpoints: step 200, results/run1/Walker/Walker-200.onnx\n"
        "kept Walker/final_checkpoint: it lists results/run1/Walker/Walker.onnx, which does not exist; "
        f"`trainstatus delete {status} Walker final_checkpoint` removes it\n"
        "kept Walker/final_checkpoint: it lists results/run1/Walker/Walker.pt, which does not exist; "
        f"`trainstatus delete {status} Walker final_checkpoint` removes it\n"
        f"1 checkpoint entry removed from {status}\n")
    with StatusStore(status) as store:
        assert [e["steps"] for e in store.get("Walker", "checkpoints")] == [100, 300]
        assert store.get("Walker", "final_checkpoint")["steps"] == 400
    assert (tmp_path / "results" / "run1" / "Walker" / "Walker-200.onnx").exists()  # files are not touched
    assert _cli_main.main(["prune-missing", "--root", str(tmp_path), str(status)]) == 0
    assert capsys.readouterr().out.endswith(f"nothing removed: every file a checkpoints list of {status} names exists with its recorded size\n")


@pytest.mark.parametrize("files", [1, 10])
def test_check_files_says_a_deleted_checkpoint_folder_once_with_how_many_files_it_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: int
) -> None:
    # One line per missing folder, not one per file recorded in it (a deleted checkpoint-100/ of
    # ten files was eleven near-identical warnings); a file missing from a folder that is still
    # there keeps its own line, and the folder kept whole is not mentioned.
    run = tmp_path / "run"
    status = run / "training_status.json"
    with StatusStore(status) as store:
        checkpoints = CheckpointList(store, "transformers", keep=None, root=run)
        for step in (100, 200, 300):
            folder = run / f"checkpoint-{step}"
            folder.mkdir(parents=True)
            for i in range(files):
                (folder / f"shard-{i}.bin").write_bytes(b"x" * (i + 1))
            checkpoints.add(step, f"checkpoint-{step}")
    shutil.rmtree(run / "checkpoint-100")
    (run / "checkpoint-300" / "shard-0.bin").unlink()
    prune = f"`trainstatus prune-missing {status}` removes such entries"
    assert _cli_main.main(["check", "--files", str(status)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("warning: ")] == [
        f"warning: transformers/checkpoints lists the folder checkpoint-100 ({'1 file' if files == 1 else '10 files'} "
        f"recorded in it), which does not exist (under {run}); a resume from it fails: put the folder back, or {prune}",
        f"warning: transformers/checkpoints lists checkpoint-300/shard-0.bin, which does not exist (under {run}); "
        f"a resume from it fails: put the file back, or {prune}",
    ]
    assert out[-1] == f"{status}: sound, with 2 warnings"


@pytest.mark.parametrize("command", [["check", "--files"], ["prune-missing"]])
def test_a_root_that_is_not_a_directory_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    status = run_with_checkpoints(tmp_path)
    before = status.read_bytes()
    for root, what in [(tmp_path / "nowhere", "does not exist"), (status, "is not a directory")]:
        assert _cli_main.main([*command, "--root", str(root), str(status)]) == 2
        assert capsys.readouterr() == ("", f"trainstatus: error: --root {root} {what}: give the directory the "
                                           "checkpoint paths listed in the file are relative to (where "
                                           "mlagents-learn ran)\n")
    assert status.read_bytes() == before


def test_check_counts_one_version_in_the_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "status.json"
    lessons(path, 2)
    assert _cli_main.main(["check", str(path)]) == 0
    assert "info: 1 earlier version kept in the history (number 1); see `trainstatus history`\n" in capsys.readouterr().out


def test_every_command_found_in_the_parser_has_help_with_an_example() -> None:
    commands = _commands(_cli_parser._parser())
    assert {"history", "diff", "restore", "prune-missing", "corrupt restore"} <= set(commands)
    for name, sub in commands.items():
        text = sub.format_help()
        assert "example" in text, name
        assert f"trainstatus {name} " in text.split("example", 1)[1], name


# -- one style for the command line's own messages and the library's --------------------------------


def test_a_library_error_reads_like_the_command_lines_own_and_says_things_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = status(tmp_path)

    def denied(fd: int, data: bytes) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(_atomic, "write_all", denied)
    assert _cli_main.main(["set", str(path), "c", "k", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (f"trainstatus: error: could not save {path} (writing it): Permission denied. The file was left "
                   "as it was; fix the permissions of the directory, then set the value again\n")
    assert err.lower().count("permission denied") == 1


def test_a_set_handed_over_and_not_finished_is_not_called_a_lock_it_could_not_take(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """TrainingStatusUnfinishedWrite is a lock timeout, but its change was handed to the holder and
    may be in the file: the command line says so, in its own words, not "could not lock"."""
    from trainstatus._lock import descriptor as _descriptor

    path = status(tmp_path)

    def stuck_holder(self: object, deadline: float | None, offer: object = None) -> bool:
        raise _descriptor._Unfinished(4242)  # the holder that took this set's change hangs in its write

    monkeypatch.setattr(_descriptor._HeldDescriptor, "acquire", stuck_holder)
    assert _cli_main.main(["set", "--lock-timeout", "2", str(path), "c", "k", "2"]) == 2
    assert capsys.readouterr().err == (
        f"trainstatus: error: could not finish this write of {path}: its change was handed to process 4242, which "
        "holds the lock and took it into its own write, but has not finished that write 10 s after this call's "
        "lock_timeout (2.0 s) ran out (it may be stopped, or its disk hung). The change may or may not be in the "
        "file: read it once that process goes on, or set the value again\n")


def test_a_library_error_keeps_the_spaces_inside_a_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One line, but a category "a  b" is still "a  b": only the message's line breaks are joined.
    path = status(tmp_path)
    assert _cli_main.main(["set", str(path), "wall  height", "k", str(2**64)]) == 2
    assert capsys.readouterr().err.startswith(f"trainstatus: error: cannot store wall  height/k in {path}: ")


@pytest.mark.parametrize(("library", "shown"), [
    ("Could not lock x.json within 1 s.", "could not lock x.json within 1 s"),
    ("Cannot store c/k in x.json: the integer 1 is too big. Nothing was written.",
     "cannot store c/k in x.json: the integer 1 is too big. Nothing was written"),
    ("/runs/x.json was damaged (it is empty); it was kept.", "/runs/x.json was damaged (it is empty); it was kept"),
    ("StatusStore(...) needs a path.", "StatusStore(...) needs a path"),  # a name keeps its capitals
    ("CheckpointList category= must be a str.", "CheckpointList category= must be a str"),
    ("Look at the file...", "look at the file..."),  # an ellipsis stays whole
    ("Two\nlines.", "two lines"),
    ("Two \r\n  lines, a  b kept.", "two lines, a  b kept"),
])
def test_library_messages_in_the_command_lines_style(library: str, shown: str) -> None:
    assert _cli_base._cli_words(library) == shown


def test_the_readme_lists_every_command() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    listed = re.search(r"\[Command line\]\(docs/cli\.md\): ((?:`[a-z -]+`, )+)and their exit codes", readme)
    assert listed is not None
    names = [name.removeprefix("trainstatus ") for name in re.findall(r"`([a-z -]+)`", listed.group(1))]
    assert sorted(names) == sorted(name for name in _commands(_cli_parser._parser()) if " " not in name)
