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

What is left here is the face the store uses: the threads, the lock modes with the soft lease,
the registry across forks, and the errors a caller sees. The ``flock`` descriptor itself, with
the fair wait of processes and the hand-over of their changes, is ``descriptor``'s (which imports
``kernel_wait``, ``fair`` and ``mailbox``); this module imports ``descriptor``, ``mailbox`` (for
types), ``_interrupts`` and ``_errors``, and filelock lazily.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

from . import descriptor as _descriptor, mailbox as _mailbox, version as _version
from .. import _interrupts
from .._errors import (
    TrainingStatusLockTimeout,
    TrainingStatusUnfinishedWrite,
    TrainingStatusValueError,
    TrainingStatusWarning,
    TrainingStatusWriteError,
    warn,
)

if TYPE_CHECKING:
    import filelock
else:
    from .._lazy import lazy_module

    filelock = lazy_module("filelock")  # imported by the first lock taken (see _lazy)

__all__ = ["LOCK_MODES", "NO_FLOCK", "SOFT_LEASE_SECONDS", "PathLock", "generation", "lock_for"]

LOCK_MODES = ("flock", "soft")
# Every writer of one file must agree on this (filelock refuses a lease of another duration). A
# waiter takes over a dead holder's lease from another machine after this long; a live holder that
# cannot refresh it for this long (stopped, cut off from the server) may lose it.
SOFT_LEASE_SECONDS = 10.0

# The soft lease is polled by filelock; a failed try reads the marker (a round trip on NFS).
_SOFT_POLL = 0.005
# flock errors that mean "this filesystem has no flock" (some network filesystems): soft mode goes on
# with its lease alone.
NO_FLOCK = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP})


class PathLock:
    """Mutual exclusion for one status file across threads and processes; reentrant per thread.

    ``lock_path`` is ``<file>.lock``; in ``"soft"`` mode the lease is ``lease_path``, by default
    ``<file>.softlock`` beside it (``_storage.filenames`` makes both names for a long file name).
    """

    def __init__(self, lock_path: str, mode: str = "flock", lease_path: str | None = None) -> None:
        self.lock_path = lock_path
        self.mode = mode
        self._mutex = threading.RLock()
        self._depth = 0  # holds by the thread owning _mutex; guarded by _mutex
        self._owner: int | None = None  # thread ident while _depth > 0; guarded by _mutex
        self._file_lock = _descriptor._HeldDescriptor(lock_path)
        self._flock_held = False  # soft mode: whether this hold also took the flock
        # The status file's versions this hold builds on, locked too (``_lock.version``: a lock
        # file deleted by hand must not let two writers in at once), and how long a wait for
        # one may take (the hold's deadline, and the lock_timeout it came from, for the message).
        self.versions = _version.VersionLocks(lock_path)
        self._version_wait: tuple[float | None, float | None] = (None, None)  # (deadline, as configured)
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
        holder (``_lock.mailbox``): the context then gives True, and only this process's threads are
        held off (the box says the holder wrote the changes: the store checks the file); otherwise False.
        """
        shown = timeout if configured is None else configured
        taken_in = generation  # a hold that spans a fork must not release in the child
        deadline = None if timeout is None else time.monotonic() + timeout
        if not _interrupts.acquire(self._mutex, timeout):
            raise self._timeout(shown, path, None)
        try:
            if self._depth == 0:
                if self._take(deadline, shown, path, offer):
                    yield True
                    return
                self._version_wait = (deadline, shown)
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
            self._file_lock.handed_over = None
            if self._file_lock.acquire(deadline, offer if self._lease is None else None):
                return True
            self._flock_held = True
        except filelock.Timeout as exc:
            raise self._timeout(shown, path, exc) from exc
        except _descriptor._Unfinished as exc:
            raise self._unfinished(shown, path, exc.claimer) from None
        except _descriptor._CannotFlock as exc:
            if self._lease is None or exc.error.errno not in NO_FLOCK:
                raise self._cannot_flock(path, exc.error) from exc.error
        except OSError as exc:  # cannot create or open the lock file
            raise self._cannot_lock(path, exc) from exc
        except BaseException as exc:  # Ctrl-C (or a signal handler's exception) during the wait
            if self._file_lock.handed_over is not None:
                _say_handed_over(exc, path, *self._file_lock.handed_over)
            raise
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

    def take_version(self, fd: int, key: tuple[int, int], target: str, *, path: str) -> bool:
        """With the lock held: lock the status file's version open as ``fd`` (its device and inode:
        ``key``; ``_lock.version``); whether it is still the file at ``target``."""
        return self.versions.take(fd, key, target, *self._version_wait, path=path)

    def collect(self, *, meta: Callable[[], bytes], durable: bool) -> list[_mailbox.Request]:
        """Changes other processes handed over that this hold's write can carry (see ``_lock.mailbox``)."""
        if not self._flock_held or self._lease is not None:
            return []
        return self._file_lock.collect(meta=meta, durable=durable)

    def acknowledge(self, requests: list[_mailbox.Request]) -> None:
        """Tell the processes of ``requests`` that the write carrying them is durable."""
        if self._flock_held:
            self._file_lock.acknowledge(requests)

    def lock_file_lost(self) -> bool:
        """Whether the lock file this hold locked is no longer the one at its path (deleted or
        replaced by hand since): another writer may then have locked the new one and removed this
        write's temp file as a leftover. Asked only once a write failed: it is then written again."""
        fd = self._file_lock._current_fd()
        if not self._flock_held or fd is None:
            return False
        try:
            mine = os.fstat(fd)
            there = os.lstat(self.lock_path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return mine.st_nlink == 0 or (mine.st_dev, mine.st_ino) != (there.st_dev, there.st_ino)

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
            try:
                self.versions.release()  # first: the lock file still keeps out whoever shares it
            finally:
                if self._lease is not None:
                    self._lease.release()
        finally:
            if self._flock_held:
                self._flock_held = False
                self._file_lock.release()

    def _cannot_lock(self, path: str, exc: OSError, lock_file: str | None = None) -> TrainingStatusWriteError:
        lock_file = lock_file or self.lock_path
        what = "make its directory writable (and the lock file a regular file, not a symlink)"
        if exc.errno == errno.EPERM:  # the lock file or its folder may carry chattr's mark
            from . import attributes as _attributes

            places = (lock_file, os.path.dirname(lock_file) or ".")
            marked = _attributes.refusing_mark(places)
            if marked is not None and marked[1] != _attributes.UNKNOWN:
                what = _attributes.advice(*marked, refused="open it for writing")
            elif marked is not None:
                what += f", or {_attributes.unknown_advice(places)}"
        return TrainingStatusWriteError(
            f"Could not lock {path}: cannot open the lock file {lock_file}: "
            f"{exc.strerror or exc}. Nothing was written; {what}.",
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
        if exc is None:
            who = "another thread of this process"
        else:
            from .holders import holder_of_flock  # only once a wait timed out

            who = holder_of_flock(self.lock_path)
        return TrainingStatusLockTimeout(
            f"Could not lock {path} within {timeout} s: {who} holds {self.lock_path} (a write or an "
            "open transaction). Let it finish, or open the store with a longer lock_timeout=.",
            path=path,
            lock_file=self.lock_path,
        )

    def _unfinished(self, timeout: float | None, path: str, claimer: int) -> TrainingStatusUnfinishedWrite:
        who = f"process {claimer}" if claimer else "another process"
        return TrainingStatusUnfinishedWrite(
            f"Could not finish this write of {path}: its change was handed to {who}, which holds "
            f"the lock and took it into its own write, but has not finished that write "
            f"{_descriptor._OUTCOME_GRACE:g} s after this call's lock_timeout ({timeout} s) ran out "
            "(it may be stopped, or its disk hung). The change may or may not be in the file: read it once "
            "that process goes on, or set the value again.",
            path=path,
            lock_file=self.lock_path,
        )

    def _soft_timeout(self, timeout: float | None, path: str, exc: BaseException) -> TrainingStatusLockTimeout:
        assert self.lease_path is not None
        from .holders import holder_of_lease  # only once a wait timed out

        return TrainingStatusLockTimeout(
            f"Could not lock {path} within {timeout} s: {holder_of_lease(self.lease_path)} holds "
            f"{self.lease_path} (a write or an open transaction). Let it finish, or open the store "
            f"with a longer lock_timeout=. A holder that was killed is taken over once its lease "
            f"has gone {SOFT_LEASE_SECONDS:g} s without renewal (at once on its own machine); if it "
            f"is gone and you cannot wait, delete {self.lease_path}.",
            path=path,
            lock_file=self.lease_path,
        )


def _say_handed_over(exc: BaseException, path: str, state: int, claimer: int) -> None:
    """Tell whoever sees ``exc`` (a Ctrl-C during the wait) that its change may land all the same:
    a holder had taken it into its write (``state``: the box's, ``_lock.mailbox``)."""
    who = f"process {claimer}" if claimer else "another process"
    if state == _mailbox.DONE:
        outcome = f"after {who} had written its change: the change is in the file"
        then = "The store's reload() shows it"
    else:
        outcome = (f"after {who}, which holds the lock, had taken its change into its own write: the "
                   "change may still land in the file")
        then = "The store's reload() shows whether it did, once that write is done"
    note = (f"trainstatus: this call was interrupted while it waited for the lock of {path}, {outcome}. "
            f"{then} (its next write reads the file first, too).")
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:  # Python 3.11+: shown with the traceback
        add_note(note)
        return
    try:  # Python 3.10 has no notes on exceptions
        warn(TrainingStatusWarning(note, path=path))
    except Exception:  # noqa: BLE001 - warnings turned into errors: the interrupt still goes first
        pass


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
        _descriptor.close_all(lock._file_lock._held)
        lock.versions = _version.VersionLocks(lock.lock_path)  # the parent's (version.forget closes them)
    _registry = weakref.WeakValueDictionary()
    _registry_mutex = threading.Lock()
    generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
