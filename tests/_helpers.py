"""Helpers shared by several test files."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import trainstatus
from trainstatus import StatusStore
from trainstatus._lock import path_lock as _locking


def same(a: Any, b: Any) -> bool:
    """Exact equality of plain JSON values: NaN equals NaN, types and the sign of zero count,
    and so does the order of dict keys."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


# Object stores (tests/test_s3.py, tests/test_object_store.py): a bucket of either server module
# has ``read(key)``; every bucket's test object is at ``OBJECT_KEY``.
OBJECT_KEY = "run/run_logs/training_status.json"


def stored(bucket: Any, key: str = OBJECT_KEY) -> dict[str, Any]:
    """The object as another reader parses it (Python's json: NaN literals allowed)."""
    data = bucket.read(key)
    assert data is not None, f"no object at {key}"
    return json.loads(data)  # type: ignore[no-any-return]


def assert_memory_is_object(store: StatusStore, bucket: Any) -> None:
    assert same(store.to_dict(), stored(bucket))


def requests(store: StatusStore) -> int:
    """How many requests the store's object storage has sent."""
    return store._storage.requests  # type: ignore[attr-defined, no-any-return]


def conflicts(store: StatusStore) -> int:
    """How many conditional writes of the store's object storage lost a race."""
    return store._storage.conflicts  # type: ignore[attr-defined, no-any-return]


def fill(store: StatusStore) -> None:
    """The same changes, on any store: categories, a NaN, infinities, a delete, nesting."""
    store.set("wall_height", "lesson_num", 3)
    store.set("SoccerTwos?team=0", "elo", 1234.5)
    store.set("Walker", "checkpoints", [{"steps": 500_000, "reward": math.nan, "file_path": "Walker-500000.onnx"}])
    store.set("Walker", "final_checkpoint", None)
    store.set("extremes", "inf", [math.inf, -math.inf, 2**64 - 1, -(2**63)])
    store.set("extremes", "unicode", "größe ✓")
    store.set("gone", "soon", 1)
    assert store.delete("gone", "soon") is True
    with store.transaction():
        store.set("wall_height", "lesson_num", 4)
        store.set("Walker", "lesson", {"nested": {"deep": [1, 2.5, "x", True]}})


def write(root: Path, name: str, data: bytes = b"weights") -> str:
    """Create ``root/name`` (folders too); return ``name``, the path as a trainer would list it."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return name


def read_fresh(path: Path | str | os.PathLike[str]) -> dict[str, Any]:
    """What a new store reads from disk."""
    fresh = StatusStore(path)
    try:
        return fresh.to_dict()
    finally:
        fresh.close()


def program(pid: int) -> str:
    """Process ``pid`` as the library's messages name it: its executable's base name and its script
    (``-m module``; ``-c`` without the code), "..." when more was given, never the arguments. For
    the command lines the tests start: ``python -c ...``, ``python -m pytest ...``, ``python x.py``,
    after the interpreter's flags (multiprocessing's ``spawn`` passes ``-B`` on, for one)."""
    words = [w.decode() for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
    executable, rest, skipped = os.path.basename(words[0]), words[1:], False
    while rest and rest[0][:1] == "-" and rest[0][1:].isalpha() and not set(rest[0]) & set("cmWX"):
        rest, skipped = rest[1:], True  # -B, -u, -I: flags without a value, not shown
    if rest[:1] == ["-c"]:
        return f"{executable} -c ..."
    if rest[:1] == ["-m"]:
        shown, rest = f"{executable} -m {rest[1]}", rest[2:]
    elif rest:
        shown, rest = f"{executable} {os.path.basename(rest[0])}", rest[1:]
    else:
        shown = executable
    return shown + (" ..." if rest or skipped else "")


def process_message(path: Path, timeout: float, pid: int) -> str:
    """The exact TrainingStatusLockTimeout text when process ``pid`` holds the lock."""
    return (
        f"Could not lock {path} within {timeout} s: process {pid} ({program(pid)}) holds {path}.lock "
        "(a write or an open transaction). Let it finish, or open the store with a longer lock_timeout=."
    )


_HOLDER = """
import sys, filelock
lock = filelock.FileLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.readline()
lock.release()
"""


@contextmanager
def lock_held_by_another_process(lock_path: Path) -> Iterator[int]:
    """Hold ``lock_path`` with plain filelock in a child until the block ends, then release it;
    gives the child's pid."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(lock_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        try:
            assert child.stdout.readline() == "locked\n"
            yield child.pid
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.wait(timeout=30) == 0
        finally:
            if child.poll() is None:
                child.kill()


def run_threads(targets: list[Callable[[], None]], *, timeout: float = 60.0) -> None:
    """Run each target in a thread; fail on a hang (past ``timeout`` s) or on any exception."""
    errors: list[str] = []

    def wrapped(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException:  # reported below
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=wrapped, args=(t,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a worker thread hung (deadlock?)"
    assert not errors, errors[0]


# -- lock="soft": a holder in another process, and the message a waiter gets ------------------------

_SOFT_HOLDER = """
import os, sys
from trainstatus import StatusStore; from trainstatus._lock import path_lock as _locking
_locking.SOFT_LEASE_SECONDS = float(sys.argv[2])
store = StatusStore(sys.argv[1], lock="soft", durable=False)
with store.transaction():
    store.set("holder", "pid", os.getpid())
    print(os.getpid(), flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


# A soft-mode writer on another machine, as this machine sees it: it holds the lease file, and its
# flock (if the filesystem shares one at all) is not visible here.
_REMOTE_HOLDER = """
import os, sys, filelock
from trainstatus._storage import filenames as _names
folder, name = os.path.split(sys.argv[1])
lease = filelock.SoftFileLease(os.path.join(folder, _names.lease_name(name)), thread_local=False,
                               lease_duration=float(sys.argv[2]))
lease.acquire()
print(os.getpid(), flush=True)
sys.stdin.readline()
lease.release()
print("released", flush=True)
"""


@contextmanager
def soft_holder(path: Path, lease: float | None = None, *, remote: bool = False) -> Iterator[subprocess.Popen[str]]:
    """A child holds a lock="soft" transaction on ``path`` until the block ends (or it is killed);
    ``remote``: holds only the lease, like a writer on another machine."""
    lease = _locking.SOFT_LEASE_SECONDS if lease is None else lease
    with subprocess.Popen(
        [sys.executable, "-c", _REMOTE_HOLDER if remote else _SOFT_HOLDER, str(path), str(lease)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        try:
            assert int(child.stdout.readline()) == child.pid
            yield child
            if child.poll() is None:
                child.stdin.write("\n")
                child.stdin.flush()
                assert child.stdout.readline() == "released\n"
                assert child.wait(timeout=60) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def soft_message(path: Path, timeout: float, pid: int) -> str:
    from filelock._identity import (
        host_name,  # what filelock records as the holder's machine
    )

    # The holder's machine is this one (a "remote" holder is simulated here): its program too.
    return (
        f"Could not lock {path} within {timeout} s: process {pid} on {host_name()} ({program(pid)}) holds "
        f"{path}.softlock (a write or an open transaction). Let it finish, or open the store with a "
        f"longer lock_timeout=. A holder that was killed is taken over once its lease has gone "
        f"{_locking.SOFT_LEASE_SECONDS:g} s without renewal (at once on its own machine); if it is "
        f"gone and you cannot wait, delete {path}.softlock."
    )


def hold_lock_in_subprocess(lock_file: str | os.PathLike[str], seconds: float) -> subprocess.Popen[bytes]:
    """Another process holding ``flock`` on ``lock_file`` for ``seconds``; returns once it holds it."""
    script = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock_file)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "sys.stdout.write('held\\n'); sys.stdout.flush()\n"
        f"time.sleep({seconds})\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"held\n"
    return child


def end_processes(processes: list[subprocess.Popen[str]]) -> None:
    """End each of ``processes`` still running, a stopped one too (SIGCONT, then SIGKILL), reap it
    and close its pipes: whatever a test asserted, no process it started outlives it."""
    import signal

    for process in processes:
        if process.poll() is None:  # not reaped yet: its pid is still its own, even once it exits
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
            process.wait(timeout=60)
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


def skip_unless_local_locks(lock_file: Path) -> None:
    """Skip the test where ``lock_file`` is not on a local filesystem: the hand-off of turns and of
    changes is used only there (on a network one ``flock`` may be made of byte-range locks)."""
    import pytest

    from trainstatus._lock import fair as _fair

    fd = os.open(lock_file, os.O_RDONLY)
    try:
        if not _fair._on_local_filesystem(fd):
            pytest.skip("the hand-off is for local filesystems (flock may be made of byte locks elsewhere)")
    finally:
        os.close(fd)


def claim_byte_free(lock_file: str | os.PathLike[str], slot: int) -> bool:
    """Whether no process holds the claim byte of box ``slot`` of ``lock_file`` (``_lock.mailbox``):
    a waiter lets go of it just after it posted, and a holder passes by a box whose byte is held."""
    import fcntl
    import struct

    from trainstatus._lock import mailbox

    fd = os.open(lock_file, os.O_RDWR)
    try:
        claim = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, mailbox._CLAIM_BYTES + slot, 1, 0)
        return bool(struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, claim))[0] == fcntl.F_UNLCK)
    finally:
        os.close(fd)


@contextmanager
def alarm(seconds: float, message: str) -> Iterator[None]:
    """Fail with ``message`` if the body blocks the main thread for ``seconds`` (a wait with no
    timeout of its own). The test's own time limit (pytest-timeout's signal method, on the same
    timer) still holds: it fires instead if it comes first, and is set again for what is left of it
    after the body."""
    outer, _ = signal.getitimer(signal.ITIMER_REAL)
    limit_first = bool(outer) and outer <= seconds
    started = time.monotonic()
    fired: list[int] = []

    def expired(signum: int, frame: Any) -> None:
        fired.append(signum)
        if limit_first and callable(previous):
            previous(signum, frame)  # the test's limit: its failure and its stacks
        raise AssertionError(message)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, outer if limit_first else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer and not (fired and limit_first):  # at least a moment: a limit passed fires at once
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001))


# -- a child run as user nobody ---------------------------------------------------------------------
# The checkout, its .venv and the interpreter it was made from may all lie under a folder only
# root can enter (a clone under mktemp -d, pyenv under /root): what nobody runs must be copied out,
# or found elsewhere.


def closed_to_others(path: str | os.PathLike[str]) -> str | None:
    """The first folder on the way to ``path``, or ``path`` itself, that a user other than its owner
    and group (``nobody``) cannot pass through or read; None if there is none."""
    target = os.path.realpath(path)
    for folder in [*reversed(Path(target).parents), Path(target)]:
        mode = os.stat(folder).st_mode
        need = stat.S_IXOTH if str(folder) != target else stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            return str(folder)
    return None


def interpreter_for_nobody() -> str:
    """A Python of this one's version whose standard library ``nobody`` can read, or skip saying why
    (the copied orjson is compiled for this version)."""
    reasons = []
    for candidate in dict.fromkeys([os.path.realpath(sys.executable), "/usr/bin/python3",
                                    f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"]):
        if not os.path.exists(candidate):
            continue
        probe = subprocess.run(
            [candidate, "-I", "-S", "-c", "import json, sys, sysconfig; print(json.dumps([sys.version_info[:2], "
             "sysconfig.get_path('stdlib'), sysconfig.get_path('platstdlib')]))"],
            capture_output=True, text=True, timeout=60, check=True)
        version, *libraries = json.loads(probe.stdout)
        closed = [found for found in map(closed_to_others, libraries) if found]
        if tuple(version) != sys.version_info[:2]:
            reasons.append(f"{candidate} is Python {version[0]}.{version[1]}")
        elif closed:
            reasons.append(f"{candidate}'s standard library is under {closed[0]}, which others cannot read")
        else:
            return candidate
    pytest.skip("no interpreter user nobody can run: " + "; ".join(reasons))


def copy_for_nobody(folder: Path) -> Path:
    """trainstatus and its dependencies (pyproject.toml's filelock and orjson) copied into
    ``folder``, everyone able to read them; skip if ``nobody`` cannot reach ``folder``."""
    shutil.copytree(Path(trainstatus.__file__).parent, folder / "trainstatus", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("filelock", "orjson"):
        for file in importlib.metadata.distribution(name).files or []:
            if file.parts[0].endswith(".dist-info") or ".." in file.parts or "__pycache__" in file.parts:
                continue
            (folder / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file.locate(), folder / file)
    for root, folders, names in os.walk(folder):  # whatever the umask made them
        for name in folders:
            os.chmod(os.path.join(root, name), 0o755)
        for name in names:
            os.chmod(os.path.join(root, name), 0o644)
    os.chmod(folder, 0o755)
    closed = closed_to_others(folder)
    if closed:
        pytest.skip(f"user nobody cannot reach the temporary folder: {closed} is closed to others")
    return folder
