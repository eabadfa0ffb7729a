"""A new checkpoint entry, checked and read before it is recorded.

``new_entry`` checks the arguments of ``CheckpointList.add`` and ``set_final`` and that every
file they name exists (each file in a checkpoint folder), takes the sizes, and returns the entry
to record with what ``folders.sync_entry`` is to sync. It raises on anything wrong and changes
nothing, so a bad call leaves the status and the files as they were. Its own module because the
checks are many and answer one question (may this be recorded?) that the list's order of steps
does not need to show.

Imports ``files`` (the entry's layout) and ``_errors`` only: never the store.
"""

from __future__ import annotations

import math
import numbers
import os
import stat
import time

from .files import FILES, _fspath, _join
from .._errors import TrainingStatusCheckpointError, TrainingStatusTypeError, TrainingStatusValueError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["new_entry"]


def new_entry(steps: Any, file_path: Any, reward: Any, auxillary: Any, creation_time: Any, synced: Any, *,
              root: str | None, where: str, context: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The entry to record and what ``folders.sync_entry`` syncs: ``(absolute path, name shown)``
    of each file, then of each folder inside a checkpoint folder, deepest first, then of the
    checkpoint folder itself. Raises on anything wrong."""
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
        reward = _number("reward", reward, where, context,
                         " Pass reward=None when the checkpoint has no reward yet.", nan=True)
    if creation_time is None:
        creation_time = time.time()
    else:
        creation_time = _number("creation_time", creation_time, where, context,
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
    given = [_path("file_path", file_path, where, context)]
    given += [_path("auxillary_file_paths", p, where, context) for p in extra]
    paths = [_join(root, p) for p in given]
    sizes: dict[str, int] = {}
    targets: list[tuple[str, str]] = []
    folders: list[tuple[str, str]] = []
    for index, (name, path) in enumerate(zip(given, paths)):
        if _exists(name, path, int(steps), root, where, context, folder=index == 0):
            folders = _folder(name, path, int(steps), sizes, targets, where, context)
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


def _folder(given: str, folder: str, steps: int, sizes: dict[str, int], targets: list[tuple[str, str]],
            where: str, context: dict[str, Any]) -> list[tuple[str, str]]:
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
        failed_at = exc.filename if isinstance(exc.filename, str) else folder
        raise TrainingStatusCheckpointError(
            f"Cannot record the checkpoint at steps {steps} of {where}: reading its folder "
            f"{given} failed at {failed_at} ({exc.strerror or exc}). Check the folder's permissions and "
            "links. Nothing was recorded or removed.",
            file_path=given, errno=exc.errno, **context,
        ) from exc
    if not any(path.startswith(folder + os.sep) for path, _ in targets):
        raise TrainingStatusCheckpointError(
            f"Cannot record the checkpoint at steps {steps} of {where}: its folder {given} "
            "holds no file. Write the checkpoint's files completely before recording it. Nothing "
            "was recorded or removed.",
            file_path=given, **context,
        )
    return folders[::-1]  # os.walk goes top-down: reversed, each folder after those inside it


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


def _exists(given: str, path: str, steps: int, root: str | None, where: str, context: dict[str, Any], *,
            folder: bool) -> bool:
    """Raise unless ``path`` is a regular file, or a folder where ``folder``; True for a folder."""
    what = f"the checkpoint at steps {steps} of {where}"
    shown = given if given == path else f"{given} ({path})"
    try:
        info = os.stat(path)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            problem = "does not exist"
            todo = ("Write the checkpoint's files completely before recording it"
                    + ("" if os.path.isabs(given) else
                       f"; relative paths are resolved against "
                       f"{root or 'the current directory (' + os.getcwd() + ')'}"))
        else:
            problem = f"cannot be looked up ({exc.strerror or exc})"
            todo = "Check the path and the permissions of its folders"
        raise TrainingStatusCheckpointError(
            f"Cannot record {what}: its file {shown} {problem}. {todo}. Nothing was recorded or removed.",
            file_path=given, errno=exc.errno, **context,
        ) from exc
    if folder and stat.S_ISDIR(info.st_mode):
        return True
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise TrainingStatusCheckpointError(
            f"Cannot record {what}: {shown} is {kind}. Only file_path may be a checkpoint folder; "
            "auxillary_file_paths lists files. Nothing was recorded or removed.",
            file_path=given, **context,
        )
    return False
