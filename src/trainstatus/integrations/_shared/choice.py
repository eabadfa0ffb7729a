"""What the integrations' resumes share: the newest whole checkpoint a resume takes, and the
warning, in a training library user's words, about the newer ones it passed over."""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable, Mapping
from typing import Any

from ..._storage import history as _history
from ..._checkpoints.checkpoint_list import CheckpointList
from ..._checkpoints.usable import newest_usable
from ..._errors import TrainingStatusCheckpointWarning, TrainingStatusWriteError, warn
from ..._store import StatusStore
from .upkeep import drop


@dataclasses.dataclass(frozen=True)
class Words:
    """How an integration's messages speak to its users about the checkpoints a resume passes over."""

    left: str  # what becomes of newer checkpoints passed over when an older one is resumed from
    fresh: str  # what a run does when last_complete_checkpoint() returned None
    elsewhere: str  # how to train apart from these files


def choose(checkpoints: CheckpointList, check: Callable[[dict[str, Any]], bool]) -> tuple[dict[str, Any] | None,
                                                                                       list[tuple[Any, str]]]:
    """The newest entry of ``checkpoints`` that passes ``check`` (and has its recorded files), or
    None, and the newer ones passed over with why, newest first (``CheckpointList.latest``'s choice,
    without its warning: the integrations word their own). Each why names the file it is about."""
    chosen, skipped = newest_usable(checkpoints.entries(), _naming(check), checkpoints.resolve(os.curdir))
    return (None if chosen is None else dict(chosen)), [(entry, _why(entry, reason)) for entry, reason in skipped]


def recorded(status_path: str) -> bool:
    """Is there a status file at ``status_path``, or a kept version of one (its history), to read?
    Without either, nothing was ever recorded there: a fresh run."""
    return os.path.exists(status_path) or bool(
        _history.versions(os.path.dirname(os.path.abspath(status_path)), os.path.basename(status_path)))


def later(entry: Mapping[str, Any], step: int) -> bool:
    """Is ``entry`` of a step after ``step``?"""
    steps = entry.get("steps")
    return type(steps) is int and steps > step


def choose_unlisting(checkpoints: CheckpointList, check: Callable[[dict[str, Any]], bool]
                     ) -> tuple[dict[str, Any] | None, list[tuple[Any, str]], TrainingStatusWriteError | None]:
    """``choose``, and the newer entries passed over dropped from the list in one write (their
    files stay): a run saves over their folders as it reaches their steps, and a folder half saved
    over must never be found listed (same-size shards pass the size check).

    A status file that cannot be written here (a read-only mount, a folder of someone else's, one
    marked immutable: ``EROFS``, ``EACCES``, ``EPERM``) leaves them listed, and the resume goes on:
    a run cannot save there either (its first record, and a save over a listed folder, which
    unlists it first, fail loudly), and each resume passes them over again. That refusal is
    returned third (None when they were dropped), for the caller's warning (``left_listed``). Any
    other failure of the write (a full disk, an I/O error) is raised: a run that could write its
    checkpoints would then find them listed while it saves over them."""
    entry, skipped = choose(checkpoints, check)
    if skipped:
        newest = -1 if entry is None else entry["steps"]
        try:
            drop(checkpoints, lambda e: later(e, newest))
        except TrainingStatusWriteError as exc:
            if exc.errno not in READ_ONLY:
                raise
            return entry, skipped, exc
    return entry, skipped, None


def left_listed(path: str, refused: TrainingStatusWriteError) -> str:
    """The sentence of a passed-over warning when ``choose_unlisting`` could not drop them."""
    return (f"They stay listed: {path} cannot be written here, and each resume passes them over again ({refused}) "
            "Resuming read-only is fine; a run that saves checkpoints here needs to write the status file (its "
            "first save fails otherwise).")


READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})  # the status file's write refused, not failed


def pick(status_path: str, category: str, root: str, check: Callable[[dict[str, Any]], bool],
         listed: list[Any] | None = None) -> tuple[dict[str, Any] | None, list[tuple[Any, str]]]:
    """``choose`` over ``category``'s checkpoints in ``status_path`` (relative paths under ``root``);
    ``listed``, when given, gets every entry read (so that no caller opens the store a second time).

    A missing status file is a fresh run (None, nothing passed over), unless its history is there:
    then the store puts the newest kept version back (``resume=True``) and that is read.
    """
    if not recorded(status_path):
        return None, []
    store = StatusStore(status_path, resume=True)
    try:
        checkpoints = CheckpointList(store, category, keep=None, root=root)
        if listed is not None:
            listed.extend(checkpoints.entries())
        return choose(checkpoints, check)
    finally:
        store.close()


def reasons(skipped: list[tuple[Any, str]]) -> str:
    """The whys of ``skipped`` in one clause, newest first."""
    return "; ".join(why for _, why in skipped)


def warn_passed_over(returned: str | None, skipped: list[tuple[Any, str]], status_path: str, category: str,
                     root: str, words: Words) -> None:
    """Warn, in the words of a user of the training library, that ``last_complete_checkpoint``
    passed over ``skipped`` (recorded but damaged or gone) and returns ``returned``."""
    if returned is not None:
        message = (f"{returned} is the newest whole checkpoint recorded in {status_path}; the newer ones cannot be "
                   f"resumed from: {reasons(skipped)}. {words.left} If you have whole copies of them, stop, put "
                   f"them back in {root} and start again to resume from the newest.")
    else:
        message = (f"No checkpoint recorded in {status_path} can be resumed from: {reasons(skipped)}. "
                   f"last_complete_checkpoint() returns None: {words.fresh} To keep these files, stop and move "
                   f"them out of {root}, or {words.elsewhere}; if you have whole copies of them, put them back "
                   f"in {root} and start again.")
    warn(TrainingStatusCheckpointWarning(message, skipped=list(skipped), path=status_path, category=category))


def newest_whole(status_path: str, category: str, root: str, check: Callable[[dict[str, Any]], bool],
                 words: Words, shown: str) -> dict[str, Any] | None:
    """``pick``, warning (``warn_passed_over``) about the newer entries passed over; ``shown`` is
    the folder as the caller gave it, joined to the entry's path in the warning."""
    entry, skipped = pick(status_path, category, root, check)
    if skipped:
        returned = None if entry is None else os.path.join(shown, entry["file_path"])
        warn_passed_over(returned, skipped, status_path, category, root, words)
    return entry


def _naming(check: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    """``check``, with any error but a ValueError (whose message names the file: the integrations'
    own) turned into one that names the checkpoint's file."""

    def named(entry: dict[str, Any]) -> bool:
        try:
            return check(entry)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - a reader failing on the file means "not whole"
            raise ValueError(f"{entry['file_path']} cannot be read ({type(exc).__name__}: {exc})") from exc

    return named


_CHECK_RAISED = "the check raised ValueError: "  # usable.unusable's wording of a check's ValueError


def _why(entry: Any, reason: str) -> str:
    """``reason`` as a user reads it: the check's own message, or what is wrong with the entry."""
    if reason.startswith(_CHECK_RAISED):
        return reason[len(_CHECK_RAISED):]
    if reason.startswith("not a checkpoint entry"):
        return f"an item of the list is {reason}: {str(entry)[:80]}"
    return reason
