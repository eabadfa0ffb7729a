"""Training with Hugging Face Accelerate and trainstatus.integrations.accelerate, for
tests/test_integration_accelerate.py, run by .venv-torch's interpreter:

    python -m torch.distributed.run --standalone --nproc_per_node=2 _accelerate_trainer.py '<json options>'
    python _accelerate_trainer.py '<json options>'          (one process)

An ``Accelerator`` on the CPU (gloo under torchrun) with ``ProjectConfiguration(project_dir=dir,
automatic_checkpoint_naming=True, total_limit=limit)``, a small model (linear layers ``width``
wide) under DDP, trained on data each process draws from its own torch RNG (seeded per process by
``set_seed(seed, device_specific=True)``): a resumed run sees the data an uninterrupted one sees
only if every process's RNG state was restored. A registered object counts the steps
(``custom_checkpoint_0.pkl``). Each step is trained, then saved, up to step ``steps``:

- ``"mode": "ours"`` (the default): ``load_state(accelerator)`` of trainstatus first, then
  ``save_state(accelerator)`` after every step. With ``"theirs": true`` every process first tries
  Accelerate's own resume on the same folder: ``accelerator.load_state()`` (the highest-numbered
  ``checkpoint_<n>``), reports it, and puts the state it had back before ours loads.
- ``"mode": "accelerate"``: Accelerate's own way throughout: ``accelerator.load_state()`` (a
  failure is reported and the run goes on from scratch), then ``accelerator.save_state()``.
- ``"mode": "mixed"``: Accelerate's own ``accelerator.load_state()``, then trainstatus'
  ``save_state``: the counter not advanced by the load.

``"role": "api"``: see ``api`` below.

Each process prints one JSON object a line (tests/_forkserver.py ``say``), with ``event``, ``rank``,
``run`` (the fork server's run number) and ``t``:

- ``pid``;
- ``theirs`` (path, ok, error, rng, fresh: the RNG's digest before the load, rng_file: whether the
  folder holds this process's ``random_states_<rank>.pkl``, step);
- ``resumed`` (path, step, counter, rng, warnings, where: the ``file:line`` each points at, error);
- ``save-begin`` (step, counter, rng: the digest of the torch RNG state the save records, params:
  with ``"params": true``, the digest of the parameters);
- ``writing`` and ``written`` (step: Accelerate's own save begins, and returned, inside
  trainstatus' ``save_state``; gone: the folders the status file lists that are not on disk then,
  main process);
- ``saved`` (step, path, warnings, where, folders: the checkpoint folders on disk after it, main
  process);
- ``error`` (step, type, message: a save that raised);
- ``done`` (step, digest of the parameters, main process).

``serve``: tests/_forkserver.py's fork server, torch and Accelerate imported once: each run's
workers are forked with the environment torchrun gives its workers (none with ``"world": 1``: one
process alone, as ``python _accelerate_trainer.py`` starts it), each running the options above.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import re
import sys
import warnings
from typing import Any

import _forkserver
from _forkserver import announce, leave_once, say
from _parts import Progress


def ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message}" for w in caught if w.category.__name__.startswith("TrainingStatus")]


def where(caught: list[warnings.WarningMessage]) -> list[str]:
    """``file:line`` each of our warnings points at."""
    return [f"{os.path.basename(w.filename)}:{w.lineno}" for w in caught
            if w.category.__name__.startswith("TrainingStatus")]


def listed_but_gone(directory: str) -> list[str]:
    """The folders the status file lists that are not on disk (read as plain JSON: no lock taken)."""
    try:
        with open(os.path.join(directory, "training_status.json"), "rb") as f:
            entries = json.load(f).get("accelerate", {}).get("checkpoints", [])
    except (OSError, ValueError):
        return []
    return [e["file_path"] for e in entries if not os.path.isdir(os.path.join(directory, e["file_path"]))]


def folders(directory: str) -> list[str]:
    folder = os.path.join(directory, "checkpoints")
    found = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted((name for name in found if re.fullmatch(r"checkpoint_\d+", name)), key=lambda n: int(n.split("_")[1]))


def run(options: dict[str, Any]) -> None:
    announce()
    import datetime

    import numpy as np
    import torch
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration, set_seed

    from trainstatus.integrations.accelerate import load_state, save_state

    torch.set_num_threads(1)
    directory, width, mode = options["dir"], options.get("width", 256), options.get("mode", "ours")
    accelerator = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=directory, automatic_checkpoint_naming=True,
                                            total_limit=options.get("limit", 2)),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=options.get("timeout", 120)))],
    )
    set_seed(options.get("seed", 0), device_specific=True)

    progress = Progress()
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(progress)

    own_save = accelerator.save_state

    def save_told(*args: Any, **kwargs: Any) -> Any:  # Accelerate's own save, between two events
        say(event="writing", step=progress.step)
        saved = own_save(*args, **kwargs)
        say(event="written", step=progress.step, gone=gone() if accelerator.is_main_process else None)
        return saved

    accelerator.save_state = save_told  # what trainstatus' save_state calls

    def gone() -> list[str]:
        return listed_but_gone(directory)

    def parameters() -> str:
        sha = hashlib.sha256()
        for name, tensor in sorted(accelerator.unwrap_model(model).state_dict().items()):
            sha.update(name.encode())
            sha.update(tensor.detach().numpy().tobytes())
        return sha.hexdigest()

    def rng() -> str:
        return hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]

    def theirs() -> tuple[str | None, bool | None, str | None]:
        """Accelerate's own resume: the highest-numbered folder, loaded by accelerator.load_state()."""
        found = folders(directory)
        if not found:
            return None, None, None
        try:
            accelerator.load_state()
        except Exception as exc:
            return os.path.join(directory, "checkpoints", found[-1]), False, f"{type(exc).__name__}: {exc}"[:300]
        return os.path.join(directory, "checkpoints", found[-1]), True, None

    def own_rng_file(path: str | None) -> bool | None:
        """Whether the folder holds this process's RNG state (Accelerate loads it without, in silence)."""
        rank = int(os.environ.get("RANK", "0"))
        return None if path is None else os.path.exists(os.path.join(path, f"random_states_{rank}.pkl"))

    if mode == "ours" and options.get("theirs"):
        kept = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()), torch.get_rng_state(),
                random.getstate(), np.random.get_state(), progress.step, accelerator.step)
        fresh = rng()
        path = (folders(directory) or [None])[-1]
        rng_file = own_rng_file(None if path is None else os.path.join(directory, "checkpoints", path))
        path, ok, error = theirs()
        say(event="theirs", path=path, ok=ok, error=error, rng=rng(), fresh=fresh, rng_file=rng_file,
            step=progress.step)
        model.load_state_dict(kept[0])
        optimizer.load_state_dict(kept[1])
        torch.set_rng_state(kept[2])
        random.setstate(kept[3])
        np.random.set_state(kept[4])
        progress.step, accelerator.step = kept[5], kept[6]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        error = None
        path = None
        if mode == "ours":
            path = load_state(accelerator)  # the user's call
        else:
            path, ok, error = theirs()
    say(event="resumed", path=path, step=progress.step, counter=accelerator.project_configuration.iteration,
        rng=rng(), warnings=ours(caught), where=where(caught), error=error)

    while progress.step < options["steps"]:
        x, y = torch.randn(8, 8), torch.randn(8, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        progress.step += 1
        say(event="save-begin", step=progress.step, counter=accelerator.project_configuration.iteration, rng=rng(),
            params=parameters() if options.get("params") else None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                saved = save_state(accelerator) if mode != "accelerate" else accelerator.save_state()  # the user's call
            except Exception as exc:
                say(event="error", step=progress.step, type=type(exc).__name__, message=str(exc))
                break
        say(event="saved", step=progress.step, path=os.fspath(saved), warnings=ours(caught), where=where(caught),
            folders=folders(directory) if accelerator.is_main_process else None)
        leave_once(options, accelerator.process_index, progress.step)

    digest = parameters() if accelerator.is_main_process else None
    accelerator.end_training()  # destroys the process group: without it torch may abort at exit
    say(event="done", step=progress.step, digest=digest)
    sys.stdout.flush()
    os._exit(0)  # the interpreter's teardown after torch takes seconds


def api(options: dict[str, Any]) -> None:
    """``"role": "api"``: one process, no launcher. The calls' answers and errors on the project
    folder ``project`` (a copy of a run's), then a run saving into folders of its own choosing
    under ``explicit`` (no automatic naming). Prints one ``api`` event: each call's value or error,
    with its warnings."""
    import torch
    from accelerate import Accelerator

    from trainstatus import StatusStore
    from trainstatus.integrations.accelerate import last_complete_checkpoint, load_state, save_state

    results: dict[str, Any] = {}

    def attempt(label: str, call: Any) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                results[label] = {"value": call(), "warnings": ours(caught)}
            except Exception as exc:
                results[label] = {"error": f"{type(exc).__name__}: {exc}", "warnings": ours(caught)}

    project, explicit = options["project"], options["explicit"]
    attempt("project", lambda: last_complete_checkpoint(project))
    attempt("checkpoints", lambda: last_complete_checkpoint(os.path.join(project, "checkpoints")))
    attempt("folder", lambda: last_complete_checkpoint(os.path.join(project, "checkpoints", "checkpoint_3")))
    attempt("not an accelerator", lambda: save_state(object()))  # type: ignore[arg-type]
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(4, 2))
    attempt("no input_dir", lambda: load_state(accelerator))
    attempt("no output_dir", lambda: save_state(accelerator))
    config = accelerator.project_configuration
    config.automatic_checkpoint_naming = True
    attempt("no project_dir", lambda: save_state(accelerator))
    config.automatic_checkpoint_naming = False
    attempt("save a", lambda: save_state(accelerator, os.path.join(explicit, "a")))
    attempt("save b", lambda: save_state(accelerator, os.path.join(explicit, "b")))
    config.iteration = 0  # a new run: load_state sets the counter after what it loads
    attempt("load", lambda: load_state(accelerator, explicit))
    results["counter"] = config.iteration
    attempt("save a again", lambda: save_state(accelerator, os.path.join(explicit, "a")))
    with StatusStore(os.path.join(explicit, "training_status.json")) as store:
        results["entries"] = [(e["steps"], e["file_path"]) for e in store.get("accelerate", "checkpoints")]
    # A sharded save (FSDP's pytorch_model_fsdp_0/, a torch.distributed.checkpoint folder, written
    # here by a save hook), its shard cut short before the second record: the size check passes,
    # .metadata does not.
    import torch.distributed.checkpoint as dcp

    def shards(models: Any, weights: Any, output_dir: str) -> None:
        folder = os.path.join(output_dir, "pytorch_model_fsdp_0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.distributed is disabled ... assuming single process"
            dcp.save({"w": torch.arange(4096.0)}, checkpoint_id=folder)
        if output_dir.endswith("checkpoint_1"):
            shard = os.path.join(folder, "__0_0.distcp")
            os.truncate(shard, os.path.getsize(shard) // 2)

    config.project_dir, config.automatic_checkpoint_naming, config.iteration = options["sharded"], True, 0
    accelerator.register_save_state_pre_hook(shards)
    attempt("sharded 0", lambda: save_state(accelerator))
    attempt("sharded 1", lambda: save_state(accelerator))
    attempt("sharded", lambda: last_complete_checkpoint(options["sharded"]))
    say(event="api", results=results)
    sys.stdout.flush()
    os._exit(0)


def serve() -> None:
    """The fork server (tests/_forkserver.py), torch and Accelerate imported once for every worker."""
    import accelerate  # noqa: F401
    import numpy  # noqa: F401
    import torch

    import trainstatus.integrations.accelerate  # noqa: F401

    torch.set_num_threads(1)
    _forkserver.serve(lambda options: (api if options.get("role") == "api" else run)(options))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    elif json.loads(sys.argv[1]).get("role") == "api":
        api(json.loads(sys.argv[1]))
    else:
        run(json.loads(sys.argv[1]))
