"""CheckpointList (_checkpoints/): the list never names a file that is gone.

Unit behaviour on the real filesystem; the order of a save (files synced before the record, old
files removed only after it, only files nothing lists any more); ML-Agents interop, with the sample
file and with ML-Agents 1.1.0's own checkpoint manager; and SIGKILLs of a checkpointing process,
at random moments and at each named point of a save (tests/_checkpoint_writer.py).
"""

from __future__ import annotations

import errno
import json
import math
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _checkpoint_writer as cw
import pytest
from _helpers import read_fresh, run_threads, same, write
from _launch import Run, Workers

from trainstatus import (
    CheckpointList,
    StatusStore,
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusError,
    TrainingStatusMissingWarning,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusWarning,
    TrainingStatusWriteError,
)
from trainstatus._checkpoints.files import describe_missing
from trainstatus._checkpoints.files import missing_files

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data" / "mlagents_training_status.json"
FIELDS = ["steps", "file_path", "reward", "creation_time", "auxillary_file_paths"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StatusStore]:
    opened = StatusStore(tmp_path / "run_logs" / "training_status.json")
    yield opened
    opened.close()


def on_disk(store: StatusStore) -> dict[str, Any]:
    """The status file as Python's json module (and ML-Agents) reads it."""
    with open(store.path) as f:
        return dict(json.load(f))


def fill(tmp_path: Path, store: StatusStore, steps: list[int], keep: int | None = 3) -> CheckpointList:
    checkpoints = CheckpointList(store, "Walker", keep=keep, root=tmp_path)
    for n in steps:
        checkpoints.add(n, write(tmp_path, f"models/Walker-{n}.onnx"),
                        auxillary_file_paths=[write(tmp_path, f"models/Walker-{n}.pt")])
    return checkpoints


# -- recording ---------------------------------------------------------------------------------


def test_the_same_checkpoint_added_again_replaces_its_entry_and_keeps_its_files(
        tmp_path: Path, store: StatusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # ML-Agents saves the step it resumed from a second time, under the same name.
    monkeypatch.chdir(tmp_path)
    checkpoints = fill(tmp_path, store, [100, 200], keep=2)
    again = checkpoints.add(200, str(tmp_path / "models/Walker-200.onnx"), reward=7.5,  # spelled absolute now
                            auxillary_file_paths=["models/Walker-200.pt"])
    assert [(e["steps"], e["reward"]) for e in checkpoints.entries()] == [(100, None), (200, 7.5)]
    assert checkpoints.entries()[1] == again
    assert read_fresh(store.path)["Walker"]["checkpoints"] == checkpoints.entries()
    left = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert left == ["Walker-100.onnx", "Walker-100.pt", "Walker-200.onnx", "Walker-200.pt"]
    checkpoints.add(100, "models/Walker-100.onnx", reward=1.0)  # in place: not moved after 200
    assert [(e["steps"], e["reward"]) for e in checkpoints.entries()] == [(100, 1.0), (200, 7.5)]
    checkpoints.add(300, write(tmp_path, "models/Walker-300.onnx"))
    assert [e["steps"] for e in checkpoints.entries()] == [200, 300]
    assert not (tmp_path / "models/Walker-100.onnx").exists()


def test_a_checkpoint_added_again_among_the_oldest_is_never_the_one_trimmed(tmp_path: Path, store: StatusStore) -> None:
    # keep lowered since the list was written (or a list ML-Agents wrote with a larger
    # keep_checkpoints), and the run resumed from its oldest checkpoint, which it saves again:
    # the entry just recorded stays, files and all; the oldest others make room.
    fill(tmp_path, store, [100, 200, 300], keep=3)
    checkpoints = CheckpointList(store, "Walker", keep=2, root=tmp_path)
    again = checkpoints.add(100, "models/Walker-100.onnx", auxillary_file_paths=["models/Walker-100.pt"], reward=4.0)
    assert [e["steps"] for e in checkpoints.entries()] == [100, 300]
    assert checkpoints.entries()[0] == again
    left = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert left == ["Walker-100.onnx", "Walker-100.pt", "Walker-300.onnx", "Walker-300.pt"]
    assert missing_files(read_fresh(store.path), str(tmp_path)) == []


def test_the_same_steps_with_another_file_is_another_checkpoint(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [100], keep=2)
    checkpoints.add(100, write(tmp_path, "models/Walker-100-b.onnx"))
    assert [e["file_path"] for e in checkpoints.entries()] == ["models/Walker-100.onnx", "models/Walker-100-b.onnx"]


def test_duplicates_already_listed_collapse_into_the_new_entry(tmp_path: Path, store: StatusStore) -> None:
    # A list written by ML-Agents itself, or by an earlier trainstatus, can hold the same one twice.
    main = write(tmp_path, "models/Walker-200.onnx")
    entry = {"steps": 200, "file_path": main, "reward": 1.0, "creation_time": 1.0, "auxillary_file_paths": []}
    store.set("Walker", "checkpoints", [entry, dict(entry, reward=2.0)])
    checkpoints = CheckpointList(store, "Walker", keep=2, root=tmp_path)
    checkpoints.add(200, main, reward=3.0)
    assert [e["reward"] for e in checkpoints.entries()] == [3.0]
    assert (tmp_path / main).exists()


def test_a_nan_reward_is_recorded_and_stays_nan_on_disk(tmp_path: Path, store: StatusStore) -> None:
    # ML-Agents records NaN when no episode ended before the checkpoint.
    checkpoints = CheckpointList(store, "Walker", root=tmp_path)
    entry = checkpoints.add(100, write(tmp_path, "models/Walker-100.onnx"), reward=math.nan)
    assert math.isnan(entry["reward"])
    checkpoints.set_final(100, "models/Walker-100.onnx", reward=float("nan"))
    raw = Path(store.path).read_text()
    assert raw.count('"reward": NaN') == 2 and "null" not in raw
    on_disk = json.loads(raw)  # Python's json reads NaN, as ML-Agents does
    assert math.isnan(on_disk["Walker"]["checkpoints"][0]["reward"])
    assert math.isnan(on_disk["Walker"]["final_checkpoint"]["reward"])
    reopened = StatusStore(store.path)
    try:
        again = CheckpointList(reopened, "Walker", root=tmp_path)
        assert math.isnan(again.entries()[0]["reward"]) and math.isnan(again.final()["reward"])  # type: ignore[index]
    finally:
        reopened.close()


def test_add_records_an_entry_in_ml_agents_layout(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Walker", root=tmp_path)
    main = write(tmp_path, "models/Walker-500.onnx")
    extra = write(tmp_path, "models/Walker-500.pt")
    before = time.time()
    entry = checkpoints.add(500, main, reward=12.5, auxillary_file_paths=[extra])
    assert list(entry) == [*FIELDS, "files"]  # ML-Agents' fields as they are, then the sizes
    assert entry["creation_time"] >= before and entry["creation_time"] <= time.time()
    assert entry == {"steps": 500, "file_path": "models/Walker-500.onnx", "reward": 12.5,
                     "creation_time": entry["creation_time"], "auxillary_file_paths": ["models/Walker-500.pt"],
                     "files": {"models/Walker-500.onnx": 7, "models/Walker-500.pt": 7}}
    # On disk when add returns, under Walker/checkpoints, paths as given (relative).
    assert on_disk(store)["Walker"]["checkpoints"] == [entry]
    assert checkpoints.entries() == [entry]
    second = checkpoints.add(1000, write(tmp_path, "models/Walker-1000.onnx"), creation_time=5.0)
    assert second == {"steps": 1000, "file_path": "models/Walker-1000.onnx", "reward": None,
                      "creation_time": 5.0, "auxillary_file_paths": [], "files": {"models/Walker-1000.onnx": 7}}
    assert [e["steps"] for e in on_disk(store)["Walker"]["checkpoints"]] == [500, 1000]


@pytest.mark.parametrize("kind", ["str", "bytes", "Path"])
def test_paths_of_every_type_are_stored_as_str(tmp_path: Path, store: StatusStore, kind: str) -> None:
    convert: dict[str, Callable[[str], Any]] = {"str": str, "bytes": os.fsencode, "Path": Path}
    checkpoints = CheckpointList(store, "Walker", root=convert[kind](str(tmp_path)))
    assert checkpoints.root == str(tmp_path)
    name = write(tmp_path, "a.onnx")
    entry = checkpoints.add(1, convert[kind](name), auxillary_file_paths=[convert[kind](write(tmp_path, "a.pt"))])
    assert entry["file_path"] == "a.onnx" and entry["auxillary_file_paths"] == ["a.pt"]


def test_relative_paths_resolve_against_the_current_directory_by_default(
        tmp_path: Path, store: StatusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    checkpoints = CheckpointList(store, "Walker", keep=1)
    assert checkpoints.root is None
    checkpoints.add(1, write(tmp_path, "results/Walker-1.onnx"))
    checkpoints.add(2, write(tmp_path, "results/Walker-2.onnx"))
    assert not (tmp_path / "results/Walker-1.onnx").exists()
    assert checkpoints.resolve("results/Walker-2.onnx") == str(tmp_path / "results/Walker-2.onnx")
    absolute = str(tmp_path / "results/Walker-2.onnx")
    assert checkpoints.resolve(absolute) == absolute


@pytest.mark.parametrize("bad", [None, 3])
def test_resolve_of_something_not_a_path_is_a_trainstatus_error(store: StatusStore, bad: Any) -> None:
    with pytest.raises(TrainingStatusTypeError) as caught:
        CheckpointList(store, "Walker").resolve(bad)
    assert isinstance(caught.value, TypeError) and caught.value.category == "Walker"
    assert str(caught.value) == (
        f"CheckpointList.resolve: file_path= must be a path (str, bytes or os.PathLike), not "
        f"{type(bad).__name__!r} ({bad!r}), for Walker in {store.path}."
    )


def test_keep_trims_oldest_first_and_removes_main_and_auxiliary_files(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [100, 200, 300, 400, 500], keep=3)
    assert [e["steps"] for e in checkpoints.entries()] == [300, 400, 500]
    left = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert left == [f"Walker-{n}.{ext}" for n in (300, 400, 500) for ext in ("onnx", "pt")]


def test_keep_none_keeps_every_checkpoint(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, list(range(1, 9)), keep=None)
    assert [e["steps"] for e in checkpoints.entries()] == list(range(1, 9))
    assert len(list((tmp_path / "models").iterdir())) == 16


def test_a_longer_list_is_trimmed_to_keep_in_one_add(tmp_path: Path, store: StatusStore) -> None:
    fill(tmp_path, store, [1, 2, 3, 4, 5], keep=None)
    checkpoints = fill(tmp_path, store, [6], keep=2)
    assert [e["steps"] for e in checkpoints.entries()] == [5, 6]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        "Walker-5.onnx", "Walker-5.pt", "Walker-6.onnx", "Walker-6.pt"]


def test_files_are_synced_before_the_record_and_not_when_synced_is_true(
        tmp_path: Path, store: StatusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints = CheckpointList(store, "Walker", root=tmp_path)
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        events.append(("replace", os.fspath(target)))
        real_replace(source, target, *args, **kwargs)

    real_link = os.link

    def link(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:  # a new file's first version
        events.append(("replace", os.fspath(target)))
        real_link(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "link", link)
    models = os.path.realpath(tmp_path / "models")
    main, extra = write(tmp_path, "models/a.onnx"), write(tmp_path, "models/a.pt")
    checkpoints.add(1, main, auxillary_file_paths=[extra])
    record = events.index(("replace", store.path))
    synced = [path for kind, path in events[:record] if kind == "fsync"]
    assert os.path.join(models, "a.onnx") in synced
    assert os.path.join(models, "a.pt") in synced
    assert models in synced  # the folder, so the names survive a power loss too

    events.clear()
    checkpoints.add(2, write(tmp_path, "models/b.onnx"), synced=True)
    checkpoints.set_final(2, "models/b.onnx", synced=True)
    assert events.count(("replace", store.path)) == 2
    assert not [path for kind, path in events if kind == "fsync" and path.startswith(models)]

    # A symlink: the file it points at and both folders are synced.
    events.clear()
    write(tmp_path, "store/c.onnx")
    os.symlink(tmp_path / "store/c.onnx", tmp_path / "models/c.onnx")
    checkpoints.set_final(3, "models/c.onnx")
    synced = [path for kind, path in events[:events.index(("replace", store.path))] if kind == "fsync"]
    assert {os.path.realpath(tmp_path / "store/c.onnx"), models, os.path.realpath(tmp_path / "store")} <= set(synced)


def test_old_files_are_removed_only_once_the_record_without_them_is_on_disk(
        tmp_path: Path, store: StatusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints = fill(tmp_path, store, [1, 2], keep=2)
    real_remove = os.remove
    removed: list[str] = []

    def remove(path: Any, *args: Any, **kwargs: Any) -> None:
        listed = [p for e in on_disk(store)["Walker"]["checkpoints"] for p in [e["file_path"], *e["auxillary_file_paths"]]]
        assert os.path.relpath(path, tmp_path) not in listed, f"removed {path} while the file still lists it"
        removed.append(os.path.relpath(path, tmp_path))
        real_remove(path, *args, **kwargs)

    monkeypatch.setattr(os, "remove", remove)
    fill(tmp_path, store, [3, 4], keep=2)
    assert removed == ["models/Walker-1.onnx", "models/Walker-1.pt", "models/Walker-2.onnx", "models/Walker-2.pt"]
    assert [e["steps"] for e in checkpoints.entries()] == [3, 4]


def test_a_failed_record_removes_nothing(tmp_path: Path, store: StatusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints = fill(tmp_path, store, [1, 2], keep=2)
    before = Path(store.path).read_bytes()
    real_replace = os.replace

    def full_disk(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(target) == store.path:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(TrainingStatusWriteError):
        checkpoints.add(3, write(tmp_path, "models/Walker-3.onnx"))
    assert Path(store.path).read_bytes() == before
    assert [e["steps"] for e in checkpoints.entries()] == [1, 2]
    assert (tmp_path / "models/Walker-1.onnx").exists() and (tmp_path / "models/Walker-1.pt").exists()


def test_files_still_listed_are_never_removed(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Walker", keep=1, root=tmp_path)
    # ML-Agents' final checkpoint lists the newest checkpoint's .pt as its auxiliary file.
    shared = write(tmp_path, "models/Walker-1.pt")
    checkpoints.add(1, write(tmp_path, "models/Walker-1.onnx"), auxillary_file_paths=[shared])
    checkpoints.set_final(1, write(tmp_path, "models/Walker.onnx"), auxillary_file_paths=[shared])
    checkpoints.add(2, write(tmp_path, "models/Walker-2.onnx"))
    assert not (tmp_path / "models/Walker-1.onnx").exists()
    assert (tmp_path / "models/Walker-1.pt").exists()
    # A trainer that saves over one path lists it again: the kept entry's file stays.
    checkpoints.add(3, write(tmp_path, "models/latest.onnx", b"3"))
    checkpoints.add(4, write(tmp_path, "models/latest.onnx", b"4"))
    assert (tmp_path / "models/latest.onnx").read_bytes() == b"4"
    # The same file spelled two ways is one file.
    checkpoints.add(5, write(tmp_path, "models/Walker-5.onnx"), auxillary_file_paths=[write(tmp_path, "models/shared.bin")])
    checkpoints.add(6, write(tmp_path, "models/Walker-6.onnx"), auxillary_file_paths=["./models/../models/shared.bin"])
    assert (tmp_path / "models/shared.bin").exists() and not (tmp_path / "models/Walker-5.onnx").exists()
    os.symlink(tmp_path / "models", tmp_path / "alias")  # or through a folder's other name
    checkpoints.add(7, write(tmp_path, "models/Walker-7.onnx"), auxillary_file_paths=["alias/shared.bin"])
    checkpoints.add(8, write(tmp_path, "models/Walker-8.onnx"), auxillary_file_paths=["models/shared.bin"])
    assert (tmp_path / "models/shared.bin").exists() and not (tmp_path / "models/Walker-7.onnx").exists()
    # A file another behavior lists stays too.
    CheckpointList(store, "Crawler", root=tmp_path).add(1, write(tmp_path, "models/both.onnx"))
    checkpoints.add(9, "models/both.onnx")
    checkpoints.add(10, write(tmp_path, "models/Walker-10.onnx"))
    assert (tmp_path / "models/both.onnx").exists()
    assert [e["steps"] for e in checkpoints.entries()] == [10]


def test_a_file_already_gone_is_no_error(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [1], keep=1)
    (tmp_path / "models/Walker-1.onnx").unlink()
    fill(tmp_path, store, [2], keep=1)  # filterwarnings=error: no warning either
    assert not (tmp_path / "models/Walker-1.pt").exists()
    assert [e["steps"] for e in checkpoints.entries()] == [2]


def test_a_file_that_cannot_be_removed_is_warned_about_after_the_record(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [1], keep=1)
    (tmp_path / "models/Walker-1.pt").unlink()
    (tmp_path / "models/Walker-1.pt").mkdir()  # os.remove refuses a directory
    (tmp_path / "models/Walker-1.pt/inside").write_bytes(b"")
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        fill(tmp_path, store, [2], keep=1)
    assert str(caught[0].message) == (
        f"Old checkpoints of Walker/checkpoints in {store.path} were dropped from the list but some of "
        "their files are still on disk: steps 1: models/Walker-1.pt could not be removed (Is a directory). "
        "They are no longer listed; remove them by hand."
    )
    assert caught[0].filename == __file__  # points at the caller
    assert [e["steps"] for e in checkpoints.entries()] == [2]
    assert not (tmp_path / "models/Walker-1.onnx").exists()
    assert (tmp_path / "models/Walker-1.pt/inside").exists()


def test_writers_of_other_keys_are_merged(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Walker", root=tmp_path)
    other = StatusStore(store.path)
    other.set("wall_height", "lesson_num", 3)
    other.set("Walker", "elo", 1234.5)
    checkpoints.add(1, write(tmp_path, "a.onnx"))
    found = read_fresh(store.path)
    assert found["wall_height"] == {"lesson_num": 3}
    assert found["Walker"]["elo"] == 1234.5 and len(found["Walker"]["checkpoints"]) == 1
    other.close()


def test_concurrent_adds_on_one_list_lose_no_entry_and_leave_only_listed_files(tmp_path: Path) -> None:
    path = tmp_path / "run_logs" / "training_status.json"
    stores = [StatusStore(path) for _ in range(3)]
    per_thread = 12

    def adder(index: int) -> Callable[[], None]:
        def run() -> None:
            checkpoints = CheckpointList(stores[index], "Walker", keep=None if index == 2 else 5, root=tmp_path)
            for i in range(per_thread):
                steps = index * 1000 + i
                checkpoints.add(steps, write(tmp_path, f"models/{steps}.onnx"))
        return run

    run_threads([adder(0), adder(1)])
    kept = CheckpointList(StatusStore(path), "Walker", root=tmp_path).entries()
    assert len(kept) == 5
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == sorted(f"{e['steps']}.onnx" for e in kept)
    run_threads([adder(2)])
    assert len(CheckpointList(StatusStore(path), "Walker").entries()) == 5 + per_thread
    for opened in stores:
        opened.close()


def test_set_final_and_prune_missing_join_a_transaction_but_add_refuses_one(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [1, 2], keep=2)
    (tmp_path / "models/Walker-1.pt").unlink()
    with store.transaction():
        store.set("wall_height", "lesson_num", 4)
        checkpoints.set_final(2, write(tmp_path, "models/Walker.onnx"))
        assert [e["steps"] for e in checkpoints.prune_missing()] == [1]
        with pytest.raises(TrainingStatusError) as raised:
            checkpoints.add(3, write(tmp_path, "models/Walker-3.onnx"))
        assert "final_checkpoint" not in on_disk(store)["Walker"]  # one write, at the end
    assert str(raised.value) == (
        f"CheckpointList.add() cannot run inside a transaction of {store.path}: it removes old checkpoint "
        "files only after its own write, which a transaction would delay. Call add() after the with "
        "store.transaction() block. Nothing was recorded or removed."
    )
    found = on_disk(store)
    assert found["wall_height"] == {"lesson_num": 4} and found["Walker"]["final_checkpoint"]["steps"] == 2
    assert [e["steps"] for e in found["Walker"]["checkpoints"]] == [2]
    assert (tmp_path / "models/Walker-1.onnx").exists()  # prune_missing only drops records
    # Another thread's transaction is no reason to refuse: add waits for it.
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transaction():
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    threading.Timer(0.05, release.set).start()
    checkpoints.add(3, "models/Walker-3.onnx")
    holder.join(10)
    assert [e["steps"] for e in checkpoints.entries()] == [2, 3]


def test_the_error_and_the_warning_classes() -> None:
    assert issubclass(TrainingStatusCheckpointError, TrainingStatusError)
    assert issubclass(TrainingStatusCheckpointError, OSError)
    assert issubclass(TrainingStatusCheckpointWarning, TrainingStatusWarning)
    assert issubclass(TrainingStatusCheckpointWarning, UserWarning)
    error = TrainingStatusCheckpointError("m", file_path="a.onnx", errno=errno.ENOENT, path="/s.json", key="checkpoints")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.args, copy.file_path, copy.errno, copy.path, copy.key, copy.category) == (
        ("m",), "a.onnx", errno.ENOENT, "/s.json", "checkpoints", None)
    warning = TrainingStatusCheckpointWarning("w", category="Walker")
    assert warning.skipped == [] and pickle.loads(pickle.dumps(warning)).category == "Walker"


# -- refusals: nothing written, nothing removed ------------------------------------------------


def test_a_missing_file_is_refused_with_what_to_do(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [1], keep=1)
    before = Path(store.path).read_bytes()
    with pytest.raises(TrainingStatusCheckpointError) as raised:
        checkpoints.add(2, "models/Walker-2.onnx")
    assert str(raised.value) == (
        f"Cannot record the checkpoint at steps 2 of Walker/checkpoints in {store.path}: its file "
        f"models/Walker-2.onnx ({tmp_path}/models/Walker-2.onnx) does not exist. Write the checkpoint's "
        f"files completely before recording it; relative paths are resolved against {tmp_path}. Nothing "
        "was recorded or removed."
    )
    error = raised.value
    assert isinstance(error, OSError) and error.errno == errno.ENOENT
    assert (error.path, error.category, error.key, error.file_path) == (
        store.path, "Walker", "checkpoints", "models/Walker-2.onnx")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is TrainingStatusCheckpointError and str(copy) == str(error)
    assert (copy.errno, copy.file_path, copy.category) == (errno.ENOENT, "models/Walker-2.onnx", "Walker")
    # A missing auxiliary file is refused the same way, and so is the final checkpoint's.
    with pytest.raises(TrainingStatusCheckpointError, match="its file models/gone.pt"):
        checkpoints.add(2, write(tmp_path, "models/Walker-2.onnx"), auxillary_file_paths=["models/gone.pt"])
    with pytest.raises(TrainingStatusCheckpointError, match="of Walker/final_checkpoint in"):
        checkpoints.set_final(2, "models/gone.onnx")
    assert Path(store.path).read_bytes() == before
    assert (tmp_path / "models/Walker-1.onnx").exists()


def test_an_empty_folder_and_a_folder_as_an_auxiliary_file_are_refused(tmp_path: Path, store: StatusStore) -> None:
    (tmp_path / "saved_model" / "empty").mkdir(parents=True)  # a folder of folders holds no checkpoint
    with pytest.raises(TrainingStatusCheckpointError) as raised:
        CheckpointList(store, "Walker", root=tmp_path).add(1, str(tmp_path / "saved_model"))
    assert str(raised.value) == (
        f"Cannot record the checkpoint at steps 1 of Walker/checkpoints in {store.path}: its folder "
        f"{tmp_path}/saved_model holds no file. Write the checkpoint's files completely before recording "
        "it. Nothing was recorded or removed."
    )
    assert not os.path.exists(store.path)
    write(tmp_path, "weights.onnx")
    with pytest.raises(TrainingStatusCheckpointError) as raised:
        CheckpointList(store, "Walker", root=tmp_path).add(1, "weights.onnx", auxillary_file_paths=["saved_model"])
    assert str(raised.value) == (
        f"Cannot record the checkpoint at steps 1 of Walker/checkpoints in {store.path}: saved_model "
        f"({tmp_path}/saved_model) is a directory. Only file_path may be a checkpoint folder; "
        "auxillary_file_paths lists files. Nothing was recorded or removed."
    )
    assert not os.path.exists(store.path)
    with pytest.raises(TrainingStatusCheckpointError) as raised:
        CheckpointList(store, "Walker", root=tmp_path).add(1, "weights.onnx/inner")
    assert str(raised.value) == (
        f"Cannot record the checkpoint at steps 1 of Walker/checkpoints in {store.path}: its file "
        f"weights.onnx/inner ({tmp_path}/weights.onnx/inner) cannot be looked up (Not a directory). Check "
        "the path and the permissions of its folders. Nothing was recorded or removed."
    )
    assert raised.value.errno == errno.ENOTDIR
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(TrainingStatusCheckpointError, match=r"pipe \(.*/pipe\) is not a regular file\. Only file_path"):
        CheckpointList(store, "Walker", root=tmp_path).add(1, "pipe")


def test_a_file_that_cannot_be_synced_is_refused(
        tmp_path: Path, store: StatusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints = fill(tmp_path, store, [1], keep=1)
    before = Path(store.path).read_bytes()
    name = write(tmp_path, "models/Walker-2.onnx")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(TrainingStatusCheckpointError) as raised:
        checkpoints.add(2, name)
    assert str(raised.value) == (
        f"Cannot record the checkpoint at steps 2 of Walker/checkpoints in {store.path}: syncing "
        "models/Walker-2.onnx to disk failed (Input/output error). Nothing was recorded or removed; "
        "check the disk, or pass synced=True if you made the files durable yourself."
    )
    assert raised.value.errno == errno.EIO and isinstance(raised.value.__cause__, OSError)
    monkeypatch.undo()
    assert Path(store.path).read_bytes() == before
    assert (tmp_path / "models/Walker-1.onnx").exists()


BAD_ADDS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"steps": True}, TrainingStatusTypeError, "steps must be an int (the trainer step of the checkpoint), not 'bool' (True)"),
    ({"steps": 2.0}, TrainingStatusTypeError, "steps must be an int (the trainer step of the checkpoint), not 'float' (2.0)"),
    ({"steps": "2"}, TrainingStatusTypeError, "steps must be an int (the trainer step of the checkpoint), not 'str' ('2')"),
    ({"steps": -1}, TrainingStatusValueError, "steps must be >= 0, not -1"),
    ({"reward": math.inf}, TrainingStatusValueError, "reward must be a finite number or NaN, not inf"),
    ({"reward": -math.inf}, TrainingStatusValueError, "reward must be a finite number or NaN, not -inf"),
    ({"reward": True}, TrainingStatusTypeError, "reward must be a number, not 'bool' (True)"),
    ({"reward": "1.5"}, TrainingStatusTypeError, "reward must be a number, not 'str' ('1.5')"),
    ({"creation_time": math.nan}, TrainingStatusValueError, "creation_time must be a finite number, not nan"),
    ({"synced": "yes"}, TrainingStatusTypeError, "synced= must be True or False, not 'str' ('yes')"),
    ({"auxillary_file_paths": "models/x.pt"}, TrainingStatusTypeError,
     "auxillary_file_paths must be a list of paths, not a single path ('models/x.pt')"),
    ({"auxillary_file_paths": 5}, TrainingStatusTypeError, "auxillary_file_paths must be a list of paths, not 'int' (5)"),
    ({"auxillary_file_paths": [None]}, TrainingStatusTypeError,
     "auxillary_file_paths must be a path (str, bytes or os.PathLike), not 'NoneType' (None)"),
    ({"file_path": None}, TrainingStatusTypeError, "file_path must be a path (str, bytes or os.PathLike), not 'NoneType' (None)"),
    ({"file_path": ""}, TrainingStatusValueError, "file_path '' is not a file path (empty, or holds a NUL character)"),
]


@pytest.mark.parametrize(("change", "kind", "start"), BAD_ADDS, ids=[next(iter(c)) + "=" + repr(next(iter(c.values())))
                                                                      for c, _, _ in BAD_ADDS])
@pytest.mark.parametrize("method", ["add", "set_final"])
def test_bad_input_raises_before_anything_is_written_or_removed(
        tmp_path: Path, store: StatusStore, change: dict[str, Any], kind: type[Exception], start: str, method: str) -> None:
    checkpoints = fill(tmp_path, store, [1], keep=1)
    before = Path(store.path).read_bytes()
    arguments: dict[str, Any] = {"steps": 2, "file_path": write(tmp_path, "models/Walker-2.onnx"), **change}
    with pytest.raises(kind) as raised:
        getattr(checkpoints, method)(**arguments)
    key = "checkpoints" if method == "add" else "final_checkpoint"
    assert str(raised.value).startswith(f"{start}, for Walker/{key} in {store.path}")
    assert raised.value.category == "Walker" and raised.value.key == key  # type: ignore[attr-defined]
    assert Path(store.path).read_bytes() == before
    assert (tmp_path / "models/Walker-1.onnx").exists() and (tmp_path / "models/Walker-1.pt").exists()


def test_numpy_numbers_are_stored_as_python_numbers(tmp_path: Path, store: StatusStore) -> None:
    np = pytest.importorskip("numpy")
    entry = CheckpointList(store, "Walker", root=tmp_path).add(
        np.int64(7), write(tmp_path, "a.onnx"), reward=np.float32(0.5), creation_time=np.float64(2.0))
    assert same(entry, {"steps": 7, "file_path": "a.onnx", "reward": 0.5, "creation_time": 2.0, "auxillary_file_paths": [],
                        "files": {"a.onnx": 7}})
    assert same(on_disk(store)["Walker"]["checkpoints"][0], entry)


@pytest.mark.parametrize("damaged", [{"steps": 1}, "checkpoints", 7])
def test_a_list_that_is_not_a_list_is_refused_before_the_files_are_touched(
        tmp_path: Path, store: StatusStore, monkeypatch: pytest.MonkeyPatch, damaged: Any) -> None:
    store.set("Walker", "checkpoints", damaged)
    files = [tmp_path / write(tmp_path, "models/a.onnx"), tmp_path / write(tmp_path, "models/a.pt")]
    status = Path(store.path)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in [*files, status]}
    listings = {d: sorted(os.listdir(d)) for d in (tmp_path / "models", status.parent)}
    # Every fsync and every open the refused call makes: a refusal costs the files nothing (an
    # fsync of a checkpoint folder on a busy disk takes seconds) and takes no lock, writes nothing.
    synced: list[int] = []
    opened: list[str] = []
    real_fsync, real_open = os.fsync, os.open
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(os, "open", lambda path, *args, **kwargs: (opened.append(os.fsdecode(path)),
                                                                    real_open(path, *args, **kwargs))[1])
    with pytest.raises(TrainingStatusValueError) as raised:
        CheckpointList(store, "Walker", root=tmp_path).add(2, "models/a.onnx", auxillary_file_paths=["models/a.pt"])
    monkeypatch.undo()
    assert str(raised.value) == (
        f"Walker/checkpoints in {store.path} holds a {type(damaged).__name__}, not a list of checkpoints; fix it, "
        f"or delete it (trainstatus delete {store.path} Walker checkpoints) to start a new list."
    )
    assert synced == [] and opened == []
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in [*files, status]} == before
    assert {d: sorted(os.listdir(d)) for d in listings} == listings
    assert store.get("Walker", "checkpoints") == damaged


@pytest.mark.parametrize(("options", "kind", "message"), [
    ({"keep": 0}, TrainingStatusValueError, "CheckpointList keep= must be a number of checkpoints >= 1, or None to "
     "keep every one, not 0, for Walker in {path} (ML-Agents' keep_checkpoints: 0 means keep every one: pass keep=None)."),
    ({"keep": -2}, TrainingStatusValueError, "CheckpointList keep= must be a number of checkpoints >= 1, or None to "
     "keep every one, not -2, for Walker in {path}."),
    ({"keep": "5"}, TrainingStatusTypeError, "CheckpointList keep= must be a number of checkpoints >= 1, or None to "
     "keep every one, not '5', for Walker in {path}."),
    ({"keep": True}, TrainingStatusTypeError, "CheckpointList keep= must be a number of checkpoints >= 1, or None to "
     "keep every one, not True, for Walker in {path}."),
    ({"root": 5}, TrainingStatusTypeError, "CheckpointList root= must be a directory path (str, bytes or os.PathLike) "
     "or None, not 'int' (5), for Walker in {path}."),
])
def test_options_are_checked(store: StatusStore, options: dict[str, Any], kind: type[Exception], message: str) -> None:
    with pytest.raises(kind) as raised:
        CheckpointList(store, "Walker", **options)
    assert str(raised.value) == message.format(path=store.path)


def test_store_and_category_are_checked(store: StatusStore) -> None:
    with pytest.raises(TrainingStatusTypeError, match=r"^CheckpointList needs a StatusStore as store=, not 'str'"):
        CheckpointList("results/run_logs/training_status.json", "Walker")  # type: ignore[arg-type]
    with pytest.raises(TrainingStatusTypeError) as raised:
        CheckpointList(store, 3)  # type: ignore[arg-type]
    assert str(raised.value) == (f"CheckpointList category= must be a str (the behavior name, e.g. 'Walker'), "
                                 f"not 'int' (3), for {store.path}.")
    with pytest.raises(TrainingStatusValueError, match="^The category 'metadata' is the metadata block of"):
        CheckpointList(store, "metadata")
    import enum

    class Behavior(enum.Enum):
        WALKER = "Walker"

    checkpoints = CheckpointList(store=store, category=Behavior.WALKER, keep=2)
    assert (checkpoints.category, checkpoints.keep, checkpoints.store) == ("Walker", 2, store)
    assert repr(checkpoints) == f"CheckpointList(StatusStore({store.path!r}), 'Walker', keep=2, root=None)"


# -- reading -----------------------------------------------------------------------------------


def test_latest_is_the_newest_by_steps_then_position(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Walker", keep=None, root=tmp_path)
    assert checkpoints.latest() is None and checkpoints.entries() == []
    for n, name in [(300, "a"), (100, "b"), (300, "c"), (200, "d")]:
        checkpoints.add(n, write(tmp_path, f"{name}.onnx"))
    assert checkpoints.latest()["file_path"] == "c.onnx"  # type: ignore[index]


def test_latest_skips_newer_broken_checkpoints_with_one_warning(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [100, 200, 300, 400], keep=None)
    (tmp_path / "models/Walker-400.pt").unlink()
    (tmp_path / "models/Walker-300.onnx").write_bytes(b"garbage")  # overwritten, same size: only a check sees it
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        found = checkpoints.latest(check=lambda e: Path(checkpoints.resolve(e["file_path"])).read_bytes() == b"weights")
    assert found is not None and found["steps"] == 200
    assert len(caught) == 1 and caught[0].filename == __file__  # points at the caller
    warning = caught[0].message
    assert str(warning) == (
        f"Skipped 2 newer checkpoint(s) of Walker/checkpoints in {store.path}: steps 400 "
        "(models/Walker-400.pt is missing); steps 300 (the check returned False). Using the checkpoint "
        "at steps 200 (models/Walker-200.onnx). The entries stay listed; prune_missing() drops those "
        "whose files are gone."
    )
    assert isinstance(warning, TrainingStatusCheckpointWarning)
    assert [(e["steps"], reason) for e, reason in warning.skipped] == [
        (400, "models/Walker-400.pt is missing"), (300, "the check returned False")]
    assert (warning.path, warning.category, warning.key) == (store.path, "Walker", "checkpoints")
    copy = pickle.loads(pickle.dumps(warning))
    assert str(copy) == str(warning) and copy.skipped == warning.skipped
    assert len(checkpoints.entries()) == 4  # nothing dropped by reading


def test_a_check_that_raises_counts_as_broken(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [1, 2], keep=None)

    def loader(entry: dict[str, Any]) -> bool:
        if entry["steps"] == 2:
            raise EOFError("Ran out of input")
        return True

    with pytest.warns(TrainingStatusCheckpointWarning, match=r"steps 2 \(the check raised EOFError: Ran out of input\)"):
        assert checkpoints.latest(loader)["steps"] == 1  # type: ignore[index]


def test_latest_is_none_with_a_warning_when_nothing_is_usable(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [1], keep=None)
    store.set("Walker", "checkpoints", [*checkpoints.entries(), {"steps": "x"}, "junk",
                                        {"steps": 2, "file_path": "a", "auxillary_file_paths": [3]}])
    (tmp_path / "models/Walker-1.onnx").unlink()
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert checkpoints.latest() is None
    layout = "not a checkpoint entry in ML-Agents' layout (steps, file_path, auxillary_file_paths)"
    assert str(caught[0].message) == (
        f"No checkpoint of Walker/checkpoints in {store.path} is usable: steps 2 ({layout}); steps 1 "
        f"(models/Walker-1.onnx is missing); steps ? ({layout}); steps x ({layout}). latest() returned None: "
        "training starts without "
        "a checkpoint. The entries stay listed; prune_missing() drops those whose files are gone."
    )


def test_a_path_that_is_a_directory_now_is_skipped(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [1, 2], keep=None)
    (tmp_path / "models/Walker-2.onnx").unlink()
    (tmp_path / "models/Walker-2.onnx").mkdir()
    with pytest.warns(TrainingStatusCheckpointWarning, match=r"steps 2 \(models/Walker-2.onnx is not a file\)"):
        assert checkpoints.latest()["steps"] == 1  # type: ignore[index]


def test_the_final_checkpoint(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [1], keep=1)
    assert checkpoints.final() is None
    entry = checkpoints.set_final(1, write(tmp_path, "models/Walker.onnx"), reward=3.0,
                                  auxillary_file_paths=["models/Walker-1.pt"], creation_time=9.0)
    assert entry == {"steps": 1, "file_path": "models/Walker.onnx", "reward": 3.0, "creation_time": 9.0,
                     "auxillary_file_paths": ["models/Walker-1.pt"],
                     "files": {"models/Walker.onnx": 7, "models/Walker-1.pt": 7}}
    assert on_disk(store)["Walker"]["final_checkpoint"] == entry
    assert checkpoints.final() == entry
    assert checkpoints.final(check=lambda e: e["reward"] < 5) == entry
    # Replacing it removes no file.
    checkpoints.set_final(2, write(tmp_path, "models/Walker-final-2.onnx"))
    assert (tmp_path / "models/Walker.onnx").exists()
    (tmp_path / "models/Walker-final-2.onnx").unlink()
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert checkpoints.final() is None
    assert str(caught[0].message) == (
        f"The final checkpoint of Walker/final_checkpoint in {store.path} is not usable: steps 2 "
        "(models/Walker-final-2.onnx is missing). final() returned None."
    )


def test_a_failing_final_check_is_warned_about(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Walker", root=tmp_path)
    checkpoints.set_final(1, write(tmp_path, "models/Walker.onnx"))
    with pytest.warns(TrainingStatusCheckpointWarning, match=r"steps 1 \(the check returned 0\)"):
        assert checkpoints.final(check=lambda e: 0) is None


def test_prune_missing_drops_entries_whose_files_are_gone_in_one_write(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = fill(tmp_path, store, [1, 2, 3, 4], keep=None)
    store.set("Walker", "checkpoints", [*checkpoints.entries(), {"note": "not an entry"}])
    inode = os.stat(store.path).st_ino
    assert checkpoints.prune_missing() == []
    assert os.stat(store.path).st_ino == inode  # nothing missing: nothing written
    (tmp_path / "models/Walker-2.onnx").unlink()
    (tmp_path / "models/Walker-4.pt").unlink()
    dropped = checkpoints.prune_missing()
    assert [e["steps"] for e in dropped] == [2, 4]
    assert [e.get("steps") for e in on_disk(store)["Walker"]["checkpoints"]] == [1, 3, None]
    assert (tmp_path / "models/Walker-2.pt").exists()  # what is left of them stays on disk
    assert missing_files(read_fresh(store.path), str(tmp_path)) == []


# -- ML-Agents' files --------------------------------------------------------------------------


def sample_run(tmp_path: Path) -> Path:
    """The ML-Agents sample status file in a run folder; the checkpoint files are not there yet."""
    status = tmp_path / "run_logs" / "training_status.json"
    status.parent.mkdir(parents=True)
    shutil.copyfile(DATA, status)
    return status


def test_a_list_written_by_ml_agents_is_read(tmp_path: Path) -> None:
    status = sample_run(tmp_path)
    with open(DATA) as f:
        written = json.load(f)
    checkpoints = CheckpointList(StatusStore(status, resume=True), "Walker", keep=5, root=tmp_path)
    assert same(checkpoints.entries(), written["Walker"]["checkpoints"])  # NaN reward included
    assert math.isnan(checkpoints.entries()[0]["reward"])
    with pytest.warns(TrainingStatusCheckpointWarning, match="results/walker_run/Walker.onnx is missing"):
        assert checkpoints.final() is None
    for entry in written["Walker"]["checkpoints"][:3]:
        for name in [entry["file_path"], *entry["auxillary_file_paths"]]:
            write(tmp_path, name)
    with pytest.warns(TrainingStatusCheckpointWarning, match=r"^Skipped 2 newer checkpoint\(s\) of Walker/checkpoints"):
        found = checkpoints.latest()
    assert found == written["Walker"]["checkpoints"][2]
    assert missing_files(written, str(tmp_path)) == [
        ("Walker", "checkpoints", "results/walker_run/Walker/Walker-2000000.onnx"),
        ("Walker", "checkpoints", "results/walker_run/Walker/Walker-2000000.pt"),
        ("Walker", "checkpoints", "results/walker_run/Walker/Walker-2500000.onnx"),
        ("Walker", "checkpoints", "results/walker_run/Walker/Walker-2500000.pt"),
        ("Walker", "final_checkpoint", "results/walker_run/Walker.onnx"),
        ("Walker", "final_checkpoint", "results/walker_run/Walker/Walker-2512345.pt"),
    ]
    # Adding to it keeps ML-Agents' order (oldest first, trimmed at the front) and its layout.
    checkpoints.prune_missing()
    checkpoints.add(3_000_000, write(tmp_path, "results/walker_run/Walker/Walker-3000000.onnx"))
    steps = [e["steps"] for e in on_disk(checkpoints.store)["Walker"]["checkpoints"]]
    assert steps == [500000, 1000000, 1500000, 3000000]
    assert on_disk(checkpoints.store)["SoccerTwos?team=0"] == {"elo": 1278.4, "checkpoints": []}


def test_missing_files_resolves_against_root_and_skips_what_is_not_an_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    document = {
        "Walker": {"checkpoints": [{"steps": 1, "file_path": "a.onnx", "auxillary_file_paths": ["a.pt"]},
                                   {"steps": 2}, "junk"],
                   "final_checkpoint": {"steps": 3, "file_path": str(tmp_path / "abs.onnx")}},
        "wall_height": {"lesson_num": 3, "checkpoints": "not a list"},
        "metadata": {"checkpoints": [{"file_path": "meta.onnx"}]},
    }
    write(tmp_path, "root/a.pt")
    assert missing_files(document, tmp_path / "root") == [
        ("Walker", "checkpoints", "a.onnx"), ("Walker", "final_checkpoint", str(tmp_path / "abs.onnx"))]
    monkeypatch.chdir(tmp_path / "root")
    write(tmp_path, "abs.onnx")
    write(tmp_path, "root/a.onnx")
    assert missing_files(document, None) == []


MLAGENTS_SIDE = r"""
import json, math, os, sys
from mlagents.trainers.training_status import GlobalTrainingStatus
from mlagents.trainers.policy.checkpoint_manager import ModelCheckpoint, ModelCheckpointManager

mode, status = sys.argv[1], "run_logs/training_status.json"

def saved(name):
    os.makedirs(os.path.dirname(name), exist_ok=True)
    open(name, "wb").close()
    return name

if mode == "write":  # a fresh ML-Agents run: three checkpoints kept of four, then the final one
    for steps in (100, 200, 300, 400):
        onnx, pt = saved(f"models/Walker-{steps}.onnx"), saved(f"models/Walker-{steps}.pt")
        reward = float("nan") if steps == 100 else steps / 10
        ModelCheckpointManager.add_checkpoint("Walker", ModelCheckpoint(steps, onnx, reward, float(steps), [pt]), 3)
    ModelCheckpointManager.track_final_checkpoint(
        "Walker", ModelCheckpoint(400, saved("models/Walker.onnx"), 40.0, 401.0, ["models/Walker-400.pt"]))
    os.makedirs("run_logs")  # learn.run_training does this at the start
    GlobalTrainingStatus.save_state(status)
else:  # an ML-Agents resume of a list trainstatus wrote: it adds one and trims to two
    GlobalTrainingStatus.load_state(status)
    onnx, pt = saved("models/Walker-900.onnx"), saved("models/Walker-900.pt")
    ModelCheckpointManager.add_checkpoint("Walker", ModelCheckpoint(900, onnx, 90.0, 900.0, [pt]), 2)
    print(json.dumps(ModelCheckpointManager.get_checkpoints("Walker")))
"""


def test_ml_agents_and_trainstatus_read_each_others_lists(tmp_path: Path, mla_python: Path) -> None:
    python = mla_python
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE", "PYTHON"))}

    def mlagents(mode: str) -> str:
        done = subprocess.run([str(python), "-c", MLAGENTS_SIDE, mode], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    mlagents("write")
    store = StatusStore(tmp_path / "run_logs" / "training_status.json", resume=True)
    checkpoints = CheckpointList(store, "Walker", keep=3, root=tmp_path)
    listed = checkpoints.entries()
    assert [e["steps"] for e in listed] == [200, 300, 400]
    assert list(listed[0]) == FIELDS
    assert listed[0]["auxillary_file_paths"] == ["models/Walker-200.pt"]
    assert checkpoints.latest() == listed[-1]
    assert checkpoints.final() == {"steps": 400, "file_path": "models/Walker.onnx", "reward": 40.0,
                                   "creation_time": 401.0, "auxillary_file_paths": ["models/Walker-400.pt"]}
    # trainstatus goes on: ML-Agents' final checkpoint shares Walker-400.pt, which stays.
    for steps in (500, 600, 700):
        checkpoints.add(steps, write(tmp_path, f"models/Walker-{steps}.onnx"),
                        auxillary_file_paths=[write(tmp_path, f"models/Walker-{steps}.pt")])
    assert (tmp_path / "models/Walker-400.pt").exists() and not (tmp_path / "models/Walker-400.onnx").exists()
    store.close()
    # ML-Agents resumes on trainstatus's file and trims it by ML-Agents' own rules (removing our files).
    after = json.loads(mlagents("trim"))
    assert [e["steps"] for e in after] == [700, 900]
    assert not (tmp_path / "models/Walker-500.onnx").exists() and not (tmp_path / "models/Walker-600.pt").exists()
    resumed = CheckpointList(StatusStore(store.path), "Walker", keep=3, root=tmp_path)
    assert after[0] == resumed.entries()[-1]
    # ML-Agents removed those files before saving its list (it saves at exit): until then the
    # status lists files that are gone, which missing_files reports and prune_missing mends.
    gone = [("Walker", "checkpoints", f"models/Walker-{n}.{ext}") for n in (500, 600) for ext in ("onnx", "pt")]
    assert missing_files(resumed.store.to_dict(), tmp_path) == gone
    assert [e["steps"] for e in resumed.prune_missing()] == [500, 600]
    assert missing_files(read_fresh(store.path), tmp_path) == []
    resumed.store.close()


# -- kills -------------------------------------------------------------------------------------


class Server(Workers):
    """tests/_checkpoint_writer.py's fork server: a writer a run."""

    def __init__(self, where: Path) -> None:
        super().__init__(Path(sys.executable), TESTS / "_checkpoint_writer.py", where)

    def spawn(self, **arguments: Any) -> Run:
        return self.start(1, **arguments)

    def reap(self, run: Run, *, kill: bool) -> None:
        """Wait for the writer (SIGKILLing it first if ``kill``); fail unless SIGKILL ended it."""
        if kill:
            run.kill([0])
        assert run.exits() == [-signal.SIGKILL], f"the writer ended by itself: {run.stderr()}"


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("writers"))
    yield running
    running.close()


def after_kill(run_dir: Path, keep: int) -> dict[str, Any]:
    """What a resume finds; fails if a listed file is missing or incomplete. Returns a summary."""
    path = cw.status_path(str(run_dir))
    if os.path.exists(path):
        store = StatusStore(path, resume=True)
    else:
        # Killed before its first write: a resume finds no file, and says so.
        with pytest.warns(TrainingStatusMissingWarning, match="no status file"):
            store = StatusStore(path, resume=True)
    try:
        checkpoints = CheckpointList(store, cw.CATEGORY, keep=keep, root=run_dir)
        listed = checkpoints.entries()
        assert missing_files(store.to_dict(), str(run_dir)) == [], "a listed checkpoint file is missing"
        assert len(listed) <= keep
        steps = [e["steps"] for e in listed]
        assert steps == sorted(set(steps))
        assert all(cw.complete(str(run_dir), e) for e in listed), "a listed checkpoint file is incomplete"
        best = checkpoints.latest(check=lambda e: cw.complete(str(run_dir), e))  # warns (fails) if any skipped
        assert best == (listed[-1] if listed else None)
    finally:
        store.close()
    newest = steps[-1] if steps else 0
    unlisted = [p for p in (run_dir / "models").iterdir() if int(p.stem.split("-")[1]) not in steps]
    for path in unlisted:
        # Unlisted files are the save in progress (newer) or the dropped ones awaiting removal (older).
        n = int(path.stem.split("-")[1])
        assert n > newest or (steps and n < steps[0]), f"{path.name} is unlisted among listed checkpoints"
    mains = [p for p in unlisted if p.suffix == ".ckpt" and int(p.stem.split("-")[1]) > newest]
    return {
        "newest": newest,
        "partial": sum(p.stat().st_size < cw.SIZE for p in mains),
        "unrecorded": sum(p.stat().st_size == cw.SIZE for p in mains),
        "leftover": sum(int(p.stem.split("-")[1]) < newest for p in unlisted),
        "leftover_files": {p.name for p in unlisted if int(p.stem.split("-")[1]) < newest},
    }


def test_a_kill_before_the_first_write_leaves_a_run_that_resumes_with_a_warning(tmp_path: Path) -> None:
    # What the random kills below meet when one lands before the writer's first set (1 time in 60
    # or so): no status file yet. The resume says so (a warning, an error under this suite's
    # filterwarnings) and finds nothing listed.
    (tmp_path / "models").mkdir()
    found = after_kill(tmp_path, keep=3)
    assert found["newest"] == 0 and found["leftover_files"] == set()
    assert not os.path.exists(cw.status_path(str(tmp_path)))  # a resume that only reads creates nothing


@pytest.mark.long
def test_sigkill_at_random_moments_never_leaves_a_listed_file_missing(
        tmp_path: Path, server: Server, reliability: Any, seed: int) -> None:
    rng = random.Random(seed)
    kills, keep = 60, 3
    # Kills after which the save in progress had left a part-written file, a whole file not yet
    # recorded, or (recorded already) old files not yet removed.
    seen = {"partial": 0, "unrecorded": 0, "leftover": 0}
    progress = 0
    leftovers: set[str] = set()
    for _ in range(kills):
        writer = server.spawn(run_dir=str(tmp_path), keep=keep)
        time.sleep(rng.uniform(0.005, 0.12))
        server.reap(writer, kill=True)
        found = after_kill(tmp_path, keep)
        assert found["newest"] >= progress  # nothing recorded is ever lost
        progress = found["newest"]
        seen["partial"] += found["partial"] > 0
        seen["unrecorded"] += found["unrecorded"] > 0
        seen["leftover"] += bool(found["leftover_files"] - leftovers)
        leftovers = found["leftover_files"]
    reliability.add("kills", kills, source="test_checkpoints.py")
    assert progress >= 10 * cw.STEP, "the writers hardly ever got to record a checkpoint"
    # The kills did land inside saves, before their record (a rate that depends on the disk: most
    # of a save is its fsyncs; the points test reaches every state for certain).
    assert seen["partial"] + seen["unrecorded"] >= 1, seen


@pytest.mark.parametrize("point", cw.STOP_POINTS)
def test_sigkill_at_each_point_of_a_checkpoint_save(tmp_path: Path, server: Server, point: str, reliability: Any) -> None:
    keep = 2
    writer = server.spawn(run_dir=str(tmp_path), keep=keep, stop_at=point, stop_after=4)
    server.reap(writer, kill=False)  # it kills itself at the point
    found = after_kill(tmp_path, keep)
    recorded = point in ("after-record", "mid-remove", "after-add")
    assert found["newest"] == (4 if recorded else 3) * cw.STEP
    assert found["partial"] == (point == "mid-write")
    assert found["unrecorded"] == (point in ("before-add", "after-file-fsync", "before-record"))
    # Killed after the record but before (all of) the old files went: they are extra, never missing.
    # (the dropped checkpoint's two files, or the one not yet removed)
    assert found["leftover"] == {"after-record": 2, "mid-remove": 1}.get(point, 0)
    # The next run finishes the job: it resumes after the newest listed checkpoint.
    writer = server.spawn(run_dir=str(tmp_path), keep=keep, stop_at="after-add", stop_after=1)
    server.reap(writer, kill=False)
    again = after_kill(tmp_path, keep)
    assert again["newest"] == found["newest"] + cw.STEP
    reliability.add("kills", 2, source="test_checkpoints.py")


def test_the_same_checks_catch_ml_agents_order(tmp_path: Path, server: Server) -> None:
    # ML-Agents 1.1.0 removes the dropped checkpoint's files and then sets the list: killed in
    # between, the status lists a file that is gone. The checks above must see that.
    writer = server.spawn(run_dir=str(tmp_path), keep=2, stop_at="mid-remove", stop_after=4, order="mlagents")
    server.reap(writer, kill=False)
    with pytest.raises(AssertionError, match="a listed checkpoint file is missing"):
        after_kill(tmp_path, 2)
    found = missing_files(read_fresh(cw.status_path(str(tmp_path))), str(tmp_path))
    assert found == [("Walker", "checkpoints", cw.file_name(2 * cw.STEP))]


def test_the_writer_content_and_check_agree(tmp_path: Path) -> None:
    data = cw.content(3000)
    assert len(data) == cw.SIZE and data != cw.content(4000)
    write(tmp_path, cw.file_name(3000), data)
    assert cw.complete(str(tmp_path), {"steps": 3000, "file_path": cw.file_name(3000)})
    write(tmp_path, cw.file_name(3000), data[:-1])
    assert not cw.complete(str(tmp_path), {"steps": 3000, "file_path": cw.file_name(3000)})


# -- trainstatus check --files --------------------------------------------------------------------


def test_check_files_reports_each_listed_file_that_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainstatus._cli import base as _cli, main as _cli_main

    models = tmp_path / "results" / "run1" / "Walker"
    models.mkdir(parents=True)
    status = tmp_path / "results" / "run1" / "run_logs" / "training_status.json"
    present = models / "Walker-100.onnx"
    present.write_bytes(b"model")
    entry = {"steps": 100, "file_path": "results/run1/Walker/Walker-100.onnx", "reward": 1.0,
             "creation_time": 1.0, "auxillary_file_paths": ["results/run1/Walker/Walker-100.pt"]}
    # A whole entry too: with none, prune-missing would empty the list and check says that instead.
    whole = {**entry, "steps": 50, "file_path": "results/run1/Walker/Walker-50.onnx", "auxillary_file_paths": []}
    (models / "Walker-50.onnx").write_bytes(b"model")
    with StatusStore(status) as store:
        store.set("Walker", "checkpoints", [whole, entry])
        store.set("Walker", "final_checkpoint", {**entry, "auxillary_file_paths": []})
    assert _cli_main.main(["check", "--files", "--root", str(tmp_path), str(status)]) == _cli.EXIT_WARNINGS
    out = capsys.readouterr().out
    assert (f"warning: Walker/checkpoints lists results/run1/Walker/Walker-100.pt, which does not exist "
            f"(under {tmp_path})") in out
    assert out.count("which does not exist") == 1
    (models / "Walker-100.pt").write_bytes(b"model")
    assert _cli_main.main(["check", "--files", "--root", str(tmp_path), str(status)]) == 0
    assert f"ok: every checkpoint file listed exists with its recorded size (4 files, under {tmp_path})" in capsys.readouterr().out
    assert _cli_main.main(["check", "--root", str(tmp_path), str(status)]) == _cli.EXIT_ERROR
    assert "--root is where --files looks" in capsys.readouterr().err


def test_describe_missing_names_ten_files_and_counts_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "models/here.onnx")
    entries = [{"steps": n, "file_path": f"models/gone-{n}.onnx", "auxillary_file_paths": []} for n in range(12)]
    document = {"Walker": {"checkpoints": entries, "final_checkpoint": {"steps": 1, "file_path": "models/here.onnx"}}}
    described = describe_missing(document)
    assert described.startswith(" That version lists 12 checkpoint file(s) that are missing now: "
                                "Walker/checkpoints models/gone-0.onnx; ")
    assert (f"models/gone-9.onnx (and 2 more) (relative paths looked up under {tmp_path}, the current directory: "
            "Walker records no checkpoint_root, so its paths are read as ML-Agents writes them, relative to the "
            "folder mlagents-learn ran in). ") in described
    assert "gone-10" not in described and "here" not in described
    assert describe_missing({"Walker": {"final_checkpoint": {"steps": 1, "file_path": "models/here.onnx"}}}) == ""


@pytest.mark.parametrize("layout", ["beside", "nested", "status-elsewhere"])
def test_a_checkpoint_in_a_new_folder_is_listed_only_with_its_folder_after_a_power_loss(
        tmp_path: Path, layout: str) -> None:
    # The status file exists first; then the trainer makes its models/ folder (and, nested, one
    # more level) and records a checkpoint there. fsyncing the file and models/ is not enough:
    # the entry "models" lives in the folder above, and until that is synced a power loss can
    # lose models/ with everything in it while the list naming it survives.
    from trainstatus.testing import PowerLoss, power_losses

    run_dir = tmp_path / "run"
    status = {"status-elsewhere": "status/deep/training_status.json"}.get(layout, "run_logs/training_status.json")
    models = {"nested": "models/Walker"}.get(layout, "models")
    (run_dir / os.path.dirname(status)).mkdir(parents=True)
    store = StatusStore(run_dir / status)
    store.set("Walker", "lesson", 1)
    store.close()

    def run() -> None:
        with StatusStore(run_dir / status) as store:
            os.makedirs(run_dir / models)
            fd = os.open(run_dir / models / "Walker-100.onnx", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"x" * 5000)
            os.close(fd)
            CheckpointList(store, "Walker", keep=3, root=run_dir).add(100, f"{models}/Walker-100.onnx")

    states = 0

    def check(loss: PowerLoss) -> None:
        nonlocal states
        states += 1
        with StatusStore(os.path.join(loss.folder, status), durable=False) as store:
            assert missing_files(store.to_dict(), loss.folder) == [], str(loss)
            if loss.acknowledged:
                assert [e["steps"] for e in store.get("Walker", "checkpoints")] == [100]

    power_losses(run, check, root=run_dir)
    assert states > 3


def _synced_folders(monkeypatch: pytest.MonkeyPatch, refuse: str | None = None, error: int = errno.EACCES) -> list[str]:
    """Record the folders CheckpointList fsyncs; ``refuse`` one of them (as a 711 folder would)."""
    import trainstatus._checkpoints.folders as module

    synced: list[str] = []
    real = module._fsync

    def fsync(path: str, *, directory: bool = False) -> None:
        if directory and path == refuse:
            raise OSError(error, os.strerror(error), path)
        if directory:
            synced.append(os.path.realpath(path))
        real(path, directory=directory)

    monkeypatch.setattr(module, "_fsync", fsync)
    return synced


def test_the_walk_up_stops_at_the_folder_shared_with_the_status_file_through_symlinks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The run folder reached through a symlink (a scratch mount, a home link): the walk compares
    # real paths, so it stops at the run folder instead of climbing to /.
    real_run = tmp_path / "real" / "run"
    (real_run / "run_logs").mkdir(parents=True)
    os.symlink(real_run, tmp_path / "link")
    store = StatusStore(tmp_path / "link" / "run_logs" / "training_status.json")
    write(tmp_path / "link", "models/a.onnx")
    synced = _synced_folders(monkeypatch)
    CheckpointList(store, "Walker", root=tmp_path / "link").add(1, "models/a.onnx")
    store.close()
    assert synced == [str(real_run / "models"), str(real_run)]


def test_a_folder_above_that_cannot_be_opened_does_not_stop_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Checkpoints under a traverse-only group folder (mode 711) on another tree than the status
    # file: the folders above can be unreadable, and this run made no entry in those.
    store = StatusStore(tmp_path / "home" / "run_logs" / "training_status.json")
    write(tmp_path, "scratch/group/me/a.onnx")
    synced = _synced_folders(monkeypatch, refuse=str(tmp_path / "scratch" / "group"))
    CheckpointList(store, "Walker", root=tmp_path).add(1, "scratch/group/me/a.onnx")
    assert [e["steps"] for e in CheckpointList(store, "Walker").entries()] == [1]
    assert synced == [str(tmp_path / "scratch" / "group" / "me"), str(tmp_path / "scratch"), str(tmp_path)]
    store.close()


def test_nothing_above_is_synced_for_a_status_that_is_no_local_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainstatus._checkpoints.folders as module

    write(tmp_path, "models/a.onnx")
    synced = _synced_folders(monkeypatch)
    for location in ("s3://bucket/run/training_status.json", "<memory>"):
        module.sync_folders_above([str(tmp_path / "models")], location)
    assert synced == []


def test_an_io_error_syncing_a_folder_above_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StatusStore(tmp_path / "run_logs" / "training_status.json")
    store.set("Walker", "lesson", 1)
    before = Path(store.path).read_bytes()
    write(tmp_path, "models/new/a.onnx")
    _synced_folders(monkeypatch, refuse=str(tmp_path / "models"), error=errno.EIO)
    with pytest.raises(TrainingStatusCheckpointError) as caught:
        CheckpointList(store, "Walker", root=tmp_path).add(1, "models/new/a.onnx")
    assert str(caught.value) == (
        f"Cannot record the checkpoint at steps 1 of Walker/checkpoints in {store.path}: syncing the folder "
        f"{tmp_path / 'models'} above it to disk failed (Input/output error). Nothing was recorded or removed; "
        "check the disk, or pass synced=True if you made the files and their folders durable yourself.")
    assert caught.value.errno == errno.EIO
    assert Path(store.path).read_bytes() == before and store.get("Walker", "checkpoints") is None
    store.close()
