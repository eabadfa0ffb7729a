"""Whether a recorded checkpoint is usable, and the warning that names those passed over.

``CheckpointList.latest()`` and ``final()`` return the first entry ``unusable`` finds nothing
wrong with: an entry in ML-Agents' layout whose files are all there with their recorded sizes
(``files._faults``), and that passes the caller's check. ``warn_skipped`` says which entries they
passed over and why, in one ``TrainingStatusCheckpointWarning``. Its own module so that the list
reads as its steps, with the wording of what it skipped kept apart.

Imports ``files`` and ``_errors`` only: never the store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .files import CHECKPOINTS, FINAL_CHECKPOINT, _entry_paths, _faults
from .._errors import TrainingStatusCheckpointWarning, warn

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["newest_usable", "unusable", "warn_skipped"]


def unusable(entry: Any, check: Callable[[dict[str, Any]], object] | None, root: str | None) -> str | None:
    """Why ``entry`` is not a usable checkpoint, or None if it is."""
    paths = _entry_paths(entry)
    if paths is None or type(entry.get("steps")) is not int:
        return "not a checkpoint entry in ML-Agents' layout (steps, file_path, auxillary_file_paths)"
    for _, _, why in _faults(entry, root):
        return why
    if check is not None:
        try:
            result = check(dict(entry))
        except Exception as exc:  # noqa: BLE001 - a loader failing on the file means "broken"
            return f"the check raised {type(exc).__name__}: {exc}"
        if not result:
            return f"the check returned {result!r}"
    return None


def newest_usable(entries: list[Any], check: Callable[[dict[str, Any]], object] | None,
                  root: str | None) -> tuple[Any, list[tuple[Any, str]]]:
    """The newest usable entry of ``entries`` (None if none is) and the newer ones passed over,
    each with why, newest first: ``latest()``'s choice, which the integrations word their own way.

    Newest means the highest ``steps``, then the later in the list; entries without int steps
    have no place in time and come after every valid one.
    """

    def newness(index: int) -> tuple[bool, int, int]:
        steps = entries[index].get("steps") if isinstance(entries[index], Mapping) else None
        return (True, steps, index) if type(steps) is int else (False, 0, index)

    skipped: list[tuple[Any, str]] = []
    for index in sorted(range(len(entries)), key=newness, reverse=True):
        problem = unusable(entries[index], check, root)
        if problem is None:
            return entries[index], skipped
        skipped.append((entries[index], problem))
    return None, skipped


def warn_skipped(key: str, skipped: list[tuple[Any, str]], chosen: Mapping[str, Any] | None, where: str,
                 context: dict[str, Any]) -> None:
    """Warn that ``latest()`` or ``final()`` passed over ``skipped`` (each entry and why), and what
    it returns instead: ``chosen``, or None."""
    details = "; ".join(f"steps {_steps(entry)} ({reason})" for entry, reason in skipped)
    if chosen is not None:
        message = (f"Skipped {len(skipped)} newer checkpoint(s) of {where}: {details}. "
                   f"Using the checkpoint at steps {chosen['steps']} ({chosen['file_path']}).")
    elif key == FINAL_CHECKPOINT:
        message = f"The final checkpoint of {where} is not usable: {details}. final() returned None."
    else:
        message = (f"No checkpoint of {where} is usable: {details}. latest() returned None: "
                   "training starts without a checkpoint.")
    if key == CHECKPOINTS:
        message += " The entries stay listed; prune_missing() drops those whose files are gone."
    warn(TrainingStatusCheckpointWarning(
        message,
        skipped=list(skipped), **context,
    ))


def _steps(entry: Any) -> Any:
    return entry.get("steps", "?") if isinstance(entry, Mapping) else "?"
