"""Who holds a store's lock, for the command line: ``check``'s finding and a lock timeout's message.

The holders are found as the library's own messages find them (``_lock.holders``: ``/proc/locks``
and command lines for a flock, the lease file's marker for the soft lock); here is what the
command line says about them. Nothing here creates, takes or removes a lock file. Below both
``_cli.base`` (a command that timed out) and ``_cli`` (``check``), so neither imports the other.
"""

from __future__ import annotations

import errno as errno_codes
import fcntl
import os
import stat
import time

from .._storage import filenames as _names
from .._errors import TrainingStatusLockTimeout
from .._lock.holders import describe, flock_holders, holder_of_flock, marker_fields, this_host
from .._lock.path_lock import SOFT_LEASE_SECONDS


def _lock_state(lock_file: str) -> tuple[str, str]:
    """("free" | "held" | "unknown", description), without creating or following the lock file."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(lock_file, flags)
    except FileNotFoundError:
        return "free", "no lock file yet"
    except OSError as exc:
        if exc.errno == errno_codes.ELOOP:
            return "unknown", f"{lock_file} is a symlink, not followed"
        return "unknown", f"cannot open {lock_file}: {exc.strerror or exc}"
    try:
        try:
            # Shared: conflicts only with a writer's exclusive lock, and taken for an instant.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return "held", describe(flock_holders(os.fstat(fd)), "pid", full=True)
        except OSError as exc:
            return "unknown", f"cannot lock {lock_file}: {exc.strerror or exc}"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return "free", "nobody holds it"
    finally:
        os.close(fd)


def _soft_lease_state(lease_file: str) -> tuple[str, str] | None:
    """(level, finding) about a soft lock's lease file, or None when there is none.

    filelock's ``SoftFileLease`` marker is ``filelock/2`` then ``name=value`` lines (pid, host, mode,
    token, duration); its holder renews it by touching it every third of the lease, so its age is
    the time since the mtime. The file is read once, never locked, created or removed.
    """
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(lease_file, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno_codes.ELOOP:
            return "info", f"the soft lock state is unknown: {lease_file} is a symlink, not followed"
        return "info", f"the soft lock state is unknown: cannot open {lease_file}: {exc.strerror or exc}"
    try:
        st = os.fstat(fd)
        raw = os.read(fd, 4096) if stat.S_ISREG(st.st_mode) else b""
    finally:
        os.close(fd)
    age = max(0.0, time.time() - st.st_mtime)  # by this machine's clock (an NFS server's may differ)
    fields = marker_fields(raw)
    pid, host = fields.get("pid", ""), fields.get("host", "")
    if not (pid.isascii() and pid.isdigit() and host):
        return "info", (f"a write or a transaction may be in progress: {lease_file} exists but names no "
                        "holder (a marker being written, or not filelock's)")
    try:
        lease = float(fields.get("duration", SOFT_LEASE_SECONDS))
    except ValueError:
        lease = SOFT_LEASE_SECONDS
    holder = f"process {pid} on {''.join(c if c.isprintable() else '?' for c in host)}"
    if host == this_host() and not _runs(int(pid)):
        return "warning", (f"the soft lock {lease_file} names {holder}, this machine, which no longer runs: "
                           "a killed writer left it; the next writer with the soft lock takes it over at once")
    if age > lease:
        return "warning", (f"the soft lock {lease_file} names {holder}, but it was last renewed {age:.1f} s "
                           f"ago, longer than its {lease:g} s lease: its holder is probably gone; the next "
                           "writer with the soft lock takes it over")
    return "held", (f"the soft lock {lease_file} is held by {holder} (renewed {age:.1f} s ago; its lease is "
                    f"{lease:g} s)")


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs, as another user
        return True
    return True


def _lock_timeout_message(exc: TrainingStatusLockTimeout, timeout: float) -> str:
    lock_file = exc.lock_file or os.path.join(os.path.dirname(exc.path or ""), _names.lock_name(os.path.basename(exc.path or "")))
    holder = holder_of_flock(lock_file, "pid", full=True)  # the whole command line: a person at a shell
    return (
        f"could not lock {exc.path} within {timeout:g} s: {lock_file} is held by {holder}; "
        "let that write or transaction finish, or pass a longer --lock-timeout"
    )
