"""The command line's words: help and manual agree with what the commands do, errors name the
problem and the way out. In-process ``main`` (fast); ``test_cli.py`` runs the installed script.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from trainstatus import _cli_main

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
