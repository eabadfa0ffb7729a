"""The files of checkpoint entries on disk: synced before an entry is recorded, removed after
it is dropped.

``sync_entry`` fsyncs what a new entry names (its files, the folders of a checkpoint folder, the
directories holding them) and ``sync_folders_above`` the folders above, up to the one shared with
the status file, so the record never outlives the data after a power loss; ``remove_unlisted``
removes the files of dropped entries that no entry lists any more. Its own module because
``CheckpointList`` and the ML-Agents plugin's checkpoint manager (``_mlagents.status.plugin``) both take
these steps, and the plugin needs nothing else of the list. Every fsync of a checkpoint goes
through ``_fsync`` here, so one patch of it sees them all.

Imports ``files`` and ``roots`` (the reading of an entry and its folder), ``_errors`` and ``_log``
only: never the store.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Mapping

from .files import _entry_files, _entry_paths, _is_folder, _join, _listed, bases
from .roots import Base
from .._errors import TrainingStatusCheckpointError
from .. import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["remove_unlisted", "sync_entry", "sync_folders_above"]

logger = logging.getLogger("trainstatus")


def remove_unlisted(dropped: Iterable[Any], document: Mapping[str, Any], root: str | None,
                    location: str, category: str | None = None) -> list[tuple[Any, str]]:
    """Remove the files of the ``dropped`` entries that no entry of ``document`` lists; return
    ``(entry, reason)`` for each file that could not be removed (one already gone is fine).

    ``root``: the folder the dropped entries' relative paths are under (None: the current
    directory), which is also that of ``category``'s entries (the list they were dropped from);
    those of the other categories are under the folder each records (``roots``), else ``root``.
    ``location``: the status file. Used by ``CheckpointList.add`` and by the ML-Agents plugin's
    checkpoint manager.
    """
    # A file still listed may be spelled differently (``./a``, a symlinked folder) or be the
    # same file under another name: compare by path and by inode. Both are stats, where
    # os.path.realpath would cost one lstat per path component of every listed file.
    under = {name: found.folder if isinstance(found, Base) else root
             for name, found in bases(document, location, root).items()}
    if category is not None:
        under[category] = root
    listed_paths: set[str] = set()
    listed_files: set[tuple[int, int]] = set()
    for listed_in, _, paths in _listed(document):
        for given in paths:
            path = _join(under.get(listed_in, root), given)
            listed_paths.add(path)
            with contextlib.suppress(OSError):
                kept = os.stat(path)
                listed_files.add((kept.st_dev, kept.st_ino))
    failed: list[tuple[Any, str]] = []
    for entry in dropped:
        folders: list[tuple[str, str]] = []
        folder_entry = _entry_paths(entry) is not None and _is_folder(entry)
        for index, (given, _) in enumerate(_entry_files(entry) or []):
            path = _join(root, given)
            try:
                info = os.stat(path)
                same_file = (info.st_dev, info.st_ino) in listed_files
                is_folder = folder_entry and index == 0 and stat.S_ISDIR(info.st_mode)
            except OSError:
                same_file = is_folder = False  # gone already (what we wanted), or os.remove says why below
            if path in listed_paths or same_file:
                logger.debug("trainstatus: kept %s, still listed in %s", path, location)
                continue
            if is_folder:  # a checkpoint folder: emptied of its recorded files first, below
                folders.append((given, path))
                continue
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append((entry, f"{given} could not be removed ({exc.strerror or exc})"))
            else:
                logger.debug("trainstatus: removed old checkpoint file %s", path)
        for given, folder in folders:
            failed += [(entry, reason) for reason in _remove_folder(entry, given, folder, root)]
    return failed


def _remove_folder(entry: Any, given: str, folder: str, root: str | None) -> list[str]:
    """Remove a dropped checkpoint folder once its recorded files are gone: the subfolders that
    held them, deepest first, then the folder. A folder still holding anything (a file nobody
    recorded) stays: only what the entry recorded is ours to remove."""
    inside: set[str] = set()
    for listed, _ in _entry_files(entry) or []:
        parent = os.path.dirname(_join(root, listed))
        while parent.startswith(folder + os.sep):
            inside.add(parent)
            parent = os.path.dirname(parent)
    failed: list[str] = []
    for path in [*sorted(inside, key=lambda p: p.count(os.sep), reverse=True), folder]:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                logger.debug("trainstatus: kept folder %s of an old checkpoint: it holds files not recorded", path)
            else:
                shown = given if path == folder else os.path.join(given, os.path.relpath(path, folder))
                failed.append(f"the folder {shown} could not be removed ({exc.strerror or exc})")
        else:
            logger.debug("trainstatus: removed old checkpoint folder %s", path)
    return failed


def _fsync(path: str, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0) | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_entry(entry: Mapping[str, Any], synced: list[tuple[str, str]], status_path: str, where: str,
               context: dict[str, Any]) -> None:
    """fsync each file, then each folder of a checkpoint folder (deepest first), then each
    directory holding one of those (once each), then the folders above (``sync_folders_above``)."""
    directories: dict[str, None] = {}  # real paths: a folder reached through a link once
    for path, _ in synced:
        directories[os.path.realpath(os.path.dirname(path))] = None
        # A symlink: its target's directory entry matters too.
        directories[os.path.dirname(os.path.realpath(path))] = None
    targets = [(path, os.path.isdir(path), name) for path, name in synced]
    done = {os.path.realpath(path) for path, directory, _ in targets if directory}
    targets += [(directory, True, directory) for directory in directories if directory not in done]
    for path, directory, name in targets:
        try:
            _fsync(path, directory=directory)
        except OSError as exc:
            raise TrainingStatusCheckpointError(
                f"Cannot record the checkpoint at steps {entry['steps']} of {where}: "
                f"syncing {'its directory ' if directory else ''}{name} to disk failed "
                f"({exc.strerror or exc}). Nothing was recorded or removed; check the disk, or pass "
                "synced=True if you made the files durable yourself.",
                file_path=name, errno=exc.errno, **context,
            ) from exc
    # Only from the outermost synced folders: those above the others were just synced.
    done |= set(directories)
    try:
        sync_folders_above([d for d in directories if not _inside(d, done)], status_path)
    except OSError as exc:
        raise TrainingStatusCheckpointError(
            f"Cannot record the checkpoint at steps {entry['steps']} of {where}: "
            f"syncing the folder {exc.filename} above it to disk failed ({exc.strerror or exc}). "
            "Nothing was recorded or removed; check the disk, or pass synced=True if you made "
            "the files and their folders durable yourself.",
            file_path=entry["file_path"], errno=exc.errno, **context,
        ) from exc


def sync_folders_above(directories: Iterable[str], status_path: str) -> None:
    """fsync the folders above ``directories`` up to the one they share with the status file.

    A folder made since the status file (``models/`` in a new run) is itself an entry of the
    folder above it, and so on up: until those are synced, a power loss can lose ``models/`` with
    the checkpoint in it while the list naming it survives. Above the folder shared with the
    status file nothing is new (the store syncs its own folders). Real paths on both sides, so a
    symlink in either does not send the walk to ``/``; nothing for a status file that is no
    local path (an object store: no folder to share).

    A folder this process may not open (a traverse-only group folder, mode 711) cannot be synced
    by it at all, and a filesystem that refuses directory fsync has nothing to sync: both are
    skipped. Any other error (EIO, say) is raised as an ``OSError`` naming the folder.
    """
    if not os.path.isabs(status_path):  # an s3:// URL, or ML-Agents' unbound "<memory>" store
        return
    status_dir = os.path.realpath(os.path.dirname(status_path))
    above: dict[str, None] = {}
    for directory in directories:
        current = os.path.realpath(directory)
        try:
            shared = os.path.commonpath([current, status_dir])
        except ValueError:  # different drives (Windows): nothing shared
            continue
        while current != shared:
            parent = os.path.dirname(current)
            if parent == current:  # the filesystem's root
                break
            above[parent] = None
            current = parent
    for folder in above:
        try:
            _fsync(folder, directory=True)
        except OSError as exc:
            if exc.errno not in _CANNOT_SYNC_A_FOLDER:
                raise OSError(exc.errno, exc.strerror, folder) from exc
            logger.debug("trainstatus: skipped syncing folder %s above a checkpoint: %s", folder, exc)


# Opening a folder without read permission (EACCES, EPERM); a filesystem without directory fsync
# (EINVAL, ENOTSUP/EOPNOTSUPP): nothing this process can do, and nothing it could make durable there.
_CANNOT_SYNC_A_FOLDER = frozenset({errno.EACCES, errno.EPERM, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})


def _inside(folder: str, folders: set[str]) -> bool:
    """Is ``folder`` below one of ``folders``?"""
    parent = os.path.dirname(folder)
    while parent != folder:
        if parent in folders:
            return True
        folder, parent = parent, os.path.dirname(parent)
    return False
