"""Which files the checkpoint entries of a status document list, and which of them are missing.

Below both the store and ``CheckpointList``: the store names the missing files when it puts a
version from its history back (that version may list checkpoints removed since), and
``CheckpointList`` and ``trainstatus check --files`` use the same reading of an entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from ._load import METADATA

__all__ = ["CHECKPOINTS", "FINAL_CHECKPOINT", "describe_missing", "missing_files"]

CHECKPOINTS = "checkpoints"
FINAL_CHECKPOINT = "final_checkpoint"


def _fspath(value: Any) -> str:
    given = os.fspath(value)
    return os.fsdecode(given) if isinstance(given, bytes) else given


def _entry_paths(entry: Any) -> list[str] | None:
    """The files an entry lists (main file first), or None if it is not in ML-Agents' layout."""
    if not isinstance(entry, Mapping):
        return None
    main = entry.get("file_path")
    extra = entry.get("auxillary_file_paths", [])
    if not isinstance(main, str) or not main or not isinstance(extra, list):
        return None
    if not all(isinstance(p, str) and p for p in extra):
        return None
    return [main, *extra]


def _listed(document: Mapping[str, Any]) -> Iterable[tuple[str, str, list[str]]]:
    """(category, key, files) of every checkpoint entry in a document, in file order."""
    for category, keys in document.items():
        if category == METADATA or not isinstance(keys, Mapping):
            continue
        for key in (CHECKPOINTS, FINAL_CHECKPOINT):
            value = keys.get(key)
            for entry in value if isinstance(value, list) else [value]:
                paths = _entry_paths(entry)
                if paths is not None:
                    yield category, key, paths


def _join(base: str | None, path: str) -> str:
    if os.path.isabs(path):  # no current directory needed (it may have been removed)
        return os.path.normpath(path)
    return os.path.abspath(os.path.join(os.getcwd() if base is None else base, path))


def missing_files(categories: Mapping[str, Mapping[str, Any]],
                  root: str | os.PathLike[str] | None = None) -> list[tuple[str, str, str]]:
    """Every file listed by a checkpoint entry that does not exist: ``(category, key, path)``.

    ``categories`` is a status document (``StatusStore.to_dict()`` or the parsed file); the
    ``checkpoints`` list and the ``final_checkpoint`` of each category are looked at, main files
    and auxiliary files alike. ``path`` is the path as listed; relative ones are looked up against
    ``root`` (default: the current directory, where ML-Agents resolves them). Values that are not
    checkpoint entries are left out.
    """
    base = None if root is None else os.path.abspath(_fspath(root))
    return [(category, key, path)
            for category, key, paths in _listed(categories)
            for path in paths if not os.path.exists(_join(base, path))]


def describe_missing(categories: Mapping[str, Mapping[str, Any]], shown: int = 10) -> str:
    """A sentence naming the listed checkpoint files that are missing now (relative paths against
    the current directory, as ML-Agents resolves them), or "" when none is."""
    try:
        missing = missing_files(categories)
        cwd = os.getcwd()
    except OSError:  # the current directory was removed: a warning's extra sentence is not worth failing for
        return ""
    if not missing:
        return ""
    listed = "; ".join(f"{category}/{key} {path}" for category, key, path in missing[:shown])
    more = f" (and {len(missing) - shown} more)" if len(missing) > shown else ""
    return (f" That version lists {len(missing)} checkpoint file(s) that are missing now: {listed}{more} "
            f"(relative paths looked up in {cwd}). Do not resume from them: "
            "CheckpointList.latest() skips them, prune_missing() drops their entries.")
