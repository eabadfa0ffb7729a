"""After another writer: picking up its version, and retrying a conditional write that lost.

Under the lock (a local file), a write first asks whether the stored document changed since this
store last saw it (``_sync``) and, if so, reads it into memory; the pending changes are then laid
over it key by key, so changes to different keys never lose each other.

Storage without a lock (an ``s3://`` object, ``Storage.conditional``). A write does not ask first
whether the object changed: its conditional ``replace`` fails with ``Conflict`` if it did, and the
store then re-reads, lays ``_pending`` over the new version key by key and tries again after a
jittered, growing pause (``_after_conflict``), until the call's ``lock_timeout`` is spent. A
transaction's body may have decided on values it read, so a transaction also remembers which keys
its body read (``_tx_reads``); if another writer changed one of them, retrying the writes alone
would be wrong, and the transaction fails with ``_StaleRead`` instead (``run_transaction`` runs the
body again).
"""

from __future__ import annotations

import contextlib
import time

from . import _interrupts
from . import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log
from ._codec.values import Entry
from ._document import ALL
from ._errors import TrainingStatusConflictError, TrainingStatusReadError
from ._load import METADATA
from ._opening import _Opening

logger = logging.getLogger("trainstatus")

# Pause after a lost conditional write: grows from the first to the longest, each jittered
# between half and all of it, so that writers that collided do not collide again in step.
FIRST_BACKOFF = 0.01
_LONGEST_BACKOFF = 1.0
# How often a store removes temp files of dead writers after another process's write (see _sync).
_CLEANUP_EVERY = 1.0


class _StaleRead(TrainingStatusConflictError):
    """A transaction's body read a key another writer changed before the transaction was written."""


class _Conflicts(_Opening):
    """Catching up with other writers (see the module doc)."""

    def _init_conflicts(self) -> None:
        self._last_cleanup = -_CLEANUP_EVERY  # when _sync last removed leftovers (monotonic)

    def _sync(self, *, ask: bool = True) -> None:
        """With the lock held: pick up a file another writer changed since we last saw it.

        ``ask=False``: only if the storage already knows it is out of date (see ``Storage.stale``).
        """
        if self._storage.changed() if ask else self._storage.stale():
            logger.debug("%s changed on disk; merging", self._location)
            self._load(initial=False, locked=True)
            # A change we did not make: its writer may have died since, leaving a temp file. At
            # most once a second: processes taking turns on one file reload at every write, and a
            # listing of the directory each time was a fifth of the handoff (issue 13).
            now = time.monotonic()
            if now - self._last_cleanup >= _CLEANUP_EVERY:
                self._last_cleanup = now
                self._storage.cleanup()

    def _after_conflict(self, backoff: float) -> float:
        """Wait, then read the version that won; ``_StaleRead`` if it changed what the body read.

        A local file's write loses only to a writer that got in through a lock file deleted by hand
        (``_lock.version``): it read again at once, with no pause, as the other writer is done with
        the version it made (or waits for ours)."""
        if self._storage.conditional:
            try:
                backoff = self._pause(backoff, "conflict")
            except TrainingStatusConflictError:
                # Out of time: still show what won (other writers' values), as a write that lost does.
                with contextlib.suppress(TrainingStatusReadError):
                    self._sync(ask=False)
                raise
        seen_doc, seen_meta = self._doc, self._meta
        self._sync(ask=False)
        stale = self._stale_read(seen_doc, seen_meta)
        if stale is not None:
            whole = stale == ALL
            what = "the document" if whole else f"{stale[0]}/{stale[1]}"
            raise _StaleRead(
                f"Another writer changed {what} in {self._location} after this transaction read "
                "it, so the transaction was not written: its changes may rest on the old value. "
                "Run it again on the new state (store.run_transaction(func) does that).",
                path=self._location,
                category=None if whole else stale[0],
                key=None if whole else stale[1],
            )
        return backoff

    def _stale_read(self, seen_doc: dict[str, dict[str, Entry]], seen_meta: dict[str, Entry]) -> tuple[str, str] | None:
        """The first key the transaction read whose stored value differs from ``seen_*``."""
        for category, key in sorted(self._tx_reads or ()):
            if self._vanished:  # deleted meanwhile: whatever the body read is gone
                return category, key
            if (category, key) == ALL:
                if seen_doc != self._doc or seen_meta != self._meta:
                    return ALL
            elif category == METADATA:
                if seen_meta.get(key) != self._meta.get(key):
                    return category, key
            elif seen_doc.get(category, {}).get(key) != self._doc.get(category, {}).get(key):
                return category, key
        return None

    def _pause(self, backoff: float, why: str | None, deadline: float | None | bool = False) -> float:
        """Sleep about ``backoff`` s (jittered) within ``deadline`` (default: the call's); the next backoff."""
        import random  # only after a lost race (imported at need: see test_startup)

        delay = random.uniform(backoff / 2, backoff)
        if deadline is False:
            deadline = self._deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TrainingStatusConflictError(
                    f"Could not save {self._location}: other writers kept changing it for "
                    f"{self._lock_timeout} s (lock_timeout), each time before this store's "
                    "conditional write landed, so nothing of this call was written. Open the store "
                    "with a longer lock_timeout=, or write less often.",
                    path=self._location,
                )
            delay = min(delay, left)
        logger.debug("%s: %s; retrying in %.3f s", self._location, why or "stale transaction", delay)
        _interrupts.sleep(delay)
        return min(2 * backoff, _LONGEST_BACKOFF)
