"""What ``TrainStatusCallback`` does to its checkpoint list besides recording: the rotation of
``save_total_limit`` after each record, the entries a run saves over dropped at its start, and the
resumed state's best checkpoint made a whole, recorded one.

Under a process group these run on rank 0 only (the one writer of the status file); the best
checkpoint's fix is returned rather than set, so that every rank's ``TrainerState`` gets the same.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..._checkpoints.checkpoint_list import CheckpointList
from ..._errors import TrainingStatusCheckpointWarning, warn
from .._shared.choice import choose, reasons
from .._shared.upkeep import drop
from .folders import problem, whole

__all__ = ["Best", "best_fix", "drop_later", "metric", "output_dir", "remove", "rotate"]

Best = tuple[str | None, float | None, int | None]
"""``state.best_model_checkpoint``, ``best_metric`` and ``best_global_step``, as ``best_fix`` sets them."""


def output_dir(args: TrainingArguments) -> str:
    # Typed Optional; TrainingArguments.__post_init__ sets "trainer_output" where none is given.
    return os.fspath(args.output_dir or "trainer_output")


def rotate(checkpoints: CheckpointList, recorded: Mapping[str, Any], limit: int, best: str | None) -> None:
    """``transformers.trainer_utils.rotate_checkpoints`` over the recorded entries, after the new
    one is recorded: the oldest beyond ``limit`` go, never the newest nor ``best``."""
    protected = {checkpoints.resolve(recorded["file_path"])}
    if best is not None:
        protected.add(os.path.abspath(best))
    entries = [e for e in checkpoints.entries() if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)]
    entries.sort(key=lambda e: e["steps"] if type(e.get("steps")) is int else -1)  # oldest first, stable
    remaining, doomed = len(entries), []
    for entry in entries:
        if remaining <= max(limit, len(protected)):
            break
        if checkpoints.resolve(entry["file_path"]) not in protected:
            doomed.append(id(entry))
            remaining -= 1
    if doomed:
        marks = {(e["file_path"], e.get("steps"), e.get("creation_time")) for e in entries if id(e) in doomed}
        remove(checkpoints, lambda e: (e["file_path"], e.get("steps"), e.get("creation_time")) in marks)


def remove(checkpoints: CheckpointList, stale: Callable[[Mapping[str, Any]], bool]) -> None:
    """Drop the entries ``stale`` picks in one write, then remove their folders (as ``add`` does
    with ``keep``: a kill in between leaves a folder no longer listed, never a listed one gone)."""
    dropped, document = drop(checkpoints, stale)
    if dropped:
        checkpoints._remove(dropped, document)


def drop_later(checkpoints: CheckpointList, step: int, shown: str) -> None:
    """Drop the entries of steps after ``step`` (their folders stay): this run saves over them, file
    by file, and a kill in the middle must not leave them listed with some files of each run.
    ``shown``: the output_dir as the user gave it (the warning names a folder the way they would)."""
    later = [e for e in checkpoints.entries() if isinstance(e, Mapping) and type(e.get("steps")) is int
             and e["steps"] > step]
    if not later:
        return
    root = checkpoints.resolve(os.curdir)
    # A run at step 0 over recorded checkpoints: is there one it could have continued from?
    chosen, skipped = choose(checkpoints, whole(root)) if step == 0 else (None, [])
    drop(checkpoints, lambda e: type(e.get("steps")) is int and e["steps"] > step)
    if step != 0:
        return
    start = (f"This run starts at step 0 in {root}, where {checkpoints.store.path} recorded checkpoints up to "
             f"step {max(e['steps'] for e in later)}")
    if chosen is None:
        message = (f"{start}, none of them whole ({reasons(skipped)}): they are no longer listed, and this run "
                   f"saves over their folders as it reaches their steps. To keep them, stop and move them out of "
                   f"{root}, or train into another output_dir.")
    else:
        message = (f"{start}: they are no longer listed, and this run saves over their folders as it reaches "
                   f"their steps. If you meant to continue, stop and pass trainer.train(resume_from_checkpoint="
                   f"{os.path.join(shown, chosen['file_path'])!r}), the newest whole one, before this run "
                   "saves over it; to start over without this warning, train into another output_dir.")
    warn(TrainingStatusCheckpointWarning(message, path=checkpoints.store.path, category=checkpoints.category))


def best_fix(checkpoints: CheckpointList, args: TrainingArguments, state: TrainerState) -> Best | None:
    """What the resumed state's best checkpoint must become so that it names a recorded, whole
    folder, or None (nothing to change); warns when it changes it (module docs)."""
    by_folder = {checkpoints.resolve(e["file_path"]): e for e in checkpoints.entries()
                 if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)}
    named = state.best_model_checkpoint
    if named is None:
        # The Trainer itself forgets a best folder that is gone (_init_training_state) but keeps
        # its best_metric: no later checkpoint could become best unless it beats the lost one.
        step = getattr(state, "best_global_step", None)
        folder = None if not step else checkpoints.resolve(f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if folder is None or folder not in by_folder:
            return None
    else:
        folder = os.path.abspath(named)
    why = problem(checkpoints, by_folder.get(folder), folder)
    if why is None:
        return None
    candidates = [e for path, e in by_folder.items() if e.get("steps", 0) <= state.global_step
                  and isinstance(e.get("reward"), (int, float)) and not math.isnan(e["reward"])
                  and problem(checkpoints, e, path) is None]
    better = max if _greater_is_better(args) else min
    chosen = better(candidates, key=lambda e: e["reward"]) if candidates else None
    fix: Best
    if chosen is None:
        fix = (None, None, None)
        instead = "None (no whole recorded checkpoint has the metric): the next evaluation becomes the best"
    else:
        fix = (os.path.join(output_dir(args), chosen["file_path"]), chosen["reward"], chosen["steps"])
        instead = f"{fix[0]} ({args.metric_for_best_model} {chosen['reward']})"
    # As the Trainer spells it (args.output_dir joined), also where it had already dropped it.
    shown = named if named is not None else os.path.join(output_dir(args), os.path.basename(folder))
    reason = f"{os.path.basename(folder)} {why}" if not why.startswith(os.path.basename(folder)) else why
    warn(TrainingStatusCheckpointWarning(
        f"The resumed trainer state's best checkpoint {shown} is not a whole checkpoint ({reason}); "
        f"best_model_checkpoint is now {instead}. Recorded in {checkpoints.store.path}.",
        path=checkpoints.store.path, category=checkpoints.category,
    ))
    return fix


def _greater_is_better(args: TrainingArguments) -> bool:
    if args.greater_is_better is not None:
        return bool(args.greater_is_better)
    return not str(args.metric_for_best_model or "loss").endswith("loss")  # TrainingArguments' default


def metric(args: TrainingArguments, state: TrainerState) -> float | None:
    """This checkpoint's value of the metric the Trainer ranks checkpoints by, as it logged it at
    this step (``_determine_best_metric``'s ``eval_`` prefix), or None (not evaluated here)."""
    name = args.metric_for_best_model
    if not name:
        return None
    key = name if name.startswith("eval_") else f"eval_{name}"
    for logged in reversed(state.log_history):
        if logged.get("step") == state.global_step and key in logged:
            try:
                value = float(logged[key])
            except (TypeError, ValueError):
                return None
            return value if not math.isinf(value) else None
    return None
