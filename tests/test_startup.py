"""What starting up imports: ``from trainstatus import StatusStore`` and ``trainstatus show FILE``
load none of the modules they were made to do without (issue 23's start-up figures).

Checked in a fresh interpreter against a list of modules, not timed: a slip (an import moved back
to the top of a module) fails here on any machine, loaded or not.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainstatus import StatusStore

# Loaded by the first store that opens (orjson, and the modules its setup imports), by the code
# that needs them (json for files with NaN or not written by trainstatus, hashlib for names of
# 222 bytes and more, datetime for a restore or a copy kept aside, copy/random for rare errors and
# S3 retries, logging only by the program itself, the S3 backend by an s3:// URL), or never; typing
# (and the re it imports) by type checkers alone; enum by orjson's setup (signal, which imports it,
# never: the Ctrl-C guard uses the C module _signal); a value's refusal and an I/O error's message
# when one happens.
NOT_FOR_THE_STORE_CLASS = (
    "orjson", "dataclasses", "inspect", "uuid", "platform", "logging", "json", "hashlib", "datetime", "copy",
    "random", "trainstatus._remote.s3", "shutil", "argparse", "pickle", "numpy", "boto3", "traceback", "tokenize",
    "subprocess", "tempfile", "typing", "re", "enum", "signal", "trainstatus._codec.refusals",
    "trainstatus._storage.messages",
)
# show reads with Python's json alone and prints: no codec, no store, no lock; a plain `show PATH` is
# read without argparse (nor the gettext and locale its messages import), and argparse's formatter,
# where it is used, does not find the terminal's width through shutil (which imports bz2, lzma, zlib).
NOT_FOR_SHOW = (
    "orjson", "dataclasses", "inspect", "uuid", "platform", "logging", "hashlib", "datetime", "copy", "random",
    "shutil", "bz2", "lzma", "zlib", "fnmatch", "trainstatus._codec.values", "trainstatus._store", "trainstatus._remote.s3",
    "trainstatus._storage.local", "trainstatus._cli.write", "trainstatus._cli.check", "trainstatus._cli.corrupt",
    "trainstatus._cli.target", "trainstatus._cli.values", "trainstatus._storage.base", "trainstatus._lock.path_lock",
    "pickle", "numpy", "traceback", "subprocess", "tempfile",
    "argparse", "gettext", "locale", "trainstatus._cli.parser", "shlex", "signal", "math",
)


def loaded_after(code: str, *argv: str) -> dict[str, str]:
    """The modules a fresh interpreter holds after ``code``, each with its type's name (a module
    importlib's LazyLoader made but nothing has used yet is a ``_LazyModule``)."""
    report = (  # importing nothing itself (json would be one of the modules looked for)
        "\nimport sys as _sys\n"
        "_sys.stderr.write(''.join(f'MODULE {n} {type(m).__name__}\\n' for n, m in list(_sys.modules.items())))\n"
    )
    # Without pytest-cov's measuring of subprocesses (its variables make the child start coverage,
    # which imports much of what is looked for here).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COV_CORE_", "COVERAGE_"))}
    done = subprocess.run([sys.executable, "-c", code + report, *argv], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stderr.splitlines() if line.startswith("MODULE ")]
    return {name: kind for _, name, kind in lines}


def imported(modules: dict[str, str], names: tuple[str, ...]) -> list[str]:
    return sorted(name for name in names if name in modules and modules[name] != "_LazyModule")


def test_importing_the_store_class_loads_no_heavy_module() -> None:
    modules = loaded_after("from trainstatus import StatusStore")
    assert imported(modules, NOT_FOR_THE_STORE_CLASS) == []
    assert "trainstatus._store" in modules  # the import did happen
    assert modules.get("filelock") in (None, "_LazyModule")  # the first lock loads it


# Read only to word an error: who holds the lock (a timeout), chattr's marks (a refused write), the
# messages of a failed write. Writes that succeed pay nothing for them.
ONLY_FOR_ERRORS = ("trainstatus._lock.holders", "trainstatus._lock.attributes", "trainstatus._storage.messages")


def test_writes_load_nothing_that_only_words_an_error(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from trainstatus import StatusStore\n"
        "store = StatusStore(sys.argv[1])\n"
        "store.set('c', 'k', 1)\n"
        "with store.transaction():\n"
        "    store.set('c', 'k', 2)\n"
        "store.close()\n"
    )
    modules = loaded_after(code, str(tmp_path / "status.json"))
    assert "trainstatus._lock.path_lock" in modules  # the lock was taken
    assert imported(modules, ONLY_FOR_ERRORS) == []


def test_show_loads_no_heavy_module(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    with StatusStore(status) as store:
        store.set("wall_height", "lesson_num", 3)
    code = (
        "import contextlib, io, sys\n"
        "from _trainstatus_cli import main\n"
        "sys.argv[0] = 'trainstatus'\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert main() == 0\n"
        "assert 'lesson_num: 3' in out.getvalue(), out.getvalue()\n"
    )
    modules = loaded_after(code, "show", str(status))
    assert imported(modules, NOT_FOR_SHOW) == []
    assert "trainstatus._cli.read" in modules


# Arguments that argparse reads in different ways: options of show, their abbreviations and
# misspellings, a PATH that starts with "-" (some are options, some a PATH), "--", an empty PATH.
_TOKENS = ("show", "get", "f.json", "s3://b/k", "--json", "--js", "--json=1", "--jsonx", "--", "-", "-1", "-a b",
           "-h", "--help", "--version", "", "--storage-option", "x=y")


def _argparse_reads(argv: list[str]) -> dict[str, object] | None:
    """What the full parser makes of ``argv`` (the command named, not its object), or None when it
    refuses it."""
    from trainstatus._cli.parser import _parser

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = _parser().parse_args(argv)
    except SystemExit:
        return None
    return {**vars(args), "run": (args.run.module, args.run.function)}


def test_a_plain_show_is_read_as_argparse_reads_it() -> None:
    """Every command line ``_plain_show`` reads without argparse (any argument of ``_TOKENS`` after
    show, up to three) is one argparse reads, to the same attributes; the rest are left to argparse."""
    from trainstatus._cli.main import _plain_show

    accepted = []
    for count in range(4):
        for rest in itertools.product(_TOKENS, repeat=count):
            for argv in (["show", *rest], [*rest, "show"]):
                args = _plain_show(argv)
                if args is None:
                    continue
                accepted.append(argv)
                assert {**vars(args), "run": (args.run.module, args.run.function)} == _argparse_reads(argv), argv
    assert ["show", "f.json"] in accepted and ["show", "--json", "s3://b/k"] in accepted
    assert ["show", "-a b", "--json"] not in accepted  # argparse reads it as a PATH; left to argparse all the same
    assert _argparse_reads(["show", "-a b", "--json"]) is not None


@pytest.mark.parametrize("columns", ["", "57", "x"])
def test_the_help_is_as_wide_as_shutil_says(monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    """The width argparse's formatter is given is the one it would have asked shutil for."""
    import shutil

    from trainstatus._cli import parser as _cli_parser

    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
    import argparse

    assert _cli_parser._terminal_columns() == shutil.get_terminal_size().columns
    assert _cli_parser._Formatter("trainstatus")._width == argparse.RawDescriptionHelpFormatter("trainstatus")._width


def test_debug_records_reach_logging_once_the_program_imports_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The library's logger (``_log``) passes its records to ``logging.getLogger("trainstatus")``,
    with the line that logged them, whenever the program has imported logging."""
    import logging

    with caplog.at_level(logging.DEBUG, logger="trainstatus"), StatusStore(tmp_path / "s.json") as store:
        store.set("a", "k", 1)
    wrote = [r for r in caplog.records if r.name == "trainstatus" and r.getMessage().startswith("wrote ")]
    assert wrote and wrote[0].module == "local", [(r.module, r.getMessage()) for r in caplog.records]
