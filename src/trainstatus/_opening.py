"""Opening a store: reading the document, and recovering when it is damaged or missing.

``_load`` reads the stored document into memory (``_take``). A missing file is an empty document,
or, when resuming, the newest intact version of its history put back in its place. A damaged
file is kept aside byte for byte (under the lock, after reading again) and replaced the same way,
unless the store is ``strict``. A file naming a key twice keeps its bytes aside before a write
drops one. Temp files a dead writer left are removed once nobody holds the lock. A reload after
another writer's change goes through here too (``initial=False``), where the last good state this
store knew beats an empty document.
"""

from __future__ import annotations

import contextlib

from ._storage import history as _history
from ._storage.base import Conflict
from . import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log
from ._checkpoints.files import CHECKPOINTS, FINAL_CHECKPOINT, describe_missing
from ._checkpoints.roots import ROOT
from ._codec.values import decode
from ._errors import (
    TrainingStatusCorruptError,
    TrainingStatusCorruptWarning,
    TrainingStatusLockTimeout,
    TrainingStatusMissingWarning,
    TrainingStatusWriteError,
    warn,
)
from ._guard import _Guarded
from ._load import Corrupt, Document, check_metadata, load_document

logger = logging.getLogger("trainstatus")

_CHECKPOINT_KEYS = frozenset({CHECKPOINTS, FINAL_CHECKPOINT, ROOT})  # and the folder their paths are under


class _NotRestored(Exception):
    """A version of the history could not be written back at open; the message says so."""


class _Superseded(Exception):
    """A version of the history was not written back: another writer made the file meanwhile (it
    got in through a lock file deleted by hand), and its file is the one to read."""


class _Opening(_Guarded):
    """Reading the stored document into memory, with recovery (see the module doc)."""

    def _init_opening(self, *, resume: bool, strict: bool) -> None:
        self._resume = resume
        self._strict = strict
        self._vanished = False  # the last read after opening found no document at all
        self._cleaned = False  # leftovers of dead writers removed (at open or before a first write)

    def _load(self, *, initial: bool, locked: bool) -> None:
        data = self._storage.read()
        self._vanished = data is None and not initial
        try:
            self._take(data, initial=initial, locked=locked)
        except BaseException:
            # Interrupted (Ctrl-C) before the document read is installed: the storage already
            # records that version as seen, which would let the next write replace it with the
            # older document in memory. Forget it, so that write reads again.
            self._storage.forget()
            raise

    def _take(self, data: bytes | None, *, initial: bool, locked: bool) -> None:
        """``_load`` from the bytes read (None: no document)."""
        if data is None:
            if not initial:
                # Removed under us (by hand, or kept aside as damaged by another store): what this
                # store last knew is the best state there is; the next write puts it back.
                logger.debug("%s disappeared; keeping what this store knew", self._location)
                return
            not_restored = ""
            if self._resume and self._storage.history():
                if not locked:
                    # Put a kept version back under the lock, after reading again: another
                    # process may be doing the same, or may have written the file meanwhile.
                    with self._storage.lock(self._lock_timeout, configured=self._lock_timeout):
                        self._load(initial=True, locked=True)
                    return
                found = self._from_history()
                if found is not None:
                    try:
                        restored = self._restore(found)
                    except _NotRestored as failure:
                        not_restored = f" {failure}"
                        found = None
                    except _Superseded:
                        self._load(initial=True, locked=True)
                        return
                if found is not None:
                    warn(TrainingStatusMissingWarning(
                        f"Resuming, but there is no status file at {self._location}: {restored} was "
                        "put back in its place; changes written after that version are lost."
                        f"{self._missing_checkpoint_files()} "
                        f"`trainstatus history {self._location}` lists the versions kept.",
                        path=self._location,
                    ))
                    return
            if self._resume:
                warn(TrainingStatusMissingWarning(
                    f"Resuming, but there is no status file at {self._location}: curriculum "
                    f"lessons, kept checkpoints and ELO start from scratch.{not_restored} Check the run "
                    "folder, or open without resume=True for a new run.",
                    path=self._location,
                ))
            self._install(Document({}, None))
            return
        try:
            document = load_document(data)
        except Corrupt as exc:
            self._damaged(exc.reason, initial=initial, locked=locked)
            return
        if document.duplicates:
            self._duplicates(data, document)
        if initial:
            check_metadata(document.metadata, self._registered_metadata(), location=self._location)
        self._install(document)

    def _duplicates(self, data: bytes, document: Document) -> None:
        """Warn that the file names a key twice, keeping its bytes aside before a write drops one."""
        keep_copy = getattr(self._storage, "keep_copy", None)
        kept = ""
        moved: str | None = None
        if keep_copy is not None:
            try:
                moved = keep_copy(data)
                kept = f" Its bytes were kept, as they are, as {moved}."
            except OSError as exc:
                kept = f" Its bytes could not be kept aside ({exc.strerror or exc}): copy the file now."
        listed = "; ".join(str(d) for d in document.duplicates[:5])
        more = f" (and {len(document.duplicates) - 5} more)" if len(document.duplicates) > 5 else ""
        warn(TrainingStatusCorruptWarning(
            f"{self._location} gives a name more than once: {listed}{more}. The next write keeps only "
            f"the value read.{kept} Check which value is right and set it.",
            path=self._location,
            moved_to=moved,
        ))

    def _damaged(self, reason: str, *, initial: bool, locked: bool) -> None:
        if self._strict:
            raise TrainingStatusCorruptError(
                f"{self._location} is damaged: {reason}. It was left untouched because the store "
                "was opened with strict=True; repair or remove it, or open without strict to keep "
                "it aside and start from the newest intact version in its history (empty without "
                f"one; `trainstatus history {self._location}` lists them).",
                path=self._location,
            )
        if not locked:
            # Keep it aside under the lock, after reading again: another process may have moved
            # or rewritten it meanwhile.
            with self._storage.lock(self._lock_timeout if initial else self._remaining(), configured=self._lock_timeout):
                self._load(initial=initial, locked=True)
            return
        try:
            moved = self._storage.move_aside()
        except OSError as exc:
            raise TrainingStatusCorruptError(
                f"{self._location} is damaged ({reason}) and could not be kept aside: "
                f"{exc.strerror or exc}. It was left untouched; make its directory writable or "
                "move the file away by hand, then open the store again.",
                path=self._location,
            ) from exc
        found = self._from_history() if initial else None
        not_restored = ""
        if found is not None:
            try:
                restored = self._restore(found)
            except _NotRestored as failure:
                not_restored = f" {failure}"
            except _Superseded:
                warn(TrainingStatusCorruptWarning(
                    f"{self._location} was damaged ({reason}); it was kept, byte for byte, as {moved}, and "
                    "another writer wrote the file anew meanwhile: that file was read.",
                    path=self._location,
                    moved_to=moved,
                ))
                self._load(initial=True, locked=True)
                return
            else:
                warn(TrainingStatusCorruptWarning(
                    f"{self._location} was damaged ({reason}); it was kept, byte for byte, as {moved}, and "
                    f"{restored} was put back in its place: changes written after that version are lost "
                    f"unless that copy still holds them.{self._missing_checkpoint_files()} "
                    f"`trainstatus history {self._location}` lists the versions kept.",
                    path=self._location,
                    moved_to=moved,
                ))
                return
        if initial:
            outcome = "the store starts empty"
        else:
            outcome = "the next write puts back what this store last read or wrote"
        warn(TrainingStatusCorruptWarning(
            f"{self._location} was damaged ({reason}); it was kept, byte for byte, as {moved} and "
            f"{outcome}.{not_restored} Inspect that file to recover anything newer.",
            path=self._location,
            moved_to=moved,
        ))
        if initial:
            self._install(Document({}, None))
        # Otherwise keep _doc: the last good state this store knew beats an empty document.

    def _missing_checkpoint_files(self) -> str:
        """A sentence naming the checkpoint files the document lists that are gone ("" if none).

        A version from the history is older than the file it stands in for: the trainer may have
        removed checkpoints it listed since (trimmed to keep_checkpoints), and a resume would try
        to load them.
        """
        listed = {category: {key: decode(entry) for key, entry in keys.items() if key in _CHECKPOINT_KEYS}
                  for category, keys in self._doc.items()}
        return describe_missing(listed, self._location)

    def _from_history(self) -> tuple[_history.Version, Document, bytes] | None:
        """The newest kept version that loads as a status document, with its document and bytes."""
        for version in reversed(self._storage.history()):
            try:
                data = _history.read(version)
                document = load_document(data)
            except (OSError, Corrupt):
                continue  # pruned meanwhile, or damaged too: an older one may do
            return version, document, data
        return None

    def _restore(self, found: tuple[_history.Version, Document, bytes]) -> str:
        """Put a kept version back in the file, byte for byte (lock held), and load it; what it was."""
        version, document, data = found
        unsure = ""
        try:
            self._storage.replace(data)
        except Conflict:
            raise _Superseded from None
        except TrainingStatusWriteError as exc:
            if not getattr(exc, "_replaced", False):
                cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
                raise _NotRestored(
                    f"Version {version.sequence} of its history could not be put back ({cause.strerror or cause}); "
                    f"once the cause is fixed, `trainstatus restore {self._location} {version.sequence}` "
                    "puts it back.") from exc
            unsure = " (its directory could not be synced: it may not survive a power loss)"
        unkept = self._storage.take_warning()
        check_metadata(document.metadata, self._registered_metadata(), location=self._location)
        self._install(document)
        import datetime  # only for a restore (imported at need: see test_startup)

        written = datetime.datetime.fromtimestamp(version.mtime_ns / 1e9, datetime.timezone.utc)
        if unkept is not None:
            warn(unkept)
        return f"version {version.sequence} from its history (written {written:%Y-%m-%d %H:%M:%S} UTC){unsure}"

    def _clean_leftovers_at_open(self) -> None:
        if not self._storage.leftovers():
            return
        # A live writer holds the lock while its temp file exists: only clean when nobody does.
        # A lock that cannot even be taken (read-only directory) only means: clean later.
        with contextlib.suppress(TrainingStatusLockTimeout, TrainingStatusWriteError), self._storage.lock(0):
            self._storage.cleanup()
            self._cleaned = True
