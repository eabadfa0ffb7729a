"""Fair turns for processes waiting on one file lock: the longest waiter goes first.

``flock`` wakes nobody in order, and a waiter polls (see ``_locking``): the process that just
released the lock, still running, takes it again before any waiter's next try. Eight processes on
one file then got 0.43 times one process's sets per second, with a p99 of 200 times its p50: one
process wrote while the others slept through their chances.

So waiting processes sign in, in the lock file itself: a small registry of slots at its start,
each ``(pid, check, arrival)`` in 16 bytes written with one ``pwrite`` (the lock file has no other
content; ``flock`` does not look at it). A process that takes the lock at its first try and
finds a waiter signed in lets the lock go at once and signs in behind (the list is read only when
the lock file shows a change since it was last read empty: ``_locking``, issue 23). Only the oldest
waiter tries, and waits in ``flock`` itself
(see ``_locking``); the next in line looks at the list every 0.1 ms, the others less often. The
one that gets the lock signs out.

Nothing here can stop the lock from being taken; it only decides who tries. A waiter killed while
signed in would hold the others back, so a slot counts only while its process exists on this
machine and for ``_STALE_NS`` at most, and no process defers for longer than ``_DEFER_AT_MOST`` s in
one acquire: a slot of a process that died, or of another machine (an NFS-mounted folder), costs
the others that much once, never a hang. A torn read (a slot half written) fails its check and is
skipped. ``filelock.FileLock`` users of the same lock file truncate it, which signs everyone out:
the waiters sign in again at their next look. A lock file that holds anything else, or that has
a second name (a hard link planted at the lock path), is never written: its waiters poll as before.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import time
from collections.abc import Callable
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Registry"]

_SLOTS = 64
_SLOT = struct.Struct("<IIq")  # pid, check, arrival (time.monotonic_ns: one clock for the machine)
_SIZE = _SLOTS * _SLOT.size
_EMPTY = bytes(_SIZE)
_FREE = bytes(_SLOT.size)
_MAGIC = 0x7E57A7E5
_STALE_NS = 5_000_000_000
_DEFER_AT_MOST = 0.05


def _check(pid: int, arrival: int) -> int:
    return (pid ^ (arrival & 0xFFFFFFFF) ^ (arrival >> 32) ^ _MAGIC) & 0xFFFFFFFF


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process, alive
        return True
    return True


class Registry:
    """The waiting list in one open lock file; ``fd_of()`` gives its descriptor, opened read-write
    by ``real_os``, at each use (a lock file replaced under us is opened again by ``_locking``: a
    number kept here could by then be another file's).

    ``real_os`` is the ``os`` module that opened it, and it must be the real one: under pyfakefs
    the descriptor is a fake one, and the real ``pread`` would read whatever real file has its
    number (``_locking`` makes no registry then, and waiters poll as before).
    """

    def __init__(self, fd_of: Callable[[], int | None], real_os: Any) -> None:
        self._fd_of = fd_of
        self._os = real_os
        self._slot: int | None = None  # where this process signed in
        self._arrival = 0
        self._since = 0.0

    @property
    def fd(self) -> int:
        fd = self._fd_of()
        if fd is None:
            raise OSError(errno.EBADF, "the lock file is not open")
        return fd

    def _read(self) -> bytes:
        return self._os.pread(self.fd, _SIZE, 0)  # type: ignore[no-any-return]

    def anyone_waiting(self) -> bool:
        """Whether some process may be signed in (the check after a first try took the lock)."""
        data = self._read()
        return bool(data) and data != _EMPTY[: len(data)]

    def _writable(self, data: bytes) -> bool:
        """Whether the lock file is a registry this module may write: one name (a hard link planted
        at the lock path is someone's file), and nothing in it but free slots and valid records."""
        st = self._os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or len(data) % _SLOT.size:
            return False
        return all((pid, check, arrival) == (0, 0, 0) or check == _check(pid, arrival)
                   for pid, check, arrival in _SLOT.iter_unpack(data))

    def sign_in(self) -> None:
        pid = os.getpid()
        self._arrival = time.monotonic_ns()
        self._since = time.monotonic()
        record = _SLOT.pack(pid, _check(pid, self._arrival), self._arrival)
        data = self._read()
        if not self._writable(data):
            self._slot = None  # not a registry: wait without a place, as before
            return
        data = data.ljust(_SIZE, b"\0")
        start = hash(pid) % _SLOTS
        for i in range(_SLOTS):
            slot = (start + i) % _SLOTS
            if data[slot * _SLOT.size:(slot + 1) * _SLOT.size] == _FREE:
                self._os.pwrite(self.fd, record, slot * _SLOT.size)
                self._slot = slot
                return
        self._slot = None  # a full list (64 waiters): wait without a place, as before

    def ahead(self) -> int:
        """How many live waiters are ahead of this process (0: its turn to try the lock).

        0 as well once it deferred ``_DEFER_AT_MOST`` s, or without a place in the list.
        """
        if self._slot is None or time.monotonic() - self._since > _DEFER_AT_MOST:
            return 0
        data = self._read()
        me = os.getpid()
        mine = data[self._slot * _SLOT.size:(self._slot + 1) * _SLOT.size]
        if len(mine) < _SLOT.size or _SLOT.unpack(mine)[0] != me:
            self.sign_in_again()  # truncated or overwritten: sign in again, keeping the arrival
            data = self._read()
        now = time.monotonic_ns()
        count = 0
        for pid, check, arrival in _SLOT.iter_unpack(data[: len(data) - len(data) % _SLOT.size]):
            if (pid == 0 or pid == me or check != _check(pid, arrival) or arrival >= self._arrival
                    or now - arrival > _STALE_NS):
                continue
            if _alive(pid):
                count += 1
        return count

    def sign_in_again(self) -> None:
        arrival, since = self._arrival, self._since
        self.sign_in()
        self._since = since
        if self._slot is not None and arrival:
            self._arrival = arrival
            pid = os.getpid()
            self._os.pwrite(self.fd, _SLOT.pack(pid, _check(pid, arrival), arrival), self._slot * _SLOT.size)

    def sign_out(self) -> None:
        if self._slot is None:
            return
        slot, self._slot = self._slot, None
        current = self._os.pread(self.fd, _SLOT.size, slot * _SLOT.size)
        if len(current) == _SLOT.size and _SLOT.unpack(current)[0] == os.getpid():
            self._os.pwrite(self.fd, _FREE, slot * _SLOT.size)
