"""The files a local status file has beside it besides its history: copies kept aside, leftovers.

A damaged file is kept aside, byte for byte, under ``<file>.corrupt-<UTC time>[-N]``
(``keep_copy``, ``move_aside``), before the store starts anew or restores a version; a writer
killed mid-write leaves its temp file behind (``leftovers``), removed once nobody can be writing
(``remove_leftovers``). None of this is on the path of a read or a write, so it lives apart from
``local.LocalFile``, which calls it with its paths. It imports the write protocol (``atomic``),
the names (``filenames``) and the library's logger; ``datetime`` only when a copy is kept.
"""

from __future__ import annotations

import contextlib
import errno as errno_codes
import os

from . import atomic as _atomic, filenames as _names
from .. import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log
from .._lazy import OnFirstUse

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    import datetime
    import re
else:
    datetime = OnFirstUse("datetime", globals())  # only a damaged file kept aside needs it

__all__ = ["keep_copy", "leftovers", "move_aside", "remove_leftovers"]

logger = logging.getLogger("trainstatus")


def keep_copy(target: str, data: bytes | None = None) -> str:
    """Give the file ``target`` a second name, ``<file>.corrupt-<UTC time>[-N]``; return it.

    The file keeps its own name too. A name already taken is never replaced. Where hard links
    are not available the bytes (``data``, or read from the file) are copied to the new name
    exclusively and synced.
    """
    directory, name = os.path.split(target)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    base = os.path.join(directory, _names.copy_stem(name) + _names.COPY_MARK + stamp)
    aside, n = base, 0
    while True:
        try:
            os.link(target, aside, follow_symlinks=False)
            return aside
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno not in (errno_codes.EPERM, errno_codes.ENOTSUP, errno_codes.EXDEV, errno_codes.EMLINK):
                raise
            if data is None:
                with open(target, "rb") as f:
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


def move_aside(target: str, *, durable: bool) -> str:
    """Keep the file ``target`` under a new name (``keep_copy``), then remove its own; return the
    new name."""
    # The second name first, so the damaged bytes always have a name: a crash between the
    # two steps leaves two names, never none.
    aside = keep_copy(target)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)
    if durable:
        directory = os.path.dirname(target)
        try:
            _atomic.sync_directory(directory)
        except OSError as exc:  # the move happened; after a power loss it may be redone
            logger.debug("could not sync %s after keeping a damaged file aside: %s", directory, exc)
    return aside


def leftovers(directory: str, temp_pattern: re.Pattern[str]) -> list[str]:
    """The temp files in ``directory`` whose names ``temp_pattern`` matches ([] if unlisted)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    # filter over fullmatch runs in C: a run folder may hold dozens of history versions.
    return [os.path.join(directory, name) for name in filter(temp_pattern.fullmatch, names)]


def remove_leftovers(temps: list[str]) -> None:
    """Remove ``temps`` (``leftovers``), each as far as it can be removed."""
    for temp in temps:
        with contextlib.suppress(OSError):
            os.unlink(temp)
            logger.debug("removed a temp file left by a killed writer: %s", temp)
