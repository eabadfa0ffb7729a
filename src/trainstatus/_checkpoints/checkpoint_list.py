"""Checkpoint lists that never name a file that is gone.

A behavior's category holds ``checkpoints`` (a list, oldest first) and ``final_checkpoint`` (one
entry), each entry in ML-Agents' layout: ``steps``, ``file_path``, ``reward``, ``creation_time``,
``auxillary_file_paths`` (ML-Agents' spelling, kept so both read each other's files), plus
``files``: the size of each file recorded (``_checkpoint_files.FILES``). ``file_path`` may be a
folder (Transformers' ``checkpoint-500/``): ``files`` then lists every file in it.

The order of ``add`` is the point of this module. ML-Agents 1.1.0's ``add_checkpoint`` deletes the
files of the checkpoints it drops and only then sets the list; a kill in between leaves a status
that lists files that are gone. Here:

1. check the arguments and that every file exists, and take their sizes (nothing done yet if not);
2. fsync each file (each file and folder of a checkpoint folder), its directory and the folders
   above that up to the one the status file is in,
   so the record never outlives the data after a power loss;
3. record the entry, trimmed to ``keep``, in one transaction (one durable write, merged with what
   other writers set meanwhile);
4. only then remove the files of the dropped entries, skipping any file another entry still lists
   (a dropped folder: its recorded files, then the folder if that left it empty).

A kill between 3 and 4 leaves files that are no longer listed: disk space, never a wrong pointer.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import itertools
import math
import numbers
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .files import (
    CHECKPOINTS,
    FILES,
    FINAL_CHECKPOINT,
    _entry_files,
    _entry_paths,
    _faults,
    _fspath,
    _is_folder,
    _join,
    changed_files,
    missing_files,
)
from .files import _listed as _listed  # the command line's check --files counts with it
from .._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    warn,
)
from .._load import METADATA
from .. import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log
from .._committing import retold
from .._store import StatusStore

__all__ = ["CHECKPOINTS", "FINAL_CHECKPOINT", "CheckpointList", "changed_files", "missing_files", "remove_unlisted"]

logger = logging.getLogger("trainstatus")


Check = Callable[[dict[str, Any]], object]


def remove_unlisted(dropped: Iterable[Any], document: Mapping[str, Any], root: str | None,
                    location: str) -> list[tuple[Any, str]]:
    """Remove the files of the ``dropped`` entries that no entry of ``document`` lists; return
    ``(entry, reason)`` for each file that could not be removed (one already gone is fine).

    Used by ``CheckpointList.add`` and by the ML-Agents plugin's checkpoint manager.
    """
    # A file still listed may be spelled differently (``./a``, a symlinked folder) or be the
    # same file under another name: compare by path and by inode. Both are stats, where
    # os.path.realpath would cost one lstat per path component of every listed file.
    listed_paths: set[str] = set()
    listed_files: set[tuple[int, int]] = set()
    for _, _, paths in _listed(document):
        for given in paths:
            path = _join(root, given)
            listed_paths.add(path)
            with contextlib.suppress(OSError):
                kept = os.stat(path)
                listed_files.add((kept.st_dev, kept.st_ino))
    failed: list[tuple[Any, str]] = []
    for entry in dropped:
        folders: list[tuple[str, str]] = []
        folder_entry = _entry_paths(entry) is not None and _is_folder(entry)
        for index, (given, _) in enumerate(_entry_files(entry) or []):
            path = _join(root, given)
            try:
                info = os.stat(path)
                same_file = (info.st_dev, info.st_ino) in listed_files
                is_folder = folder_entry and index == 0 and stat.S_ISDIR(info.st_mode)
            except OSError:
                same_file = is_folder = False  # gone already (what we wanted), or os.remove says why below
            if path in listed_paths or same_file:
                logger.debug("trainstatus: kept %s, still listed in %s", path, location)
                continue
            if is_folder:  # a checkpoint folder: emptied of its recorded files first, below
                folders.append((given, path))
                continue
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append((entry, f"{given} could not be removed ({exc.strerror or exc})"))
            else:
                logger.debug("trainstatus: removed old checkpoint file %s", path)
        for given, folder in folders:
            failed += [(entry, reason) for reason in _remove_folder(entry, given, folder, root)]
    return failed


def _remove_folder(entry: Any, given: str, folder: str, root: str | None) -> list[str]:
    """Remove a dropped checkpoint folder once its recorded files are gone: the subfolders that
    held them, deepest first, then the folder. A folder still holding anything (a file nobody
    recorded) stays: only what the entry recorded is ours to remove."""
    inside: set[str] = set()
    for listed, _ in _entry_files(entry) or []:
        parent = os.path.dirname(_join(root, listed))
        while parent.startswith(folder + os.sep):
            inside.add(parent)
            parent = os.path.dirname(parent)
    failed: list[str] = []
    for path in [*sorted(inside, key=lambda p: p.count(os.sep), reverse=True), folder]:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                logger.debug("trainstatus: kept folder %s of an old checkpoint: it holds files not recorded", path)
            else:
                shown = given if path == folder else os.path.join(given, os.path.relpath(path, folder))
                failed.append(f"the folder {shown} could not be removed ({exc.strerror or exc})")
        else:
            logger.debug("trainstatus: removed old checkpoint folder %s", path)
    return failed


def _fsync(path: str, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0) | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    - ``root``: the directory relative file paths are resolved against; paths are stored as given.
      Default: the current directory at each call, as ML-Agents does.

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
        """The absolute directory relative paths are resolved against; None: the current one."""
        return self._root

    def __repr__(self) -> str:
        return f"CheckpointList({self._store!r}, {self._category!r}, keep={self._keep!r}, root={self._root!r})"

    def resolve(self, file_path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
        """The absolute path of ``file_path`` as this list finds it (relative to ``root``)."""
        try:
            given = _fspath(file_path)
        except TypeError:
            raise TrainingStatusTypeError(
                f"CheckpointList.resolve: file_path= must be a path (str, bytes or os.PathLike), not "
                f"{type(file_path).__name__!r} ({file_path!r}), for {self._category} in {self._store.path}.",
                path=self._store.path, category=self._category,
            ) from None
        return _join(self._root, given)

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
        entries = self.entries()

        def newness(index: int) -> tuple[bool, int, int]:
            # Entries without int steps have no place in time: after every valid one.
            steps = entries[index].get("steps") if isinstance(entries[index], Mapping) else None
            return (True, steps, index) if type(steps) is int else (False, 0, index)

        skipped: list[tuple[Any, str]] = []
        for index in sorted(range(len(entries)), key=newness, reverse=True):
            problem = self._problem(entries[index], check)
            if problem is None:
                if skipped:
                    self._report(CHECKPOINTS, skipped, entries[index])
                return entries[index]
            skipped.append((entries[index], problem))
        if skipped:
            self._report(CHECKPOINTS, skipped, None)
        return None

    def final(self, check: Check | None = None) -> dict[str, Any] | None:
        """The final checkpoint if it is recorded, its files all exist and it passes ``check``.

        A recorded one that fails is reported in a ``TrainingStatusCheckpointWarning`` and None is
        returned; ``store.get(category, "final_checkpoint")`` reads it as it is.
        """
        entry = self._store.get(self._category, FINAL_CHECKPOINT)
        if entry is None:
            return None
        problem = self._problem(entry, check)
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
        entry, paths = self._prepare(CHECKPOINTS, steps, file_path, reward, auxillary_file_paths,
                                     creation_time, synced)
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
        with retold("set the final checkpoint again"):
            self._store.set(self._category, FINAL_CHECKPOINT, entry)
        return dict(entry)

    def prune_missing(self) -> list[dict[str, Any]]:
        """Drop, in one write, the checkpoints whose files (main or auxiliary) are gone or of
        another size than recorded; return them.

        Their remaining files are left on disk. Nothing is written when nothing is missing. Entries
        that are not in ML-Agents' layout are kept (``latest()`` skips them).
        """

        def body(store: StatusStore) -> list[dict[str, Any]]:
            current = self._list(store.get(self._category, CHECKPOINTS))
            gone = [i for i, entry in enumerate(current) if self._gone(entry)]
            if gone:
                store.set(self._category, CHECKPOINTS, [e for i, e in enumerate(current) if i not in gone])
            return [current[i] for i in gone]

        with retold("prune the missing checkpoints again"):
            return self._store.run_transaction(body)

    # -- the steps ---------------------------------------------------------------------------

    def _where(self, key: str) -> str:
        return f"{self._category}/{key} in {self._store.path}"

    def _context(self, key: str) -> dict[str, Any]:
        return {"path": self._store.path, "category": self._category, "key": key}

    def _list(self, value: Any) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise TrainingStatusValueError(
                f"{self._where(CHECKPOINTS)} holds a {type(value).__name__}, not a list of checkpoints; "
                f"fix it, or delete it (trainstatus delete {self._store.path} {self._category} "
                f"{CHECKPOINTS}) to start a new list.",
                **self._context(CHECKPOINTS),
            )
        return value

    def _prepare(self, key: str, steps: Any, file_path: Any, reward: Any, auxillary: Any,
                 creation_time: Any, synced: Any) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The entry to record and what ``_sync`` syncs: ``(absolute path, name shown)`` of each
        file, then of each folder inside a checkpoint folder, deepest first, then of the checkpoint
        folder itself. Raises on anything wrong."""
        where = self._where(key)
        context = self._context(key)
        if type(steps) is bool or not isinstance(steps, numbers.Integral):
            raise TrainingStatusTypeError(
                f"steps must be an int (the trainer step of the checkpoint), not {type(steps).__name__!r} "
                f"({steps!r}), for {where}. Nothing was written.",
                **context,
            )
        if steps < 0:
            raise TrainingStatusValueError(
                f"steps must be >= 0, not {steps!r}, for {where}. Nothing was written.", **context)
        if reward is not None:
            # NaN is what ML-Agents records when no episode ended before the checkpoint; the codec
            # writes it as NaN (never null), so it reads back as NaN. Infinity has no such excuse.
            reward = self._number("reward", reward, where, context,
                                  " Pass reward=None when the checkpoint has no reward yet.", nan=True)
        if creation_time is None:
            creation_time = time.time()
        else:
            creation_time = self._number("creation_time", creation_time, where, context,
                                         " Pass a time.time() value, or leave it out for now.")
        if type(synced) is not bool:
            raise TrainingStatusTypeError(
                f"synced= must be True or False, not {type(synced).__name__!r} ({synced!r}), for {where}.",
                **context,
            )
        if isinstance(auxillary, (str, bytes, os.PathLike)):
            raise TrainingStatusTypeError(
                f"auxillary_file_paths must be a list of paths, not a single path ({auxillary!r}), for "
                f"{where}; pass [path]. Nothing was written.",
                **context,
            )
        try:
            extra = list(auxillary)
        except TypeError:
            raise TrainingStatusTypeError(
                f"auxillary_file_paths must be a list of paths, not {type(auxillary).__name__!r} "
                f"({auxillary!r}), for {where}. Nothing was written.",
                **context,
            ) from None
        given = [self._path("file_path", file_path, where, context)]
        given += [self._path("auxillary_file_paths", p, where, context) for p in extra]
        paths = [self.resolve(p) for p in given]
        sizes: dict[str, int] = {}
        targets: list[tuple[str, str]] = []
        folders: list[tuple[str, str]] = []
        for index, (name, path) in enumerate(zip(given, paths)):
            if self._exists(name, path, int(steps), key, folder=index == 0):
                folders = self._folder(name, path, int(steps), key, sizes, targets)
            else:
                sizes.setdefault(name, os.stat(path).st_size)
                targets.append((path, name))
        entry = {
            "steps": int(steps),
            "file_path": given[0],
            "reward": reward,
            "creation_time": creation_time,
            "auxillary_file_paths": given[1:],
            FILES: sizes,
        }
        return entry, targets + folders

    def _folder(self, given: str, folder: str, steps: int, key: str, sizes: dict[str, int],
                targets: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Record the files of a checkpoint folder in ``sizes`` (as ``given/relative/name``) and
        ``targets``; return its folders, deepest first, the checkpoint folder last."""
        folders: list[tuple[str, str]] = []

        def refuse(exc: OSError) -> None:
            raise exc

        try:
            # Sorted so the entry lists the files in the same order on every machine.
            for current, subfolders, names in os.walk(folder, onerror=refuse):
                subfolders.sort()
                relative = os.path.relpath(current, folder)
                shown = given if relative == os.curdir else os.path.join(given, relative)
                folders.append((current, shown))
                for name in sorted(names):
                    path = os.path.join(current, name)
                    info = os.stat(path)
                    if stat.S_ISREG(info.st_mode):
                        sizes[os.path.join(shown, name)] = info.st_size
                        targets.append((path, os.path.join(shown, name)))
        except OSError as exc:
            where = exc.filename if isinstance(exc.filename, str) else folder
            raise TrainingStatusCheckpointError(
                f"Cannot record the checkpoint at steps {steps} of {self._where(key)}: reading its folder "
                f"{given} failed at {where} ({exc.strerror or exc}). Check the folder's permissions and "
                "links. Nothing was recorded or removed.",
                file_path=given, errno=exc.errno, **self._context(key),
            ) from exc
        if not any(path.startswith(folder + os.sep) for path, _ in targets):
            raise TrainingStatusCheckpointError(
                f"Cannot record the checkpoint at steps {steps} of {self._where(key)}: its folder {given} "
                "holds no file. Write the checkpoint's files completely before recording it. Nothing "
                "was recorded or removed.",
                file_path=given, **self._context(key),
            )
        return folders[::-1]  # os.walk goes top-down: reversed, each folder after those inside it

    @staticmethod
    def _number(name: str, value: Any, where: str, context: dict[str, Any], hint: str, *, nan: bool = False) -> float:
        if type(value) is bool or not isinstance(value, numbers.Real):
            raise TrainingStatusTypeError(
                f"{name} must be a number, not {type(value).__name__!r} ({value!r}), for {where}."
                f"{hint} Nothing was written.",
                **context,
            )
        number = float(value)
        if not math.isfinite(number) and not (nan and math.isnan(number)):
            raise TrainingStatusValueError(
                f"{name} must be a finite number{' or NaN' if nan else ''}, not {number!r}, for {where}.{hint} "
                "Nothing was written.",
                **context,
            )
        return number

    @staticmethod
    def _path(name: str, value: Any, where: str, context: dict[str, Any]) -> str:
        try:
            path = _fspath(value)
        except TypeError:
            raise TrainingStatusTypeError(
                f"{name} must be a path (str, bytes or os.PathLike), not {type(value).__name__!r} "
                f"({value!r}), for {where}. Nothing was written.",
                **context,
            ) from None
        if not path or "\0" in path:
            raise TrainingStatusValueError(
                f"{name} {path!r} is not a file path (empty, or holds a NUL character), for {where}. "
                "Nothing was written.",
                **context,
            )
        return path

    def _exists(self, given: str, path: str, steps: int, key: str, *, folder: bool) -> bool:
        """Raise unless ``path`` is a regular file, or a folder where ``folder``; True for a folder."""
        what = f"the checkpoint at steps {steps} of {self._where(key)}"
        shown = given if given == path else f"{given} ({path})"
        try:
            info = os.stat(path)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                problem = "does not exist"
                todo = ("Write the checkpoint's files completely before recording it"
                        + ("" if os.path.isabs(given) else
                           f"; relative paths are resolved against "
                           f"{self._root or 'the current directory (' + os.getcwd() + ')'}"))
            else:
                problem = f"cannot be looked up ({exc.strerror or exc})"
                todo = "Check the path and the permissions of its folders"
            raise TrainingStatusCheckpointError(
                f"Cannot record {what}: its file {shown} {problem}. {todo}. Nothing was recorded or removed.",
                file_path=given, errno=exc.errno, **self._context(key),
            ) from exc
        if folder and stat.S_ISDIR(info.st_mode):
            return True
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise TrainingStatusCheckpointError(
                f"Cannot record {what}: {shown} is {kind}. Only file_path may be a checkpoint folder; "
                "auxillary_file_paths lists files. Nothing was recorded or removed.",
                file_path=given, **self._context(key),
            )
        return False

    def _sync(self, key: str, entry: dict[str, Any], synced: list[tuple[str, str]]) -> None:
        """fsync each file, then each folder of a checkpoint folder (deepest first), then each
        directory holding one of those (once each), then the folders above (``sync_folders_above``)."""
        directories: dict[str, None] = {}  # real paths: a folder reached through a link once
        for path, _ in synced:
            directories[os.path.realpath(os.path.dirname(path))] = None
            # A symlink: its target's directory entry matters too.
            directories[os.path.dirname(os.path.realpath(path))] = None
        targets = [(path, os.path.isdir(path), name) for path, name in synced]
        done = {os.path.realpath(path) for path, directory, _ in targets if directory}
        targets += [(directory, True, directory) for directory in directories if directory not in done]
        for path, directory, name in targets:
            try:
                _fsync(path, directory=directory)
            except OSError as exc:
                raise TrainingStatusCheckpointError(
                    f"Cannot record the checkpoint at steps {entry['steps']} of {self._where(key)}: "
                    f"syncing {'its directory ' if directory else ''}{name} to disk failed "
                    f"({exc.strerror or exc}). Nothing was recorded or removed; check the disk, or pass "
                    "synced=True if you made the files durable yourself.",
                    file_path=name, errno=exc.errno, **self._context(key),
                ) from exc
        # Only from the outermost synced folders: those above the others were just synced.
        done |= set(directories)
        try:
            sync_folders_above([d for d in directories if not _inside(d, done)], self._store.path)
        except OSError as exc:
            raise TrainingStatusCheckpointError(
                f"Cannot record the checkpoint at steps {entry['steps']} of {self._where(key)}: "
                f"syncing the folder {exc.filename} above it to disk failed ({exc.strerror or exc}). "
                "Nothing was recorded or removed; check the disk, or pass synced=True if you made "
                "the files and their folders durable yourself.",
                file_path=entry["file_path"], errno=exc.errno, **self._context(key),
            ) from exc

    def _record(self, store: StatusStore, entry: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The transaction's body: append, trim, set. Returns the dropped entries and the document
        as written (what is still listed). Pure reads and one set, so it can run again."""
        document = store.to_dict()
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
        failed = remove_unlisted(dropped, document, self._root, self._store.path)
        if failed:
            details = "; ".join(f"steps {_steps(entry)}: {reason}" for entry, reason in failed)
            warn(TrainingStatusCheckpointWarning(
                f"Old checkpoints of {self._where(CHECKPOINTS)} were dropped from the list but some of "
                f"their files are still on disk: {details}. They are no longer listed; remove them by hand.",
                skipped=failed, **self._context(CHECKPOINTS),
            ))

    def _gone(self, entry: Any) -> bool:
        """Is a file of ``entry`` missing, not a file, or of another size than recorded?"""
        return next(_faults(entry, self._root), None) is not None

    def _problem(self, entry: Any, check: Check | None) -> str | None:
        """Why ``entry`` is not a usable checkpoint, or None if it is."""
        paths = _entry_paths(entry)
        if paths is None or type(entry.get("steps")) is not int:
            return "not a checkpoint entry in ML-Agents' layout (steps, file_path, auxillary_file_paths)"
        for _, _, why in _faults(entry, self._root):
            return why
        if check is not None:
            try:
                result = check(dict(entry))
            except Exception as exc:  # noqa: BLE001 - a loader failing on the file means "broken"
                return f"the check raised {type(exc).__name__}: {exc}"
            if not result:
                return f"the check returned {result!r}"
        return None

    def _report(self, key: str, skipped: list[tuple[Any, str]], chosen: Mapping[str, Any] | None) -> None:
        details = "; ".join(f"steps {_steps(entry)} ({reason})" for entry, reason in skipped)
        if chosen is not None:
            message = (f"Skipped {len(skipped)} newer checkpoint(s) of {self._where(key)}: {details}. "
                       f"Using the checkpoint at steps {chosen['steps']} ({chosen['file_path']}).")
        elif key == FINAL_CHECKPOINT:
            message = f"The final checkpoint of {self._where(key)} is not usable: {details}. final() returned None."
        else:
            message = (f"No checkpoint of {self._where(key)} is usable: {details}. latest() returned None: "
                       "training starts without a checkpoint.")
        if key == CHECKPOINTS:
            message += " The entries stay listed; prune_missing() drops those whose files are gone."
        warn(TrainingStatusCheckpointWarning(
            message,
            skipped=list(skipped), **self._context(key),
        ))


def sync_folders_above(directories: Iterable[str], status_path: str) -> None:
    """fsync the folders above ``directories`` up to the one they share with the status file.

    A folder made since the status file (``models/`` in a new run) is itself an entry of the
    folder above it, and so on up: until those are synced, a power loss can lose ``models/`` with
    the checkpoint in it while the list naming it survives. Above the folder shared with the
    status file nothing is new (the store syncs its own folders). Real paths on both sides, so a
    symlink in either does not send the walk to ``/``; nothing for a status file that is no
    local path (an object store: no folder to share).

    A folder this process may not open (a traverse-only group folder, mode 711) cannot be synced
    by it at all, and a filesystem that refuses directory fsync has nothing to sync: both are
    skipped. Any other error (EIO, say) is raised as an ``OSError`` naming the folder.
    """
    if not os.path.isabs(status_path):  # an s3:// URL, or ML-Agents' unbound "<memory>" store
        return
    status_dir = os.path.realpath(os.path.dirname(status_path))
    above: dict[str, None] = {}
    for directory in directories:
        current = os.path.realpath(directory)
        try:
            shared = os.path.commonpath([current, status_dir])
        except ValueError:  # different drives (Windows): nothing shared
            continue
        while current != shared:
            parent = os.path.dirname(current)
            if parent == current:  # the filesystem's root
                break
            above[parent] = None
            current = parent
    for folder in above:
        try:
            _fsync(folder, directory=True)
        except OSError as exc:
            if exc.errno not in _CANNOT_SYNC_A_FOLDER:
                raise OSError(exc.errno, exc.strerror, folder) from exc
            logger.debug("trainstatus: skipped syncing folder %s above a checkpoint: %s", folder, exc)


# Opening a folder without read permission (EACCES, EPERM); a filesystem without directory fsync
# (EINVAL, ENOTSUP/EOPNOTSUPP): nothing this process can do, and nothing it could make durable there.
_CANNOT_SYNC_A_FOLDER = frozenset({errno.EACCES, errno.EPERM, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})


def _in_transaction(store: StatusStore) -> bool:
    """Whether this thread is inside ``store.transaction()`` (the store has no public way to say)."""
    return bool(store._tx_depth) and store._tx_owner == threading.get_ident()


def _inside(folder: str, folders: set[str]) -> bool:
    """Is ``folder`` below one of ``folders``?"""
    parent = os.path.dirname(folder)
    while parent != folder:
        if parent in folders:
            return True
        folder, parent = parent, os.path.dirname(parent)
    return False


def _steps(entry: Any) -> Any:
    return entry.get("steps", "?") if isinstance(entry, Mapping) else "?"
