"""Where the document lives, behind one seam.

The store only needs: read the document (remembering which version it read), tell whether the
stored version changed since, replace it, lock it, keep a damaged one aside, and clear leftovers of
killed writers. ``LocalFile`` is the implementation for a path on a local filesystem; ``Memory``
holds the document in the process (the ML-Agents drop-in before it is bound to a path). An object
store implements the same seam with conditional writes instead of a lock
(``_object_store.ObjectStorage``: S3, GCS, Azure Blob).
"""

from __future__ import annotations

import atexit
import contextlib
import errno as errno_codes
import os
import stat
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator

from . import atomic as _atomic, history as _history, filenames as _names
from .._lock import path_lock as _locking
from .. import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log
from .._errors import (
    TrainingStatusHistoryWarning,
    TrainingStatusReadError,
    TrainingStatusWarning,
    TrainingStatusWriteError,
)
from .._lazy import OnFirstUse

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    import datetime

    from .._lock import mailbox as _mailbox
    from typing import ContextManager
else:
    datetime = OnFirstUse("datetime", globals())  # only a damaged file kept aside needs it

__all__ = ["Conflict", "LocalFile", "Memory", "Storage", "byte_size", "default_file_mode"]

logger = logging.getLogger("trainstatus")


class Conflict(Exception):
    """``replace`` refused: the stored document is no longer the version last read or written.

    Only a ``conditional`` storage raises it; the store then reads again, lays its pending changes
    over what it finds and retries.
    """


class Storage:
    """The seam between the store and where its document is kept."""

    location: str
    lock_file: str | None = None  # what ``lock`` takes, for messages; None where nothing is
    # False: ``lock`` excludes other writers, so a write can trust ``changed()`` taken under it.
    # True: there is no lock; ``replace`` succeeds only if the stored version is still the one
    # last seen and raises ``Conflict`` otherwise (an object store's conditional write).
    conditional = False

    def read(self) -> bytes | None:
        """The stored document's bytes, or None when there is none; remembers this version."""
        raise NotImplementedError

    def changed(self) -> bool:
        """Whether the stored version differs from the one last read or written."""
        raise NotImplementedError

    def stale(self) -> bool:
        """Whether a write must read the document again first.

        Where the lock makes ``changed()`` cheap and final, the same question; a ``conditional``
        storage answers from what it knows without asking (its ``replace`` checks the version).
        """
        return self.changed()

    def replace(self, data: bytes) -> None:
        """Replace the stored document (the caller holds ``lock``); remembers the new version."""
        raise NotImplementedError

    def lock(self, timeout: float | None, *, configured: float | None = None) -> ContextManager[object]:
        """Exclude every other writer of this document while held; reentrant per thread.

        Waits at most ``timeout`` s; ``configured`` is the whole ``lock_timeout`` for messages.
        """
        raise NotImplementedError

    def lock_or_hand_over(self, timeout: float | None, offer: _mailbox.Offer, *,
                          configured: float | None = None) -> ContextManager[bool]:
        """``lock``, or, where another process holds it and takes over waiters' changes, hand
        ``offer``'s changes to it (``_mailbox``): True then, once they are durably written."""
        return _not_handed(self.lock(timeout, configured=configured))

    kept_versions = 0  # the earlier versions a write keeps (``history=``)

    def collect(self, meta: Callable[[], bytes]) -> list[_mailbox.Request]:
        """With the lock held: changes other processes handed over (``lock_or_hand_over``) by
        stores whose key (``_GroupCommit._hand_over_key``) is ``meta()``."""
        return []

    def acknowledge(self, requests: list[_mailbox.Request]) -> None:
        """Once the write that carried ``requests`` is durable: tell their processes."""

    def move_aside(self) -> str:
        """Keep the stored document, byte for byte, under a new name; return that name."""
        raise NotImplementedError

    def leftovers(self) -> list[str]:
        """What killed writers may have left behind (stale unless a writer holds the lock)."""
        return []

    def cleanup(self) -> None:
        """Remove ``leftovers()`` (called with ``lock`` held, when nobody can be writing)."""

    def forget(self) -> None:
        """Forget the version last seen, so that ``changed()`` says yes until the next read."""

    def history(self) -> list[_history.Version]:
        """Earlier versions kept, oldest first ([] where none are kept)."""
        return []

    def take_warning(self) -> TrainingStatusWarning | None:
        """What the last ``replace`` has to report besides its result (issued by the caller)."""
        return None

    def close(self) -> None:
        """Release what this object holds open."""


@contextlib.contextmanager
def _not_handed(lock: ContextManager[object]) -> Iterator[bool]:
    with lock:
        yield False


class Memory(Storage):
    """A document kept in this process only: nothing survives the process."""

    location = "<memory>"

    def __init__(self) -> None:
        self._data: bytes | None = None

    def read(self) -> bytes | None:
        return self._data

    def changed(self) -> bool:
        return False

    def replace(self, data: bytes) -> None:
        self._data = data

    def lock(self, timeout: float | None, *, configured: float | None = None) -> ContextManager[object]:
        return contextlib.nullcontext()

    def move_aside(self) -> str:  # pragma: no cover - a document this store wrote is never damaged
        raise NotImplementedError


def default_file_mode() -> int:
    """0666 under the process umask: what ``open(path, "w")`` would give a new file."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    # No /proc: the only portable read of the umask sets it, briefly, for the whole process.
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


class _Closer:
    """Closes the descriptors of replaced file versions, and prunes histories, on a background thread.

    Closing the last descriptor of a replaced file frees its inode, which on ext4 costs 150 µs or
    more: about a seventh of a small durable write, half of a ``durable=False`` one (the bare
    protocol pays the same inside its rename). Those descriptors protect nothing once the new
    version is pinned, so no caller needs to wait for that. Removing a history's oldest versions
    frees inodes the same way, and no write needs to wait for it either.

    Waking the thread costs too (a futex and a switch each way, the GIL passed back and forth: a
    quarter of a small ``durable=False`` set), so a write hands over only what frees an inode:
    a replaced version the history keeps is closed by the writer itself (its inode lives on under
    the history's name, so closing is cheap), and a history is pruned in batches (``defer``).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queued: list[_locking.Descriptor] = []
        self._jobs: dict[Hashable, Callable[[], None]] = {}  # one per key: a later one replaces it
        self._deferred: dict[Hashable, Callable[[], None]] = {}  # run by ``flush`` or ``wait``
        self._busy = False  # the thread took work and has not finished it; guarded by _cond
        self._thread: threading.Thread | None = None

    def close(self, fds: list[_locking.Descriptor]) -> None:
        # pyfakefs answers a call made from this module's thread with the real os (it takes the
        # thread's frames for those of a module it must not patch): a fake descriptor closed there
        # would close whatever real file has its number (a test runner's capture file, say).
        # Those are closed here, now, by the os that opened them.
        fake = [d for d in fds if _opened_by_pyfakefs(d[1])]
        if fake:
            _locking.close_all(fake)
            fds = [d for d in fds if not _opened_by_pyfakefs(d[1])]
            if not fds:
                return
        with self._cond:
            self._queued.extend(fds)
            self._start()

    def later(self, key: Hashable, job: Callable[[], None]) -> None:
        """Run ``job`` on the thread soon; a job queued under the same ``key`` and not started yet
        is replaced (pruning twice in a row does nothing more than once), a deferred one too."""
        with self._cond:
            self._deferred.pop(key, None)
            self._jobs[key] = job
            self._start()

    def defer(self, key: Hashable, job: Callable[[], None]) -> None:
        """Keep ``job`` for the thread without waking it: it runs when a ``later`` or ``flush`` of
        the same key, or a ``wait``, comes (a later ``defer`` of the key replaces it)."""
        with self._cond:
            self._deferred[key] = job

    def flush(self, key: Hashable) -> None:
        """Run the job deferred under ``key``, if any, soon (a store closing)."""
        with self._cond:
            job = self._deferred.pop(key, None)
            if job is not None:
                self._jobs[key] = job
                self._start()

    def _start(self) -> None:  # with _cond held
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainstatus-closer", daemon=True)
            self._thread.start()
        self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._jobs:
                    self._cond.wait()
                batch, self._queued = self._queued, []
                jobs, self._jobs = list(self._jobs.values()), {}
                self._busy = True
            try:
                _locking.close_all(batch)
                for job in jobs:
                    try:
                        job()
                    except Exception as exc:  # noqa: BLE001 - the thread must live on for the fds
                        # A history not pruned now is pruned after the next write.
                        logger.debug("background job failed: %s", exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> None:
        """Return once everything queued so far is done (tests counting descriptors or files, and
        the exit of the process), or after ``timeout`` s."""
        with self._cond:
            if self._deferred:
                self._jobs.update(self._deferred)
                self._deferred.clear()
                self._start()
            self._cond.wait_for(lambda: not (self._queued or self._jobs or self._busy), timeout)

    def after_fork_in_child(self) -> None:
        # Only the forking thread survives a fork: the closer is gone, and what it had taken is
        # lost (a few descriptors, copies of the parent's; a prune the next write queues again).
        # What was still queued is closed here.
        queued = self._queued
        self.__init__()  # type: ignore[misc]  # a fresh, unlocked state, as in a new process
        _locking.close_all(queued)


def _opened_by_pyfakefs(close: Callable[[int], None]) -> bool:
    return (getattr(close, "__module__", None) or "").startswith("pyfakefs.")


_closer = _Closer()
# Its thread is a daemon, stopped at exit: a short-lived process (the command line) would leave
# its prune undone, and the history one version longer on every run. A few ms at most.
atexit.register(_closer.wait, 5.0)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_closer.after_fork_in_child)


class _Pin:
    """An open descriptor on the file version last read or written (see ``write_atomic``).

    A pin replaced by our own write is *retired*, not closed at once: once this thread releases
    the lock, retired pins go to the background ``_closer`` (see there why), except those whose
    version the write kept in the history (``linked``): closing them frees nothing, so this
    thread closes them itself.

    Each descriptor is kept with the ``os.close`` of the ``os`` that opened it (``_locking.Descriptor``).
    """

    def __init__(self) -> None:
        self._current: _locking.Descriptor | None = None
        self.retired: list[_locking.Descriptor] = []
        self.linked: list[_locking.Descriptor] = []  # retired, their inode kept by a history link

    @property
    def fd(self) -> int | None:
        return None if self._current is None else self._current[0]

    def set(self, fd: int | None) -> None:
        old, self._current = self._current, None if fd is None else (fd, os.close)
        if old is not None:
            _locking.close_all([old])

    def replace(self, fd: int, *, linked: bool = False) -> None:
        """Pin ``fd`` and retire the previous pin (closed later by ``close_retired``); ``linked``:
        its version has a name in the history, so closing it frees no inode."""
        old, self._current = self._current, (fd, os.close)
        if old is not None:
            (self.linked if linked else self.retired).append(old)

    @property
    def pending(self) -> bool:
        """Whether retired pins wait for ``close_retired``."""
        return bool(self.retired or self.linked)

    def close_retired(self) -> None:
        _locking.close_all(self.linked)
        retired, self.retired = self.retired, []
        if retired:
            _closer.close(retired)

    def close(self) -> None:
        self.set(None)
        _locking.close_all(self.linked)
        _locking.close_all(self.retired)  # at once: a closed store holds nothing open


# How many versions pushed out of a history are removed at once (see LocalFile._written): up to
# that many more than history= may be there between two prunes.
PRUNE_BATCH = 8


def byte_size(count: int) -> str:
    """A size as people read it: 512 bytes, 44.0 KB, 3.2 MB."""
    if count < 1024:
        return f"{count} byte{'' if count == 1 else 's'}"
    size = count / 1024
    for unit in ("KB", "MB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _version(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class LocalFile(Storage):
    """A JSON file on a local filesystem, locked with ``filelock`` on ``<file>.lock``."""

    def __init__(self, path: str, *, durable: bool, lock: str = "flock", history: int = 0) -> None:
        self.location = path
        # A status file that is a symlink is followed: the target is replaced in its own
        # directory and the link is kept, so a run folder may point at shared storage.
        self._target = os.path.realpath(path)
        self._directory, self._name = os.path.split(self._target)
        self._durable = durable
        self._temp_pattern = _names.temp_pattern(self._name)
        self._lock_file = os.path.join(self._directory, _names.lock_name(self._name))
        self._version: tuple[int, int, int, int] | None = None
        self._mode: int | None = None
        self._owner: tuple[int, int] | None = None
        self._own_ids: tuple[int, int] | None = None  # (uid, gid) of the file our last write made
        self._pin = _Pin()
        weakref.finalize(self, self._pin.close)
        # Fetched now, so that a bad or conflicting lock= fails at open.
        self._lock_mode = lock
        self._path_lock: _locking.PathLock | None = _locking.lock_for(self.lock_file, lock, self._lease_file(), target=self._target)
        self._lock_generation = _locking.generation
        self._directory_ready = False
        self._keep = history  # versions kept; 0: none
        # The number the version now in the file gets in the history, and whether it is kept
        # already; None: find out from the directory (after a read: another writer's version).
        self._slot: tuple[int, bool] | None = None
        self._prune_all = True  # the next prune lists the directory (see _written)
        # [done, queued] for the prunes of this store's history (see _written): every version
        # numbered up to ``done`` is gone (set by the prune that removed them, on the closer
        # thread: a cell, so that no job holds a reference to this object; None: not known), and
        # ``queued`` is the newest number a prune was queued for.
        self._pruned: list[int] = [0, 0]
        self._prune_known = False
        # A version number known to be kept (the one our last write's version gets from the next
        # writer), for next_slot to look up from after another process wrote; None: list.
        self._known: int | None = None
        self._unkept: TrainingStatusHistoryWarning | None = None  # reported once the write is in

    @property
    def target(self) -> str:
        return self._target

    @property
    def lock_file(self) -> str:  # type: ignore[override]  # a read-only view of the base attribute
        return self._lock_file

    def _lease_file(self) -> str:
        return os.path.join(self._directory, _names.lease_name(self._name))

    # -- reading -------------------------------------------------------------------------------

    def read(self) -> bytes | None:
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self._target, flags)
        except FileNotFoundError:
            self._remember(None, None)
            return None
        except OSError as exc:
            raise self._read_error(exc) from exc
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                os.close(fd)
                raise TrainingStatusReadError(
                    f"Cannot read {self.location}: it is a directory, not a status file. Move the "
                    "directory away or open the store on another path.",
                    path=self.location,
                )
        except OSError as exc:
            if isinstance(exc, TrainingStatusReadError):
                raise
            os.close(fd)
            raise self._read_error(exc) from exc
        try:
            chunks = []
            while True:
                chunk = os.read(fd, max(st.st_size + 1, 65536))
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError as exc:
            os.close(fd)
            raise self._read_error(exc) from exc
        except BaseException:
            os.close(fd)
            raise
        self._slot = None
        # The version read before is retired, not closed here: when another process replaced it,
        # this may be its last descriptor, and freeing its inode took 0.15 of a 0.19 ms reload
        # under the lock (issue 13). Closed once the lock is let go, on the closer thread.
        self._remember(fd, st, retire=True)
        if self._pin.pending and (self._path_lock is None or not self._path_lock.held_here()):
            self._pin.close_retired()
        return b"".join(chunks)

    def _read_error(self, exc: OSError) -> TrainingStatusReadError:
        if exc.errno == errno_codes.ENAMETOOLONG:
            return TrainingStatusReadError(
                f"Cannot read {self.location}: {exc.strerror or exc}. Nothing was changed: {self._too_long()}, "
                "then open the store again.",
                path=self.location,
            )
        return TrainingStatusReadError(
            f"Cannot read {self.location}: {exc.strerror or exc}. The file was left as it is; fix "
            "its permissions or path and open the store again.",
            path=self.location,
        )

    def _too_long(self) -> str:
        size = len(os.fsencode(self._name))
        if size > _names.NAME_MAX:
            return (f"its name has {size} bytes and a file name can have at most {_names.NAME_MAX}, so "
                    "give the status file a shorter name")
        return "the path is longer than this system allows, so use a shorter path"

    def _remember(self, fd: int | None, st: os.stat_result | None, *, retire: bool = False) -> None:
        if retire and fd is not None:
            self._pin.replace(fd)
        else:
            self._pin.set(fd)
        self._version = None if st is None else _version(st)
        self._mode = None if st is None else st.st_mode
        self._owner = None if st is None else (st.st_uid, st.st_gid)

    def _remember_written(self, fd: int, st: os.stat_result, *, linked: bool = False) -> None:
        self._pin.replace(fd, linked=linked)
        self._version = _version(st)
        self._mode = st.st_mode
        self._owner = (st.st_uid, st.st_gid)

    def forget(self) -> None:
        self._version = None

    def changed(self) -> bool:
        if self._lock_mode == "soft":
            # On a shared filesystem a stat may not show another machine's
            # write yet (NFS caches attributes for seconds); opening the file to read it is what
            # close-to-open consistency keeps current. So every write reads the file first.
            return True
        try:
            st = os.stat(self._target)
        except FileNotFoundError:
            return self._version is not None
        except OSError:
            return True  # let the read that follows report it
        # A chmod or chown since our last write is kept by the next one.
        self._mode = st.st_mode
        self._owner = (st.st_uid, st.st_gid)
        return _version(st) != self._version

    # -- writing -------------------------------------------------------------------------------

    def lock(self, timeout: float | None, *, configured: float | None = None) -> ContextManager[object]:
        return self._hold(self._lock(), timeout, configured, None)

    def lock_or_hand_over(self, timeout: float | None, offer: _mailbox.Offer, *,
                          configured: float | None = None) -> ContextManager[bool]:
        offer.durable = self._durable
        return self._hold(self._lock(), timeout, configured, offer)

    def _lock(self) -> _locking.PathLock:
        if self._lock_generation != _locking.generation or self._path_lock is None:
            self._path_lock = _locking.lock_for(self.lock_file, self._lock_mode, self._lease_file(), target=self._target)
            self._lock_generation = _locking.generation
        self._ensure_directory()
        return self._path_lock

    @property
    def kept_versions(self) -> int:  # type: ignore[override]  # a read-only view of the base attribute
        return self._keep

    def collect(self, meta: Callable[[], bytes]) -> list[_mailbox.Request]:
        if self._path_lock is None or self._lock_generation != _locking.generation:
            return []
        return self._path_lock.collect(meta=meta, durable=self._durable)

    def acknowledge(self, requests: list[_mailbox.Request]) -> None:
        if requests and self._path_lock is not None:
            self._path_lock.acknowledge(requests)

    @contextlib.contextmanager
    def _hold(self, path_lock: _locking.PathLock, timeout: float | None, configured: float | None,
              offer: _mailbox.Offer | None) -> Iterator[bool]:
        try:
            with contextlib.ExitStack() as stack:
                try:
                    handed = stack.enter_context(path_lock.hold(timeout, path=self.location, configured=configured, offer=offer))
                except TrainingStatusWriteError as exc:
                    # The run folder was deleted under a running store (rm -r run_logs): recreate
                    # it, as a new store would, instead of failing every write from now on.
                    if exc.errno != errno_codes.ENOENT or os.path.isdir(self._directory):
                        raise
                    self._directory_ready = False
                    self._ensure_directory()
                    handed = stack.enter_context(path_lock.hold(timeout, path=self.location, configured=configured, offer=offer))
                yield handed
        finally:
            # Once this thread lets go of the lock, free the files our writes replaced.
            if self._pin.pending and not path_lock.held_here():
                self._pin.close_retired()

    def _ensure_directory(self) -> None:
        if self._directory_ready:
            return
        try:
            _atomic.ensure_directory(self._directory, durable=self._durable)
        except OSError as exc:
            raise self._write_error(exc, "creating its directory") from exc
        self._directory_ready = True

    def replace(self, data: bytes) -> None:
        if self._version is not None and self._mode is not None:
            mode = self._mode
            # Keep another user's file theirs when root rewrites it; otherwise nothing to do. The
            # owner this process's files get is known from its last write (no geteuid/getegid).
            ours = self._own_ids or (os.geteuid(), os.getegid())
            owner = self._owner if self._owner != ours else None
        else:
            mode, owner = default_file_mode(), None
        kept: list[int | None] = [None]  # the number the replaced version got in the history
        made: list[str] = []  # the history name this write gave it, if it gave one

        def keep() -> None:
            kept[0] = self._keep_previous(made)

        keeping = self._keep and self._version is not None
        try:
            fd, st = _atomic.write_atomic(self._target, data, durable=self._durable, mode=mode, owner=owner,
                                          before_replace=keep if keeping else None)
        except _atomic.ReplacedNotSynced as exc:
            self._remember_written(exc.fd, exc.st)
            self._written(kept[0])
            error = self._write_error(exc.cause, "syncing its directory")
            error._replaced = True  # type: ignore[attr-defined]  # tells the store the file changed
            raise error from exc.cause
        except OSError as exc:
            self._unkept = None  # nothing was replaced: the version is still the file itself
            for name in made:  # the rename failed: the file is still that version, kept twice
                with contextlib.suppress(OSError):
                    os.unlink(name)
                self._slot = None
            if exc.errno == errno_codes.ENOENT and not os.path.isdir(self._directory):
                self._directory_ready = False  # removed under us: recreated on the next write
            if exc.errno in (errno_codes.EACCES, errno_codes.EPERM) and mode & 0o600 != 0o600:
                # The new version keeps the file's mode; one its owner cannot read and write
                # cannot be written (and pinned) by this non-root process.
                raise TrainingStatusWriteError(
                    f"Could not save {self.location}: the file's mode is {stat.filemode(mode)} "
                    f"({mode & 0o7777:#o}), which does not let its owner read and write it, and a "
                    "rewrite keeps the file's mode. The file was left as it was; give its owner "
                    f"read and write (chmod u+rw {self.location}), then set the value again.",
                    path=self.location,
                    errno=exc.errno,
                ) from exc
            raise self._write_error(exc, "writing it") from exc
        # The version replaced lives on in the history when this write kept it (``made``; one kept
        # already, by another writer, may be pruned by now): its pin is closed here, cheaply.
        self._remember_written(fd, st, linked=bool(made))
        if owner is None:
            self._own_ids = (st.st_uid, st.st_gid)  # what a file this process creates here gets
        self._written(kept[0])
        logger.debug("wrote %s (%d bytes)", self.location, len(data))
        if _atomic.observer is not None:  # trainstatus.testing: a kill once the write is all done
            _atomic.observer("returned", self._target, "", -1)

    def _keep_previous(self, made: list[str]) -> int | None:
        """Keep the version about to be replaced in the history; its number, or None if not kept.

        A failure here never fails the write: the new version matters more than an old one. The
        name given is appended to ``made`` (not when the version was kept already).
        """
        assert self._version is not None
        kept = self._directory
        try:
            for _ in range(2):
                if self._slot is None:
                    after, self._known = self._known, None
                    self._slot = _history.next_slot(self._directory, self._name, self._version[:2], after)
                    if after is None:
                        self._prune_all = True  # numbers found by a listing: the next prune lists too
                sequence, done = self._slot
                if done:
                    return sequence
                kept = os.path.join(self._directory, _names.history_name(self._name, sequence))
                try:
                    _atomic.keep_previous(self._target, kept, durable=self._durable)
                except FileExistsError:
                    self._slot = None  # taken by a writer that did not tell us: look again
                    continue
                made.append(kept)
                self._slot = (sequence, True)
                return sequence
            raise FileExistsError(errno_codes.EEXIST, "the next version number was taken twice", kept)
        except FileNotFoundError:
            return None  # removed meanwhile: nothing to keep
        except OSError as exc:
            self._slot = self._known = None
            self._unkept = (TrainingStatusHistoryWarning(
                f"Could not keep the version of {self.location} that this write replaces in its "
                f"history ({kept}): {exc.strerror or exc}. The write goes on; that version is "
                "not kept. Free some space or check the directory's permissions, or open the "
                "store with history=0 to stop keeping versions.",
                path=self.location,
            ))
        return None

    def _written(self, kept: int | None) -> None:
        """After a write replaced the file: the new version's slot; old versions pruned later.

        A version that could not be kept is reported by the store (``take_warning``) once the new
        file is in place and in its memory: a warning turned into an error (``-W error``) then
        cannot undo the write or leave memory behind the file.
        """
        if not self._keep:
            return
        if kept is None:
            self._slot = None
            return
        self._slot = (kept + 1, False)
        self._known = kept  # kept a moment ago: a reload's next_slot looks up from here
        directory, name, keep = self._directory, self._name, self._keep
        last = kept - keep  # the newest number to go
        if last <= 0:
            return
        # Each write pushes one version out; removing it at once meant waking the closer thread
        # at every write (issue 23). The versions pushed out are removed PRUNE_BATCH at a time, by
        # number, from the first one not removed yet: no listing of the directory, and no unlink
        # of a number that cannot be there. The directory is listed instead when the numbers came
        # from a listing (the first write of a store, or one after another writer's: versions
        # another history= left may be there), when the numbers are not known, and every 64th
        # write. Versions another writer added in between have numbers in that range too.
        cell = self._pruned
        if self._prune_all or kept % 64 == 0 or not self._prune_known or last - max(cell) > 2 * PRUNE_BATCH + keep:
            self._prune_all, self._prune_known = False, True
            cell[1] = last

            def listing() -> None:
                oldest = _history.prune(directory, name, keep)
                cell[0] = last if oldest is None else max(last, oldest - 1)

            _closer.later((directory, name), listing)
            return

        def batch() -> None:
            # The range is taken when the job runs (jobs run one after the other): one queued
            # before and replaced by this one, or one that ran meanwhile, is covered.
            done = cell[0]
            if last > done and not _history.prune_range(directory, name, done + 1, last):
                _history.prune(directory, name, keep)  # the newest to go was not there: list
            cell[0] = max(cell[0], last)

        if last - max(cell) >= PRUNE_BATCH:
            cell[1] = last
            _closer.later((directory, name), batch)
        else:
            _closer.defer((directory, name), batch)  # replaced by the next write's, or run by wait()

    def take_warning(self) -> TrainingStatusWarning | None:
        unkept, self._unkept = self._unkept, None
        return unkept

    def history(self) -> list[_history.Version]:
        if not self._keep:
            return []  # history=0: none kept, and none restored from what others left
        try:
            return _history.versions(self._directory, self._name)
        except OSError as exc:  # a directory we may write but not list: no history to offer
            logger.debug("could not list the history of %s: %s", self.location, exc)
            return []

    def _history_space(self) -> str:
        """On a full disk: what the history beside the file holds and how to free it ('' if none)."""
        try:
            kept = _history.versions(self._directory, self._name)
        except OSError:
            return ""
        if not kept:
            return ""
        names = os.path.basename(kept[0].path)
        if len(kept) > 1:
            names += f" to {os.path.basename(kept[-1].path)}"
        count = f"{len(kept)} earlier version{'s' if len(kept) > 1 else ''}"
        keep, removes = (2, "all but the newest 2") if len(kept) > 2 else (0, "them" if len(kept) > 1 else "it")
        import shlex  # here: a full disk is rare, and import trainstatus stays light

        # Quoted, so that the command copied into a shell gets a path with spaces as one argument.
        return (f" (the history beside the file holds {count}, {names}, {byte_size(sum(v.size for v in kept))} "
                f"together: `trainstatus history {shlex.quote(self.location)} --prune --keep {keep}` removes {removes}, "
                "and a store opened with a smaller history= keeps fewer)")

    def _write_error(self, exc: OSError, step: str) -> TrainingStatusWriteError:
        # What to do; what happened is the error's own strerror, already in the message.
        full = self._history_space() if exc.errno in (errno_codes.ENOSPC, errno_codes.EDQUOT) else ""
        what = {
            errno_codes.ENOSPC: f"the disk is full; free some space{full}",
            errno_codes.EDQUOT: f"free some space{full} or raise the quota",
            errno_codes.EROFS: "remount the filesystem writable or use another path",
            errno_codes.EACCES: "fix the permissions of the directory",
            errno_codes.EPERM: "fix the permissions of the directory",
            errno_codes.ENAMETOOLONG: self._too_long(),
        }.get(exc.errno or 0, "check the disk and the path")
        if step == "syncing its directory":
            outcome = "The new content is in the file but may not survive a power loss"
        else:
            outcome = "The file was left as it was"
        return TrainingStatusWriteError(
            f"Could not save {self.location} ({step}): {exc.strerror or exc}. {outcome}; "
            f"{what}, then set the value again.",
            path=self.location,
            errno=exc.errno,
        )

    def keep_copy(self, data: bytes | None = None) -> str:
        """Give the file a second name, ``<file>.corrupt-<UTC time>[-N]``; return it.

        The file keeps its own name too. A name already taken is never replaced. Where hard links
        are not available the bytes (``data``, or read from the file) are copied to the new name
        exclusively and synced.
        """
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        base = os.path.join(self._directory, _names.copy_stem(self._name) + _names.COPY_MARK + stamp)
        aside, n = base, 0
        while True:
            try:
                os.link(self._target, aside, follow_symlinks=False)
                return aside
            except FileExistsError:
                pass
            except OSError as exc:
                if exc.errno not in (errno_codes.EPERM, errno_codes.ENOTSUP, errno_codes.EXDEV, errno_codes.EMLINK):
                    raise
                if data is None:
                    with open(self._target, "rb") as f:
                        data = f.read()
                try:
                    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                except FileExistsError:
                    pass
                else:
                    try:
                        _atomic.write_all(fd, data)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    return aside
            n += 1
            aside = f"{base}-{n}"

    def move_aside(self) -> str:
        # The second name first, so the damaged bytes always have a name: a crash between the
        # two steps leaves two names, never none.
        aside = self.keep_copy()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._target)
        if self._durable:
            try:
                _atomic.sync_directory(self._directory)
            except OSError as exc:  # the move happened; after a power loss it may be redone
                logger.debug("could not sync %s after keeping a damaged file aside: %s", self._directory, exc)
        self._remember(None, None)
        logger.debug("moved damaged %s aside to %s", self.location, aside)
        return aside

    def leftovers(self) -> list[str]:
        try:
            names = os.listdir(self._directory)
        except OSError:
            return []
        # filter over fullmatch runs in C: a run folder may hold dozens of history versions.
        return [os.path.join(self._directory, name) for name in filter(self._temp_pattern.fullmatch, names)]

    def cleanup(self) -> None:
        for temp in self.leftovers():
            with contextlib.suppress(OSError):
                os.unlink(temp)
                logger.debug("removed a temp file left by a killed writer: %s", temp)

    def close(self) -> None:
        _closer.flush((self._directory, self._name))  # a batch of versions still to go
        self._pin.close()
        self._path_lock = None  # its lock file descriptor closes once no store uses it
