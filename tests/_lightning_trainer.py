"""A real Lightning run for tests/test_integration_lightning.py, run by .venv-torch's interpreter.

    python _lightning_trainer.py '<json options>'

A tiny LightningModule (a few linear layers, ``width`` wide) trained on random tensors on the CPU,
with ``ModelCheckpoint(dirpath=dir, monitor="step", mode="max", save_top_k=top_k,
every_n_train_steps=every, save_last=save_last)`` (top-k by step: the newest ``top_k`` are kept)
and ``TrainStatusCheckpointIO``. It resumes with ``trainer.fit(ckpt_path=last_complete_checkpoint(dir))``
and trains up to ``max_steps`` (the trainer's global step, absolute).

With ``"theirs"`` (a folder) a second ``ModelCheckpoint`` with the same settings saves there at
the same moments through Lightning's own ``TorchCheckpointIO`` alone (what a run without the
plugin does), and before training the child tries Lightning's own resume on that folder:
``ckpt_path="last"`` loads the newest ``last*.ckpt`` by modification time.

With ``"probe": true`` the wrapped plugin reports each removal, with whether the status file on
disk still listed the file at that moment.

It prints one JSON object a line, flushed: ``resumed`` (path, warnings, where: file:line each
warning points at), ``theirs`` (path, ok,
error), ``ready`` (step: the global step Lightning restored), ``removed`` (name, listed), ``done``
(step) at the end.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import warnings
from typing import Any


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    options = json.loads(sys.argv[1])
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import TorchCheckpointIO
    from torch.utils.data import DataLoader, TensorDataset

    from trainstatus.integrations.lightning import TrainStatusCheckpointIO, last_complete_checkpoint

    torch.set_num_threads(1)  # two cores shared by the suite: one each for trainer and checker
    torch.manual_seed(options.get("seed", 0))
    directory = options["dir"]
    theirs = options.get("theirs")
    status_path = options.get("status_path")
    width = options.get("width", 32)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                           torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
                                           torch.nn.Linear(width, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class Probe(TorchCheckpointIO):
        def remove_checkpoint(self, path: Any) -> None:
            listed = None
            status = status_path or os.path.join(os.path.dirname(path), "training_status.json")
            if os.path.exists(status):
                with open(status) as f:
                    entries = json.load(f).get("lightning", {}).get("checkpoints", [])
                listed = os.path.basename(path) in [e["file_path"] for e in entries]
            say(event="removed", name=os.path.basename(path), listed=listed)
            super().remove_checkpoint(path)

    class Split(TrainStatusCheckpointIO):
        """Saves under ``theirs`` go to the wrapped TorchCheckpointIO alone: Lightning without the plugin."""

        def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
            if theirs is not None and os.path.dirname(os.path.abspath(path)) == os.path.abspath(theirs):
                return self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options)
            return super().save_checkpoint(checkpoint, path, storage_options)

        def remove_checkpoint(self, path: Any) -> None:
            if theirs is not None and os.path.dirname(os.path.abspath(path)) == os.path.abspath(theirs):
                return self.checkpoint_io.remove_checkpoint(path)
            return super().remove_checkpoint(path)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = last_complete_checkpoint(directory, status_path=status_path)  # the user's call
    ours = [w for w in caught if w.category.__name__ == "TrainingStatusCheckpointWarning"]
    say(event="resumed", path=path, warnings=[f"{w.category.__name__}: {w.message}" for w in ours],
        where=[f"{os.path.basename(w.filename)}:{w.lineno}" for w in ours])

    if theirs is not None:
        lasts = glob.glob(os.path.join(theirs, "last*.ckpt"))
        newest = max(lasts, key=os.path.getmtime) if lasts else None
        ok, error = None, None
        if newest is not None:
            try:
                TorchCheckpointIO().load_checkpoint(newest, weights_only=False)
                ok = True
            except Exception as exc:  # what trainer.fit(ckpt_path="last") would crash on
                ok, error = False, f"{type(exc).__name__}: {exc}"
        say(event="theirs", path=newest, ok=ok, error=error)

    save_last = options.get("save_last", True)

    class Theirs(ModelCheckpoint):
        @property
        def state_key(self) -> str:  # Lightning refuses two ModelCheckpoints with one state key
            return "theirs-" + super().state_key

    def checkpoint(folder: str, kind: type[ModelCheckpoint] = ModelCheckpoint) -> ModelCheckpoint:
        return kind(dirpath=folder, monitor="step", mode="max", save_top_k=options.get("top_k", 2),
                               every_n_train_steps=options.get("every", 4), save_last=save_last)

    class Ready(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            say(event="ready", step=trainer.global_step)

    callbacks: list[Any] = [checkpoint(directory), Ready()]
    if theirs is not None:
        callbacks.insert(1, checkpoint(theirs, Theirs))
    plugin = Split(Probe() if options.get("probe") else None, status_path=status_path)
    trainer = pl.Trainer(max_steps=options["max_steps"], max_epochs=-1, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=callbacks, plugins=[plugin])
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer.fit(Tiny(), DataLoader(data, batch_size=8), ckpt_path=path)
    say(event="done", step=trainer.global_step)


if __name__ == "__main__":
    main()
