"""Where the document lives, behind one seam: ``Storage``, and the ``Conflict`` it may raise.

The store only needs: read the document (remembering which version it read), tell whether the
stored version changed since, replace it, lock it, keep a damaged one aside, and clear leftovers of
killed writers. ``local.LocalFile`` is the implementation for a path on a local filesystem;
``memory.Memory`` holds the document in the process (the ML-Agents drop-in before it is bound to a
path). An object store implements the same seam with conditional writes instead of a lock
(``_remote.object_store.ObjectStorage``: S3, GCS, Azure Blob).

Its own module so that the store and every backend depend on the seam alone, not on the local
file's lock, pin and closer thread. It imports no other module of the package (the types it names
are imported for type checkers only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import ContextManager

    from . import history as _history
    from .._errors import TrainingStatusWarning
    from .._lock import mailbox as _mailbox

__all__ = ["Conflict", "Storage"]


class Conflict(Exception):
    """``replace`` refused: the stored document is no longer the version last read or written.

    Only a ``conditional`` storage raises it; the store then reads again, lays its pending changes
    over what it finds and retries.
    """


class Storage:
    """The seam between the store and where its document is kept."""

    location: str
    lock_file: str | None = None  # what ``lock`` takes, for messages; None where nothing is
    # False: ``lock`` excludes other writers, so a write can trust ``changed()`` taken under it.
    # True: there is no lock; ``replace`` succeeds only if the stored version is still the one
    # last seen and raises ``Conflict`` otherwise (an object store's conditional write).
    conditional = False

    def read(self) -> bytes | None:
        """The stored document's bytes, or None when there is none; remembers this version."""
        raise NotImplementedError

    def changed(self) -> bool:
        """Whether the stored version differs from the one last read or written."""
        raise NotImplementedError

    def stale(self) -> bool:
        """Whether a write must read the document again first.

        Where the lock makes ``changed()`` cheap and final, the same question; a ``conditional``
        storage answers from what it knows without asking (its ``replace`` checks the version).
        """
        return self.changed()

    def exclusive(self) -> bool:
        """With the lock held and the document read: whether the lock keeps every other writer
        from replacing this version until it is let go. False where a write may still lose a race
        (``Conflict``): always on a ``conditional`` storage; on a local file with no file to lock
        yet, when a lock file deleted by hand let in another writer (``_lock.version``)."""
        return not self.conditional

    def replace(self, data: bytes) -> None:
        """Replace the stored document (the caller holds ``lock``); remembers the new version."""
        raise NotImplementedError

    def lock(self, timeout: float | None, *, configured: float | None = None) -> ContextManager[object]:
        """Exclude every other writer of this document while held; reentrant per thread.

        Waits at most ``timeout`` s; ``configured`` is the whole ``lock_timeout`` for messages.
        """
        raise NotImplementedError

    def lock_or_hand_over(self, timeout: float | None, offer: _mailbox.Offer, *,
                          configured: float | None = None) -> ContextManager[bool]:
        """``lock``, or, where another process holds it and takes over waiters' changes, hand
        ``offer``'s changes to it (``_lock.mailbox``): True then, once they are durably written."""
        return _not_handed(self.lock(timeout, configured=configured))

    kept_versions = 0  # the earlier versions a write keeps (``history=``)

    def collect(self, meta: Callable[[], bytes]) -> list[_mailbox.Request]:
        """With the lock held: changes other processes handed over (``lock_or_hand_over``) by
        stores whose key (``_GroupCommit._hand_over_key``) is ``meta()``."""
        return []

    def acknowledge(self, requests: list[_mailbox.Request]) -> None:
        """Once the write that carried ``requests`` is durable: tell their processes."""

    def move_aside(self) -> str:
        """Keep the stored document, byte for byte, under a new name; return that name."""
        raise NotImplementedError

    def leftovers(self) -> list[str]:
        """What killed writers may have left behind (stale unless a writer holds the lock)."""
        return []

    def cleanup(self) -> None:
        """Remove ``leftovers()`` (called with ``lock`` held, when nobody can be writing)."""

    def forget(self) -> None:
        """Forget the version last seen, so that ``changed()`` says yes until the next read."""

    def history(self) -> list[_history.Version]:
        """Earlier versions kept, oldest first ([] where none are kept)."""
        return []

    def take_warning(self) -> TrainingStatusWarning | None:
        """What the last ``replace`` has to report besides its result (issued by the caller)."""
        return None

    def close(self) -> None:
        """Release what this object holds open."""


@contextlib.contextmanager
def _not_handed(lock: ContextManager[object]) -> Iterator[bool]:
    with lock:
        yield False
