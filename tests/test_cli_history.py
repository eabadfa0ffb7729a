"""The command line's ``restore``, ``history``, ``diff`` and the history's cost on disk.

``restore`` writes the file like a trainer does: under the lock (a real process holds it here, on a
real directory: flock does nothing under pyfakefs) and durably (the order of the fsyncs and the
rename, recorded around the in-process ``main``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainstatus import StatusStore, _cli, _history, _storage


def kept(path: Path) -> list[_history.Version]:
    _storage._closer.wait()  # pruning runs on the closer thread
    return _history.versions(str(path.parent), path.name)


def lessons(path: Path, count: int, **options: Any) -> list[bytes]:
    """Lessons 0..count-1 set one write each; the bytes of each version written."""
    written = []
    with StatusStore(path, **options) as store:
        for lesson in range(count):
            store.set("wall_height", "lesson_num", lesson)
            written.append(path.read_bytes())
    return written


HOLDER = """\
import sys
from trainstatus import StatusStore

with StatusStore(sys.argv[1], durable=False) as store, store.transaction():
    print("held", flush=True)
    sys.stdin.readline()
"""


@contextlib.contextmanager
def held_by_another_process(path: Path) -> Iterator[None]:
    """Another process in a transaction on ``path`` (so holding its lock) until the block ends."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        yield
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(timeout=60) == 0
        child.stdout.close()  # type: ignore[union-attr]


# -- restore: the lock, durability, the undo version -----------------------------------------------


def test_restore_waits_for_a_lock_another_process_holds_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    written = lessons(path, 3)
    before = kept(path)
    with held_by_another_process(path):
        status = _cli.main(["restore", "--lock-timeout", "0.2", str(path), "1"])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainstatus: error: could not lock {path} within 0.2 s: ") and err.count("\n") == 1
    assert path.read_bytes() == written[-1]
    assert kept(path) == before


def test_restore_syncs_the_temp_file_before_the_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    written = lessons(path, 3)
    steps: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        steps.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_replace(src: Any, dst: Any, **kwargs: Any) -> None:
        steps.append(("replace", os.fspath(dst)))
        replace(src, dst, **kwargs)
        steps.append(("replaced", os.fspath(src)))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    assert _cli.main(["restore", str(path), "1"]) == 0, capsys.readouterr().err
    assert path.read_bytes() == written[0]
    renames = [i for i, step in enumerate(steps) if step == ("replace", str(path))]
    assert len(renames) == 1, steps
    rename = renames[0]
    temp = steps[rename + 1][1]
    assert ("fsync", temp) in steps[:rename], steps  # the new bytes are on disk before their name
    assert ("fsync", str(tmp_path)) in steps[rename + 1:], steps  # and the name after the rename


def test_restore_names_the_version_it_replaced_while_other_writers_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    lessons(path, 3)  # lesson 2 in the file; versions 1 and 2 hold lessons 0 and 1
    lock = _storage.LocalFile.lock
    replaced: list[bytes] = []

    def write(elo: float) -> None:
        monkeypatch.setattr(_storage.LocalFile, "lock", lock)  # the other writer's own lock
        with StatusStore(path) as other:
            other.set("Walker", "elo", elo)
        monkeypatch.setattr(_storage.LocalFile, "lock", busy_lock)

    @contextlib.contextmanager
    def busy_lock(self: _storage.LocalFile, *args: Any, **kwargs: Any) -> Iterator[None]:
        write(1200.0)  # a trainer writing just before restore takes the lock
        with lock(self, *args, **kwargs):
            replaced.append(path.read_bytes())
            yield
        write(1300.0)  # and just after it lets go

    monkeypatch.setattr(_storage.LocalFile, "lock", busy_lock)
    assert _cli.main(["restore", str(path), "1"]) == 0
    out = capsys.readouterr().out
    undo = out.split("to undo: ", 1)[1].split()
    assert undo[:2] == ["trainstatus", "restore"]
    number = int(undo[-1])
    assert Path([v for v in kept(path) if v.sequence == number][0].path).read_bytes() == replaced[0]
    assert f"kept as version {number};" in out
