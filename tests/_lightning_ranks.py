"""Lightning on several processes for tests/test_integration_lightning_ranks.py, run by .venv-torch's interpreter.

    torchrun --standalone --nproc_per_node=2 _lightning_ranks.py '<json options>'
    python _lightning_ranks.py serve

The first form is one run, started by torchrun as a user would. The second is tests/_forkserver.py's
fork server, torch and Lightning imported once: it forks each run's workers with the environment
torchrun gives its workers, so that each of the kill test's twenty-odd runs starts in about a
second. The workers run the same code either way, Lightning's own DDP or ModelParallel strategy on
its own gloo process group.

A worker trains a tiny LightningModule on random tensors on the CPU with ``ModelCheckpoint(dirpath=dir,
monitor="step", mode="max", save_top_k=top_k, every_n_train_steps=every, save_last=True)``,
``TrainStatusCheckpointIO`` and ``TrainStatusCallback``, resuming with
``trainer.fit(ckpt_path=last_complete_checkpoint(dir))`` up to ``max_steps``. Options:

- ``strategy``: ``"ddp"`` (``DDPStrategy``), ``"model_parallel"`` (``ModelParallelStrategy``, its
  sharded saves: FSDP2's ``fully_shard`` on CPU), or ``"dcp_ddp"`` (``DCPStrategy`` below: DDP
  whose saves are DCP folders written without ``CheckpointIO``, each rank adding a file of its
  own; ``TrainStatusCallback(sharded=True)``); ``slow``: that rank writes its own file half, then
  the rest 2 s later, at every save.
- ``theirs`` (a folder): a second ``ModelCheckpoint`` with the same settings saves there at the same
  moments past trainstatus (Lightning's ``TorchCheckpointIO``, or the strategy's own sharded
  save); before training rank 0 checks whether what ``ckpt_path="last"`` would load (the newest
  ``last*.ckpt``) can be loaded: a file loads with ``torch.load``; a sharded folder must have
  ``.metadata``, every chunk it names inside its files, a ``meta.pt`` that loads, and no file
  written after ``.metadata`` nor ``meta.pt`` written before it (a folder half saved over loads as
  a mix of two saves).
- ``init_first``: initialize the process group before ``last_complete_checkpoint`` (Lightning
  then takes it as it is): the call is one decision for every rank.
- ``cwd`` (one folder per rank): each rank works there, with ``dir`` relative: what node-local
  folders look like (the same path, other files).
- ``callback``: False leaves ``TrainStatusCallback`` out; ``timeout``: the strategy's, in seconds.
- ``refusals`` (cases): rank 0 alone, without a process group, builds a Trainer that
  ``TrainStatusCallback`` must refuse at set-up for each case (``deepspeed``: a ``DeepSpeedStrategy``
  overriding ``save_checkpoint``, ``own``: any other strategy doing so, ``no-plugin``) and prints ``refused`` (case, type, message).

Each worker prints one JSON object a line, flushed, with ``rank``: ``resumed`` (path, warnings),
``theirs`` (rank 0: path, ok, error), ``ready`` (the global step Lightning restored), both with
``reads`` (how many times this process has read the status file to decide so far),
``save-begin``/``save-end`` (path, step), ``error`` (type, message, ranks), ``done`` (step).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import warnings
from typing import Any

import _forkserver
from _forkserver import announce, leave_once, say

def theirs_ok(path: str) -> tuple[bool, str | None]:
    """Whether ``trainer.fit(ckpt_path="last")`` could load ``path`` (see the module docstring)."""
    import torch

    if os.path.isfile(path):
        try:
            torch.load(path, weights_only=False, map_location="cpu")
            return True, None
        except Exception as exc:  # what Lightning's own load would raise
            return False, f"{type(exc).__name__}: {exc}"[:300]
    from torch.distributed.checkpoint import FileSystemReader

    metadata = os.path.join(path, ".metadata")
    if not os.path.isfile(metadata):
        return False, "no .metadata: Lightning raises 'does not point to a valid checkpoint'"
    try:
        chunks = FileSystemReader(path).read_metadata().storage_data.values()
        for chunk in chunks:
            if chunk.offset + chunk.length > os.path.getsize(os.path.join(path, chunk.relative_path)):
                return False, f"{chunk.relative_path} is shorter than .metadata says"
        torch.load(os.path.join(path, "meta.pt"), weights_only=False)
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"[:300]
    written = os.stat(metadata).st_mtime_ns
    if any(os.stat(os.path.join(path, n)).st_mtime_ns > written for n in os.listdir(path) if n.endswith(".distcp")):
        return False, "shards written after .metadata: a mix of two saves"
    if os.stat(os.path.join(path, "meta.pt")).st_mtime_ns < written:
        return False, "meta.pt older than .metadata: a mix of two saves"
    return True, None


def refusals(cases: list[str]) -> None:
    """One process: a Trainer whose set-up TrainStatusCallback refuses, for each case; what it raised."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import DeepSpeedStrategy, SingleDeviceStrategy

    from trainstatus.integrations.lightning import (
        TrainStatusCallback,
        TrainStatusCheckpointIO,
    )

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                 "TORCHELASTIC_RUN_ID"):
        os.environ.pop(name, None)

    class Own(SingleDeviceStrategy):
        def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
            pass

    class OwnDeepSpeed(DeepSpeedStrategy):
        def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
            pass

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.net(batch[0]).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    for case in cases:
        try:
            if case == "deepspeed":  # not installed: Lightning's class, not built (that needs the package)
                strategy = OwnDeepSpeed.__new__(OwnDeepSpeed)
                strategy.checkpoint_io = TrainStatusCheckpointIO()
                TrainStatusCallback().setup(type("Trainer", (), {"strategy": strategy})(), Tiny(), "fit")
            else:
                own = Own(torch.device("cpu")) if case == "own" else SingleDeviceStrategy(torch.device("cpu"))
                trainer = pl.Trainer(max_steps=1, strategy=own, logger=False, enable_progress_bar=False,
                                     enable_checkpointing=False, enable_model_summary=False,
                                     callbacks=[TrainStatusCallback()],
                                     plugins=[] if case == "no-plugin" else [TrainStatusCheckpointIO()])
                trainer.fit(Tiny(), [(torch.ones(1, 2),)])
            say(event="refused", case=case, type=None, message=None)
        except Exception as exc:
            say(event="refused", case=case, type=type(exc).__name__, message=str(exc))


def run(options: dict[str, Any]) -> None:
    if options.get("refusals"):
        if os.environ["RANK"] == "0":
            refusals(options["refusals"])
        return
    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
    from torch.utils.data import DataLoader, TensorDataset

    import trainstatus.integrations._lightning.resume as integration  # its decide reads through pick
    from trainstatus import TrainingStatusError
    from trainstatus.integrations.lightning import (
        TrainStatusCallback,
        TrainStatusCheckpointIO,
        last_complete_checkpoint,
    )

    reads = [0]  # how often this process read the status file to decide (the plugin's pick)
    read = integration.pick

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        return read(*args, **kwargs)

    integration.pick = counted  # type: ignore[assignment]
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    if options.get("cwd"):
        os.chdir(options["cwd"][rank])
    announce()
    directory, theirs, kind = options["dir"], options.get("theirs"), options.get("strategy", "ddp")
    width, timeout = options.get("width", 32), datetime.timedelta(seconds=options.get("timeout", 60))
    torch.manual_seed(options.get("seed", 0))
    if options.get("init_first"):
        dist.init_process_group("gloo", timeout=timeout)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                           torch.nn.ReLU(), torch.nn.Linear(width, 1))

        def configure_model(self) -> None:
            if kind == "model_parallel":
                from torch.distributed.fsdp import fully_shard

                mesh = self.device_mesh["data_parallel"]
                for layer in self.net:
                    if isinstance(layer, torch.nn.Linear):
                        fully_shard(layer, mesh=mesh)
                fully_shard(self.net, mesh=mesh)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class DCPStrategy(DDPStrategy):
        """DDP whose checkpoints are DCP folders saved past CheckpointIO, as FSDPStrategy's sharded
        branch saves them (dcp.save, then meta.pt on rank 0), each rank adding a file of its own."""

        def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
            path = str(self.broadcast(filepath))
            os.makedirs(path, exist_ok=True)
            dcp.save({"state_dict": checkpoint.pop("state_dict")}, checkpoint_id=path)
            own = torch.randn(4096).numpy().tobytes()  # this rank's state (RNG, data position...)
            with open(os.path.join(path, f"rank_{self.global_rank}.bin"), "wb") as f:
                if self.global_rank == options.get("slow"):
                    f.write(own[: len(own) // 2])
                    f.flush()
                    time.sleep(2)
                f.write(own[f.tell():])
            if self.global_rank == 0:
                torch.save(checkpoint, os.path.join(path, "meta.pt"))

    class Split(TrainStatusCheckpointIO):
        """Saves under ``theirs`` go to the wrapped TorchCheckpointIO alone: Lightning without the plugin."""

        def _theirs(self, path: Any) -> bool:
            return theirs is not None and os.path.dirname(os.path.abspath(path)) == os.path.abspath(theirs)

        def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
            if self._theirs(path):
                return self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options)
            return super().save_checkpoint(checkpoint, path, storage_options)

        def remove_checkpoint(self, path: Any) -> None:
            if self._theirs(path):
                return self.checkpoint_io.remove_checkpoint(path)
            return super().remove_checkpoint(path)

    class Theirs(ModelCheckpoint):
        @property
        def state_key(self) -> str:  # Lightning refuses two ModelCheckpoints with one state key
            return "theirs-" + super().state_key

    class Events(pl.Callback):
        """Reports each save (outermost, around trainstatus's wrapper); sends saves under ``theirs``
        past trainstatus (the strategy's class method: Lightning's own sharded save)."""

        def setup(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
            strategy = trainer.strategy
            inner = strategy.save_checkpoint

            def save(checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
                step = checkpoint.get("global_step")
                say(event="save-begin", path=str(filepath), step=step)
                if theirs is not None and os.path.dirname(os.path.abspath(filepath)) == os.path.abspath(theirs):
                    type(strategy).save_checkpoint(strategy, checkpoint, filepath, storage_options)
                else:
                    inner(checkpoint, filepath, storage_options)
                say(event="save-end", path=str(filepath), step=step)
                leave_once(options, rank, step)  # rank 0: its save through the plugin has recorded the file

            strategy.save_checkpoint = save

        def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            say(event="ready", step=trainer.global_step, reads=reads[0])

    started = time.monotonic()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            path = last_complete_checkpoint(directory, status_path=options.get("status_path"))  # the user's call
    except TrainingStatusError as exc:
        say(event="error", type=type(exc).__name__, message=str(exc), ranks=getattr(exc, "ranks", None),
            seconds=time.monotonic() - started)
        return
    say(event="resumed", path=path, reads=reads[0], warnings=[f"{w.category.__name__}: {w.message}" for w in caught
                                                              if w.category.__name__.startswith("TrainingStatus")])

    if theirs is not None and rank == 0:
        lasts = [os.path.join(theirs, n) for n in os.listdir(theirs) if n.startswith("last")] \
            if os.path.isdir(theirs) else []
        newest = max(lasts, key=os.path.getmtime) if lasts else None
        ok, error = (None, None) if newest is None else theirs_ok(newest)
        say(event="theirs", path=newest, ok=ok, error=error)

    if kind == "model_parallel":
        strategy: Any = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1,
                                              process_group_backend="gloo", timeout=timeout)
    elif kind == "dcp_ddp":
        strategy = DCPStrategy(process_group_backend="gloo", timeout=timeout)
    else:
        strategy = DDPStrategy(process_group_backend="gloo", timeout=timeout)

    def checkpoint(folder: str, kind: type[ModelCheckpoint] = ModelCheckpoint) -> ModelCheckpoint:
        return kind(dirpath=folder, monitor="step", mode="max", save_top_k=options.get("top_k", 2),
                    every_n_train_steps=options.get("every", 2), save_last=True)

    callbacks: list[Any] = []
    if options.get("callback", True):
        callbacks.append(TrainStatusCallback(sharded=True if kind == "dcp_ddp" else None))
    callbacks += [Events(), checkpoint(directory)]
    if theirs is not None:
        callbacks.append(checkpoint(theirs, Theirs))
    trainer = pl.Trainer(max_steps=options["max_steps"], max_epochs=-1, accelerator="cpu", devices=2, strategy=strategy,
                         logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=callbacks, plugins=[Split(status_path=options.get("status_path"))])
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    try:
        trainer.fit(Tiny(), DataLoader(data, batch_size=4), ckpt_path=path)
    except TrainingStatusError as exc:
        say(event="error", type=type(exc).__name__, message=str(exc), ranks=getattr(exc, "ranks", None),
            seconds=time.monotonic() - started)
        return
    say(event="done", step=trainer.global_step)


def serve() -> None:
    """The fork server (tests/_forkserver.py), torch and Lightning imported once for every worker."""
    import lightning.pytorch  # noqa: F401
    import torch.distributed.checkpoint
    import torch.distributed.fsdp  # noqa: F401

    import trainstatus.integrations.lightning  # noqa: F401

    _forkserver.serve(run)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        _forkserver.alone()  # Lightning's own lines go to stderr
        run(json.loads(sys.argv[1]))
