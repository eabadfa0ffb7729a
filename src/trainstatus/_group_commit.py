"""Group commit: the ``set`` calls of several threads on one store, written together.

A plain ``set`` does not write alone when other threads are setting on the same store: its change
joins the open ``_Batch``. The first thread to find no write in progress leads: it takes the
locks, then the batch (every change queued by then, its own included), writes it once and hands
the outcome to every thread whose change it carried. So each ``set`` still returns only after a
write holding its change is durable, and raises if that write failed. A thread whose change is
still queued when its ``lock_timeout`` runs out takes it back and raises; once taken, a change is
written (the leader holds every lock by then) and its thread waits for the outcome.

The same across processes (``_lock.mailbox``): a leader that must wait for another process's lock hands
its batch to that process, which writes it with its own and says when it is durable, with an
acknowledgement bound to the batch (a word that does not check is not taken: the leader writes
its batch itself, as when that process dies); the batch is taken from the moment it is handed
over. A leader holding the lock after a wait writes, with its batch, what the processes waiting
behind it handed over, and tells them once the write is durable.
"""

from __future__ import annotations

import contextlib
import threading
import time

from . import _interrupts
from ._lock import mailbox as _mailbox
from ._committing import _Committing
from ._document import Change, apply
from ._errors import TrainingStatusError


class _Batch:
    """Changes of several threads' ``set`` calls, written together by one of them (the leader)."""

    __slots__ = ("changes", "done", "error", "taken", "written")

    def __init__(self) -> None:
        self.changes: list[Change] = []  # in arrival order: a later set of the same key wins
        # The leader is writing it, or handed it to another process: no change joins or leaves.
        self.taken = False
        self.written = False  # a write carrying it began (here or in another process)
        self.done = False
        self.error: BaseException | None = None


class _Offer(_mailbox.Offer):
    """A leader's batch, as handed to another process while waiting for its lock."""

    __slots__ = ("batch", "store")

    def __init__(self, store: _GroupCommit, batch: _Batch) -> None:
        self.store = store
        self.batch = batch

    def request(self) -> bytes | None:
        return self.store._hand_over(self.batch)


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
        offer = _Offer(self, batch)
        try:
            with self._guard(start), self._storage.lock_or_hand_over(self._remaining(), offer, configured=timeout) as handed:
                if handed:
                    self._handed_over(batch)
                else:
                    self._write_batch(batch)
        except BaseException:
            if not batch.written:
                # Failed before writing (a timeout, a closed store, Ctrl-C while waiting): take our
                # change back and let a waiting thread try, within its own lock_timeout. A batch
                # handed to another process may be in the file all the same: the other threads'
                # changes are then written twice, the same values (the next write reads the file
                # first, as after any other process's write).
                with self._queue:
                    batch.taken = False
                    self._withdraw(batch, change)
                    self._writing = False
                    self._wake_all()
            raise

    def _collect_handed_over(self) -> list[_mailbox.Request]:
        """Lay over ``_pending`` what waiting processes handed over that this write may carry."""
        if self._cleared or self._newer_format is not None:
            return []
        handed = self._storage.collect(self._hand_over_key)  # called only when others waited
        for request in handed:
            for key, entry in request.changes:
                self._pending[key] = entry
        return handed

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

    def _hand_over(self, batch: _Batch) -> bytes | None:
        """The payload handing ``batch`` to another process (``_Offer``); None: not to be handed."""
        if self._cleared or self._newer_format is not None or self._closed:
            return None  # a write only this store can make (or refuse)
        with self._queue:
            batch.taken = True
            if self._open_batch is batch:
                self._open_batch = None
            changes = list(batch.changes)
        return _mailbox.encode(changes, self._hand_over_key())

    def _hand_over_key(self) -> bytes:
        """What a holder compares before it carries a batch: it writes only what its waiter's store
        would have written alike (the same metadata of its own, versions kept, downgrade allowed
        or not)."""
        own = sorted((name, entry[0]) for name, entry in self._own_metadata.items())
        return repr((own, self._storage.kept_versions, self._allow_downgrade)).encode()

    def _handed_over(self, batch: _Batch) -> None:
        """Another process wrote ``batch`` (its box is DONE with that process's acknowledgement,
        ``_lock.mailbox``): memory becomes the file, as after a write of this store's own, other
        writers' changes included (guard held; read without the lock, as ``reload`` does: the
        file is only ever replaced whole).

        The file read is not compared with the batch: a value there other than this batch's is
        no sign that the holder left it out. Another writer may have set the key since the
        holder's write, or a later waiter's change to the same key rode in that same write;
        writing the batch again would put an older value back over a newer one.
        """
        try:
            batch.written = True
            try:
                self._load(initial=False, locked=False)
                if self._vanished:  # removed since: memory keeps what it knew, with this batch
                    self._doc = apply(self._doc, dict(batch.changes))
            except Exception:  # noqa: BLE001 - the set is durable; memory takes it, the next write reads
                self._doc = apply(self._doc, dict(batch.changes))
                self._storage.forget()
        finally:
            with self._queue:
                batch.done = True
                self._writing = False
                self._wake_all()

    def _write_batch(self, batch: _Batch) -> None:
        """Write every change of ``batch`` at once and tell their threads (guard and lock held).

        With it go the changes waiting processes handed over (``_lock.mailbox``), acknowledged once
        the write is durable; if it fails they are not, and each of them writes its own.
        """
        with self._queue:
            batch.taken = batch.written = True
            if self._open_batch is batch:
                self._open_batch = None
        try:
            for key, entry in batch.changes:
                self._pending[key] = entry
            handed = self._collect_handed_over()
            self._write()
            if handed:
                self._storage.acknowledge(handed)
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
