"""One run per status file: the run lease a training job holds on its status file for its life.

Two jobs started on one output folder (a resubmitted job while the first still runs, a typo in a
sweep) both resume from the same checkpoint, then save and record the same folders over each
other, and both end "successfully". The lease makes the second one stop before it writes:

- The lease is ``<status file>.run`` beside the status file (``filenames.run_name``), with an
  exclusive ``flock`` held on an open descriptor for as long as the job runs (rank 0 of a process
  group, or the one process). The kernel frees it when that process dies, however it dies. A
  second process that finds it locked is refused (``TrainingStatusInUseError``) with what the
  holder wrote there: its pid, host, start time, run name and program.
- The file stays, like the ``.lock`` file: a job that ends empties it (``release``: the end of
  ``trainer.train()``, ``fit``, ``learn``; ``atexit`` for the rest). Deleting it instead would race
  a job opening it at that moment. A file found unlocked and not empty was left by a job that died
  without ending (SIGKILL, OOM, a lost machine): the lease is taken over and a note saying whose it
  was goes to the ``trainstatus`` logger (a warning: a resume after a kill is normal, and a Python
  warning per resume would only teach people to filter them).
- The steps are named (``_open``, ``_lock``, ``_still_there``, ``_write``) so tests can fault them
  one at a time. A file deleted by hand between this job's open and its lock, and made again by
  another job, is not the one the path names (``_still_there``): the take starts over, so two jobs
  never each hold a lease on a different file of the same name.
- A job that finds the lease held while its holder has not written it yet (they started at the same
  moment) waits for the holder's text a little (``_HOLDER_WAIT``), so the refusal names it.
- After ``fork`` the child closes its copies of the descriptors (``os.register_at_fork``, the fork
  made under ``_mutex`` so no take is halfway): a ``flock`` lasts while any copy is open, and a
  DataLoader worker outliving a killed trainer must not keep its lease. The child holds no lease.

Where the lease cannot be taken it is not, and the job goes on: a status file on an object store
(``s3://``: no lock lasts a run there), a folder this process cannot write or make (a read-only
resume, which writes nothing), a filesystem without ``flock`` (warned: the status file's own writes
need ``flock`` there too). A lease file another user made and this one cannot write is locked
read-only: it still excludes, it only cannot name this job. On NFS, ``flock`` excludes across
machines only where the mount has locking (``lockd``; not ``nolock``), and a machine lost while it
holds one keeps it until the server's lease on it expires.
"""

from __future__ import annotations

import atexit
import datetime
import errno
import fcntl
import os
import socket
import threading
import time
from typing import Any

import orjson

from ... import _log as logging
from ..._errors import TrainingStatusInUseError, TrainingStatusWarning, warn
from ..._lock.holders import program
from ..._lock.path_lock import NO_FLOCK
from ..._storage.filenames import run_name
from .choice import READ_ONLY  # this process cannot make or write the file

__all__ = ["describe", "held", "lease_file", "release", "release_all", "take"]

logger = logging.getLogger("trainstatus")

_TRIES = 20  # a lease file deleted under us this many times in a row: something deletes it at once
_MAX = 4096
_HOLDER_WAIT = 1.0  # seconds a refused job waits for a holder that has just locked to write its name
DONE = "This job stopped before writing anything."

_mutex = threading.Lock()
_held: dict[str, int] = {}  # lease file (absolute) -> the descriptor holding its flock


def lease_file(status_path: str) -> str:
    """The run lease of the status file ``status_path`` (local)."""
    folder, name = os.path.split(os.path.abspath(status_path))
    return os.path.join(folder, run_name(name))


def take(status_path: str, who: str, *, run: str | None = None, stopped: str = DONE) -> bool:
    """Take the run lease of ``status_path`` (a local path, or a URL: none) for this process, unless it already holds it.

    ``who`` names the caller in messages (``TrainStatusCallback``); ``run`` is the job's name, if it
    has one (Transformers' ``run_name``); ``stopped`` says what the refused job did not do. True
    when this process holds it afterwards. Raises ``TrainingStatusInUseError`` when another live
    process holds it.
    """
    if "://" in status_path:
        return False
    run = run if isinstance(run, str) and run else None
    lease = lease_file(status_path)
    with _mutex:
        if lease in _held:
            return True
        for _ in range(_TRIES):
            fd = _open(lease, who)
            if fd is None:
                return False
            try:
                if not _lock(fd, lease, status_path, who, stopped):
                    os.close(fd)
                    return False
                if not _still_there(fd, lease):
                    os.close(fd)  # deleted by hand as this job opened it: the path names another file now
                    continue
                left = _read(fd)
                _write(fd, _mine(run), lease)
            except BaseException:
                os.close(fd)
                raise
            _held[lease] = fd
            if left is not None:
                _note_taken_over(left, lease)
            return True
        warn(TrainingStatusWarning(
            f"{who}: the run lease {lease} was deleted {_TRIES} times as it was taken: something deletes it "
            "(a cleanup job?). This job goes on without it: a second job on this status file would not be "
            "refused. Leave *.run files beside status files alone.", path=status_path, lock_file=lease))
        return False


def release(status_path: str) -> None:
    """Release the run lease of ``status_path`` this process holds (nothing if it holds none): the
    file is emptied first, then the lock freed, so the next job finds a lease that ended well."""
    lease = lease_file(status_path)
    with _mutex:
        fd = _held.pop(lease, None)
        if fd is not None:
            _end(fd, lease)


def release_all() -> None:
    """Release every run lease this process holds (at exit; tests between cases)."""
    with _mutex:
        while _held:
            lease, fd = _held.popitem()
            _end(fd, lease)


def held() -> list[str]:
    """The lease files this process holds."""
    with _mutex:
        return sorted(_held)


def _open(lease: str, who: str) -> int | None:
    """Step 1: the lease file, made if missing (None: this process cannot make it; read-only when
    another user made it and this one cannot write it)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    try:
        try:
            return os.open(lease, flags, 0o666)  # the umask decides, as for the status file
        except FileNotFoundError:
            os.makedirs(os.path.dirname(lease), exist_ok=True)  # the job's first use of its output folder
            return os.open(lease, flags, 0o666)
    except OSError as exc:
        if exc.errno not in READ_ONLY:
            raise
        try:
            return os.open(lease, os.O_RDONLY | os.O_CLOEXEC)  # another user's: a lock on it still excludes
        except OSError:
            logger.debug("%s: no run lease %s: %s (a read-only resume)", who, lease, exc)
            return None


def _lock(fd: int, lease: str, status_path: str, who: str, stopped: str) -> bool:
    """Step 2: its exclusive ``flock``, without waiting. Raises when another process holds it;
    False when the filesystem has no ``flock`` (warned)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        found = _read(fd)
        deadline = time.monotonic() + _HOLDER_WAIT
        while not found and time.monotonic() < deadline:  # locked, not written yet: it started just now
            time.sleep(0.01)
            found = _read(fd)
        raise TrainingStatusInUseError(_refusal(who, status_path, lease, found or {}, stopped), holder=found,
                                       path=status_path, lock_file=lease) from None
    except OSError as exc:
        if exc.errno not in NO_FLOCK:  # none here: the job goes on without a lease (above)
            raise
        warn(TrainingStatusWarning(
            f"{who}: the filesystem of {lease} has no flock ({exc.strerror}), so this job cannot hold the run "
            "lease that stops a second job on the same status file; it goes on without it. Make sure no other "
            "job trains into this folder.", path=status_path, lock_file=lease))
        return False
    return True


def _still_there(fd: int, lease: str) -> bool:
    """Step 3: the path still names the file locked."""
    try:
        named = os.stat(lease)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


def _write(fd: int, fields: dict[str, Any], lease: str) -> None:
    """Step 4: who holds it, for the next job's message (not synced: the lock is the lease, the
    text only names it, and a crash frees both)."""
    data = orjson.dumps(fields) + b"\n"
    try:
        os.pwrite(fd, data, 0)  # then cut: a job refused meanwhile reads a whole text, never an empty one
        os.ftruncate(fd, len(data))
    except OSError as exc:
        if exc.errno not in (*READ_ONLY, errno.EBADF):  # EBADF: opened read-only (another user's file)
            raise
        logger.debug("could not name this job in the run lease %s: %s", lease, exc)


def _end(fd: int, lease: str) -> None:
    try:
        os.ftruncate(fd, 0)  # ended well: nothing to take over
    except OSError as exc:
        logger.debug("could not empty the run lease %s: %s", lease, exc)
    finally:
        os.close(fd)


def _read(fd: int) -> dict[str, Any] | None:
    """What the lease file says (None: empty; {} for anything not a holder's fields)."""
    try:
        raw = os.pread(fd, _MAX, 0)
    except OSError:
        return {}
    if not raw.strip():
        return None
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return fields if isinstance(fields, dict) else {}


def _mine(run: str | None) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "run": run,
        "program": program(os.getpid()),
    }


def describe(fields: dict[str, Any]) -> str:
    """``process 4242 on node3 (python train.py ...), run 'bert-7', started 2026-12-07 18:50:01 UTC``."""
    if not fields:
        return "a process that left no name (the lease file is empty, damaged, or not writable by it)"
    said = f"process {fields.get('pid', '?')} on {fields.get('host', '?')}"
    if fields.get("program"):
        said += f" ({fields['program']})"
    if fields.get("run"):
        said += f", run {fields['run']!r}"
    if fields.get("started"):
        said += f", started {fields['started']}"
    return said


def _refusal(who: str, status_path: str, lease: str, found: dict[str, Any], stopped: str) -> str:
    return (
        f"{who}: another job is training on {status_path}: {describe(found)}. It holds the run lease {lease}. "
        "Two jobs on one status file resume from the same checkpoint and then save over each other's. "
        "Give this job a folder of its own (or a status file of its own), or stop the other job first; if "
        f"that process is gone (a machine lost while it held a lock on NFS), delete {lease}. {stopped}"
    )


def _note_taken_over(left: dict[str, Any], lease: str) -> None:
    logger.warning(
        "trainstatus took over the run lease %s from %s: that job ended without releasing it (killed, out of "
        "memory, or its machine lost).", lease, describe(left))


def _after_fork_in_child() -> None:
    # The child holds no lease; closing its copies leaves the parent's locks alone (see above).
    for fd in _held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()
    _mutex.release()  # taken by the forking thread, the child's only one


os.register_at_fork(before=_mutex.acquire, after_in_parent=_mutex.release, after_in_child=_after_fork_in_child)
atexit.register(release_all)  # a job that returns ends well: no note for the next one
