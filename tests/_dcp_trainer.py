"""Training with ``torch.distributed.checkpoint`` and trainstatus.integrations.dcp, for
tests/test_integration_dcp.py, run by .venv-torch's interpreter.

    python -m torch.distributed.run --standalone --nproc_per_node=2 _dcp_trainer.py '<json options>'
    RANK=.. WORLD_SIZE=2 MASTER_ADDR=.. MASTER_PORT=.. python _dcp_trainer.py '<json options>'
    python _dcp_trainer.py '{"role": "alone", ...}'
    python _dcp_trainer.py serve <folder>     # the fork server (tests/_forkserver.py) of the kill campaigns

``"role": "train"`` (the default): a small model (linear layers ``width`` wide) sharded with FSDP2
(``fully_shard``) on the gloo process group the launcher's environment describes, trained on data
drawn from a generator seeded by the step and the rank (an uninterrupted run and a resumed one see
the same data at every step), with AdamW. It resumes with ``last_complete_checkpoint(dir)`` and
``dcp.load`` of the model's and the optimizer's state (``get_state_dict``/``set_state_dict``), then
saves every step into ``dir/step-<n>``, with ``dcp.save`` at odd steps and
``dcp.async_save(...).result()`` at even ones, and calls ``record(folder, step, keep=keep)``, up to
step ``steps``. At the end rank 0 prints the SHA-256 of the full parameters (gathered).

``inplace``: every step saved into ``dir/latest`` with ``trainstatus.integrations.dcp.save`` (the
step kept in the state as ``step``), each ``recorded`` event with the SHA-256 of the model as it
lies on disk (rank 0, ``disk_digest``); ``theirs`` then loads ``latest`` and says its digest;
``die_in_write`` ([rank, step]) makes that rank's writer ``os._exit`` once the save is planned,
before its shard is written.

Options of that role for the tests: ``theirs`` (before the resume, every rank loads the highest
``step-*`` folder alone, ``no_dist=True``, into a model and optimizer of its own: what a loop without
trainstatus resumes from), ``late`` (rank 1 writes a file of its own into the folder after the save,
half of it, then the rest 2 s later, and only then reaches ``record``), ``exit_before_record`` (that
rank leaves with ``os._exit`` after its save returned), ``exit_after`` ([rank, name]: that rank leaves
once its first call of the ``torch.distributed`` function ``name`` returned: ``"monitored_barrier"``
is the record's barrier, which neither DCP nor FSDP calls), ``hold_before_record``
(that rank reads a line of stdin first), ``exit_once`` ([rank, step]: that rank leaves once the step
is recorded, in a ``torchrun --max-restarts`` run's first attempt: tests/_forkserver.py ``leave_once``), ``linger`` (after an error, wait for stdin's end before
leaving), ``timeout`` (given to ``record`` and ``last_complete_checkpoint``). SIGUSR1 prints every
thread's stack to stderr (the tests ask for it before failing on a child that hangs).

``"role": "alone"``: one process, no process group; the scenarios ``scenarios`` of
tests/test_integration_dcp.py on a plain module (see ``alone``).

It prints one JSON object a line (tests/_forkserver.py ``say``), each with ``event``, ``rank`` and ``t``:
``pid``, ``theirs`` (path, ok, error), ``resumed`` (path, step, warnings, seconds), ``save-begin``
and ``save-end`` (step), ``arrive`` (rank 1, late), ``recorded`` (step, files, seconds), ``error``
(what a trainstatus call raised: type, message, ranks, hosts, seconds), ``done`` (step, digest).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
import warnings
from typing import Any

import _forkserver
from _forkserver import announce, leave_once, say


def ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message}" for w in caught if w.category.__name__.startswith("TrainingStatus")]


def failed(exc: BaseException, started: float) -> None:
    say(event="error", type=type(exc).__name__, message=str(exc), ranks=getattr(exc, "ranks", None),
        hosts=getattr(exc, "hosts", None), seconds=time.monotonic() - started)


def highest(directory: str) -> str | None:
    """The highest ``step-<n>`` folder of ``directory``: what a loop without trainstatus resumes from."""
    steps = [int(m.group(1)) for m in map(re.compile(r"step-(\d+)").fullmatch, os.listdir(directory)) if m] \
        if os.path.isdir(directory) else []
    return os.path.join(directory, f"step-{max(steps)}") if steps else None


def disk_digest(folder: str) -> str:
    """The SHA-256 of the model's full parameters as they lie in the DCP folder ``folder`` (read in
    this process alone: ``dcp_to_torch_save``), to tell a whole save from one that mixes two."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch:
        target = os.path.join(scratch, "full.pt")
        dcp_to_torch_save(folder, target)
        full = torch.load(target, weights_only=False)
    sha = hashlib.sha256()
    for name in sorted(full["model"]):
        sha.update(name.encode())
        sha.update(full["model"][name].numpy().tobytes())
    return sha.hexdigest()


def train(options: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    from trainstatus import TrainingStatusError
    from trainstatus.integrations.dcp import last_complete_checkpoint, record
    from trainstatus.integrations.dcp import save as save_in_place

    torch.set_num_threads(1)
    if "exit_after" in options:  # [rank, a torch.distributed function]: that rank leaves after its first call
        leaving, name = options["exit_after"]
        original = getattr(dist, name)

        def then_exit(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if dist.get_rank() == leaving:
                os._exit(3)
            return result

        setattr(dist, name, then_exit)  # trainstatus looks it up on torch.distributed at each call
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    announce()
    directory, timeout, width = options["dir"], options.get("timeout", 120), options.get("width", 512)

    def build() -> tuple[Any, Any]:
        torch.manual_seed(0)  # every rank builds the same model, then keeps its shard
        made = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                   torch.nn.ReLU(), torch.nn.Linear(width, 8))
        for layer in made:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(made)
        return made, torch.optim.AdamW(made.parameters(), lr=1e-2)

    def state(model: Any, optimizer: Any) -> dict[str, Any]:
        # Before the optimizer's first step, get_state_dict makes its state with a step of lr 0:
        # AdamW's step count is then one ahead (of no consequence when a load follows).
        model_state, optimizer_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optim": optimizer_state}

    def linger() -> None:
        if options.get("linger"):
            sys.stdin.read()  # the test closes stdin once the other rank is done

    inplace = options.get("inplace", False)
    if options.get("theirs"):
        theirs, ok, error = highest(directory), None, None
        if inplace:
            theirs = os.path.join(directory, "latest") if os.path.isdir(os.path.join(directory, "latest")) else None
        if theirs is not None:
            copy = state(*build())  # a model and optimizer of its own: this one's must not be touched
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
                    dcp.load(copy, checkpoint_id=theirs, no_dist=True)
                ok = True
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - what dcp.load(<highest step-*>) raises
                ok, error = False, f"{type(exc).__name__}: {exc}"[:300]
        digest = None
        if inplace and ok and rank == 0:
            try:
                digest = disk_digest(theirs)
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - loaded, yet not whole: a digest of no step
                digest = f"unreadable ({type(exc).__name__})"
        say(event="theirs", path=theirs, ok=ok, error=error, digest=digest)

    started = time.monotonic()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            path = last_complete_checkpoint(directory, timeout=timeout)
    except TrainingStatusError as exc:
        failed(exc, started)
        linger()
        return
    seconds = time.monotonic() - started
    model, optimizer = build()
    start = 0
    if path is not None:
        loaded = state(model, optimizer)
        if inplace:
            loaded["step"] = torch.tensor(0)
        dcp.load(loaded, checkpoint_id=path)
        start = int(loaded["step"]) if inplace else int(os.path.basename(path).split("-")[1])
        set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    say(event="resumed", path=path, step=start, warnings=ours(caught), seconds=seconds)

    for step in range(start + 1, options["steps"] + 1):
        generator = torch.Generator().manual_seed(step * 1000 + rank)
        x, y = torch.randn(16, width, generator=generator), torch.randn(16, 8, generator=generator)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        folder = os.path.join(directory, f"step-{step}")
        say(event="save-begin", step=step)
        if inplace:
            folder = os.path.join(directory, "latest")
            writer = dcp.FileSystemWriter(folder)
            if options.get("die_in_write") == [rank, step]:
                class Dying(dcp.FileSystemWriter):  # type: ignore[misc]
                    def write_data(self, plan: Any, planner: Any) -> Any:
                        os._exit(9)  # planned with the others, killed before its shard is written

                writer = Dying(folder)
            try:
                entry = save_in_place({**state(model, optimizer), "step": torch.tensor(step)}, folder, step,
                                      keep=options.get("keep"), timeout=timeout, storage_writer=writer)
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - rank 0, after rank 1 died
                failed(exc, time.monotonic())
                linger()
                return
            say(event="recorded", step=step, files=entry["files"], seconds=0.0,
                digest=disk_digest(folder) if rank == 0 else None)
            leave_once(options, rank, step)
            continue
        if step % 2:
            dcp.save(state(model, optimizer), checkpoint_id=folder)
        else:
            dcp.async_save(state(model, optimizer), checkpoint_id=folder).result()
        say(event="save-end", step=step)
        if options.get("exit_before_record") == rank:
            os._exit(3)
        if options.get("hold_before_record") == rank:
            sys.stdin.readline()
        if options.get("late") and rank == 1:
            with open(os.path.join(folder, "extra-rank1.bin"), "wb") as f:
                f.write(b"1" * 50_000)
                f.flush()
                time.sleep(2)  # rank 1 reaches record() 2 s after rank 0, its file half written meanwhile
                f.write(b"1" * 50_000)
            say(event="arrive", step=step)
        started = time.monotonic()
        try:
            entry = record(folder, step, keep=options.get("keep"), timeout=timeout)
        except TrainingStatusError as exc:
            failed(exc, started)
            linger()
            return
        say(event="recorded", step=step, files=entry["files"], seconds=time.monotonic() - started)
        leave_once(options, rank, step)

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    digest = None
    if rank == 0:
        sha = hashlib.sha256()
        for name in sorted(full):
            sha.update(name.encode())
            sha.update(full[name].numpy().tobytes())
        digest = sha.hexdigest()
    dist.destroy_process_group()
    say(event="done", step=options["steps"], digest=digest)


def alone(options: dict[str, Any]) -> None:
    """One process, no process group: each of ``scenarios`` in a folder of its own under ``dir``,
    its events marked with its name.

    - ``keep``: saves steps 1-5 with ``record(..., keep=2)``; each removal of a file of a step
      folder reports what the status file on disk listed at that moment (``removing``); then
      ``last_complete_checkpoint`` and a ``dcp.load`` of it (``loaded``: the weights saved at step 5).
    - ``no_metadata``: records a folder holding a shard but no ``.metadata``.
    - ``truncated``: saves steps 1-4, cuts step-3's shard to half and removes step-4's, resumes.
    - ``past_end``: saves steps 1-2, cuts step-2's shard to half and records that size in the
      status file (a size check passes), resumes.
    - ``rolled_back``: saves steps 1-4, then step 2 again (a run resumed from step 1), resumes.
    - ``boundary``: saves steps 1-2; step-2's shard ends where its last chunk ends (``end``: start
      and end of that chunk, the shard's size, from torch's own reader); resumes with it as saved,
      then grown by one byte, then cut by one byte, each size recorded (a size check passes).
    Events: ``imported`` first (the torch modules loaded by the import, and by a resume that finds
    nothing recorded), then per scenario ``folders``, ``removing``, ``entries`` (the recorded steps and
    files), ``end``, ``resumed`` (path, warnings), ``loaded``, ``error``.
    """
    from trainstatus import StatusStore, TrainingStatusError
    from trainstatus.integrations.dcp import last_complete_checkpoint, record

    base = options["dir"]
    os.makedirs(base, exist_ok=True)
    say(event="imported", torch=sorted(m for m in sys.modules if m.split(".")[0] == "torch"),
        fresh=last_complete_checkpoint(base))

    import torch
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(64, 64)

    for scenario in options["scenarios"]:
        directory = os.path.join(base, scenario)
        status = os.path.join(directory, "training_status.json")

        def tell(**fields: Any) -> None:
            say(scenario=scenario, **fields)  # noqa: B023 - called in this iteration only

        def save(step: int) -> str:
            with torch.no_grad():
                model.weight.fill_(float(step))
            folder = os.path.join(directory, f"step-{step}")  # noqa: B023
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
                dcp.save({"model": model.state_dict()}, checkpoint_id=folder)
            return folder

        def entries() -> None:
            with StatusStore(status) as store:  # noqa: B023
                listed = store.get("dcp", "checkpoints") or []
            tell(event="entries", steps=[e["steps"] for e in listed], files=[e["files"] for e in listed])

        def resume() -> None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                path = last_complete_checkpoint(directory)  # noqa: B023
            tell(event="resumed", path=path, warnings=ours(caught))

        try:
            if scenario == "keep":
                removing = os.remove

                def watched(path: Any, *args: Any, **kwargs: Any) -> None:
                    if os.path.basename(os.path.dirname(os.fspath(path))).startswith("step-"):
                        with open(status, "rb") as f:  # noqa: B023
                            listed = [e["steps"] for e in json.load(f)["dcp"]["checkpoints"]]
                        tell(event="removing", path=os.path.relpath(path, directory), listed=listed)  # noqa: B023
                    removing(path, *args, **kwargs)  # noqa: B023 - os.remove, the same in every iteration

                os.remove = watched
                try:
                    for step in range(1, 6):
                        record(save(step), step, keep=2)
                        tell(event="folders", names=sorted(n for n in os.listdir(directory) if n.startswith("step-")))
                finally:
                    os.remove = removing
                entries()
                resume()
                with torch.no_grad():
                    model.weight.zero_()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    dcp.load({"model": model.state_dict()}, checkpoint_id=os.path.join(directory, "step-5"))
                tell(event="loaded", weight=model.weight.detach().unique().tolist())
            elif scenario == "no_metadata":
                folder = save(1)
                os.remove(os.path.join(folder, ".metadata"))
                record(folder, 1)
            elif scenario == "truncated":
                for step in (1, 2, 3, 4):
                    record(save(step), step)
                shard = os.path.join(directory, "step-3", "__0_0.distcp")
                os.truncate(shard, os.path.getsize(shard) // 2)
                os.remove(os.path.join(directory, "step-4", "__0_0.distcp"))
                resume()
                entries()
            elif scenario == "past_end":
                for step in (1, 2):
                    record(save(step), step)
                shard = os.path.join(directory, "step-2", "__0_0.distcp")
                half = os.path.getsize(shard) // 2
                os.truncate(shard, half)
                with StatusStore(status) as store:
                    listed = store.get("dcp", "checkpoints")
                    listed[-1]["files"]["step-2/__0_0.distcp"] = half
                    store.set("dcp", "checkpoints", listed)
                resume()
                entries()
            elif scenario == "boundary":
                from torch.distributed.checkpoint import FileSystemReader

                for step in (1, 2):
                    record(save(step), step)
                shard = os.path.join(directory, "step-2", "__0_0.distcp")
                chunks = [(info.offset, info.offset + info.length) for info in
                          FileSystemReader(os.path.join(directory, "step-2")).read_metadata().storage_data.values()
                          if info.relative_path == "__0_0.distcp"]
                start, end = max(chunks, key=lambda chunk: chunk[1])
                tell(event="end", start=start, end=end, size=os.path.getsize(shard))
                for size in (end, end + 1, end - 1):
                    os.truncate(shard, size)  # grows it too (with a zero byte)
                    with StatusStore(status) as store:
                        listed = store.get("dcp", "checkpoints")
                        listed[-1]["files"]["step-2/__0_0.distcp"] = size
                        store.set("dcp", "checkpoints", listed)
                    resume()
                entries()
            elif scenario == "rolled_back":
                for step in (1, 2, 3, 4):
                    record(save(step), step)
                record(save(2), 2)  # resumed from step-1, saved step 2 again
                entries()
                resume()
            else:
                raise ValueError(f"no scenario {scenario!r}")
        except TrainingStatusError as exc:
            tell(event="error", type=type(exc).__name__, message=str(exc))
            entries()


def main() -> None:
    options = json.loads(sys.argv[1])
    if options.get("role", "train") == "alone":
        alone(options)
    else:
        train(options)
    # The interpreter's teardown after torch takes seconds and nothing of the run happens in it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve() -> None:
    """The fork server (tests/_forkserver.py): torch, FSDP and DCP imported once for every worker of
    the kill campaigns (each launch of a fresh interpreter spent seconds importing them)."""
    import torch.distributed.checkpoint
    import torch.distributed.checkpoint.state_dict
    import torch.distributed.fsdp  # noqa: F401

    import trainstatus.integrations.dcp  # noqa: F401

    _forkserver.serve(train)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        main()
