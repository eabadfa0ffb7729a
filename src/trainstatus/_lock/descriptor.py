"""The file lock of one status file in this process: a ``flock`` descriptor, and its fair wait.

``_HeldDescriptor`` locks a descriptor of ``<file>.lock`` kept open between holds. A process that
must wait signs in on the waiting list (``fair``) and blocks in the kernel (``kernel_wait``); with
an offer it hands its changes to the holder (``mailbox``), and a holder collects them. Its own
module: how one process gets the lock from the others, apart from ``path_lock``'s threads, modes
and errors. It imports ``kernel_wait``, ``fair``, ``mailbox`` and ``_interrupts``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import types
import weakref
from collections.abc import Callable
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

from . import fair as _fair, mailbox as _mailbox
from .kernel_wait import _OPEN_FLAGS, _KernelWait, _TurnWait
from .. import _interrupts

if TYPE_CHECKING:
    import filelock
else:
    from .._lazy import lazy_module

    filelock = lazy_module("filelock")  # imported by the first lock taken (see _lazy)

__all__ = ["Descriptor", "_CannotFlock", "_HeldDescriptor", "_Unfinished", "close_all"]

# A writer waiting for another process retries after 0.2 ms, then twice as long each time, up to
# 1 ms: a write takes about a millisecond, and a failed try costs a few µs (0.3% of a core at 1 ms).
# Waiters poll, so the releasing process often takes the lock again first; waking every 1 rather
# than 5 ms halved the p99 latency of 2 to 8 processes writing at once (57 -> 35 ms at 2, 239 ->
# 114 ms at 8, benchmarks/concurrency.py).
_FIRST_WAIT = 0.0002
_LONGEST_WAIT = 0.001
# How long the first of the waiting processes (see _lock.fair) blocks in flock before it looks at the
# list again (a holder that died, a deadline).
_IN_KERNEL_FOR = 0.05
# How often the second of the waiting processes looks whether it is first.
_NEXT_POLL = 0.0001
# How long after the lock file's last change its mtime is trusted to change again with the next
# (file timestamps advance by the kernel's clock tick, a few ms; see _HeldDescriptor._quiet).
_QUIET_AFTER_NS = 50_000_000
# How long past its lock_timeout a waiter whose change a holder took waits for that holder's write
# (which takes milliseconds) before it gives up saying the change may or may not be written: the
# holder is stopped (SIGSTOP, a debugger) or its disk hangs.
_OUTCOME_GRACE = 10.0


class _Unfinished(Exception):
    """A holder took this process's change into its write and has not finished it, past the
    waiter's deadline and ``_OUTCOME_GRACE``: the change may or may not be written."""

    def __init__(self, claimer: int) -> None:
        super().__init__(claimer)
        self.claimer = claimer


class _CannotFlock(Exception):
    """``flock`` itself failed (not for contention): the filesystem may have none."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


# An open descriptor with the ``os.close`` of the ``os`` that opened it. pyfakefs swaps ``os`` in
# tests: a fake descriptor closed by the real ``os.close`` after the fake filesystem is gone (an
# object collected later) would close whatever real file has that number.
Descriptor = tuple[int, Callable[[int], None]]


def close_all(held: list[Descriptor]) -> None:
    """Close and remove every descriptor of ``held``; one already closed is not an error."""
    while held:
        fd, close = held.pop()
        try:
            close(fd)
        except Exception:  # noqa: BLE001 - closed already, or its pyfakefs filesystem is gone (it asserts)
            pass


class _HeldDescriptor:
    """filelock's native lock on a descriptor of the lock file that stays open between holds.

    ``filelock.lock_descriptor`` takes the same ``flock`` that ``filelock.FileLock`` takes on the
    same file. What FileLock checks that matters here is kept: once locked, the descriptor must
    still be the file at the lock path (someone may have deleted or replaced it, and a lock on an
    orphan excludes nobody); if not, the file there is opened and locked instead.

    The descriptor is closed with the ``close`` of the ``os`` that opened it: a store made under
    pyfakefs holds a fake descriptor, which the real ``os.close`` must never see (it would close
    whatever real file has that number). For the same reason a descriptor opened by another ``os``
    than the current one is dropped and the lock file opened again.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # [(fd, its close)] once open; closed when this object goes (or in a forked child).
        self._held: list[Descriptor] = []
        self._opened_by: Any = None  # the os module that opened it
        self._kernel_wait: _KernelWait | None = None  # a blocked flock of the acquire in progress
        self._turn_wait: _TurnWait | None = None  # a wait behind the next in line, not yet woken
        self._locked: os.stat_result | None = None  # the lock file as try_lock last locked it
        # (inode, size, mtime) of the lock file when its waiting list was last read and empty,
        # long enough after its last change that any later one has another mtime: while the file
        # still shows these, nobody has signed in since, and the list is not read again.
        self._quiet: tuple[int, int, int] | None = None
        # Whether the last acquire found others waiting (or waited itself): only then does its
        # write look for changes they handed over (``collect``); a lone writer pays nothing.
        self.contended = False
        # (box state, claimer pid) when the last wait was interrupted after a holder had taken its
        # change: it may be written all the same. Set by ``_wait``, cleared by path_lock.
        self.handed_over: tuple[int, int] | None = None
        weakref.finalize(self, close_all, self._held)

    def _open(self) -> int:
        if self._held and self._opened_by is not os:
            close_all(self._held)  # opened under (or before) pyfakefs: not ours to use now
        if not self._held:
            fd = os.open(self.path, _OPEN_FLAGS, 0o666)
            self._held.append((fd, os.close))
            self._opened_by = os
        return self._held[0][0]

    def close(self) -> None:
        close_all(self._held)

    def try_lock(self) -> bool:
        while True:
            fd = self._open()
            try:
                if not filelock.lock_descriptor(fd, blocking=False):
                    return False
            except OSError as exc:
                raise _CannotFlock(exc) from exc
            try:
                mine = os.fstat(fd)
                there = os.lstat(self.path)
            except FileNotFoundError:
                there = None
            except BaseException:
                filelock.unlock_descriptor(fd)
                raise
            if mine.st_nlink and there is not None and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                self._locked = mine
                return True
            filelock.unlock_descriptor(fd)  # an orphan: lock the file that is there now
            self.close()

    def _registry(self) -> _fair.Registry | None:
        """The lock file's waiting list (see ``_lock.fair``), on the real ``os`` only; None if unusable."""
        self._open()
        if not isinstance(self._opened_by, types.ModuleType):
            return None  # pyfakefs' os: its descriptors are not real ones
        return _fair.Registry(self._current_fd, self._opened_by, handoff=True)

    def _current_fd(self) -> int | None:
        return self._held[0][0] if self._held and self._opened_by is os else None

    def acquire(self, deadline: float | None, offer: _mailbox.Offer | None = None) -> bool:
        """Lock, retrying until ``deadline`` (monotonic; None: forever); ``filelock.Timeout`` after.

        Waiting processes take turns, the longest waiter first (``_lock.fair``): a process that finds
        others waiting signs in behind them instead of taking the lock as it comes free. A waiter
        with an ``offer`` hands its changes to the holder (``_lock.mailbox``); True: the holder wrote
        them (its box is DONE, with the holder's acknowledgement), and the lock is not held.
        """
        registry = self._registry()
        self.contended = False
        if self.try_lock():
            # Taken at the first try, as nearly every lock is. Only now is the list read, and only
            # when someone may have signed in: never when the file is empty (signing in writes
            # it) or unchanged since the list was last read empty. A process found waiting
            # longer gets the lock back at once, and this one signs in behind it.
            if registry is None or not self._anyone_waiting(registry):
                return False
            self.release()
        self.contended = True
        if registry is not None:
            try:
                registry.sign_in()
            except OSError:
                with contextlib.suppress(OSError):
                    registry.sign_out()  # lets go of a byte it may have locked
                registry = None
        try:
            return self._wait(deadline, registry, offer)
        finally:
            self._cancel_kernel_wait()
            if registry is not None:
                with contextlib.suppress(OSError):
                    registry.sign_out()

    def _anyone_waiting(self, registry: _fair.Registry) -> bool:
        """Whether the lock file just locked may list a waiter (see ``acquire``)."""
        seen = self._locked
        if seen is None or not seen.st_size:
            return False
        key = (seen.st_ino, seen.st_size, seen.st_mtime_ns)
        if key == self._quiet:
            return False
        try:
            if registry.anyone_waiting():
                return True
        except OSError:
            return False
        # Remembered only when the last change is older than a clock tick of the filesystem's
        # timestamps: a sign-in after this read then cannot leave the same mtime behind.
        if seen.st_mtime_ns < time.time_ns() - _QUIET_AFTER_NS:
            self._quiet = key
        return False

    def _wait(self, deadline: float | None, registry: _fair.Registry | None, offer: _mailbox.Offer | None) -> bool:
        box = None if offer is None or registry is None else self._post(registry, offer)
        try:
            return self._wait_in_line(deadline, registry, box)
        except BaseException:
            if box is not None:
                # Interrupted: a request no holder took is taken back; one taken may be written
                # (``handed_over``: path_lock says so on the exception).
                try:
                    state, claimer = box.withdraw(), box.claimer()
                except OSError:
                    state, claimer = _mailbox.CLAIMED, 0  # unknown: as if taken
                if state not in (_mailbox.PENDING, _mailbox.EMPTY):
                    self.handed_over = (state, claimer)
            raise

    def _post(self, registry: _fair.Registry, offer: _mailbox.Offer) -> _mailbox.Box | None:
        """Hand ``offer``'s changes to whoever holds the lock (``_lock.mailbox``); None: not handed."""
        fd, slot = registry.own_descriptor(), registry.slot
        if fd is None or slot is None:
            return None  # no byte held: a holder could not tell that this waiter lives
        payload = offer.request()
        if payload is None:
            return None
        try:
            return _mailbox.Box.post(fd, slot, registry.arrival, payload, durable=offer.durable)
        except OSError:
            return None

    def _settle(self, box: _mailbox.Box | None) -> bool:
        """With the lock just taken: True (and the lock let go) if a holder wrote the request."""
        if box is None:
            return False
        try:
            if box.state() == _mailbox.DONE:
                self.release()
                return True
            box.withdraw()  # pending, taken by a holder that failed or died, or DONE unacknowledged: written here
        except OSError:
            pass
        return False

    def _outcome(self, box: _mailbox.Box, until: float) -> bool:
        """A holder took the request when time ran out: wait until it is written or the lock is
        free, until ``until`` at most (then ``_Unfinished``: the change may or may not land)."""
        while True:
            if self._done(box):
                return True
            if self.try_lock() or self._wait_in_kernel(until, _IN_KERNEL_FOR):
                return self._settle(box)
            if time.monotonic() >= until:
                try:
                    claimer = box.claimer()
                except OSError:
                    claimer = 0
                raise _Unfinished(claimer)

    @staticmethod
    def _done(box: _mailbox.Box | None) -> bool:
        """Whether a holder wrote the request: DONE, acknowledged (``Box.state`` checks it)."""
        if box is None:
            return False
        try:
            return box.state() == _mailbox.DONE
        except OSError:
            return False

    def collect(self, *, meta: Callable[[], bytes], durable: bool) -> list[_mailbox.Request]:
        """The changes waiting processes handed over that this write can carry (lock held)."""
        if not self.contended:
            return []
        registry = self._registry()
        fd = self._current_fd()
        if registry is None or fd is None:
            return []
        try:
            waiters = registry.live_waiters()
        except OSError:
            return []
        return _mailbox.collect(fd, waiters, meta=meta(), durable=durable) if waiters else []

    def acknowledge(self, requests: list[_mailbox.Request]) -> None:
        fd = self._current_fd()
        if fd is not None and requests:
            _mailbox.acknowledge(fd, requests)

    def _wait_in_line(self, deadline: float | None, registry: _fair.Registry | None, box: _mailbox.Box | None) -> bool:
        wait = _FIRST_WAIT
        handoff = True  # until a wait behind the next in line fails: then polling, as before
        while True:
            if self._done(box):
                return True
            try:
                ahead = 0 if registry is None else registry.ahead()
            except OSError:
                ahead, registry = 0, None
            if ahead == 0:
                if self.try_lock():
                    return self._settle(box)
                if registry is not None:
                    # First in line: wait in the kernel, woken the moment the holder lets go,
                    # instead of polling (a sleep of 0.1 ms takes 0.2: a fifth of a write).
                    if self._wait_in_kernel(deadline, _IN_KERNEL_FOR):
                        return self._settle(box)
            elif handoff and registry is not None and registry.next_in_line is not None:
                # Behind a waiter that holds its byte: sleep in the kernel until it signs out or
                # dies, then look again.
                woken = self._wait_for_turn(deadline, registry.next_in_line, registry.deferring_for())
                if woken:
                    continue
                handoff = woken is not None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    if box is not None:
                        try:
                            state = box.withdraw()
                        except OSError:
                            state = _mailbox.CLAIMED  # unknown: as if taken
                        if state == _mailbox.DONE:
                            return True
                        if state in (_mailbox.CLAIMED, _mailbox.GONE):  # may be written: not a timeout
                            return self._outcome(box, deadline + _OUTCOME_GRACE)
                    raise filelock.Timeout(self.path)
            # Without the hand-off the others only look at the list: the next in line often, to
            # be in flock before the turn comes; the rest less often.
            pause = _NEXT_POLL if ahead == 1 else wait
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - time.monotonic()))
            _interrupts.sleep(pause)
            wait = min(2 * wait, _LONGEST_WAIT)

    def _wait_in_kernel(self, deadline: float | None, longest: float) -> bool:
        """Block in ``flock`` for at most ``longest`` s (and ``deadline``); whether locked.

        ``flock`` cannot time out, so it blocks on a thread of its own (``_KernelWait``), on a
        descriptor of its own, while this thread waits for it with a timeout and lets Ctrl-C
        through. A wait that timed out stays pending for the next call of this acquire; the end
        of the acquire cancels it (``_cancel_kernel_wait``). Taken, its descriptor becomes the one
        held, and the check of ``try_lock`` (the lock file is still the one at its path) applies.
        """
        timeout = longest if deadline is None else min(longest, deadline - time.monotonic())
        if timeout <= 0:
            return False
        if self._kernel_wait is None:
            self._kernel_wait = _KernelWait(self.path)
        fd = self._kernel_wait.take(timeout)
        if fd is None:
            if self._kernel_wait.failed:
                self._kernel_wait = None
            return False
        self._kernel_wait = None
        close_all(self._held)
        self._held.append((fd, os.close))
        self._opened_by = os
        try:
            mine = os.fstat(fd)
            there = os.lstat(self.path)
        except FileNotFoundError:
            there = None
        if mine.st_nlink and there is not None and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)  # an orphan: the caller locks the file that is there now
        self.close()
        return False

    def _wait_for_turn(self, deadline: float | None, byte: int, longest: float) -> bool | None:
        """Wait, within ``deadline`` and ``longest`` s, for the waiter ahead to let go of its turn
        ``byte``: True once it did, False when time is up, None if the wait failed."""
        timeout = longest if deadline is None else min(longest, deadline - time.monotonic())
        if timeout <= 0:
            return False
        if self._turn_wait is None or self._turn_wait.byte != byte:
            try:
                self._turn_wait = _TurnWait(self.path, byte)  # one behind another byte ends by itself
            except (OSError, RuntimeError):  # cannot open the file, or start a thread
                self._turn_wait = None
                return None
        if not self._turn_wait.woken(timeout):
            return False
        failed, self._turn_wait = self._turn_wait.failed, None
        return None if failed else True

    def _cancel_kernel_wait(self) -> None:
        self._turn_wait = None  # its thread ends once the byte is let go
        pending, self._kernel_wait = self._kernel_wait, None
        if pending is not None:
            pending.cancel()

    def release(self) -> None:
        filelock.unlock_descriptor(self._held[0][0])
