"""``LocalFile``: the storage seam (``base.Storage``) for a status file on a local filesystem.

It reads the file and pins the version read (``pin``), tells whether another process replaced it
since, takes the file's lock (``_lock.path_lock``), replaces the file by the write protocol
(``atomic``) and lists the earlier versions kept beside it (``history``). Its helpers each answer
one question: which version a write keeps in the history and when the oldest go (``keeper``),
what is kept aside and what killed writers left (``aside``), what its errors say (``messages``).
It imports those modules of this package, the lock module and the errors.
"""

from __future__ import annotations

import contextlib
import errno as errno_codes
import os
import stat
import weakref
from collections.abc import Callable, Iterator

from . import aside as _aside, atomic as _atomic, history as _history, filenames as _names
from .base import Conflict, Storage
from .keeper import _Keeper
from .pin import _Pin
from .._lock import path_lock as _locking
from .. import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log
from .._errors import TrainingStatusError, TrainingStatusReadError, TrainingStatusWarning, TrainingStatusWriteError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from .._lock import mailbox as _mailbox
    from typing import ContextManager

__all__ = ["LocalFile", "default_file_mode"]

logger = logging.getLogger("trainstatus")


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


def _version(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _made_anew(target: str, version: tuple[int, int, int, int]) -> bool:
    """Whether another file than ``version`` is at ``target`` (none there is not another)."""
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) != version[:2]


# What a failed read or write says (``messages``) is imported only when one fails: every store pays
# nothing for it at start-up.
def _read_error(location: str, target: str, exc: OSError) -> TrainingStatusReadError:
    from .messages import read_error

    return read_error(location, target, exc)


def _write_error(location: str, target: str, exc: OSError, step: str) -> TrainingStatusWriteError:
    from .messages import write_error

    return write_error(location, target, exc, step)


def _marked(exc: OSError, target: str) -> bool:
    """Whether an ``EPERM`` may come from chattr's immutable or append-only mark, not the mode."""
    from .messages import marked

    return exc.errno == errno_codes.EPERM and marked(target)


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
        self._keeper = _Keeper(self._target, path, history, durable=durable)  # what the history keeps

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
        locking = self._held_lock()
        while True:
            fd, st = self._open_current()
            if fd is None or st is None:
                return None
            if locking is None:
                break
            try:
                # Under the lock, the version read is the one the write builds on: locked
                # (``_lock.version``), or, replaced meanwhile by a writer we waited for, read anew.
                if locking.take_version(fd, (st.st_dev, st.st_ino), self._target, path=self.location):
                    break
            except BaseException as exc:
                os.close(fd)
                if isinstance(exc, OSError) and not isinstance(exc, TrainingStatusError):  # (a timeout is one)
                    raise _read_error(self.location, self._target, exc) from exc
                raise
            os.close(fd)
        try:
            chunks = []
            while True:
                chunk = os.read(fd, max(st.st_size + 1, 65536))
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError as exc:
            os.close(fd)
            raise _read_error(self.location, self._target, exc) from exc
        except BaseException:
            os.close(fd)
            raise
        self._keeper.slot = None
        # The version read before is retired, not closed here: when another process replaced it,
        # this may be its last descriptor, and freeing its inode took 0.15 of a 0.19 ms reload
        # under the lock (issue 13). Closed once the lock is let go, on the closer thread.
        self._remember(fd, st, retire=True)
        if self._pin.pending and (self._path_lock is None or not self._path_lock.held_here()):
            self._pin.close_retired()
        return b"".join(chunks)

    def _open_current(self) -> tuple[int | None, os.stat_result | None]:
        """The file at the path, open, and its stat; (None, None) when there is none (forgotten)."""
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self._target, flags)
        except FileNotFoundError:
            self._remember(None, None)
            return None, None
        except OSError as exc:
            raise _read_error(self.location, self._target, exc) from exc
        try:
            st = os.fstat(fd)
        except BaseException as exc:
            os.close(fd)
            if isinstance(exc, OSError):
                raise _read_error(self.location, self._target, exc) from exc
            raise
        if stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise TrainingStatusReadError(
                f"Cannot read {self.location}: it is a directory, not a status file. Move the "
                "directory away or open the store on another path.",
                path=self.location,
            )
        return fd, st

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
        if _version(st) != self._version:
            return True
        return not self._version_locked()

    def _held_lock(self) -> _locking.PathLock | None:
        """The lock, if this thread holds it (then the versions a write builds on are locked)."""
        path_lock = self._path_lock
        held = path_lock is not None and self._lock_generation == _locking.generation and path_lock.held_here()
        return path_lock if held else None

    def _version_locked(self) -> bool:
        """Under the lock: lock the version last read or written (``_lock.version``), found in
        place; False if a writer we waited for replaced it meanwhile."""
        locking, fd, version = self._held_lock(), self._pin.fd, self._version
        if locking is None or fd is None or version is None or locking.versions.holds(version[:2]):
            return True
        try:
            return locking.take_version(fd, version[:2], self._target, path=self.location)
        except TrainingStatusError:  # out of time (an OSError too, as a TimeoutError)
            raise
        except OSError:
            return False  # as if replaced: the read that follows reports what fails

    def exclusive(self) -> bool:
        # Nothing to lock while there is no file: a first version may still lose to another writer
        # that got in through a lock file deleted by hand (its link then fails: ``Conflict``).
        return self._version is not None or self._path_lock is None or not self._path_lock.versions.usable()

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
        return self._keeper.keep

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
            raise _write_error(self.location, self._target, exc, "creating its directory") from exc
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
        keeper = self._keeper

        keeping = keeper.keep and self._version is not None
        locking = self._held_lock()
        if locking is not None and not self._version_locked():
            raise Conflict  # replaced since it was read: read it again and lay the change over it

        def keep() -> None:  # just before the rename
            if locking is not None and self._version is not None and _made_anew(self._target, self._version):
                raise Conflict  # deleted by hand with the lock file, and made anew by another writer
            if keeping:
                kept[0] = keeper.keep_previous(made, self._version)

        try:
            fd, st = _atomic.write_atomic(self._target, data, durable=self._durable, mode=mode, owner=owner,
                                          before_replace=keep if keeping or locking is not None else None,
                                          lock_new=None if locking is None else locking.versions.adopt,
                                          create=self._version is None and locking is not None)
        except _atomic.ReplacedNotSynced as exc:
            self._remember_written(exc.fd, exc.st)
            keeper.written(kept[0])
            error = _write_error(self.location, self._target, exc.cause, "syncing its directory")
            error._replaced = True  # type: ignore[attr-defined]  # tells the store the file changed
            raise error from exc.cause
        except OSError as exc:
            keeper.unkept = None  # nothing was replaced: the version is still the file itself
            for name in made:  # the rename failed: the file is still that version, kept twice
                with contextlib.suppress(OSError):
                    os.unlink(name)
                keeper.slot = None
            if exc.errno == errno_codes.ENOENT and not os.path.isdir(self._directory):
                self._directory_ready = False  # removed under us: recreated on the next write
            if isinstance(exc, FileExistsError) and self._version is None:
                # Another writer made the file since we found none (it got in through a lock file
                # deleted by hand, see _lock.version): build on its version instead.
                raise Conflict from exc
            if (exc.errno == errno_codes.ENOENT and self._path_lock is not None and self._directory_ready
                    and self._path_lock.lock_file_lost()):
                # The lock file deleted by hand (the folder is still there): another writer locked the
                # one made in its place and removed our temp file as a killed writer's leftover.
                # Read again (the other waits for the version we hold) and written again.
                raise Conflict from exc
            if (exc.errno in (errno_codes.EACCES, errno_codes.EPERM) and mode & 0o600 != 0o600
                    and os.geteuid() != 0 and not _marked(exc, self._target)):
                # The new version keeps the file's mode; one its owner cannot read and write
                # cannot be written (and pinned) by this non-root process (root's are).
                from .messages import mode_error

                raise mode_error(self.location, mode, exc) from exc
            raise _write_error(self.location, self._target, exc, "writing it") from exc
        # The version replaced lives on in the history when this write kept it (``made``; one kept
        # already, by another writer, may be pruned by now): its pin is closed here, cheaply.
        self._remember_written(fd, st, linked=bool(made))
        if owner is None:
            self._own_ids = (st.st_uid, st.st_gid)  # what a file this process creates here gets
        keeper.written(kept[0])
        logger.debug("wrote %s (%d bytes)", self.location, len(data))
        if _atomic.observer is not None:  # trainstatus.testing: a kill once the write is all done
            _atomic.observer("returned", self._target, "", -1)

    def take_warning(self) -> TrainingStatusWarning | None:
        keeper = self._keeper
        unkept, keeper.unkept = keeper.unkept, None
        return unkept

    def history(self) -> list[_history.Version]:
        if not self._keeper.keep:
            return []  # history=0: none kept, and none restored from what others left
        try:
            return _history.versions(self._directory, self._name)
        except OSError as exc:  # a directory we may write but not list: no history to offer
            logger.debug("could not list the history of %s: %s", self.location, exc)
            return []

    # -- copies kept aside, leftovers (see aside) -------------------------------------------------

    def keep_copy(self, data: bytes | None = None) -> str:
        """Give the file a second name, ``<file>.corrupt-<UTC time>[-N]``; return it (``_aside.keep_copy``)."""
        return _aside.keep_copy(self._target, data)

    def move_aside(self) -> str:
        aside = _aside.move_aside(self._target, durable=self._durable)
        self._remember(None, None)
        logger.debug("moved damaged %s aside to %s", self.location, aside)
        return aside

    def leftovers(self) -> list[str]:
        return _aside.leftovers(self._directory, self._temp_pattern)

    def cleanup(self) -> None:
        _aside.remove_leftovers(self.leftovers())

    def close(self) -> None:
        self._keeper.close()  # a batch of versions still to go
        self._pin.close()
        self._path_lock = None  # its lock file descriptor closes once no store uses it
