"""Which files the checkpoint entries of a status document list, and which of them are missing.

Below both the store and ``CheckpointList``: the store names the missing files when it puts a
version from its history back (that version may list checkpoints removed since), and
``CheckpointList`` and ``trainstatus check --files`` use the same reading of an entry.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

from .._load import METADATA

__all__ = ["CHECKPOINTS", "FILES", "FINAL_CHECKPOINT", "changed_files", "describe_missing", "missing_files"]

CHECKPOINTS = "checkpoints"
FINAL_CHECKPOINT = "final_checkpoint"
# The one field trainstatus adds to ML-Agents' entry layout: ``{path as listed: size in bytes}``
# of every file the entry records (the main file, or each file inside a checkpoint folder, and
# the auxiliary files), taken when the entry was recorded. ML-Agents ignores keys it does not know.
FILES = "files"


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


def _entry_sizes(entry: Mapping[str, Any]) -> dict[str, int]:
    """The entry's recorded ``files`` sizes; {} when it has none (an entry ML-Agents or an older
    trainstatus wrote) or when the field is not a mapping of paths to sizes (edited by hand): such
    an entry is checked for existence only, as before the field existed."""
    sizes = entry.get(FILES)
    if not isinstance(sizes, Mapping):
        return {}
    if not all(isinstance(p, str) and p and type(n) is int and n >= 0 for p, n in sizes.items()):
        return {}
    return dict(sizes)


def _is_folder(entry: Mapping[str, Any]) -> bool:
    """Does the entry record a checkpoint folder (sizes recorded, none for ``file_path`` itself)?
    Only then may its main path be a directory: an entry without sizes keeps listing files only."""
    sizes = _entry_sizes(entry)
    return bool(sizes) and entry["file_path"] not in sizes


def _entry_files(entry: Any) -> list[tuple[str, int | None]] | None:
    """Every path an entry lists with its recorded size (None: not recorded): the main file or
    folder first, then the auxiliary files, then the files recorded inside a folder. None if the
    entry is not in ML-Agents' layout."""
    paths = _entry_paths(entry)
    if paths is None:
        return None
    sizes = _entry_sizes(entry)
    listed = {path: sizes.get(path) for path in paths}
    listed.update((path, size) for path, size in sizes.items() if path not in listed)
    return list(listed.items())


def _listed(document: Mapping[str, Any]) -> Iterable[tuple[str, str, list[str]]]:
    """(category, key, paths) of every checkpoint entry in a document, in file order; the paths
    are those of ``_entry_files`` (a checkpoint folder's recorded files included)."""
    for category, key, entry in _entries(document):
        yield category, key, [path for path, _ in _entry_files(entry) or []]


def _entries(document: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    for category, keys in document.items():
        if category == METADATA or not isinstance(keys, Mapping):
            continue
        for key in (CHECKPOINTS, FINAL_CHECKPOINT):
            value = keys.get(key)
            for entry in value if isinstance(value, list) else [value]:
                if isinstance(entry, Mapping) and _entry_paths(entry) is not None:
                    yield category, key, entry


def _faults(entry: Any, base: str | None) -> Iterator[tuple[str, bool, str]]:
    """``(path as listed, missing, why)`` for each listed path that makes ``entry`` unusable: gone,
    not a file (only the main path may be a folder), or of another size than recorded."""
    folder = _entry_paths(entry) is not None and _is_folder(entry)
    for index, (given, size) in enumerate(_entry_files(entry) or []):
        try:
            info = os.stat(_join(base, given))
        except OSError:  # as os.path.exists reads it: a file that cannot be looked up is not there
            yield given, True, f"{given} is missing"
            continue
        if stat.S_ISDIR(info.st_mode) and index == 0 and folder:
            continue  # a checkpoint folder (Transformers' checkpoint-500/): its files are listed too
        if not stat.S_ISREG(info.st_mode):
            yield given, False, f"{given} is not a file"
        elif size is not None and info.st_size != size:
            yield given, False, f"{given} has {info.st_size:,} bytes, {size:,} recorded"


def _join(base: str | None, path: str) -> str:
    if os.path.isabs(path):  # no current directory needed (it may have been removed)
        return os.path.normpath(path)
    return os.path.abspath(os.path.join(os.getcwd() if base is None else base, path))


def missing_files(categories: Mapping[str, Mapping[str, Any]],
                  root: str | os.PathLike[str] | None = None) -> list[tuple[str, str, str]]:
    """Every file listed by a checkpoint entry that does not exist: ``(category, key, path)``.

    ``categories`` is a status document (``StatusStore.to_dict()`` or the parsed file); the
    ``checkpoints`` list and the ``final_checkpoint`` of each category are looked at, main files
    (or folders), auxiliary files and the files recorded in a checkpoint folder alike. ``path`` is the path as listed; relative ones are looked up against
    ``root`` (default: the current directory, where ML-Agents resolves them). Values that are not
    checkpoint entries are left out.
    """
    base = None if root is None else os.path.abspath(_fspath(root))
    return [(category, key, path)
            for category, key, paths in _listed(categories)
            for path in paths if not os.path.exists(_join(base, path))]


def changed_files(categories: Mapping[str, Mapping[str, Any]],
                  root: str | os.PathLike[str] | None = None) -> list[tuple[str, str, str, str]]:
    """Every listed path that exists but is not what the entry recorded: ``(category, key, path,
    why)``, why being "models/a.pt has 1,234 bytes, 5,678 recorded" or "models/a.pt is not a
    file". Missing files are ``missing_files``'s."""
    base = None if root is None else os.path.abspath(_fspath(root))
    return [(category, key, path, why)
            for category, key, entry in _entries(categories)
            for path, missing, why in _faults(entry, base) if not missing]


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
