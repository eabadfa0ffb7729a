"""Group commit across processes (``_lock.mailbox``): a waiting process hands its set to the holder.

Real processes on a real lock file. The holder here is this test's own store, holding its lock
while the waiter, another process, signs in and posts; its next ``set`` carries the waiter's
change. Each test says which promise it checks: a handed-over change is acknowledged only once
it is in the file, a holder that fails or dies leaves the waiter to write its own change, a waiter
that gives up takes back a change no holder took and waits for one that a holder took.
"""

from __future__ import annotations

import contextlib
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
from _helpers import claim_byte_free, end_processes, skip_unless_local_locks
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trainstatus import StatusStore, TrainingStatusValueError, TrainingStatusWriteError
from trainstatus._codec.names import check_name
from trainstatus._codec.values import Entry
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
if len(sys.argv) > 7 and sys.argv[7] == "withdraw-when-told":
    # Out of time, it takes its request back only when the test says so (a line on stdin): the
    # test decides whether a holder took it first, not the machine's load.
    from trainstatus._lock import mailbox as _mailbox
    _real_withdraw, _told = _mailbox.Box.withdraw, []
    def _withdraw_when_told(box):
        if _told:
            return _real_withdraw(box)
        _told.append(1)
        print("out of time", flush=True)
        assert sys.stdin.readline() == "withdraw\n"
        try:
            state = _real_withdraw(box)
        except OSError as exc:
            print("withdraw failed", exc.errno, flush=True)
            raise
        print("withdrew", state, flush=True)
        return state
    _mailbox.Box.withdraw = _withdraw_when_told
import warnings; from trainstatus import TrainingStatusVersionWarning
warnings.simplefilter("ignore", TrainingStatusVersionWarning)  # a file of another run=: told at open
store = StatusStore(sys.argv[1], durable=sys.argv[4] == "durable", lock_timeout=float(sys.argv[2]),
                    metadata={"run": sys.argv[5]} if sys.argv[5] else None)
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
from trainstatus import TrainingStatusUnfinishedWrite  # a kind of timeout: caught before the others
try:
    store.set("waiters", sys.argv[3], [1.5, float("nan")])
except TrainingStatusUnfinishedWrite as exc:
    print("unfinished:", exc, flush=True)
except TrainingStatusLockTimeout:
    print("timeout", flush=True)
except TrainingStatusError as exc:
    print("error:", exc, flush=True)
else:
    print("set", store.get("waiters", sys.argv[3]), store.get("holder", "k"), flush=True)
store.close()
"""


_spawned: list[subprocess.Popen[str]] = []  # every process the helpers below start, as they start it


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    """Whatever a test asserts, every process the helpers started ends with it: a stopped one too
    (SIGCONT, then SIGKILL), one waiting on its stdin, one waiting for the lock."""
    yield
    try:
        end_processes(_spawned)
    finally:
        _spawned.clear()


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
            metadata: str = "", grace: float = 10.0, withdraw_when_told: bool = False) -> subprocess.Popen[str]:
    """A waiter process let go once its request is posted (the caller holds the lock). With
    ``withdraw_when_told``, once out of time it says "out of time" and waits for ``_tell_withdraw``
    before it takes its request back, then says "withdrew <state>" (or "withdraw failed <errno>")."""
    return _posted(path, _WAITER, str(lock_timeout), key, "durable" if durable else "fast", metadata, str(grace),
                   "withdraw-when-told" if withdraw_when_told else "")


def _tell_withdraw(waiter: subprocess.Popen[str]) -> None:
    assert waiter.stdin is not None
    waiter.stdin.write("withdraw\n")
    waiter.stdin.flush()


def _said(waiter: subprocess.Popen[str], start: str, seconds: float = 60.0) -> str:
    """The first line ``waiter`` prints from now that begins with ``start`` (AssertionError after
    ``seconds``, or if it exits first)."""
    import select

    assert waiter.stdout is not None
    deadline = time.monotonic() + seconds
    while True:
        ready, _, _ = select.select([waiter.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"process {waiter.pid} did not say {start!r} within {seconds} s"
        line = waiter.stdout.readline()
        assert line, f"process {waiter.pid} exited without saying {start!r}"
        if line.startswith(start):
            return line.rstrip("\n")


def _posted(path: Path, script: str, *args: str) -> subprocess.Popen[str]:
    """``script`` run on ``path``, let go once it prints "ready", returned once it posted a request."""
    waiter = subprocess.Popen([sys.executable, "-c", script, str(path), *args],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _spawned.append(waiter)  # before anything is asserted
    assert waiter.stdout is not None and waiter.stdin is not None
    assert waiter.stdout.readline() == "ready\n"
    waiter.stdin.write("go\n")
    waiter.stdin.flush()
    lock_file = Path(str(path) + ".lock")
    _until(lambda: _posted_and_let_go(lock_file, waiter.pid) or waiter.poll() is not None or _stopped(waiter.pid),
           "the waiter never posted its request")
    return waiter


def _posted_and_let_go(lock_file: Path, pid: int) -> bool:
    """Whether ``pid``'s box is PENDING and its claim byte free. The waiter lets go of the byte just
    after it wrote the box, and a holder passes by a box whose byte is held (``_lock.mailbox``):
    a holder that wrote in between would not carry it (a waiter slowed down there, on a loaded
    machine, made the tests that count on it being carried wait for nothing). ``_posted`` also
    returns once the waiter is stopped: one a test stops holding the byte never lets go."""
    slot = next((s for s, (p, state) in _slots(lock_file).items() if p == pid and state == _mailbox.PENDING), None)
    return slot is not None and claim_byte_free(lock_file, slot)


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
        waiter = _waiter(path, "w1", lock_timeout=0.3, grace=60, withdraw_when_told=True)
        file_lock.contended = True
        real = _atomic.write_atomic

        def slow(*args: Any, **kwargs: Any) -> Any:
            # The request taken: the waiter's time runs out, and it finds it taken, before this write.
            _said(waiter, "out of time")
            _tell_withdraw(waiter)
            assert _said(waiter, "withdr") == f"withdrew {_mailbox.CLAIMED}"
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
    ({"metadata": {"run": "mine"}}, {"metadata": "other"}),  # the same field, another value: compared by value
    ({"history": 0}, {}),  # a write that keeps no earlier version: not for a store that keeps them
    ({"allow_downgrade": True}, {}),  # a write that may rewrite a newer format: not for one that refuses
], ids=["durable", "metadata", "metadata-value", "history", "downgrade"])
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
import warnings; from trainstatus import TrainingStatusWarning
try:
    with warnings.catch_warnings(record=True) as caught:  # what Python 3.10, without notes, says
        store.set("waiters", "w1", 1)
except KeyboardInterrupt as exc:
    print("interrupted", *getattr(exc, "__notes__", ()),  # what the traceback would add
          *(f"(warned) {w.message}" for w in caught if issubclass(w.category, TrainingStatusWarning)), flush=True)
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
    """Interrupted while the holder writes its change: the set raises, saying that the change may
    land all the same, the change lands, and the waiter's store reads the file at its next write
    rather than trust memory."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _interrupted_waiter(path)
        file_lock.contended = True
        real = _atomic.write_atomic
        said: list[str] = []

        def interrupting(*args: Any, **kwargs: Any) -> Any:
            assert _boxes(lock_file)[waiter.pid] == _mailbox.CLAIMED
            waiter.send_signal(signal.SIGINT)
            said.append(_said(waiter, "interrupted"))  # raised while this write carries its change
            return real(*args, **kwargs)

        monkeypatch.setattr(_atomic, "write_atomic", interrupting)
        store.set("holder", "k", 1)
        monkeypatch.undo()
        assert "\"w1\": 1" in path.read_text()
    out, _ = waiter.communicate(timeout=60)
    note = (f"trainstatus: this call was interrupted while it waited for the lock of {path}, after process "
            f"{os.getpid()}, which holds the lock, had taken its change into its own write: the change may still "
            "land in the file. The store's reload() shows whether it did, once that write is done (its next write "
            "reads the file first, too).")
    # Python 3.11+ adds it to the KeyboardInterrupt as a note; 3.10, without notes, warns it instead.
    assert said == [f"interrupted {note}" if sys.version_info >= (3, 11) else f"interrupted (warned) {note}"]
    assert out.split("\n")[:1] == ["then 1"]
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
    the change may or may not be written (not a timeout: a timeout writes nothing).

    Handshakes only: the waiter's time runs out whenever it does, but it takes its request back
    only once told, and this holder tells it once it took the request (a 0.3 s lock_timeout that
    ran out before a loaded machine's holder took it used to fail this test with "timeout")."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1", lock_timeout=0.3, grace=0.5, withdraw_when_told=True)
        file_lock.contended = True
        real = _atomic.write_atomic
        said: list[str] = []

        def hung(*args: Any, **kwargs: Any) -> Any:
            _said(waiter, "out of time")
            _tell_withdraw(waiter)
            said.append(_said(waiter, "withdr"))
            said.append(_said(waiter, "unfinished: "))  # while this holder still hangs
            return real(*args, **kwargs)

        monkeypatch.setattr(_atomic, "write_atomic", hung)
        store.set("holder", "k", 1)
        monkeypatch.undo()
    waiter.communicate(timeout=60)
    assert said[0] == f"withdrew {_mailbox.CLAIMED}"
    assert said[1].startswith(f"unfinished: Could not finish this write of {path}: its change was handed to process {os.getpid()}")
    assert "may or may not be in the file" in said[1]
    assert "\"w1\"" in path.read_text()  # it was: the holder went on
    store.close()


def test_a_box_truncated_away_after_the_holder_took_it_is_not_taken_for_withdrawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that truncates the lock file (older filelock.FileLock did) wipes the box a holder
    already took. The waiter, out of time, cannot tell whether its change is being written: it must
    not raise a timeout (which promises nothing was written), but wait for the lock and write it."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1", lock_timeout=0.3, grace=60, withdraw_when_told=True)
        file_lock.contended = True
        real = _atomic.write_atomic

        def truncating(*args: Any, **kwargs: Any) -> Any:
            os.truncate(lock_file, 0)
            _said(waiter, "out of time")  # past the waiter's lock_timeout, its box gone
            _tell_withdraw(waiter)
            assert _said(waiter, "withdr") == f"withdrew {_mailbox.GONE}"
            return real(*args, **kwargs)

        monkeypatch.setattr(_atomic, "write_atomic", truncating)
        store.set("holder", "k", 1)
        monkeypatch.undo()
    out, _ = waiter.communicate(timeout=60)
    assert out.strip() == "set [1.5, nan] 1"
    assert "\"w1\"" in path.read_text()
    store.close()


# -- nobody waits for a claim byte: a process stopped holding one (SIGSTOP, a debugger, Ctrl-Z) ----


def _started(script: str, *args: str) -> subprocess.Popen[str]:
    """``script`` run with ``args``, returned once it printed "ready" (its imports done)."""
    process = subprocess.Popen([sys.executable, "-c", script, *args],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _spawned.append(process)  # before anything is asserted
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    return process


def _go(process: subprocess.Popen[str], line: str = "go") -> None:
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): its state in /proc is T."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _end(processes: list[subprocess.Popen[str]]) -> None:
    """End what is still running (a stopped process too: SIGCONT, then SIGKILL) and reap it."""
    end_processes(processes)


_STOPPING_WAITER = r"""
import fcntl, os, signal, sys
from trainstatus import StatusStore; from trainstatus._lock import mailbox as _mailbox
_post = _mailbox.Box.post
def _post_and_stop(fd, slot, arrival, payload, *, durable):
    box = _post(fd, slot, arrival, payload, durable=durable)
    # Its request PENDING, it takes its box's claim byte with the call it takes it with to post
    # or to take the request back, and is stopped holding it (as in those microseconds).
    _mailbox._claim_lock(fd, slot, fcntl.F_WRLCK)
    print("stopping", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    _mailbox._claim_lock(fd, slot, fcntl.F_UNLCK)
    return box
_mailbox.Box.post = staticmethod(_post_and_stop)
store = StatusStore(sys.argv[1], lock_timeout=60, durable=False)  # a change any holder could carry
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
store.set("waiters", "stopped", 1)
print("set", flush=True)
store.close()
"""

_WRITER = r"""
import sys
from trainstatus import StatusStore, TrainingStatusError
store = StatusStore(sys.argv[1], lock_timeout=float(sys.argv[3]))
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
try:
    for i in range(5):
        store.set("writers", sys.argv[2], i)
except TrainingStatusError as exc:
    print("failed:", exc, flush=True)
else:
    print("done", flush=True)
store.close()
"""

_CTRL_C_HOLDER = r"""
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # not the SIG_IGN a background pytest passes on
from trainstatus import StatusStore; from trainstatus._lock import mailbox as _mailbox
_collect = _mailbox.collect
def _collect_when_told(fd, waiters, **options):
    # Its write about to take the waiting processes' requests: the test sends Ctrl-C now, then
    # lets it go on (so the signal is certain to come while this set holds the lock).
    print("collecting", len(waiters), flush=True)
    assert sys.stdin.readline() == "collect\n"
    return _collect(fd, waiters, **options)
_mailbox.collect = _collect_when_told
store = StatusStore(sys.argv[1], lock_timeout=60, durable=False)  # the bound is on Ctrl-C, not the disk
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
try:
    store.set("holder", "k", 1)  # the stopped waiter is signed in: a contended write, which collects
    print("set", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", time.monotonic(), flush=True)
store.close()
"""


def test_a_waiter_stopped_holding_its_claim_byte_holds_no_writer_back(tmp_path: Path) -> None:
    """A waiter stopped while it holds its box's claim byte (issue 32: the holder took that byte
    with a blocking lock, and every writer froze for the whole stop, past lock_timeout and Ctrl-C).
    The holders pass its box by: the other writers finish within their lock_timeout, a Ctrl-C to a
    holder is honoured within a second, and once let go the waiter writes its change itself."""
    path, lock_file, store = _prepared(tmp_path)
    processes: list[subprocess.Popen[str]] = []
    try:
        writers = [_started(_WRITER, str(path), f"p{i}", "10") for i in range(2)]
        holder = _started(_CTRL_C_HOLDER, str(path))
        processes += [*writers, holder]
        with _holding(store):
            stopped = _posted(path, _STOPPING_WAITER)
            processes.append(stopped)
            _said(stopped, "stopping")
            _until(lambda: _stopped(stopped.pid), "the waiter did not stop")
        # Signed in, its slot's byte and its box's claim byte held, its request PENDING: each
        # write below finds it waiting (contended), and takes what the others posted.
        for writer in writers:
            _go(writer)
        assert [w.communicate(timeout=60)[0].strip() for w in writers] == ["done", "done"]
        _go(holder)
        assert _said(holder, "collecting") == "collecting 1"
        holder.send_signal(signal.SIGINT)  # held back: the holder is writing
        sent = time.monotonic()  # the holder in its collect, the Ctrl-C pending: let it go on
        _go(holder, "collect")
        interrupted = float(_said(holder, "interrupted", seconds=30).split()[1])
        print(f"Ctrl-C honoured {interrupted - sent:.3f} s after the holder met the stopped waiter's byte")
        # The issue asks for "within a second"; 3 s here, since this spans two processes' scheduling
        # on a loaded 2-core machine. A holder that waits for the byte waits for the whole stop (the
        # waiter is let go below, after this): with the old blocking wait this never came at all.
        assert interrupted - sent < 3.0
        assert _boxes(lock_file)[stopped.pid] == _mailbox.PENDING  # no holder took it
        os.kill(stopped.pid, signal.SIGCONT)
        assert stopped.communicate(timeout=60)[0].strip() == "set"
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
        _end(processes)
    assert _on_disk(path)["waiters"] == {"stopped": 1}  # written by itself
    assert _on_disk(path)["writers"] == {"p0": 4, "p1": 4}
    assert _on_disk(path)["holder"]["k"] == 1  # the interrupted set wrote, then raised
    store.close()


_CLAIM_BYTE_TAKER = r"""
import fcntl, os, signal, sys
from trainstatus._lock import mailbox as _mailbox
fd = os.open(sys.argv[1], os.O_RDWR)
for slot in map(int, sys.argv[2:]):
    _mailbox._claim_lock(fd, slot, fcntl.F_WRLCK)  # as a holder takes it, to claim or acknowledge
print("holding", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # a holder stopped there
"""


def _claim_bytes_taken(lock_file: Path, slots: list[int]) -> subprocess.Popen[str]:
    """A process holding the claim bytes of ``slots``'s boxes, stopped (SIGKILL ends it)."""
    taker = subprocess.Popen([sys.executable, "-c", _CLAIM_BYTE_TAKER, str(lock_file), *map(str, slots)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _spawned.append(taker)  # before anything is asserted
    assert taker.stdout is not None and taker.stdout.readline() == "holding\n"
    _until(lambda: _stopped(taker.pid), "the claim byte taker did not stop")
    return taker


@pytest.mark.parametrize("when", ["posting", "out of time", "interrupted"])
def test_a_holder_stopped_holding_a_waiter_claim_byte_holds_that_waiter_back_no_longer(tmp_path: Path, when: str) -> None:
    """The other side: a waiter's post and its taking back wait for the claim byte only briefly
    (they used to wait for it without a bound, seeing neither lock_timeout nor Ctrl-C). A waiter
    that cannot post waits without handing its change over; one that cannot tell whether a holder
    took its request treats it as perhaps taken."""
    path, lock_file, store = _prepared(tmp_path)
    processes: list[subprocess.Popen[str]] = []
    try:
        with _holding(store):
            if when == "posting":
                processes.append(_claim_bytes_taken(lock_file, list(range(_fair._SLOTS))))
                waiter = _posted(path, _WAITER, "0.5", "w1", "durable", "", "10")  # returns once it ended
                processes.append(waiter)
                assert waiter.communicate(timeout=60)[0].strip() == "timeout"
                assert waiter.pid not in _boxes(lock_file)  # it never posted
            elif when == "out of time":
                waiter = _waiter(path, "w1", lock_timeout=0.3, grace=0.5, withdraw_when_told=True)
            else:
                waiter = _posted(path, _INTERRUPTED_WAITER)
            if when != "posting":
                processes.append(waiter)
                slot = next(s for s, (pid, _) in _slots(lock_file).items() if pid == waiter.pid)
                processes.append(_claim_bytes_taken(lock_file, [slot]))
            if when == "out of time":
                _said(waiter, "out of time")
                _tell_withdraw(waiter)
                assert _said(waiter, "withdr", seconds=30).startswith("withdraw failed")
                said = _said(waiter, "unfinished: ", seconds=30)  # as if a holder took it: it may be written
                assert "may or may not be in the file" in said
            elif when == "interrupted":
                waiter.send_signal(signal.SIGINT)
                _said(waiter, "interrupted", seconds=30)
        if when == "interrupted":
            assert waiter.communicate(timeout=60)[0].split("\n")[:1] == ["then None"]  # nobody took it
    finally:
        _end(processes)
    store.close()


def test_a_holder_acknowledging_passes_by_a_box_whose_claim_byte_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its write done, the holder marks each box it carried DONE; the claim byte of one is taken
    (its waiter taking the request back, stopped there). The holder leaves that box CLAIMED rather
    than wait for the byte holding the lock (it used to), and the waiter writes its change itself."""
    import threading

    path, lock_file, store = _prepared(tmp_path)
    taker: list[subprocess.Popen[str]] = []
    # Should the holder wait for the byte after all, the test fails in a minute rather than hang.
    rescue = threading.Timer(60, lambda: [t.kill() for t in taker])
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1")
        slot = next(s for s, (pid, _) in _slots(lock_file).items() if pid == waiter.pid)
        file_lock.contended = True
        real = _atomic.write_atomic

        def then_taken(*args: Any, **kwargs: Any) -> Any:
            written = real(*args, **kwargs)
            taker.append(_claim_bytes_taken(lock_file, [slot]))
            rescue.start()
            return written

        monkeypatch.setattr(_atomic, "write_atomic", then_taken)
        try:
            store.set("holder", "k", 1)
        finally:
            rescue.cancel()
            monkeypatch.undo()
        assert taker[0].poll() is None  # still holding the byte: the holder did not wait for it
        assert _boxes(lock_file)[waiter.pid] == _mailbox.CLAIMED  # so not told
        assert "\"w1\"" in path.read_text()  # though carried
    _end(taker)
    out, _ = waiter.communicate(timeout=60)
    assert out.strip() == "set [1.5, nan] 1"
    store.close()


_ACKNOWLEDGED = r"""
import os, struct, sys
from trainstatus import StatusStore; from trainstatus._lock import fair as _fair, mailbox as _mailbox
from trainstatus._storage import atomic as _atomic
_fair._DEFER_AT_MOST = 600.0
_fair._STALE_NS = 600 * 10**9
_state, _seen = _mailbox.Box.state, []
def _state_told(box):
    # The first time its box's state byte reads DONE, it says what it takes the box for.
    raw = struct.unpack("<I", os.pread(box.fd, 4, _mailbox.box_of(box.slot) + _mailbox._STATE_AT))[0]
    state = _state(box)
    if raw == _mailbox.DONE and not _seen:
        _seen.append(state)
        print("DONE taken for", state, flush=True)
    return state
_mailbox.Box.state = _state_told
store = StatusStore(sys.argv[1], lock_timeout=60)
reads, writes = [], []
_read, _write = store._storage.read, _atomic.write_atomic
store._storage.read = lambda: reads.append(1) or _read()
_atomic.write_atomic = lambda *args, **kwargs: writes.append(1) or _write(*args, **kwargs)
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
store.set("waiters", "w1", [1.5, float("nan")])
print("set", "reads", len(reads), "writes", len(writes), flush=True)
store.close()
"""


def _rest(process: subprocess.Popen[str]) -> str:
    """What ``process`` prints from now until it ends (``_said`` may have read part of it into the
    pipe's buffer already, which ``communicate`` would not see)."""
    process.wait(timeout=60)
    assert process.stdout is not None
    return process.stdout.read().strip()


def _write_into_box(lock_file: Path, slot: int, at: int, value: int) -> None:
    """Write the 32-bit ``value`` at offset ``at`` of box ``slot``'s head, as a tool (or a stray
    write) that writes into the lock file would."""
    fd = os.open(lock_file, os.O_RDWR)
    try:
        os.pwrite(fd, struct.pack("<I", value), _mailbox.box_of(slot) + at)
    finally:
        os.close(fd)


@pytest.mark.parametrize("told_by", ["the holder", "a byte written into the lock file"])
def test_a_waiter_told_done_returns_only_when_the_holder_acknowledged_it(tmp_path: Path, told_by: str) -> None:
    """DONE alone said a change was written: one byte written into the lock file made a set return
    with nothing written (issue 32). A holder writes an acknowledgement of the request with DONE;
    a waiter that finds DONE without it waits on, and writes its change itself once it has the
    lock. Acknowledged, it reads the file once, as after a write of its own, and writes nothing."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _posted(path, _ACKNOWLEDGED)
        if told_by == "the holder":
            file_lock.contended = True
            store.set("holder", "k", 1)
        else:
            slot = next(s for s, (pid, _) in _slots(lock_file).items() if pid == waiter.pid)
            _write_into_box(lock_file, slot, _mailbox._STATE_AT, _mailbox.DONE)  # PENDING -> DONE
        # Seen while this process holds the lock: only a DONE taken for written ends the wait.
        taken_for = _mailbox.DONE if told_by == "the holder" else _mailbox.CLAIMED
        assert _said(waiter, "DONE taken for") == f"DONE taken for {taken_for}"
    # The file another process (this one) reads holds the change, whoever wrote it.
    assert _rest(waiter) == ("set reads 1 writes 0" if told_by == "the holder" else "set reads 0 writes 1")
    assert json.dumps(_on_disk(path)["waiters"]["w1"]) == "[1.5, NaN]"
    store.close()


@pytest.mark.parametrize("ack", ["none", "another request's"])
def test_a_done_without_its_acknowledgement_leaves_the_waiter_to_write_its_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ack: str) -> None:
    """A holder took the request and its write failed: the box stays CLAIMED, unacknowledged, and
    the change is in no file. DONE written over that state (its byte alone), or with the
    acknowledgement of another request of the same waiter (another arrival), is not taken for
    written: the waiter writes its change itself."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _posted(path, _ACKNOWLEDGED)
        file_lock.contended = True

        def full(*args: Any, **kwargs: Any) -> Any:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(_atomic, "write_atomic", full)
        with pytest.raises(TrainingStatusWriteError):
            store.set("holder", "k", 1)
        monkeypatch.undo()
        slot = next(s for s, (pid, _) in _slots(lock_file).items() if pid == waiter.pid)
        at = _mailbox.box_of(slot)
        _, state, pid, claimer, arrival, _, _, crc, acknowledged = _mailbox._HEAD.unpack(
            lock_file.read_bytes()[at:at + _mailbox._HEAD.size])
        assert (state, claimer, acknowledged) == (_mailbox.CLAIMED, os.getpid(), 0)
        if ack == "another request's":
            _write_into_box(lock_file, slot, _mailbox._ACK_AT, _mailbox._ack(claimer, pid, arrival + 1, crc))
        _write_into_box(lock_file, slot, _mailbox._STATE_AT, _mailbox.DONE)
        assert _said(waiter, "DONE taken for") == f"DONE taken for {_mailbox.CLAIMED}"
        assert "waiters" not in _on_disk(path)
    assert _rest(waiter) == "set reads 0 writes 1"
    assert json.dumps(_on_disk(path)["waiters"]["w1"]) == "[1.5, NaN]"
    store.close()


def test_a_killed_waiter_request_is_never_carried_over_newer_values(tmp_path: Path) -> None:
    """A waiter SIGKILLed with its request posted leaves its box PENDING and its slot signed in
    (nobody signs it out); only its slot's byte, let go by the kernel, says it died. Its set never
    returned: a later contended write must not carry it over what was set since."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store):
        waiter = _waiter(path, "w1")
        waiter.kill()
        waiter.communicate(timeout=60)
    assert _boxes(lock_file)[waiter.pid] == _mailbox.PENDING
    store.set("waiters", "w1", "newer")  # the dead waiter's record makes this write contended
    with _holding(store) as file_lock:
        file_lock.contended = True
        store.set("holder", "k", 1)
    assert _on_disk(path)["waiters"] == {"w1": "newer"}
    assert _boxes(lock_file)[waiter.pid] == _mailbox.PENDING
    store.close()


def _in_flock(lock_file: Path, pid: int) -> bool:
    """Whether process ``pid`` is blocked in ``flock`` on ``lock_file`` (/proc/locks)."""
    st = os.stat(lock_file)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(fields[1:3] == ["->", "FLOCK"] and fields[5] == str(pid) and fields[6] == inode
               for fields in map(str.split, Path("/proc/locks").read_text().splitlines()) if len(fields) >= 7)


_WAITER_STAYING = r"""
import sys
from trainstatus import StatusStore; from trainstatus._lock import descriptor as _descriptor
_descriptor._IN_KERNEL_FOR = 600.0  # woken only by taking the flock: it finds its box DONE holding it
store = StatusStore(sys.argv[1], lock_timeout=60)
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
store.set("waiters", "w1", 1)
print("set", flush=True)
assert sys.stdin.readline() == "exit\n"  # alive, its store open, while another process writes
store.close()
"""


def test_a_waiter_whose_change_a_holder_wrote_lets_go_of_the_lock(tmp_path: Path) -> None:
    """The waiter takes the flock as the holder lets go, and finds its change written: its set
    returns, and the lock must be free for the others (it used to stay held until that process
    wrote again or exited: every other writer timed out meanwhile)."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _posted(path, _WAITER_STAYING)
        _until(lambda: _in_flock(lock_file, waiter.pid), "the waiter is not blocked in flock")
        file_lock.contended = True
        store.set("holder", "k", 1)
        assert _boxes(lock_file)[waiter.pid] == _mailbox.DONE
    assert waiter.stdout is not None and waiter.stdin is not None
    try:
        assert waiter.stdout.readline() == "set\n"
        other = StatusStore(path, lock_timeout=10)  # the lock is free at once; 10 s only under load
        other.set("holder", "after", 2)
        other.close()
    finally:
        waiter.stdin.write("exit\n")
        waiter.stdin.flush()
        waiter.communicate(timeout=60)
    assert waiter.returncode == 0
    assert _on_disk(path)["holder"] == {"start": 0, "k": 1, "after": 2}
    store.close()


def test_a_change_is_not_acknowledged_when_the_holder_directory_sync_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder's rename landed but its directory sync failed: the file holds the change, yet it
    may not survive a power loss. Its waiter must not be told DONE: it writes its change itself."""
    path, lock_file, store = _prepared(tmp_path)
    with _holding(store) as file_lock:
        waiter = _waiter(path, "w1")
        file_lock.contended = True

        def failing(directory: str) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(_atomic, "sync_directory", failing)
        with pytest.raises(TrainingStatusWriteError, match="may not survive a power loss"):
            store.set("holder", "k", 1)
        monkeypatch.undo()
        assert "\"w1\"" in path.read_text()  # in the file, not durable
        assert _boxes(lock_file)[waiter.pid] == _mailbox.CLAIMED
        replaced = os.stat(path).st_ino
    out, _ = waiter.communicate(timeout=60)
    assert out.strip() == "set [1.5, nan] 1"
    assert os.stat(path).st_ino != replaced  # written again, by the waiter, durably
    store.close()


# -- a box's payload: what a holder decodes is what its waiter encoded -----------------------------


def _name_the_codec_takes(name: str) -> bool:
    try:
        check_name(name, "key", "status.json")
    except TrainingStatusValueError:  # a high surrogate followed by a low one
        return False
    return True


# Any code point, lone surrogates included (the codec writes them as escapes).
_box_names = st.text(st.characters(exclude_categories=()), max_size=10).filter(_name_the_codec_takes)
_box_changes = st.lists(st.tuples(st.tuples(_box_names, _box_names), st.builds(Entry, st.binary(max_size=40), st.booleans())),
                        max_size=6)


def _payload_size(meta: bytes, changes: list[tuple[tuple[str, str], Entry]]) -> int:
    """The box's layout: the metadata's length and the count, the metadata, then for each change
    its three lengths and exotic flag, its names in UTF-8 (surrogates passed) and its bytes."""
    return 8 + len(meta) + sum(
        _mailbox._ITEM.size + len(category.encode("utf-8", "surrogatepass")) + len(key.encode("utf-8", "surrogatepass"))
        + len(entry.raw) for (category, key), entry in changes)


@st.composite
def _box_contents(draw: Any) -> tuple[list[tuple[tuple[str, str], Entry]], bytes]:
    """Changes and metadata; half the time the metadata or one value grown to within 3 bytes
    either side of a full box, where refusing starts."""
    changes = draw(_box_changes)
    meta = draw(st.binary(max_size=40))
    slack = draw(st.none() | st.integers(-3, 3))
    if slack is not None:
        short = _mailbox.BOX - _mailbox._HEAD.size + slack - _payload_size(meta, changes)
        grown = draw(st.integers(0, len(changes)))
        if grown == len(changes):
            meta += b"m" * short
        else:
            name, entry = changes[grown]
            changes[grown] = (name, Entry(entry.raw + b"v" * short, entry.exotic))
    return changes, meta


_ROOM = _mailbox.BOX - _mailbox._HEAD.size  # what a box holds past its head


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(_box_contents())
@example(([(("Walker", "steps"), Entry(b"1200")), (("Walker", "\udcff"), Entry(b"NaN", True)),
           (("wall_height", "lesson_num"), Entry(b"[\n  4\n]"))], b"meta"))  # several changes, one exotic
@example(([], b"m" * (_ROOM - 8 + 1)))  # metadata alone one byte too many
@example(([(("c", "k"), Entry(b"v" * (_ROOM - 8 - 13 - 2)))], b""))  # exactly full
def test_property_a_box_decodes_to_what_was_posted_or_is_refused_when_it_does_not_fit(
        contents: tuple[list[tuple[tuple[str, str], Entry]], bytes]) -> None:
    changes, meta = contents
    payload = _mailbox.encode(changes, meta)
    if _payload_size(meta, changes) > _ROOM:
        assert payload is None  # its process writes it itself
        return
    assert payload is not None and len(payload) == _payload_size(meta, changes)
    decoded_meta, decoded = _mailbox.decode(payload)
    assert decoded_meta == meta
    assert decoded == changes
    assert [type(entry.exotic) for _, entry in decoded] == [bool] * len(changes)
