"""A real Lightning save under trainstatus.testing's power-loss model, for tests/test_integration_lightning.py.

    python _lightning_power_loss.py <run folder>

Run by .venv-torch's interpreter. A tiny LightningModule trains one step with
``ModelCheckpoint(dirpath=<run>/ckpts, every_n_train_steps=1)`` and ``TrainStatusCheckpointIO``
recording in ``<run>/run_logs/training_status.json`` (apart from the checkpoints, so that the
status file's own folder sync says nothing about the checkpoints' folder). ``power_losses``
records every os operation in the run folder, Lightning's temp file included (``TMPDIR`` is
``<run>/tmp``, where ``TorchCheckpointIO``'s fsspec transaction makes it), and checks each state
a power loss could leave: whatever the status file lists there is whole
(``last_complete_checkpoint`` returns the newest listed entry and passes over nothing), and the
checkpoint is listed once its record was acknowledged.

Prints one JSON line: the number of states checked, the operations recorded, and the first
failing state if any (``failed``: what was wrong, and the state in a line).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from typing import Any


def main() -> None:
    run = os.path.abspath(sys.argv[1])
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from trainstatus import StatusStore, TrainingStatusCheckpointWarning
    from trainstatus.integrations.lightning import TrainStatusCheckpointIO, last_complete_checkpoint
    from trainstatus.testing import PowerLoss, power_losses

    torch.set_num_threads(1)
    torch.manual_seed(0)
    status = os.path.join("run_logs", "training_status.json")
    os.makedirs(os.path.join(run, "run_logs"))
    os.makedirs(os.path.join(run, "tmp"))
    tempfile.tempdir = os.path.join(run, "tmp")  # fsspec's mkstemp: inside the recorded folder

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)  # no optimizer state: a small checkpoint

    # Made before the recording: what Lightning does at construction is not a save.
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=tempfile.mkdtemp(prefix="lightning-root-", dir=os.path.dirname(run)),
                         callbacks=[ModelCheckpoint(dirpath=os.path.join(run, "ckpts"), every_n_train_steps=1,
                                                    save_top_k=-1)],
                         plugins=[TrainStatusCheckpointIO(status_path=os.path.join(run, status))])
    data = DataLoader(TensorDataset(torch.randn(4, 2), torch.randn(4, 1)), batch_size=4)
    failures: list[str] = []

    def check(loss: PowerLoss) -> None:
        path = os.path.join(loss.folder, status)
        listed: list[str] = []
        if os.path.exists(path):
            with StatusStore(path) as store:
                listed = [e["file_path"] for e in store.get("lightning", "checkpoints") or []]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = last_complete_checkpoint(os.path.join(loss.folder, "ckpts"), status_path=path)
        # Warnings about listed checkpoints passed over (``skipped``), not about checkpoint files the
        # list does not hold yet (a state before the first record): those are the states' point.
        passed_over = [str(w.message) for w in caught if issubclass(w.category, TrainingStatusCheckpointWarning)
                       and getattr(w.message, "skipped", None)]
        wrong = None
        if passed_over:
            wrong = f"a listed checkpoint is not whole: {passed_over[0]}"
        elif listed and found != os.path.join(loss.folder, "ckpts", listed[-1]):
            wrong = f"listed {listed}, last_complete_checkpoint returned {found}"
        elif loss.acknowledged and not listed:
            wrong = "the record was acknowledged, but nothing is listed"
        if wrong is not None and not failures:
            failures.append(f"{wrong} ({loss})")

    recording = power_losses(lambda: trainer.fit(Tiny(), data), check, root=run, scratch=os.path.dirname(run))
    print(json.dumps({"states": recording.states, "operations": recording.operations, "failed": failures[:1]}),
          flush=True)


if __name__ == "__main__":
    main()
