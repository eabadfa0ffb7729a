"""One lock per status file per process: an in-process RLock in front of one ``filelock``.

Every store on the same file in this process shares one ``PathLock``. Threads queue on the RLock,
so the ``FileLock`` (an ``flock`` on the sibling ``.lock`` file, excluding other processes) is only
ever taken by one thread at a time and only once per outermost hold: a ``set`` inside a
transaction pays for ``filelock`` zero times, a plain ``set`` once. Two ``FileLock`` objects on one
path in one process would also make filelock raise its deadlock error; sharing avoids that.

After ``fork`` the child must not touch the parent's lock objects: an inherited RLock may be held by
a thread that does not exist in the child, and releasing an inherited ``flock`` descriptor would
free the parent's lock. The child therefore starts a new registry (``generation`` changes, and
holders fetch their lock again) and keeps the inherited objects referenced forever, so no finalizer
of theirs runs in the child.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import filelock

from ._errors import TrainingStatusLockTimeout, TrainingStatusWriteError

__all__ = ["PathLock", "generation", "lock_for"]

# How often a writer waiting for another process retries the lock. filelock's default, 50 ms,
# makes a waiting writer miss most releases: with 4 processes setting in a loop, p99 latency
# reached 200 ms. A failed try costs filelock about 0.2 ms of CPU, so 5 ms keeps a waiter's
# polling under 5% of a core.
_POLL_INTERVAL = 0.005


class PathLock:
    """Mutual exclusion for one status file across threads and processes; reentrant per thread."""

    def __init__(self, lock_path: str) -> None:
        self.lock_path = lock_path
        self._mutex = threading.RLock()
        self._depth = 0  # holds by the thread owning _mutex; guarded by _mutex
        self._owner: int | None = None  # thread ident while _depth > 0; guarded by _mutex
        self._file_lock = filelock.FileLock(lock_path, thread_local=False)

    def held_here(self) -> bool:
        """Whether the calling thread holds this lock (safe to ask from any thread)."""
        return self._owner == threading.get_ident()

    @contextmanager
    def hold(self, timeout: float | None, *, path: str, configured: float | None = None) -> Iterator[None]:
        """Hold the lock, waiting at most ``timeout`` s (None: forever).

        ``configured`` is the caller's whole ``lock_timeout``, for the message, when ``timeout`` is
        what is left of it.
        """
        shown = timeout if configured is None else configured
        taken_in = generation  # a hold that spans a fork must not release in the child
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._mutex.acquire(timeout=-1 if timeout is None else timeout):
            raise self._timeout(shown, path, None)
        try:
            if self._depth == 0:
                remaining = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    self._file_lock.acquire(timeout=remaining, poll_interval=_POLL_INTERVAL)
                except filelock.Timeout as exc:
                    raise self._timeout(shown, path, exc) from exc
                except OSError as exc:  # cannot create or open the lock file
                    raise TrainingStatusWriteError(
                        f"Could not lock {path}: cannot open the lock file {self.lock_path}: "
                        f"{exc.strerror or exc}. Nothing was written; make its directory writable "
                        "(and the lock file a regular file, not a symlink).",
                        path=path,
                        lock_file=self.lock_path,
                        errno=exc.errno,
                    ) from exc
            self._depth += 1
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    if generation == taken_in:  # in a forked child the flock is the parent's
                        self._file_lock.release()
        finally:
            self._mutex.release()

    def _timeout(self, timeout: float | None, path: str, exc: BaseException | None) -> TrainingStatusLockTimeout:
        who = "another process" if exc is not None else "another thread of this process"
        return TrainingStatusLockTimeout(
            f"Could not lock {path} within {timeout} s: {who} holds {self.lock_path} (a write or an "
            "open transaction). Let it finish, or open the store with a longer lock_timeout=.",
            path=path,
            lock_file=self.lock_path,
        )


_registry: weakref.WeakValueDictionary[str, PathLock] = weakref.WeakValueDictionary()
_registry_mutex = threading.Lock()
_inherited: list[Any] = []  # objects from before a fork, kept alive in the child on purpose
generation = 0


def lock_for(lock_path: str) -> PathLock:
    """The process-wide lock for ``lock_path`` (an absolute, resolved path)."""
    with _registry_mutex:
        lock = _registry.get(lock_path)
        if lock is None:
            lock = _registry[lock_path] = PathLock(lock_path)
        return lock


def _after_fork_in_child() -> None:
    global _registry, _registry_mutex, generation
    _inherited.append(list(_registry.values()))
    _registry = weakref.WeakValueDictionary()
    _registry_mutex = threading.Lock()
    generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
