"""History: every write keeps the version it replaces; a damaged or missing file comes back from it.

On a real directory (hard links, inode numbers, fsync counts are the point), with real processes
for the command line and for a trainer that picks up a restore.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from _helpers import read_fresh

from trainstatus import (
    CheckpointList,
    StatusStore,
    TrainingStatusCorruptError,
    TrainingStatusCorruptWarning,
    TrainingStatusHistoryWarning,
    TrainingStatusMissingWarning,
    TrainingStatusTypeError,
    TrainingStatusValueError,
)
from trainstatus._storage import atomic as _atomic, history as _history, filenames as _names
from trainstatus._storage.closer import _closer
from trainstatus._cli import main as _cli_main


def kept(path: Path) -> list[_history.Version]:
    _closer.wait()  # pruning runs on the closer thread
    return _history.versions(str(path.parent), path.name)


def lessons(path: Path, count: int, **options: Any) -> tuple[StatusStore, list[bytes]]:
    """A store that set lesson 0..count-1, one write each; the bytes of each version written."""
    store = StatusStore(path, **options)
    written = []
    for lesson in range(count):
        store.set("wall_height", "lesson_num", lesson)
        written.append(path.read_bytes())
    return store, written


def warned(caught: list[warnings.WarningMessage], kind: type[Warning]) -> list[Any]:
    return [w.message for w in caught if isinstance(w.message, kind)]


# -- keeping versions ---------------------------------------------------------------------------


def test_each_write_keeps_the_version_it_replaces_as_a_hard_link(tmp_path: Path) -> None:
    path = tmp_path / "training_status.json"
    store = StatusStore(path)
    store.set("wall_height", "lesson_num", 0)
    assert kept(path) == []  # the first write replaces nothing
    inodes, written = [], []
    for lesson in (1, 2, 3):
        inodes.append(os.stat(path).st_ino)
        written.append(path.read_bytes())
        store.set("wall_height", "lesson_num", lesson)
    versions = kept(path)
    assert [v.sequence for v in versions] == [1, 2, 3]
    for version, inode, data in zip(versions, inodes, written):
        assert os.stat(version.path).st_ino == inode  # the old inode itself: nothing copied
        assert Path(version.path).read_bytes() == data
        assert os.path.basename(version.path) == _names.history_name(path.name, version.sequence)
    assert json.loads(Path(versions[-1].path).read_bytes())["wall_height"]["lesson_num"] == 2
    store.close()


def test_history_adds_no_fsync_to_a_durable_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The link lives in the file's own directory: the directory fsync after the rename covers it.
    counts = {}
    for history in (0, 20):
        path = tmp_path / str(history) / "status.json"
        store, _ = lessons(path, 2, history=history)
        calls: list[str] = []
        real_fsync, real_link = os.fsync, os.link
        monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
        monkeypatch.setattr(os, "link", lambda *a, **k: (calls.append("link"), real_link(*a, **k))[1])
        store.set("wall_height", "lesson_num", 9)
        monkeypatch.undo()
        counts[history] = calls
        store.close()
    assert counts[0] == ["fsync", "fsync"]  # the file, then its directory
    assert counts[20] == ["fsync", "link", "fsync"]  # linked once the new file is complete


def test_only_the_newest_versions_are_kept_and_pruned_off_the_writers_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = []
    real_prune, real_prune_range = _history.prune, _history.prune_range

    def prune(directory: str, name: str, keep: int) -> None:
        threads.append(threading.current_thread().name)
        real_prune(directory, name, keep)

    def prune_range(directory: str, name: str, first: int, last: int) -> bool:
        threads.append(threading.current_thread().name)
        return real_prune_range(directory, name, first, last)

    monkeypatch.setattr(_history, "prune", prune)
    monkeypatch.setattr(_history, "prune_range", prune_range)
    path = tmp_path / "status.json"
    store, written = lessons(path, 12, history=4)
    _closer.wait(10)
    versions = kept(path)
    assert [v.sequence for v in versions] == [8, 9, 10, 11]
    assert [Path(v.path).read_bytes() for v in versions] == written[7:11]
    assert threads and set(threads) == {"trainstatus-closer"}
    store.close()


def test_versions_another_keep_left_are_pruned_at_once(tmp_path: Path) -> None:
    """Pruning unlinks version ``newest - keep`` by its number (issue 13); where the numbers came
    from a listing (a new store, another writer's write) the directory is listed again, so versions
    that a store with a larger history= left are pruned at the first write, not every 64th."""
    path = tmp_path / "status.json"
    wide = StatusStore(path, history=6)
    for i in range(8):
        wide.set("wall", "lesson", i)
    _closer.wait(10)
    assert len(kept(path)) == 6
    narrow = StatusStore(path, history=3)
    for i in range(5):
        narrow.set("wall", "lesson", 10 + i)
        _closer.wait(10)
        assert len(kept(path)) == 3
    wide.set("wall", "other", 1)  # reads narrow's writes, numbers from a listing: keeps up to 6
    narrow.set("wall", "lesson", 20)  # reads wide's, lists again
    _closer.wait(10)
    assert len(kept(path)) == 3
    assert [v.sequence for v in kept(path)] == sorted(v.sequence for v in kept(path))
    wide.close()
    narrow.close()


def test_history_0_keeps_nothing(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store, _ = lessons(path, 4, history=0)
    assert kept(path) == [] and sorted(os.listdir(tmp_path)) == ["status.json", "status.json.lock"]
    store.close()


def test_numbers_go_on_across_stores_and_processes(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store, _ = lessons(path, 3)
    other = StatusStore(path)
    other.set("Walker", "elo", 1200.0)  # sees the first store's version, keeps it as number 3
    code = f"from trainstatus import StatusStore; StatusStore({str(path)!r}).set('Walker', 'elo', 1300.0)"
    subprocess.run([sys.executable, "-c", code], check=True)
    store.set("wall_height", "lesson_num", 7)
    assert [v.sequence for v in kept(path)] == [1, 2, 3, 4, 5]
    contents = [json.loads(Path(v.path).read_bytes()) for v in kept(path)]
    assert contents[3]["Walker"]["elo"] == 1200.0 and contents[4]["Walker"]["elo"] == 1300.0
    assert len({os.stat(v.path).st_ino for v in kept(path)}) == 5
    store.close()
    other.close()


def test_a_failed_link_never_fails_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    store, _ = lessons(path, 2)

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_atomic, "keep_previous", full)
    with pytest.warns(TrainingStatusHistoryWarning) as caught:
        store.set("wall_height", "lesson_num", 5)
    message = str(caught[0].message)
    assert str(path) in message and "No space left on device" in message and "history=0" in message
    assert read_fresh(path)["wall_height"]["lesson_num"] == 5
    monkeypatch.undo()
    store.set("wall_height", "lesson_num", 6)  # keeps going where it left off
    assert [v.sequence for v in kept(path)] == [1, 2]
    assert json.loads(Path(kept(path)[-1].path).read_bytes())["wall_height"]["lesson_num"] == 5
    store.close()


def test_without_hard_links_the_bytes_are_copied_and_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    store, written = lessons(path, 2)
    os.chmod(path, 0o640)
    store.reload()
    synced: list[int] = []
    real_fsync = os.fsync

    def no_link(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_link)
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    store.set("wall_height", "lesson_num", 5)
    monkeypatch.undo()
    newest = kept(path)[-1]
    assert Path(newest.path).read_bytes() == written[-1]
    assert os.stat(newest.path).st_ino != os.stat(path).st_ino
    assert os.stat(newest.path).st_mode & 0o777 == 0o640
    assert len(synced) == 3  # the copy, the new file, the directory
    store.close()


KILLED_BEFORE_RENAME = """
import os, sys
from trainstatus import StatusStore; from trainstatus._storage import atomic as _atomic
store = StatusStore(sys.argv[1])
_atomic.replace = lambda temp, target: os._exit(9)  # dies after the link, before the rename
store.set("wall_height", "lesson_num", 5)
"""


def test_a_writer_killed_between_the_link_and_the_rename_does_not_keep_one_version_twice(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store, written = lessons(path, 2)
    store.close()
    child = subprocess.run([sys.executable, "-c", KILLED_BEFORE_RENAME, str(path)])
    assert child.returncode == 9 and path.read_bytes() == written[-1]
    assert [os.stat(v.path).st_ino for v in kept(path)][-1] == os.stat(path).st_ino  # linked, not renamed
    fresh = StatusStore(path)
    fresh.set("wall_height", "lesson_num", 6)
    inodes = [os.stat(v.path).st_ino for v in kept(path)]
    assert len(inodes) == len(set(inodes)) == 2
    assert [Path(v.path).read_bytes() for v in kept(path)] == written
    fresh.close()


def test_a_write_whose_rename_fails_leaves_no_extra_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    store, written = lessons(path, 2)

    def fails(*args: Any) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(_atomic, "replace", fails)
    with pytest.raises(OSError):
        store.set("wall_height", "lesson_num", 5)
    monkeypatch.undo()
    assert [Path(v.path).read_bytes() for v in kept(path)] == written[:1]
    store.set("wall_height", "lesson_num", 6)
    assert [Path(v.path).read_bytes() for v in kept(path)] == written
    store.close()


# -- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["20", 2.0, True])
def test_history_of_the_wrong_type_is_refused(tmp_path: Path, value: Any) -> None:
    with pytest.raises(TrainingStatusTypeError, match=r"option history= must be a number of versions"):
        StatusStore(tmp_path / "status.json", history=value)


def test_a_negative_history_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "status.json")
    with pytest.raises(TrainingStatusValueError) as caught:
        StatusStore(path, history=-1)
    assert isinstance(caught.value, ValueError)  # ``except ValueError`` still catches it
    assert caught.value.path == path
    assert str(caught.value) == (
        f"StatusStore option history= must be a number of versions >= 0 (0: keep none; None: the default, 20), "
        f"not -1, for {path}."
    )
    assert list(tmp_path.iterdir()) == []


def test_history_on_s3_is_refused_before_any_request() -> None:
    url = "s3://bucket/run/training_status.json"
    with pytest.raises(TrainingStatusValueError) as caught:
        StatusStore(url, history=5)
    assert isinstance(caught.value, ValueError) and caught.value.path == url
    assert str(caught.value) == (
        f"history=5 is kept for local files only; {url!r} is an s3:// object. Turn on versioning in the "
        "bucket to keep earlier versions, and leave history= out."
    )


# -- coming back from history -------------------------------------------------------------------


def test_a_damaged_file_is_replaced_by_the_newest_intact_version(tmp_path: Path) -> None:
    path = tmp_path / "training_status.json"
    store, written = lessons(path, 4)
    store.close()
    newest = kept(path)[-1]
    Path(newest.path).write_bytes(b'{"wall_height": {"lesson_n')  # damaged as well: skipped
    path.write_bytes(b'{"wall_height": ')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = StatusStore(path)
    (warning,) = warned(caught, TrainingStatusCorruptWarning)
    assert store.get("wall_height", "lesson_num") == 1
    assert path.read_bytes() == written[1]  # put back byte for byte, under the lock
    assert f"version {newest.sequence - 1} from its history (written " in str(warning)
    assert "changes written after that version are lost" in str(warning)
    assert f"trainstatus history {path}" in str(warning)
    assert warning.moved_to is not None and Path(warning.moved_to).read_bytes() == b'{"wall_height": '
    assert read_fresh(path) == store.to_dict()
    store.close()


def checkpoints_then_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A status whose newest kept version lists a checkpoint removed since (keep=1 trimmed it)."""
    monkeypatch.chdir(tmp_path)  # relative paths, looked up in the current directory (ML-Agents')
    (tmp_path / "models").mkdir()
    path = tmp_path / "run_logs" / "training_status.json"
    with StatusStore(path) as store:
        checkpoints = CheckpointList(store, "Walker", keep=1)
        for steps in (100, 200):
            (tmp_path / f"models/Walker-{steps}.onnx").write_bytes(b"weights")
            (tmp_path / f"models/Walker-{steps}.pt").write_bytes(b"weights")
            checkpoints.add(steps, f"models/Walker-{steps}.onnx", auxillary_file_paths=[f"models/Walker-{steps}.pt"])
    assert not (tmp_path / "models/Walker-100.onnx").exists()
    return path


MISSING_NOW = ("That version lists 2 checkpoint file(s) that are missing now: Walker/checkpoints "
               "models/Walker-100.onnx; Walker/checkpoints models/Walker-100.pt (relative paths looked up under {cwd}, "
               "the current directory: Walker records no checkpoint_root, so its paths are read as ML-Agents writes "
               "them, relative to the folder mlagents-learn ran in). "
               "Do not resume from them: CheckpointList.latest() skips them, prune_missing() drops their entries.")


def test_a_version_from_history_that_lists_removed_checkpoints_names_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = checkpoints_then_lost(tmp_path, monkeypatch)
    path.write_bytes(b'{"Walker": ')
    with pytest.warns(TrainingStatusCorruptWarning) as caught:
        store = StatusStore(path)
    (warning,) = caught.list
    assert [e["steps"] for e in store.get("Walker", "checkpoints")] == [100]
    assert MISSING_NOW.format(cwd=tmp_path) in str(warning.message)
    store.close()


def test_a_missing_file_from_history_that_lists_removed_checkpoints_names_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = checkpoints_then_lost(tmp_path, monkeypatch)
    path.unlink()
    with pytest.warns(TrainingStatusMissingWarning) as caught:
        store = StatusStore(path, resume=True)
    (warning,) = caught.list
    assert [e["steps"] for e in store.get("Walker", "checkpoints")] == [100]
    assert MISSING_NOW.format(cwd=tmp_path) in str(warning.message)
    store.close()


def test_a_version_from_history_whose_checkpoints_all_exist_names_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = checkpoints_then_lost(tmp_path, monkeypatch)
    for name in ("Walker-100.onnx", "Walker-100.pt"):
        (tmp_path / "models" / name).write_bytes(b"weights")  # put back: nothing is missing
    path.write_bytes(b'{"Walker": ')
    with pytest.warns(TrainingStatusCorruptWarning) as caught:
        StatusStore(path).close()
    (warning,) = caught.list
    assert "missing now" not in str(warning.message)
    assert "changes written after that version are lost unless that copy still holds them. `trainstatus history" in str(
        warning.message)


def test_strict_raises_and_restores_nothing(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store, _ = lessons(path, 3)
    store.close()
    path.write_bytes(b"{")
    with pytest.raises(TrainingStatusCorruptError):
        StatusStore(path, strict=True)
    assert path.read_bytes() == b"{"


def test_a_missing_file_comes_back_from_history_when_resuming(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store, written = lessons(path, 3)
    store.close()
    path.unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fresh = StatusStore(path)  # a new run: starts empty, silently, writes nothing
    assert fresh.to_dict() == {"metadata": fresh.to_dict()["metadata"]} and not caught and not path.exists()
    fresh.close()
    with pytest.warns(TrainingStatusMissingWarning, match=r"version 2 from its history") as caught_resume:
        resumed = StatusStore(path, resume=True)
    assert "changes written after that version are lost" in str(caught_resume[0].message)
    assert resumed.get("wall_height", "lesson_num") == 1 and path.read_bytes() == written[1]
    resumed.close()


def test_a_missing_file_without_history_warns_as_before(tmp_path: Path) -> None:
    with pytest.warns(TrainingStatusMissingWarning, match=r"start from scratch"):
        StatusStore(tmp_path / "status.json", resume=True).close()


# -- the command line ---------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainstatus", *args], capture_output=True, text=True)


def test_history_lists_each_version_with_the_keys_it_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "status.json"
    store, _ = lessons(path, 3)
    store.set("Walker", "elo", 1200.0)
    store.close()
    assert _cli_main.main(["history", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["VERSION", "WRITTEN", "SIZE"]
    assert [line.split()[0] for line in lines[1:]] == ["current", "3", "2", "1"]
    assert lines[1].endswith("Walker/elo") and lines[2].endswith("wall_height/lesson_num")
    assert lines[-1].endswith("(the oldest kept)")


def test_history_without_versions_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "status.json"
    lessons(path, 1)[0].close()
    assert _cli_main.main(["history", str(path)]) == 0
    assert "no earlier versions" in capsys.readouterr().out


def test_diff_is_key_by_key_with_diffs_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "status.json"
    store, _ = lessons(path, 2)
    with store.transaction():
        store.set("Walker", "elo", float("nan"))
        store.delete("wall_height", "lesson_num")
        store.set("big_wall", "lesson_num", 3)
    store.close()
    assert _cli_main.main(["diff", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ["from version 2 to current: 3 keys differ", "- wall_height/lesson_num (was 1)",
                   "+ Walker/elo = NaN", "+ big_wall/lesson_num = 3"]
    assert _cli_main.main(["diff", "--json", str(path), "1", "2"]) == 1
    assert json.loads(capsys.readouterr().out) == [
        {"change": "changed", "category": "wall_height", "key": "lesson_num", "old": 0, "new": 1}]
    assert _cli_main.main(["diff", str(path), "2", "2"]) == 0
    assert "0 keys differ" in capsys.readouterr().out


def test_restore_is_a_new_version_that_can_be_undone(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store, written = lessons(path, 4)
    store.close()
    result = cli("restore", str(path), "1")
    assert result.returncode == 0, result.stderr
    assert path.read_bytes() == written[0]
    assert "to undo: trainstatus restore" in result.stdout
    undo = result.stdout.split("to undo: ", 1)[1].split()
    assert undo[-1] == "4"
    assert Path(kept(path)[-1].path).read_bytes() == written[3]
    again = cli(*undo[1:])
    assert again.returncode == 0, again.stderr
    assert path.read_bytes() == written[3]


def test_a_running_trainer_picks_a_restore_up_like_another_writers_change(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    trainer, _ = lessons(path, 3)  # lesson 2 now; version 1 holds lesson 0
    trainer.set("Walker", "elo", 1200.0)
    result = cli("restore", str(path), "1")
    assert result.returncode == 0, result.stderr
    trainer.set("Walker", "steps", 5000)  # its next write reads the restored file first
    on_disk = read_fresh(path)
    assert on_disk["wall_height"]["lesson_num"] == 0 and on_disk["Walker"] == {"steps": 5000}
    assert trainer.to_dict() == on_disk
    trainer.close()


@pytest.mark.parametrize(("version", "message"), [
    ("9", "has no version 9 in its history (versions 1 to 2 are kept)"),
    ("x", "'x' is not a version"),
    ("current", "'current' is the file itself"),
])
def test_restore_of_a_version_that_is_not_there_changes_nothing(tmp_path: Path, version: str, message: str) -> None:
    path = tmp_path / "status.json"
    store, written = lessons(path, 3)
    store.close()
    result = cli("restore", str(path), version)
    assert result.returncode == 2 and message in result.stderr
    assert path.read_bytes() == written[-1] and len(kept(path)) == 2


def test_restore_of_a_damaged_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store, written = lessons(path, 3)
    store.close()
    Path(kept(path)[0].path).write_bytes(b"[1,")
    result = cli("restore", str(path), "1")
    assert result.returncode == 2 and "version 1 does not parse as a status document" in result.stderr
    assert path.read_bytes() == written[-1]


def test_command_line_writes_keep_as_many_versions_as_they_find(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store, written = lessons(path, 30, history=40)
    store.close()
    assert len(kept(path)) == 29
    for lesson in (3, 4):  # more than the default 20 stay; the count neither shrinks nor grows
        assert cli("set", str(path), "wall_height", "lesson_num", str(lesson)).returncode == 0
        assert len(kept(path)) == 29
    newest, before = (json.loads(Path(v.path).read_bytes())["wall_height"]["lesson_num"] for v in kept(path)[:-3:-1])
    assert (newest, before) == (3, 29)  # what each edit replaced
    few = tmp_path / "few.json"
    lessons(few, 3)[0].close()
    assert cli("set", str(few), "wall_height", "lesson_num", "9").returncode == 0
    assert len(kept(few)) == 3  # under the default: nothing pruned


def test_check_counts_the_versions_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "status.json"
    lessons(path, 3)[0].close()
    assert _cli_main.main(["check", str(path)]) == 0
    assert "info: 2 earlier versions kept in the history (numbers 1 to 2); see `trainstatus history`" in capsys.readouterr().out


# -- review findings ----------------------------------------------------------------------------


def test_a_restore_at_open_that_cannot_be_written_starts_empty_and_says_how_to_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "status.json"
    lessons(path, 3)[0].close()
    path.write_bytes(b"{")

    def full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_atomic, "write_all", full)
    with pytest.warns(TrainingStatusCorruptWarning) as caught:
        store = StatusStore(path)
    message = str(caught[0].message)
    assert "the store starts empty" in message
    assert f"Version 2 of its history could not be put back (No space left on device)" in message
    assert f"`trainstatus restore {path} 2` puts it back" in message
    assert store.get("wall_height", "lesson_num") is None and not path.exists()
    store.close()


def test_history_0_neither_keeps_nor_restores(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    lessons(path, 3)[0].close()  # versions 1 and 2 left by a default store
    path.write_bytes(b"{")
    with pytest.warns(TrainingStatusCorruptWarning, match="the store starts empty"):
        store = StatusStore(path, history=0)
    store.set("wall_height", "lesson_num", 7)
    assert len(kept(path)) == 2
    store.close()


def test_a_history_that_cannot_be_listed_is_no_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unlistable(directory: str, name: str) -> list[Any]:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), directory)

    monkeypatch.setattr(_history, "versions", unlistable)
    with pytest.warns(TrainingStatusMissingWarning, match="start from scratch"):
        StatusStore(tmp_path / "status.json", resume=True).close()


def test_a_version_not_kept_under_warnings_as_errors_still_writes_and_updates_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "status.json"
    store, _ = lessons(path, 2)

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_atomic, "keep_previous", full)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingStatusHistoryWarning)
        with pytest.raises(TrainingStatusHistoryWarning):
            store.set("wall_height", "lesson_num", 5)
    assert read_fresh(path)["wall_height"]["lesson_num"] == 5 == store.get("wall_height", "lesson_num")
    store.close()


def test_a_symlink_under_a_versions_name_is_never_read(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    lessons(path, 2)[0].close()
    secret = tmp_path / "elsewhere.json"
    secret.write_text('{"planted": {"x": 1}}')
    os.symlink(secret, tmp_path / _names.history_name(path.name, 99))
    assert [v.sequence for v in kept(path)] == [1]
    path.write_bytes(b"{")
    with pytest.warns(TrainingStatusCorruptWarning, match="version 1 from its history"):
        store = StatusStore(path)
    assert store.get("planted", "x") is None
    store.set("wall_height", "lesson_num", 3)
    assert os.path.basename(kept(path)[-1].path) == _names.history_name(path.name, 2)
    store.close()


def test_a_resume_from_history_after_the_current_directory_was_removed_still_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Relative checkpoint paths are looked up in the current directory; with that directory gone
    # the warning leaves the list out instead of the open failing with a bare FileNotFoundError.
    path = checkpoints_then_lost(tmp_path, monkeypatch)
    path.unlink()
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.warns(TrainingStatusMissingWarning) as caught:
        store = StatusStore(path, resume=True)
    (warning,) = caught.list
    assert [e["steps"] for e in store.get("Walker", "checkpoints")] == [100]
    assert "missing now" not in str(warning.message)
    store.close()
