"""The command line's ``restore``, ``history``, ``diff`` and the history's cost on disk.

``restore`` writes the file like a trainer does: under the lock (a real process holds it here, on a
real directory: flock does nothing under pyfakefs) and durably (the order of the fsyncs and the
rename, recorded around the in-process ``main``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainstatus import StatusStore, TrainingStatusWriteError
from trainstatus._storage import atomic as _atomic, history as _history, local as _storage, messages as _messages
from trainstatus._storage.closer import _closer
from trainstatus._cli import main as _cli_main


def kept(path: Path) -> list[_history.Version]:
    _closer.wait()  # pruning runs on the closer thread
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
        status = _cli_main.main(["restore", "--lock-timeout", "0.2", str(path), "1"])
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
    assert _cli_main.main(["restore", str(path), "1"]) == 0, capsys.readouterr().err
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
    assert _cli_main.main(["restore", str(path), "1"]) == 0
    out = capsys.readouterr().out
    undo = out.split("to undo: ", 1)[1].split()
    assert undo[:2] == ["trainstatus", "restore"]
    number = int(undo[-1])
    assert Path([v for v in kept(path) if v.sequence == number][0].path).read_bytes() == replaced[0]
    assert f"kept as version {number};" in out


# -- the history's cost on disk: a full disk names it, and the command line prunes it -------------


def test_a_full_disk_names_the_history_and_how_to_prune_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "status.json"
    lessons(path, 4)
    size = sum(v.size for v in kept(path))

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_atomic, "write_all", full)
    history = (f"(the history beside the file holds 3 earlier versions, .status.json.history-00000001 to "
               f".status.json.history-00000003, {size} bytes together: `trainstatus history {path} --prune "
               "--keep 2` removes all but the newest 2, and a store opened with a smaller history= keeps fewer)")
    with StatusStore(path) as store, pytest.raises(TrainingStatusWriteError) as caught:
        store.set("wall_height", "lesson_num", 9)
    assert str(caught.value) == (
        f"Could not save {path} (writing it): No space left on device. The file was left as it was; the "
        f"disk is full; free some space {history}, then set the value again.")
    assert _cli_main.main(["set", str(path), "wall_height", "lesson_num", "9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and history in err


def test_a_full_disk_without_a_history_says_nothing_of_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    lessons(path, 1)  # the first write replaces nothing: no history
    assert kept(path) == []
    monkeypatch.setattr(_atomic, "write_all", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with StatusStore(path) as store, pytest.raises(TrainingStatusWriteError, match=r"free some space, then set") as caught:
        store.set("wall_height", "lesson_num", 9)
    assert "history" not in str(caught.value)


@pytest.mark.parametrize(("size", "shown"), [(0, "0 bytes"), (1, "1 byte"), (1023, "1023 bytes"),
                                             (45056, "44.0 KB"), (3 * 2**20 + 2**19, "3.5 MB"),
                                             (5 * 2**30, "5.0 GB")])
def test_sizes_read_as_people_write_them(size: int, shown: str) -> None:
    assert _messages.byte_size(size) == shown


def test_history_prune_keeps_the_newest_versions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "status.json"
    written = lessons(path, 6)  # versions 1 to 5 hold lessons 0 to 4
    sizes = sum(v.size for v in kept(path)[:3])
    assert _cli_main.main(["history", str(path), "--prune", "--keep", "2"]) == 0
    assert capsys.readouterr().out == (
        f"removed 3 earlier versions of {path} (1 to 3, {sizes} bytes); 2 versions kept\n")
    assert [v.sequence for v in kept(path)] == [4, 5]
    assert [Path(v.path).read_bytes() for v in kept(path)] == written[3:5]
    assert path.read_bytes() == written[-1]
    assert _cli_main.main(["history", str(path), "--prune", "--keep", "2"]) == 0
    assert capsys.readouterr().out == f"nothing to remove: 2 earlier versions of {path} kept, --keep 2\n"
    assert _cli_main.main(["history", str(path), "--prune", "--keep", "0"]) == 0
    assert capsys.readouterr().out == f"removed 2 earlier versions of {path} (4 to 5, {2 * sizes // 3} bytes); 0 versions kept\n"
    assert kept(path) == [] and path.read_bytes() == written[-1]


@pytest.mark.parametrize(("args", "message"), [
    (["--prune"], "--prune needs --keep N: how many of the newest versions to keep (0: none)"),
    (["--keep", "2"], "--keep is how many versions --prune keeps: pass --prune too"),
])
def test_history_prune_needs_both_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    path = tmp_path / "status.json"
    lessons(path, 3)
    assert _cli_main.main(["history", str(path), *args]) == 2
    assert capsys.readouterr().err == f"trainstatus: error: {message}\n"
    assert len(kept(path)) == 2


# -- diff of two checkpoint lists: one entry a line ---------------------------------------------------


def _entry(steps: int, reward: float) -> dict[str, Any]:
    return {"steps": steps, "file_path": f"results/run1/Walker/Walker-{steps}.onnx", "reward": reward,
            "creation_time": 1700000000.5, "auxillary_file_paths": [f"results/run1/Walker/Walker-{steps}.pt"]}


def test_diff_of_two_checkpoint_lists_shows_the_entries_added_removed_and_changed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two lists of 3 and 4 checkpoints used to print as one line of over 1 KB; only the entries
    that differ are shown now, one a line, and a changed one field by field."""
    path = tmp_path / "status.json"
    before = [_entry(1000, 1.0), _entry(2000, 1.5), _entry(3000, 2.0)]
    after = [_entry(2000, 1.75), _entry(3000, 2.0), _entry(4000, 2.5), _entry(5000, 2.625)]
    after[0]["file_size"] = 512
    with StatusStore(path) as store:
        store.set("Walker", "checkpoints", before)
        store.set("Walker", "checkpoints", after)
        store.set("Walker", "steps", 5000)
    assert _cli_main.main(["diff", str(path), "1", "current"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "from version 1 to current: 2 keys differ",
        "~ Walker/checkpoints: 3 -> 4 entries: 2 added, 1 removed, 1 changed",
        '    - {"steps": 1000, "file_path": "results/run1/Walker/Walker-1000.onnx", "reward": 1.0, "creation_time": '
        '1700000000.5, "auxillary_file_paths": ["results/run1/Walker/Walker-1000.pt"]}',
        "    ~ step 2000, results/run1/Walker/Walker-2000.onnx: reward 1.5 -> 1.75; file_size (not set) -> 512",
        '    + {"steps": 4000, "file_path": "results/run1/Walker/Walker-4000.onnx", "reward": 2.5, "creation_time": '
        '1700000000.5, "auxillary_file_paths": ["results/run1/Walker/Walker-4000.pt"]}',
        '    + {"steps": 5000, "file_path": "results/run1/Walker/Walker-5000.onnx", "reward": 2.625, "creation_time": '
        '1700000000.5, "auxillary_file_paths": ["results/run1/Walker/Walker-5000.pt"]}',
        "+ Walker/steps = 5000",
    ]
    assert max(len(line) for line in out.splitlines()) < 250
    # The other way round, and a list added or removed whole: one entry a line too.
    assert _cli_main.main(["diff", str(path), "current", "1"]) == 1
    assert capsys.readouterr().out.splitlines()[1:4] == [
        "~ Walker/checkpoints: 4 -> 3 entries: 1 added, 2 removed, 1 changed",
        '    - {"steps": 4000, "file_path": "results/run1/Walker/Walker-4000.onnx", "reward": 2.5, "creation_time": '
        '1700000000.5, "auxillary_file_paths": ["results/run1/Walker/Walker-4000.pt"]}',
        '    - {"steps": 5000, "file_path": "results/run1/Walker/Walker-5000.onnx", "reward": 2.625, "creation_time": '
        '1700000000.5, "auxillary_file_paths": ["results/run1/Walker/Walker-5000.pt"]}',
    ]


@pytest.mark.parametrize(("old", "new", "shown"), [
    # Paired by file_path: the steps changed.
    ([{"steps": 1, "file_path": "a"}], [{"steps": 2, "file_path": "a"}],
     ["~ c/k: 1 -> 1 entry: 1 changed", "    ~ a: steps 1 -> 2"]),
    # Without a file_path, by steps; the same steps twice (ML-Agents records the resume step again) pair in order.
    ([{"steps": 5, "r": 1}, {"steps": 5, "r": 2}], [{"steps": 5, "r": 1}, {"steps": 5, "r": 3}],
     ["~ c/k: 2 -> 2 entries: 1 changed", "    ~ step 5: r 2 -> 3"]),
    # Neither: not paired.
    ([{"x": 1}], [{"x": 2}], ["~ c/k: 1 -> 1 entry: 1 added, 1 removed", '    - {"x": 1}', '    + {"x": 2}']),
    ([{"steps": 1}, {"steps": 2}], [{"steps": 2}, {"steps": 1}], ["~ c/k: the same 2 entries, in another order"]),
    # An entry recorded again (a resume at the same step): one more, not the same list.
    ([{"steps": 5}], [{"steps": 5}, {"steps": 5}], ["~ c/k: 1 -> 2 entries: 1 added", '    + {"steps": 5}']),
    ([], [{"steps": 1}], ["~ c/k: 0 -> 1 entry: 1 added", '    + {"steps": 1}']),
    # Anything else is shown whole, as before.
    ([1, 2], [1, 3], ["~ c/k: [1, 2] -> [1, 3]"]),
    ([{"steps": 1}, 2], [{"steps": 1}, 3], ['~ c/k: [{"steps": 1}, 2] -> [{"steps": 1}, 3]']),
    ({"steps": 1}, {"steps": 2}, ['~ c/k: {"steps": 1} -> {"steps": 2}']),
    ([], [1], ["~ c/k: [] -> [1]"]),
], ids=["by-file", "by-steps", "unpaired", "reordered", "twice", "from-empty", "numbers", "mixed", "object", "empty-numbers"])
def test_diff_pairs_entries_by_file_then_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str], old: Any, new: Any,
                                              shown: list[str]) -> None:
    path = tmp_path / "status.json"
    with StatusStore(path) as store:
        store.set("c", "k", old)
        store.set("c", "k", new)
    assert _cli_main.main(["diff", str(path)]) == 1
    assert capsys.readouterr().out.splitlines()[1:] == shown
