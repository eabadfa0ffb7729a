"""One rank of a Transformers Trainer run under ``torchrun`` or ``accelerate launch``, for
tests/test_integration_transformers_ranks.py, run by .venv-torch's interpreter:

    python -m torch.distributed.run --nproc_per_node=2 _transformers_ranks.py '<json options>'

The tiny model of tests/_transformers_trainer.py (linear layers ``width`` wide, random tensors, CPU,
gloo, no hub) trained by ``transformers.Trainer`` under DDP, saving every ``every`` steps into
``dir`` with ``TrainStatusCallback`` and ``save_total_limit=limit``, up to ``max_steps``.

The resume: ``"resume": "call"`` (the default) calls ``last_complete_checkpoint(dir)`` once
``TrainingArguments`` exists (it joins the process group) and passes the result to ``train``;
``true`` passes ``resume_from_checkpoint=True`` (routed to the callback's decision); ``"fresh"``
starts at step 0.

With ``"theirs": true`` each rank first measures Transformers' own resume on the same folder:
``get_last_checkpoint(dir)``, and when that is another folder than ours, the loads
``Trainer.train`` makes of it on every rank (the model, ``trainer_state.json``, optimizer and
scheduler, this rank's ``rng_state_<rank>.pth``), on a Trainer of its own. Not ``train`` itself:
a rank that fails there would leave the other waiting in DDP's first all-reduce until the timeout.

With ``"slow": {"rank": 1, "at": {"<step>": "sleep" | "half"}, "markers": folder, "hold": bool}``
that rank's ``Trainer._save_rng_state`` at each of those steps holds its file back (``sleep``:
writes nothing yet; ``half``: writes its first half) until rank 0 is in ``on_save`` (a marker file
rank 0 writes there, before our callback) and then until rank 0 recorded the folder or 3 s passed
(the window in which a record without a barrier happens); it prints ``window<step>``
(``recorded``: whether the folder was recorded meanwhile; ``written`` and ``size``: the bytes
written so far and in all) and, with ``hold``, waits there to be killed; else it writes the rest.

Each rank prints one JSON object a line (tests/_forkserver.py ``say``), with ``rank``:
``pid``, ``resumed`` (path, warnings, error; ``read``: the bytes the call read),
``theirs`` (path, ok, error),
``ready`` (step, at on_train_begin after our callback), ``stepped`` (the first step trained: the
checkpoint's RNG state was loaded), ``window``, ``saved`` (step, after our callback's on_save),
``done`` (step, error). An error is ``"<type>: <message>"``, with the
``ranks`` and ``hosts`` of a ``TrainingStatusCheckpointNotShared``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import warnings
from typing import Any

from _forkserver import announce, leave_once, say
from _parts import trainer_parts

RANK = int(os.environ.get("RANK", "0"))


def described(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{type(exc).__name__}: {exc}", "ranks": getattr(exc, "ranks", None),
            "hosts": getattr(exc, "hosts", None)}


def ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message}" for w in caught if w.category.__name__.startswith("TrainingStatus")]


def recorded(status: str, name: str) -> bool:
    """Does the status file list the folder ``name``? (Read as plain JSON: no lock of ours taken.)"""
    try:
        with open(status, "rb") as f:
            document = json.load(f)
    except (OSError, ValueError):
        return False
    return any(isinstance(e, dict) and e.get("file_path") == name
               for e in document.get("transformers", {}).get("checkpoints", []) or [])


def read_so_far() -> int:
    """Bytes this process has read through read() calls so far (``rchar``: files, pipes, sockets)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def wait_for(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def main() -> None:
    options = json.loads(sys.argv[1])
    if "cwd" in options:  # a relative dir: each node's own folder
        os.chdir(options["cwd"])
    announce()
    import torch
    from transformers import (
        PrinterCallback,
        ProgressCallback,
        Trainer,
        TrainerCallback,
        TrainerState,
        TrainingArguments,
    )
    from transformers.trainer_utils import get_last_checkpoint

    from trainstatus.integrations.transformers import TrainStatusCallback, last_complete_checkpoint

    torch.set_num_threads(1)
    directory = options["dir"]
    width = options.get("width", 32)
    every = options.get("every", 2)

    Tiny, Data = trainer_parts(width)

    def arguments(output_dir: str, max_steps: int, limit: int | None) -> Any:
        return TrainingArguments(output_dir=output_dir, max_steps=max_steps, save_strategy="steps", save_steps=every,
                                 save_total_limit=limit, per_device_train_batch_size=4, learning_rate=1e-2,
                                 logging_strategy="no", report_to="none", use_cpu=True, seed=options.get("seed", 0),
                                 disable_tqdm=True, ddp_backend="gloo", ddp_timeout=options.get("ddp_timeout", 300))

    def trainer(args: Any, callbacks: list[Any]) -> Any:
        made = Trainer(model=Tiny(), args=args, train_dataset=Data(256), callbacks=callbacks)
        for quiet in (PrinterCallback, ProgressCallback):
            made.remove_callback(quiet)
        return made

    args = arguments(directory, options["max_steps"], options.get("limit"))  # joins the process group
    resume = options.get("resume", "call")
    path = None
    if resume == "call":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            before = read_so_far()
            try:
                path = last_complete_checkpoint(directory, timeout=args.ddp_timeout)
            except Exception as exc:
                say(event="resumed", path=None, warnings=ours(caught), **described(exc))
                finish()
            read = read_so_far() - before
        say(event="resumed", path=path, warnings=ours(caught), error=None, read=read)

    if options.get("theirs"):
        theirs = get_last_checkpoint(directory) if os.path.isdir(directory) else None
        ok, error = None, None
        if theirs is not None and theirs == path:
            ok = True  # the same folder as ours: the resume below is its test
        elif theirs is not None:
            step = int(re.fullmatch(r"checkpoint-(\d+)", os.path.basename(theirs)).group(1))  # type: ignore[union-attr]
            with tempfile.TemporaryDirectory() as scratch:
                own = trainer(arguments(scratch, step + 1, None), [])
                try:  # what Trainer.train(resume_from_checkpoint=theirs) loads, in its order
                    own._load_from_checkpoint(theirs)
                    TrainerState.load_from_json(os.path.join(theirs, "trainer_state.json"))
                    own.create_optimizer_and_scheduler(num_training_steps=step + 1)
                    own._load_optimizer_and_scheduler(theirs)
                    own._load_rng_state(theirs)
                    ok = True
                except Exception as exc:
                    ok, error = False, f"{type(exc).__name__}: {exc}"[:300]
        say(event="theirs", path=theirs, ok=ok, error=error)

    slow = options.get("slow")
    if slow is not None and RANK == slow["rank"]:
        save_rng_state = Trainer._save_rng_state

        def held_back(self: Any, output_dir: str) -> None:
            step = self.state.global_step
            mode = slow["at"].get(str(step))
            if mode is None:
                save_rng_state(self, output_dir)
                return
            with tempfile.TemporaryDirectory() as scratch:
                save_rng_state(self, scratch)
                [name] = os.listdir(scratch)
                with open(os.path.join(scratch, name), "rb") as f:
                    data = f.read()
            os.makedirs(output_dir, exist_ok=True)  # as the Trainer's own does: rank 0 may not have made it yet
            target = os.path.join(output_dir, name)
            half = len(data) // 2 if mode == "half" else 0
            out = open(target, "wb") if half else None  # noqa: SIM115 - held open across the window
            if out is not None:
                out.write(data[:half])
                out.flush()
            arrived = os.path.join(slow["markers"], f"arrived-{step}")
            wait_for(lambda: os.path.exists(arrived), 120)
            status = os.path.join(os.path.abspath(directory), "training_status.json")
            seen = wait_for(lambda: recorded(status, f"checkpoint-{step}"), 3.0)
            say(event=f"window{step}", recorded=seen, written=half, size=len(data))
            if slow.get("hold"):
                time.sleep(600)  # killed here
            if out is None:
                out = open(target, "wb")  # noqa: SIM115
            with out:
                out.write(data[half:])

        Trainer._save_rng_state = held_back

    class Arrived(TrainerCallback):  # type: ignore[misc]
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if slow is not None and RANK == 0 and str(state.global_step) in slow["at"]:
                with open(os.path.join(slow["markers"], f"arrived-{state.global_step}"), "w"):
                    pass

    class Events(TrainerCallback):  # type: ignore[misc]
        begun = -1

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.begun = state.global_step
            say(event="ready", step=state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == self.begun + 1:  # the resumed state loaded, RNG states among it
                say(event="stepped", step=state.global_step)

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            say(event="saved", step=state.global_step)
            leave_once(options, RANK, state.global_step)  # recorded by then: TrainStatusCallback's on_save came first

    run = trainer(args, [Arrived(), TrainStatusCallback(), Events()])
    ended: dict[str, Any] = {"error": None}
    try:
        run.train(resume_from_checkpoint=True if resume is True else None if resume == "fresh" else path)
    except Exception as exc:
        ended = described(exc)
    say(event="done", step=run.state.global_step, **ended)
    finish()


def finish() -> None:
    # No teardown: the process group is not destroyed (a rank that raised alone would wait for the
    # other there), and the interpreter's exit after torch takes seconds.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
