"""Transactions: several changes written at once, with the lock held from the first read.

The outermost transaction of a thread takes the guard and the lock, picks up what other writers
wrote, and owns the store's pending changes (``_tx_owner``) until its end writes them in one
commit; a nested one only keeps a savepoint to roll back to. ``set``, ``get`` and ``delete`` of the
owning thread join it; other threads wait at the guard.
"""

from __future__ import annotations

import contextlib
import threading

from . import _interrupts
from ._lock import path_lock as _locking
from ._codec.values import Entry
from ._errors import TrainingStatusError
from ._group_commit import _GroupCommit

TYPE_CHECKING = False  # typing.TYPE_CHECKING: typing (and the re it imports) are 4 ms of every start
if TYPE_CHECKING:
    from typing import Any, Generic, TypeVar

    _S = TypeVar("_S", bound="_Transactions")
else:
    class Generic:
        """typing.Generic's part at run time: ``Generic[_S]`` as a base is this class (annotations,
        ``_Transaction[Any]`` among them, are strings at run time)."""

        __slots__ = ()

        def __class_getitem__(cls, parameters: object) -> type:
            return cls

    _S = None


class _Transaction(Generic[_S]):
    """What ``StatusStore.transaction()`` returns: a class, not a generator, for ``__enter__``.

    Once the transaction is open the only way out is ``__exit__``, which the with statement calls
    only if ``__enter__`` returned; so no signal may raise between the opening and the return.
    Both frames hold signals back on every line (``_interrupts.BOUNDARIES``); what arrived while
    opening is delivered before returning, and if that raises the transaction is closed first.
    The body runs with signals going through at once: it is the caller's code.
    """

    __slots__ = ("main", "opened", "outer", "savepoint", "stack", "start", "store")

    def __init__(self, store: _S, start: float | None = None) -> None:
        self.store = store
        self.start = start
        self.main = False
        self.opened = False
        self.outer = False
        self.savepoint: tuple[dict[tuple[str, str], Entry | None], bool, bool] = ({}, False, False)
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> _S:
        if self.opened:
            raise TrainingStatusError(
                f"This transaction on {self.store._location} is already open; call store.transaction() "
                "again for a nested one.",
                path=self.store._location,
            )
        self.opened = True
        main = self.main = _interrupts.enter()
        try:
            self.store._begin(self)
        except BaseException:
            if main:
                _interrupts.leave()
            raise
        if not main:
            return self.store
        _interrupts.hold()
        state = _interrupts.state
        while True:
            if not state.pending: state.depth -= 1; state.users -= 1; return self.store  # noqa: E701,E702 - one line: atomic
            try:
                _interrupts.deliver()  # with the transaction open: a handler may just set a flag
            except BaseException:
                _interrupts.unhold()
                try:
                    self.store._end(self, failed=True)
                finally:
                    _interrupts.leave()
                raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self.main: _interrupts.state.depth += 1  # noqa: E701 - the hold counts it as a user already
        try:
            self.store._end(self, failed=exc_type is not None)
        finally:
            if self.main:
                _interrupts.leave()


class _Transactions(_GroupCommit):
    """Opening and closing transactions (see the module doc)."""

    def _init_transactions(self) -> None:
        self._tx_generation = _locking.generation  # a transaction opened before a fork is not the child's

    def _begin(self, tx: _Transaction[Any]) -> None:
        """Open ``tx``: the guard, and for the outermost the lock and what others wrote."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._guard(tx.start))
            tx.outer = self._tx_depth == 0
            if tx.outer:
                stack.enter_context(self._storage.lock(self._remaining(), configured=self._lock_timeout))
                self._sync()
                if not self._storage.exclusive():  # its write may lose a race: note what the body reads
                    self._tx_reads = set()
                self._tx_owner = threading.get_ident()
                self._tx_generation = _locking.generation
                stack.callback(self._end_transaction)
            tx.savepoint = (dict(self._pending), self._save_requested, self._cleared)
            self._tx_depth += 1
            tx.stack = stack.pop_all()

    def _end(self, tx: _Transaction[Any], failed: bool) -> None:
        """Close ``tx``: roll back (``failed``) or, for the outermost, write; then let go."""
        with tx.stack:
            self._tx_depth -= 1
            if failed:
                self._pending, self._save_requested, self._cleared = tx.savepoint
                return
            if tx.outer and (self._pending or self._save_requested or self._cleared):
                if self._tx_generation != _locking.generation:
                    raise TrainingStatusError(
                        f"A transaction on {self._location} was opened before this process was "
                        "forked; it is not committed in the child. Open a new StatusStore in the "
                        "child and redo the changes there.",
                        path=self._location,
                    )
                self._commit()

    def _end_transaction(self) -> None:
        self._tx_reads = None
        self._pending.clear()
        self._save_requested = False
        self._cleared = False
        self._tx_owner = None


# Their frames are where the body's end meets the commit (see _Transaction's doc).
_interrupts.BOUNDARIES.update((_Transaction.__enter__.__code__, _Transaction.__exit__.__code__))
