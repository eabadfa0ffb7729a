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
- Under ``torchrun``, ``accelerate launch`` or any launcher whose processes form a
  ``torch.distributed`` process group, the record and the resume decision are collectives
  (``_ranks``): every rank's files of a save (RNG states, shards) are durable before rank 0
  records the folder, and every rank resumes from the folder rank 0 chose, or raises the same error.

Usage (two lines differ from Transformers' own recipe)::

    from trainstatus.integrations.transformers import TrainStatusCallback, last_complete_checkpoint

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TrainStatusCallback()])
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
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
from .._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusError,
    TrainingStatusTypeError,
    warn,
)
from .._store import StatusStore
from ._ranks import hosts as _hosts
from ._ranks import resuming as _resuming
from ._ranks import saving as _saving
from ._shared import lease as _lease
from ._shared.choice import Words, newest_whole, pick, reasons, warn_passed_over
from ._transformers.folders import (
    note_world_size,
    output_folder,
    refuse_reshard,
    refuse_status_inside,
    unrecorded,
    warn_unrecorded,
    whole,
)
from ._transformers.upkeep import Best, best_fix, drop_later, metric, remove, rotate
from ._transformers.upkeep import output_dir as _output_dir

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
    Folders not recorded (left by a killed save, or by a run without this callback) are neither
    counted nor removed.

    Several processes (``torchrun``, ``accelerate launch``, the DeepSpeed launcher: a
    ``torch.distributed`` process group): every rank takes part in ``on_save``, which waits until
    every rank's save returned and its files are fsynced, then rank 0 alone records the folder,
    with every rank's files (``rng_state_<rank>.pth``, shards), and every rank goes on only once
    the record is on disk (within ``args.ddp_timeout``, else ``TrainingStatusCollectiveError`` names
    the ranks that did not answer). Rank 0 alone reads and writes the list (start of training,
    rotation); every rank gets the same best checkpoint and resumes from the same folder. A rank
    other than 0 that saves too (``save_on_each_node`` over several nodes) records nothing: the one
    record needs one folder every rank sees, and node-local folders make every rank raise
    ``TrainingStatusCheckpointNotShared`` at the first save. Without a process group, the process
    that saves (``args.should_save``) records.
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
            if self._checkpoints is not None:  # another output_dir: the job of the old one has ended
                _lease.release(self._checkpoints.store.path)
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
        me = _hosts.ranks()
        if me is not None and int(args.world_size) != me.world_size:
            # The same on every rank (each counts itself alone): raised before any collective.
            raise TrainingStatusError(
                f"TrainStatusCallback on rank {me.rank}: the Trainer counts {args.world_size} process(es) "
                f"(TrainingArguments.world_size), but torch.distributed has {me.world_size} ranks. Every rank would "
                "save as the main process, all into the same checkpoint folder (trainer_state.json, the model, "
                "rng_state.pth), and a resume would load a mix. On CPU under torchrun pass use_cpu=True to "
                "TrainingArguments (with deepspeed= too: Accelerate otherwise sees one process a rank); else launch "
                "with accelerate launch or the deepspeed launcher. Nothing was trained.",
                path=_status_path(os.path.abspath(_output_dir(args)), self.status_path),
            )
        root = os.path.abspath(_output_dir(args))
        refuse_status_inside(root, _status_path(root, self.status_path), "TrainStatusCallback")  # every rank alike
        if me is None and not args.should_save:
            return
        # Under a process group rank 0 alone reads and writes the list; every rank takes its best
        # checkpoint, and its error (a damaged status file) stops every rank, not rank 0 alone.
        fix = _resuming.decide(lambda: self._begin(args, state), lambda _: {}, root,
                                 what=f"the checkpoints recorded for {root} at step {state.global_step}",
                                 timeout=_timeout(args))
        if fix is not None:
            state.best_model_checkpoint, state.best_metric, state.best_global_step = fix

    def _begin(self, args: TrainingArguments, state: TrainerState) -> Best | None:
        # One job per status file, from here to on_train_end: a second one stops before it trains.
        _lease.take(_status_path(os.path.abspath(_output_dir(args)), self.status_path), "TrainStatusCallback",
                    run=getattr(args, "run_name", None))
        checkpoints = self.checkpoints(args)  # a bad status file fails before training
        drop_later(checkpoints, state.global_step, _output_dir(args))
        return best_fix(checkpoints, args, state)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        me = _hosts.ranks()
        if me is None and not args.should_save:
            return
        root = os.path.abspath(_output_dir(args))
        name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        # Under a process group: once every rank's save returned and its files are fsynced, rank 0
        # records; every rank waits for the record (no rank's next save, and no rotation, before it).
        recorded = _saving.record(os.path.join(root, name), _status_path(root, self.status_path),
                                      lambda synced: self._record(args, state, name, synced),
                                      what=f"{name} of {root}", timeout=_timeout(args))
        if self._limit is not None and (me is None or me.rank == 0):
            rotate(self.checkpoints(args), recorded, self._limit, state.best_model_checkpoint)

    def _record(self, args: TrainingArguments, state: TrainerState, name: str, synced: bool) -> dict[str, Any]:
        checkpoints = self.checkpoints(args)
        if not os.path.isdir(checkpoints.resolve(name)):
            raise TrainingStatusCheckpointError(
                f"TrainStatusCallback cannot record the checkpoint at step {state.global_step}: "
                f"{checkpoints.resolve(name)} is not there. The Trainer saves into args.output_dir/{name} "
                "except in a hyperparameter search (run-* folders), which this callback does not support.",
                path=checkpoints.store.path, category=CATEGORY, file_path=name,
            )
        # add() fsyncs each file, each folder and the folders above up to the status file's, unless
        # every rank did already (synced: _saving.record, which also has world_size kept).
        return checkpoints._add(state.global_step, name, reward=metric(args, state), synced=synced,
                                fields=_saving.entry_fields())

    @property
    def _limit(self) -> int | None:
        # What the Trainer does with the limit: none below 1.
        return self._taken if self._taken is not None and self._taken > 0 else None

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        me = _hosts.ranks()
        writer = args.should_save if me is None else me.rank == 0
        if writer and self._limit == 1 and state.best_model_checkpoint is not None:
            # The Trainer's own rule at the end of training (skipped: it read None): with a limit
            # of 1, only the best checkpoint stays.
            best = os.path.abspath(state.best_model_checkpoint)
            checkpoints = self.checkpoints(args)
            remove(checkpoints, lambda entry: checkpoints.resolve(entry["file_path"]) != best)
        if self._taken is not None and args.save_total_limit is None:
            args.save_total_limit = self._taken
        if writer:
            _lease.release(_status_path(os.path.abspath(_output_dir(args)), self.status_path))
        self._close()

    def _close(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.store.close()
            self._checkpoints = None

    def _resume_from(self, folder: str, timeout: float | None = None) -> str | None:
        """What ``trainer.train(resume_from_checkpoint=True)`` resumes from in a Trainer holding this
        callback: ``last_complete_checkpoint(folder)``, before anything is loaded (``_route_resume``).

        When that is None but there are checkpoints (recorded ones, none whole; folders never
        recorded), a ``TrainingStatusCheckpointError`` says so, where the Trainer would load the
        newest folder and fail on it. None when there is nothing at all: the Trainer's own error.
        Under a process group rank 0 decides, and every rank gets its folder or its error.
        """
        root = os.path.abspath(folder)
        path = _status_path(root, self.status_path)

        def choose() -> dict[str, Any] | None:
            entry, skipped = pick(path, CATEGORY, root, whole(root))
            newer = unrecorded(root, path, CATEGORY, -1 if entry is None else entry["steps"])
            if entry is None:
                if not skipped and not newer:
                    return None
                found = [f"none of the checkpoints recorded in {path} is whole ({reasons(skipped)})"] if skipped else []
                if newer:
                    found.append(f"{', '.join(newer)} {'was' if len(newer) == 1 else 'were'} never recorded in "
                                 f"{path} (a save that did not finish, or one made without TrainStatusCallback)")
                raise TrainingStatusCheckpointError(
                    f"trainer.train(resume_from_checkpoint=True) found no checkpoint to resume from in {root}: "
                    f"{'; '.join(found)}. Nothing was loaded. To start a new run there, pass "
                    "resume_from_checkpoint=None (it saves over these folders as it reaches their steps); to "
                    "resume from a folder you know is whole, pass that folder; to keep them, train into another "
                    "output_dir.",
                    path=path, category=CATEGORY,
                )
            shown = os.path.join(folder, entry["file_path"])
            me = _hosts.ranks()
            refuse_reshard(entry, shown, path, CATEGORY, 1 if me is None else me.world_size)
            if skipped:
                warn_passed_over(shown, skipped, path, CATEGORY, root, _WORDS)
            if newer:
                warn_unrecorded(newer, root, path, CATEGORY)
            note_world_size(entry, shown, path, CATEGORY, 1 if me is None else me.world_size)
            return entry

        entry = _decide(choose, root, timeout)
        return None if entry is None else os.path.join(folder, entry["file_path"])


def last_complete_checkpoint(output_dir: str | os.PathLike[str], *,
                             status_path: str | os.PathLike[str] | None = None,
                             timeout: float | None = None) -> str | None:
    """The newest recorded ``checkpoint-<step>`` folder of ``output_dir`` that is whole, or None.

    A drop-in for ``transformers.trainer_utils.get_last_checkpoint(output_dir)``:
    ``trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))`` (None starts
    a fresh run). Reads what ``TrainStatusCallback`` (same ``status_path``) recorded; a folder counts
    when every file recorded in it is there with its recorded size, ``trainer_state.json`` among
    them and readable as JSON, each ``.safetensors`` file's header matches its length, and each
    file ``torch.save`` wrote (``.pt``, ``.pth``, ``.bin``) has its zip directory: metadata only, no
    weights are read. Newer recorded folders passed over are named, with the reason, in one
    ``TrainingStatusCheckpointWarning``; so, in another, are newer ``checkpoint-*`` folders that were
    never recorded (a save a kill cut short, or one by a run without the callback), which
    ``get_last_checkpoint`` would have returned. Nothing is removed.

    Under a ``torch.distributed`` process group (made by ``TrainingArguments`` under ``torchrun`` or
    ``accelerate launch``), call it on every rank: rank 0 alone reads the status file and the
    folders' metadata and chooses, every rank gets the same folder (or None, or the same error), and
    if a rank does not see the chosen folder's files with their recorded sizes, every rank raises
    ``TrainingStatusCheckpointNotShared``. ``timeout``: seconds to wait for every rank (default:
    torch's 1800; ``TrainingStatusCollectiveError`` after it).
    """
    root = output_folder(output_dir)
    path = _status_path(root, None if status_path is None else os.path.abspath(os.fspath(status_path)))
    refuse_status_inside(root, path, f"last_complete_checkpoint({os.fspath(output_dir)!r})")
    _warn_alone(root, path)

    def choose() -> dict[str, Any] | None:
        entry = newest_whole(path, CATEGORY, root, whole(root), _WORDS, os.fspath(output_dir))
        newer = unrecorded(root, path, CATEGORY, -1 if entry is None else entry["steps"])
        if newer:
            warn_unrecorded(newer, root, path, CATEGORY)
        if entry is not None:
            me = _hosts.ranks()
            shown = os.path.join(os.fspath(output_dir), entry["file_path"])
            refuse_reshard(entry, shown, path, CATEGORY, 1 if me is None else me.world_size)
            note_world_size(entry, shown, path, CATEGORY, 1 if me is None else me.world_size)
        return entry

    entry = _decide(choose, root, timeout)
    return None if entry is None else os.path.join(os.fspath(output_dir), entry["file_path"])


# -- helpers ------------------------------------------------------------------------------------


def _status_path(root: str, status_path: str | None) -> str:
    return os.path.join(root, STATUS_FILE) if status_path is None else status_path


def _timeout(args: Any) -> float | None:
    """How long the collectives wait for every rank: the Trainer's own ``ddp_timeout``."""
    seconds = getattr(args, "ddp_timeout", None)
    return None if seconds is None else float(seconds)


def _decide(choose: Callable[[], dict[str, Any] | None], root: str, timeout: float | None) -> dict[str, Any] | None:
    """``choose()`` on rank 0, the same entry on every rank, each rank seeing its files (``_resuming.decide``)."""
    return _resuming.decide(choose, _resuming.entry_files, root, what=f"the newest whole checkpoint of {root}",
                              timeout=timeout)


def _warn_alone(root: str, status_path: str) -> None:
    """Warn when this process is one of several a launcher started but has no process group yet:
    it chooses alone, and another rank may choose another folder."""
    world = os.environ.get("WORLD_SIZE", "")
    if world.isdigit() and int(world) > 1 and _hosts.ranks() is None:
        warn(TrainingStatusCheckpointWarning(
            f"last_complete_checkpoint({root!r}) ran in one of {world} processes (WORLD_SIZE={world}) before "
            "this one joined their torch.distributed process group: it chose alone, and the ranks may resume "
            "from different checkpoints. Call it after TrainingArguments(...) is made (that joins the group), "
            "as in trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir)), or pass "
            "resume_from_checkpoint=True to a Trainer holding TrainStatusCallback.",
            path=status_path, category=CATEGORY,
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
        caller = sys._getframe(1)
        callback = _callback_of(caller)
        if callback is None:
            return own(folder)
        return callback._resume_from(os.fspath(folder), _timeout(getattr(caller.f_locals.get("self"), "args", None)))

    setattr(get_last_checkpoint, "_trainstatus", True)
    setattr(trainer_module, "get_last_checkpoint", get_last_checkpoint)


def _callback_of(caller: FrameType | None) -> TrainStatusCallback | None:
    """The ``TrainStatusCallback`` of the Trainer whose method is running in ``caller``, if any."""
    owner = caller.f_locals.get("self") if caller is not None else None
    for callback in getattr(getattr(owner, "callback_handler", None), "callbacks", ()):
        if isinstance(callback, TrainStatusCallback):
            return callback
    return None
