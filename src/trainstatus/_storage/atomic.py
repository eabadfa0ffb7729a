"""The write protocol: replace a file with new bytes so a crash leaves the old or the new file.

Each step is a module-level function called through this module from ``write_atomic`` alone, so a
test can replace any one of them (``monkeypatch.setattr(_storage.atomic, "sync_file", failing)``) and
check what a fault there leaves behind. On any failure before the rename the temp file is removed
and the first error is re-raised; a failing clean-up never hides it.

Why each step:
- the temp file is created exclusively (``O_EXCL``, no symlink followed) in the target's directory,
  with mode 0600, so nobody else can read it half-written or redirect it, and so the rename stays
  within one filesystem and is atomic;
- ``fsync`` before the rename, because without it a power loss can leave the new name pointing at
  a file whose data never reached the disk (ext4 ``auto_da_alloc`` narrows, but does not close, that
  window);
- the permission bits are set before the rename, so the file never appears with the wrong ones;
- ``fsync`` of the directory after the rename, because the rename itself lives in the directory and
  is not durable until the directory is;
- a file's first version is put in place by ``link`` (``place_new``), not a rename: the lock may have
  let in another writer that made the file meanwhile (a lock file deleted by hand, ``_lock.version``),
  and a link fails where a rename would replace that writer's file.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Callable
from . import filenames as _names

__all__ = [
    "ReplacedNotSynced",
    "discard_temp",
    "ensure_directory",
    "keep_previous",
    "observer",
    "open_temp",
    "place_new",
    "replace",
    "set_mode",
    "set_owner",
    "token",
    "sync_directory",
    "sync_file",
    "write_all",
    "write_atomic",
]

_TEMP_MODE = 0o600  # while written: nobody else reads it half-written
_PIN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


# Told each named point a write passes: ``observer(point, target, temp, fd)`` with point one of
# "created", "written", "synced", "renamed", "dir-synced" (here) and "returned" (``LocalFile``,
# once the write's bookkeeping is done); ``fd`` is the temp file's, or -1 once closed. None but
# inside ``trainstatus.testing`` (simulated kills), where it may raise to stop the write there.
observer: Callable[[str, str, str, int], None] | None = None


class ReplacedNotSynced(Exception):
    """The new file is in place but the directory sync failed: it may not survive a power loss."""

    def __init__(self, cause: OSError, fd: int, st: os.stat_result) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fd = fd
        self.st = st


def ensure_directory(directory: str, *, durable: bool) -> None:
    """Create ``directory`` and missing parents; sync each new entry into its parent."""
    if os.path.isdir(directory):
        return
    parent = os.path.dirname(directory)
    if parent and parent != directory:
        ensure_directory(parent, durable=durable)
    try:
        os.mkdir(directory)
    except FileExistsError:
        return
    if durable:
        sync_directory(parent or ".")


# The source of temp file names: a keyed hash (BLAKE2b) of a counter, the key drawn from the
# system once per process (a getrandom per name was a system call of every write, issue 23), again
# in a forked child. Not a seeded generator (random.Random): its output gives its state away after
# a few hundred names, and another user of a shared folder could then take the next ones in
# advance. hashlib is imported at the first write, not with trainstatus.
_names_key: bytes | None = None
_names_count = itertools.count()


def token() -> str:
    """16 unpredictable hex digits for a temp file's name. Unguessable names are not what keeps the
    write safe (``O_EXCL`` and ``O_NOFOLLOW`` are: a name taken is drawn again), only what keeps
    another user from taking them in advance."""
    global _names_key
    if _names_key is None:
        _names_key = os.urandom(32)
    import hashlib

    return hashlib.blake2b(next(_names_count).to_bytes(8, "little"), key=_names_key, digest_size=8).hexdigest()


def _new_names_in_child() -> None:
    global _names_key
    _names_key = None  # else parent and child would draw the same names


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_names_in_child)


_owner_bits_kept: bool | None = None


def _umask_keeps_owner_bits() -> bool:
    """Whether a file created 0600 is 0600 (the umask takes none of the owner's bits), read from
    /proc once per process; False when it cannot be read (the mode is then set every write)."""
    global _owner_bits_kept
    if _owner_bits_kept is None:
        _owner_bits_kept = False
        try:
            with open("/proc/self/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Umask:"):
                        _owner_bits_kept = int(line.split()[1], 8) & _TEMP_MODE == 0
                        break
        except (OSError, ValueError):
            pass
    return _owner_bits_kept


def open_temp(directory: str, name: str) -> tuple[int, str]:
    """Create a new, empty temp file beside the target; (fd, path)."""
    for _ in range(100):
        temp = os.path.join(directory, _names.temp_name(name, token()))
        try:
            return os.open(temp, _OPEN_FLAGS, _TEMP_MODE), temp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "could not find a free temp file name", directory)


# The errors of a filesystem (or a directory's quota of links) that has no hard link to give.
NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS})


def keep_previous(target: str, kept: str, *, durable: bool) -> None:
    """Give the version about to be replaced a second name, ``kept`` (the store's history).

    Called before the rename, with the lock held. The link's directory entry is made durable by
    the directory fsync after the rename (same directory). Without hard links the bytes are
    copied to a temp file, synced when ``durable``, and renamed to ``kept``, so that a crash
    never leaves a kept version half-written.
    """
    try:
        os.link(target, kept, follow_symlinks=False)
        return
    except OSError as exc:
        if exc.errno not in NO_HARD_LINKS:
            raise
    with open(target, "rb") as f:
        data = f.read()
        source = os.fstat(f.fileno())
    directory, name = os.path.split(target)
    fd, temp = open_temp(directory, name)
    try:
        write_all(fd, data)
        os.fchmod(fd, stat.S_IMODE(source.st_mode))
        # The version's own time, as a link would keep it: the history shows when it was written.
        os.utime(fd, ns=(source.st_atime_ns, source.st_mtime_ns))
        if durable:
            os.fsync(fd)
        written, fd = fd, -1
        os.close(written)
        # The lock is held, so nobody else takes this number (rename, unlike link, would not say).
        os.replace(temp, kept)
    except BaseException:
        discard_temp(fd, temp)
        raise


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def set_mode(fd: int, mode: int) -> None:
    """Give the temp file the permission bits the target should have."""
    os.fchmod(fd, mode)


def set_owner(fd: int, owner: tuple[int, int]) -> None:
    """Give the temp file the target's owner and group (only root may give another owner)."""
    try:
        os.fchown(fd, *owner)
    except PermissionError:
        pass  # not root: the file becomes ours, as with any editor's save


def sync_file(fd: int) -> None:
    """Make the file's data durable before its name can point at it."""
    os.fsync(fd)


def replace(temp: str, target: str) -> None:
    """Atomically put the temp file in the target's place."""
    os.replace(temp, target)


def place_new(temp: str, target: str) -> None:
    """Put the temp file in place as the first version: unlike a rename, ``link`` fails
    (``FileExistsError``) when another writer made the file meanwhile, which then is not lost.
    Where the filesystem has no hard links, a rename (which cannot refuse)."""
    try:
        os.link(temp, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in NO_HARD_LINKS:
            raise
        os.replace(temp, target)
        return
    try:
        os.unlink(temp)
    except OSError:
        pass  # a second name of the new version: removed as a leftover by a later write


def sync_directory(directory: str) -> None:
    """Make a rename (or creation) in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard_temp(fd: int, temp: str) -> None:
    """Close and remove a temp file after a failure, never raising over the first error.

    ``fd`` is -1 once the temp file was closed: it is not closed again. (pyfakefs takes
    ``os.close(-1)`` for its newest open file, as a list index, and closes that.)
    """
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        os.unlink(temp)
    except OSError:
        pass


def write_atomic(
    target: str, data: bytes, *, durable: bool, mode: int, owner: tuple[int, int] | None = None,
    before_replace: Callable[[], None] | None = None,
    lock_new: Callable[[int, os.stat_result], None] | None = None,
    create: bool = False,
) -> tuple[int, os.stat_result]:
    """Replace ``target`` with ``data``; return a read-only fd on the new file and its stat.

    The fd is handed to the caller, who keeps it open: while it is open the inode cannot be freed,
    so its number cannot be reused by a later file, which keeps (inode, size, mtime) a reliable
    sign of whether anyone replaced the file since. It is read-only so that no stray write to it
    can ever change the file in place.

    ``before_replace`` runs once the new file is complete, just before the rename: the store keeps
    the version about to be replaced there (``keep_previous``), so that a write failing earlier
    leaves no trace in the history. ``lock_new`` is given the returned fd and its stat before the
    rename, to lock the new version (``_lock.version``). ``create``: there was no file; the new one is put in
    place by ``place_new``, which raises ``FileExistsError`` if another writer made one meanwhile.

    Raises the ``OSError`` of the failing step, with the target untouched and no temp file left;
    or ``ReplacedNotSynced`` when only the final directory sync failed.
    """
    directory, name = os.path.split(target)
    fd, temp = open_temp(directory, name)
    pin = -1
    try:
        if observer is not None:
            observer("created", target, temp, fd)
        write_all(fd, data)
        if observer is not None:
            observer("written", target, temp, fd)
        if owner is not None:
            set_owner(fd, owner)
        if stat.S_IMODE(mode) != _TEMP_MODE or not _umask_keeps_owner_bits():
            set_mode(fd, stat.S_IMODE(mode))  # a 0600 file's temp has its mode already
        if durable:
            sync_file(fd)
            if observer is not None:
                observer("synced", target, temp, fd)
        st = os.fstat(fd)
        pin = os.open(temp, _PIN_FLAGS)
        # Closed before the rename: close() may report a deferred write error (NFS does), and
        # then the target must still be untouched.
        written, fd = fd, -1
        os.close(written)
        if lock_new is not None:
            lock_new(pin, st)
        if before_replace is not None:
            before_replace()
        if create:
            place_new(temp, target)
        else:
            replace(temp, target)
        if observer is not None:
            observer("renamed", target, temp, -1)
    except BaseException:
        if pin >= 0:
            os.close(pin)
        discard_temp(fd, temp)  # fd is -1 once closed: discard_temp leaves it
        raise
    if durable:
        try:
            sync_directory(directory)
        except OSError as exc:
            raise ReplacedNotSynced(exc, pin, st) from exc
        except BaseException:
            os.close(pin)
            raise
        if observer is not None:
            try:
                observer("dir-synced", target, temp, -1)
            except BaseException:
                os.close(pin)
                raise
    return pin, st
