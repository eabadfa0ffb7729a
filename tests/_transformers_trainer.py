"""A real Transformers Trainer run for tests/test_integration_transformers.py, run by .venv-torch's interpreter.

    python _transformers_trainer.py '<json options>'

A tiny ``torch.nn.Module`` (linear layers ``width`` wide, its ``forward`` returning the loss) trained
by ``transformers.Trainer`` on random tensors on the CPU (no hub: ``HF_HUB_OFFLINE=1``), saving
every ``every`` steps into ``dir`` with ``save_total_limit=limit`` and ``TrainStatusCallback``.
With ``"best": true`` it evaluates at each save, with ``metric_for_best_model="loss"`` and
``load_best_model_at_end``, on the training inputs with their targets negated: the better the
model fits, the worse its evaluation, so the best checkpoint is the first one. It resumes with
``trainer.train(resume_from_checkpoint=last_complete_checkpoint(dir))`` and trains up to
``max_steps`` (the global step, absolute).

With ``"theirs": true`` it first measures Transformers' own resume on the same folder:
``get_last_checkpoint(dir)``; when that is another folder than ours, a second Trainer (no callback,
its own scratch output_dir) resumes from it up to its own step and reports whether that failed.

With ``"fresh": true`` it starts at step 0 whatever ``last_complete_checkpoint`` found. With
``"resume"`` it passes that to ``train`` instead: ``true`` (the Trainer's own pick, which
``TrainStatusCallback`` routes to ``last_complete_checkpoint``) or a folder of ``dir`` (a run
rolled back to an older checkpoint).

With ``"kill_on_save": N`` a callback before ours SIGKILLs the process in ``on_save`` at step N:
the Trainer has written (and, with a limit of its own, rotated) but nothing is recorded yet.

It prints one JSON object a line, flushed: ``resumed`` (path, warnings, where), ``theirs`` (path, ok,
error), ``ready`` (step, best, limit, warnings, where: at on_train_begin, after our callback's),
``done`` (step, best, limit: args.save_total_limit after training; warnings, where; error: what
``train`` raised, or None) at the end. ``where`` says where each warning points (file:line): the
lines marked "the user's call".
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import warnings
from typing import Any

from _parts import trainer_parts


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message}" for w in caught if w.category.__name__.startswith("TrainingStatus")]


def where(caught: list[warnings.WarningMessage]) -> list[str]:
    """Where each of ``ours`` points: file name and line."""
    return [f"{os.path.basename(w.filename)}:{w.lineno}" for w in caught
            if w.category.__name__.startswith("TrainingStatus")]


def main() -> None:
    options = json.loads(sys.argv[1])
    if "cwd" in options:  # a relative dir: the Trainer then names folders relative to it too
        os.chdir(options["cwd"])
    import torch
    from transformers import (
        PrinterCallback,
        ProgressCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.trainer_utils import get_last_checkpoint

    from trainstatus.integrations.transformers import TrainStatusCallback, last_complete_checkpoint

    torch.set_num_threads(1)  # two cores shared by the suite: one each for trainer and checker
    directory = options["dir"]
    width = options.get("width", 32)
    every = options.get("every", 2)
    best = options.get("best", False)

    Tiny, Data = trainer_parts(width)

    def arguments(output_dir: str, max_steps: int, limit: int | None) -> Any:
        evaluate = {"eval_strategy": "steps", "eval_steps": every, "load_best_model_at_end": True,
                    "metric_for_best_model": "loss"} if best else {}
        return TrainingArguments(output_dir=output_dir, max_steps=max_steps, save_strategy="steps", save_steps=every,
                                 save_total_limit=limit, per_device_train_batch_size=8, learning_rate=1e-2,
                                 logging_strategy="no", report_to="none", use_cpu=True, seed=options.get("seed", 0),
                                 disable_tqdm=True, **evaluate)

    def trainer(output_dir: str, max_steps: int, limit: int | None, callbacks: list[Any]) -> Any:
        made = Trainer(model=Tiny(), args=arguments(output_dir, max_steps, limit), train_dataset=Data(64),
                       eval_dataset=Data(64, -1.0) if best else None, callbacks=callbacks)
        for quiet in (PrinterCallback, ProgressCallback):  # the Trainer's own prints: not our events
            made.remove_callback(quiet)
        return made

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = last_complete_checkpoint(directory, status_path=options.get("status_path"))  # the user's call
    say(event="resumed", path=path, warnings=ours(caught), where=where(caught))

    if options.get("theirs"):
        theirs = get_last_checkpoint(directory) if os.path.isdir(directory) else None
        ok, error = None, None
        if theirs is not None and theirs == path:
            ok = True  # the same folder as ours: the resume below is its test
        elif theirs is not None:
            step = int(re.fullmatch(r"checkpoint-(\d+)", os.path.basename(theirs)).group(1))  # type: ignore[union-attr]
            with tempfile.TemporaryDirectory() as scratch:
                try:
                    trainer(scratch, max(step, 1), None, []).train(resume_from_checkpoint=theirs)
                    ok = True
                except Exception as exc:  # what trainer.train(resume_from_checkpoint=get_last_checkpoint(...)) hits
                    ok, error = False, f"{type(exc).__name__}: {exc}"[:300]
        say(event="theirs", path=theirs, ok=ok, error=error)

    class Ready(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            say(event="ready", step=state.global_step, best=state.best_model_checkpoint,
                best_step=state.best_global_step, limit=args.save_total_limit, warnings=ours(training),
                where=where(training))

    class Kill(TrainerCallback):  # type: ignore[misc]
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == options.get("kill_on_save"):
                os.kill(os.getpid(), signal.SIGKILL)

    callback = TrainStatusCallback(status_path=options.get("status_path"))
    run = trainer(directory, options["max_steps"], options.get("limit"), [Kill(), callback, Ready()])
    resume = options.get("resume")
    if resume is not None and resume is not True:  # a folder of dir, as a user rolling back names it
        resume = os.path.join(directory, resume)
    error = None
    with warnings.catch_warnings(record=True) as training:
        warnings.simplefilter("always")
        try:
            run.train(resume_from_checkpoint=None if options.get("fresh") else resume or path)  # the user's call
        except Exception as exc:  # the run's end, reported: what trainer.train() raised
            error = f"{type(exc).__name__}: {exc}"
    say(event="done", step=run.state.global_step, best=run.state.best_model_checkpoint, limit=run.args.save_total_limit,
        warnings=ours(training), where=where(training), error=error)
    # The interpreter's teardown after torch and transformers takes seconds (2.6 s measured) and
    # nothing of the run happens in it: the suite runs these children a few dozen times.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
