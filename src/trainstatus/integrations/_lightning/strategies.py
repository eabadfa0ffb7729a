"""Lightning's strategies, as ``TrainStatusCallback`` sees them at set-up: which save through
``CheckpointIO``, which save sharded folders past it (recorded here), which cannot be recorded
(refused), and whether every rank resumes from the same checkpoint.

How each saves, read in Lightning 2.6.6's source (``lightning/pytorch/strategies/``):
``Trainer.save_checkpoint`` calls ``strategy.save_checkpoint(checkpoint, filepath)`` on every rank,
then ``strategy.barrier()``.

- ``Strategy.save_checkpoint`` (DDP, single device; XLA after its ``mark_step``): global rank 0
  hands the checkpoint to ``checkpoint_io``, which ``TrainStatusCheckpointIO`` records.
- ``FSDPStrategy(state_dict_type="sharded")`` and ``ModelParallelStrategy(save_distributed_checkpoint=True)``:
  ``filepath`` becomes a folder; every rank calls ``torch.distributed.checkpoint.save`` into it
  (its own ``__<rank>_0.distcp``, then ``.metadata`` by the coordinator; the call returns on every
  rank once ``.metadata`` is written), then rank 0 alone writes ``meta.pt`` (the trainer state)
  with ``torch.save``. ``CheckpointIO`` is not called. A folder saved again (``last.ckpt``) is
  written over in place, file by file. With ``state_dict_type="full"`` or
  ``save_distributed_checkpoint=False`` they save one file through ``CheckpointIO`` instead.
- ``DeepSpeedStrategy``: ``filepath`` becomes a folder; every rank calls DeepSpeed's
  ``engine.save_checkpoint(filepath, tag="checkpoint")``: each rank ``torch.save``s its ZeRO shard
  into ``filepath/checkpoint/``, data-parallel rank 0 the module's states, then rank 0 writes
  ``filepath/latest`` (naming ``checkpoint``) and copies DeepSpeed's ``zero_to_fp32.py``; the call
  ends with DeepSpeed's own barrier. ``CheckpointIO`` is not called. ``last.ckpt`` is saved over in
  place. Its load (``DeepSpeedStrategy.load_checkpoint``) reads ``latest`` for the tag. Nothing in
  the folder says when it is whole: that is read from the file names (``_formats.deepspeed_tags``:
  every rank's shard, the module's states) once every rank's save has returned.

Removing an old top-k checkpoint goes through ``checkpoint_io.remove_checkpoint`` on rank 0 for
every strategy, folders included: the plugin drops the entry first, then the folder goes.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import lightning.pytorch.strategies as pl_strategies
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, Strategy
from lightning.pytorch.strategies.xla import XLAStrategy
from lightning.pytorch.trainer.states import TrainerFn

from ..._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointNotShared,
    TrainingStatusCheckpointWarning,
    TrainingStatusTypeError,
)
from .._formats import deepspeed_tags
from .._formats.dcp_metadata import METADATA
from .._ranks.collectives import from_rank_0, gather, group
from .._ranks.hosts import ranks
from .._ranks.resuming import decide
from .._ranks.saving import entry_fields, record
from .._shared.upkeep import drop
from .common import deepspeed_problem, local, score, status_path

__all__ = ["DEEPSPEED", "IO", "SHARDED", "Resumed", "agree", "how_it_saves", "remote_refusal", "record_sharded_saves",
           "refuse_reshard_at_load", "timeout_of"]

IO = "CheckpointIO"
SHARDED = "sharded"
DEEPSPEED = "deepspeed"

_MODEL_PARALLEL: Any = getattr(pl_strategies, "ModelParallelStrategy", None)  # Lightning >= 2.4


def remote_refusal(strategy: Strategy, how: str) -> str | None:
    """Why ``strategy``'s checkpoints cannot be recorded in a remote ``dirpath``, or None."""
    kind = type(strategy).__name__
    if how != IO:
        return (f"{kind} saves each checkpoint as a folder every rank writes into, past TrainStatusCheckpointIO, which "
                "trainstatus records on a local or shared filesystem only")
    if type(strategy).save_checkpoint is not Strategy.save_checkpoint:
        # FSDPStrategy (full state dict), ModelParallelStrategy(save_distributed_checkpoint=False)
        return (f"{kind} hands CheckpointIO the path as a pathlib.Path, which makes s3://bucket/x.ckpt the local "
                "path s3:/bucket/x.ckpt: the checkpoints would be written on this machine's disk")
    return None


def how_it_saves(strategy: Strategy, sharded: bool | None) -> str:
    """``IO``, ``SHARDED`` or ``DEEPSPEED`` (module docstring), or a ``TrainingStatusTypeError`` for a strategy
    whose saves cannot be recorded. ``sharded``: the user's answer for a strategy whose class
    overrides ``save_checkpoint`` and is none of Lightning's (Lightning's own are known, whatever
    ``sharded`` says)."""
    kind = type(strategy).__name__
    if isinstance(strategy, DeepSpeedStrategy):
        if type(strategy).save_checkpoint is DeepSpeedStrategy.save_checkpoint:
            return DEEPSPEED
        raise TrainingStatusTypeError(
            f"TrainStatusCallback does not know how {kind} saves: it overrides DeepSpeedStrategy.save_checkpoint, "
            "whose saves (DeepSpeed's engine, every rank, a tag folder named 'checkpoint') are the ones trainstatus "
            "records. Keep DeepSpeedStrategy's save_checkpoint, or leave TrainStatusCallback and "
            "TrainStatusCheckpointIO out. Nothing was recorded."
        )
    saver = type(strategy).save_checkpoint
    if saver in (Strategy.save_checkpoint, XLAStrategy.save_checkpoint):
        return IO
    if saver is FSDPStrategy.save_checkpoint:
        return SHARDED if getattr(strategy, "_state_dict_type", None) == "sharded" else IO
    if _MODEL_PARALLEL is not None and saver is _MODEL_PARALLEL.save_checkpoint:
        return SHARDED if getattr(strategy, "_save_distributed_checkpoint", True) else IO
    if sharded is not None:  # a strategy of the user's, as the user says it saves
        return SHARDED if sharded else IO
    raise TrainingStatusTypeError(
        f"TrainStatusCallback does not know how {kind} saves: its class overrides save_checkpoint, and it is "
        "not one of Lightning's strategies whose saves trainstatus records. Say how: TrainStatusCallback("
        "sharded=True) if every rank saves a torch.distributed.checkpoint folder at the path it is given "
        "(as FSDPStrategy(state_dict_type='sharded') does), sharded=False if global rank 0 saves through "
        "the strategy's checkpoint_io (as Strategy.save_checkpoint does). Nothing was recorded."
    )


def timeout_of(strategy: Strategy) -> float | None:
    """The strategy's own process-group timeout (``DDPStrategy(timeout=...)``), in seconds, or None."""
    given = getattr(strategy, "_timeout", None)
    seconds = getattr(given, "total_seconds", None)
    return float(seconds()) if callable(seconds) else None


def record_sharded_saves(strategy: Strategy, plugin: Any, timeout: float | None,
                         how: str = SHARDED) -> Callable[[], None]:
    """Wrap ``strategy.save_checkpoint`` (on this instance) so that each sharded save (``how``:
    ``SHARDED`` or ``DEEPSPEED``) is recorded once every rank's files are durable; return what
    unwraps it.

    ``plugin`` is the strategy's ``TrainStatusCheckpointIO``: its lists and ``status_path``. Every
    rank runs the wrapper, as Lightning calls the save on every rank:

    1. A folder about to be saved over (``last.ckpt``) is first dropped from the list, by rank 0,
       and no rank begins the save before that write (``_ranks.resuming.decide``): a folder half
       written over is never found listed (same-size shards would pass a size check).
    2. The strategy saves (``dcp.save`` on every rank, then ``meta.pt`` on rank 0; or DeepSpeed's
       engine on every rank).
    3. ``_ranks.saving.record``: every rank waits for every rank's save to have returned, one rank
       per host fsyncs the files, and rank 0 records the folder (every file with its size) once it sees every
       rank's files, only if the folder is whole by its names: ``.metadata`` is there (DCP), or
       every rank's ZeRO shard, the module's states and ``latest`` (DeepSpeed).
    """
    original = strategy.save_checkpoint

    def save_checkpoint(checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        if how == DEEPSPEED:  # what would fail in the save, refused before anything is unlisted
            if storage_options is not None:
                raise TypeError(f"`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg is "
                                f"not supported for `{type(strategy).__name__}` as `CheckpointIO` is not used.")
            kind = deepspeed_tags.decoupled(getattr(strategy, "deepspeed_engine", None))
            if kind is not None:
                raise TrainingStatusTypeError(
                    f"TrainStatusCallback cannot record the saves of {type(strategy).__name__}: its DeepSpeed "
                    f"checkpoint engine ({kind}) is decoupled, it writes the files after the save returns, so nothing "
                    "is whole to record then. Use DeepSpeed's default torch checkpoint engine with trainstatus. "
                    "Nothing was saved.")
        target = local(strategy.broadcast(filepath), "save")  # rank 0's path, as the strategy saves to it
        folder, name = os.path.split(target)
        steps = checkpoint.get("global_step", 0)
        steps = steps if type(steps) is int else 0
        reward = score(checkpoint, folder)  # before the save: it pops the state out of the dict
        what = f"{name} of {folder} (step {steps})"
        decide(lambda: _unlist(plugin.checkpoints(folder), target), lambda _: {}, folder,
                           what=f"the entry of {what} to drop before it is saved over", timeout=timeout)
        original(checkpoint, filepath, storage_options=storage_options)

        def write(synced: bool) -> dict[str, Any]:
            if how == DEEPSPEED:
                why = deepspeed_problem(target)
                if why is not None:
                    raise TrainingStatusCheckpointError(
                        f"Cannot record {what}: DeepSpeed's save returned on every rank, but {why}. Nothing was "
                        "recorded; the checkpoints recorded before stay the ones a resume finds.",
                        path=status_path(folder, plugin.status_path), file_path=name,
                    )
            elif not os.path.isfile(os.path.join(target, METADATA)):
                raise TrainingStatusCheckpointError(
                    f"Cannot record {what}: {type(strategy).__name__} saved it past CheckpointIO, and it is not a "
                    f"torch.distributed.checkpoint folder ({METADATA}, which DCP writes last, is not in it), so "
                    "nothing says it is whole. Nothing was recorded. If this strategy saves one file through its "
                    "checkpoint_io, use TrainStatusCallback(sharded=False).",
                    path=status_path(folder, plugin.status_path), file_path=name,
                )
            recorded: dict[str, Any] = plugin.checkpoints(folder)._add(steps, name, reward=reward, synced=synced,
                                                                       fields=entry_fields())
            return recorded

        record(target, status_path(folder, plugin.status_path), write, what=what, timeout=timeout)

    strategy.save_checkpoint = save_checkpoint  # type: ignore[method-assign, unused-ignore]

    def undo() -> None:
        if vars(strategy).get("save_checkpoint") is save_checkpoint:
            del strategy.save_checkpoint
    return undo


def _unlist(checkpoints: Any, target: str) -> None:
    drop(checkpoints, lambda entry: checkpoints.resolve(entry["file_path"]) == target)


def refuse_reshard_at_load(strategy: Strategy, plugin: Any, timeout: float | None) -> Callable[[], None]:
    """Wrap ``strategy.load_checkpoint`` (``DeepSpeedStrategy``, on this instance) so that a
    checkpoint recorded as saved by another number of ranks is refused before DeepSpeed loads it
    (``deepspeed_tags.refusal``: DeepSpeed raises ``ZeRORuntimeException`` partway through); return
    what unwraps it. Here, not at set-up: the load is handed the path Lightning really loads
    (``last_complete_checkpoint``'s answer, ``ckpt_path="last"``, a path of the user's), for every
    stage (``validate`` too: it loads the weights, which ZeRO-3 partitions). Every rank calls it,
    as Lightning does; rank 0 reads the entry and every rank raises alike. A checkpoint nothing
    recorded is left to DeepSpeed."""
    original = strategy.load_checkpoint

    def load_checkpoint(checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        given = os.fspath(checkpoint_path)
        # DeepSpeedStrategy loads the optimizer's state when fitting only (its load_optimizer_states)
        module = strategy.lightning_module
        optimizer = module is not None and module.trainer.state.fn == TrainerFn.FITTING

        def check() -> None:
            if not isinstance(given, str) or "://" in given:
                return
            target = os.path.abspath(given)
            folder = os.path.dirname(target)
            path = status_path(folder, plugin.status_path)
            if not os.path.isfile(path):
                return
            checkpoints = plugin.checkpoints(folder)
            entry = next((e for e in reversed(checkpoints.entries()) if isinstance(e, dict)
                          and isinstance(e.get("file_path"), str) and checkpoints.resolve(e["file_path"]) == target),
                         None)
            world = int(getattr(strategy, "world_size", 1))  # a ParallelStrategy's
            if entry is None:
                return
            why = deepspeed_tags.refusal(entry, given, world, optimizer=optimizer)
            if why is not None:
                raise TrainingStatusCheckpointError(f"Cannot resume from {given}: {why}. Nothing was loaded.",
                                                    path=path, file_path=entry["file_path"])

        me = ranks()
        if me is None:
            check()
        else:
            doing = "checking the world size of the checkpoint to load"
            from_rank_0(check, me, group(timeout, doing), doing)
        return original(checkpoint_path, *args, **kwargs)

    strategy.load_checkpoint = load_checkpoint  # type: ignore[method-assign, unused-ignore]

    def undo() -> None:
        if vars(strategy).get("load_checkpoint") is load_checkpoint:
            del strategy.load_checkpoint
    return undo


class Resumed(NamedTuple):
    """What ``last_complete_checkpoint`` answered in this process: its folder and status file
    (absolute), the checkpoint's name in the folder (``file_path`` of its entry) or None, and
    whether that answer was decided by every rank together."""

    folder: str
    status_path: str | None
    name: str | None
    collective: bool


def agree(resumed: Resumed | None, again: Callable[[Resumed, str], str | None], timeout: float | None) -> None:
    """Under a process group: check that every rank resumes from the checkpoint rank 0 resumes from.

    Lightning starts its process group inside ``trainer.fit``, after the user's
    ``last_complete_checkpoint`` ran in each rank alone. Here (set-up, before anything is restored)
    the ranks exchange what they were answered; when rank 0's answer was not already one decision,
    ``again(resumed, shown)`` takes it together (rank 0 reads; every rank checks it sees the chosen
    files in its own folder, ``TrainingStatusCheckpointNotShared`` on every rank if not; ``shown``,
    rank 0's folder, names the checkpoint alike in every rank's message) and returns the name chosen;
    a rank that was answered another name (or None) makes every rank raise the same
    ``TrainingStatusCheckpointNotShared``. Names are compared, not paths: a share may be mounted at
    other paths on other nodes.
    """
    me = ranks()
    if me is None:
        return
    doing = "checking the resume"
    link = group(timeout, doing)
    answers = gather((me.host, resumed), link, me, doing)
    first: Resumed | None = from_rank_0(lambda: answers[0][1] if answers else None, me, link, doing)
    if first is None or first.collective:
        return  # rank 0 resumed from a path of its own, or from a decision every rank took part in
    with warnings.catch_warnings():  # rank 0 warned about what it passed over when it first read
        warnings.simplefilter("ignore", TrainingStatusCheckpointWarning)
        chosen = again(resumed if resumed is not None else first, first.folder)  # the same on every rank

    def verdict() -> None:
        assert answers is not None
        differ = [(rank, host, given.name) for rank, (host, given) in enumerate(answers)
                  if given is not None and given.name != chosen]
        if differ:
            listed = ", ".join(f"rank {rank} on {host} with {_named(name)}" for rank, host, name in differ)
            raise TrainingStatusCheckpointNotShared(
                f"Not every rank resumes from the same checkpoint: rank 0 resumes from {_named(chosen)} of "
                f"{first.folder}, but last_complete_checkpoint() answered {listed}, having read another status "
                "file or folder. No rank resumes. Every rank must see the same checkpoint folder and status file (a "
                "shared filesystem mounted on every node): give every rank the same dirpath and status_path.",
                ranks=[rank for rank, _, _ in differ], hosts=sorted({host for _, host, _ in differ}),
                path=first.status_path,
            )

    from_rank_0(verdict, me, link, doing)


def _named(name: str | None) -> str:
    return "nothing" if name is None else repr(name)
