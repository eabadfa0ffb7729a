"""Where the relative paths of a behavior's checkpoints are rooted: the ``checkpoint_root`` key.

A behavior's category may hold ``checkpoint_root`` beside ``checkpoints`` and ``final_checkpoint``:
the folder their relative ``file_path``, ``auxillary_file_paths`` and ``files`` are under.
``CheckpointList(root=...)`` records it with the entries it adds, relative to the folder of the
status file when the root is that folder or inside it (``"."``, ``"models"``), so a run folder
moved or copied with its status file still resolves; absolute otherwise (and always beside a status
file that is not a local file). Both sides are taken as real paths (symlinks resolved): the store
writes the real file, so every reader finds the same folder whichever link it opened it through.

A category without the key is in ML-Agents' layout: relative paths are under the folder
``mlagents-learn`` ran in, which readers take to be the current directory (or the command line's
``--root``), and say so. ML-Agents reads the file with ``json.load`` and looks up its own keys:
the extra key is carried through its rewrites and never read by it.

Recording another folder moves what is listed onto it in the same write (``rebase``): each
relative path of the category's entries is rewritten to name the same file under the new folder,
or made absolute when it is not inside it, so no reader looks for an entry recorded earlier under
the wrong folder. Entries of a category that recorded none are taken to be under the current
directory of the process that records the folder, where every reader looked for them, unless
their files are not there but under the new folder (a list an integration recorded with that
folder before trainstatus recorded it).

Below the store, like ``files``: imports ``_errors`` only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from .._errors import TrainingStatusValueError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["ROOT", "BadRoot", "Base", "base", "rebase", "recorded", "recorded_folder", "to_record"]

ROOT = "checkpoint_root"
# files.CHECKPOINTS, files.FINAL_CHECKPOINT and files.FILES (files imports this module, not back).
_ENTRY_KEYS = ("checkpoints", "final_checkpoint")
_FILES = "files"


class BadRoot(ValueError):
    """The category's ``checkpoint_root`` is not a folder this reader can use; ``str()`` says why."""


class Base:
    """The folder a category's relative paths were looked up under, and where that came from.

    ``folder``: absolute, or None for the current directory at each lookup. ``source``:
    ``"recorded"`` (the category's ``checkpoint_root``), ``"given"`` (the caller's root or the
    command line's ``--root``) or ``"current"`` (neither: ML-Agents' layout).
    """

    __slots__ = ("category", "folder", "source")

    def __init__(self, category: str, folder: str | None, source: str) -> None:
        self.category = category
        self.folder = folder
        self.source = source

    def shown(self) -> str:
        """The folder as a message names it: its absolute path, the current directory's included."""
        if self.folder is not None:
            return self.folder
        try:
            return os.getcwd()
        except OSError:  # removed under us: still say which folder was meant
            return "the current directory (removed)"

    def why(self, given: str = "given as root=") -> str:
        """Where the folder came from, in words: ``given`` names the caller's way of giving one."""
        if self.source == "recorded":
            return f"recorded in {self.category}/{ROOT}"
        if self.source == "given":
            return given
        return (f"the current directory: {self.category} records no {ROOT}, so its paths are read as "
                "ML-Agents writes them, relative to the folder mlagents-learn ran in")

    def __repr__(self) -> str:
        return f"Base({self.category!r}, {self.folder!r}, {self.source!r})"


def _status_folder(status_path: str) -> str:
    return os.path.dirname(os.path.realpath(status_path))


def to_record(root: str, status_path: str) -> str:
    """What ``checkpoint_root`` records for the absolute folder ``root`` in the file ``status_path``."""
    if not os.path.isabs(status_path):  # an object store's URL, ML-Agents' unbound "<memory>" store
        return root
    relative = os.path.relpath(os.path.realpath(root), _status_folder(status_path))
    if relative == os.pardir or relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
        return root
    return relative


def recorded(category: str, keys: Any, status_path: str | None) -> str | None:
    """The absolute folder the category ``keys`` records, or None when it records none.

    ``status_path``: the absolute path of the local status file the category was read from, or
    None (or a URL) when there is none. Raises ``BadRoot`` for a value no reader can use: not a
    non-empty string, or relative with no local status file to take it from.
    """
    value = keys.get(ROOT) if isinstance(keys, Mapping) else None
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise BadRoot(f"{category}/{ROOT} holds {value!r}, which is not a folder path")
    if os.path.isabs(value):
        return os.path.normpath(value)
    if status_path is None or not os.path.isabs(status_path):
        raise BadRoot(f"{category}/{ROOT} holds the relative path {value!r}, relative to the folder of "
                      f"a status file, and {status_path or 'this document'} is not a local file")
    return os.path.normpath(os.path.join(_status_folder(status_path), value))


def base(category: str, keys: Any, status_path: str | None, given: str | None = None, *,
         given_wins: bool = False) -> Base:
    """The folder ``category``'s relative paths are under (``keys``: the category's keys).

    The recorded ``checkpoint_root``, else ``given``, else the current directory; ``given_wins``:
    ``given`` (when not None) before the recorded one (a ``CheckpointList`` given ``root=``).
    Raises ``BadRoot`` when the recorded one is needed and unusable.
    """
    if given is not None and given_wins:
        return Base(category, given, "given")
    found = recorded(category, keys, status_path)
    if found is not None:
        return Base(category, found, "recorded")
    if given is not None:
        return Base(category, given, "given")
    return Base(category, None, "current")


def recorded_folder(category: str, value: Any, status_path: str) -> str | None:
    """The folder ``checkpoint_root`` (``value``) of ``category`` in ``status_path`` names, or None
    for the current directory (none recorded); a ``TrainingStatusValueError`` that says what to do
    when it cannot be used."""
    try:
        return recorded(category, {ROOT: value}, status_path)
    except BadRoot as exc:
        raise TrainingStatusValueError(
            f"{exc}: the relative checkpoint paths of {category} in {status_path} cannot be found. Set it "
            f"to the directory they are relative to, or delete it (trainstatus delete {status_path} "
            f"{category} {ROOT}) to read them from the current directory, or pass CheckpointList(root=...).",
            path=status_path, category=category, key=ROOT,
        ) from None


def rebase(category: str, keys: Mapping[str, Any], root: str, status_path: str) -> dict[str, Any]:
    """What to set in ``category`` (``keys``: its keys) to record the absolute folder ``root`` as
    its ``checkpoint_root``: that key, and ``checkpoints`` and ``final_checkpoint`` with each
    relative path that was under another folder moved onto ``root`` (the same file, relative when
    inside it, absolute otherwise); {} when ``root`` is recorded already.

    Their folder was the recorded one; a recorded one no reader can use is taken to be ``root``, as
    the list given it reads them. Without one, see ``_unrecorded``.
    """
    value = to_record(root, status_path)
    if keys.get(ROOT) == value:
        return {}
    try:
        old = recorded(category, keys, status_path)
    except BadRoot:
        old = root
    real = os.path.realpath(root)
    if old is not None and os.path.realpath(old) == real:
        return {ROOT: value}

    def moved(entry: Any) -> Any:
        folder = old if old is not None else _unrecorded(entry, root, category, status_path)
        if os.path.realpath(folder) == real:
            return entry
        return _mapped(entry, lambda path: _move(path, folder, real))

    changes: dict[str, Any] = {ROOT: value}
    for key in _ENTRY_KEYS:
        listed = keys.get(key)
        if isinstance(listed, list):
            changes[key] = [moved(entry) for entry in listed]
        elif isinstance(listed, Mapping):
            changes[key] = moved(listed)
    return changes


def _unrecorded(entry: Any, root: str, category: str, status_path: str) -> str:
    """The folder the relative paths of ``entry`` are under, in a category that records none: the
    current directory, where every reader looked for them (ML-Agents' layout: the folder
    mlagents-learn ran in), unless its files are not there but are under ``root`` (a list recorded
    with this ``root=`` by a trainstatus that did not record it yet). Raises
    ``TrainingStatusValueError`` when that takes a current directory that was removed."""
    relative = [path for path in _paths(entry) if not os.path.isabs(path)]
    try:
        current: str | None = os.getcwd()
    except OSError:
        current = None
    if not relative or (current is not None and _all_there(current, relative)):
        return current or root
    if _all_there(root, relative):
        return root
    if current is None:
        raise TrainingStatusValueError(
            f"Cannot record {category}/{ROOT} in {status_path}: the checkpoints {category} lists are relative "
            f"to the current directory (it records no {ROOT}), which was removed, and are not under {root}, "
            "so they cannot be moved onto it. Run from the folder they are relative to. Nothing was recorded "
            "or removed.",
            path=status_path, category=category, key=ROOT,
        )
    return current


def _all_there(folder: str, paths: list[str]) -> bool:
    return all(os.path.lexists(os.path.join(folder, path)) for path in paths)


def _paths(listed: Any) -> list[str]:
    """Every path the entries ``listed`` (a list of them, or one) name."""
    paths: list[str] = []

    def collect(path: str) -> str:
        paths.append(path)
        return path

    for entry in listed if isinstance(listed, list) else [listed]:
        _mapped(entry, collect)
    return paths


def _mapped(entry: Any, change: Callable[[str], str]) -> Any:
    """A copy of ``entry`` with ``change`` applied to each path it names: ``file_path``, each of
    ``auxillary_file_paths`` and each key of ``files``, as far as they hold non-empty strings
    (an entry edited by hand keeps what is not a path); anything but a mapping as it is."""
    if not isinstance(entry, Mapping):
        return entry
    moved = dict(entry)
    main = entry.get("file_path")
    if isinstance(main, str) and main:
        moved["file_path"] = change(main)
    extra = entry.get("auxillary_file_paths")
    if isinstance(extra, list):
        moved["auxillary_file_paths"] = [change(p) if isinstance(p, str) and p else p for p in extra]
    sizes = entry.get(_FILES)
    if isinstance(sizes, Mapping):
        moved[_FILES] = {change(p) if isinstance(p, str) and p else p: n for p, n in sizes.items()}
    return moved


def _move(path: str, old: str, new: str) -> str:
    """``path``, relative to ``old``, as the same file relative to ``new`` (a real path) when inside
    it (``old`` taken as its real path too, as a recorded root is), else absolute: where readers
    found it."""
    if os.path.isabs(path):
        return path
    try:
        inside = os.path.relpath(os.path.join(os.path.realpath(old), path), new)
    except ValueError:  # another drive (Windows)
        inside = os.pardir
    if inside == os.curdir or inside == os.pardir or inside.startswith(os.pardir + os.sep):
        return os.path.normpath(os.path.join(old, path))
    return inside
