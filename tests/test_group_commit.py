"""Group commit: sets from several threads on one store share writes, and lose nothing.

Real threads on real files. To make batching deterministic, a test holds the first write (the
leader's) inside the write protocol until the other threads' changes are queued, then counts the
writes: the waiting changes must all go out in one. Every set that returns must find its value
in the file; every set whose write failed must raise, and memory must match the disk after.
"""

from __future__ import annotations

import errno
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _helpers import claim_byte_free, end_processes, read_fresh, skip_unless_local_locks

import trainstatus._storage.atomic
from trainstatus._lock import fair as _fair, mailbox as _mailbox
from trainstatus import StatusStore, TrainingStatusError, TrainingStatusLockTimeout, TrainingStatusWriteError

TIMEOUT = 30.0

spawned: list[subprocess.Popen[str]] = []  # every process a test here starts, as it starts it


@pytest.fixture(autouse=True)
def no_process_outlives_its_test() -> Iterator[None]:
    """Whatever a test asserts, every process in ``spawned`` ends with it (SIGCONT, then SIGKILL)."""
    yield
    try:
        end_processes(spawned)
    finally:
        spawned.clear()


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_bytes())


def assert_memory_matches_disk(store: StatusStore) -> None:
    assert store.to_dict() == read_fresh(store.path)


class Writes:
    """The write protocol, instrumented: counts calls, can hold one until released, can fail some."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.started = threading.Event()  # the held write has begun
        self.release = threading.Event()
        self.hold: int | None = None  # 1-based number of the write to hold
        self.fail: dict[int, Callable[[], BaseException]] = {}  # write number -> error to raise
        self.contents: list[dict[str, Any]] = []  # what each successful write put in the file
        self._lock = threading.Lock()
        real = trainstatus._storage.atomic.write_atomic

        def instrumented(target: str, data: bytes, **kwargs: Any) -> Any:
            with self._lock:
                self.count += 1
                number = self.count
            if number == self.hold:
                self.started.set()
                assert self.release.wait(TIMEOUT), "the held write was never released"
            if number in self.fail:
                raise self.fail[number]()
            result = real(target, data, **kwargs)
            self.contents.append(json.loads(data))
            return result

        monkeypatch.setattr(trainstatus._storage.atomic, "write_atomic", instrumented)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Writes:
    return Writes(monkeypatch)


class Call:
    """Run ``target`` in a thread; ``wait()`` returns its result or raises its exception."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self.thread.start()

    def _run(self, target: Callable[[], Any]) -> None:
        try:
            self.result = target()
        except BaseException as exc:  # noqa: BLE001 - handed to wait()
            self.error = exc
        finally:
            self.done.set()

    def wait(self) -> Any:
        assert self.done.wait(TIMEOUT), "the call hung (deadlock?)"
        if self.error is not None:
            raise self.error
        return self.result

    def failure(self) -> BaseException:
        assert self.done.wait(TIMEOUT), "the call hung (deadlock?)"
        assert self.error is not None, "the call succeeded"
        return self.error


def queued(store: StatusStore) -> int:
    """Changes waiting in the store's open batch (for the other threads to be in place)."""
    batch = store._open_batch  # noqa: SLF001 - the only way to know a thread is queued, not yet running
    return 0 if batch is None else len(batch.changes)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


@contextmanager
def leader_held(store: StatusStore, writes: Writes, key: str = "leader") -> Iterator[Call]:
    """A thread's set is inside its write (write number ``writes.count + 1``) for the body."""
    writes.hold = writes.count + 1
    leader = Call(lambda: store.set("c", key, "L"))
    assert writes.started.wait(TIMEOUT), "the leader never started writing"
    try:
        yield leader
    finally:
        writes.release.set()


def queue_sets(store: StatusStore, values: list[tuple[str, Any]]) -> list[Call]:
    """Start one set per (key, value), in order: each is queued before the next starts."""
    calls = []
    for n, (key, value) in enumerate(values, start=1):
        calls.append(Call(lambda key=key, value=value: store.set("c", key, value)))
        wait_until(lambda n=n: queued(store) == n, f"{n} queued changes")
    return calls


# -- batching ------------------------------------------------------------------------------------


@pytest.mark.parametrize("durable", [True, False])
def test_waiting_sets_go_out_in_one_write(tmp_path: Path, writes: Writes, durable: bool) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=durable)
    with leader_held(store, writes) as leader:
        waiters = queue_sets(store, [(f"w{i}", i) for i in range(7)])
        assert not any(w.done.is_set() for w in waiters)  # none returns before its write
    leader.wait()
    for waiter in waiters:
        waiter.wait()
    assert writes.count == 2  # the leader's own, then one carrying all seven
    assert writes.contents[0]["c"] == {"leader": "L"}
    assert writes.contents[1]["c"] == {"leader": "L", **{f"w{i}": i for i in range(7)}}
    assert read(path)["c"] == writes.contents[1]["c"]
    assert_memory_matches_disk(store)


def test_each_set_returns_only_once_its_value_is_in_the_file(tmp_path: Path, writes: Writes,
                                                             reliability: Any) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    threads, sets = 8, 40
    errors: list[str] = []
    start = threading.Barrier(threads)

    def work(w: int) -> None:
        try:
            start.wait(TIMEOUT)
            for i in range(sets):
                store.set("c", f"t{w}", i)
                on_disk = read(path)["c"][f"t{w}"]  # only this thread writes this key
                assert on_disk == i, f"set returned with {i} but the file holds {on_disk}"
                assert store.get("c", f"t{w}") == i
        except BaseException:  # noqa: BLE001 - reported below
            errors.append(traceback.format_exc())

    workers = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(TIMEOUT)
    assert not any(w.is_alive() for w in workers), "a thread hung"
    assert not errors, errors[0]
    assert read(path)["c"] == {f"t{w}": sets - 1 for w in range(threads)}
    assert writes.count <= threads * sets  # never more writes than sets
    assert_memory_matches_disk(store)
    reliability.add("concurrent_writers", threads, source="test_group_commit.py")
    reliability.add("concurrent_sets", threads * sets, source="test_group_commit.py")


def test_later_set_of_the_same_key_in_a_batch_wins(tmp_path: Path, writes: Writes) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    with leader_held(store, writes) as leader:
        waiters = queue_sets(store, [("same", "first"), ("other", 1), ("same", "second"), ("same", "third")])
    leader.wait()
    for waiter in waiters:
        waiter.wait()
    assert writes.count == 2
    assert read(path)["c"] == {"leader": "L", "same": "third", "other": 1}
    assert store.get("c", "same") == "third"


def test_sets_waiting_for_a_transaction_go_out_in_one_write_after_it(tmp_path: Path, writes: Writes) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    other = StatusStore(path)  # another writer of the file: its key must survive the merge
    other.set("other", "x", 1)
    assert writes.count == 1
    with store.transaction():
        store.set("tx", "k", "in transaction")
        first = Call(lambda: store.set("c", "a", 1))  # leads: waits for the transaction
        wait_until(lambda: queued(store) == 1, "the first set to queue")
        rest = queue_sets_after(store, [("b", 2), ("c", 3)], already=1)
        time.sleep(0.05)
        assert not first.done.is_set() and not any(c.done.is_set() for c in rest)
        assert store.get("tx", "k") == "in transaction"  # this thread sees its transaction
        assert Call(lambda: store.get("tx", "k")).wait() is None  # another thread does not
        assert "c" not in read(path)
    first.wait()
    for call in rest:
        call.wait()
    assert writes.count == 3  # other's set, the transaction, one write for the three sets
    doc = read(path)
    assert doc["c"] == {"a": 1, "b": 2, "c": 3}
    assert doc["tx"] == {"k": "in transaction"} and doc["other"] == {"x": 1}
    assert_memory_matches_disk(store)


def queue_sets_after(store: StatusStore, values: list[tuple[str, Any]], already: int) -> list[Call]:
    calls = []
    for n, (key, value) in enumerate(values, start=already + 1):
        calls.append(Call(lambda key=key, value=value: store.set("c", key, value)))
        wait_until(lambda n=n: queued(store) == n, f"{n} queued changes")
    return calls


def test_set_inside_a_transaction_does_not_wait_for_other_threads(tmp_path: Path, writes: Writes) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    with leader_held(store, writes) as leader:
        waiter = queue_sets(store, [("w", 1)])[0]
    leader.wait()
    waiter.wait()
    with store.transaction():
        for i in range(5):
            store.set("c", "tx", i)  # joins the transaction: no write yet
        assert writes.count == 2
    assert writes.count == 3
    assert read(path)["c"] == {"leader": "L", "w": 1, "tx": 4}


# -- failures ------------------------------------------------------------------------------------


def enospc() -> BaseException:
    return OSError(errno.ENOSPC, "No space left on device")


def test_failed_group_write_raises_in_every_thread_it_carried(tmp_path: Path, writes: Writes) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    store.set("c", "before", 0)
    before = path.read_bytes()
    writes.fail[writes.count + 2] = enospc  # the write after the leader's own
    with leader_held(store, writes) as leader:
        waiters = queue_sets(store, [(f"w{i}", i) for i in range(5)])
    leader.wait()  # its own write succeeded
    errors = [w.failure() for w in waiters]
    for error in errors:
        assert isinstance(error, TrainingStatusWriteError)
        assert error.errno == errno.ENOSPC
        assert error.path == str(path)
        assert str(error).startswith(f"Could not save {path} (writing it): No space left on device.")
        assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.ENOSPC
    assert len({id(e) for e in errors}) == len(errors)  # each thread raises its own object
    assert writes.count == 3  # "before", the leader's, the failed one carrying all five
    doc = read(path)
    assert doc["c"] == {"before": 0, "leader": "L"}
    assert path.read_bytes() != before  # the leader's write is there...
    assert all(store.get("c", f"w{i}") is None for i in range(5))  # ...none of the failed ones
    assert_memory_matches_disk(store)
    store.set("c", "after", 1)  # the store still works
    assert read(path)["c"] == {"before": 0, "leader": "L", "after": 1}


def test_failed_directory_sync_of_a_group_write_raises_everywhere_but_keeps_the_content(
        tmp_path: Path, writes: Writes, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=True)
    real_sync = trainstatus._storage.atomic.sync_directory
    syncs = {"n": 0}

    def failing_second_sync(directory: str) -> None:
        syncs["n"] += 1
        if syncs["n"] == 2:
            raise OSError(errno.EIO, "Input/output error")
        real_sync(directory)

    monkeypatch.setattr(trainstatus._storage.atomic, "sync_directory", failing_second_sync)
    with leader_held(store, writes) as leader:
        waiters = queue_sets(store, [(f"w{i}", i) for i in range(3)])
    leader.wait()
    for waiter in waiters:
        error = waiter.failure()
        assert isinstance(error, TrainingStatusWriteError) and error.errno == errno.EIO
        assert "may not survive a power loss" in str(error)
    assert read(path)["c"] == {"leader": "L", "w0": 0, "w1": 1, "w2": 2}  # in the file...
    assert [store.get("c", f"w{i}") for i in range(3)] == [0, 1, 2]  # ...and in memory
    assert_memory_matches_disk(store)


def test_interrupted_group_write_tells_the_other_threads(tmp_path: Path, writes: Writes) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    writes.fail[2] = KeyboardInterrupt
    with leader_held(store, writes) as leader:
        waiters = queue_sets(store, [("w0", 0), ("w1", 1)])
    leader.wait()
    errors = [w.failure() for w in waiters]
    interrupted = [e for e in errors if isinstance(e, KeyboardInterrupt)]
    told = [e for e in errors if not isinstance(e, KeyboardInterrupt)]
    assert len(interrupted) == 1  # the thread that led that write
    assert len(told) == 1
    assert type(told[0]) is TrainingStatusError
    assert str(told[0]) == (
        f"The write of {path} that carried this change was interrupted in another thread "
        "(KeyboardInterrupt); the change may not be in the file. Set it again."
    )
    assert isinstance(told[0].__cause__, KeyboardInterrupt)
    assert read(path)["c"] == {"leader": "L"}
    assert_memory_matches_disk(store)


def test_value_errors_raise_in_their_own_thread_before_joining_a_batch(tmp_path: Path, writes: Writes) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    with leader_held(store, writes) as leader:
        bad = Call(lambda: store.set("c", "bad", {1, 2}))
        assert isinstance(bad.failure(), TypeError)  # raised at once, while the leader still writes
        assert queued(store) == 0
        waiter = queue_sets(store, [("good", 1)])[0]
    leader.wait()
    waiter.wait()
    assert read(path)["c"] == {"leader": "L", "good": 1}


# -- timeouts and closing ------------------------------------------------------------------------


def test_sets_that_time_out_behind_a_transaction_write_nothing(tmp_path: Path, writes: Writes) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False, lock_timeout=0.3)
    with store.transaction():
        store.set("tx", "k", 1)
        first = Call(lambda: store.set("c", "a", 1))
        wait_until(lambda: queued(store) == 1, "the first set to queue")
        second = Call(lambda: store.set("c", "b", 2))
        wait_until(lambda: queued(store) == 2, "the second set to queue")
        errors = [first.failure(), second.failure()]  # the transaction outlasts both timeouts
        assert queued(store) == 0  # both took their change back
    for error in errors:
        assert isinstance(error, TrainingStatusLockTimeout)
        assert str(error) == (
            f"Could not use {path} within 0.3 s: another thread of this process is using this store "
            "(a transaction, or a write waiting for the lock). Let it finish, or open the store with a "
            "longer lock_timeout=."
        )
        assert error.lock_file == str(path) + ".lock"
    assert writes.count == 1  # the transaction only
    assert read(path) == {"tx": {"k": 1}, "metadata": read(path)["metadata"]}
    assert store.get("c", "a") is None and store.get("c", "b") is None
    store.set("c", "a", 3)  # the store is free again
    assert read(path)["c"] == {"a": 3}


def test_waiters_of_a_closed_store_each_raise(tmp_path: Path, writes: Writes) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    with leader_held(store, writes) as leader:
        waiters = queue_sets(store, [("w0", 0), ("w1", 1)])
        closing = Call(store.close)  # waits for the store mutex, held by the leader
        time.sleep(0.02)
    leader.wait()
    closing.wait()
    results = []
    for waiter in waiters:
        assert waiter.done.wait(TIMEOUT)
        results.append(waiter.error)
    # Each waiter either got into the write before the close or raises the closed-store error.
    for error in results:
        if error is not None:
            assert isinstance(error, TrainingStatusError)
            assert str(error) == f"The store on {path} is closed; open a new StatusStore to change it."
    written = read(path)["c"]
    for i, error in enumerate(results):
        assert (f"w{i}" in written) == (error is None)


# -- a batch handed to another process (_lock.mailbox) ---------------------------------------------

_HOLDER = r"""
import sys
from trainstatus import StatusStore
store = StatusStore(sys.argv[1])
with store._storage.lock(None):
    print("holding", flush=True)
    assert sys.stdin.readline() == "go\n"
    store._storage._path_lock._file_lock.contended = True  # as after a wait: its write collects
    store.set("holder", "k", 1)
store.close()
"""


def posted(lock_file: Path, pid: int) -> bool:
    """Whether process ``pid`` has a request waiting in a box of ``lock_file``, and has let go of
    its claim byte (a holder passes by a box whose byte is held, ``_lock.mailbox``)."""
    data = lock_file.read_bytes()
    for slot in range(_fair._SLOTS):
        head = data[_mailbox.box_of(slot):_mailbox.box_of(slot) + 12]
        if len(head) == 12 and struct.unpack("<III", head) == (_mailbox._MAGIC, _mailbox.PENDING, pid):
            return claim_byte_free(lock_file, slot)
    return False


@pytest.mark.skipif(not _fair._HANDOFF, reason="handing over needs Linux's open file description locks")
def test_a_set_after_the_batch_was_handed_to_another_process_is_written_too(tmp_path: Path) -> None:
    """This process's leader waits for another process's lock and hands its batch over. A thread
    that sets after that must not join the handed batch (the holder writes only what it was
    handed): it opens a batch of its own, and returns only once its value is in the file."""
    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.set("c", "start", 0)
    lock_file = Path(str(path) + ".lock")
    skip_unless_local_locks(lock_file)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    spawned.append(holder)  # before anything is asserted
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline() == "holding\n"
        handed = Call(lambda: store.set("c", "handed", 1))
        wait_until(lambda: posted(lock_file, os.getpid()), "the leader to hand its batch over")
        later = Call(lambda: store.set("c", "later", 2))
        wait_until(lambda: len(store._waiters) == 1, "the later set to wait")  # noqa: SLF001
        assert queued(store) == 1  # its change alone: the handed batch was closed when handed
    finally:
        holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0
    handed.wait()
    later.wait()
    assert read(path)["c"] == {"start": 0, "handed": 1, "later": 2}
    assert read(path)["holder"] == {"k": 1}
    assert_memory_matches_disk(store)
    store.close()


_SETTER = r"""
import sys
from trainstatus import StatusStore, _group_commit
from trainstatus._lock import fair as _fair
from trainstatus._storage import atomic as _atomic
_fair._DEFER_AT_MOST = 600.0  # the test holds the lock as long as it needs, however loaded the machine
_fair._STALE_NS = 600 * 10**9
writes = []
_write = _atomic.write_atomic
_atomic.write_atomic = lambda *args, **kwargs: writes.append(1) or _write(*args, **kwargs)
if sys.argv[3] == "pause":
    # Told its change was written, it reads the file only once the test says so.
    _handed_over = _group_commit._GroupCommit._handed_over
    def _paused(self, batch):
        print("told written", flush=True)
        assert sys.stdin.readline() == "read\n"
        return _handed_over(self, batch)
    _group_commit._GroupCommit._handed_over = _paused
store = StatusStore(sys.argv[1], lock_timeout=60)
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
store.set("shared", "progress", int(sys.argv[2]))
print("set", store.get("shared", "progress"), "writes", len(writes), flush=True)
store.close()
"""


def setter(path: Path, value: int, *, pause: bool = False) -> subprocess.Popen[str]:
    """A process setting shared/progress to ``value``, returned once its change is posted for the
    holder (the caller holds the lock). With ``pause``, told its change was written, it says "told
    written" and reads the file only after a line on its stdin."""
    process = subprocess.Popen([sys.executable, "-c", _SETTER, str(path), str(value), "pause" if pause else ""],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    spawned.append(process)  # before anything is asserted
    assert process.stdout is not None and process.stdin is not None
    assert process.stdout.readline() == "ready\n"
    process.stdin.write("go\n")
    process.stdin.flush()
    wait_until(lambda: posted(Path(str(path) + ".lock"), process.pid) or process.poll() is not None,
               "the setter to post its change")
    return process


def output(process: subprocess.Popen[str]) -> str:
    """What ``process`` printed from now until it ended."""
    process.wait(timeout=60)
    assert process.stdout is not None
    return process.stdout.read().strip()


def held_store(tmp_path: Path) -> tuple[Path, StatusStore]:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.set("c", "start", 0)
    skip_unless_local_locks(Path(str(path) + ".lock"))
    return path, store


@pytest.mark.skipif(not _fair._HANDOFF, reason="handing over needs Linux's open file description locks")
def test_two_processes_setting_one_key_in_one_carried_write_leave_the_later_value(tmp_path: Path) -> None:
    """Two processes set one key while a third holds the lock; its write carries both, the later
    one's value laid over the older one's. Both are told written and neither writes again: the
    older one, finding the later value where it set its own, once wrote its own back (issue 32)."""
    path, store = held_store(tmp_path)
    with store._storage.lock(None):
        older, newer = setter(path, 1), setter(path, 2)
        store._storage._path_lock._file_lock.contended = True  # type: ignore[attr-defined]
        store.set("holder", "k", 1)
        assert read(path)["shared"] == {"progress": 2}
    assert (output(older), output(newer)) == ("set 2 writes 0", "set 2 writes 0")
    assert read(path)["shared"] == {"progress": 2}
    store.close()


@pytest.mark.skipif(not _fair._HANDOFF, reason="handing over needs Linux's open file description locks")
def test_a_set_written_for_another_process_is_not_written_again_over_a_later_set(tmp_path: Path) -> None:
    """A holder writes a waiting process's set and tells it so; before that process reads the
    file, another store sets the same key, and its set returns. The waiting process then finds
    the later value, not its own, and must leave it: it once wrote its own back (issue 32)."""
    path, store = held_store(tmp_path)
    with store._storage.lock(None):
        waiter = setter(path, 1, pause=True)
        store._storage._path_lock._file_lock.contended = True  # type: ignore[attr-defined]
        store.set("holder", "k", 1)
    assert waiter.stdout is not None and waiter.stdin is not None
    assert select.select([waiter.stdout], [], [], 60)[0], "the waiter was not told its change was written"
    assert waiter.stdout.readline() == "told written\n"
    assert read(path)["shared"] == {"progress": 1}
    later = StatusStore(path)
    later.set("shared", "progress", 2)  # returned: durable, and later than the waiter's value
    later.close()
    waiter.stdin.write("read\n")
    waiter.stdin.flush()
    assert output(waiter) == "set 2 writes 0"
    assert read(path)["shared"] == {"progress": 2}
    store.close()
