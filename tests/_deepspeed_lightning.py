"""Lightning's ``DeepSpeedStrategy`` on CPU, for tests/test_integration_deepspeed.py: the role
``"lightning"`` of tests/_deepspeed_trainer.py's workers (.venv-deepspeed, ``DS_ACCELERATOR=cpu``).

Lightning refuses ``DeepSpeedStrategy`` on anything but CUDA GPUs (``setup_environment``), checks
that device indices match local ranks (``setup_distributed``) and hands DeepSpeed the root device's
index (None on CPU) as ``device_rank``. ``CPUDeepSpeed`` below skips those three, in the tests only
(never shipped): DeepSpeed then trains on its CPU accelerator over gloo, and everything
trainstatus meets is Lightning's and DeepSpeed's own: ``DeepSpeedStrategy.save_checkpoint`` (every
rank, ``engine.save_checkpoint(path, tag="checkpoint")``), its load, ``ModelCheckpoint``'s
``last.ckpt`` saved over in place, its top-k folders removed through ``CheckpointIO``.

A tiny module is trained with ``ModelCheckpoint(dirpath=dir, monitor="step", mode="max",
save_top_k=2, every_n_train_steps=2, save_last=True)``, ``TrainStatusCheckpointIO`` and
``TrainStatusCallback``, resumed from ``last_complete_checkpoint(dir)`` up to ``max_steps``.
Options: ``stage`` (ZeRO, default 2); ``port`` (one process started without a launcher's
environment: its process group's); ``plain`` (Lightning alone, no trainstatus, resumed from
``ckpt_path`` as given, nothing saved: Lightning's own way); ``leave_before_shard`` (a step: at
that step's save of ``last.ckpt``, rank 1 leaves with ``os._exit`` just before writing its ZeRO
shard, once rank 0 has written ``latest``: the folder keeps rank 1's shard of the save before,
whole, beside rank 0's new files: the torn folder a kill inside an in-place save leaves).

Events: ``resumed`` (path, warnings), ``ready`` (Lightning's restored global step, and ``adam``: the
step count in this rank's AdamW state, which comes from this rank's own ZeRO shard: ranks that
disagree loaded shards of different saves), ``dying``, ``error`` (type, message), ``done`` (step).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

from _forkserver import announce, say


def lightning(options: dict[str, Any]) -> None:
    import deepspeed
    import lightning.pytorch as pl
    import torch
    from lightning.fabric.utilities.seed import reset_seed
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
    from torch.utils.data import DataLoader, TensorDataset

    from trainstatus import TrainingStatusError
    from trainstatus.integrations.lightning import (
        TrainStatusCallback,
        TrainStatusCheckpointIO,
        last_complete_checkpoint,
    )

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # else a first initialize compiles it
    torch.set_num_threads(1)
    announce()
    if "RANK" not in os.environ:  # one process, no launcher: Lightning's own environment, on this port
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(options["port"])})
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    directory, stage, plain = options["dir"], options.get("stage", 2), options.get("plain", False)
    now = {"step": 0}

    class CPUDeepSpeed(DeepSpeedStrategy):  # type: ignore[misc]
        def setup_environment(self) -> None:
            DDPStrategy.setup_environment(self)  # not DeepSpeedStrategy's: it refuses a CPU accelerator

        def setup_distributed(self) -> None:  # DeepSpeedStrategy's, less its check of GPU indices
            reset_seed()
            self.set_world_ranks()
            self._init_deepspeed_distributed()

        def _setup_model_and_optimizer(self, model: Any, optimizer: Any, lr_scheduler: Any = None) -> Any:
            # DeepSpeedStrategy's, with the local rank for device_rank (the CPU device has no index)
            engine, optimizer, _, _ = deepspeed.initialize(
                args=argparse.Namespace(device_rank=self.local_rank), config=self.config, model=model,
                model_parameters=[p for p in model.parameters() if p.requires_grad], optimizer=optimizer,
                lr_scheduler=lr_scheduler, dist_init_required=False)
            return engine, optimizer

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    class Events(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            inner = trainer.strategy.deepspeed_engine.optimizer.optimizer  # torch's AdamW, this rank's shard
            steps = [float(state["step"]) for state in inner.state.values() if "step" in state]
            say(event="ready", step=trainer.global_step, adam=max(steps) if steps else None)

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            now["step"] = trainer.global_step  # before ModelCheckpoint's save of this step (Lightning runs it last)

    leaving = options.get("leave_before_shard")
    if leaving is not None and rank == 1:
        original = torch.save
        last = os.path.join(os.path.abspath(directory), "last.ckpt")

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            where = os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else ""
            if now["step"] == leaving and where.startswith(last + os.sep) and "zero_pp_rank_1" in where:
                began, latest = time.time_ns(), os.path.join(last, "latest")
                # ZeRO-2: rank 0 writes its files and latest without waiting for this rank
                while not (os.path.exists(latest) and os.stat(latest).st_mtime_ns >= began) \
                        and time.time_ns() - began < 20e9:
                    time.sleep(0.01)
                written = os.path.exists(latest) and os.stat(latest).st_mtime_ns >= began
                say(event="dying", step=leaving, latest_written=written)
                os._exit(9)
            return original(obj, f, *args, **kwargs)

        torch.save = save  # DeepSpeed's torch checkpoint engine calls torch.save by this name

    try:
        if plain:
            path = options.get("ckpt_path")
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                path = last_complete_checkpoint(directory)
            say(event="resumed", path=path, warnings=[f"{w.category.__name__}: {w.message}" for w in caught
                                                      if w.category.__name__.startswith("TrainingStatus")])
        config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage},
                  "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
        strategy = CPUDeepSpeed(config=config, process_group_backend="gloo")
        callbacks: list[Any] = [Events()]
        if not plain:
            callbacks += [TrainStatusCallback(), ModelCheckpoint(dirpath=directory, monitor="step", mode="max",
                                                                 save_top_k=2, every_n_train_steps=2, save_last=True)]
        trainer = pl.Trainer(max_steps=options["max_steps"], max_epochs=-1, accelerator="cpu", devices=world,
                             strategy=strategy, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, enable_checkpointing=not plain, callbacks=callbacks,
                             plugins=[] if plain else [TrainStatusCheckpointIO()])
        generator = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator))
        trainer.fit(Tiny(), DataLoader(data, batch_size=4), ckpt_path=path)
    except TrainingStatusError as exc:
        say(event="error", type=type(exc).__name__, message=str(exc))
        say(event="done", step=None)
        return
    say(event="done", step=trainer.global_step)
