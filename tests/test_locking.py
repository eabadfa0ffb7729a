"""The lock: exclusion across processes and threads, timeouts and their messages, reentrancy."""

from __future__ import annotations

import json
import math
import multiprocessing
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import filelock
import pytest
from _helpers import process_message

import _workers
from trainstatus import StatusStore, TrainingStatusError, TrainingStatusLockTimeout

SPAWN = multiprocessing.get_context("spawn")
TIMEOUT = 60.0


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_bytes())


def thread_message_path_lock(path: Path, timeout: float) -> str:
    return (
        f"Could not lock {path} within {timeout} s: another thread of this process holds "
        f"{path}.lock (a write or an open transaction). Let it finish, or open the store with a "
        "longer lock_timeout=."
    )


def thread_message_store(path: Path, timeout: float) -> str:
    return (
        f"Could not use {path} within {timeout} s: another thread of this process is using this "
        "store (a transaction, or a write waiting for the lock). Let it finish, or open the store "
        "with a longer lock_timeout=."
    )


@contextmanager
def deadline(seconds: int = 30) -> Iterator[None]:
    """Fail instead of hanging when the body blocks the main thread (waits with no timeout)."""

    def expired(signum: int, frame: Any) -> None:
        raise AssertionError(f"still blocked after {seconds} s: deadlock")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def held_by_another_process(path: Path, key: str = "holder") -> Iterator[None]:
    """A spawned child holds a transaction on ``path`` for the body; it commits when we leave."""
    held, release = SPAWN.Event(), SPAWN.Event()
    child = SPAWN.Process(target=_workers.hold_transaction, args=(str(path), held, release, key))
    child.start()
    try:
        give_up = time.monotonic() + TIMEOUT
        while not held.wait(0.05):
            assert child.is_alive(), f"the lock-holding child died first (exit {child.exitcode})"
            assert time.monotonic() < give_up, "the child never took the lock"
        yield
    finally:
        release.set()
        child.join(TIMEOUT)
        if child.is_alive():
            child.kill()
            child.join(5)
            pytest.fail("the lock-holding child hung")
    assert child.exitcode == 0


@contextmanager
def held_by_another_thread(store: StatusStore) -> Iterator[None]:
    """Another thread of this process holds a transaction on ``store`` for the body."""
    held, release, errors = threading.Event(), threading.Event(), []

    def hold() -> None:
        try:
            with store.transaction():
                store.set("holder", "thread", 1)
                held.set()
                assert release.wait(TIMEOUT)
        except BaseException:  # noqa: BLE001
            errors.append(traceback.format_exc())
            held.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert held.wait(TIMEOUT) and not errors, errors
        yield
    finally:
        release.set()
        thread.join(TIMEOUT)
    assert not thread.is_alive(), "the lock-holding thread hung"
    assert not errors, errors[0]


class InThread:
    """Run ``target`` in a daemon thread; ``finished`` and ``result``/``error`` tell how it went."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self.finished = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._target = target
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self._target()
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            self.finished.set()

    def wait(self) -> Any:
        assert self.finished.wait(TIMEOUT), "the thread hung (deadlock?)"
        if self.error is not None:
            raise self.error
        return self.result


# -- across processes ------------------------------------------------------------------------


def test_lock_excludes_another_process(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=0.3)
    store.set("mine", "before", 1)
    with held_by_another_process(path):
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("mine", "k", 1)
        error = info.value
        assert isinstance(error, TimeoutError)
        assert isinstance(error, TrainingStatusError)
        assert error.lock_file == str(path) + ".lock"
        assert error.path == str(path)
        assert str(error) == process_message(path, 0.3)
        assert isinstance(error.__cause__, filelock.Timeout)
        with pytest.raises(TrainingStatusLockTimeout):
            with store.transaction():
                pass  # pragma: no cover
        assert store.get("mine", "k") is None  # nothing pending was kept
    doc = read(path)
    assert "k" not in doc["mine"] and "holder" in doc
    store.set("mine", "k", 2)  # free again
    assert read(path)["mine"] == {"before": 1, "k": 2}
    assert "holder" in read(path)


def test_lock_timeout_none_waits_for_another_process(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=None, durable=False)
    with held_by_another_process(path):
        waiter = InThread(lambda: store.set("mine", "k", 1))
        assert not waiter.finished.wait(0.5), "the set got in while another process held the lock"
    waiter.wait()
    doc = read(path)
    assert doc["mine"] == {"k": 1} and "holder" in doc


# -- across threads --------------------------------------------------------------------------


def test_another_thread_in_a_transaction_on_the_same_store_times_out_a_set(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=0.2, durable=False)
    with held_by_another_thread(store):
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("mine", "k", 1)
        assert str(info.value) == thread_message_store(path, 0.2)
        assert isinstance(info.value, TimeoutError)
        assert info.value.path == str(path)
    assert read(path) == {"holder": {"thread": 1}, "metadata": read(path)["metadata"]}


def test_store_lock_timeout_names_the_lock_file(tmp_path: Path) -> None:
    """The spec: TrainingStatusLockTimeout names lock_file, whichever thread holds the lock."""
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=0.2, durable=False)
    with held_by_another_thread(store):
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("mine", "k", 1)
    assert info.value.lock_file == str(path) + ".lock"


def test_another_thread_in_a_transaction_on_another_store_times_out_a_set(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    holder = StatusStore(path, durable=False)
    other = StatusStore(path, lock_timeout=0.2, durable=False)
    with held_by_another_thread(holder):
        with pytest.raises(TrainingStatusLockTimeout) as info:
            other.set("mine", "k", 1)
        assert str(info.value) == thread_message_path_lock(path, 0.2)
        assert info.value.lock_file == str(path) + ".lock"
    other.set("mine", "k", 2)
    assert read(path)["mine"] == {"k": 2}


def test_two_stores_on_one_path_in_one_process_do_not_deadlock(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    a = StatusStore(path, durable=False)
    b = StatusStore(path, durable=False, lock_timeout=None)  # waits forever: filelock's deadlock check applies
    with deadline(), a.transaction():
        a.set("a", "k", 1)
        waiter = InThread(lambda: b.set("b", "k", 2))
        assert not waiter.finished.wait(0.3), "another store's set got in during the transaction"
        assert not path.exists()
    waiter.wait()  # no RuntimeError("Deadlock: ...") from filelock, no hang
    assert read(path)["a"] == {"k": 1} and read(path)["b"] == {"k": 2}
    # And the other way round, with the transaction on the forever-waiting store.
    with deadline(), b.transaction():
        b.set("b", "k", 3)
        waiter = InThread(lambda: a.set("a", "k", 4))
        assert not waiter.finished.wait(0.3)
    waiter.wait()
    assert read(path)["a"] == {"k": 4} and read(path)["b"] == {"k": 3}


def test_second_store_used_inside_a_transaction_on_the_same_thread(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    a = StatusStore(path, durable=False, lock_timeout=None)
    b = StatusStore(path, durable=False, lock_timeout=None)
    with deadline(), a.transaction():
        a.set("a", "k", 1)
        b.set("b", "k", 2)  # same thread: joins the held lock, writes at once
        assert read(path)["b"] == {"k": 2} and "a" not in read(path)
    assert read(path)["a"] == {"k": 1} and read(path)["b"] == {"k": 2}


# -- reentrancy and options ------------------------------------------------------------------


@pytest.fixture
def filelock_acquires(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    calls: list[float | None] = []
    real = filelock.FileLock.acquire

    def counting(self: Any, timeout: float | None = None, *args: Any, **kwargs: Any) -> Any:
        calls.append(timeout)
        return real(self, timeout, *args, **kwargs)

    monkeypatch.setattr(filelock.FileLock, "acquire", counting)
    return calls


def test_filelock_is_taken_once_per_outermost_hold(tmp_path: Path, filelock_acquires: list[float | None]) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    other = StatusStore(path, durable=False)
    with store.transaction():
        store.set("c", "a", 1)
        store.set("c", "b", 2)
        store.delete("c", "a")
        with store.transaction():
            store.set("c", "d", 3)
        store.save()
        other.set("c", "e", 4)  # another store, same thread: rides on the same hold
    assert len(filelock_acquires) == 1
    store.set("c", "f", 5)
    assert len(filelock_acquires) == 2
    assert read(path)["c"] == {"b": 2, "d": 3, "e": 4, "f": 5}


def test_lock_timeout_none_is_passed_as_wait_forever(tmp_path: Path, filelock_acquires: list[float | None]) -> None:
    store = StatusStore(tmp_path / "status.json", lock_timeout=None, durable=False)
    with deadline():
        store.set("c", "k", 1)
    assert filelock_acquires and all(t is not None and t < 0 for t in filelock_acquires)


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan])
def test_invalid_lock_timeout_is_refused(tmp_path: Path, bad: float) -> None:
    path = tmp_path / "status.json"
    with pytest.raises(ValueError) as info:
        StatusStore(path, lock_timeout=bad)
    assert str(info.value) == f"lock_timeout must be a number of seconds >= 0 or None, not {bad!r}"
    assert list(tmp_path.iterdir()) == []


def test_lock_timeout_zero_tries_once(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=0, durable=False)
    store.set("c", "k", 1)  # free: works
    with held_by_another_process(path):
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("c", "k", 2)
        assert str(info.value) == process_message(path, 0)
    assert read(path)["c"] == {"k": 1}


@pytest.mark.parametrize("huge", [math.inf, 1e10])
def test_huge_lock_timeout_works_like_none(tmp_path: Path, huge: float) -> None:
    """Accepted at open (a number >= 0), so a write must not fail with a raw OverflowError."""
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=huge, durable=False)
    with deadline():
        store.set("c", "k", 1)
    assert read(path)["c"] == {"k": 1}


def test_lock_is_released_after_a_failed_transaction(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.set("c", "k", 1)
            raise RuntimeError
    foreign = filelock.FileLock(str(path) + ".lock")
    foreign.acquire(timeout=5)  # raises filelock.Timeout if the flock were still held
    foreign.release()
    other = StatusStore(path, lock_timeout=0.2, durable=False)
    other.set("c", "k", 2)
    assert read(path)["c"] == {"k": 2}
