"""Ctrl-C at any point of a store's call leaves nothing held, and memory agreeing with the file.

The deterministic tests run one operation once per *injection point*: the n-th event of the main
thread while the operation runs, counting every function entry and line (``sys.settrace``) and
every return from a C function (``sys.setprofile``). Those are the points where CPython runs a
signal handler (function entry, loops, after a call into C); lines are a superset. At point n the
SIGINT handler installed at that moment is run with the frame executing there, exactly as CPython
runs it when a signal arrives: the default handler raises ``KeyboardInterrupt``, the store's own
holds it back for later. Every point is enumerated, not sampled, until the operation runs through
without reaching the next one. The lines of this file's own operations are not points (their
calls are): the line event of a with statement's end comes before the call of ``__exit__``, where
CPython has no check point, and an exception raised there would skip ``__exit__`` in any with
statement at all.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from _helpers import hold_lock_in_subprocess

from trainstatus import StatusStore, TrainingStatusCorruptWarning
from trainstatus import _interrupts
from trainstatus._lock import path_lock as _locking
from trainstatus._storage.closer import _closer



def _run_interrupted_at(point: int, operation: Callable[[], Any]) -> tuple[bool, int]:
    """Run ``operation``, handling a SIGINT at its ``point``-th event: (interrupted?, events seen)."""
    seen = 0
    fired = False

    def inject(frame: Any) -> None:
        nonlocal fired
        fired = True
        handler = signal.getsignal(signal.SIGINT)
        assert callable(handler)
        handler(signal.SIGINT, frame)

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal seen
        if event == "call" or (event == "line" and frame.f_code.co_filename != __file__):
            if fired or frame.f_code is _HARNESS:
                return tracer
            seen += 1
            if seen == point:
                inject(frame)
        return tracer

    def profiler(frame: Any, event: str, arg: Any) -> None:
        nonlocal seen
        if event == "c_return" and not fired and frame.f_code is not _HARNESS:
            seen += 1
            if seen == point:
                inject(frame)

    sys.setprofile(profiler)
    sys.settrace(tracer)
    try:
        operation()
    except KeyboardInterrupt:
        return True, seen
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return False, seen


_HARNESS = _run_interrupted_at.__code__  # its own lines and calls (settrace) are not points


_checks: queue.Queue[dict[str, Any]] = queue.Queue()
_checked: queue.Queue[list[str]] = queue.Queue()


def _checker() -> None:
    while True:
        locks = _checks.get()
        held = []
        for name, lock in locks.items():
            if lock.acquire(timeout=2):
                lock.release()
            else:
                held.append(name)
        _checked.put(held)


_checker_thread: threading.Thread | None = None


def _free_in_another_thread(**locks: Any) -> list[str]:
    """The names of ``locks`` another thread cannot take at once (one long-lived thread: a new
    thread per point would cost more than the point)."""
    global _checker_thread
    if _checker_thread is None:
        _checker_thread = threading.Thread(target=_checker, name="lock-checker", daemon=True)
        _checker_thread.start()
    _checks.put(locks)
    return _checked.get(timeout=30)


def _on_disk(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        document = json.loads(f.read())
    document.pop("metadata", None)
    return dict(document)


def _in_memory(store: StatusStore) -> dict[str, Any]:
    document = store.to_dict()
    document.pop("metadata")
    return document


def _assert_nothing_held(store: StatusStore, path: Path) -> None:
    # An interrupted wait may leave its flock blocked on a thread of its own (kernel_wait._KernelWait):
    # once the lock is free it takes it, sees it was given up and lets go. Wait for that first.
    for thread in threading.enumerate():
        if thread.name == "trainstatus-lock-wait":
            thread.join(10)
            assert not thread.is_alive(), "a given-up flock wait never returned"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    state = _interrupts.state
    assert (state.depth, state.users, state.pending, state.waiting) == (0, 0, [], False)
    assert store._writing is False and store._open_batch is None and store._waiters == []
    assert store._pending == {} and store._tx_depth == 0 and store._tx_owner is None
    path_lock = _locking.lock_for(str(path) + ".lock")
    assert path_lock._depth == 0 and path_lock._owner is None
    held = _free_in_another_thread(
        store_mutex=store._mutex, closer=_closer._cond, path_lock=path_lock._mutex)
    assert held == [], f"still held: {held}"
    if os.path.exists(str(path) + ".lock"):
        fd = os.open(str(path) + ".lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if a hold leaked
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _open_fds(baseline: int | None) -> int:
    """Descriptors open now; a count over ``baseline`` is taken again after a collection."""
    count = len(os.listdir("/proc/self/fd"))
    if baseline is not None and count <= baseline:
        return count
    # Descriptors of dropped objects close when those are collected (an interrupted call leaves
    # cycles through its traceback), retired ones on the closer thread. A full collection walks
    # the whole suite's heap, so the young generations go first: they hold this point's objects.
    for generation in (0, 1, 2):
        gc.collect(generation)
        _closer.wait()
        count = len(os.listdir("/proc/self/fd"))
        if baseline is not None and count <= baseline:
            break
    return count


def _enumerate(tmp_path: Path, operation: Callable[[StatusStore], Any], *, prepare: Callable[[StatusStore], Any] | None = None,
               limit: int = 20_000) -> tuple[int, int]:
    """Interrupt ``operation`` at every point; check the invariants after each. (points, interrupted)."""
    interrupted = 0
    other = StatusStore(tmp_path / "other" / "status.json", durable=False, lock_timeout=2)
    other.set("o", "n", 0)
    baseline: int | None = None
    point = 0
    while point < limit:
        point += 1
        path = tmp_path / f"run{point % 2}" / "status.json"
        store = StatusStore(path, durable=False, lock_timeout=2)
        store.clear()
        store.set("b", "n", 1)
        store.set("b", "keep", [1, 2, 3])
        if prepare is not None:
            prepare(store)
        before, disk_before = _in_memory(store), _on_disk(path)
        was_interrupted, seen = _run_interrupted_at(point, lambda: operation(store))
        interrupted += was_interrupted
        try:
            _assert_nothing_held(store, path)
        except AssertionError as exc:
            raise AssertionError(f"after an interrupt at point {point} (of {seen}): {exc}") from exc
        after, disk_after = _in_memory(store), _on_disk(path)
        # Either none of the change (memory and file as they were) or all of it, in both.
        expected = _expected(operation, tmp_path, before, prepare)
        untouched = (after, disk_after) == (before, disk_before)
        assert untouched or after == disk_after == expected, (
            f"after an interrupt at point {point}: memory {after}, file {disk_after}, expected {expected}")
        if not was_interrupted:
            assert after == disk_after == expected
        if operation is _close:
            if store._closed:  # then the next calls go to a store opened again
                store = StatusStore(path, durable=False, lock_timeout=2)
            else:
                assert was_interrupted
        # The next calls work, on this store and on another.
        store.set("b", "next", point)
        other.set("o", "n", point)
        assert _on_disk(path)["b"]["next"] == point
        store.close()
        store = None  # type: ignore[assignment]
        descriptors = _open_fds(baseline)
        if baseline is None or descriptors < baseline:
            baseline = descriptors
        assert descriptors == baseline, f"a descriptor leaked after an interrupt at point {point}"
        if seen < point:  # ran through without reaching this point: every point was tried
            assert not was_interrupted
            return point - 1, interrupted
    raise AssertionError(f"more than {limit} points")


_expected_cache: dict[Any, dict[str, Any]] = {}


def _expected(operation: Callable[[StatusStore], Any], tmp_path: Path, before: dict[str, Any],
              prepare: Callable[[StatusStore], Any] | None) -> dict[str, Any]:
    """The document after ``operation`` ran uninterrupted from the same starting point."""
    key = operation
    if key not in _expected_cache:
        path = tmp_path / "reference" / "status.json"
        with StatusStore(path, durable=False) as store:
            store.clear()
            store.set("b", "n", 1)
            store.set("b", "keep", [1, 2, 3])
            if prepare is not None:
                prepare(store)
            assert _in_memory(store) == before
            operation(store)
            _expected_cache[key] = _in_memory(store)
    return _expected_cache[key]


def _set(store: StatusStore) -> None:
    store.set("b", "n", 2)


def _increment(store: StatusStore) -> None:
    with store.transaction():
        store.set("b", "n", store.get("b", "n") + 1)
        store.set("c", "new", "yes")


def _run_increment(store: StatusStore) -> None:
    store.run_transaction(lambda s: s.set("b", "n", s.get("b", "n") + 1))


def _delete(store: StatusStore) -> None:
    store.delete("b", "keep")


def _clear(store: StatusStore) -> None:
    store.clear()


def _save(store: StatusStore) -> None:
    store.save()


def _close(store: StatusStore) -> None:
    store.close()


def _another_process_wrote(store: StatusStore) -> None:
    with StatusStore(store.path, durable=False) as writer:
        writer.set("b", "elsewhere", True)


def _set_after_another_wrote(store: StatusStore) -> None:
    store.set("b", "n", 5)


def _reload(store: StatusStore) -> None:
    store.reload()


OPERATIONS = {
    "set": (_set, None),
    "set merging another writer's change": (_set_after_another_wrote, _another_process_wrote),
    "transaction": (_increment, None),
    "run_transaction": (_run_increment, None),
    "delete": (_delete, None),
    "clear": (_clear, None),
    "save": (_save, None),
    "close": (_close, None),
    "reload after another writer's change": (_reload, _another_process_wrote),
}


# ``set`` and ``close`` in the default run; every other operation (3 to 8 s each) in ``-m long``.
@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in ("set", "close") else pytest.mark.long)
                                  for name in OPERATIONS])
def test_an_interrupt_at_any_point_leaves_nothing_held_and_memory_matching_the_file(tmp_path: Path, name: str, reliability: Any) -> None:
    operation, prepare = OPERATIONS[name]
    points, interrupted = _enumerate(tmp_path, operation, prepare=prepare)
    assert points > 100 and interrupted > 0
    if prepare is _another_process_wrote:  # the operation read what the other writer wrote
        assert _expected_cache[operation]["b"]["elsewhere"] is True
    reliability.add("interrupt_points", points, source="test_interrupts.py")


@pytest.mark.long
def test_an_interrupt_while_opening_a_damaged_file_leaves_nothing_held(tmp_path: Path) -> None:
    """Opening keeps a damaged file aside under the lock: interrupted anywhere, the bytes keep a name."""
    path = tmp_path / "status.json"
    damaged = b'{"b": {"n": 1}, "metadata": {"stats_format_version": "0.3.0"'  # cut short
    point = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingStatusCorruptWarning)
        while True:
            point += 1
            path.write_bytes(damaged)
            for leftover in tmp_path.glob("status.json.corrupt-*"):
                leftover.unlink()
            opened: list[StatusStore] = []
            interrupted, seen = _run_interrupted_at(point, lambda: opened.append(StatusStore(path, durable=False)))
            copies = list(tmp_path.glob("status.json.corrupt-*"))
            # The damaged bytes always have a name: the file itself, or the copy kept aside.
            assert (path.exists() and path.read_bytes() == damaged) or [c.read_bytes() for c in copies] == [damaged], point
            store = opened[0] if opened else StatusStore(path, durable=False)
            _assert_nothing_held(store, path)
            store.set("b", "after", point)
            store.close()
            if seen < point:
                break
    assert point > 100


class _sigint_after:  # noqa: N801 - reads as a call
    """SIGINT to this process in ``seconds``; ``since()`` is how long ago it was sent."""

    def __init__(self, seconds: float) -> None:
        self.sent: float | None = None
        self.timer = threading.Timer(seconds, self._send)
        self.timer.start()

    def _send(self) -> None:
        self.sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    def since(self) -> float:
        assert self.sent is not None, "the SIGINT was never sent"
        return time.monotonic() - self.sent


# A wait that Ctrl-C cannot end would still end in KeyboardInterrupt, once lock_timeout (30 s)
# runs out and the held-back signal is delivered: each test bounds the time from the SIGINT.
INTERRUPTED_WITHIN = 5.0


def test_ctrl_c_stops_a_set_waiting_for_another_processs_lock_at_once(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=30)
    store.set("b", "n", 1)
    child = hold_lock_in_subprocess(Path(str(path) + ".lock"), 30)
    try:
        sigint = _sigint_after(0.2)
        with pytest.raises(KeyboardInterrupt):
            store.set("b", "n", 2)
        waited = sigint.since()
    finally:
        child.kill()
        child.communicate()
    assert waited < INTERRUPTED_WITHIN, f"the wait for the lock went on {waited:.1f} s after Ctrl-C"
    _assert_nothing_held(store, path)
    assert store.get("b", "n") == 1 and _on_disk(path)["b"]["n"] == 1
    store.set("b", "n", 3)
    assert _on_disk(path)["b"]["n"] == 3


def test_ctrl_c_stops_a_set_waiting_for_another_threads_transaction(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=30)
    store.set("b", "n", 1)
    opened, finish = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transaction():
            store.set("b", "other", 1)
            opened.set()
            finish.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert opened.wait(5)
    sigint = _sigint_after(0.2)
    with pytest.raises(KeyboardInterrupt):
        store.set("b", "n", 2)
    waited = sigint.since()
    finish.set()
    holder.join()
    assert waited < INTERRUPTED_WITHIN, f"the wait for the transaction went on {waited:.1f} s after Ctrl-C"
    _assert_nothing_held(store, path)
    assert _in_memory(store) == _on_disk(path) == {"b": {"n": 1, "other": 1}}


def _leading_a_held_write(store: StatusStore) -> tuple[threading.Thread, threading.Event]:
    """Another thread leads a group write (``b/leader``) that stays inside ``replace`` until the
    returned event is set."""
    real_replace = store._storage.replace
    in_write, go_on = threading.Event(), threading.Event()

    def held_replace(data: bytes) -> None:
        if threading.current_thread() is not threading.main_thread() and not in_write.is_set():
            in_write.set()
            go_on.wait(30)
        real_replace(data)

    store._storage.replace = held_replace  # type: ignore[method-assign]
    leader = threading.Thread(target=store.set, args=("b", "leader", 1))
    leader.start()
    assert in_write.wait(5)
    return leader, go_on


def test_ctrl_c_of_a_set_queued_behind_another_threads_write_takes_its_change_back(tmp_path: Path) -> None:
    """The main thread waits for a group write another thread leads; the write is held on an event."""
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=30)
    store.set("b", "n", 1)
    leader, go_on = _leading_a_held_write(store)
    sigint = _sigint_after(0.2)
    with pytest.raises(KeyboardInterrupt):
        store.set("b", "n", 2)  # queued behind the leader's write: the wait is interrupted
    waited = sigint.since()
    go_on.set()
    leader.join()
    assert waited < INTERRUPTED_WITHIN, f"the wait for the group write went on {waited:.1f} s after Ctrl-C"
    _assert_nothing_held(store, path)
    assert _in_memory(store) == _on_disk(path) == {"b": {"n": 1, "leader": 1}}
    store.set("b", "n", 3)
    assert _on_disk(path)["b"]["n"] == 3


def test_a_set_whose_lock_timeout_runs_out_while_queued_is_never_written_later(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=0.3)
    store.set("b", "n", 1)
    leader, go_on = _leading_a_held_write(store)
    errors: list[BaseException] = []

    def queued() -> None:
        try:
            store.set("b", "late", 1)  # joins the next batch; its lock_timeout runs out there
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    waiter = threading.Thread(target=queued)
    waiter.start()
    waiter.join(5)
    assert len(errors) == 1 and type(errors[0]).__name__ == "TrainingStatusLockTimeout"
    go_on.set()
    leader.join()
    store.set("b", "after", 1)  # the next write must not carry the withdrawn change
    assert "late" not in _on_disk(path)["b"] and store.get("b", "late") is None


SOAK_CHILD = r"""
import json, os, signal, sys, time
from trainstatus import StatusStore

path, seconds = sys.argv[1], float(sys.argv[2])
armed = False
ignored = 0

def interrupt(signum, frame):
    # Raises as the default handler does, but only inside the loop's try: it disarms itself, so
    # a second SIGINT cannot land in the except clause that checks the store.
    global armed, ignored
    if not armed:
        ignored += 1
        return
    armed = False
    raise KeyboardInterrupt

signal.signal(signal.SIGINT, interrupt)
store = StatusStore(path, durable=False, lock_timeout=5)
interrupts = mismatches = sets = 0
value = 0
end = time.monotonic() + seconds
sys.stdout.write("ready\n"); sys.stdout.flush()
while time.monotonic() < end:
    try:
        armed = True
        value += 1
        if value % 3 == 0:
            with store.transaction():
                store.set("b", "n", store.get("b", "n", 0) + 1)
                store.set("b", "v", value)
        elif value % 7 == 0:
            store.delete("b", "v")
        else:
            store.set("b", "v", value)
        sets += 1
    except KeyboardInterrupt:
        interrupts += 1
        try:
            with open(path, "rb") as f:
                on_disk = json.loads(f.read())
        except FileNotFoundError:  # the first set interrupted before it wrote: memory must be empty too
            on_disk = {}
        on_disk.pop("metadata", None)
        memory = store.to_dict()
        memory.pop("metadata")
        if memory != on_disk:
            mismatches += 1
    armed = False
print(json.dumps({"interrupts": interrupts, "mismatches": mismatches, "sets": sets, "ignored": ignored}))
"""


@pytest.mark.long
def test_soak_sigint_at_random_moments_never_hangs_nor_leaves_memory_and_file_apart(tmp_path: Path, reliability: Any,
                                                                                     seed: int) -> None:
    import random

    rng = random.Random(seed)
    path = tmp_path / "status.json"
    seconds = 6.0
    child = subprocess.Popen([sys.executable, "-c", SOAK_CHILD, str(path), str(seconds)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    sent = 0
    deadline = time.monotonic() + seconds - 0.3
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.0005, 0.004))
        child.send_signal(signal.SIGINT)
        sent += 1
    try:
        out, _ = child.communicate(timeout=60)  # the watchdog: a hang fails here
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("the setting process hung after an interrupt")
    assert child.returncode == 0, out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["mismatches"] == 0
    assert figures["interrupts"] >= 1000, figures
    assert figures["sets"] > 0
    reliability.add("interrupts_caught", figures["interrupts"], source="test_interrupts.py")


def test_a_signal_whose_handler_returns_leaves_the_wait_interruptible(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, lock_timeout=30)
    store.set("b", "n", 1)
    flags: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: flags.append(signum))
    child = hold_lock_in_subprocess(Path(str(path) + ".lock"), 30)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        sigint = _sigint_after(0.5)
        with pytest.raises(KeyboardInterrupt):
            store.set("b", "n", 2)
        waited = sigint.since()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        child.kill()
        child.communicate()
    assert flags == [signal.SIGUSR1] and waited < INTERRUPTED_WITHIN
    _assert_nothing_held(store, path)


def test_a_handler_chaining_to_the_one_it_found_inside_a_transaction_body_still_raises(tmp_path: Path) -> None:
    """A library installing its handler in the body, calling the one it found (the store's)."""
    path = tmp_path / "status.json"
    store = StatusStore(path)
    calls: list[str] = []
    with store.transaction():
        found = signal.getsignal(signal.SIGINT)
        assert callable(found)

        def chained(signum: int, frame: Any) -> None:
            calls.append("chained")
            found(signum, frame)

        signal.signal(signal.SIGINT, chained)
        store.set("b", "n", 1)
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # no recursion: it ends in the default handler
        store.set("b", "n", 2)  # the store installs over the chained handler and puts it back
        assert signal.getsignal(signal.SIGINT) is chained
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert calls == ["chained", "chained"]
    assert _on_disk(path) == {"b": {"n": 2}}


def test_one_transaction_object_cannot_be_entered_twice(tmp_path: Path) -> None:
    from trainstatus import TrainingStatusError

    store = StatusStore(tmp_path / "status.json")
    transaction = store.transaction()
    with transaction:
        with pytest.raises(TrainingStatusError, match="already open"):
            transaction.__enter__()
        store.set("b", "n", 1)
    assert _on_disk(tmp_path / "status.json") == {"b": {"n": 1}}


def test_a_handler_installed_between_two_sets_is_held_back_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_install`` skips its per-signal look when the handlers are the ones it found last time
    (issue 13): a handler set on another signal in between must still be seen and held back."""
    from trainstatus._storage import atomic as _atomic

    store = StatusStore(tmp_path / "status.json")
    store.set("a", "b", 1)
    store.set("a", "b", 2)  # the second call takes the shortcut
    delivered: list[int] = []
    during: list[tuple[bool, int]] = []
    real_sync = _atomic.sync_file

    def sync_and_signal(fd: int) -> None:
        during.append((signal.getsignal(signal.SIGUSR2) is _interrupts._handler, len(delivered)))
        os.kill(os.getpid(), signal.SIGUSR2)
        during.append((True, len(delivered)))
        real_sync(fd)

    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: delivered.append(signum))
    try:
        monkeypatch.setattr(_atomic, "sync_file", sync_and_signal)
        store.set("a", "b", 3)
        assert delivered == [signal.SIGUSR2]  # delivered once the set was done...
        assert during == [(True, 0), (True, 0)]  # ...not inside it, where _handler stood in
        monkeypatch.setattr(_atomic, "sync_file", real_sync)
        store.set("a", "b", 4)
    finally:
        signal.signal(signal.SIGUSR2, previous)
        store.close()
    assert signal.getsignal(signal.SIGUSR2) is previous
    assert json.loads((tmp_path / "status.json").read_bytes())["a"]["b"] == 4


def test_the_suite_started_with_sigint_ignored_still_tests_ctrl_c(tmp_path: Path) -> None:
    # ``nohup pytest &`` from a non-interactive shell starts Python with SIGINT ignored, and every
    # child inherits that: without tests/conftest.py's reset, the Ctrl-C tests would fail (or, worse,
    # test nothing). A Ctrl-C test of this file, run by a pytest that starts that way, passes.
    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-cov", "-q", "-m", "", f"--basetemp={tmp_path / 'pytest'}",
         f"{__file__}::test_ctrl_c_stops_a_set_waiting_for_another_processs_lock_at_once"],
        preexec_fn=ignore_sigint, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout


# Every public name of StatusStore, called as a user would (a method added without an entry here
# fails the check below, so it cannot escape the guard test unseen).
_PUBLIC_CALLS: dict[str, Callable[[StatusStore], Any]] = {
    "get": lambda store: store.get("b", "n"),
    "set": lambda store: store.set("b", "n", 2),
    "delete": lambda store: store.delete("b", "keep"),
    "clear": lambda store: store.clear(),
    "save": lambda store: store.save(),
    "transaction": lambda store: _increment(store),
    "run_transaction": lambda store: _run_increment(store),
    "reload": lambda store: (_another_process_wrote(store), store.reload()),
    "to_dict": lambda store: store.to_dict(),
    "close": lambda store: store.close(),
    "__exit__": lambda store: store.__exit__(None, None, None),
}
_TAKE_THE_MUTEX = {"set", "delete", "clear", "save", "transaction", "run_transaction", "reload", "close", "__exit__"}


def test_every_public_method_taking_the_stores_mutex_holds_signals_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A method that takes the mutex outside ``_interrupts.protected`` (or a transaction's own
    ``enter``) can be cut by Ctrl-C between the acquire and the ``try`` that releases it."""
    public = {name for name, value in vars(StatusStore).items()
              if callable(value) and not name.startswith("_")} | {"__exit__"}
    assert public == set(_PUBLIC_CALLS), "add the new public method to _PUBLIC_CALLS"
    assert isinstance(vars(StatusStore)["path"], property)  # the one public attribute not called

    real_guard = StatusStore._guard
    depths: list[int] = []
    watched: list[StatusStore] = []

    def spied_guard(self: StatusStore, start: float | None = None) -> Any:
        if self in watched and threading.current_thread() is threading.main_thread():
            depths.append(_interrupts.state.depth)
        return real_guard(self, start)

    monkeypatch.setattr(StatusStore, "_guard", spied_guard)
    took = set()
    for name, call in _PUBLIC_CALLS.items():
        path = tmp_path / name / "status.json"
        store = StatusStore(path, durable=False)
        store.set("b", "n", 1)
        store.set("b", "keep", [1])
        depths.clear()
        watched[:] = [store]
        call(store)
        if depths:
            took.add(name)
        assert all(depths), f"StatusStore.{name} takes the mutex with signals let through: wrap it in _interrupts.protected"
        if name == "reload":
            assert store.get("b", "elsewhere") is True  # it read, under the mutex
        store.close()
    assert took == _TAKE_THE_MUTEX


# -- Ctrl-C after another process took the change into its write -----------------------------------
# (the waiter's side, for real: test_mailbox.test_ctrl_c_after_a_holder_took_the_request_leaves_memory_to_the_file)


def test_an_interrupt_after_a_holder_wrote_the_change_says_it_is_in_the_file() -> None:
    from trainstatus import TrainingStatusWarning
    from trainstatus._lock import mailbox as _mailbox

    said = ("trainstatus: this call was interrupted while it waited for the lock of /runs/status.json, after "
            "process 4242 had written its change: the change is in the file. The store's reload() shows it (its "
            "next write reads the file first, too).")
    interrupt = KeyboardInterrupt()
    if sys.version_info >= (3, 11):  # a note, shown with the traceback
        _locking._say_handed_over(interrupt, "/runs/status.json", _mailbox.DONE, 4242)
        assert interrupt.__notes__ == [said]
    else:  # Python 3.10: exceptions have no notes, so a warning says it
        with pytest.warns(TrainingStatusWarning) as caught:
            _locking._say_handed_over(interrupt, "/runs/status.json", _mailbox.DONE, 4242)
        assert [str(w.message) for w in caught] == [said]


class _InterruptWithoutNotes(KeyboardInterrupt):
    add_note = None  # as on Python 3.10, where exceptions have no notes


def test_without_notes_an_interrupt_after_a_holder_took_the_change_warns_instead() -> None:
    from trainstatus import TrainingStatusWarning
    from trainstatus._lock import mailbox as _mailbox

    with pytest.warns(TrainingStatusWarning) as caught:
        _locking._say_handed_over(_InterruptWithoutNotes(), "/runs/status.json", _mailbox.CLAIMED, 0)
    assert [str(w.message) for w in caught] == [
        "trainstatus: this call was interrupted while it waited for the lock of /runs/status.json, after "
        "another process, which holds the lock, had taken its change into its own write: the change may still "
        "land in the file. The store's reload() shows whether it did, once that write is done (its next write "
        "reads the file first, too)."]
    assert caught[0].message.path == "/runs/status.json"  # type: ignore[union-attr]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning raised as an error must not replace the interrupt
        _locking._say_handed_over(_InterruptWithoutNotes(), "/runs/status.json", _mailbox.CLAIMED, 0)
