"""The file a command names: where it really is, what lies beside it, and how a changing command opens it.

Shared by the command modules (``write``, ``check``, ``corrupt``, ``history``, ``checkpoints``), and
kept apart from them so none imports another: the real directory and name behind a PATH (symlinks
resolved), how to show a file beside it, the copies kept aside there, ``--root``, and the
``StatusStore`` that ``set``, ``delete`` and ``prune-missing`` write through.

Imports ``base`` and ``names`` of the command line, the history and file names of the
package; the store only when a command opens one (``lazy_module``): ``check`` and ``corrupt`` read
alone.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._storage import history as _history, filenames as _names
from .._storage.base import Conflict
from .base import _Fail, _json, is_url, storage_options
from .names import PROG
from .._lazy import lazy_module

if TYPE_CHECKING:
    from .. import _store
    from .._storage.local import LocalFile
    from .._checkpoints.roots import BadRoot, Base
else:  # only the commands that write need it: check reads alone
    _store = lazy_module("trainstatus._store")

__all__ = ["_bad_root", "_copies", "_faults_shown", "_open_store", "_root", "_shown_directory", "_target",
           "_where_to_look", "replace_read"]

# How often a command writing a whole file (restore) reads and writes again when another writer made
# or replaced the file between its read and its rename (one that got in through a lock file deleted
# by hand: ``_lock.version``); each time takes a new event of that kind, so a few is plenty.
_ATTEMPTS = 10


def replace_read(storage: LocalFile, data: bytes, on_read: Callable[[bytes | None], None] | None = None) -> bytes | None:
    """With ``storage``'s lock held: read the file in place (``on_read`` sees it), then replace it
    with ``data``; again if another writer got in between. What was read last."""
    for _ in range(_ATTEMPTS):
        current = storage.read()  # also remembers its mode and owner for the new file
        if on_read is not None:
            on_read(current)
        try:
            storage.replace(data)  # temp file, fsync, rename, directory fsync
            return current
        except Conflict:
            continue
    raise _Fail(f"{storage.location} was replaced by other writers {_ATTEMPTS} times while this command "
                "wrote it (their lock file was deleted by hand); nothing was changed: run the command again")


def _target(path: str) -> tuple[str, str]:
    """(directory, name) of the file a store on ``path`` really writes (symlinks resolved)."""
    return os.path.split(os.path.realpath(path))


def _shown_directory(path: str, directory: str) -> str:
    """How to show files beside ``path``: under the directory as the user wrote it if it is the same."""
    given = os.path.dirname(path)
    if os.path.realpath(given or ".") == directory:
        return given
    return directory


def _copies(directory: str, name: str) -> list[str]:
    """Names of the copies of ``name`` kept aside in ``directory``, newest first."""
    pattern = _names.copy_pattern(name)
    found = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                match = pattern.fullmatch(entry.name)
                if match:
                    found.append((match.group(1), int(match.group(2) or 0), entry.name))
    except OSError:
        return []
    return [name for _, _, name in sorted(found, reverse=True)]


def _root(root: str | None) -> str | None:
    """``--root DIR``, which must be a directory: else every relative path would look missing."""
    if root is not None and not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "does not exist"
        raise _Fail(f"--root {root} {what}: give the directory the checkpoint paths listed in the file "
                    "are relative to (where mlagents-learn ran)")
    return root


def _where_to_look(found: Base) -> str:
    """What to check when not one file of a checkpoints list is under the folder ``found`` names."""
    if found.source == "recorded":
        return (f"check that the checkpoints are in that folder and that {found.category}/checkpoint_root "
                "names it (a run folder moved without its status file?)")
    if found.source == "given":
        return "check that --root is the folder its paths are relative to"
    return "if its paths are relative to another folder (where mlagents-learn ran), run from there or pass --root DIR"


def _faults_shown(faulty: list[tuple[Any, str]], shown: int = 3) -> str:
    """The first ``shown`` of ``files.all_faulty``'s entries, each with why it is not whole."""
    listed = "; ".join(f"step {_json(entry.get('steps'))}: {why}" for entry, why in faulty[:shown])
    return listed + (f" (and {len(faulty) - shown} more)" if len(faulty) > shown else "")


def _bad_root(path: str, category: str, problem: BadRoot) -> str:
    """What to do about a ``checkpoint_root`` that cannot be used."""
    command = shlex.join([PROG, "delete", path, category, "checkpoint_root"])
    return (f"{problem}: set it to the folder the checkpoint paths of {category} are relative to, or `{command}` "
            "to read them as ML-Agents writes them (relative to the current directory, or --root)")


def _open_store(args: argparse.Namespace) -> _store.StatusStore:
    if is_url(args.path):
        # No lock and no history there: each write is conditional on the version read.
        return _store.StatusStore(args.path, lock_timeout=args.lock_timeout, lock=args.lock,
                                  allow_downgrade=args.allow_downgrade, storage_options=storage_options(args))
    # This command does not know the history= of the trainers writing the file: it keeps as
    # many versions as it finds (at least the default), so an edit neither shrinks the count a
    # trainer keeps nor grows it.
    directory, name = _target(args.path)
    # At least as many as are there, so the count stays put instead of growing with each edit.
    history = max(_store.DEFAULT_HISTORY, len(_history.versions(directory, name)))
    return _store.StatusStore(args.path, lock_timeout=args.lock_timeout, lock=args.lock,
                       allow_downgrade=args.allow_downgrade, history=history)
