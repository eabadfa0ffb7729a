"""What one host sees of a checkpoint folder: its files made durable and listed in one walk, the
digest that stands for that view in a gather, and the checks of recorded files at a resume.

One rank per host calls these (``hosts.Hosts.leads``): the page cache an fsync flushes belongs to
the host, and every rank of a host sees the same files, so the others would only repeat the same
system calls against the same (often shared, network) filesystem.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping

from ..._checkpoints.folders import sync_folders_above
from ..._storage import atomic as _atomic

__all__ = ["digest", "opened_size", "place", "survey", "unseen"]


def survey(folder: str, status_path: str) -> dict[str, int]:
    """fsync every regular file under ``folder``, each folder in it (deepest first), ``folder``,
    and the folders above it up to ``status_path``'s; each file (path relative to ``folder``) with
    its size as the synced descriptor shows it. One listing of each folder, one open each file.

    Every rank's save has returned (the caller waited at a barrier), yet a file or folder inside
    that is gone by the time it is opened (removed by the training library's own clean-up) is
    passed by: it is not part of the checkpoint. ``folder`` itself gone raises."""
    sizes: dict[str, int] = {}
    folders: list[str] = []
    pending = [folder]
    while pending:
        current = pending.pop()
        try:
            with os.scandir(current) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except FileNotFoundError:
            if current == folder:
                raise
            continue
        folders.append(current)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                size = _synced_size(entry.path)
                if size is not None:
                    sizes[os.path.relpath(entry.path, folder)] = size
    for current in reversed(folders):  # deepest first: a folder's entry is synced after its contents
        try:
            _atomic.sync_directory(current)
        except FileNotFoundError:
            if current == folder:
                raise
    sync_folders_above([folder], status_path)
    return sizes


def _synced_size(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None  # replaced by something else since the listing
        _atomic.sync_file(fd)
        return info.st_size
    finally:
        os.close(fd)


def digest(view: Mapping[str, int]) -> str:
    """What stands for ``view`` in a gather: equal digests, equal views (names and sizes). On a
    shared filesystem every host sees the same, so a host sends this, and its differences only when
    rank 0 asks (``saving``)."""
    hashed = hashlib.blake2b(digest_size=16)
    for name, size in sorted(view.items()):
        hashed.update(os.fsencode(name) + b"\0" + str(size).encode() + b"\n")  # any name a folder holds
    return hashed.hexdigest()


def place(path: str) -> str:
    """What stands for the folder a rank names, in a gather: ranks of one host that name the same
    folder see the same files, so one walks it for all. A rank that names another (a relative path
    from another working folder, a path computed apart on each rank) walks its own
    (``saving``, ``resuming``): its host's walk says nothing of it."""
    try:
        absolute = os.path.abspath(path)
    except OSError as exc:  # a relative path, and this rank's working folder was removed
        return f"unresolved: {exc}"  # another than its host's: it walks its own, and says why it cannot
    return hashlib.blake2b(os.fsencode(absolute), digest_size=8).hexdigest()


def opened_size(path: str) -> int | None:
    """The size of ``path`` as opening it shows (which revalidates a network filesystem's cached
    attributes, where a listing or a ``stat`` may be stale), or None when it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):  # ValueError: a name with a NUL byte (a status file edited by hand)
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def unseen(root: str, files: Mapping[str, int]) -> str | None:
    """Why this host cannot use the recorded files (relative to ``root``), or None."""
    for name, size in files.items():
        path = os.path.join(root, name)
        try:
            seen: int | None = os.stat(path).st_size
        except (OSError, ValueError):
            seen = None
        if seen != size:
            seen = opened_size(path)  # a stale cached attribute (NFS) or negative lookup is not the answer
        if seen is None:
            return f"{path} is not there"
        if seen != size:
            return f"{path} has {seen} bytes, {size} recorded"
    return None
