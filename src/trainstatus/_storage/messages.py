"""What the local file's read and write errors say: what happened, and what to do about it.

The messages are part of the spec (tests check them word for word); the one for a full disk names
the history that takes the space and the command that frees it, one refused by chattr's mark the
file or folder that carries it (``_lock.attributes``). Only failing reads and writes build them, so
they live apart from ``local.LocalFile``, which passes its path as given and its target. It imports
the errors, the history listing (``history``) and the names (``filenames``); ``shlex`` only when a
full disk is reported, ``_lock.attributes`` only when a write was refused with ``EPERM``.
"""

from __future__ import annotations

import errno as errno_codes
import stat
import os

from . import history as _history, filenames as _names
from .._errors import TrainingStatusReadError, TrainingStatusWriteError

__all__ = ["byte_size", "marked", "mode_error", "read_error", "write_error"]


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


def read_error(location: str, target: str, exc: OSError) -> TrainingStatusReadError:
    """Reading ``location`` (the file ``target``) failed with ``exc``."""
    if exc.errno == errno_codes.ENAMETOOLONG:
        return TrainingStatusReadError(
            f"Cannot read {location}: {exc.strerror or exc}. Nothing was changed: {too_long(target)}, "
            "then open the store again.",
            path=location,
        )
    return TrainingStatusReadError(
        f"Cannot read {location}: {exc.strerror or exc}. The file was left as it is; fix "
        "its permissions or path and open the store again.",
        path=location,
    )


def too_long(target: str) -> str:
    size = len(os.fsencode(os.path.basename(target)))
    if size > _names.NAME_MAX:
        return (f"its name has {size} bytes and a file name can have at most {_names.NAME_MAX}, so "
                "give the status file a shorter name")
    return "the path is longer than this system allows, so use a shorter path"


def history_space(location: str, target: str) -> str:
    """On a full disk: what the history beside the file holds and how to free it ('' if none)."""
    try:
        kept = _history.versions(*os.path.split(target))
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
            f"together: `trainstatus history {shlex.quote(location)} --prune --keep {keep}` removes {removes}, "
            "and a store opened with a smaller history= keeps fewer)")


def _places(target: str) -> tuple[str, str]:
    """The status file and its folder: where a mark refusing a write can be."""
    return target, os.path.dirname(target) or "."


def marked(target: str) -> bool:
    """Whether the status file ``target`` or its folder is marked immutable or append-only."""
    from .._lock import attributes as _attributes  # only a refused write asks

    found = _attributes.refusing_mark(_places(target))
    return found is not None and found[1] != _attributes.UNKNOWN


def write_error(location: str, target: str, exc: OSError, step: str) -> TrainingStatusWriteError:
    """Writing ``location`` (the file ``target``) failed with ``exc`` while ``step``."""
    if step == "syncing its directory":
        outcome = "The new content is in the file but may not survive a power loss"
    else:
        outcome = "The file was left as it was"
    return TrainingStatusWriteError(
        f"Could not save {location} ({step}): {exc.strerror or exc}. {outcome}; "
        f"{_advice(location, target, exc)}, then set the value again.",
        path=location,
        errno=exc.errno,
    )


def _advice(location: str, target: str, exc: OSError) -> str:
    """What to do about a failed write of ``location``; what happened is ``exc``'s own strerror."""
    full = history_space(location, target) if exc.errno in (errno_codes.ENOSPC, errno_codes.EDQUOT) else ""
    eperm = "fix the permissions of the directory"
    if exc.errno == errno_codes.EPERM:  # as root too: chattr's mark on the file or its folder
        from .._lock import attributes as _attributes

        found = _attributes.refusing_mark(_places(target))
        if found is not None and found[1] != _attributes.UNKNOWN:
            eperm = _attributes.advice(location if found[0] == target else found[0], found[1])
        elif found is not None:
            eperm += f", or {_attributes.unknown_advice(_places(target))}"
    return {
        errno_codes.ENOSPC: f"the disk is full; free some space{full}",
        errno_codes.EDQUOT: f"free some space{full} or raise the quota",
        errno_codes.EROFS: "remount the filesystem writable or use another path",
        errno_codes.EACCES: "fix the permissions of the directory",
        errno_codes.EPERM: eperm,
        errno_codes.ENAMETOOLONG: too_long(target),
    }.get(exc.errno or 0, "check the disk and the path")


def mode_error(location: str, mode: int, exc: OSError) -> TrainingStatusWriteError:
    """A rewrite refused because the file's ``mode`` does not let its owner read and write it (a
    rewrite keeps the mode, and this process is not root)."""
    return TrainingStatusWriteError(
        f"Could not save {location}: the file's mode is {stat.filemode(mode)} "
        f"({mode & 0o7777:#o}), which does not let its owner read and write it, and a "
        "rewrite keeps the file's mode. The file was left as it was; give its owner "
        f"read and write (chmod u+rw {location}), then set the value again.",
        path=location,
        errno=exc.errno,
    )
