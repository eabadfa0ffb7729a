"""Many writers on one status file: processes, threads, several stores, outside interference, fork.

Every wait is bounded: a deadlock fails the test (the child is killed) instead of hanging the run.
"""

from __future__ import annotations

import gc
import importlib
import json
import multiprocessing
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _helpers import process_message, run_threads

import _workers
from trainstatus import StatusStore, TrainingStatusCorruptWarning, TrainingStatusError, TrainingStatusLockTimeout
from trainstatus._storage import filenames as _names

SPAWN = multiprocessing.get_context("spawn")
TIMEOUT = 60.0  # for anything that should take a second or two

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


# -- helpers ---------------------------------------------------------------------------------


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_bytes())


def run_processes(processes: list[Any], start: Any = None) -> None:
    """Start, release and join ``processes``; fail (after killing them) if any hangs or fails."""
    for process in processes:
        process.start()
    if start is not None:
        start.set()
    deadline = time.monotonic() + TIMEOUT
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [p for p in processes if p.is_alive()]
    for process in hung:
        process.kill()
        process.join(5)
    assert not hung, f"{len(hung)} worker process(es) hung (deadlock?)"
    assert [p.exitcode for p in processes] == [0] * len(processes)


def assert_counting_result(path: Path, workers: int, sets: int) -> None:
    doc = read(path)
    assert doc["shared"] == {"count": workers * sets}
    for worker in range(workers):
        assert doc[_workers.own_category(worker)] == _workers.expected_own(worker, sets)
    assert list(doc)[-1] == "metadata"
    assert set(doc) == {"shared", "metadata"} | {_workers.own_category(w) for w in range(workers)}


def wait_child(pid: int, timeout: float) -> int:
    """Exit code of a forked child; kill it and fail if it does not end in time."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung (deadlock?) and was killed")
        time.sleep(0.01)


def run_lock_exit_handlers() -> None:
    """What a normal exit of a forked child runs that could release a lock it inherited."""
    gc.collect()
    try:
        shutdown = importlib.import_module("filelock._core._shutdown")
    except ImportError:  # pragma: no cover - another filelock layout: gc alone
        return
    release_live_locks = getattr(shutdown, "_release_live_locks", None)
    if release_live_locks is not None:
        release_live_locks()


def run_forked(child: Callable[[], None], timeout: float = 20.0, *, exit_normally: bool = False) -> None:
    """Run ``child`` in a forked child; fail with its traceback if it raises or hangs.

    ``exit_normally`` runs, before the child leaves, what a normal interpreter exit would run for
    locks (garbage collection and filelock's exit handler), but not pytest's own exit handlers.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reported through the pipe
        code, report = 1, b""
        try:
            os.close(read_end)
            child()
            if exit_normally:
                run_lock_exit_handlers()
            code = 0
        except BaseException:  # noqa: BLE001
            report = traceback.format_exc().encode()[-60000:]
        finally:
            try:
                os.write(write_end, report)
            finally:
                os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        code = wait_child(pid, timeout)
        report = pipe.read().decode(errors="replace")
    assert code == 0, f"forked child failed (exit {code}):\n{report}"


def try_set_in_new_process(path: Path, lock_timeout: float) -> tuple[Any, ...]:
    """One set from a freshly spawned process; its outcome as reported by _workers.try_set."""
    result = SPAWN.Queue()
    process = SPAWN.Process(target=_workers.try_set, args=(str(path), lock_timeout, result))
    run_processes([process])
    return result.get(timeout=TIMEOUT)


# -- many writers ----------------------------------------------------------------------------


@pytest.mark.parametrize(("sets", "durable"), [(200, False), (25, True)])
def test_processes_lose_no_key_and_no_increment(tmp_path: Path, sets: int, durable: bool, reliability: Any) -> None:
    path = tmp_path / "status.json"
    start = SPAWN.Event()
    processes = [SPAWN.Process(target=_workers.counting_worker, args=(str(path), w, sets, durable, start))
                 for w in range(4)]
    run_processes(processes, start)
    assert_counting_result(path, 4, sets)
    reliability.add("concurrent_writers", 4, source="test_concurrency.py")
    reliability.add("concurrent_sets", 4 * sets * 2, source="test_concurrency.py")  # own key + increment
    # No temp file left behind by any writer (the history's versions are expected).
    history = _names.history_pattern(path.name)
    assert sorted(p.name for p in tmp_path.iterdir() if not history.fullmatch(p.name)) == sorted([path.name, path.name + ".lock"])


THREAD_SETS = 60  # threads in one process share the GIL: fewer sets keep the test fast


def test_threads_on_one_store_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    run_threads([lambda w=w: _workers.work(store, w, THREAD_SETS) for w in range(8)])
    assert_counting_result(path, 8, THREAD_SETS)
    assert store.to_dict() == read(path)


def test_one_store_per_thread_on_one_path_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    stores = [StatusStore(path, durable=False) for _ in range(8)]
    run_threads([lambda w=w: _workers.work(stores[w], w, THREAD_SETS) for w in range(8)])
    assert_counting_result(path, 8, THREAD_SETS)
    stores[0].reload()
    assert stores[0].to_dict() == read(path)


def test_two_processes_on_the_same_key_always_leave_a_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    StatusStore(path).save()
    start, sets = SPAWN.Event(), 300
    processes = [SPAWN.Process(target=_workers.same_key_writer, args=(str(path), name, sets, start))
                 for name in ("A", "B")]
    for process in processes:
        process.start()
    start.set()
    reads, deadline = 0, time.monotonic() + TIMEOUT
    try:
        while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
            doc = json.loads(path.read_bytes())  # must parse at every moment
            assert set(doc) <= {"shared", "metadata"}
            reads += 1
    finally:
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
    assert [p.exitcode for p in processes] == [0, 0]
    assert reads > 0
    final = read(path)["shared"]["same"]
    assert final in ({"writer": "A", "i": sets - 1}, {"writer": "B", "i": sets - 1})


# -- merging with other writers --------------------------------------------------------------


def test_merge_keeps_keys_another_store_set_between_our_sets(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    a, b = StatusStore(path), StatusStore(path)
    a.set("c", "a", 1)
    b.set("c", "b", 2)
    a.set("c", "c", 3)
    assert read(path)["c"] == {"a": 1, "b": 2, "c": 3}
    assert a.get("c", "b") == 2  # its write re-read the file
    b.set("other", "x", 4)  # and the other way round
    assert read(path) == {"c": {"a": 1, "b": 2, "c": 3}, "other": {"x": 4}, "metadata": read(path)["metadata"]}
    assert b.get("c", "c") == 3


def test_merge_on_the_same_key_the_later_writer_wins(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    a, b = StatusStore(path), StatusStore(path)
    a.set("c", "k", "a1")
    a.set("c", "mine", 0)
    b.set("c", "k", "b")
    a.set("c", "mine", 1)  # does not put back its stale "k"
    assert read(path)["c"] == {"k": "b", "mine": 1}
    assert b.delete("c", "mine") is True
    a.set("c", "k", "a2")  # does not put back the key b deleted
    assert read(path)["c"] == {"k": "a2"}


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [(b"[1, 2, 3]", "its top level is an array, not an object"),
     (b'{"Walker": 3}', "category 'Walker' is a number, not an object"),
     (b"{ this is not json", None)],
)
def test_file_garbled_between_writes_is_kept_aside(tmp_path: Path, garbage: bytes, reason: str | None) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    store.set("c", "a", 1)
    store.set("c", "b", 2)
    path.write_bytes(garbage)  # another party, in place
    with pytest.warns(TrainingStatusCorruptWarning) as record:
        store.set("c", "new", 3)
    assert len(record) == 1
    warning = record[0].message
    assert isinstance(warning, TrainingStatusCorruptWarning)
    assert warning.path == str(path)
    moved = Path(warning.moved_to)
    assert moved.parent == tmp_path
    assert re.fullmatch(re.escape(path.name) + r"\.corrupt-\d{8}T\d{6}\.\d{6}Z(-\d+)?", moved.name)
    assert moved.read_bytes() == garbage
    assert read(path)["c"] == {"a": 1, "b": 2, "new": 3}
    assert store.get("c", "new") == 3
    text = str(warning)
    assert text.startswith(f"{path} was damaged (")
    assert text.endswith(
        f"); it was kept, byte for byte, as {moved} and the next write puts back what this store "
        "last read or wrote. Inspect that file to recover anything newer."
    )
    if reason is not None:
        assert f"({reason});" in text
    # No further warning: the file is good again.
    store.set("c", "after", 4)
    assert read(path)["c"]["after"] == 4


def test_file_replaced_by_garbage_atomically_is_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    store.set("c", "a", 1)
    other = tmp_path / "other"
    other.write_bytes(b"")  # empty
    os.replace(other, path)
    with pytest.warns(TrainingStatusCorruptWarning, match=r"\(it is empty\)"):
        with store.transaction():
            store.set("c", "b", 2)
    assert read(path)["c"] == {"a": 1, "b": 2}


def test_file_deleted_by_hand_is_restored_by_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    mine, other = StatusStore(path), StatusStore(path)
    mine.set("c", "a", 1)
    other.set("c", "b", 2)
    mine.set("d", "x", [1, 2])  # mine now knows a, b and x
    path.unlink()
    mine.set("c", "new", 3)
    assert read(path)["c"] == {"a": 1, "b": 2, "new": 3}
    assert read(path)["d"] == {"x": [1, 2]}
    path.unlink()
    mine.reload()  # a reload of a vanished file keeps what the store knew
    assert mine.get("c", "b") == 2
    with mine.transaction():
        mine.set("c", "tx", 4)
    assert read(path)["c"] == {"a": 1, "b": 2, "new": 3, "tx": 4}


# -- fork ------------------------------------------------------------------------------------


@needs_fork
def test_forked_child_writes_with_the_same_store_and_a_new_one(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=5)
    store.set("parent", "before", 1)
    with store.transaction():  # the lock was taken and released before the fork
        store.set("parent", "tx", 2)

    def child() -> None:
        store.set("child", "same_store", os.getpid())
        with store.transaction():
            store.set("child", "same_store_tx", 1)
        fresh = StatusStore(path, lock_timeout=5)
        fresh.set("child", "new_store", 2)
        assert fresh.get("child", "same_store") == os.getpid()

    run_forked(child)
    doc = read(path)
    assert set(doc["child"]) == {"same_store", "same_store_tx", "new_store"}
    assert doc["parent"] == {"before": 1, "tx": 2}
    store.set("parent", "after", 3)  # the parent's lock still works, and merges the child's keys
    assert read(path)["child"] == doc["child"]
    assert read(path)["parent"] == {"before": 1, "tx": 2, "after": 3}


@needs_fork
def test_forked_child_cannot_get_into_the_parents_transaction(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=5)
    store.set("parent", "before", 1)
    with store.transaction():
        store.set("parent", "in_tx", 2)

        parent = os.getpid()  # holds the lock the child waits for

        def child() -> None:
            fresh = StatusStore(path, lock_timeout=0.3)
            with pytest.raises(TrainingStatusLockTimeout) as info:
                fresh.set("child", "k", 1)
            assert str(info.value) == process_message(path, 0.3, parent)
            assert info.value.lock_file == str(path) + ".lock"
            with pytest.raises(TrainingStatusError) as unusable:
                store.set("child", "k", 2)  # the inherited store is unusable in the child
            assert str(unusable.value) == (
                f"This StatusStore on {path} was inside a transaction when the process forked, so it "
                "cannot be used in the child; open a new StatusStore here."
            )

        run_forked(child, exit_normally=True)
        # The child is gone, having run its exit handlers: the lock must still be ours.
        outcome = try_set_in_new_process(path, 0.3)
        assert outcome == ("timeout", str(path) + ".lock", process_message(path, 0.3, os.getpid()), True)
        assert read(path)["parent"] == {"before": 1}
    doc = read(path)
    assert doc["parent"] == {"before": 1, "in_tx": 2}
    assert "child" not in doc and "intruder" not in doc
    assert try_set_in_new_process(path, 5) == ("ok",)  # released at the end of the transaction


@needs_fork
def test_fork_while_another_thread_holds_the_lock(tmp_path: Path) -> None:
    """The child must not inherit the in-process lock as held by a thread that is not there."""
    path = tmp_path / "status.json"
    holder_store = StatusStore(path, durable=False)
    held, release, errors = threading.Event(), threading.Event(), []

    def hold() -> None:
        try:
            with holder_store.transaction():
                holder_store.set("holder", "k", 1)
                held.set()
                assert release.wait(TIMEOUT)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            held.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert held.wait(TIMEOUT) and not errors

        parent = os.getpid()

        def child() -> None:
            fresh = StatusStore(path, lock_timeout=0.3)
            with pytest.raises(TrainingStatusLockTimeout) as info:
                fresh.set("child", "k", 1)
            # Waiting on the parent's flock, not stuck on an inherited thread lock.
            assert str(info.value) == process_message(path, 0.3, parent)

        run_forked(child)
    finally:
        release.set()
        thread.join(TIMEOUT)
    assert not thread.is_alive() and not errors
    assert read(path) == {"holder": {"k": 1}, "metadata": read(path)["metadata"]}
