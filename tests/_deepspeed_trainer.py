"""A raw DeepSpeed training loop with trainstatus.integrations.deepspeed, for
tests/test_integration_deepspeed.py, run by .venv-deepspeed's interpreter with ``DS_ACCELERATOR=cpu``.

    python _deepspeed_trainer.py serve <folder>      # the fork server (tests/_forkserver.py)
    python -m torch.distributed.run --standalone --nproc_per_node=N _deepspeed_trainer.py '<json options>'

A small model (linear layers ``width`` wide) under ZeRO ``stage`` (1-3) on the gloo group DeepSpeed
makes on CPU, torch's AdamW (no op compiled: the shared-memory op is turned off and
``TORCH_EXTENSIONS_DIR`` is the test's), trained on data drawn from a generator seeded by the step
and the rank (a resumed run sees what an uninterrupted one does). It resumes with
``load_checkpoint(engine, dir)``, then saves after every step with ``save_checkpoint(engine, dir,
keep=keep)`` up to step ``steps``; rank 0 then says the SHA-256 of the full parameters (gathered).

Options: ``theirs`` (a folder: each step is also saved there by DeepSpeed's own
``engine.save_checkpoint``, which writes ``latest``; before the resume every rank reads it as
DeepSpeed's ``load_checkpoint(folder)`` does: ``latest``, then ``torch.load`` of each file of the tag
it names, and says whether that worked), ``die_in_write`` ([rank, step, "ours" or "theirs"]: that
rank's ``torch.save`` of its ZeRO shard at that step, into that folder, writes half the bytes and
leaves with ``os._exit``; the other rank goes on, as far as DeepSpeed lets it), ``port`` (one
process alone: its process group's), ``timeout``.

Other roles (``"role"``): ``trainer`` (the Transformers Trainer with ``deepspeed=``), ``accelerate``
(Accelerate with a ``DeepSpeedPlugin``), ``lightning`` (Lightning's ``DeepSpeedStrategy``,
tests/_deepspeed_lightning.py).

Events (tests/_forkserver.py ``say``): ``pid``, ``theirs`` (tag, ok, error), ``resumed`` (tag, step,
warnings), ``save-begin``/``save-end``/``recorded`` (step), ``error`` (a trainstatus error: type,
message; ``done`` follows, with no step), ``done`` (step, digest).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from typing import Any

import _forkserver
from _deepspeed_lightning import lightning
from _forkserver import announce, leave_once, say
from _parts import Progress, trainer_parts


def ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message}" for w in caught if w.category.__name__.startswith("TrainingStatus")]


def their_resume(folder: str, rank: int, *, latest_needed: bool = False) -> tuple[str | None, bool, str | None]:
    """What DeepSpeed's own ``load_checkpoint(folder)`` reads, read the same way: ``latest`` (its
    content stripped; an empty or missing one fails as DeepSpeed does), then every file of the
    tag (``torch.load``: under ZeRO-1/2 each rank reads every rank's shard). (tag, ok, error).
    ``latest_needed``: a missing ``latest`` fails too (the Trainer raises "failed to resume")."""
    import torch

    latest = os.path.join(folder, "latest")
    if not os.path.isfile(latest):
        if latest_needed:
            return None, False, f"FileNotFoundError: no {latest}"
        return None, True, None  # a fresh run for DeepSpeed too (it warns and returns None)
    with open(latest) as f:
        tag = f.read().strip()
    try:
        names = sorted(os.listdir(os.path.join(folder, tag))) if tag else []
        if not any(name.endswith("_model_states.pt") for name in names):
            raise AssertionError(f"no model states in {os.path.join(folder, tag)!r}")  # DeepSpeed's own assertion
        for name in names:
            torch.load(os.path.join(folder, tag, name), map_location="cpu", weights_only=False)
        return tag, True, None
    except Exception as exc:  # noqa: BLE001 - what DeepSpeed's own resume meets
        return tag, False, f"{type(exc).__name__}: {exc}"[:300]


def cut_shard(options: dict[str, Any], rank: int, folders: dict[str, str]) -> None:
    """``die_in_write`` ([rank, step, which]): that rank's ``torch.save`` of its ZeRO shard into a
    ``global_step<step>`` folder under ``folders[which]`` writes the file, cuts it to half and leaves
    with ``os._exit``, saying ``dying`` first."""
    dying = options.get("die_in_write")
    if dying is None or dying[0] != rank:
        return
    import torch

    original = torch.save
    base = folders[dying[2]]

    def cut(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        where = os.fspath(f) if isinstance(f, (str, os.PathLike)) else ""
        if (base and where.startswith(base + os.sep) and "zero_pp_rank" in os.path.basename(where)
                and os.path.basename(os.path.dirname(where)) == f"global_step{dying[1]}"):
            original(obj, f, *args, **kwargs)
            os.truncate(where, os.path.getsize(where) // 2)
            say(event="dying", step=dying[1])
            os._exit(9)
        return original(obj, f, *args, **kwargs)

    torch.save = cut  # DeepSpeed's torch checkpoint engine calls torch.save by this name at each save


def alone(options: dict[str, Any]) -> None:
    """One process (no launcher's environment): DeepSpeed still makes a process group, of one, on
    the port ``options["port"]``."""
    if "RANK" not in os.environ:
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(options["port"])})


def train(options: dict[str, Any]) -> None:
    import deepspeed
    import torch

    from trainstatus import TrainingStatusError
    from trainstatus.integrations.deepspeed import load_checkpoint, save_checkpoint

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # else a first initialize compiles it (minutes)
    torch.set_num_threads(1)
    announce()
    alone(options)
    rank = int(os.environ.get("RANK", "0"))
    directory, stage, width = options["dir"], options.get("stage", 2), options.get("width", 64)
    theirs, timeout = options.get("theirs"), options.get("timeout", 120)

    cut_shard(options, rank, {"ours": directory, "theirs": theirs or ""})

    if theirs is not None:
        tag, ok, error = their_resume(theirs, rank)
        say(event="theirs", tag=tag, ok=ok, error=error)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 8))
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    started = time.monotonic()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            path, _ = load_checkpoint(engine, directory, timeout=timeout)
    except TrainingStatusError as exc:
        say(event="error", type=type(exc).__name__, message=str(exc), seconds=time.monotonic() - started)
        say(event="done", step=None, digest=None)
        return
    say(event="resumed", tag=None if path is None else os.path.basename(os.path.dirname(path)), step=engine.global_steps,
        warnings=ours(caught))

    for step in range(engine.global_steps + 1, options["steps"] + 1):
        generator = torch.Generator().manual_seed(step * 1000 + rank)
        x, y = torch.randn(4, width, generator=generator), torch.randn(4, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        assert engine.global_steps == step
        say(event="save-begin", step=step)
        save_checkpoint(engine, directory, keep=options.get("keep"), timeout=timeout)
        say(event="recorded", step=step)
        leave_once(options, rank, step)
        if theirs is not None:
            engine.save_checkpoint(theirs)
        say(event="save-end", step=step)

    digest = None
    if stage == 3:
        from deepspeed.utils import safe_get_full_fp32_param

        full = {name: safe_get_full_fp32_param(p) for name, p in engine.module.named_parameters()}
    else:
        full = dict(engine.module.named_parameters())
    if rank == 0:
        sha = hashlib.sha256()
        for name in sorted(full):
            sha.update(name.encode())
            sha.update(full[name].detach().float().numpy().tobytes())
        digest = sha.hexdigest()
    say(event="done", step=engine.global_steps, digest=digest)


def trainer(options: dict[str, Any]) -> None:
    """``"role": "trainer"``: the Transformers Trainer with ``deepspeed=`` (ZeRO ``stage``) and
    ``TrainStatusCallback``, ``max_steps`` steps saved every 2 (a constant learning rate: a run
    killed and resumed trains as one that was not), resumed from ``last_complete_checkpoint(dir)``;
    events ``theirs`` (with ``theirs``: what the Trainer's own ``resume_from_checkpoint=True`` would
    load, ``get_last_checkpoint``'s folder and DeepSpeed's ``latest`` in it, read as
    ``their_resume`` does), ``resumed`` (path, warnings) or ``error``, ``step`` and ``saved`` (step),
    then ``done`` (step). ``die_in_write`` as for ``train`` (``"ours"``: the Trainer's save);
    ``use_cpu`` (default true: on CPU under a launcher, without it every rank counts itself alone)."""
    import deepspeed
    import torch
    from transformers import (
        PrinterCallback,
        ProgressCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.trainer_utils import get_last_checkpoint

    from trainstatus import TrainingStatusError
    from trainstatus.integrations.transformers import (
        TrainStatusCallback,
        last_complete_checkpoint,
    )

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    torch.set_num_threads(1)
    announce()
    alone(options)
    rank = int(os.environ["RANK"])
    cut_shard(options, rank, {"ours": options["dir"], "theirs": ""})

    Tiny, Data = trainer_parts(32)

    class Events(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            say(event="step", step=state.global_step)  # the save of a step comes after this

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            say(event="saved", step=state.global_step)

    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "zero_optimization": {"stage": options.get("stage", 2)}, "zero_allow_untested_optimizer": True}
    args = TrainingArguments(output_dir=options["dir"], max_steps=options["max_steps"], save_strategy="steps",
                             save_steps=2, per_device_train_batch_size=4, learning_rate=1e-2, logging_strategy="no",
                             lr_scheduler_type="constant", report_to="none", disable_tqdm=True, ddp_backend="gloo",
                             deepspeed=config, ddp_timeout=options.get("timeout", 120),
                             use_cpu=options.get("use_cpu", True))  # without it each rank counts itself alone
    if options.get("theirs"):  # the Trainer's own resume: the highest checkpoint-<N>, then DeepSpeed's latest in it
        highest = get_last_checkpoint(options["dir"]) if os.path.isdir(options["dir"]) else None
        tag, ok, error = (None, None, None) if highest is None else their_resume(highest, rank, latest_needed=True)
        say(event="theirs", path=highest, tag=tag, ok=ok, error=error)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            path = last_complete_checkpoint(options["dir"], timeout=args.ddp_timeout)
    except TrainingStatusError as exc:
        say(event="error", type=type(exc).__name__, message=str(exc))
        say(event="done", step=None)
        return
    say(event="resumed", path=path, warnings=ours(caught))
    run = Trainer(model=Tiny(), args=args, train_dataset=Data(256), callbacks=[TrainStatusCallback(), Events()])
    for quiet in (PrinterCallback, ProgressCallback):
        run.remove_callback(quiet)
    try:
        run.train(resume_from_checkpoint=path)
    except TrainingStatusError as exc:
        say(event="error", type=type(exc).__name__, message=str(exc))
        say(event="done", step=None)
        return
    say(event="done", step=run.state.global_step)


def accelerated(options: dict[str, Any]) -> None:
    """``"role": "accelerate"``: Accelerate with a ``DeepSpeedPlugin`` (ZeRO ``stage``), set up as it
    works on CPU under a launcher (``ACCELERATE_USE_DEEPSPEED=true``, a gloo process group), resumed
    with trainstatus's ``load_state``, then a step and ``save_state`` (automatic naming,
    ``total_limit`` 2) up to ``steps``; events ``resumed`` (path, step, warnings) or ``error``, then
    ``done`` (step)."""
    import deepspeed
    import torch
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration

    from trainstatus import TrainingStatusError
    from trainstatus.integrations.accelerate import load_state, save_state

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    torch.set_num_threads(1)
    announce()
    alone(options)
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    plugin = DeepSpeedPlugin(zero_stage=options.get("stage", 2), gradient_accumulation_steps=1)
    plugin.deepspeed_config.update({"train_micro_batch_size_per_gpu": 4, "zero_allow_untested_optimizer": True})
    accelerator = Accelerator(deepspeed_plugin=plugin, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")],
                              project_config=ProjectConfiguration(project_dir=options["dir"],
                                                                  automatic_checkpoint_naming=True, total_limit=2))

    progress = Progress()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    accelerator.register_for_checkpointing(progress)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            path = load_state(accelerator)
    except TrainingStatusError as exc:
        say(event="error", type=type(exc).__name__, message=str(exc))
        say(event="done", step=None)
        return
    say(event="resumed", path=path, step=progress.step, warnings=ours(caught))
    rank = accelerator.process_index
    while progress.step < options["steps"]:
        progress.step += 1
        generator = torch.Generator().manual_seed(progress.step * 1000 + rank)
        loss = torch.nn.functional.mse_loss(model(torch.randn(4, 8, generator=generator)),
                                            torch.randn(4, 1, generator=generator))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        save_state(accelerator)
    say(event="done", step=progress.step)


ROLES = {"trainer": trainer, "accelerate": accelerated, "lightning": lightning}


def serve() -> None:
    """The fork server (tests/_forkserver.py): torch, DeepSpeed and Lightning imported once for every worker."""
    import deepspeed  # noqa: F401
    import lightning.pytorch  # noqa: F401
    import torch

    import trainstatus.integrations.deepspeed
    import trainstatus.integrations.lightning  # noqa: F401

    torch.set_num_threads(1)
    _forkserver.serve(lambda options: ROLES.get(options.get("role", ""), train)(options))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        options = json.loads(sys.argv[1])
        ROLES.get(options.get("role", ""), train)(options)
        sys.stdout.flush()
        os._exit(0)
