"""Checkpoint lists that never name a file that is gone: ``CheckpointList``, the public class.

A behavior's category holds ``checkpoints`` (a list, oldest first) and ``final_checkpoint`` (one
entry), each entry in ML-Agents' layout: ``steps``, ``file_path``, ``reward``, ``creation_time``,
``auxillary_file_paths`` (ML-Agents' spelling, kept so both read each other's files), plus
``files``: the size of each file recorded (``files.FILES``). ``file_path`` may be a
folder (Transformers' ``checkpoint-500/``): ``files`` then lists every file in it.

The order of ``add`` is the point of this module. ML-Agents 1.1.0's ``add_checkpoint`` deletes the
files of the checkpoints it drops and only then sets the list; a kill in between leaves a status
that lists files that are gone. Here:

1. check the arguments and that every file exists, and take their sizes (nothing done yet if not:
   ``entries``);
2. fsync each file (each file and folder of a checkpoint folder), its directory and the folders
   above that up to the one the status file is in,
   so the record never outlives the data after a power loss (``folders``);
3. record the entry, trimmed to ``keep``, in one transaction (one durable write, merged with what
   other writers set meanwhile);
4. only then remove the files of the dropped entries, skipping any file another entry still lists
   (a dropped folder: its recorded files, then the folder if that left it empty: ``folders``).

A kill between 3 and 4 leaves files that are no longer listed: disk space, never a wrong pointer.

This module keeps that order and the list itself (reading, trimming, the warning about files
left behind); ``entries`` checks a new entry, ``folders`` syncs and removes files, ``usable`` says
whether a recorded entry can be used. It imports those, ``files`` and the store.
"""

from __future__ import annotations

import enum
import itertools
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .entries import new_entry
from .files import CHECKPOINTS, FINAL_CHECKPOINT, _faults, _fspath, _join
from .folders import remove_unlisted, sync_entry
from .roots import ROOT, rebase, recorded_folder
from .usable import _steps, newest_usable, unusable, warn_skipped
from .._errors import (
    TrainingStatusCheckpointWarning,
    TrainingStatusError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    warn,
)
from .._load import METADATA
from .._committing import retold
from .._store import StatusStore

__all__ = ["CheckpointList", "as_list"]


Check = Callable[[dict[str, Any]], object]


class CheckpointList:
    """The checkpoints of one behavior (``category``), kept so that the status never names a file
    that is gone.

    ``CheckpointList(store, "Walker", keep=5)`` reads and writes ``store``'s ``Walker/checkpoints``
    (oldest first) and ``Walker/final_checkpoint`` in ML-Agents' entry layout, so lists written by
    ML-Agents and by this class read each other. ``add`` records a new checkpoint and removes the
    files of those beyond ``keep`` only after the record is durable; ``latest()`` is the newest
    checkpoint whose files are all there (and pass a check of the caller's).

    - ``keep``: how many checkpoints the list holds (ML-Agents' ``keep_checkpoints``, default 5);
      ``None`` keeps every one (what ML-Agents does with ``keep_checkpoints: 0``).
    - ``root``: the directory relative file paths are resolved against; paths are stored as given,
      and the directory in the category's ``checkpoint_root`` with each entry ``add`` and
      ``set_final`` record (relative to the status file's folder when it is inside it), so that
      every reader (``trainstatus check --files``, another ``CheckpointList``) finds the files
      from any current directory; the entries recorded under another folder (the current one
      when none was recorded) are moved onto it in that write, naming the same files. Default:
      the directory the category records, else the current directory at each call, as ML-Agents does.

    Entries are read from the store's memory, as ``StatusStore.get`` does; ``store.reload()``
    picks up what other processes wrote (``add`` and ``prune_missing`` do it themselves).
    """

    def __init__(self, store: StatusStore, category: str | enum.Enum, *, keep: int | None = 5,
                 root: str | bytes | os.PathLike[str] | os.PathLike[bytes] | None = None) -> None:
        if not isinstance(store, StatusStore):
            raise TrainingStatusTypeError(
                f"CheckpointList needs a StatusStore as store=, not {type(store).__name__!r} ({store!r}); "
                "open one with StatusStore('results/run1/run_logs/training_status.json')."
            )
        location = store.path
        if isinstance(category, enum.Enum) and isinstance(category.value, str):
            category = category.value
        if type(category) is not str:
            raise TrainingStatusTypeError(
                f"CheckpointList category= must be a str (the behavior name, e.g. 'Walker'), not "
                f"{type(category).__name__!r} ({category!r}), for {location}.",
                path=location,
            )
        if category == METADATA:
            raise TrainingStatusValueError(
                f"The category 'metadata' is the metadata block of {location}, not a behavior; give "
                "the behavior name the checkpoints belong to (e.g. 'Walker').",
                path=location, category=category,
            )
        if keep is not None and (type(keep) is not int or keep < 1):
            raise (TrainingStatusValueError if type(keep) is int else TrainingStatusTypeError)(
                f"CheckpointList keep= must be a number of checkpoints >= 1, or None to keep every "
                f"one, not {keep!r}, for {category} in {location}"
                + (" (ML-Agents' keep_checkpoints: 0 means keep every one: pass keep=None)." if keep == 0 else "."),
                path=location, category=category,
            )
        if root is not None:
            try:
                root = os.path.abspath(_fspath(root))
            except TypeError:
                raise TrainingStatusTypeError(
                    f"CheckpointList root= must be a directory path (str, bytes or os.PathLike) or "
                    f"None, not {type(root).__name__!r} ({root!r}), for {category} in {location}.",
                    path=location, category=category,
                ) from None
        self._store = store
        self._category: str = category
        self._keep = keep
        self._root: str | None = root

    @property
    def store(self) -> StatusStore:
        """The store the list lives in."""
        return self._store

    @property
    def category(self) -> str:
        """The behavior's category name."""
        return self._category

    @property
    def keep(self) -> int | None:
        """How many checkpoints the list holds; None: every one."""
        return self._keep

    @property
    def root(self) -> str | None:
        """The absolute directory given as ``root=``; None: the one the category records, else
        the current one (``resolve(".")`` is the one in use)."""
        return self._root

    def __repr__(self) -> str:
        return f"CheckpointList({self._store!r}, {self._category!r}, keep={self._keep!r}, root={self._root!r})"

    def resolve(self, file_path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
        """The absolute path of ``file_path`` as this list finds it: a relative one under ``root=``,
        else the folder the category records, else the current directory."""
        try:
            given = _fspath(file_path)
        except TypeError:
            raise TrainingStatusTypeError(
                f"CheckpointList.resolve: file_path= must be a path (str, bytes or os.PathLike), not "
                f"{type(file_path).__name__!r} ({file_path!r}), for {self._category} in {self._store.path}.",
                path=self._store.path, category=self._category,
            ) from None
        return _join(self._folder(), given)

    # -- reading -----------------------------------------------------------------------------

    def entries(self) -> list[dict[str, Any]]:
        """The recorded checkpoints, oldest first (copies); ``[]`` when there are none.

        Items that are not entries in ML-Agents' layout are returned as they are.
        """
        return self._list(self._store.get(self._category, CHECKPOINTS))

    def latest(self, check: Check | None = None) -> dict[str, Any] | None:
        """The newest checkpoint whose files all exist, with the sizes the entry recorded, and, if
        given, pass ``check(entry)``.

        Newest means the highest ``steps``, then the later in the list. Newer entries that fail
        are skipped and reported in one ``TrainingStatusCheckpointWarning`` (each entry and why);
        they stay listed. ``check`` gets a copy of the entry (``resolve(entry["file_path"])`` is
        its file) and returns true for a usable checkpoint; an exception it raises counts as false
        (a loader that raises on a half-written file is a good check). None when no checkpoint is
        usable (warned about too if any were listed).
        """
        chosen, skipped = newest_usable(self.entries(), check, self._folder())
        if skipped:
            self._report(CHECKPOINTS, skipped, chosen)
        return chosen  # type: ignore[no-any-return]

    def final(self, check: Check | None = None) -> dict[str, Any] | None:
        """The final checkpoint if it is recorded, its files all exist and it passes ``check``.

        A recorded one that fails is reported in a ``TrainingStatusCheckpointWarning`` and None is
        returned; ``store.get(category, "final_checkpoint")`` reads it as it is.
        """
        entry = self._store.get(self._category, FINAL_CHECKPOINT)
        if entry is None:
            return None
        problem = unusable(entry, check, self._folder())
        if problem is None:
            return dict(entry)
        self._report(FINAL_CHECKPOINT, [(entry, problem)], None)
        return None

    # -- writing -----------------------------------------------------------------------------

    def add(self, steps: int, file_path: str | bytes | os.PathLike[str] | os.PathLike[bytes], *,
            reward: float | None = None,
            auxillary_file_paths: Iterable[str | bytes | os.PathLike[str] | os.PathLike[bytes]] = (),
            creation_time: float | None = None, synced: bool = False) -> dict[str, Any]:
        """Record a checkpoint whose files are written, then remove those beyond ``keep``.

        ``file_path`` (and each of ``auxillary_file_paths``) must be an existing file: write it
        completely first. ``file_path`` may instead be a checkpoint folder holding at least one
        file (Transformers' ``checkpoint-500/``): the entry lists every file in it. The size of
        each file is recorded in the entry's ``files``; ``latest()`` and ``final()`` skip an entry
        whose files no longer have those sizes. Unless ``synced=True`` (the caller fsynced them already), each file, its
        directory and the folders above that up to the one shared with the status file are fsynced
        (a ``models/`` folder made in this run is an entry of its parent), so that after a power
        loss the list never names lost data. The
        entry is then appended in one write (a transaction: what other writers set meanwhile is
        kept) and the list trimmed to ``keep``, oldest first. Only after that write returned are
        the files of the dropped entries removed, main and auxiliary files (a folder's recorded
        files, then the folder if that left it empty), skipping any that an
        entry of the document still lists (a shared auxiliary file, the final checkpoint's). A kill
        in between leaves unlisted files, never a listed file that is gone. ``creation_time``
        defaults to now (``time.time()``); ``reward`` may be NaN (what ML-Agents records when no
        episode ended), which is kept as NaN.

        The same checkpoint recorded again (the same ``steps`` and the same main file, as ML-Agents
        does for the step it resumed from) replaces its entry in place rather than adding a second
        one; no file is removed for it.

        Returns the entry recorded. Bad arguments and missing files raise before anything is
        written or removed (``TrainingStatusTypeError``, ``TrainingStatusValueError``,
        ``TrainingStatusCheckpointError``).
        """
        return self._add(steps, file_path, reward=reward, auxillary_file_paths=auxillary_file_paths,
                         creation_time=creation_time, synced=synced)

    def _add(self, steps: Any, file_path: Any, *, reward: Any = None, auxillary_file_paths: Any = (),
             creation_time: Any = None, synced: Any = False, fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``add``, with ``fields`` after the entry's own (the integrations' ``world_size``; a name
        of the entry's own is not replaced)."""
        entry, paths = self._prepare(CHECKPOINTS, steps, file_path, reward, auxillary_file_paths,
                                     creation_time, synced)
        entry.update((name, value) for name, value in (fields or {}).items() if name not in entry)
        if _in_transaction(self._store):
            # The record would only be written when the caller's transaction ends, after this
            # returns: removing the dropped files now could leave them listed, and later is not ours.
            raise TrainingStatusError(
                f"CheckpointList.add() cannot run inside a transaction of {self._store.path}: it removes "
                "old checkpoint files only after its own write, which a transaction would delay. Call "
                "add() after the with store.transaction() block. Nothing was recorded or removed.",
                **self._context(CHECKPOINTS),
            )
        self._list(self._store.get(self._category, CHECKPOINTS))  # refuse a damaged list before the fsyncs
        if not synced:
            self._sync(CHECKPOINTS, entry, paths)
        with retold("add the checkpoint again"):
            dropped, document = self._store.run_transaction(lambda store: self._record(store, entry))
        if dropped:
            self._remove(dropped, document)
        return dict(entry)

    def set_final(self, steps: int, file_path: str | bytes | os.PathLike[str] | os.PathLike[bytes], *,
                  reward: float | None = None,
                  auxillary_file_paths: Iterable[str | bytes | os.PathLike[str] | os.PathLike[bytes]] = (),
                  creation_time: float | None = None, synced: bool = False) -> dict[str, Any]:
        """Record the final checkpoint (``final_checkpoint``), checked and synced as ``add`` does.

        It replaces the one recorded before without removing any file. Returns the entry.
        """
        entry, paths = self._prepare(FINAL_CHECKPOINT, steps, file_path, reward, auxillary_file_paths,
                                     creation_time, synced)
        if not synced:
            self._sync(FINAL_CHECKPOINT, entry, paths)

        def body(store: StatusStore) -> None:  # with the folder its paths are under, in one write
            self._record_root(store, store.to_dict())
            store.set(self._category, FINAL_CHECKPOINT, entry)

        with retold("set the final checkpoint again"):
            if self._root is None:
                self._store.set(self._category, FINAL_CHECKPOINT, entry)
            else:
                self._store.run_transaction(body)
        return dict(entry)

    def prune_missing(self) -> list[dict[str, Any]]:
        """Drop, in one write, the checkpoints whose files (main or auxiliary) are gone or of
        another size than recorded; return them.

        Their remaining files are left on disk. Nothing is written when nothing is missing. Entries
        that are not in ML-Agents' layout are kept (``latest()`` skips them).
        """

        def body(store: StatusStore) -> list[dict[str, Any]]:
            current = self._list(store.get(self._category, CHECKPOINTS))
            folder = self._folder()
            gone = [i for i, entry in enumerate(current) if self._gone(entry, folder)]
            if gone:
                store.set(self._category, CHECKPOINTS, [e for i, e in enumerate(current) if i not in gone])
            return [current[i] for i in gone]

        with retold("prune the missing checkpoints again"):
            return self._store.run_transaction(body)

    # -- the steps ---------------------------------------------------------------------------

    def _folder(self) -> str | None:
        """The directory relative paths are under: ``root=``, else the category's recorded one,
        else None (the current one)."""
        if self._root is not None:
            return self._root
        return recorded_folder(self._category, self._store.get(self._category, ROOT), self._store.path)

    def _record_root(self, store: StatusStore, document: dict[str, Any]) -> None:
        """Record ``root=`` in the category (within the caller's transaction, ``document`` its
        reading, updated), unless it is there, with the entries moved onto it (``roots.rebase``)."""
        if self._root is not None:
            keys = document.setdefault(self._category, {})
            for key, value in rebase(self._category, keys, self._root, self._store.path).items():
                store.set(self._category, key, value)
                keys[key] = value

    def _where(self, key: str) -> str:
        return f"{self._category}/{key} in {self._store.path}"

    def _context(self, key: str) -> dict[str, Any]:
        return {"path": self._store.path, "category": self._category, "key": key}

    def _list(self, value: Any) -> list[Any]:
        return as_list(value, self._store.path, self._category)

    def _prepare(self, key: str, steps: Any, file_path: Any, reward: Any, auxillary: Any,
                 creation_time: Any, synced: Any) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The entry to record and what ``_sync`` syncs (``entries.new_entry``); raises on anything wrong."""
        return new_entry(steps, file_path, reward, auxillary, creation_time, synced,
                         root=self._folder(), where=self._where(key), context=self._context(key))

    def _sync(self, key: str, entry: dict[str, Any], synced: list[tuple[str, str]]) -> None:
        """fsync the entry's files and folders, and the folders above (``folders.sync_entry``)."""
        sync_entry(entry, synced, self._store.path, self._where(key), self._context(key))

    def _record(self, store: StatusStore, entry: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The transaction's body: append, trim, set. Returns the dropped entries and the document
        as written (what is still listed). Pure reads and sets, so it can run again."""
        document = store.to_dict()
        self._record_root(store, document)  # first: the entries below are then under root=
        current = self._list(document.get(self._category, {}).get(CHECKPOINTS))
        # The same checkpoint recorded again (ML-Agents saves the step it resumed from a second
        # time) replaces its entry where it stands: a second entry would count twice towards
        # ``keep`` and push out an older checkpoint, and the files stay (the new entry lists them).
        same = [i for i, old in enumerate(current) if self._same_checkpoint(old, entry)]
        if same:
            updated = [entry if i == same[0] else old for i, old in enumerate(current) if i == same[0] or i not in same]
        else:
            updated = [*current, entry]
        # Trim to ``keep``, oldest first, but never the entry just recorded: replaced where it
        # stands, it can be among the oldest (``keep`` lowered since, a run resumed from an older
        # checkpoint), and dropping it would remove the files this call was asked to record.
        excess = 0 if self._keep is None else max(0, len(updated) - self._keep)
        cut = set(itertools.islice((i for i, old in enumerate(updated) if old is not entry), excess))
        kept = [old for i, old in enumerate(updated) if i not in cut]
        store.set(self._category, CHECKPOINTS, kept)
        document.setdefault(self._category, {})[CHECKPOINTS] = kept
        return [old for i, old in enumerate(updated) if i in cut], document

    def _same_checkpoint(self, old: Any, new: dict[str, Any]) -> bool:
        """Does ``old`` record the checkpoint ``new`` records (same steps, same main file)?"""
        if not isinstance(old, Mapping) or type(old.get("steps")) is not int or old["steps"] != new["steps"]:
            return False
        main = old.get("file_path")
        return isinstance(main, str) and bool(main) and self.resolve(main) == self.resolve(new["file_path"])

    def _remove(self, dropped: list[Any], document: Mapping[str, Any]) -> None:
        """Remove the files of ``dropped`` entries that no entry of ``document`` lists any more."""
        failed = remove_unlisted(dropped, document, self._folder(), self._store.path, self._category)
        if failed:
            details = "; ".join(f"steps {_steps(entry)}: {reason}" for entry, reason in failed)
            warn(TrainingStatusCheckpointWarning(
                f"Old checkpoints of {self._where(CHECKPOINTS)} were dropped from the list but some of "
                f"their files are still on disk: {details}. They are no longer listed; remove them by hand.",
                skipped=failed, **self._context(CHECKPOINTS),
            ))

    def _gone(self, entry: Any, folder: str | None) -> bool:
        """Is a file of ``entry`` missing, not a file, or of another size than recorded?"""
        return next(_faults(entry, folder), None) is not None

    def _report(self, key: str, skipped: list[tuple[Any, str]], chosen: Mapping[str, Any] | None) -> None:
        warn_skipped(key, skipped, chosen, self._where(key), self._context(key))


def _in_transaction(store: StatusStore) -> bool:
    """Whether this thread is inside ``store.transaction()`` (the store has no public way to say)."""
    return bool(store._tx_depth) and store._tx_owner == threading.get_ident()


def as_list(value: Any, path: str, category: str) -> list[Any]:
    """``value``, what ``category/checkpoints`` of the status file ``path`` holds, as the list of
    checkpoints (none for None), or a ``TrainingStatusValueError`` that says how to fix it."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise TrainingStatusValueError(
            f"{category}/{CHECKPOINTS} in {path} holds a {type(value).__name__}, not a list of checkpoints; "
            f"fix it, or delete it (trainstatus delete {path} {category} {CHECKPOINTS}) to start a new list.",
            path=path, category=category, key=CHECKPOINTS,
        )
    return value
