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

One ``VersionLocks`` per status file per process (``path_lock.PathLock`` holds it), because a
``flock`` excludes other open files of the same process too: two stores of one process on one file
must share what they hold, or the second would wait for the first forever. The locks are taken on
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
import time
import types

from .. import _interrupts
from .._errors import TrainingStatusLockTimeout

__all__ = ["VersionLocks"]

# A writer waiting for a version waits for another writer's write (milliseconds): polled, as only a
# lock file deleted by hand ever makes it wait at all.
_POLL = 0.0005
# flock errors that mean "this filesystem has no flock" (some network filesystems): the versions are
# then not locked, and writers rely on the lock file alone, as before.
_NO_FLOCK = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP})


_REOPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def _own(fd: int) -> int:
    """An open file of our own on the file open as ``fd`` (see the module doc); where there is no
    ``/proc``, a duplicate of ``fd`` (the same open file, hence the same ``flock``)."""
    try:
        return os.open(f"/proc/self/fd/{fd}", _REOPEN_FLAGS)
    except OSError:
        return os.dup(fd)


class VersionLocks:
    """The versions of one status file this process holds ``flock``ed (see the module doc)."""

    def __init__(self, lock_file: str) -> None:
        self._lock_file = lock_file  # for messages
        self._held: dict[tuple[int, int], int] = {}  # (device, inode) -> our duplicate, locked
        # Set once the filesystem refused flock on the status file: writers rely on the lock file.
        self.unsupported = False

    def usable(self) -> bool:
        """Whether versions are locked here: not on a filesystem without ``flock``, and not under
        pyfakefs (which swaps ``os`` for a module of its own whose descriptors are not real)."""
        return not self.unsupported and isinstance(os, types.ModuleType)

    def holds(self, key: tuple[int, int]) -> bool:
        """Whether the version of ``key`` (device, inode) is held."""
        return key in self._held

    def take(self, fd: int, key: tuple[int, int], target: str, timeout: float | None, shown: float | None, *,
             path: str) -> bool:
        """Lock the version open as ``fd`` (device and inode: ``key``), waiting at most ``timeout`` s for a writer that holds
        it; whether it is still the file at ``target`` (False: it was replaced, and is let go).

        ``TrainingStatusLockTimeout`` naming ``path`` and ``shown`` (the store's lock_timeout) when
        the wait runs out.
        """
        if not self.usable():
            return True
        if key not in self._held:
            mine = _own(fd)
            try:
                if not self._wait(mine, timeout, shown, path, target):
                    os.close(mine)
                    return True  # no flock on this filesystem
            except BaseException:
                os.close(mine)
                raise
            self._held[key] = mine
        try:
            there = os.stat(target)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == key:
            return True
        self._let_go(key)  # replaced while we waited: whoever waits on it may go on
        return False

    def adopt(self, fd: int, st: os.stat_result) -> None:
        """Lock the new version open as ``fd`` (``st`` its stat: a temp file about to be renamed into place, which
        nobody else can have locked): from the rename on, the file at the path is ours until the
        hold ends."""
        if not self.usable():
            return
        key = (st.st_dev, st.st_ino)
        if key in self._held:
            return
        mine = _own(fd)
        try:
            fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(mine)
            if exc.errno in _NO_FLOCK:
                self.unsupported = True
                return
            raise
        self._held[key] = mine

    def release(self) -> None:
        """Let go of every version held (the end of the outermost hold)."""
        for key in list(self._held):
            self._let_go(key)

    def forget(self) -> None:
        """In a forked child: close our copies without unlocking (the flock is the parent's too)."""
        held, self._held = self._held, {}
        for mine in held.values():
            try:
                os.close(mine)
            except OSError:
                pass

    def _let_go(self, key: tuple[int, int]) -> None:
        mine = self._held.pop(key)
        try:
            fcntl.flock(mine, fcntl.LOCK_UN)
        finally:
            os.close(mine)

    def _wait(self, fd: int, timeout: float | None, shown: float | None, path: str, target: str) -> bool:
        """flock ``fd``, polling until ``timeout``; False when the filesystem has no flock."""
        deadline = None if timeout is None else time.monotonic() + timeout
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
