"""Committing: one write of the document in memory with the pending changes laid over it.

``_commit`` takes the lock (within what is left of the call's ``lock_timeout``) and ``_write``s;
``_write`` retries after a lost conditional write (``_conflicts``); ``_write_once`` is the write
itself: catch up with another writer, lay ``_pending`` over ``_doc`` (``apply``), render, replace
the stored document, and only then make the result the new ``_doc``. A write that fails leaves
memory as the file is (the new document when the file took it and only its durability is unsure;
forgotten, to be read again, when an interrupt leaves that unknown).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ._conflicts import FIRST_BACKOFF, _Conflicts
from ._document import apply
from ._errors import TrainingStatusVersionError, TrainingStatusWriteError, warn
from ._load import METADATA, STATUS_FORMAT_VERSION
from ._storage.base import Conflict

_AGAIN = "set the value again"  # what the storage's write errors say to do once the cause is fixed


@contextlib.contextmanager
def retold(todo: str) -> Iterator[None]:
    """Make a write error say ``todo`` (``delete it again``) where the storage, which does not
    know which call wrote, says to set the value again."""
    try:
        yield
    except TrainingStatusWriteError as exc:
        message = str(exc)
        if _AGAIN not in message:
            raise
        again = TrainingStatusWriteError(message.replace(_AGAIN, todo), errno=exc.errno, **exc._context())
        again.__dict__.update({k: v for k, v in vars(exc).items() if k not in vars(again)})
        raise again from exc.__cause__


class _Committing(_Conflicts):
    """Writing the document (see the module doc)."""

    def _init_committing(self, *, allow_downgrade: bool) -> None:
        self._allow_downgrade = allow_downgrade

    def _commit(self) -> None:
        """Write ``_doc`` with ``_pending`` laid over it (guard held; lock taken if not held)."""
        with self._storage.lock(self._remaining(), configured=self._lock_timeout):
            self._write()

    def _write(self) -> None:
        """``_commit`` with the lock held (on conditional storage: retried, see the module doc)."""
        backoff = FIRST_BACKOFF
        while True:
            try:
                self._write_once()
                return
            except Conflict:
                backoff = self._after_conflict(backoff)

    def _write_once(self) -> None:
        self._sync(ask=False)
        if not self._cleaned:
            self._storage.cleanup()
            self._cleaned = True
        if self._newer_format is not None and not self._allow_downgrade:
            raise TrainingStatusVersionError(
                f"Refusing to write {self._location}: it has format version "
                f"{self._newer_format!r}, newer than the {STATUS_FORMAT_VERSION!r} this "
                "trainstatus writes, and rewriting it would drop what this version does not "
                "understand. Upgrade trainstatus, or open the store with allow_downgrade=True "
                f"to rewrite it in format {STATUS_FORMAT_VERSION}.",
                path=self._location,
                found_version=self._newer_format,
            )
        base = {} if self._cleared else self._doc
        document = apply(base, self._pending)
        meta = dict(self._own_metadata) if self._cleared else self._meta
        # Rebuilds only the categories (or chunks of a big one) the pending changes touch.
        data = self._renderer.render({**document, METADATA: meta}, base, self._pending)
        try:
            self._storage.replace(data)
        except Conflict:
            raise
        except TrainingStatusWriteError as exc:
            if getattr(exc, "_replaced", False):  # in the file, only its durability is unsure
                self._doc, self._meta = document, meta
            self._storage.take_warning()  # the error says more than a kept version's warning
            raise
        except BaseException:
            # Interrupted (Ctrl-C) somewhere around the rename: whether the file changed is
            # unknown, so the next write reads it again rather than trust memory.
            self._storage.forget()
            raise
        self._doc, self._meta = document, meta
        unkept = self._storage.take_warning()
        if unkept is not None:
            warn(unkept)  # after memory took the write: -W error cannot leave it behind the file
