"""Threads blocked in the kernel on a lock file, so that a waiter can give up, time out and see Ctrl-C.

``flock(LOCK_EX)`` and a byte-range lock taken with ``F_OFD_SETLKW`` cannot time out, and a
thread blocked in one cannot be interrupted. So each blocks on a thread of its own, on a
descriptor of its own, while the waiting thread waits for that thread with a timeout:

- ``_KernelWait``: the ``flock`` of the lock file itself, taken by the first of the waiting
  processes (``descriptor``); once it returns, its descriptor is the one held.
- ``_TurnWait``: the turn byte of the waiter ahead (``fair``), taken and let go at once: only the
  wake-up is wanted, the moment that waiter signs out or dies.

Its own module because this is the one place where threads are started and descriptors are
handed from one thread to another; ``descriptor`` decides when to wait. It imports only ``fair``
(the byte lock requests) and ``_interrupts``.
"""

from __future__ import annotations

import fcntl
import os
import threading

from . import fair as _fair
from .. import _interrupts

__all__ = ["_OPEN_FLAGS", "_KernelWait", "_TurnWait"]

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


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
    """A wait on a thread for the waiter ahead to let go of its byte (``_lock.fair``'s hand-off).

    The thread takes the byte's lock on a descriptor of its own (its own open file description:
    a lock of this process's shared one would merge with its own slot's) and lets go of it at
    once: only the wake-up is wanted. ``woken(timeout)`` waits for that; nobody waiting, the
    thread ends by itself once the byte is let go.
    """

    def __init__(self, path: str, byte: int) -> None:
        self.byte = byte  # the turn byte of the one ahead (_lock.fair.turn_byte)
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
