"""One call at a time: a store's mutex, the call's ``lock_timeout``, and whether it may still run.

Every call that changes a store holds its mutex (an RLock: a transaction's body calls ``set``).
``lock_timeout`` counts from the start of the outermost call (``_deadline``), so waiting for the
mutex, for the file lock and for retries all come out of one budget (``_remaining``). A closed
store, or one forked in the middle of a transaction, refuses the call here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from . import _interrupts
from ._document import _Document
from ._errors import TrainingStatusError, TrainingStatusLockTimeout


class _Guarded(_Document):
    """The store's call guard (see the module doc)."""

    def _init_guard(self, lock_timeout: float | None) -> None:
        self._lock_timeout = lock_timeout
        self._mutex = threading.RLock()
        self._guard_depth = 0  # guarded by _mutex
        self._deadline: float | None = None  # of the outermost guarded call; guarded by _mutex
        self._forked_in_transaction = False
        self._closed = False

    def _busy(self, timeout: float | None) -> TrainingStatusLockTimeout:
        return TrainingStatusLockTimeout(
            f"Could not use {self._location} within {timeout} s: another thread of this "
            "process is using this store (a transaction, or a write waiting for the lock). "
            "Let it finish, or open the store with a longer lock_timeout=.",
            path=self._location,
            lock_file=self._storage.lock_file,
        )

    @contextlib.contextmanager
    def _guard(self, start: float | None = None) -> Iterator[None]:
        """Hold this store's mutex; ``lock_timeout`` counts from ``start`` (default: now) for the
        whole call."""
        timeout = self._lock_timeout
        if timeout is None:
            deadline = None
            acquired = _interrupts.acquire(self._mutex, None)
        else:
            deadline = (time.monotonic() if start is None else start) + timeout
            acquired = _interrupts.acquire(self._mutex, max(0.0, deadline - time.monotonic()))
        if not acquired:
            raise self._busy(timeout)
        if self._guard_depth == 0:
            self._deadline = deadline
        self._guard_depth += 1
        try:
            if self._closed:
                raise TrainingStatusError(
                    f"The store on {self._location} is closed; open a new StatusStore to change it.",
                    path=self._location,
                )
            if self._forked_in_transaction:
                raise TrainingStatusError(
                    f"This StatusStore on {self._location} was inside a transaction when the "
                    "process forked, so it cannot be used in the child; open a new StatusStore here.",
                    path=self._location,
                )
            yield
        finally:
            self._guard_depth -= 1
            self._mutex.release()

    def _remaining(self) -> float | None:
        """Seconds left of the current call's ``lock_timeout`` (guard held)."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def _after_fork_in_child(self) -> None:
        # The thread holding the mutex did not come along; inside a transaction, though, the
        # child's copy of it is half done, and must not be written (see _guard).
        if self._tx_depth:
            self._forked_in_transaction = True
        else:
            self._mutex = threading.RLock()
            self._guard_depth = 0
            self._renderer.after_fork_in_child()
