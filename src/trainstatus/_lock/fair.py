"""Fair turns for processes waiting on one file lock: the longest waiter goes first.

``flock`` wakes nobody in order, and a waiter polls (see ``_lock``): the process that just
released the lock, still running, takes it again before any waiter's next try. Eight processes on
one file then got 0.43 times one process's sets per second, with a p99 of 200 times its p50: one
process wrote while the others slept through their chances.

So waiting processes sign in, in the lock file itself: a small registry of slots at its start,
each ``(pid, check, arrival)`` in 16 bytes written with one ``pwrite`` (the lock file has no other
content; ``flock`` does not look at it). A process that takes the lock at its first try and
finds a waiter signed in lets the lock go at once and signs in behind (the list is read only when
the lock file shows a change since it was last read empty: ``_lock``, issue 23). Only the oldest
waiter tries, and waits in ``flock`` itself (see ``_lock``). The one that gets the lock signs out.

The others wait without polling, each in the kernel behind the waiter directly ahead of it (Linux,
on a local filesystem): a waiter in slot ``s`` holds open-file-description byte-range locks on
byte ``_SIZE + s`` of the lock file (it lives) and on its turn byte (``turn_byte``: of its slot
and arrival) while it is signed in, and the one behind it blocks (on a thread, ``_lock``)
taking that turn byte. It is woken the moment the waiter ahead signs out (it took the lock, or a
holder wrote its change: ``_lock.mailbox``) or dies (the kernel lets a dead process's locks go), and
then looks at the list again.
Byte-range locks and ``flock`` do not see each other on a local filesystem; on a network one
``flock`` may be made of byte-range locks, so anywhere else, and where the byte lock fails, the
next in line looks at the list every 0.1 ms and the others less often, as it did before.

Nothing here can stop the lock from being taken; it only decides who tries. A waiter killed while
signed in would hold the others back, so a slot counts only while its process exists on this
machine (a slot whose byte is held lives: the kernel lets go of a dead one's) and for
``_STALE_NS`` at most, and no process defers for longer than ``_DEFER_AT_MOST`` s in
one acquire: a slot of a process that died, or of another machine (an NFS-mounted folder), costs
the others that much once, never a hang. A torn read (a slot half written) fails its check and is
skipped. ``filelock.FileLock`` users of the same lock file truncate it, which signs everyone out:
the waiters sign in again at their next look. A lock file that holds anything else, or that has
a second name (a hard link planted at the lock path), is never written: its waiters poll as before.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import sys
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


# struct flock of 64-bit Linux (l_type, l_whence, l_start, l_len, l_pid); elsewhere no hand-off.
_FLOCK = struct.Struct("hhqqi4x")
_HANDOFF = sys.platform == "linux" and hasattr(fcntl, "F_OFD_SETLKW") and struct.calcsize("P") == 8
# Filesystems whose byte-range locks and flock are the kernel's local ones, kept apart.
_LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "overlay", "zfs", "bcachefs"})
_local_devices: dict[int, bool] = {}
# Every descriptor holding a waiter's byte: a forked child closes its copies, so that its parent's
# byte is let go when the parent dies (an open file description's locks last while any copy is open).
_duplicates: set[int] = set()


def byte_of(slot: int) -> int:
    """The byte a waiter signed in at ``slot`` holds locked while it waits: it lives."""
    return _SIZE + slot


# Each sign-in also holds a turn byte picked by its slot and its arrival, and the one behind waits
# on that byte, not the slot's: a waiter that read a record just before its process signed out and
# in again at the same slot (a write takes a millisecond, then the next set signs in) would
# otherwise wait on the new sign-in, which may be waiting on it, and both slept until
# _DEFER_AT_MOST. Byte-range locks need no content: the turn bytes lie far past the end of the file.
_TURN_BYTES = 1 << 40
_sign_ins = 0  # this process's sign-ins: each starts looking for a free slot one further on


def turn_byte(slot: int, arrival: int) -> int:
    """The byte the one behind a waiter (``slot``, ``arrival``) waits on (one of 2**24 per slot)."""
    return _TURN_BYTES + (slot << 24) + ((arrival ^ (arrival >> 24)) & 0xFFFFFF)


def lock_request(kind: int, slot: int) -> bytes:
    return byte_request(kind, byte_of(slot))


def byte_request(kind: int, byte: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, byte, 1, 0)  # l_pid must be 0 for OFD locks


def _on_local_filesystem(fd: int) -> bool:
    """Whether the file is on a filesystem in ``_LOCAL_FILESYSTEMS`` (/proc/self/mountinfo)."""
    return on_local_device(os.fstat(fd).st_dev)


def on_local_device(dev: int) -> bool:
    """Whether device ``dev`` holds a filesystem in ``_LOCAL_FILESYSTEMS`` (read once per device)."""
    known = _local_devices.get(dev)
    if known is None:
        wanted = f"{os.major(dev)}:{os.minor(dev)}"
        known = False
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
                for line in mounts:
                    fields = line.split()
                    if len(fields) > 2 and fields[2] == wanted and " - " in line:
                        known = line.split(" - ", 1)[1].split()[0] in _LOCAL_FILESYSTEMS
                        break
        except OSError:
            pass
        _local_devices[dev] = known
    return known


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
    by ``real_os``, at each use (a lock file replaced under us is opened again by ``_lock``: a
    number kept here could by then be another file's).

    ``real_os`` is the ``os`` module that opened it, and it must be the real one: under pyfakefs
    the descriptor is a fake one, and the real ``pread`` would read whatever real file has its
    number (``_lock`` makes no registry then, and waiters poll as before).
    """

    def __init__(self, fd_of: Callable[[], int | None], real_os: Any, *, handoff: bool = False) -> None:
        self._fd_of = fd_of
        self._os = real_os
        self._slot: int | None = None  # where this process signed in
        self._arrival = 0
        self._since = 0.0
        # Waiting behind the one ahead in the kernel (see the module's doc): ``_mine`` is a
        # duplicate of the descriptor (one open file description, which outlives the descriptor
        # ``_lock`` may replace) that holds the byte of this process's slot.
        self._handoff = handoff and _HANDOFF
        self._mine: int | None = None
        self._pid = 0  # the process that made _mine (a forked child must not touch it)
        self.next_in_line: int | None = None  # ahead(): the turn byte of the one directly ahead

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

    def sign_in(self, arrival: int | None = None) -> None:
        global _sign_ins
        pid = os.getpid()
        self._arrival = time.monotonic_ns() if arrival is None else arrival
        self._since = time.monotonic()
        record = _SLOT.pack(pid, _check(pid, self._arrival), self._arrival)
        data = self._read()
        if not self._writable(data):
            self._slot = None  # not a registry: wait without a place, as before
            return
        data = data.ljust(_SIZE, b"\0")
        _sign_ins += 1
        start = (hash(pid) + _sign_ins) % _SLOTS
        for i in range(_SLOTS):
            slot = (start + i) % _SLOTS
            if data[slot * _SLOT.size:(slot + 1) * _SLOT.size] == _FREE and self._hold_byte(slot):
                self._os.pwrite(self.fd, record, slot * _SLOT.size)
                self._slot = slot
                return
        self._slot = None  # a full list (64 waiters): wait without a place, as before

    def _hold_byte(self, slot: int) -> bool:
        """Lock the byte of a free ``slot`` before writing it; False: another process is taking it.

        Locked first, so that a record whose byte is free belongs to a process that is gone (or
        that does not hand off: it is then looked at as before). Without the hand-off, True.
        """
        if not self._handoff:
            return True
        try:
            if self._mine is None:
                if not _on_local_filesystem(self.fd):
                    self._handoff = False
                    return True
                self._mine, self._pid = os.dup(self.fd), os.getpid()
                _duplicates.add(self._mine)
            fcntl.fcntl(self._mine, fcntl.F_OFD_SETLK, lock_request(fcntl.F_WRLCK, slot))
            try:
                fcntl.fcntl(self._mine, fcntl.F_OFD_SETLK, byte_request(fcntl.F_WRLCK, turn_byte(slot, self._arrival)))
            except OSError:
                fcntl.fcntl(self._mine, fcntl.F_OFD_SETLK, lock_request(fcntl.F_UNLCK, slot))
                raise
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            self._let_go_of_bytes()  # no byte-range locks here: wait as before
            self._handoff = False
        return True

    def _let_go_of_bytes(self) -> None:
        mine, self._mine = self._mine, None
        if mine is not None and self._pid == os.getpid():
            _duplicates.discard(mine)
            try:
                fcntl.fcntl(mine, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0))
            finally:
                os.close(mine)

    def _byte_held(self, slot: int) -> bool:
        """Whether another open file description holds the byte of ``slot`` (its waiter lives)."""
        assert self._mine is not None
        answer = fcntl.fcntl(self._mine, fcntl.F_OFD_GETLK, lock_request(fcntl.F_WRLCK, slot))
        return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)

    def deferring_for(self) -> float:
        """How long this process may still defer to the others in this acquire (s)."""
        return _DEFER_AT_MOST - (time.monotonic() - self._since)

    def ahead(self) -> int:
        """How many live waiters are ahead of this process (0: its turn to try the lock).

        0 as well once it deferred ``_DEFER_AT_MOST`` s, or without a place in the list. With the
        hand-off, ``next_in_line`` is then the slot of the one directly ahead if it holds its byte
        (None: look again later), and a waiter holding its byte lives (no ``kill``).
        """
        self.next_in_line = None
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
        latest = -1  # arrival of the live waiter directly ahead
        for slot, (pid, check, arrival) in enumerate(_SLOT.iter_unpack(data[: len(data) - len(data) % _SLOT.size])):
            if (pid == 0 or pid == me or check != _check(pid, arrival) or arrival >= self._arrival
                    or now - arrival > _STALE_NS):
                continue
            held = self._mine is not None and self._byte_held(slot)
            if held or _alive(pid):
                count += 1
                if arrival > latest:
                    latest, self.next_in_line = arrival, (turn_byte(slot, arrival) if held else None)
        return count

    @property
    def slot(self) -> int | None:
        """Where this process is signed in (None: nowhere)."""
        return self._slot

    @property
    def arrival(self) -> int:
        return self._arrival

    def own_descriptor(self) -> int | None:
        """The waiter's own open file description, holding its slot's byte (None: no hand-off)."""
        return self._mine if self._handoff and self._slot is not None else None

    def live_waiters(self) -> list[tuple[int, int, int]]:
        """``(slot, pid, arrival)`` of each signed-in waiter that holds its byte, oldest first.

        Asked by the process holding the lock (``_lock.mailbox``): on its own descriptor, whose open
        file description holds no byte, so a byte shown held is another waiter's.
        """
        if not _HANDOFF or not _on_local_filesystem(self.fd):
            return []  # nobody posts there (see _hold_byte)
        data = self._read()
        found = []
        for slot, (pid, check, arrival) in enumerate(_SLOT.iter_unpack(data[: len(data) - len(data) % _SLOT.size])):
            if pid == 0 or check != _check(pid, arrival):
                continue
            answer = fcntl.fcntl(self.fd, fcntl.F_OFD_GETLK, lock_request(fcntl.F_WRLCK, slot))
            if _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK:
                found.append((arrival, slot, pid))
        return [(slot, pid, arrival) for arrival, slot, pid in sorted(found)]

    def sign_in_again(self) -> None:
        """Sign in again, keeping the arrival (the record was truncated away or overwritten)."""
        arrival, since = self._arrival, self._since
        if self._mine is not None and self._slot is not None:
            fcntl.fcntl(self._mine, fcntl.F_OFD_SETLK, lock_request(fcntl.F_UNLCK, self._slot))
            fcntl.fcntl(self._mine, fcntl.F_OFD_SETLK, byte_request(fcntl.F_UNLCK, turn_byte(self._slot, arrival)))
        self.sign_in(arrival or None)
        self._since = since

    def sign_out(self) -> None:
        """Leave the list, then let go of the byte: the one behind, woken, finds the slot free."""
        try:
            if self._slot is None:
                return
            slot, self._slot = self._slot, None
            current = self._os.pread(self.fd, _SLOT.size, slot * _SLOT.size)
            if len(current) == _SLOT.size and _SLOT.unpack(current)[0] == os.getpid():
                self._os.pwrite(self.fd, _FREE, slot * _SLOT.size)
        finally:
            self._let_go_of_bytes()


def _after_fork_in_child() -> None:
    for fd in _duplicates:
        try:
            os.close(fd)
        except OSError:
            pass
    _duplicates.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
