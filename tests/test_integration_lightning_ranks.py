"""trainstatus.integrations.lightning on several processes: Lightning's DDP and its sharded saves.

Lightning's real strategies on 2 CPU processes with gloo (tests/_lightning_ranks.py): ``DDPStrategy``
(rank 0 saves each ``.ckpt`` through the plugin), ``ModelParallelStrategy`` (FSDP2 on CPU: every
rank saves a DCP folder past ``CheckpointIO``, recorded by ``TrainStatusCallback``), and a DDP
strategy of the test's own that saves DCP folders with one file per rank, rank 1's slow.
``FSDPStrategy`` needs a GPU (FSDP1 refuses a CPU device) and DeepSpeed is not installed: their
save code is read, not run (docs/lightning.md).

One test runs the real ``torchrun``; the others fork their workers from a process that imported
torch and Lightning once, with torchrun's environment (see tests/_lightning_ranks.py): a run then
starts in about a second, which the kill test's twenty restarts need. Every worker is killed by pid
if it is still there at the end of its test. All tests are in the ``integrations`` group.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _launch
import pytest
from _launch import Run, Workers, alive, elastic, restarted
from _trainer_child import OwnResume

RANKS = Path(__file__).resolve().parent / "_lightning_ranks.py"
BOUND = 120.0  # seconds: a generous bound for "within a bound"
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def workers(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """tests/_lightning_ranks.py's fork server (tests/_forkserver.py)."""
    with Workers(torch_python, RANKS, tmp_path_factory.mktemp("lightning-ranks"), bound=BOUND) as server:
        yield server


@pytest.fixture
def fresh(workers: Workers) -> Iterator[Workers]:
    """The server; no worker of a run the test started outlives the test."""
    with workers.owned():
        yield workers


finished = Run.finished  # every rank's "done", and every worker ended with 0


def saving(run: Run) -> bool:
    """Whether a save had begun and not ended on some rank, as far as the events say."""
    begun: dict[int, int] = {}
    for f in run.events:
        if f["event"] in ("save-begin", "save-end"):
            begun[f["rank"]] = begun.get(f["rank"], 0) + (1 if f["event"] == "save-begin" else -1)
    return any(begun.values())


def recorded(directory: Path) -> list[dict[str, Any]]:
    return _launch.recorded(directory / "training_status.json", "lightning")


def newest(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The entry last_complete_checkpoint picks when all are whole: highest steps, then the later listed."""
    return max(enumerate(entries), key=lambda item: (item[1]["steps"], item[0]))[1] if entries else None


# -- DDP ------------------------------------------------------------------------------------------


def test_ddp_under_torchrun_resumes_both_ranks_from_one_decision(torch_python: Path, fresh: Workers,
                                                                  tmp_path: Path) -> None:
    # A first run saves (rank 0, through the plugin); then the real torchrun, as a user starts it,
    # with the process group made before last_complete_checkpoint: one decision, read by rank 0
    # alone, the same path on both ranks, and training goes on from it.
    directory = tmp_path / "ckpts"
    finished(fresh.start(dir=str(directory), max_steps=6, every=2))
    entries = recorded(directory)  # each .ckpt written by rank 0 alone: no world_size
    assert [(e["steps"], e["file_path"], "world_size" in e) for e in entries] == [
        (4, "epoch=0-step=4.ckpt", False), (6, "epoch=0-step=6.ckpt", False), (6, "last.ckpt", False)]
    options = {"dir": str(directory), "max_steps": 10, "every": 2, "init_first": True}
    done = subprocess.run([str(torch_python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(RANKS), json.dumps(options)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}, check=False)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert not [e["pid"] for e in events if e["event"] == "pid" and alive(e["pid"])]
    assert done.returncode == 0, done.stderr[-5000:]

    def each(name: str) -> list[dict[str, Any]]:
        return [next(e for e in events if e["event"] == name and e["rank"] == rank) for rank in (0, 1)]

    resumed, ready = each("resumed"), each("ready")
    assert [e["path"] for e in resumed] == [str(directory / "last.ckpt")] * 2
    assert [e["reads"] for e in resumed] == [1, 0]  # rank 0 read; rank 1 was told
    assert [(e["step"], e["reads"]) for e in ready] == [(6, 1), (6, 0)]  # no second decision at set-up
    assert [e["step"] for e in each("done")] == [10, 10]
    assert [(e["steps"], e["file_path"]) for e in recorded(directory)][-3:] == [
        (8, "epoch=0-step=8.ckpt"), (10, "epoch=1-step=10.ckpt"), (10, "last.ckpt")]


def test_ranks_that_decided_alone_are_checked_together_at_set_up(fresh: Workers, tmp_path: Path) -> None:
    # Without a process group before fit (Lightning makes it inside), each rank reads alone;
    # TrainStatusCallback takes the decision again at set-up, rank 0 reading.
    directory = tmp_path / "ckpts"
    finished(fresh.start(dir=str(directory), max_steps=4, every=2))
    run = fresh.start(dir=str(directory), max_steps=6, every=2)
    assert [(e["path"], e["reads"]) for e in run.each("resumed")] == [(str(directory / "last.ckpt"), 1)] * 2
    assert [(e["step"], e["reads"]) for e in run.each("ready")] == [(4, 2), (4, 1)]
    finished(run)


NOT_SHARED = ("TrainingStatusCheckpointNotShared", "Not every rank can resume from the newest complete checkpoint of "
              "{folder}: rank 1 on {host}: {missing} is not there. Every rank must see the same checkpoint folder "
              "(rank 1 cannot), so none resumes. Put the checkpoints on storage every node mounts at the same path (a "
              "shared filesystem), or copy the folder to every node's path, and start again.")


@pytest.mark.parametrize("init_first", [True, False], ids=["group-before-the-call", "group-made-by-lightning"])
def test_a_rank_that_cannot_see_the_checkpoint_makes_every_rank_raise_the_same_error(
        fresh: Workers, tmp_path: Path, init_first: bool) -> None:
    # Node-local folders: the same path ("ckpts", relative), other files (each rank works in a
    # folder of its own). Rank 0's holds the checkpoints, rank 1's none. Both ranks raise the same
    # error, naming rank 1, before anything is loaded; no hang. With the group made by Lightning,
    # the callback's check at set-up raises it.
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    node0.mkdir()
    node1.mkdir()
    finished(fresh.start(dir="ckpts", cwd=[str(node0), str(node0)], max_steps=4, every=2))
    run = fresh.start(dir="ckpts", cwd=[str(node0), str(node1)], max_steps=6, every=2,
                      init_first=init_first)
    if not init_first:  # each rank read its own folder alone
        assert [e["path"] for e in run.each("resumed")] == ["ckpts/last.ckpt", None]
    errors = run.each("error")
    missing = node1 / "ckpts" / "last.ckpt"
    assert [(e["type"], e["message"], e["ranks"]) for e in errors] == [
        (NOT_SHARED[0], NOT_SHARED[1].format(folder="ckpts" if init_first else node0 / "ckpts", host=HOST,
                                             missing=missing), [1])] * 2
    assert max(e["seconds"] for e in errors) < BOUND
    run.exits()
    assert not [e for e in run.events if e["event"] == "ready"]  # neither rank trained


def test_a_rank_given_another_checkpoint_than_rank_0_makes_every_rank_raise_the_same_error(
        fresh: Workers, tmp_path: Path) -> None:
    # The other way round: rank 0's folder is empty (it resumes from nothing), rank 1's holds the
    # checkpoints. Every rank sees what rank 0 chose (nothing); the callback's set-up check still
    # finds rank 1 given another answer, and both ranks raise the same error before any training.
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    node0.mkdir()
    node1.mkdir()
    finished(fresh.start(dir="ckpts", cwd=[str(node1), str(node1)], max_steps=4, every=2))
    run = fresh.start(dir="ckpts", cwd=[str(node0), str(node1)], max_steps=6, every=2)
    assert [e["path"] for e in run.each("resumed")] == [None, "ckpts/last.ckpt"]
    errors = run.each("error")
    assert [(e["type"], e["message"], e["ranks"]) for e in errors] == [(
        "TrainingStatusCheckpointNotShared",
        f"Not every rank resumes from the same checkpoint: rank 0 resumes from nothing of {node0 / 'ckpts'}, but "
        f"last_complete_checkpoint() answered rank 1 on {HOST} with 'last.ckpt', having read another status file or "
        "folder. No rank resumes. Every rank must see the same checkpoint folder and status file (a shared filesystem "
        "mounted on every node): give every rank the same dirpath and status_path.", [1])] * 2
    run.exits()
    assert not [e for e in run.events if e["event"] == "ready"]


# -- sharded saves --------------------------------------------------------------------------------


def folder_files(entry: dict[str, Any]) -> list[str]:
    return sorted(os.path.relpath(name, entry["file_path"]) for name in entry["files"])


def test_model_parallel_sharded_saves_are_recorded_and_resumed_on_both_ranks(fresh: Workers, tmp_path: Path) -> None:
    # ModelParallelStrategy saves DCP folders past CheckpointIO; TrainStatusCallback records each
    # once both ranks' shards are durable, and ModelCheckpoint's top-k removal of an old folder goes
    # through the plugin (its entry dropped first).
    directory = tmp_path / "ckpts"
    run = fresh.start(dir=str(directory), strategy="model_parallel", max_steps=6, every=2)
    finished(run)
    entries = recorded(directory)
    assert [(e["steps"], e["file_path"]) for e in entries] == [
        (4, "epoch=0-step=4.ckpt"), (6, "epoch=0-step=6.ckpt"), (6, "last.ckpt")]
    for entry in entries:  # every file of the folder, each with its size on disk; written by 2 ranks
        assert folder_files(entry) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
        assert entry["world_size"] == 2
        assert all((directory / name).stat().st_size == size for name, size in entry["files"].items())
    assert not (directory / "epoch=0-step=2.ckpt").exists()  # save_top_k=2 removed it, through the plugin
    run = fresh.start(dir=str(directory), strategy="model_parallel", max_steps=8, every=2)
    assert [(e["path"], e["warnings"]) for e in run.each("resumed")] == [(str(directory / "last.ckpt"), [])] * 2
    assert [e["step"] for e in run.each("ready")] == [6, 6]  # Lightning loaded the folder on both ranks
    finished(run)
    assert [(e["steps"], e["file_path"]) for e in recorded(directory)][-1] == (8, "last.ckpt")


def test_a_sharded_save_is_recorded_only_once_the_slow_rank_has_written(fresh: Workers, tmp_path: Path) -> None:
    # A strategy of the test's own saves DCP folders past CheckpointIO (as FSDPStrategy's sharded
    # branch does) and each rank adds a file of its own; rank 1 writes half of its file, then the
    # rest 2 s later. Rank 0's save has returned long before: the record waits for rank 1, so it
    # lists rank 1's file whole, with its final size.
    directory = tmp_path / "ckpts"
    finished(fresh.start(dir=str(directory), strategy="dcp_ddp", slow=1, max_steps=2, every=2))
    entries = recorded(directory)
    assert [(e["steps"], e["file_path"]) for e in entries] == [(2, "epoch=0-step=2.ckpt"), (2, "last.ckpt")]
    for entry in entries:
        assert folder_files(entry) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt", "rank_0.bin",
                                       "rank_1.bin"]
        own = {os.path.basename(name): size for name, size in entry["files"].items() if name.endswith(".bin")}
        assert own == {"rank_0.bin": 16384, "rank_1.bin": 16384}


REFUSED = [
    ("deepspeed", "TrainStatusCallback does not know how OwnDeepSpeed saves: it overrides "
                  "DeepSpeedStrategy.save_checkpoint, whose saves (DeepSpeed's engine, every rank, a tag folder named "
                  "'checkpoint') are the ones trainstatus records. Keep DeepSpeedStrategy's save_checkpoint, or leave "
                  "TrainStatusCallback and TrainStatusCheckpointIO out. Nothing was recorded."),
    ("own", "TrainStatusCallback does not know how Own saves: its class overrides save_checkpoint, and it is not one "
            "of Lightning's strategies whose saves trainstatus records. Say how: TrainStatusCallback(sharded=True) if "
            "every rank saves a torch.distributed.checkpoint folder at the path it is given (as FSDPStrategy("
            "state_dict_type='sharded') does), sharded=False if global rank 0 saves through the strategy's "
            "checkpoint_io (as Strategy.save_checkpoint does). Nothing was recorded."),
    ("no-plugin", "TrainStatusCallback needs TrainStatusCheckpointIO as the strategy's checkpoint_io, and "
                  "SingleDeviceStrategy has TorchCheckpointIO: add plugins=[TrainStatusCheckpointIO()] to the Trainer. "
                  "Nothing would be recorded without it."),
]

def test_strategies_whose_saves_cannot_be_recorded_are_refused_at_set_up(fresh: Workers, tmp_path: Path) -> None:
    # A DeepSpeedStrategy whose save_checkpoint is the user's (its class: the package is not
    # installed here; Lightning's own is recorded, tests/test_integration_deepspeed.py), a strategy of
    # the user's that overrides save_checkpoint, and the callback without the plugin: each refused loudly at set-up, before
    # any training, never a run that records nothing.
    run = fresh.start(dir=str(tmp_path / "ckpts"), refusals=[case for case, _ in REFUSED])
    run.exits()
    assert [(e["case"], e["type"], e["message"]) for e in run.events if e["event"] == "refused"] == [
        (case, "TrainingStatusTypeError", message) for case, message in REFUSED]


UNRECORDED = ("TrainingStatusCheckpointWarning: epoch=0-step=2.ckpt, epoch=0-step=4.ckpt, last.ckpt in {directory} are "
              "sharded checkpoints (torch.distributed.checkpoint folders, saved by FSDPStrategy(state_dict_type="
              "'sharded') or ModelParallelStrategy) that {status} has never recorded: a sharded strategy saves past "
              "TrainStatusCheckpointIO, so nothing records them, and last_complete_checkpoint() does not return them. "
              "Add TrainStatusCallback() to the Trainer's callbacks beside the plugin: it records sharded saves.")


def test_sharded_saves_without_the_callback_are_named_at_the_next_resume(fresh: Workers, tmp_path: Path) -> None:
    # The plugin alone never sees a sharded save (the strategy does not call it): nothing is
    # recorded, and the next resume says why rather than starting over in silence.
    directory = tmp_path / "ckpts"
    finished(fresh.start(dir=str(directory), strategy="model_parallel", max_steps=4, every=2,
                         callback=False, top_k=-1))
    assert recorded(directory) == []
    run = fresh.start(dir=str(directory), strategy="model_parallel", max_steps=4, every=2,
                      callback=False)
    resumed = run.each("resumed")
    assert [e["path"] for e in resumed] == [None, None]
    message = UNRECORDED.format(directory=directory, status=directory / "training_status.json")
    assert [e["warnings"] for e in resumed] == [[message], [message]]  # each rank read alone: no process group
    finished(run)


# -- random kills ---------------------------------------------------------------------------------


def files_intact(directory: Path, entry: dict[str, Any]) -> bool:
    return all((directory / name).is_file() and (directory / name).stat().st_size == size
               for name, size in entry["files"].items())


@pytest.mark.parametrize("strategy", ["ddp", "model_parallel"])
def test_random_kills_of_one_rank_or_both_resume_both_from_the_last_recorded_checkpoint(
        fresh: Workers, tmp_path: Path, seed: int, strategy: str) -> None:
    """SIGKILL one rank, the other, or both, at random moments (10 kills a strategy), with a second
    ModelCheckpoint saving past trainstatus at the same moments (Lightning's own save: through
    ``TorchCheckpointIO`` under DDP, the strategy's sharded save under ModelParallel). After each
    kill both ranks resume with ``last_complete_checkpoint``: the same path on both, the newest
    recorded checkpoint (never older), Lightning loads it on both and training goes on; rank 0
    checks what ``ckpt_path="last"`` would load in the other folder. A surviving rank ends on its
    own (its collectives fail once its peer is gone)."""
    rng = random.Random(f"{seed}-{strategy}")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    kills, own, why = 10, OwnResume(), []
    mid_save = resumes = 0
    victims_seen: dict[str, int] = {}
    last_recorded, expected = 0, None
    for kill in range(kills + 1):
        final = kill == kills
        run = fresh.start(dir=str(ours), theirs=str(theirs), strategy=strategy, every=2, top_k=2, width=256,
                          seed=kill, timeout=60, max_steps=last_recorded + 4 if final else 10**6)
        resumed = run.each("resumed")
        path = None if expected is None else str(ours / expected["file_path"])
        assert [e["path"] for e in resumed] == [path, path], (kill, resumed)
        # A sharded save killed before its first record: named, never returned (nothing else warns).
        assert all(w.startswith("TrainingStatusCheckpointWarning: ") and "has never recorded" in w
                   for e in resumed for w in e["warnings"]), resumed
        resumes += path is not None
        theirs_resume = run.event("theirs", 0)
        own.add(theirs_resume)
        if theirs_resume["ok"] is False:
            why.append(theirs_resume["error"].split(":")[0])
        assert [e["step"] for e in run.each("ready")] == [last_recorded] * 2, (kill, resumed)
        if final:
            assert [e["step"] for e in finished(run)] == [last_recorded + 4] * 2
            break
        time.sleep(rng.uniform(0.0, 1.5))  # a random moment: in a step or a save
        victims = rng.choice([[0], [1], [0, 1]])
        victims_seen[str(victims)] = victims_seen.get(str(victims), 0) + 1
        mid_save += saving(run)
        run.kill(victims)
        codes = run.exits()
        assert codes[victims[0]] == -signal.SIGKILL, codes  # (a second victim may have ended on its own first)
        entries = recorded(ours)
        assert all(files_intact(ours, e) for e in entries), entries  # never a listed file gone or torn
        steps = [e["steps"] for e in entries]
        assert not steps or max(steps) >= last_recorded
        last_recorded, expected = (max(steps) if steps else 0), newest(entries)
    print(f"\nLightning {strategy} on 2 processes (gloo, CPU), {kills} SIGKILLs at random moments "
          f"({', '.join(f'{n} of ranks {v}' for v, n in sorted(victims_seen.items()))}; {mid_save} inside a save):\n"
          f"  last_complete_checkpoint: {resumes} resumes from a checkpoint, the same on both ranks, 0 failed to "
          "load, 0 went back past the last recorded one\n"
          f"  ckpt_path=\"last\" (Lightning's own): {own.failed} of {own.tried} could not be loaded whole"
          + (f" ({'; '.join(why)})" if why else ""))
    sys.stdout.flush()


def test_an_elastic_restart_resumes_every_rank_from_the_newest_recorded_checkpoint(torch_python: Path,
                                                                                   tmp_path: Path) -> None:
    # torchrun --max-restarts=1 under DDP: rank 0 (which saves and records) dies once step 2's
    # top-k file is recorded; torchrun ends rank 1 and starts both again, which resume from it.
    directory = tmp_path / "ckpts"
    launch = elastic(torch_python, RANKS, {"dir": str(directory), "max_steps": 6, "exit_once": [0, 2]}, tmp_path,
                     bound=BOUND)
    after = restarted(launch)
    assert [(e["path"], e["warnings"]) for e in after] == [(str(directory / "epoch=0-step=2.ckpt"), [])] * 2
    assert recorded(directory)[-1]["steps"] == 6
