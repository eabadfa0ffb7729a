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
  with their recorded sizes, for ``trainer.train(resume_from_checkpoint=...)``.

Usage (two lines differ from Transformers' own recipe)::

    from trainstatus.integrations.transformers import TrainStatusCallback, last_complete_checkpoint

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TrainStatusCallback()])
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

from transformers import (
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .._checkpoints.files import FILES, _faults
from .._checkpoints.checkpoint_list import CheckpointList
from .._errors import TrainingStatusCheckpointError, TrainingStatusCheckpointWarning, TrainingStatusTypeError, warn
from .._store import StatusStore
from ._common import drop, newest_whole

__all__ = ["CATEGORY", "STATUS_FILE", "TrainStatusCallback", "last_complete_checkpoint"]

STATUS_FILE = "training_status.json"
"""The status file's name in ``args.output_dir`` when no ``status_path`` is given."""

CATEGORY = "transformers"
"""The category of the status file the checkpoints are listed under (``transformers/checkpoints``)."""

TRAINER_STATE = "trainer_state.json"  # the Trainer's TRAINER_STATE_NAME: written last, read on resume

_FOLDER = re.compile(re.escape(PREFIX_CHECKPOINT_DIR) + r"-([0-9]+)")  # get_last_checkpoint's pattern, whole name


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
        _drop_later(checkpoints, state.global_step)
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
    entry = newest_whole(path, CATEGORY, root, _whole(root))
    _warn_unrecorded(root, path, -1 if entry is None else entry["steps"])
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


def _problem(checkpoints: CheckpointList, entry: Mapping[str, Any] | None, folder: str) -> str | None:
    """Why ``folder`` (with its entry, if recorded) is no whole checkpoint, or None."""
    if entry is None:
        return None if os.path.isdir(folder) else "is missing"
    for _, _, why in _faults(entry, checkpoints.root):
        return why
    try:
        _whole(checkpoints.resolve(os.curdir))(dict(entry))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:  # a header of the wrong shape too
        return str(exc)
    return None


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


def _drop_later(checkpoints: CheckpointList, step: int) -> None:
    """Drop the entries of steps after ``step`` (their folders stay): this run saves over them, file
    by file, and a kill in the middle must not leave them listed with some files of each run."""
    later = [e for e in checkpoints.entries() if isinstance(e, Mapping) and type(e.get("steps")) is int
             and e["steps"] > step]
    if not later:
        return
    drop(checkpoints, lambda e: type(e.get("steps")) is int and e["steps"] > step)
    if step == 0:
        newest = max(e["steps"] for e in later)
        warn(TrainingStatusCheckpointWarning(
            f"{CATEGORY}/checkpoints in {checkpoints.store.path} has checkpoints up to step {newest}, but "
            "this run starts at step 0: it saves over their folders, so they are no longer listed. To "
            "continue a run, pass trainer.train(resume_from_checkpoint=last_complete_checkpoint(output_dir)); "
            "to start over, use another output_dir.",
            path=checkpoints.store.path, category=CATEGORY,
        ))


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
    problem = _problem(checkpoints, by_folder.get(folder), folder)
    if problem is None:
        return
    candidates = [e for path, e in by_folder.items() if e.get("steps", 0) <= state.global_step
                  and isinstance(e.get("reward"), (int, float)) and not math.isnan(e["reward"])
                  and _problem(checkpoints, e, path) is None]
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
    reason = f"{os.path.basename(folder)} {problem}" if not problem.startswith(os.path.basename(folder)) else problem
    warn(TrainingStatusCheckpointWarning(
        f"The resumed trainer state's best checkpoint {shown} is not a whole checkpoint ({reason}); "
        f"best_model_checkpoint is now {instead}. Recorded in {checkpoints.store.path}.",
        path=checkpoints.store.path, category=CATEGORY,
    ))


def _warn_unrecorded(root: str, status_path: str, chosen: int) -> None:
    """Warn naming the ``checkpoint-*`` folders newer than step ``chosen`` that nothing recorded."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    folders = {int(m.group(1)): name for name in names if (m := _FOLDER.fullmatch(name))
               and int(m.group(1)) > chosen and os.path.isdir(os.path.join(root, name))}
    if not folders:
        return
    recorded: set[str] = set()
    if os.path.exists(status_path):
        with StatusStore(status_path) as store:
            entries = store.get(CATEGORY, "checkpoints") or []
        recorded = {os.path.abspath(os.path.join(root, e["file_path"])) for e in entries
                    if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)}
    unrecorded = [name for _, name in sorted(folders.items()) if os.path.join(root, name) not in recorded]
    if unrecorded:
        warn(TrainingStatusCheckpointWarning(
            f"Passed over {', '.join(unrecorded)} in {root}: not recorded in {status_path} (a save that "
            "did not finish, or one made without TrainStatusCallback); get_last_checkpoint() would "
            "return the newest of them. Left on disk: a resumed run saves over them.",
            path=status_path, category=CATEGORY,
        ))


def _whole(root: str) -> Callable[[dict[str, Any]], bool]:
    """The check of a recorded folder beyond its files' sizes (which ``latest`` checks)."""

    def check(entry: dict[str, Any]) -> bool:
        folder = entry["file_path"]
        files: Mapping[str, Any] = entry[FILES] if isinstance(entry.get(FILES), Mapping) else {}
        state = os.path.join(folder, TRAINER_STATE)
        if state not in files:
            raise ValueError(f"{folder} has no {TRAINER_STATE} recorded: not a Trainer checkpoint")
        with open(os.path.join(root, state), "rb") as f:
            json.load(f)
        for name in files:
            if name.endswith(".safetensors"):
                _check_safetensors(os.path.join(root, name), name)
        return True

    return check


def _check_safetensors(path: str, name: str) -> None:
    """Raise ValueError unless the file's header (8-byte length, then JSON) accounts for its length."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{name} is too short for a safetensors header")
        (length,) = struct.unpack("<Q", head)
        size = os.fstat(f.fileno()).st_size
        if length > size - 8:
            raise ValueError(f"{name}: its header claims {length:,} bytes, the file has {size:,}")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise ValueError(f"{name}: its header is not JSON ({exc})") from None
    ends = [t["data_offsets"][1] for key, t in header.items() if key != "__metadata__"]
    if 8 + length + max(ends, default=0) != size:
        raise ValueError(f"{name}: its tensors end at byte {8 + length + max(ends, default=0):,}, the file has {size:,}")
