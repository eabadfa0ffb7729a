"""Which files the checkpoint entries of a status document list, and which of them are missing.

Below both the store and ``CheckpointList``: the store names the missing files when it puts a
version from its history back (that version may list checkpoints removed since), and
``CheckpointList`` and ``trainstatus check --files`` use the same reading of an entry, each
relative path under the folder its category records (``roots``), found the same way by all.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

from .roots import BadRoot, Base, base
from .._load import METADATA

__all__ = ["CHECKPOINTS", "FILES", "FINAL_CHECKPOINT", "all_faulty", "all_missing", "bases", "changed_files",
           "describe_missing", "missing_files"]

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


def bases(categories: Mapping[str, Any], status_path: str | None,
          root: str | os.PathLike[str] | None = None) -> dict[str, Base | BadRoot]:
    """The folder each category's relative paths are under (``roots.base``), or the ``BadRoot``
    that says why its recorded one cannot be used; for every category that is an object.

    ``status_path``: the absolute path of the status file the document was read from (a URL or
    None: there is none, and only absolute recorded folders can be used). ``root``: the folder for
    the categories that record none (default: the current directory, as ML-Agents resolves them).
    """
    given = None if root is None else os.path.abspath(_fspath(root))
    found: dict[str, Base | BadRoot] = {}
    for category, keys in categories.items():
        if category == METADATA or not isinstance(keys, Mapping):
            continue
        try:
            found[category] = base(category, keys, status_path, given)
        except BadRoot as exc:
            found[category] = exc
    return found


def _folders(categories: Mapping[str, Any], root: str | os.PathLike[str] | None,
             status_path: str | None) -> dict[str, str | None]:
    """The folder of each category, for ``missing_files`` and ``changed_files``: raises ``BadRoot``."""
    if status_path is None:  # the recorded folders are not read: every relative path is under root
        given = None if root is None else os.path.abspath(_fspath(root))
        return {category: given for category in categories}
    folders: dict[str, str | None] = {}
    for category, found in bases(categories, status_path, root).items():
        if isinstance(found, BadRoot):
            raise found
        folders[category] = found.folder
    return folders


def missing_files(categories: Mapping[str, Mapping[str, Any]], root: str | os.PathLike[str] | None = None, *,
                  status_path: str | None = None) -> list[tuple[str, str, str]]:
    """Every file listed by a checkpoint entry that does not exist: ``(category, key, path)``.

    ``categories`` is a status document (``StatusStore.to_dict()`` or the parsed file); the
    ``checkpoints`` list and the ``final_checkpoint`` of each category are looked at, main files
    (or folders), auxiliary files and the files recorded in a checkpoint folder alike. ``path`` is
    the path as listed. Relative ones are looked up under the folder the category records
    (``checkpoint_root``, read when ``status_path``, the file the document was read from, is
    given: ``BadRoot`` if it cannot be used), else under ``root`` (default: the current directory,
    where ML-Agents resolves them). Values that are not checkpoint entries are left out.
    """
    folders = _folders(categories, root, status_path)
    return [(category, key, path)
            for category, key, paths in _listed(categories)
            for path in paths if not os.path.exists(_join(folders[category], path))]


def changed_files(categories: Mapping[str, Mapping[str, Any]], root: str | os.PathLike[str] | None = None, *,
                  status_path: str | None = None) -> list[tuple[str, str, str, str]]:
    """Every listed path that exists but is not what the entry recorded: ``(category, key, path,
    why)``, why being "models/a.pt has 1,234 bytes, 5,678 recorded" or "models/a.pt is not a
    file". Missing files are ``missing_files``'s; folders are found as it finds them."""
    folders = _folders(categories, root, status_path)
    return [(category, key, path, why)
            for category, key, entry in _entries(categories)
            for path, missing, why in _faults(entry, folders[category]) if not missing]


def all_missing(entries: Any, folder: str | None) -> list[str]:
    """The paths ``entries`` (a ``checkpoints`` list) name when not one of them exists under
    ``folder``, the sign of a list read against the wrong folder; [] when one does, or none is named."""
    listed = [path for entry in (entries if isinstance(entries, list) else [])
              for path, _ in _entry_files(entry) or []]
    if any(os.path.exists(_join(folder, path)) for path in listed):
        return []
    return listed


def all_faulty(entries: Any, folder: str | None) -> list[tuple[Any, str]]:
    """``(entry, why)`` for each checkpoint of ``entries`` (a ``checkpoints`` list), ``why`` its
    first fault under ``folder`` (``"checkpoint-1 is missing"``, ``"a.pt has 5 bytes, 3
    recorded"``), when every one has a fault: pruning would drop them all, the sign of a list read
    against the wrong folder (where another run's files of the same names may lie); [] when one is
    whole, or the list names none. Items not in ML-Agents' layout are not checkpoints (kept)."""
    faulty: list[tuple[Any, str]] = []
    for entry in entries if isinstance(entries, list) else []:
        if _entry_paths(entry) is None:
            continue
        fault = next(_faults(entry, folder), None)
        if fault is None:
            return []
        faulty.append((entry, fault[2]))
    return faulty


def describe_missing(categories: Mapping[str, Mapping[str, Any]], status_path: str | None = None,
                     shown: int = 10) -> str:
    """A sentence naming the listed checkpoint files that are missing now, and the folder each
    category's relative paths were looked up under (``bases``), or "" when none is missing."""
    try:
        found = bases(categories, status_path)
        usable = {category: keys for category, keys in categories.items()
                  if isinstance(found.get(category), Base)}
        missing = missing_files(usable, status_path=status_path)
        folders = {category: found[category] for category, _, _ in missing}
        where = "; ".join(f"under {b.shown()}, {b.why()}" for b in folders.values() if isinstance(b, Base))
    except OSError:  # the current directory was removed: a warning's extra sentence is not worth failing for
        return ""
    if not missing:
        return ""
    listed = "; ".join(f"{category}/{key} {path}" for category, key, path in missing[:shown])
    more = f" (and {len(missing) - shown} more)" if len(missing) > shown else ""
    return (f" That version lists {len(missing)} checkpoint file(s) that are missing now: {listed}{more} "
            f"(relative paths looked up {where}). Do not resume from them: "
            "CheckpointList.latest() skips them, prune_missing() drops their entries.")
