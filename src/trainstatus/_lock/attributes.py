"""A file's immutable and append-only attributes (``chattr +i``, ``chattr +a``), for messages.

Such a mark refuses a rename over the file, its removal or (immutable) opening it for writing with
``EPERM``, to root too, whatever the file's mode says. A write refused with ``EPERM`` looks here
before it blames permissions: the status file and its folder (``_storage.messages``), the lock file
(``path_lock``). Read with the ``FS_IOC_GETFLAGS`` ioctl (Linux; ext4, XFS, btrfs and others keep
the flags), only once something was refused, never on a write's path. Here, in the lowest layer
that opens files, so that the lock and the storage above it both use it.
"""

from __future__ import annotations

import os
import struct

__all__ = ["IMMUTABLE", "APPEND_ONLY", "UNKNOWN", "advice", "mark", "refusing_mark", "unknown_advice"]

IMMUTABLE = "immutable"
APPEND_ONLY = "append-only"
UNKNOWN = "unknown"  # the flags cannot be read here (not Linux, a filesystem without them)

# _IOR('f', 1, long) as <linux/fs.h> defines it (the kernel reads and writes an int there); the
# layout of x86, Arm and most others: elsewhere the ioctl fails and the mark is UNKNOWN.
_FS_IOC_GETFLAGS = (2 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 1
_FS_IMMUTABLE_FL = 0x00000010
_FS_APPEND_FL = 0x00000020


def mark(path: str) -> str | None:
    """IMMUTABLE, APPEND_ONLY, None (neither), or UNKNOWN (cannot tell: no such file, no flags)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        return UNKNOWN
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)  # nonblocking: a FIFO there
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None  # nothing there to carry a mark
    except OSError:
        return UNKNOWN
    try:
        buffer = bytearray(struct.calcsize("l"))
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, buffer, True)
    except OSError:
        return UNKNOWN
    finally:
        os.close(fd)
    value = struct.unpack_from("i", buffer)[0]
    if value & _FS_IMMUTABLE_FL:
        return IMMUTABLE
    if value & _FS_APPEND_FL:
        return APPEND_ONLY
    return None


def refusing_mark(paths: tuple[str, ...]) -> tuple[str, str] | None:
    """``(path, mark)`` of the first of ``paths`` marked immutable or append-only; else
    ``("", UNKNOWN)`` when one of them could not be read, or None when none has a mark."""
    unknown = False
    for path in paths:
        found = mark(path)
        if found == UNKNOWN:
            unknown = True
        elif found is not None:
            return path, found
    return ("", UNKNOWN) if unknown else None


def advice(path: str, found: str, refused: str = "replace it") -> str:
    """What to do about ``path`` marked ``found`` (IMMUTABLE or APPEND_ONLY), as a clause;
    ``refused``: what the mark refused to do to a file (a folder says it itself)."""
    import shlex  # here: only a refused write gets this far

    flag = "i" if found == IMMUTABLE else "a"
    if os.path.isdir(path):
        kind = "the folder "
        refused = "create or replace a file in it" if found == IMMUTABLE else "replace a file in it"
    else:
        kind = ""
    return (f"{kind}{path} is marked {found} (chattr +{flag}), so no one, not even root, can {refused} "
            f"whatever the permissions say: lift the mark with `chattr -{flag} {shlex.quote(path)}` "
            "unless it was put there on purpose")


def unknown_advice(paths: tuple[str, ...]) -> str:
    """The clause for an ``EPERM`` whose marks could not be read: the other possibility, named."""
    names = " or ".join(paths)
    return (f"lift an immutable or append-only mark from {names} if one has it (`lsattr -d` shows it, "
            "`chattr -i` or `chattr -a` lifts it)")
