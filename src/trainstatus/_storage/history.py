"""Earlier versions of a local status file, kept beside it (``StatusStore(..., history=N)``).

Version ``n`` of ``training_status.json`` is kept as ``.training_status.json.history-0000000n``
in the file's own directory. Why this layout:

- the version a write replaces is already complete and durable: a second name for its inode,
  taken just before the rename (``_storage.atomic.keep_previous``), keeps it for one ``link()`` call, and
  its bytes are never copied or changed;
- in the same directory, the directory fsync that makes the rename durable makes that name
  durable too. A folder of its own would cost a second directory fsync on every write;
- where the filesystem has no hard links, the bytes are copied and fsynced instead (one more
  fsync per write) by the same step.

Sequence numbers only grow: the next is one past the highest kept. When the newest kept version
is the file itself (a writer was killed between the link and the rename), it is not kept twice
(where the bytes are copied instead, such a kill leaves the same bytes under two numbers).
Versions past the newest ``history`` are removed on the background closer thread, after the write
returned: a crash before that leaves a few extra versions, which the next write removes. The
count is that of the writer that prunes: writers of one file should use one ``history=``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections import namedtuple

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import NamedTuple

from . import filenames as _names

__all__ = ["Version", "next_slot", "prune", "read", "versions"]


if TYPE_CHECKING:

    class Version(NamedTuple):
        sequence: int
        path: str
        mtime_ns: int
        size: int
        inode: tuple[int, int]  # (st_dev, st_ino): the same inode as the file means the same version

else:  # the same class, without importing typing for its NamedTuple
    Version = namedtuple("Version", ("sequence", "path", "mtime_ns", "size", "inode"), module=__name__)
Version.__doc__ = """One kept version: its number, where it is, when it was written, its size.

A named tuple rather than a frozen dataclass: no ``exec`` at import.
"""


def versions(directory: str, name: str) -> list[Version]:
    """The versions of ``name`` kept in ``directory``, oldest first ([] when there is no history)."""
    pattern = _names.history_pattern(name)
    found = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                match = pattern.fullmatch(entry.name)
                if match is None:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:  # pruned meanwhile
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue  # a symlink or anything else planted under a version's name
                found.append(Version(int(match.group(1)), entry.path, st.st_mtime_ns, st.st_size,
                                     (st.st_dev, st.st_ino)))
    except (FileNotFoundError, NotADirectoryError):
        return []  # no directory yet: no history (other errors are the caller's to report)
    found.sort(key=lambda v: v.sequence)
    return found


def _numbered(directory: str, name: str) -> list[tuple[int, str]]:
    """(number, path) of each kept version, oldest first: names only, no stat (the write path)."""
    pattern = _names.history_pattern(name)
    try:
        with os.scandir(directory) as it:
            # Regular files only: a symlink planted under such a name is never read or restored.
            found = [(int(m.group(1)), e.path) for e in it
                     if (m := pattern.fullmatch(e.name)) is not None and e.is_file(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    found.sort()
    return found


def _kept_file(path: str) -> bool:
    """Whether ``path`` is a regular file (one ``lstat``: a symlink planted there is not a version)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def next_slot(directory: str, name: str, current: tuple[int, int] | None, after: int | None = None) -> tuple[int, bool]:
    """(the number the version now in the file gets, whether it is already kept under it).

    ``current`` is the file's (st_dev, st_ino). Only the newest kept version is looked at.
    ``after``: a number known to be kept (or about to be, by the writer after us): the versions
    after it are looked up by name, one ``lstat`` each, rather than by listing the directory. That
    is what a write after another process's write does (two or three lookups against a listing of
    the whole history: issue 13); when ``after`` is not there, the directory is listed.
    """
    found: list[tuple[int, str]] | None = None
    if after is not None and after > 0 and _kept_file(os.path.join(directory, _names.history_name(name, after))):
        sequence = after
        while _kept_file(os.path.join(directory, _names.history_name(name, sequence + 1))):
            sequence += 1
        found = [(sequence, os.path.join(directory, _names.history_name(name, sequence)))]
    if found is None:
        found = _numbered(directory, name)
    if not found:
        return 1, False
    sequence, path = found[-1]
    if current is not None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == current:
            return sequence, True
    return sequence + 1, False


def read(version: Version) -> bytes:
    with open(version.path, "rb") as f:
        return f.read()


def prune_range(directory: str, name: str, first: int, last: int) -> bool:
    """Remove versions ``first`` to ``last`` by number, no listing; whether ``last`` was there.

    Versions are numbered one after the other, so once version ``n`` is kept the ones to go are
    those up to ``n - keep``. A number already gone (another writer pruned it) is skipped; when
    the newest, ``last``, was not there, numbers were skipped and the caller lists the directory
    (``prune``).
    """
    found = False
    for number in range(last, first - 1, -1):
        try:
            os.unlink(os.path.join(directory, _names.history_name(name, number)))
        except FileNotFoundError:
            continue
        found = found or number == last
    return found


def prune(directory: str, name: str, keep: int) -> int | None:
    """Remove all but the newest ``keep`` versions (called off the write's path); the number of
    the oldest one kept (None: none is)."""
    found = _numbered(directory, name)
    for _, path in found[: max(0, len(found) - keep)]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    kept = found[max(0, len(found) - keep):]
    return kept[0][0] if kept and keep else None
