"""Group commit: the ``set`` calls of several threads on one store, written together.

A plain ``set`` does not write alone when other threads are setting on the same store: its change
joins the open ``_Batch``. The first thread to find no write in progress leads: it takes the
locks, then the batch (every change queued by then, its own included), writes it once and hands
the outcome to every thread whose change it carried. So each ``set`` still returns only after a
write holding its change is durable, and raises if that write failed. A thread whose change is
still queued when its ``lock_timeout`` runs out takes it back and raises; once taken, a change is
written (the leader holds every lock by then) and its thread waits for the outcome.
"""

from __future__ import annotations

import contextlib
import threading
import time

from . import _interrupts
from ._committing import _Committing
from ._document import Change
from ._errors import TrainingStatusError


class _Batch:
    """Changes of several threads' ``set`` calls, written together by one of them (the leader)."""

    __slots__ = ("changes", "done", "error", "taken")

    def __init__(self) -> None:
        self.changes: list[Change] = []  # in arrival order: a later set of the same key wins
        self.taken = False  # the leader holds the locks and is writing it; no change joins or leaves
        self.done = False
        self.error: BaseException | None = None


def _error_for_waiter(error: BaseException, location: str) -> BaseException:
    """The failure of a group write as raised in a thread whose change it carried, not the leader.

    Each thread gets its own copy (one exception object raised in several threads at once would
    collect all their tracebacks); the leader raises the original.
    """
    if isinstance(error, Exception):
        try:
            import copy  # only for a failed batch's waiters (imported at need: see test_startup)

            twin = copy.copy(error)
        except Exception:  # noqa: BLE001 - an exception class that cannot be copied: described below
            twin = None
        if type(twin) is type(error) and str(twin) == str(error):
            assert twin is not None
            twin.__cause__ = error.__cause__
            twin.__suppress_context__ = error.__suppress_context__
            return twin
    failure = TrainingStatusError(
        f"The write of {location} that carried this change was interrupted in another thread "
        f"({type(error).__name__}); the change may not be in the file. Set it again.",
        path=location,
    )
    failure.__cause__ = error
    return failure


class _GroupCommit(_Committing):
    """Writing the ``set`` calls of several threads together (see the module doc)."""

    def _init_group_commit(self) -> None:
        self._queue = threading.Lock()  # guards the three below
        self._open_batch: _Batch | None = None  # where a set joins; None until a set opens one
        self._writing = False  # a leader is writing (or waiting for the locks to write)
        # Threads waiting for a group write or for the turn to lead, each on its own taken Lock,
        # released to wake it (what a Condition does, but the wait is a C-level acquire, which
        # an interrupt leaves either taken or not: see _interrupts).
        self._waiters: list[threading.Lock] = []

    def _set_grouped(self, change: Change) -> None:
        """Write ``change`` together with whatever other threads are setting (see the module doc)."""
        start = time.monotonic()
        timeout = self._lock_timeout
        waiter: threading.Lock | None = None
        with self._queue:
            batch = self._open_batch
            if batch is None:
                batch = self._open_batch = _Batch()
            batch.changes.append(change)
            lead = not self._writing
            self._writing = True
        while not lead:
            with self._queue:
                if waiter is not None:
                    self._forget_waiter(waiter)  # woken, or its wait ran out
                if batch.done:
                    break
                if not self._writing:
                    self._writing = lead = True  # the leader withdrew: lead this batch
                    break
                remaining = None
                if not batch.taken and timeout is not None:
                    remaining = start + timeout - time.monotonic()
                    if remaining <= 0:
                        self._withdraw(batch, change)
                        raise self._busy(timeout)
                waiter = threading.Lock()
                waiter.acquire()
                self._waiters.append(waiter)
            try:
                _interrupts.acquire(waiter, remaining)
            except BaseException:
                # Interrupted while waiting: a change not taken yet is taken back; once taken,
                # the leader writes it (memory follows the file there, in the leader's thread).
                with self._queue:
                    self._forget_waiter(waiter)
                    if not batch.taken and not batch.done:
                        self._withdraw(batch, change)
                raise
        if not lead:
            if batch.error is not None:
                raise _error_for_waiter(batch.error, self._location)
            return
        try:
            with self._guard(start), self._storage.lock(self._remaining(), configured=timeout):
                self._write_batch(batch)
        except BaseException:
            if not batch.taken:
                # Failed before writing (a timeout, a closed store): take our change back and let
                # a waiting thread try, within its own lock_timeout.
                with self._queue:
                    self._withdraw(batch, change)
                    self._writing = False
                    self._wake_all()
            raise

    def _forget_waiter(self, waiter: threading.Lock) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _wake_all(self) -> None:
        """Wake every waiting thread, to look at the state again (``_queue`` held)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.release()

    def _withdraw(self, batch: _Batch, change: Change) -> None:
        """Take ``change`` out of a batch not yet taken (``_queue`` held)."""
        for index, queued in enumerate(batch.changes):
            if queued is change:
                del batch.changes[index]
                break
        if not batch.changes and self._open_batch is batch:
            self._open_batch = None

    def _write_batch(self, batch: _Batch) -> None:
        """Write every change of ``batch`` at once and tell their threads (guard and lock held)."""
        with self._queue:
            batch.taken = True
            if self._open_batch is batch:
                self._open_batch = None
        try:
            for key, entry in batch.changes:
                self._pending[key] = entry
            self._write()
        except BaseException as exc:
            batch.error = exc
            raise
        finally:
            self._pending.clear()
            with self._queue:
                batch.done = True
                self._writing = False
                self._wake_all()

    def _after_fork_in_child(self) -> None:
        # Changes other threads had queued are theirs to write, in the parent.
        self._init_group_commit()
        super()._after_fork_in_child()
