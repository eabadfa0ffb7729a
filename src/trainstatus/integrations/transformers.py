"""Hugging Face Transformers: a resume that never picks a half-written checkpoint folder.

The ``Trainer`` writes ``checkpoint-<step>/`` file by file (weights, optimizer, scheduler, RNG
states, ``trainer_state.json`` last) straight into its final folder, and
``transformers.trainer_utils.get_last_checkpoint`` returns the highest step whether or not its save
finished. Here:

- ``TrainStatusCallback`` is a ``TrainerCallback``: after each save (``on_save``) it fsyncs every
  file of the new folder, the folder and the folders above it, then records the folder in a
  ``CheckpointList`` with the size of each file. It also takes ``save_total_limit`` over from the
  Trainer, which would remove old folders before the new one is recorded, and removes them itself
  after.
- ``last_complete_checkpoint(output_dir)`` is the newest recorded folder whose files are all there
  with their recorded sizes, for ``trainer.train(resume_from_checkpoint=...)``. A Trainer holding
  the callback resumes from it when given ``resume_from_checkpoint=True`` too.

Usage (two lines differ from Transformers' own recipe)::

    from trainstatus.integrations.transformers import TrainStatusCallback, last_complete_checkpoint

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TrainStatusCallback()])
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from transformers import (
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .._checkpoints.checkpoint_list import CheckpointList
from .._errors import TrainingStatusCheckpointError, TrainingStatusCheckpointWarning, TrainingStatusTypeError, warn
from .._store import StatusStore
from ._common import Words, choose, drop, newest_whole, pick, reasons, warn_passed_over
from ._transformers_folders import problem, unrecorded, warn_unrecorded, whole

__all__ = ["CATEGORY", "STATUS_FILE", "TrainStatusCallback", "last_complete_checkpoint"]

STATUS_FILE = "training_status.json"
"""The status file's name in ``args.output_dir`` when no ``status_path`` is given."""

CATEGORY = "transformers"
"""The category of the status file the checkpoints are listed under (``transformers/checkpoints``)."""

_WORDS = Words(
    left="They are left on disk: a run saves over each folder when it reaches its step.",
    fresh="trainer.train(resume_from_checkpoint=None) starts at step 0 and saves over these folders as it "
          "reaches their steps.",
    elsewhere="train into another output_dir",
)


class TrainStatusCallback(TrainerCallback):
    """A ``TrainerCallback`` that records each checkpoint folder once it is durable, and takes over
    ``save_total_limit``.

    ``Trainer(..., callbacks=[TrainStatusCallback()])``. The Trainer's saves are unchanged; around them:

    - ``on_save`` (the Trainer has written ``checkpoint-<global_step>/``): every file of the folder,
      the folder and the folders above it are fsynced, then the folder is recorded in
      ``transformers/checkpoints`` of the status file (``steps``: ``global_step``; ``files``: each
      file with its size; ``reward``: this checkpoint's value of ``args.metric_for_best_model``,
      when the Trainer evaluated it at this step, else None).
    - ``save_total_limit``: the Trainer removes old folders inside its save, before ``on_save``,
      so a kill right after could leave no recorded folder on disk. ``on_train_begin`` sets the
      Trainer's ``args.save_total_limit`` to None (``on_train_end`` puts it back) and this callback
      applies the limit as the Trainer would: after the new folder is recorded, the oldest entries
      beyond the limit are dropped from the list in one write, and only then their folders
      removed; the newest and ``state.best_model_checkpoint`` are never removed; with a limit of 1
      and a best checkpoint, the other folders go at the end of training (what the Trainer does).
    - ``on_train_begin`` also drops the entries of steps after the one the run starts from (the
      run saves over those folders; a run starting at step 0 over recorded checkpoints is warned
      about), and makes sure ``state.best_model_checkpoint`` names a folder that is recorded and
      whole: one that is missing or damaged is replaced by the best whole recorded checkpoint up to
      this step (by ``metric_for_best_model`` and ``greater_is_better``; ``best_metric`` and
      ``best_global_step`` with it), or by None, with a ``TrainingStatusCheckpointWarning``.

    - ``trainer.train(resume_from_checkpoint=True)`` (where the Trainer would take the highest
      ``checkpoint-*`` folder, whole or not) resumes from ``last_complete_checkpoint(args.output_dir)``,
      with its warnings; when no checkpoint there is whole, a ``TrainingStatusCheckpointError``
      says why before anything is loaded. (The Trainer gives a callback no event before it loads:
      the name ``get_last_checkpoint`` in ``transformers.trainer``, which it calls given True, is
      wrapped for Trainers holding this callback; docs/transformers.md.)

    ``status_path``: the status file (default: ``training_status.json`` in ``args.output_dir``).
    Only the process that saves (``args.should_save``) records. Folders not recorded (left by a
    killed save, or by a run without this callback) are neither counted nor removed.
    """

    def __init__(self, status_path: str | os.PathLike[str] | None = None) -> None:
        if status_path is not None and not isinstance(status_path, (str, os.PathLike)):
            raise TrainingStatusTypeError(
                f"TrainStatusCallback status_path= must be a file path (str or os.PathLike) or None "
                f"(training_status.json in args.output_dir), not {type(status_path).__name__!r} ({status_path!r})."
            )
        self.status_path = None if status_path is None else os.path.abspath(os.fspath(status_path))
        self._checkpoints: CheckpointList | None = None
        self._taken: int | None = None  # the args.save_total_limit taken over, as given
        _route_resume()

    def checkpoints(self, args: TrainingArguments) -> CheckpointList:
        """The ``CheckpointList`` the checkpoints of ``args.output_dir`` are recorded in (opened on first use)."""
        root = os.path.abspath(_output_dir(args))
        if self._checkpoints is None or self._checkpoints.root != root:
            self._close()
            store = StatusStore(_status_path(root, self.status_path))
            self._checkpoints = CheckpointList(store, CATEGORY, keep=None, root=root)
        return self._checkpoints

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        # The Trainer's rotation (_save_checkpoint, before on_save) reads args.save_total_limit:
        # None turns it off. A second train() finds None here and keeps the limit taken before.
        if args.save_total_limit is not None:
            self._taken, args.save_total_limit = args.save_total_limit, None
        if not args.should_save:
            return
        checkpoints = self.checkpoints(args)  # a bad status file fails before training
        _drop_later(checkpoints, state.global_step, _output_dir(args))
        _check_best(checkpoints, args, state)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if not args.should_save:
            return
        checkpoints = self.checkpoints(args)
        name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not os.path.isdir(checkpoints.resolve(name)):
            raise TrainingStatusCheckpointError(
                f"TrainStatusCallback cannot record the checkpoint at step {state.global_step}: "
                f"{checkpoints.resolve(name)} is not there. The Trainer saves into args.output_dir/{name} "
                "except in a hyperparameter search (run-* folders), which this callback does not support.",
                path=checkpoints.store.path, category=CATEGORY, file_path=name,
            )
        # add() fsyncs each file, each folder and the folders above up to the status file's.
        recorded = checkpoints.add(state.global_step, name, reward=_metric(args, state))
        if self._limit is not None:
            _rotate(checkpoints, recorded, self._limit, state.best_model_checkpoint)

    @property
    def _limit(self) -> int | None:
        # What the Trainer does with the limit: none below 1.
        return self._taken if self._taken is not None and self._taken > 0 else None

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if args.should_save and self._limit == 1 and state.best_model_checkpoint is not None:
            # The Trainer's own rule at the end of training (skipped: it read None): with a limit
            # of 1, only the best checkpoint stays.
            best = os.path.abspath(state.best_model_checkpoint)
            checkpoints = self.checkpoints(args)
            _remove(checkpoints, lambda entry: checkpoints.resolve(entry["file_path"]) != best)
        if self._taken is not None and args.save_total_limit is None:
            args.save_total_limit = self._taken
        self._close()

    def _close(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.store.close()
            self._checkpoints = None

    def _resume_from(self, output_dir: str) -> str | None:
        """What ``trainer.train(resume_from_checkpoint=True)`` resumes from in a Trainer holding this
        callback: ``last_complete_checkpoint(output_dir)``, before anything is loaded (``_route_resume``).

        When that is None but there are checkpoints (recorded ones, none whole; folders never
        recorded), a ``TrainingStatusCheckpointError`` says so, where the Trainer would load the
        newest folder and fail on it. None when there is nothing at all: the Trainer's own error.
        """
        root = os.path.abspath(output_dir)
        path = _status_path(root, self.status_path)
        entry, skipped = pick(path, CATEGORY, root, whole(root))
        newer = unrecorded(root, path, CATEGORY, -1 if entry is None else entry["steps"])
        if entry is None:
            if not skipped and not newer:
                return None
            found = [f"none of the checkpoints recorded in {path} is whole ({reasons(skipped)})"] if skipped else []
            if newer:
                found.append(f"{', '.join(newer)} {'was' if len(newer) == 1 else 'were'} never recorded in {path} "
                             "(a save that did not finish, or one made without TrainStatusCallback)")
            raise TrainingStatusCheckpointError(
                f"trainer.train(resume_from_checkpoint=True) found no checkpoint to resume from in {root}: "
                f"{'; '.join(found)}. Nothing was loaded. To start a new run there, pass "
                "resume_from_checkpoint=None (it saves over these folders as it reaches their steps); to "
                "resume from a folder you know is whole, pass that folder; to keep them, train into another "
                "output_dir.",
                path=path, category=CATEGORY,
            )
        returned = os.path.join(output_dir, entry["file_path"])
        if skipped:
            warn_passed_over(returned, skipped, path, CATEGORY, root, _WORDS)
        if newer:
            warn_unrecorded(newer, root, path, CATEGORY)
        return returned


def last_complete_checkpoint(output_dir: str | os.PathLike[str], *,
                             status_path: str | os.PathLike[str] | None = None) -> str | None:
    """The newest recorded ``checkpoint-<step>`` folder of ``output_dir`` that is whole, or None.

    A drop-in for ``transformers.trainer_utils.get_last_checkpoint(output_dir)``:
    ``trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))`` (None starts
    a fresh run). Reads what ``TrainStatusCallback`` (same ``status_path``) recorded; a folder counts
    when every file recorded in it is there with its recorded size, ``trainer_state.json`` among
    them and readable as JSON, and each ``.safetensors`` file's header matches its length. Newer
    recorded folders passed over are named, with the reason, in one
    ``TrainingStatusCheckpointWarning``; so, in another, are newer ``checkpoint-*`` folders that were
    never recorded (a save a kill cut short, or one by a run without the callback), which
    ``get_last_checkpoint`` would have returned. Nothing is removed.
    """
    root = os.path.abspath(os.fspath(output_dir))
    path = _status_path(root, None if status_path is None else os.path.abspath(os.fspath(status_path)))
    entry = newest_whole(path, CATEGORY, root, whole(root), _WORDS, os.fspath(output_dir))
    newer = unrecorded(root, path, CATEGORY, -1 if entry is None else entry["steps"])
    if newer:
        warn_unrecorded(newer, root, path, CATEGORY)
    if entry is None:
        return None
    return os.path.join(os.fspath(output_dir), entry["file_path"])


# -- helpers ------------------------------------------------------------------------------------


def _status_path(root: str, status_path: str | None) -> str:
    return os.path.join(root, STATUS_FILE) if status_path is None else status_path


def _output_dir(args: TrainingArguments) -> str:
    # Typed Optional; TrainingArguments.__post_init__ sets "trainer_output" where none is given.
    return os.fspath(args.output_dir or "trainer_output")


def _metric(args: TrainingArguments, state: TrainerState) -> float | None:
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


def _greater_is_better(args: TrainingArguments) -> bool:
    if args.greater_is_better is not None:
        return bool(args.greater_is_better)
    return not str(args.metric_for_best_model or "loss").endswith("loss")  # TrainingArguments' default


def _rotate(checkpoints: CheckpointList, recorded: Mapping[str, Any], limit: int, best: str | None) -> None:
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
        _remove(checkpoints, lambda e: (e["file_path"], e.get("steps"), e.get("creation_time")) in marks)


def _remove(checkpoints: CheckpointList, stale: Callable[[Mapping[str, Any]], bool]) -> None:
    """Drop the entries ``stale`` picks in one write, then remove their folders (as ``add`` does
    with ``keep``: a kill in between leaves a folder no longer listed, never a listed one gone)."""
    dropped, document = drop(checkpoints, stale)
    if dropped:
        checkpoints._remove(dropped, document)


def _drop_later(checkpoints: CheckpointList, step: int, output_dir: str) -> None:
    """Drop the entries of steps after ``step`` (their folders stay): this run saves over them, file
    by file, and a kill in the middle must not leave them listed with some files of each run."""
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
                   f"{os.path.join(output_dir, chosen['file_path'])!r}), the newest whole one, before this run "
                   "saves over it; to start over without this warning, train into another output_dir.")
    warn(TrainingStatusCheckpointWarning(message, path=checkpoints.store.path, category=CATEGORY))


def _check_best(checkpoints: CheckpointList, args: TrainingArguments, state: TrainerState) -> None:
    """Make the resumed state's best checkpoint a recorded, whole folder, or None (module docs)."""
    by_folder = {checkpoints.resolve(e["file_path"]): e for e in checkpoints.entries()
                 if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)}
    named = state.best_model_checkpoint
    if named is None:
        # The Trainer itself forgets a best folder that is gone (_init_training_state) but keeps
        # its best_metric: no later checkpoint could become best unless it beats the lost one.
        step = getattr(state, "best_global_step", None)
        folder = None if not step else checkpoints.resolve(f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if folder is None or folder not in by_folder:
            return
    else:
        folder = os.path.abspath(named)
    why = problem(checkpoints, by_folder.get(folder), folder)
    if why is None:
        return
    candidates = [e for path, e in by_folder.items() if e.get("steps", 0) <= state.global_step
                  and isinstance(e.get("reward"), (int, float)) and not math.isnan(e["reward"])
                  and problem(checkpoints, e, path) is None]
    better = max if _greater_is_better(args) else min
    chosen = better(candidates, key=lambda e: e["reward"]) if candidates else None
    if chosen is None:
        state.best_model_checkpoint = state.best_metric = state.best_global_step = None
        instead = "None (no whole recorded checkpoint has the metric): the next evaluation becomes the best"
    else:
        state.best_model_checkpoint = os.path.join(_output_dir(args), chosen["file_path"])
        state.best_metric, state.best_global_step = chosen["reward"], chosen["steps"]
        instead = f"{state.best_model_checkpoint} ({args.metric_for_best_model} {chosen['reward']})"
    # As the Trainer spells it (args.output_dir joined), also where it had already dropped it.
    shown = named if named is not None else os.path.join(_output_dir(args), os.path.basename(folder))
    reason = f"{os.path.basename(folder)} {why}" if not why.startswith(os.path.basename(folder)) else why
    warn(TrainingStatusCheckpointWarning(
        f"The resumed trainer state's best checkpoint {shown} is not a whole checkpoint ({reason}); "
        f"best_model_checkpoint is now {instead}. Recorded in {checkpoints.store.path}.",
        path=checkpoints.store.path, category=CATEGORY,
    ))


def _route_resume() -> None:
    """Make ``trainer.train(resume_from_checkpoint=True)`` of a Trainer holding a
    ``TrainStatusCallback`` resume from ``last_complete_checkpoint`` (``_resume_from``).

    Given True, ``Trainer.train`` calls the name ``get_last_checkpoint`` of ``transformers.trainer``
    with ``args.output_dir`` and loads what it returns; no callback event comes before that load,
    so that name is the one point to act. It is replaced, once per process, by a function that
    asks the Trainer calling it for its ``TrainStatusCallback`` and calls Transformers' own
    otherwise: other Trainers, and ``transformers.trainer_utils.get_last_checkpoint``, are unchanged.
    """
    import transformers.trainer as trainer_module

    # By name: transformers.trainer imports it from trainer_utils and does not re-export it (mypy).
    own: Callable[[Any], Any] = getattr(trainer_module, "get_last_checkpoint")
    if getattr(own, "_trainstatus", False):
        return

    @functools.wraps(own)
    def get_last_checkpoint(folder: Any) -> Any:
        callback = _callback_of(sys._getframe(1))
        return own(folder) if callback is None else callback._resume_from(os.fspath(folder))

    setattr(get_last_checkpoint, "_trainstatus", True)
    setattr(trainer_module, "get_last_checkpoint", get_last_checkpoint)


def _callback_of(caller: FrameType | None) -> TrainStatusCallback | None:
    """The ``TrainStatusCallback`` of the Trainer whose method is running in ``caller``, if any."""
    owner = caller.f_locals.get("self") if caller is not None else None
    for callback in getattr(getattr(owner, "callback_handler", None), "callbacks", ()):
        if isinstance(callback, TrainStatusCallback):
            return callback
    return None
