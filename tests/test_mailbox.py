"""Group commit across processes (``_lock.mailbox``): a waiting process hands its set to the holder.

Real processes on a real lock file. The holder here is this test's own store, holding its lock
while the waiter, another process, signs in and posts; its next ``set`` carries the waiter's
change. Each test says which promise it checks: a handed-over change is acknowledged only once
it is in the file, a holder that fails or dies leaves the waiter to write its own change, a waiter
that gives up takes back a change no holder took and waits for one that a holder took.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _helpers import skip_unless_local_locks

from trainstatus import StatusStore, TrainingStatusWriteError
from trainstatus._storage import atomic as _atomic
from trainstatus._lock import fair as _fair, mailbox as _mailbox

pytestmark = pytest.mark.skipif(not _fair._HANDOFF, reason="handing over needs Linux's open file description locks")

_WAITER = r"""
import sys, time
from trainstatus import StatusStore, TrainingStatusError, TrainingStatusLockTimeout; from trainstatus._lock import fair as _fair; from trainstatus._lock import descriptor as _descriptor
_fair._DEFER_AT_MOST = 600.0
_fair._STALE_NS = 600 * 10**9
if len(sys.argv) > 6:
    _descriptor._OUTCOME_GRACE = float(sys.argv[6])
store = StatusStore(sys.argv[1], durable=sys.argv[4] == "durable", lock_timeout=float(sys.argv[2]),
                    metadata={"run": sys.argv[5]} if sys.argv[5] else None)
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
try:
    store.set("waiters", sys.argv[3], [1.5, float("nan")])
except TrainingStatusLockTimeout:
    print("timeout", flush=True)
except TrainingStatusError as exc:
    print("unfinished:", exc, flush=True)
else:
    print("set", store.get("waiters", sys.argv[3]), store.get("holder", "k"), flush=True)
store.close()
"""


def _until(condition: Any, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


def _boxes(lock_file: Path) -> dict[int, int]:
    """pid -> state of every box in the lock file that holds a request (its last slot's)."""
    return {pid: state for pid, state in _slots(lock_file).values()}


def _slots(lock_file: Path) -> dict[int, tuple[int, int]]:
    """slot -> (pid, state) of every box in the lock file that holds a request."""
    found = {}
    with open(lock_file, "rb") as f:
        data = f.read()
    for slot in range(_fair._SLOTS):
        head = data[_mailbox.box_of(slot):_mailbox.box_of(slot) + _mailbox._HEAD.size]
        if len(head) == _mailbox._HEAD.size:
            magic, state, pid = struct.unpack_from("<III", head)
            if magic == _mailbox._MAGIC:
                found[slot] = (pid, state)
    return found


def _waiter(path: Path, key: str, *, lock_timeout: float = 60.0, durable: bool = True,
            metadata: str = "", grace: float = 10.0) -> subprocess.Popen[str]:
    """A waiter process let go once its request is posted (the caller holds the lock)."""
    return _posted(path, _WAITER, str(lock_timeout), key, "durable" if durable else "fast", metadata, str(grace))


def _posted(path: Path, script: str, *args: str) -> subprocess.Popen[str]:
    """``script`` run on ``path``, let go once it prints "ready", returned once it posted a request."""
    waiter = subprocess.Popen([sys.executable, "-c", script, str(path), *args],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert waiter.stdout is not None and waiter.stdin is not None
    assert waiter.stdout.readline() == "ready\n"
    waiter.stdin.write("go\n")
    waiter.stdin.flush()
    lock_file = Path(str(path) + ".lock")
    _until(lambda: _boxes(lock_file).get(waiter.pid) == _mailbox.PENDING or waiter.poll() is not None,
           "the waiter never posted its request")
    return waiter


@contextmanager
def _holding(store: StatusStore) -> Iterator[Any]:
    """Hold ``store``'s lock as a holder that found others waiting does (its writes collect)."""
    with store._storage.lock(None):
        file_lock = store._storage._path_lock._file_lock
        yield file_lock


def _prepared(tmp_path: Path, **options: Any) -> tuple[Path, Path, StatusStore]:
    path = tmp_path / "status.json"
    store = StatusStore(path, **options)
    store.set("holder", "start", 0)
    lock_file = Path(str(path) + ".lock")
    skip_unless_local_locks(lock_file)
    return path, lock_file, store


def _on_disk(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_the_holder_writes_a_waiting_process_set_and_acknowledges_it_after_the_write(tmp_path: Path) -> None:
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1")
        file_lock.contended = True
        store.set("holder", "k", 1)
        # Still holding the lock: only the holder can have written the waiter's change.
        assert "\"w1\": [\n      1.5,\n      NaN\n    ]" in path.read_text()
        assert _boxes(lock_file)[waiter.pid] == _mailbox.DONE
        assert store.get("waiters", "w1") is not None  # the holder's memory follows its file
    out, _ = waiter.communicate(timeout=60)
    # Its memory is the file, as after a write of its own: the holder's set is seen too.
    assert out.strip() == "set [1.5, nan] 1"
    store.close()


def test_without_contention_the_holder_reads_no_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone writer pays nothing for handing over: no look at the waiting list or the boxes."""
    path, _, store = _prepared(tmp_path)
    looked: list[int] = []
    real = _fair.Registry.live_waiters
    monkeypatch.setattr(_fair.Registry, "live_waiters", lambda self: looked.append(1) or real(self))
    for i in range(5):
        store.set("holder", "k", i)
    assert looked == []
    store.close()


def test_a_change_is_not_acknowledged_when_the_holder_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder took the request, then its write failed: the waiter writes its change itself."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1")
        file_lock.contended = True

        def full(*args: Any, **kwargs: Any) -> Any:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(_atomic, "write_atomic", full)
        with pytest.raises(TrainingStatusWriteError):
            store.set("holder", "k", 1)
        monkeypatch.undo()
        assert _boxes(lock_file)[waiter.pid] == _mailbox.CLAIMED
        assert "waiters" not in _on_disk(path)
    out, _ = waiter.communicate(timeout=60)
    assert out.strip() == "set [1.5, nan] None"
    assert "\"w1\": [\n      1.5,\n      NaN\n    ]" in path.read_text()
    store.close()


_DYING_HOLDER = r"""
import os, signal, sys
from trainstatus import StatusStore, _committing
store = StatusStore(sys.argv[1])
lock = None
with store._storage.lock(None):
    print("holding", flush=True)
    assert sys.stdin.readline() == "go\n"
    store._storage._path_lock._file_lock.contended = True
    real = _committing._Committing._write
    def dying(self):
        if self._pending.get(("waiters", "w1")) is not None:
            os.kill(os.getpid(), signal.SIGKILL)  # took the request, wrote nothing
        real(self)
    _committing._Committing._write = dying
    store.set("holder", "k", 1)
"""


def test_a_holder_killed_after_taking_a_request_leaves_the_waiter_to_write_it(tmp_path: Path) -> None:
    path, lock_file, store = _prepared(tmp_path)
    store.close()
    holder = subprocess.Popen([sys.executable, "-c", _DYING_HOLDER, str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline() == "holding\n"
    waiter = _waiter(path, "w1")
    holder.communicate("go\n", timeout=60)
    assert holder.returncode == -signal.SIGKILL
    out, _ = waiter.communicate(timeout=60)
    assert out.strip() == "set [1.5, nan] None"
    document = path.read_text()
    assert "\"w1\": [\n      1.5,\n      NaN\n    ]" in document
    assert "\"k\"" not in document


def test_a_waiter_that_times_out_takes_back_a_request_no_holder_took(tmp_path: Path) -> None:
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1", lock_timeout=0.5)
        out, _ = waiter.communicate(timeout=60)
        assert out.strip() == "timeout"
        assert _boxes(lock_file)[waiter.pid] == _mailbox.EMPTY
        file_lock.contended = True
        store.set("holder", "k", 1)  # must not write the change its process gave up on
    assert "waiters" not in _on_disk(path)
    store.close()


def test_a_waiter_whose_request_was_taken_waits_for_the_outcome_past_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a holder took it, a change is written: its process does not raise a timeout then."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1", lock_timeout=0.5)
        file_lock.contended = True
        real = _atomic.write_atomic

        def slow(*args: Any, **kwargs: Any) -> Any:
            time.sleep(1.5)  # past the waiter's lock_timeout, the request already taken
            return real(*args, **kwargs)

        monkeypatch.setattr(_atomic, "write_atomic", slow)
        store.set("holder", "k", 1)
        monkeypatch.undo()
    out, _ = waiter.communicate(timeout=60)
    assert out.strip() == "set [1.5, nan] 1"
    assert "\"w1\"" in path.read_text()
    store.close()


@pytest.mark.parametrize(("holder", "waiter"), [
    ({"durable": False}, {"durable": True}),  # a durable set only into a durable write
    ({}, {"metadata": "other"}),  # a store with metadata of its own writes them itself
    ({"history": 0}, {}),  # a write that keeps no earlier version: not for a store that keeps them
    ({"allow_downgrade": True}, {}),  # a write that may rewrite a newer format: not for one that refuses
], ids=["durable", "metadata", "history", "downgrade"])
def test_the_holder_leaves_what_its_write_cannot_carry(tmp_path: Path, holder: dict[str, Any], waiter: dict[str, Any]) -> None:
    path, lock_file, store = _prepared(tmp_path, **holder)
    with _holding(store) as file_lock:
        process = _waiter(path, "w1", **waiter)
        file_lock.contended = True
        store.set("holder", "k", 1)
        assert _boxes(lock_file)[process.pid] == _mailbox.PENDING
        assert "waiters" not in _on_disk(path)
    out, _ = process.communicate(timeout=60)
    assert out.strip() == "set [1.5, nan] 1"
    text = path.read_text()
    assert "\"w1\"" in text
    if "metadata" in waiter:
        assert "\"run\": \"other\"" in text
    store.close()


def test_a_torn_or_foreign_box_is_never_taken(tmp_path: Path) -> None:
    """A box whose checksum fails (a torn write, or bytes another program put there) is left."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1")
        slot = next(s for s in range(_fair._SLOTS)
                    if struct.unpack_from("<III", lock_file.read_bytes(), _mailbox.box_of(s))[2:3] == (waiter.pid,))
        fd = os.open(lock_file, os.O_RDWR)
        try:  # one byte of the value's bytes, the payload's last, changed
            length = _mailbox._HEAD.unpack(os.pread(fd, _mailbox._HEAD.size, _mailbox.box_of(slot)))[6]
            at = _mailbox.box_of(slot) + _mailbox._HEAD.size + length - 1
            os.pwrite(fd, b"}", at)
        finally:
            os.close(fd)
        file_lock.contended = True
        store.set("holder", "k", 1)
        assert "waiters" not in _on_disk(path)
    out, _ = waiter.communicate(timeout=60)
    assert out.strip() == "set [1.5, nan] 1"
    store.close()


_SETTER = r"""
import sys
from trainstatus import StatusStore
store = StatusStore(sys.argv[1])
for i in range(int(sys.argv[3])):
    store.set("counts", sys.argv[2], i)
    assert store.get("counts", sys.argv[2]) == i
store.close()
print("done", flush=True)
"""


def test_many_processes_setting_at_once_lose_no_set(tmp_path: Path) -> None:
    """Eight processes, each setting its own key 60 times: every last value is in the file."""
    path, lock_file, store = _prepared(tmp_path)
    store.close()
    processes = [subprocess.Popen([sys.executable, "-c", _SETTER, str(path), f"p{i}", "60"],
                                  stdout=subprocess.PIPE, text=True) for i in range(8)]
    assert [p.communicate(timeout=60)[0].strip() for p in processes] == ["done"] * 8
    assert json.loads(path.read_text())["counts"] == {f"p{i}": 59 for i in range(8)}


_INTERRUPTED_WAITER = r"""
import sys
from trainstatus import StatusStore; from trainstatus._lock import fair as _fair
_fair._DEFER_AT_MOST = 600.0
_fair._STALE_NS = 600 * 10**9
store = StatusStore(sys.argv[1])
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
try:
    store.set("waiters", "w1", 1)
except KeyboardInterrupt:
    print("interrupted", flush=True)
store.set("waiters", "after", 2)  # reads the file first: whatever the holder wrote is seen
print("then", store.get("waiters", "w1"), flush=True)
store.close()
"""


def _interrupted_waiter(path: Path) -> subprocess.Popen[str]:
    return _posted(path, _INTERRUPTED_WAITER)


def test_ctrl_c_before_a_holder_took_the_request_takes_it_back(tmp_path: Path) -> None:
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _interrupted_waiter(path)
        slot = next(s for s, (pid, state) in _slots(lock_file).items() if pid == waiter.pid)
        waiter.send_signal(signal.SIGINT)
        _until(lambda: _slots(lock_file)[slot][1] == _mailbox.EMPTY, "the request was not taken back")
        file_lock.contended = True
        store.set("holder", "k", 1)  # may carry the waiter's next set, never the one taken back
        assert "w1" not in _on_disk(path).get("waiters", {})
    out, _ = waiter.communicate(timeout=60)
    assert out.split("\n")[:2] == ["interrupted", "then None"]
    store.close()


def test_ctrl_c_after_a_holder_took_the_request_leaves_memory_to_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted while the holder writes its change: the set raises, the change lands, and the
    waiter's store reads the file at its next write rather than trust memory."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _interrupted_waiter(path)
        file_lock.contended = True
        real = _atomic.write_atomic

        def interrupting(*args: Any, **kwargs: Any) -> Any:
            assert _boxes(lock_file)[waiter.pid] == _mailbox.CLAIMED
            waiter.send_signal(signal.SIGINT)
            time.sleep(0.5)  # the waiter raises while this write carries its change
            return real(*args, **kwargs)

        monkeypatch.setattr(_atomic, "write_atomic", interrupting)
        store.set("holder", "k", 1)
        monkeypatch.undo()
        assert "\"w1\": 1" in path.read_text()
    out, _ = waiter.communicate(timeout=60)
    assert out.split("\n")[:2] == ["interrupted", "then 1"]
    store.close()


_ONE_SET = r"""
import os, sys
from trainstatus import StatusStore; from trainstatus._lock import fair as _fair
_fair._DEFER_AT_MOST = 600.0
_fair._STALE_NS = 600 * 10**9
if len(sys.argv) > 3:  # start looking for a free slot at this one
    _fair._sign_ins = (int(sys.argv[3]) - hash(os.getpid()) - 1) % _fair._SLOTS
store = StatusStore(sys.argv[1])
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
try:
    store.set("waiters", sys.argv[2], 1)
except KeyboardInterrupt:
    print("interrupted", flush=True)
else:
    print("set", flush=True)
store.close()
"""


def test_the_holder_acknowledges_only_the_request_it_carried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The waiter whose request the holder took is interrupted and leaves; another posts its own
    request in the same slot while the holder writes. That request was not carried: it must not be
    marked written (its set returned with its change in no file)."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        first = _posted(path, _ONE_SET, "w1")
        slot = next(s for s, (pid, _) in _slots(lock_file).items() if pid == first.pid)
        file_lock.contended = True
        real = _mailbox.acknowledge
        later: list[subprocess.Popen[str]] = []

        def after_an_interrupt(fd: int, requests: list[_mailbox.Request]) -> None:
            first.send_signal(signal.SIGINT)
            assert first.communicate(timeout=60)[0].strip() == "interrupted"
            later.append(_posted(path, _ONE_SET, "w2", str(slot)))
            assert _slots(lock_file)[slot] == (later[0].pid, _mailbox.PENDING)
            real(fd, requests)

        monkeypatch.setattr(_mailbox, "acknowledge", after_an_interrupt)
        store.set("holder", "k", 1)
        monkeypatch.undo()
        assert _slots(lock_file)[slot] == (later[0].pid, _mailbox.PENDING)
    assert later[0].communicate(timeout=60)[0].strip() == "set"
    assert _on_disk(path)["waiters"] == {"w1": 1, "w2": 1}  # w1 carried, w2 written by itself
    store.close()


def test_a_waiter_whose_request_was_taken_by_a_stuck_holder_gives_up_saying_it_may_be_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder took the request, then hung in its write (a stopped process, a hung disk). The
    waiter waits past its lock_timeout for the outcome, but not forever: then it raises, saying
    the change may or may not be written (not a timeout: a timeout writes nothing)."""
    import select

    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1", lock_timeout=0.3, grace=0.5)
        file_lock.contended = True
        real = _atomic.write_atomic
        said: list[str] = []

        def hung(*args: Any, **kwargs: Any) -> Any:
            assert waiter.stdout is not None
            ready, _, _ = select.select([waiter.stdout], [], [], 30)
            said.append(waiter.stdout.readline().strip() if ready else "still waiting after 30 s")
            return real(*args, **kwargs)

        monkeypatch.setattr(_atomic, "write_atomic", hung)
        store.set("holder", "k", 1)
        monkeypatch.undo()
    waiter.communicate(timeout=60)
    assert said[0].startswith(f"unfinished: Could not finish this write of {path}: its change was handed to process {os.getpid()}")
    assert "may or may not be in the file" in said[0]
    assert "\"w1\"" in path.read_text()  # it was: the holder went on
    store.close()


def test_a_box_truncated_away_after_the_holder_took_it_is_not_taken_for_withdrawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that truncates the lock file (older filelock.FileLock did) wipes the box a holder
    already took. The waiter, out of time, cannot tell whether its change is being written: it must
    not raise a timeout (which promises nothing was written), but wait for the lock and write it."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1", lock_timeout=0.3)
        file_lock.contended = True
        real = _atomic.write_atomic

        def truncating(*args: Any, **kwargs: Any) -> Any:
            os.truncate(lock_file, 0)
            time.sleep(1.0)  # past the waiter's lock_timeout
            return real(*args, **kwargs)

        monkeypatch.setattr(_atomic, "write_atomic", truncating)
        store.set("holder", "k", 1)
        monkeypatch.undo()
    out, _ = waiter.communicate(timeout=60)
    assert out.strip() == "set [1.5, nan] 1"
    assert "\"w1\"" in path.read_text()
    store.close()
