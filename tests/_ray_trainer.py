"""A Ray Train driver for tests/test_integration_ray.py, run in .venv-ray (tests/_ray_env.py).

    python _ray_trainer.py '{"temp_dir": "/tmp/tsray-x"}'

starts a local Ray cluster of its own (2 CPUs, its own temp folder, no dashboard) and serves
requests, one JSON object a line on stdin, each answered by one line ``{"event": "answer", ...}``
on stdout once done (other lines are Ray's). Starting Ray and importing torch take most of a
test's time, so one driver serves a whole module:

- ``{"do": "fit", ...}``: a ``TorchTrainer`` with 2 CPU workers (DDP on gloo) runs ``train`` for
  ``epochs`` epochs, reporting a checkpoint each epoch: ``model.pt`` (rank 0) and ``rank_<r>.pt``
  (every rank: the folder is whole only with both). Options: ``storage_path``, ``name``,
  ``num_to_keep``, ``resume_from`` (a run's folder: ``last_complete_checkpoint`` of it is passed in
  ``train_loop_config``, the Train v2 recipe), ``callback`` (``TrainStatusCallback`` or not),
  ``max_failures``, ``kill_rank``/``kill_after`` (that worker SIGKILLs itself right after its
  ``report()`` of that epoch returned, once), ``hold_at`` (a test hook on the controller holds Ray's
  write of its snapshot halfway, at that registration, for the test to kill everything there).
  Answers ``ok`` and, when Ray raised, the error's type and message.
- ``{"do": "last", "run_path": ...}``: ``last_complete_checkpoint(run_path)``: the folder, the epoch
  in its ``model.pt``, and the warnings' messages.
- ``{"do": "quit"}``: shuts the cluster down and exits.

The training function writes what it did (``start``: the epoch it starts from; ``reported``;
``killing``) as JSON lines to ``<events>`` (``events`` option), a file the test reads.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any

import ray
import ray.train
import torch
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, UserCallback
from ray.train.torch import TorchTrainer

from trainstatus.integrations.ray import TrainStatusCallback, last_complete_checkpoint


def log(path: str, **fields: Any) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({**fields, "time": time.time()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def train(config: dict[str, Any]) -> None:
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    checkpoint = ray.train.get_checkpoint() or config.get("resume_from")  # the Train v2 resume recipe
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "model.pt"))
            torch.load(os.path.join(folder, f"rank_{rank}.pt"))  # this rank's own file: a load fails without it
        model.load_state_dict(state["model"])
        start = state["epoch"] + 1
    log(config["events"], event="start", rank=rank, start=start, pid=os.getpid())
    model = ray.train.torch.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(start, config["epochs"]):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0:
                torch.save({"epoch": epoch, "model": model.module.state_dict()}, os.path.join(folder, "model.pt"))
            own = {"epoch": epoch, "rank": rank, "rng": torch.get_rng_state()}
            torch.save(own, os.path.join(folder, f"rank_{rank}.pt"))
            ray.train.report({"epoch": epoch, "loss": float(loss)}, checkpoint=Checkpoint.from_directory(folder))
        log(config["events"], event="reported", rank=rank, epoch=epoch)
        marker = config["events"] + ".killed"
        if rank == config.get("kill_rank") and epoch == config.get("kill_after") and not os.path.exists(marker):
            open(marker, "w").close()
            log(config["events"], event="killing", rank=rank, epoch=epoch, pid=os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)


class HoldSnapshot(UserCallback):
    """A test hook on the controller: at registration ``at`` (1-based), Ray's in-place write of
    ``checkpoint_manager_snapshot.json`` writes half the new snapshot and then waits, so that a kill
    of every process leaves it cut short, as a kill during that write does."""

    def __init__(self, at: int, events: str) -> None:
        self.at, self.events, self.seen = at, events, 0

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self.seen += checkpoint is not None
        if self.seen != self.at - 1:
            return
        from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import CheckpointManager

        events = self.events

        def write_half(manager: Any) -> None:
            data = manager._save_state().encode("utf-8")
            path = manager._storage_context.checkpoint_manager_snapshot_path
            with manager._storage_context.storage_filesystem.open_output_stream(path) as f:
                f.write(data[: len(data) // 2])
                f.flush()
                log(events, event="holding", snapshot=path, pid=os.getpid())
                time.sleep(3600)  # the test kills every process of the cluster here

        CheckpointManager._write_state_to_storage = write_half


def fit(request: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {"epochs": request["epochs"], "events": request["events"]}
    for key in ("kill_rank", "kill_after"):
        if key in request:
            config[key] = request[key]
    if request.get("resume_from"):
        config["resume_from"] = last_complete_checkpoint(request["resume_from"])
    callbacks: list[Any] = [TrainStatusCallback()] if request.get("callback", True) else []
    if "hold_at" in request:
        callbacks.append(HoldSnapshot(request["hold_at"], request["events"]))
    trainer = TorchTrainer(
        train, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name=request["name"], storage_path=request["storage_path"], callbacks=callbacks,
            checkpoint_config=CheckpointConfig(num_to_keep=request.get("num_to_keep")),
            failure_config=FailureConfig(max_failures=request.get("max_failures", 0)),
        ),
    )
    try:
        trainer.fit()
    except Exception as exc:  # noqa: BLE001 - the test reads what Ray raised
        return {"ok": False, "error": type(exc).__name__, "message": str(exc)}
    return {"ok": True}


def last(request: dict[str, Any]) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint = last_complete_checkpoint(request["run_path"])
    said = [str(w.message) for w in caught if w.category.__module__.startswith("trainstatus")]
    if checkpoint is None:
        return {"path": None, "warnings": said}
    with checkpoint.as_directory() as folder:
        epoch = torch.load(os.path.join(folder, "model.pt"))["epoch"]
    return {"path": checkpoint.path, "epoch": epoch, "warnings": said,
            "filesystem": checkpoint.filesystem.type_name}


def main() -> None:
    options = json.loads(sys.argv[1])
    ray.init(num_cpus=2, _temp_dir=options["temp_dir"], include_dashboard=False, log_to_driver=False)
    print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["do"] == "quit":
            break
        try:
            answer = {"fit": fit, "last": last}[request["do"]](request)
        except Exception:  # noqa: BLE001 - a failed request is the test's to report
            answer = {"failed": traceback.format_exc()}
        print(json.dumps({"event": "answer", **answer}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
