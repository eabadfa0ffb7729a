"""The command line's words: help and manual agree with what the commands do, errors name the
problem and the way out. In-process ``main`` (fast); ``test_cli.py`` runs the installed script.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from trainstatus import StatusStore, _cli, _cli_main, _history, _storage

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
    return sorted(name for name, sub in _commands(_cli_main._parser()).items()
                  if "--lock-timeout" in sub._option_string_actions)


def test_the_commands_that_write_are_the_ones_help_and_manual_name() -> None:
    assert _writers() == ["corrupt restore", "delete", "restore", "set"]
    top = _cli_main._parser().format_help()
    named = re.search(r"commands that change the file \(([^)]*)\)", " ".join(top.split()))
    assert named is not None and sorted(named.group(1).split(", ")) == _writers()
    manual = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    listed = re.search(r"Python\. ((?:`[a-z ]+`(?:, | and ))+`[a-z ]+`) take the lock", manual)
    assert listed is not None and sorted(re.findall(r"`([a-z ]+)`", listed.group(1))) == _writers()
    lock = re.search(r"((?:`[a-z ]+`(?:, | and ))+`[a-z ]+`) take `--lock-timeout SECONDS`", manual)
    assert lock is not None and sorted(re.findall(r"`([a-z ]+)`", lock.group(1))) == _writers()


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
    _storage._closer.wait()
    return _history.versions(str(path.parent), path.name)


def test_history_after_a_damaged_version_does_not_call_the_next_one_the_oldest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    lessons(path, 4)  # versions 1 to 3
    Path(versions(path)[1].path).write_bytes(b"[1,")  # version 2 damaged
    assert _cli.main(["history", str(path)]) == 0
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
    assert _cli.main([*command, str(path)]) == 2
    assert capsys.readouterr() == ("", f"trainstatus: error: no status file at {path}\n")
    assert list(tmp_path.iterdir()) == []


def test_history_of_a_missing_file_lists_what_is_left_and_says_how_to_put_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    lessons(path, 3)
    path.unlink()
    assert _cli.main(["history", str(path)]) == 2
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()] == ["VERSION", "2", "1"]
    assert err == (f"trainstatus: error: no status file at {path} (the versions above are kept beside where it "
                   f"was; `trainstatus restore {path} 2` puts the newest back)\n")


def test_corrupt_list_of_a_missing_file_lists_the_copies_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    copy = tmp_path / "status.json.corrupt-20250101T120000.000000Z"
    copy.write_bytes(b"[1,")
    assert _cli.main(["corrupt", "list", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out.startswith(str(copy))
    assert err == (f"trainstatus: error: no status file at {path} (the copies above are kept beside where it "
                   f"was; `trainstatus corrupt restore {path} COPY` puts one back)\n")


def test_restore_of_what_is_not_a_number_suggests_only_what_restore_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    lessons(path, 3)
    assert _cli.main(["restore", str(path), "abc"]) == 2
    assert capsys.readouterr().err == (
        f"trainstatus: error: 'abc' is not a version: give a number from `trainstatus history {path}`\n")
    assert _cli.main(["diff", str(path), "abc"]) == 2  # diff does take current
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
    assert _cli.main([*command, str(path)] if len(command) < 2 or command[0] == "corrupt"
                     else [command[0], str(path), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{blocking} is a file, not a directory" in err, err
    assert "does not exist" not in err and blocking.read_text() == "{}"
