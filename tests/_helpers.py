"""Helpers shared by several test files."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainstatus import StatusStore


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


def read_fresh(path: Path | str | os.PathLike[str]) -> dict[str, Any]:
    """What a new store reads from disk."""
    fresh = StatusStore(path)
    try:
        return fresh.to_dict()
    finally:
        fresh.close()


def process_message(path: Path, timeout: float) -> str:
    """The exact TrainingStatusLockTimeout text when another process holds the lock."""
    return (
        f"Could not lock {path} within {timeout} s: another process holds {path}.lock (a write or an "
        "open transaction). Let it finish, or open the store with a longer lock_timeout=."
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
def lock_held_by_another_process(lock_path: Path) -> Iterator[None]:
    """Hold ``lock_path`` with plain filelock in a child until the block ends, then release it."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(lock_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        try:
            assert child.stdout.readline() == "locked\n"
            yield
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
