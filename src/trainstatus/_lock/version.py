"""The status file's own versions, locked while a write builds on them.

Why: the lock file can be deleted or replaced by hand (``rm run_logs/*.lock``, a cleanup script
between overlapping runs, a ``cp`` over it) while a writer holds it. The next writer then makes a
new lock file and locks that, and two writers are inside at once: each reads the same version of
the status file, each renames its own over it, and one change is lost after its call returned.
Checking the lock path before the rename narrows that window but cannot close it (the deletion can
land between the check and the rename). The status file cannot be deleted that way without losing
the status anyway, so the protocol also locks the file itself:

- a writer holding the lock ``flock``s the version (the inode) it builds on, from the moment it
  reads it or finds it unchanged until its hold ends, and then checks that the version is still the
  file at the path (a writer that held it may have renamed another over it meanwhile);
- it ``flock``s its new version before renaming it into place, so the file at the path is locked
  by whoever wrote it last until that writer's hold ends;
- a file that does not exist yet cannot be locked: the first version is put in place with
  ``link``, which fails when another writer made the file meanwhile (``_storage.atomic``).

A writer that got in through a replaced lock file therefore waits for the version's ``flock``
and then builds on the newest version: deleting the lock file costs a wait, never a change. In the
usual case (one lock file, every writer behind it) the ``flock`` is free at once: a system call
and a ``stat`` per write.

Only on local filesystems (``fair``'s list): NFS makes an ``flock`` a byte-range lock on the server,
which refuses an exclusive lock on a file open read-only (and CIFS makes it mandatory, failing other
reads); there the lock file (or the soft lease) is all there is, as before. What a process holds is
one registry for the whole process, because a ``flock`` excludes other open files of the same
process too: two stores of one process on one file (or on two hard-linked names of it) must share
what they hold, or the second would wait for the first forever. ``VersionLocks`` is one holder's
(``path_lock.PathLock``'s) part of it, let go at the end of its hold. The locks are taken on
open files of their own, opened again from the caller's descriptors through ``/proc/self/fd``
(the same file even once it was renamed away), so the storage may close its own descriptors before
the hold ends, and so that a child forked while the lock is not held shares no ``flock`` with us: a
``flock`` belongs to an open file, which a fork shares, and a child (a DataLoader worker) living on
after a killed parent would keep a shared one locked. A child forked during a hold closes its
copies (``forget``). It imports ``_interrupts`` and ``_errors``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
import types

from . import fair as _fair
from .. import _interrupts
from .._errors import TrainingStatusLockTimeout

__all__ = ["VersionLocks"]

# A writer waiting for a version waits for another writer's write (milliseconds): polled, as only a
# lock file deleted by hand ever makes it wait at all.
_POLL = 0.0005
# flock errors that mean "no flock here for a version" (some network filesystems; EBADF: an exclusive
# lock on a file open read-only, where flock is a byte-range lock): versions are then not locked.
_NO_FLOCK = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES})
_REOPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)

# The process's versions: (device, inode) -> [our open file, locked; the holders (VersionLocks)].
_held: dict[tuple[int, int], tuple[int, set[int]]] = {}
_pending: set[int] = set()  # open files being locked (a child forked meanwhile closes its copies)
_mutex = threading.Lock()


def _own(fd: int) -> int:
    """An open file of our own on the file open as ``fd`` (see the module doc); where there is no
    ``/proc``, a duplicate of ``fd`` (the same open file, hence the same ``flock``)."""
    try:
        return os.open(f"/proc/self/fd/{fd}", _REOPEN_FLAGS)
    except OSError:
        return os.dup(fd)


class VersionLocks:
    """One holder's part of the versions this process holds ``flock``ed (see the module doc)."""

    def __init__(self, lock_file: str) -> None:
        self._lock_file = lock_file  # for messages
        self._mine: set[tuple[int, int]] = set()  # the versions this holder holds
        # Set once the filesystem refused flock on the status file: writers rely on the lock file.
        self.unsupported = False

    def usable(self, device: int | None = None) -> bool:
        """Whether versions are locked here (on ``device``): not on a filesystem without ``flock``
        or not local, and not under pyfakefs (which swaps ``os`` for a module of its own whose
        descriptors are not real)."""
        if self.unsupported or not isinstance(os, types.ModuleType):
            return False
        return device is None or _fair.on_local_device(device)

    def holds(self, key: tuple[int, int]) -> bool:
        """Whether this holder holds the version of ``key`` (device, inode)."""
        return key in self._mine

    def take(self, fd: int, key: tuple[int, int], target: str, deadline: float | None, shown: float | None, *,
             path: str) -> bool:
        """Lock the version open as ``fd`` (device and inode: ``key``), waiting until ``deadline``
        (monotonic; None: forever) for a writer that holds it; whether it is still the file at
        ``target`` (False: it was replaced, and is let go).

        ``TrainingStatusLockTimeout`` naming ``path`` and ``shown`` (the store's lock_timeout) when
        the wait runs out.
        """
        if not self.usable(key[0]):
            return True
        if key not in self._mine:
            with _mutex:
                shared = _held.get(key)
                if shared is not None:  # another store of this process holds it: ours too
                    shared[1].add(id(self))
                    self._mine.add(key)
            if key not in self._mine:
                mine = _own(fd)
                _pending.add(mine)
                try:
                    locked = self._wait(mine, deadline, shown, path, target)
                except BaseException:
                    _pending.discard(mine)
                    os.close(mine)
                    raise
                _pending.discard(mine)
                if not locked:
                    os.close(mine)
                    return True  # no flock on this filesystem
                with _mutex:
                    _held[key] = (mine, {id(self)})
                self._mine.add(key)
        try:
            there = os.stat(target)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == key:
            return True
        self._let_go(key)  # replaced while we waited: whoever waits on it may go on
        return False

    def adopt(self, fd: int, st: os.stat_result) -> None:
        """Lock the new version open as ``fd`` (``st`` its stat: a temp file about to be renamed
        into place, which nobody else can have locked): from the rename on, the file at the path is
        ours until the hold ends."""
        key = (st.st_dev, st.st_ino)
        if not self.usable(key[0]) or key in self._mine:
            return
        mine = _own(fd)
        _pending.add(mine)
        try:
            fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            _pending.discard(mine)
            os.close(mine)
            if exc.errno in _NO_FLOCK:
                self.unsupported = True
                return
            raise
        _pending.discard(mine)
        with _mutex:
            _held[key] = (mine, {id(self)})
        self._mine.add(key)

    def release(self) -> None:
        """Let go of every version this holder holds (the end of the outermost hold)."""
        for key in list(self._mine):
            self._let_go(key)

    def _let_go(self, key: tuple[int, int]) -> None:
        self._mine.discard(key)
        with _mutex:
            mine, holders = _held[key]
            holders.discard(id(self))
            if holders:
                return  # another store of this process still builds on it
            del _held[key]
        try:
            fcntl.flock(mine, fcntl.LOCK_UN)
        finally:
            os.close(mine)

    def _wait(self, fd: int, deadline: float | None, shown: float | None, path: str, target: str) -> bool:
        """flock ``fd``, polling until ``deadline``; False when the filesystem has no flock for it."""
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno in _NO_FLOCK:
                    self.unsupported = True
                    return False
                raise
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TrainingStatusLockTimeout(
                    f"Could not lock {path} within {shown} s: another writer holds its current version "
                    f"{target} and is still writing it, having locked a lock file that is no longer "
                    f"{self._lock_file} (it was deleted or replaced by hand while that writer held it). "
                    "Let it finish, or open the store with a longer lock_timeout=.",
                    path=path,
                    lock_file=self._lock_file,
                )
            _interrupts.sleep(_POLL if left is None else min(_POLL, left))


def forget() -> None:
    """In a forked child: close our copies without unlocking (each flock is the parent's too)."""
    global _mutex
    _mutex = threading.Lock()  # another thread of the parent may have held it
    for mine, _ in _held.values():
        _close(mine)
    for mine in _pending:
        _close(mine)
    _held.clear()
    _pending.clear()


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget)
