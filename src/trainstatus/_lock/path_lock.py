"""One lock per status file per process: an in-process RLock in front of one file lock.

Every store on the same file in this process shares one ``PathLock``. Threads queue on the RLock,
so the file lock is only ever taken by one thread at a time and only once per outermost hold: a
``set`` inside a transaction pays for it zero times, a plain ``set`` once.

Two kinds of file lock (``StatusStore(lock=...)``):

- ``"flock"`` (the default): filelock's native lock (``flock``) on the sibling ``<file>.lock``,
  taken with ``filelock.lock_descriptor`` on a descriptor kept open between holds. It excludes
  other processes and plain ``filelock.FileLock`` users of the same ``.lock`` file alike, for a
  few µs, where ``FileLock.acquire`` + ``release`` spend 150-250 µs of Python per write (filelock
  4.3 opens, checks and closes the lock file and tracks forks on every acquire): more than the
  rest of the store's own work on a small write.
- ``"soft"``: for shared filesystems (NFS and the like), where ``flock`` may not exclude across
  machines. A filelock ``SoftFileLease`` on ``<file>.softlock``: a marker file created
  exclusively, naming its holder, kept fresh by a heartbeat while held. A holder that died is
  taken over at once on its own machine (its pid is gone) and, from another machine, once its
  marker has gone ``SOFT_LEASE_SECONDS`` unrefreshed, measured on the waiter's own clock. The
  ``flock`` on ``<file>.lock`` is taken as well where the filesystem has one, so writers of
  both modes on one machine still exclude each other.

After ``fork`` the child must not touch the parent's lock objects: an inherited RLock may be held by
a thread that does not exist in the child, and unlocking an inherited ``flock`` descriptor would
free the parent's lock. The child therefore starts a new registry (``generation`` changes, and
holders fetch their lock again) and keeps the inherited objects referenced forever, so no finalizer
of theirs runs in the child. It closes its copies of the inherited descriptors, which leaves the
parent's lock alone (an ``flock`` lasts while any copy is open) and keeps a long-lived child from
holding the parent's lock after the parent dies.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator
import contextlib
from contextlib import contextmanager
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

from . import fair as _fair, mailbox as _mailbox
from .. import _interrupts
from .._errors import (
    TrainingStatusError,
    TrainingStatusLockTimeout,
    TrainingStatusValueError,
    TrainingStatusWriteError,
)

if TYPE_CHECKING:
    import filelock
else:
    from .._lazy import lazy_module

    filelock = lazy_module("filelock")  # imported by the first lock taken (see _lazy)

__all__ = ["LOCK_MODES", "SOFT_LEASE_SECONDS", "Descriptor", "PathLock", "close_all", "generation", "lock_for"]

LOCK_MODES = ("flock", "soft")
# Every writer of one file must agree on this (filelock refuses a lease of another duration). A
# waiter takes over a dead holder's lease from another machine after this long; a live holder that
# cannot refresh it for this long (stopped, cut off from the server) may lose it.
SOFT_LEASE_SECONDS = 10.0

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
# A writer waiting for another process retries after 0.2 ms, then twice as long each time, up to
# 1 ms: a write takes about a millisecond, and a failed try costs a few µs (0.3% of a core at 1 ms).
# Waiters poll, so the releasing process often takes the lock again first; waking every 1 rather
# than 5 ms halved the p99 latency of 2 to 8 processes writing at once (57 -> 35 ms at 2, 239 ->
# 114 ms at 8, benchmarks/concurrency.py).
_FIRST_WAIT = 0.0002
_LONGEST_WAIT = 0.001
# How long the first of the waiting processes (see _fair) blocks in flock before it looks at the
# list again (a holder that died, a deadline).
_IN_KERNEL_FOR = 0.05
# How often the second of the waiting processes looks whether it is first.
_NEXT_POLL = 0.0001
# How long after the lock file's last change its mtime is trusted to change again with the next
# (file timestamps advance by the kernel's clock tick, a few ms; see _HeldDescriptor._quiet).
_QUIET_AFTER_NS = 50_000_000
# The soft lease is polled by filelock; a failed try reads the marker (a round trip on NFS).
_SOFT_POLL = 0.005
# How long past its lock_timeout a waiter whose change a holder took waits for that holder's write
# (which takes milliseconds) before it gives up saying the change may or may not be written: the
# holder is stopped (SIGSTOP, a debugger) or its disk hangs.
_OUTCOME_GRACE = 10.0
# flock errors that mean "this filesystem has no flock" (some network filesystems): soft mode goes on
# with its lease alone.
_NO_FLOCK = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP})


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


class _KernelWait:
    """One ``flock(LOCK_EX)`` blocking on a thread, on its own descriptor of the lock file.

    ``take(timeout)`` waits for it; ``cancel()`` says nobody will: the thread then unlocks and
    closes the descriptor as soon as its ``flock`` returns (at once if it returned already).
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, _OPEN_FLAGS, 0o666)
        self._done = threading.Lock()
        self._done.acquire()
        self._guard = threading.Lock()
        self._locked = False
        self._cancelled = False
        # The thread's flock returned, and ``take`` has not taken its outcome: ``cancel`` drops
        # it. Not ``_done``'s state: a Ctrl-C can land just after ``take``'s wait acquired
        # ``_done`` and before it took the descriptor, which then stayed locked, unreachable,
        # holding off every writer of the file (this process's own next write included).
        self._returned = False
        self.failed = False  # flock itself failed: the caller polls instead
        threading.Thread(target=self._block, name="trainstatus-lock-wait", daemon=True).start()

    def _block(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            locked = True
        except OSError:
            locked = False
        with self._guard:
            self._locked = locked
            if self._cancelled:
                self._drop()
                return
            self._returned = True
        self._done.release()

    def _drop(self) -> None:  # with _guard held, once the thread's flock returned
        if self._locked:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)

    def take(self, timeout: float) -> int | None:
        """The locked descriptor (now the caller's), or None: not yet (try again), or it failed."""
        if not _interrupts.acquire(self._done, timeout):
            return None
        with self._guard:
            self._returned = False  # taken: the caller's now
            if self._locked:
                return self._fd
            os.close(self._fd)  # flock failed: the caller polls instead
            self._cancelled = self.failed = True
            return None

    def cancel(self) -> None:
        with self._guard:
            if self._cancelled:
                return
            self._cancelled = True
            if self._returned:  # returned, and nobody took it
                self._returned = False
                self._drop()


class _TurnWait:
    """A wait on a thread for the waiter ahead to let go of its byte (``_fair``'s hand-off).

    The thread takes the byte's lock on a descriptor of its own (its own open file description:
    a lock of this process's shared one would merge with its own slot's) and lets go of it at
    once: only the wake-up is wanted. ``woken(timeout)`` waits for that; nobody waiting, the
    thread ends by itself once the byte is let go.
    """

    def __init__(self, path: str, byte: int) -> None:
        self.byte = byte  # the turn byte of the one ahead (_fair.turn_byte)
        self.failed = False  # the byte lock itself failed: the caller looks at the list instead
        self._fd = os.open(path, _OPEN_FLAGS, 0o666)
        self._done = threading.Lock()
        self._done.acquire()
        try:
            threading.Thread(target=self._block, name="trainstatus-turn-wait", daemon=True).start()
        except BaseException:  # no thread to close it
            os.close(self._fd)
            raise

    def _block(self) -> None:
        try:
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLKW, _fair.byte_request(fcntl.F_WRLCK, self.byte))
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _fair.byte_request(fcntl.F_UNLCK, self.byte))
        except OSError:
            self.failed = True
        finally:
            os.close(self._fd)
            self._done.release()

    def woken(self, timeout: float) -> bool:
        return _interrupts.acquire(self._done, timeout)


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
        """The lock file's waiting list (see ``_fair``), on the real ``os`` only; None if unusable."""
        self._open()
        if not isinstance(self._opened_by, types.ModuleType):
            return None  # pyfakefs' os: its descriptors are not real ones
        return _fair.Registry(self._current_fd, self._opened_by, handoff=True)

    def _current_fd(self) -> int | None:
        return self._held[0][0] if self._held and self._opened_by is os else None

    def acquire(self, deadline: float | None, offer: _mailbox.Offer | None = None) -> bool:
        """Lock, retrying until ``deadline`` (monotonic; None: forever); ``filelock.Timeout`` after.

        Waiting processes take turns, the longest waiter first (``_fair``): a process that finds
        others waiting signs in behind them instead of taking the lock as it comes free. A waiter
        with an ``offer`` hands its changes to the holder (``_mailbox``); True: the holder wrote
        them, and the lock is not held.
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
                # Interrupted: a request no holder took is taken back; one taken may be written.
                with contextlib.suppress(OSError):
                    box.withdraw()
            raise

    def _post(self, registry: _fair.Registry, offer: _mailbox.Offer) -> _mailbox.Box | None:
        """Hand ``offer``'s changes to whoever holds the lock (``_mailbox``); None: not handed."""
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
            box.withdraw()  # pending, or taken by a holder that failed or died: written here
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


class PathLock:
    """Mutual exclusion for one status file across threads and processes; reentrant per thread.

    ``lock_path`` is ``<file>.lock``; in ``"soft"`` mode the lease is ``lease_path``, by default
    ``<file>.softlock`` beside it (``_names`` makes both names for a long file name).
    """

    def __init__(self, lock_path: str, mode: str = "flock", lease_path: str | None = None) -> None:
        self.lock_path = lock_path
        self.mode = mode
        self._mutex = threading.RLock()
        self._depth = 0  # holds by the thread owning _mutex; guarded by _mutex
        self._owner: int | None = None  # thread ident while _depth > 0; guarded by _mutex
        self._file_lock = _HeldDescriptor(lock_path)
        self._flock_held = False  # soft mode: whether this hold also took the flock
        self.lease_path: str | None = None
        self._lease: filelock.SoftFileLease | None = None
        if mode == "soft":
            self.lease_path = lease_path or (lock_path.removesuffix(".lock") + ".softlock")
            self._lease = filelock.SoftFileLease(
                self.lease_path, thread_local=False, lease_duration=SOFT_LEASE_SECONDS
            )

    def held_here(self) -> bool:
        """Whether the calling thread holds this lock (safe to ask from any thread)."""
        return self._owner == threading.get_ident()

    @contextmanager
    def hold(self, timeout: float | None, *, path: str, configured: float | None = None,
             offer: _mailbox.Offer | None = None) -> Iterator[bool]:
        """Hold the lock, waiting at most ``timeout`` s (None: forever).

        ``configured`` is the caller's whole ``lock_timeout``, for the message, when ``timeout`` is
        what is left of it. With an ``offer``, a process that must wait hands its changes to the
        holder (``_mailbox``): the context then gives True, and only this process's threads are
        held off (the holder wrote the changes); otherwise False.
        """
        shown = timeout if configured is None else configured
        taken_in = generation  # a hold that spans a fork must not release in the child
        deadline = None if timeout is None else time.monotonic() + timeout
        if not _interrupts.acquire(self._mutex, timeout):
            raise self._timeout(shown, path, None)
        try:
            if self._depth == 0 and self._take(deadline, shown, path, offer):
                yield True
                return
            self._depth += 1
            self._owner = threading.get_ident()
            try:
                yield False
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    if generation == taken_in:  # in a forked child the locks are the parent's
                        self._let_go()
        finally:
            self._mutex.release()

    def _take(self, deadline: float | None, shown: float | None, path: str, offer: _mailbox.Offer | None = None) -> bool:
        """Take the file lock (True instead: a holder wrote ``offer``'s changes, see ``hold``)."""
        try:
            self._flock_held = False
            if self._file_lock.acquire(deadline, offer if self._lease is None else None):
                return True
            self._flock_held = True
        except filelock.Timeout as exc:
            raise self._timeout(shown, path, exc) from exc
        except _Unfinished as exc:
            raise self._unfinished(shown, path, exc.claimer) from None
        except _CannotFlock as exc:
            if self._lease is None or exc.error.errno not in _NO_FLOCK:
                raise self._cannot_flock(path, exc.error) from exc.error
        except OSError as exc:  # cannot create or open the lock file
            raise self._cannot_lock(path, exc) from exc
        if self._lease is None:
            return False
        try:
            self._take_lease(deadline)
        except BaseException as exc:
            if self._flock_held:
                self._flock_held = False
                self._file_lock.release()
            if isinstance(exc, filelock.Timeout):
                raise self._soft_timeout(shown, path, exc) from exc
            if isinstance(exc, OSError):
                raise self._cannot_lock(path, exc, self.lease_path) from exc
            raise
        return False

    def collect(self, *, meta: Callable[[], bytes], durable: bool) -> list[_mailbox.Request]:
        """Changes other processes handed over that this hold's write can carry (see ``_mailbox``)."""
        if not self._flock_held or self._lease is not None:
            return []
        return self._file_lock.collect(meta=meta, durable=durable)

    def acknowledge(self, requests: list[_mailbox.Request]) -> None:
        """Tell the processes of ``requests`` that the write carrying them is durable."""
        if self._flock_held:
            self._file_lock.acknowledge(requests)

    def _take_lease(self, deadline: float | None) -> None:
        # Polled here rather than by filelock's own wait, so that a Ctrl-C can stop the wait
        # only between two tries, never inside one (see _interrupts).
        assert self._lease is not None
        while True:
            try:
                self._lease.acquire(blocking=False)
                return
            except filelock.Timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            left = _SOFT_POLL if deadline is None else min(_SOFT_POLL, max(0.0, deadline - time.monotonic()))
            _interrupts.sleep(left)

    def _let_go(self) -> None:
        try:
            if self._lease is not None:
                self._lease.release()
        finally:
            if self._flock_held:
                self._flock_held = False
                self._file_lock.release()

    def _cannot_lock(self, path: str, exc: OSError, lock_file: str | None = None) -> TrainingStatusWriteError:
        lock_file = lock_file or self.lock_path
        return TrainingStatusWriteError(
            f"Could not lock {path}: cannot open the lock file {lock_file}: "
            f"{exc.strerror or exc}. Nothing was written; make its directory writable "
            "(and the lock file a regular file, not a symlink).",
            path=path,
            lock_file=lock_file,
            errno=exc.errno,
        )

    def _cannot_flock(self, path: str, exc: OSError) -> TrainingStatusWriteError:
        return TrainingStatusWriteError(
            f"Could not lock {path}: flock on the lock file {self.lock_path} failed: "
            f"{exc.strerror or exc}. Nothing was written; on a filesystem without flock (some "
            'network filesystems) open the store with lock="soft".',
            path=path,
            lock_file=self.lock_path,
            errno=exc.errno,
        )

    def _timeout(self, timeout: float | None, path: str, exc: BaseException | None) -> TrainingStatusLockTimeout:
        who = "another process" if exc is not None else "another thread of this process"
        return TrainingStatusLockTimeout(
            f"Could not lock {path} within {timeout} s: {who} holds {self.lock_path} (a write or an "
            "open transaction). Let it finish, or open the store with a longer lock_timeout=.",
            path=path,
            lock_file=self.lock_path,
        )

    def _unfinished(self, timeout: float | None, path: str, claimer: int) -> TrainingStatusError:
        who = f"process {claimer}" if claimer else "another process"
        return TrainingStatusError(
            f"Could not finish this write of {path}: its change was handed to {who}, which holds "
            f"the lock and took it into its own write, but has not finished that write "
            f"{_OUTCOME_GRACE:g} s after this call's lock_timeout ({timeout} s) ran out (it may be "
            "stopped, or its disk hung). The change may or may not be in the file: read it once "
            "that process goes on, or set the value again.",
            path=path,
            lock_file=self.lock_path,
        )

    def _soft_timeout(self, timeout: float | None, path: str, exc: BaseException) -> TrainingStatusLockTimeout:
        assert self.lease_path is not None
        return TrainingStatusLockTimeout(
            f"Could not lock {path} within {timeout} s: {_holder(self.lease_path)} holds "
            f"{self.lease_path} (a write or an open transaction). Let it finish, or open the store "
            f"with a longer lock_timeout=. A holder that was killed is taken over once its lease "
            f"has gone {SOFT_LEASE_SECONDS:g} s without renewal (at once on its own machine); if it "
            f"is gone and you cannot wait, delete {self.lease_path}.",
            path=path,
            lock_file=self.lease_path,
        )


def _holder(lease_path: str) -> str:
    """Who a soft lock's marker names, for messages ("process 12 on node3"), or "another process"."""
    try:
        with open(lease_path, "rb") as f:
            record = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return "another process"
    # filelock's marker is "name=value" lines (pid, host, ...); anything else: no name to give.
    import re  # here: only this message needs it

    pid = re.search(r"^pid=(\d+)$", record, re.MULTILINE)
    host = re.search(r"^host=(\S+)$", record, re.MULTILINE)
    if pid is None:
        return "another process"
    return f"process {pid.group(1)}" + (f" on {host.group(1)}" if host else "")


_registry: weakref.WeakValueDictionary[str, PathLock] = weakref.WeakValueDictionary()
_registry_mutex = threading.Lock()
_inherited: list[Any] = []  # objects from before a fork, kept alive in the child on purpose
generation = 0


def lock_for(lock_path: str, mode: str = "flock", lease_path: str | None = None, *, target: str | None = None) -> PathLock:
    """The process-wide lock for ``lock_path`` (an absolute, resolved path) of status file ``target``."""
    with _registry_mutex:
        lock = _registry.get(lock_path)
        if lock is None:
            lock = _registry[lock_path] = PathLock(lock_path, mode, lease_path)
        elif lock.mode != mode:
            where = target or lock_path.removesuffix('.lock')
            raise TrainingStatusValueError(
                f"{where} is already open in this process with lock={lock.mode!r}; "
                f"every store on one file must use the same lock mode, not lock={mode!r}",
                path=where,
            )
        return lock


def _after_fork_in_child() -> None:
    global _registry, _registry_mutex, generation
    inherited = list(_registry.values())
    _inherited.append(inherited)
    for lock in inherited:
        # Only our copy: the parent's flock lasts while its own descriptor is open.
        close_all(lock._file_lock._held)
    _registry = weakref.WeakValueDictionary()
    _registry_mutex = threading.Lock()
    generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
