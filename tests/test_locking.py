"""The lock: exclusion across processes and threads, timeouts and their messages, reentrancy."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _workers
import filelock
import pytest
from _helpers import alarm, end_processes, lock_held_by_another_process, process_message, run_threads, soft_holder, soft_message

from trainstatus import (
    StatusStore,
    TrainingStatusError,
    TrainingStatusLockTimeout,
    TrainingStatusValueError,
    TrainingStatusWriteError,
)
from trainstatus._lock import descriptor as _descriptor, holders as _holders, kernel_wait as _kernel_wait, path_lock as _locking
from trainstatus._storage import atomic as _atomic

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


def deadline(seconds: int = 30) -> contextlib.AbstractContextManager[None]:
    """Fail instead of hanging when the body blocks the main thread (waits with no timeout)."""
    return alarm(seconds, f"still blocked after {seconds} s: deadlock")


@contextmanager
def held_by_another_process(path: Path, key: str = "holder") -> Iterator[int]:
    """A spawned child holds a transaction on ``path`` for the body (given its pid); it commits
    when we leave."""
    held, release = SPAWN.Event(), SPAWN.Event()
    child = SPAWN.Process(target=_workers.hold_transaction, args=(str(path), held, release, key))
    child.start()
    try:
        give_up = time.monotonic() + TIMEOUT
        while not held.wait(0.05):
            assert child.is_alive(), f"the lock-holding child died first (exit {child.exitcode})"
            assert time.monotonic() < give_up, "the child never took the lock"
        assert child.pid is not None
        yield child.pid
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
    with held_by_another_process(path) as holder:
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("mine", "k", 1)
        error = info.value
        assert isinstance(error, TimeoutError)
        assert isinstance(error, TrainingStatusError)
        assert error.lock_file == str(path) + ".lock"
        assert error.path == str(path)
        assert str(error) == process_message(path, 0.3, holder)
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
def flocks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every successful lock and every unlock of the file lock, in order ("lock"/"unlock")."""
    events: list[str] = []
    lock, unlock = filelock.lock_descriptor, filelock.unlock_descriptor

    def counting_lock(fd: int, *args: Any, **kwargs: Any) -> bool:
        taken = lock(fd, *args, **kwargs)
        if taken:
            events.append("lock")
        return taken

    def counting_unlock(fd: int) -> None:
        unlock(fd)
        events.append("unlock")

    monkeypatch.setattr(filelock, "lock_descriptor", counting_lock)
    monkeypatch.setattr(filelock, "unlock_descriptor", counting_unlock)
    return events


def test_file_lock_is_taken_once_per_outermost_hold(tmp_path: Path, flocks: list[str]) -> None:
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
        assert flocks == ["lock"]  # held for the whole body, taken once
    assert flocks == ["lock", "unlock"]
    store.set("c", "f", 5)
    assert flocks == ["lock", "unlock"] * 2
    assert read(path)["c"] == {"b": 2, "d": 3, "e": 4, "f": 5}


def test_lock_timeout_none_waits_without_a_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deadlines: list[float | None] = []
    real = _descriptor._HeldDescriptor.acquire

    def recording(self: Any, deadline: float | None, *rest: Any) -> bool:
        deadlines.append(deadline)
        return real(self, deadline, *rest)

    monkeypatch.setattr(_descriptor._HeldDescriptor, "acquire", recording)
    store = StatusStore(tmp_path / "status.json", lock_timeout=None, durable=False)
    with deadline():
        store.set("c", "k", 1)
    assert deadlines == [None]


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan])
def test_invalid_lock_timeout_is_refused(tmp_path: Path, bad: float) -> None:
    path = tmp_path / "status.json"
    with pytest.raises(TrainingStatusValueError) as info:
        StatusStore(path, lock_timeout=bad)
    assert isinstance(info.value, ValueError) and info.value.path == str(path)
    assert str(info.value) == (
        f"StatusStore option lock_timeout= must be a number of seconds >= 0 (0: do not wait) or None "
        f"(wait forever), not {bad!r}, for {path}."
    )
    assert list(tmp_path.iterdir()) == []


_FLOCK_HOLDER = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                 "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.readline()")


def test_a_lock_timeout_names_the_process_holding_the_lock_by_its_program_alone(tmp_path: Path) -> None:
    """Its pid, its executable and its script, never its further arguments: the message ends up in
    logs and trackers, and another user's process may carry a secret there (a --hf_token=)."""
    path = tmp_path / "status.json"
    lock_path = Path(f"{path}.lock")
    script = tmp_path / "train.py"
    script.write_text(_FLOCK_HOLDER)
    store = StatusStore(path, lock_timeout=0.2, durable=False)
    store.set("c", "k", 1)
    with subprocess.Popen([sys.executable, "-u", str(script), str(lock_path), "--hf_token=hf_s3cr3t"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(TrainingStatusLockTimeout) as info:
                store.set("c", "k", 2)
            holder.communicate("\n", timeout=TIMEOUT)
        finally:
            end_processes([holder])  # whatever failed: not left holding the lock
    assert str(info.value) == (
        f"Could not lock {path} within 0.2 s: process {holder.pid} ({os.path.basename(sys.executable)} train.py "
        f"...) holds {lock_path} (a write or an open transaction). Let it finish, or open the store with a longer "
        "lock_timeout=.")
    assert "s3cr3t" not in str(info.value) and str(tmp_path) not in str(info.value).replace(str(path), "")
    store.set("c", "k", 3)
    assert read(path)["c"] == {"k": 3}


@pytest.mark.parametrize(("words", "named"), [
    (["/usr/bin/python3", "train.py"], "python3 train.py"),
    (["python", "/home/ann/run/train.py", "--hf_token=x"], "python train.py ..."),
    (["python", "-u", "-X", "dev", "-W", "ignore", "train.py"], "python train.py ..."),
    (["python", "-Wignore", "-Xdev", "train.py"], "python train.py ..."),
    (["python3.11", "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"], "python3.11 -m torch.distributed.run ..."),
    (["python", "-mpytest"], "python -m pytest"),
    (["python", "-c", "import secrets; token = 'x'"], "python -c ..."),
    (["python", "-uc", "pass"], "python -c ..."),
    (["python", "--check-hash-based-pycs", "never", "train.py"], "python train.py ..."),
    (["python"], "python"),
    (["python", "-", "--token=x"], "python - ..."),  # the script read from stdin
    (["python", "--", "train.py"], "python train.py ..."),
    (["python", "-m"], "python ..."),  # cut short: no module to name
    (["/opt/venv/bin/torchrun", "--nproc_per_node=2", "train.py"], "torchrun ..."),
    (["mlagents-learn"], "mlagents-learn"),
    (["ray::TrainTrainable.train() --token=x"], "ray::TrainTrainable.train() ..."),  # setproctitle's one string
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_holder_program_is_its_executable_and_script_without_arguments(words: list[str], named: str) -> None:
    assert _holders.program_of(words) == named


def test_lock_timeout_zero_tries_once(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=0, durable=False)
    store.set("c", "k", 1)  # free: works
    with held_by_another_process(path) as holder:
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("c", "k", 2)
        assert str(info.value) == process_message(path, 0, holder)
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


# -- the held descriptor: what filelock.FileLock checked on every acquire, kept --------------------

_FILELOCK_TRY = """
import sys, filelock
lock = filelock.FileLock(sys.argv[1])
try:
    lock.acquire(timeout=float(sys.argv[2]))
except filelock.Timeout:
    print("timeout")
else:
    print("locked")
    lock.release()
"""


def plain_filelock_in_child(lock_path: Path, timeout: float) -> str:
    """What a plain ``filelock.FileLock`` user in another process gets: "locked" or "timeout"."""
    done = subprocess.run(
        [sys.executable, "-c", _FILELOCK_TRY, str(lock_path), str(timeout)],
        capture_output=True, text=True, timeout=TIMEOUT, check=True,
    )
    return done.stdout.strip()


def test_a_plain_filelock_user_in_another_process_is_excluded(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    store.set("c", "k", 1)  # the descriptor is open from here on, between holds too
    assert plain_filelock_in_child(Path(f"{path}.lock"), 0.2) == "locked"  # free between writes
    with store.transaction():
        store.set("c", "k", 2)
        assert plain_filelock_in_child(Path(f"{path}.lock"), 0.2) == "timeout"
    assert plain_filelock_in_child(Path(f"{path}.lock"), 5) == "locked"


def test_a_plain_filelock_user_in_another_process_excludes_us(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=0.2, durable=False)
    store.set("c", "k", 1)
    with lock_held_by_another_process(Path(f"{path}.lock")) as holder:
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("c", "k", 2)
        assert str(info.value) == process_message(path, 0.2, holder)
    store.set("c", "k", 3)
    assert read(path)["c"] == {"k": 3}


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_lock_file_deleted_or_replaced_under_us_locks_the_one_there(tmp_path: Path, how: str) -> None:
    """A lock on a descriptor of a file that is no longer at the lock path excludes nobody: the
    store must notice and lock the file that is there now."""
    path = tmp_path / "status.json"
    lock_path = Path(f"{path}.lock")
    store = StatusStore(path, lock_timeout=0.3, durable=False)
    store.set("c", "k", 1)
    if how == "deleted":
        lock_path.unlink()
    else:
        (tmp_path / "other").write_bytes(b"")
        os.replace(tmp_path / "other", lock_path)
    with lock_held_by_another_process(lock_path) as holder:  # holds the file now at the lock path
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("c", "k", 2)
        assert str(info.value) == process_message(path, 0.3, holder)
    store.set("c", "k", 3)
    assert read(path)["c"] == {"k": 3}
    assert lock_path.is_file()
    # And the other way round: what we hold now is the file at the lock path.
    with store.transaction():
        store.set("c", "k", 4)
        assert plain_filelock_in_child(lock_path, 0.2) == "timeout"


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS], ids=errno.errorcode.get)
def test_a_write_failing_on_its_own_after_its_lock_file_was_deleted_says_what_to_do_about_its_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """The lock file deleted by hand, and the write fails for a reason of its own (a full disk): the
    message says what to do about that error, the history that takes the space included. (A lost
    lock file costs no change any more, see tests/test_version_lock.py: it is not blamed.)"""
    path = tmp_path / "status.json"
    lock_path = Path(f"{path}.lock")
    store = StatusStore(path, durable=False)
    store.set("c", "k", 1)
    kept = len(path.read_bytes())
    store.set("c", "k", 2)  # the first version goes to the history, which a full disk names

    def failing(fd: int, data: bytes) -> None:
        lock_path.unlink()
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(_atomic, "write_all", failing)
    with pytest.raises(TrainingStatusWriteError) as info:
        store.set("c", "k", 3)
    monkeypatch.undo()
    advice = {
        errno.ENOSPC: (f"the disk is full; free some space (the history beside the file holds 1 earlier version, "
                       f".status.json.history-00000001, {kept} bytes together: `trainstatus history {path} --prune "
                       "--keep 0` removes it, and a store opened with a smaller history= keeps fewer)"),
        errno.EROFS: "remount the filesystem writable or use another path",
    }[err]
    assert str(info.value) == (
        f"Could not save {path} (writing it): {os.strerror(err)}. The file was left as it was; {advice}, then set "
        "the value again.")
    assert info.value.errno == err
    assert read(path)["c"] == {"k": 2}
    store.set("c", "k", 4)
    assert read(path)["c"] == {"k": 4}


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")


@needs_proc
def test_no_descriptor_is_left_once_the_stores_go(tmp_path: Path) -> None:
    gc.collect()
    before = open_fds()
    stores = [StatusStore(tmp_path / f"s{i}.json", durable=False) for i in range(20)]
    for store in stores:
        store.set("c", "k", 1)
    assert len(open_fds() - before) >= 20  # the lock file (and the pinned file) stay open
    for store in stores[:10]:
        store.close()
    del stores[:10]
    gc.collect()
    assert len(open_fds() - before) <= 2 * 10
    del stores, store
    gc.collect()
    assert open_fds() - before == set()


@needs_proc
def test_closed_store_keeps_no_descriptor_and_works_again(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    gc.collect()
    before = open_fds()
    store = StatusStore(path, durable=False)
    store.set("c", "k", 1)
    store.close()
    assert open_fds() - before == set()
    again = StatusStore(path, durable=False)
    again.set("c", "k", 2)
    assert read(path)["c"] == {"k": 2}


def test_a_lock_made_under_pyfakefs_never_closes_a_real_descriptor(tmp_path: Path) -> None:
    """A store made in a pyfakefs test keeps its lock after the patcher ends. Its fake descriptor
    number must not reach the real os.close (it would close whatever real file has that number),
    nor be flock'ed by a later real hold of the same lock."""
    from pyfakefs.fake_filesystem_unittest import Patcher

    path = tmp_path / "status.json"
    with Patcher() as patcher:
        assert patcher.fs is not None
        patcher.fs.create_dir(str(tmp_path))
        lock = _locking.lock_for(f"{path}.lock")
        with lock.hold(1.0, path=str(path)):
            pass
        fake_fd = lock._file_lock._held[0][0]
    # A real file under that number: the one a wrong close would hit.
    spare = os.open(os.devnull, os.O_RDONLY)
    made = None
    try:
        try:
            os.fstat(fake_fd)
        except OSError:
            os.dup2(spare, fake_fd)  # nothing real there: put something there
            made = fake_fd
        with lock.hold(1.0, path=str(path)):  # the same PathLock, now on the real filesystem
            assert Path(f"{path}.lock").is_file()
            assert plain_filelock_in_child(Path(f"{path}.lock"), 0.2) == "timeout"
        assert plain_filelock_in_child(Path(f"{path}.lock"), 5) == "locked"
        os.fstat(fake_fd)  # still open
        with Patcher() as patcher:  # and the real descriptor is not closed by a fake os
            assert patcher.fs is not None
            patcher.fs.create_dir(str(tmp_path))
            with lock.hold(1.0, path=str(path)):
                pass
        os.fstat(fake_fd)
        del lock
        gc.collect()
        os.fstat(fake_fd)
        os.fstat(spare)
    finally:
        os.close(spare)
        if made is not None:
            os.close(made)


_FORKING_HOLDER = """
import os, sys, time
from trainstatus import StatusStore
store = StatusStore(sys.argv[1], durable=False)
store.set("c", "k", 1)               # the lock file's descriptor is open from here on
child = os.fork()
if child == 0:                       # a long-lived worker that never writes
    time.sleep(60)
    os._exit(0)
with store.transaction():
    store.set("c", "k", 2)
    print(child, flush=True)         # holding the lock; now kill me
    time.sleep(60)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_keep_a_killed_parents_lock(tmp_path: Path) -> None:
    """flock lasts while any copy of the descriptor is open: a child forked by a writer (a data
    loader worker) must not hold the writer's lock after the writer is killed."""
    path = tmp_path / "status.json"
    with subprocess.Popen([sys.executable, "-c", _FORKING_HOLDER, str(path)], stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        try:
            assert plain_filelock_in_child(Path(f"{path}.lock"), 0.2) == "timeout"  # held
            parent.kill()
            parent.wait(TIMEOUT)
            os.kill(worker, 0)  # the worker still runs
            assert plain_filelock_in_child(Path(f"{path}.lock"), 5) == "locked"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)


# -- lock="soft": a lease file for shared filesystems --------------------------------------------

def test_soft_lock_excludes_a_writer_on_another_machine_and_says_who_it_is(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock="soft", lock_timeout=0.3, durable=False)
    store.set("mine", "before", 1)
    assert not Path(f"{path}.softlock").exists()  # only while held
    with soft_holder(path, remote=True) as holder:
        assert Path(f"{path}.softlock").is_file()
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("mine", "k", 1)
        error = info.value
        assert isinstance(error, TimeoutError) and isinstance(error.__cause__, filelock.Timeout)
        assert error.lock_file == f"{path}.softlock" and error.path == str(path)
        assert str(error) == soft_message(path, 0.3, holder.pid)
        assert store.get("mine", "k") is None
    store.set("mine", "k", 2)
    assert read(path)["mine"] == {"before": 1, "k": 2}
    assert not Path(f"{path}.softlock").exists()


def test_soft_lock_excludes_a_soft_writer_on_this_machine(tmp_path: Path) -> None:
    """On one machine the flock on <file>.lock is taken too, so the wait ends in its message."""
    path = tmp_path / "status.json"
    store = StatusStore(path, lock="soft", lock_timeout=0.3, durable=False)
    with soft_holder(path) as holder:
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("mine", "k", 1)
        assert str(info.value) == process_message(path, 0.3, holder.pid)
    store.set("mine", "k", 2)
    doc = read(path)
    assert doc["mine"] == {"k": 2} and "holder" in doc


def test_soft_lock_waits_for_another_process(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock="soft", lock_timeout=None, durable=False)
    with soft_holder(path):
        waiter = InThread(lambda: store.set("mine", "k", 1))
        assert not waiter.finished.wait(0.5), "the set got in while another process held the soft lock"
    waiter.wait()
    assert read(path)["mine"] == {"k": 1} and "holder" in read(path)


def test_soft_lock_holder_killed_on_this_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock="soft", lock_timeout=5, durable=False)
    with soft_holder(path) as holder:
        holder.kill()
        holder.wait()
        assert Path(f"{path}.softlock").exists()  # left behind by the killed holder
        started = time.monotonic()
        store.set("mine", "k", 1)
        assert time.monotonic() - started < 5  # its pid is gone: no lease to wait out
    assert read(path) == {"mine": {"k": 1}, "metadata": read(path)["metadata"]}  # its change died with it
    assert not Path(f"{path}.softlock").exists()


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_soft_lock_holder_that_stops_renewing_loses_its_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder killed on another machine looks like this one: a pid we cannot check, a marker
    that is no longer refreshed. After the lease it is taken over; before, the message says how
    long to wait and what to delete."""
    monkeypatch.setattr(_locking, "SOFT_LEASE_SECONDS", 1.0)
    path = tmp_path / "status.json"
    with soft_holder(path, lease=1.0, remote=True) as holder:
        os.kill(holder.pid, signal.SIGSTOP)
        try:
            impatient = StatusStore(path, lock="soft", lock_timeout=0.2, durable=False)
            with pytest.raises(TrainingStatusLockTimeout) as info:
                impatient.set("mine", "k", 1)
            assert str(info.value) == soft_message(path, 0.2, holder.pid)
            assert "1 s without renewal" in str(info.value)
            del impatient
            store = StatusStore(path, lock="soft", lock_timeout=TIMEOUT, durable=False)
            store.set("mine", "k", 2)  # waits out the lease, then takes it over
            assert read(path)["mine"] == {"k": 2}
        finally:
            holder.kill()
            os.kill(holder.pid, signal.SIGCONT)
            holder.wait()


def test_soft_lock_takes_the_lease_once_per_outermost_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    real = filelock.SoftFileLease.acquire

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        taken.append(self.lock_file)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(filelock.SoftFileLease, "acquire", counting)
    path = tmp_path / "status.json"
    store = StatusStore(path, lock="soft", durable=False)
    other = StatusStore(path, lock="soft", durable=False)
    with store.transaction():
        store.set("c", "a", 1)
        store.set("c", "b", 2)
        other.set("c", "e", 4)
        assert taken == [f"{path}.softlock"]
        # Held for the whole body: another process, in either mode, stays out.
        assert plain_filelock_in_child(Path(f"{path}.lock"), 0.2) == "timeout"
        child = subprocess.run(
            [sys.executable, "-c", _SOFT_TRY, str(path)], capture_output=True, text=True, timeout=TIMEOUT, check=True
        )
        assert child.stdout.strip() == "timeout"
    store.set("c", "f", 5)
    assert taken == [f"{path}.softlock"] * 2
    assert read(path)["c"] == {"a": 1, "b": 2, "e": 4, "f": 5}


_SOFT_TRY = """
import sys
from trainstatus import StatusStore, TrainingStatusLockTimeout
try:
    StatusStore(sys.argv[1], lock="soft", lock_timeout=0.2, durable=False).set("intruder", "k", 1)
except TrainingStatusLockTimeout:
    print("timeout")
else:
    print("ok")
"""


def test_soft_lock_between_threads_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    shared = StatusStore(path, lock="soft", durable=False)

    def writer(n: int) -> Callable[[], None]:
        store = shared if n % 2 else StatusStore(path, lock="soft", durable=False)

        def run() -> None:
            for i in range(15):
                store.set(f"t{n}", f"k{i}", i)
                with store.transaction():
                    store.set("shared", "count", store.get("shared", "count", 0) + 1)
        return run

    run_threads([writer(n) for n in range(4)])
    doc = read(path)
    assert doc["shared"] == {"count": 60}
    assert all(doc[f"t{n}"] == {f"k{i}": i for i in range(15)} for n in range(4))


def test_soft_lock_waits_for_a_flock_writer_on_this_machine(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock="soft", lock_timeout=0.3, durable=False)
    with lock_held_by_another_process(Path(f"{path}.lock")) as holder:
        with pytest.raises(TrainingStatusLockTimeout) as info:
            store.set("c", "k", 1)
        assert str(info.value) == process_message(path, 0.3, holder)
    store.set("c", "k", 2)
    assert read(path)["c"] == {"k": 2}


def test_lock_mode_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    with pytest.raises(TrainingStatusValueError) as info:
        StatusStore(path, lock="nfs")
    assert isinstance(info.value, ValueError) and info.value.path == str(path)
    assert str(info.value) == f"StatusStore option lock= must be one of 'flock', 'soft', not 'nfs', for {path}."
    with pytest.raises(TrainingStatusValueError) as info:
        StatusStore("s3://bucket/run/training_status.json", lock="soft")
    assert str(info.value) == (
        "lock='soft' is for local paths; 's3://bucket/run/training_status.json' is an s3:// object, which "
        "takes no lock (writes are conditional). Leave lock= out."
    )
    first = StatusStore(path, durable=False)
    with pytest.raises(TrainingStatusValueError) as info:
        StatusStore(path, lock="soft")
    assert isinstance(info.value, ValueError) and info.value.path == str(path)
    assert str(info.value) == (
        f"{path} is already open in this process with lock='flock'; every store on one file must use "
        "the same lock mode, not lock='soft'"
    )
    assert list(tmp_path.iterdir()) == []
    first.close()
    del first, info  # the traceback holds the lock it was raised about
    gc.collect()
    StatusStore(path, lock="soft").set("c", "k", 1)  # nothing open with the other mode any more
    assert read(path)["c"] == {"k": 1}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_never_releases_the_parents_soft_lock(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock="soft", durable=False)
    with store.transaction():
        store.set("c", "k", 1)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: exit the way a worker does, running exit handlers
            code = 0
            try:
                gc.collect()
                StatusStore(path, lock="soft", lock_timeout=0.2, durable=False).set("child", "k", 1)
                code = 3  # got in while the parent holds the lock
            except TrainingStatusLockTimeout:
                pass
            except BaseException:  # noqa: BLE001
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert Path(f"{path}.softlock").is_file()
        done = subprocess.run(
            [sys.executable, "-c", _SOFT_TRY, str(path)], capture_output=True, text=True, timeout=TIMEOUT, check=True
        )
        assert done.stdout.strip() == "timeout"  # still ours
    assert read(path)["c"] == {"k": 1} and "child" not in read(path)


def no_flock(monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """Make flock fail the way it does on a filesystem without it."""

    def failing(fd: int, *args: Any, **kwargs: Any) -> bool:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(filelock, "lock_descriptor", failing)


@pytest.mark.parametrize("err", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP], ids=errno.errorcode.get)
def test_without_flock_the_flock_mode_says_to_use_soft_and_soft_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    path = tmp_path / "status.json"
    no_flock(monkeypatch, err)
    store = StatusStore(path, durable=False)
    with pytest.raises(TrainingStatusWriteError) as info:
        store.set("c", "k", 1)
    assert str(info.value) == (
        f"Could not lock {path}: flock on the lock file {path}.lock failed: {os.strerror(err)}. Nothing "
        'was written; on a filesystem without flock (some network filesystems) open the store with '
        'lock="soft".'
    )
    assert info.value.errno == err and info.value.lock_file == f"{path}.lock"
    assert not path.exists()
    soft_path = tmp_path / "soft.json"
    soft = StatusStore(soft_path, lock="soft", durable=False)
    soft.set("c", "k", 1)  # the lease alone
    with soft.transaction():
        soft.set("c", "k", 2)
        done = subprocess.run([sys.executable, "-c", _SOFT_TRY, str(soft_path)], capture_output=True, text=True,
                              timeout=TIMEOUT, check=True)
        assert done.stdout.strip() == "timeout"
    assert read(soft_path)["c"] == {"k": 2}


def test_soft_mode_still_fails_on_other_flock_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    no_flock(monkeypatch, errno.EIO)
    with pytest.raises(TrainingStatusWriteError) as info:
        StatusStore(path, lock="soft", durable=False).set("c", "k", 1)
    assert info.value.errno == errno.EIO and not path.exists()


def test_a_lease_that_cannot_be_made_is_a_write_error_and_frees_the_flock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "status.json"

    def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self.lock_file))

    monkeypatch.setattr(filelock.SoftFileLease, "acquire", refused)
    store = StatusStore(path, lock="soft", durable=False)
    with pytest.raises(TrainingStatusWriteError) as info:
        store.set("c", "k", 1)
    assert str(info.value) == (
        f"Could not lock {path}: cannot open the lock file {path}.softlock: {os.strerror(errno.EACCES)}. "
        "Nothing was written; make its directory writable (and the lock file a regular file, not a symlink)."
    )
    assert info.value.lock_file == f"{path}.softlock"
    assert plain_filelock_in_child(Path(f"{path}.lock"), 5) == "locked"  # not left held
    monkeypatch.undo()
    store.set("c", "k", 2)
    assert read(path)["c"] == {"k": 2}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "another process"),  # gone between the timeout and the message
        (b"", "another process"),  # an old filelock's empty marker
        (b"garbage\n", "another process"),
        (b"filelock/2\npid=42\nmode=lease\n", "process 42"),
        (b"filelock/2\npid=42\nhost=node3\nmode=lease\n", "process 42 on node3"),
        (b"filelock/3\npid=42\nhost=node3\nmode=lease\n", "another process"),  # not the protocol filelock reads
        (b"filelock/2\npid=41\nhost=node3\npid=42\n", "process 42 on node3"),  # the last, as filelock reads it
    ],
)
def test_soft_timeout_names_the_holder_it_can(tmp_path: Path, content: bytes | None, expected: str) -> None:
    marker = tmp_path / "status.json.softlock"
    if content is not None:
        marker.write_bytes(content)
    assert _holders.holder_of_lease(str(marker)) == expected


def rewrite_behind_stat(path: Path, old: bytes, new: bytes) -> None:
    """Change the file's bytes in place keeping (dev, inode, size, mtime): what a stat on an NFS
    client with cached attributes can show after another machine's write."""
    assert len(old) == len(new)
    before = path.stat()
    data = path.read_bytes()
    assert data.count(old) == 1
    with open(path, "r+b") as f:
        f.write(data.replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


@pytest.mark.parametrize("lock", ["flock", "soft"])
def test_soft_mode_reads_the_file_before_every_write(tmp_path: Path, lock: str) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock=lock, durable=False)
    store.set("other", "k", 1111)
    store.set("mine", "k", 1)
    rewrite_behind_stat(path, b"1111", b"2222")  # "another machine" changed a key we do not touch
    store.set("mine", "k", 2)
    # flock mode trusts the stat (on a local disk it cannot miss a write: every write is a rename);
    # soft mode reads the file and keeps the other writer's value.
    assert read(path)["other"] == {"k": 2222 if lock == "soft" else 1111}
    assert read(path)["mine"] == {"k": 2}


def test_ctrl_c_just_as_the_blocked_flock_returns_leaves_the_lock_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal handled right after the wait for the blocked ``flock`` got it, before the
    descriptor was taken: the cancel that follows must unlock it. It used to stay locked, on a
    descriptor nothing referred to, and every writer of the file, this process included, waited
    for it forever."""
    import fcntl

    lock_file = tmp_path / "status.json.lock"
    holder = os.open(lock_file, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    wait = _kernel_wait._KernelWait(str(lock_file))
    real = _kernel_wait._interrupts.acquire

    def acquired_then_interrupted(lock: Any, timeout: float | None) -> bool:
        if real(lock, timeout):
            raise KeyboardInterrupt  # as a handler run the moment the wait returned
        return False

    monkeypatch.setattr(_kernel_wait._interrupts, "acquire", acquired_then_interrupted)
    assert wait.take(0.05) is None  # still held by the other descriptor
    os.close(holder)
    with pytest.raises(KeyboardInterrupt):
        wait.take(10)
    wait.cancel()
    probe = os.open(lock_file, os.O_RDWR)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if it stayed locked
    finally:
        os.close(probe)
