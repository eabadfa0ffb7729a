"""trainstatus.integrations.transformers under several processes: the real Trainer (DDP, gloo,
CPU) launched by ``torchrun`` (``python -m torch.distributed.run``) and by ``accelerate launch``,
2 ranks, each a process of tests/_transformers_ranks.py.

``torchrun`` starts each worker in a session of its own: killing the launcher leaves them running.
Every run here is a ``Launch`` (tests/_launch.py), whose workers are killed by pid (the ones the
launcher started, read from ``/proc``, and those that said their pid), and the
``_no_process_left`` fixture checks that none outlives its test.

The random-kill test measures, on the same kills, how often Transformers' own resume
(``get_last_checkpoint``, the loads ``train`` makes of it on every rank) fails and prints both
figures: docs/transformers.md quotes them.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _launch
import pytest
from _launch import Launch, elastic, free_port, leftovers, restarted
from _trainer_child import OwnResume

from trainstatus import CheckpointList, StatusStore

RANKS = Path(__file__).resolve().parent / "_transformers_ranks.py"
# GLOO_SOCKET_IFNAME: the node groups of the node-local test have host names of their own, which
# do not resolve; gloo then needs to be told which interface to use.
ENV = {"HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
RNG_FILES = {"rng_state_0.pth", "rng_state_1.pth"}

BOUND = 300.0  # seconds: every wait of a launch (a run's end on two busy cores among them)


def ranks(python: Path, where: Path, launcher: Any = "torchrun", **options: Any) -> Launch:
    """One launch of tests/_transformers_ranks.py: the launcher and its 2 workers, its stderr in ``where``.

    ``launcher``: ``"torchrun"`` (``--standalone``, 2 processes), ``"accelerate"`` (``accelerate
    launch --multi_gpu --num_processes 2``: on a machine without GPUs its torch launcher, the
    Trainer on the CPU), or ``("node", k, port, prefix)``: node ``k`` of a 2-node ``torchrun``
    (1 process each) started with ``prefix`` (a mount namespace of its own, for node-local folders).
    """
    run = [str(python), "-m", "torch.distributed.run"]
    if launcher == "torchrun":
        argv = [*run, "--standalone", "--nproc_per_node=2", str(RANKS), json.dumps(options)]
    elif launcher == "accelerate":
        argv = [str(python.parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(free_port()), str(RANKS), json.dumps(options)]
    else:
        _, node, port, prefix = launcher
        argv = [*prefix, *run, "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1", "--master_addr=127.0.0.1",
                f"--master_port={port}", str(RANKS), json.dumps(options)]
    return Launch(argv, where / f"ranks-{time.monotonic_ns()}.err", env=ENV, stdin=subprocess.DEVNULL, bound=BOUND)


def kill_rank(launch: Launch, rank: int) -> None:
    """SIGKILL one worker; the launcher stops the other and exits."""
    launch.kill([rank])
    launch.ended()


@pytest.fixture(autouse=True)
def _no_process_left(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """Kill what a test left running (a failed test leaves its runs), and fail a test that passed
    with runs left: no process outlives its test. (Every launch's options name a folder of the
    test's tmp_path: its processes' command lines hold it.)"""
    failed = request.session.testsfailed
    yield
    left = leftovers(str(tmp_path))
    assert not left or request.session.testsfailed > failed, f"processes {left} outlived the test"


def entries(directory: Path) -> list[dict[str, Any]]:
    return _launch.recorded(directory / "training_status.json", "transformers")


def steps(directory: Path) -> list[int]:
    return [e["steps"] for e in entries(directory)]


def on_disk(directory: Path, folder: str) -> dict[str, int]:
    return {f"{folder}/{name}": (directory / folder / name).stat().st_size for name in os.listdir(directory / folder)}


def latest(directory: Path) -> tuple[str | None, list[str]]:
    """What the checkpoint list resumes from, read in this process, with its warnings."""
    with StatusStore(directory / "training_status.json") as store, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = CheckpointList(store, "transformers", root=directory).latest()
    return (None if chosen is None else chosen["file_path"]), [str(w.message) for w in caught]


def test_a_rank_whose_file_is_late_holds_the_record_back(torch_python: Path, tmp_path: Path) -> None:
    # Rank 1's rng_state_1.pth is held back ("half": its first half written; "sleep": nothing
    # written yet) until rank 0 is in on_save, then 3 s more or until the folder is recorded: the
    # window in which a record without a barrier happens (the issue: rank 0 recorded checkpoint-3
    # without the file, or with 7,188 of its 14,377 bytes, and rank 1 crashed in _load_rng_state).
    directory = tmp_path / "out"

    def held(launch: int, at: dict[str, str], hold: bool) -> dict[str, Any]:
        markers = tmp_path / f"markers-{launch}"  # rank 0's "in on_save" marker files
        markers.mkdir()
        return {"rank": 1, "at": at, "markers": str(markers), "hold": hold}

    # 1. The whole group SIGKILLed in that window at checkpoint-4, rank 1's file half written.
    group = ranks(torch_python, tmp_path, dir=str(directory), max_steps=6, slow=held(1, {"4": "half"}, True))
    window = group.event("window4", 1)
    group.close()
    assert (window["recorded"], window["written"]) == (False, window["size"] // 2)  # rank 0 waited for it
    assert steps(directory) == [2]
    # 2. The resume: both ranks from checkpoint-2; both load it and train (rank 1 its RNG state).
    #    Killed again in the window of checkpoint-4, rank 1's file not yet written.
    group = ranks(torch_python, tmp_path, dir=str(directory), max_steps=6, slow=held(2, {"4": "sleep"}, True))
    assert [e["path"] for e in group.each("resumed")] == [str(directory / "checkpoint-2")] * 2
    assert [e["step"] for e in group.each("stepped")] == [3, 3]
    window = group.event("window4", 1)
    group.close()
    assert (window["recorded"], window["written"]) == (False, 0)
    assert steps(directory) == [2]
    # 3. The same windows at checkpoint-4 and checkpoint-6 without a kill, under accelerate launch
    #    (the record waits there too): each is recorded once rank 1's file is whole, so a finished
    #    checkpoint is never refused for a size taken while a rank was still writing.
    group = ranks(torch_python, tmp_path, "accelerate", dir=str(directory), max_steps=6,
                  slow=held(3, {"4": "half", "6": "sleep"}, False))
    assert [e["path"] for e in group.each("resumed")] == [str(directory / "checkpoint-2")] * 2
    windows = [group.event("window4", 1), group.event("window6", 1)]
    assert [e["recorded"] for e in windows] == [False, False]
    assert [(e["step"], e["error"]) for e in group.finished()] == [(6, None), (6, None)]
    assert steps(directory) == [2, 4, 6]
    for entry, window in zip(entries(directory)[1:], windows):
        folder = entry["file_path"]
        assert entry["files"] == on_disk(directory, folder)
        assert entry["files"][f"{folder}/rng_state_1.pth"] == window["size"]
        assert RNG_FILES <= {path.split("/")[1] for path in entry["files"]}
    assert [e.get("world_size") for e in entries(directory)] == [2, 2, 2]
    assert latest(directory) == ("checkpoint-6", [])


def _each_way(theirs: list[dict[str, Any]], why: collections.Counter[str]) -> dict[str, Any]:
    """Transformers' own resume over both ranks: failed if it failed on either (a rank that raises
    alone leaves the other waiting in DDP's next collective: the run cannot go on); ``why`` counts
    the first error of each failure by its type, and whether one rank or both raised."""
    known = [e["ok"] for e in theirs if e["ok"] is not None]
    errors = [e["error"] for e in theirs if e["ok"] is False]
    if errors:
        why[f"{errors[0].split(':')[0]} on {'both ranks' if len(errors) == 2 else 'one rank'}"] += 1
    return {"ok": None if not known else all(known)}


def test_random_kills_of_one_rank_or_the_whole_group(torch_python: Path, tmp_path: Path, seed: int) -> None:
    """SIGKILL one rank (the launcher then stops the other) or the whole group, by pid, at random
    moments (20 kills), saves of 1024-wide layers every 2 steps, save_total_limit=2. After each kill
    the next launch resumes (``last_complete_checkpoint`` or ``resume_from_checkpoint=True``, by
    turns at random): both ranks resume from the newest recorded checkpoint (never older), load it
    and train; the same launch measures Transformers' own resume on the same folder first."""
    rng = random.Random(seed)
    directory = tmp_path / "out"
    kills = 20
    own, why = OwnResume(), collections.Counter[str]()
    mid_save = resumes = one_rank = 0
    last_recorded = 0
    for kill in range(kills + 1):
        resume = rng.choice(["call", True]) if last_recorded else "call"
        group = ranks(torch_python, tmp_path, dir=str(directory), theirs=True, every=2, limit=2, width=1024, seed=kill,
                      resume=resume, max_steps=10**6 if kill < kills else last_recorded + 4)
        expected = str(directory / f"checkpoint-{last_recorded}") if last_recorded else None
        if resume == "call":
            resumed = group.each("resumed")
            assert [e["path"] for e in resumed] == [expected] * 2, (kill, resumed)
            # The only warning (on rank 0, which decides): folders of saves the kills cut short.
            assert all(w.startswith("TrainingStatusCheckpointWarning: Passed over checkpoint-")
                       for w in resumed[0]["warnings"]) and resumed[1]["warnings"] == [], (kill, resumed)
            # Rank 0 read the status file and each file's metadata (about 30 KB, measured), not the
            # weights (a checkpoint here holds 12.7 MB: 4.2 MB of model.safetensors, 8.4 MB of
            # optimizer.pt); rank 1 only heard the decision (about 3 KB, measured, with nothing to
            # decide as well: the collectives' own traffic).
            assert resumed[0]["read"] < 1_000_000 and resumed[1]["read"] < 16_000, (kill, resumed)
        own.add(_each_way(group.each("theirs"), why))
        # Both ranks loaded it (the RNG state of each among it) and trained on from it.
        assert [e["step"] for e in group.each("ready")] == [last_recorded] * 2, kill
        group.each("stepped")
        resumes += last_recorded > 0
        if kill == kills:
            break
        time.sleep(rng.uniform(0.0, 1.5))  # a random moment: in a step or a save
        if rng.random() < 0.5:
            one_rank += 1
            kill_rank(group, rng.choice([0, 1]))
        else:
            group.close()
        found = entries(directory)
        newest = max((e["steps"] for e in found), default=0)
        mid_save += any(int(p.name.split("-")[1]) > newest for p in directory.glob("checkpoint-*"))
        # The list never names a folder that is gone, nor one without every rank's files; it never
        # goes back, and keeps save_total_limit=2 (3 after a kill between a record and its rotation).
        assert [e["steps"] for e in found] == sorted(e["steps"] for e in found) and len(found) <= 3
        assert all(e["files"] == on_disk(directory, e["file_path"]) for e in found)
        assert all(RNG_FILES <= {p.split("/")[1] for p in e["files"]} for e in found)
        assert newest >= last_recorded
        last_recorded = newest
    done = group.finished()
    assert [(e["step"], e["error"]) for e in done] == [(last_recorded + 4, None)] * 2
    assert steps(directory)[-1] == last_recorded + 4
    print(f"\nTransformers integration under torchrun, 2 ranks: {kills} SIGKILLs at random moments ({one_rank} of "
          f"one rank, {kills - one_rank} of the whole group; {mid_save} inside a save, before its record):\n"
          f"  last_complete_checkpoint: {resumes} resumes from a checkpoint, 0 failed, 0 went back past the last "
          "recorded one, both ranks from the same one every time\n"
          f"  get_last_checkpoint (Transformers' own): {own.failed} of {own.tried} resumes failed"
          f"{' (' + ', '.join(f'{n} {kind}' for kind, n in why.most_common()) + ')' if why else ''}")
    sys.stdout.flush()


def _namespaces() -> bool:
    """Can this process give a child a mount namespace and a host name of its own (root, unshare)?"""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "--uts", "--propagation", "private", "true"],
                          capture_output=True, timeout=60).returncode == 0


def test_node_local_output_folders_make_every_rank_raise_the_same_error(torch_python: Path, tmp_path: Path) -> None:
    # Two torchrun node groups (--nnodes=2, one rank each) whose output folder is each node's own
    # disk: the same path, bound in each group's mount namespace to a folder of its own, and a host
    # name of its own. (Where namespaces are not allowed: each node's own folder as its current
    # directory, output_dir relative; the ranks then name different folders.)
    out = tmp_path / "out"
    homes = [tmp_path / f"node-{k}" for k in (0, 1)]
    for folder in (out, *homes):
        folder.mkdir()
    isolated = _namespaces()
    local = homes if isolated else [home / "out" for home in homes]  # each node's output folder

    def launch(**options: Any) -> list[Launch]:
        port = free_port()
        groups = []
        for k in (0, 1):
            if isolated:
                prefix = ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
                          'hostname "$0" && mount --bind "$1" "$2" && shift 2 && exec "$@"',
                          f"node-{k}", str(homes[k]), str(out)]
                groups.append(ranks(torch_python, tmp_path, ("node", k, port, prefix), dir=str(out), **options))
            else:
                groups.append(ranks(torch_python, tmp_path, ("node", k, port, []), cwd=str(homes[k]), dir="out",
                                    **options))
        return groups

    def same_error(events: list[dict[str, Any]]) -> str:
        assert events[0]["error"].startswith("TrainingStatusCheckpointNotShared: ")
        assert (events[0]["ranks"], events[1]["ranks"]) == ([1], [1])
        if isolated:
            assert events[0]["error"] == events[1]["error"] and events[0]["hosts"] == events[1]["hosts"] == ["node-1"]
        return str(events[0]["error"]).split(": ", 1)[1]

    # 1. A fresh run: the first save cannot be recorded (rank 0 does not see rank 1's RNG state):
    #    every rank raises, nothing is recorded.
    groups = launch(max_steps=4)
    done = [groups[k].event("done", k) for k in (0, 1)]
    for group in groups:
        group.close()
    message = same_error(done)
    if isolated:
        assert message == (
            f"Cannot record checkpoint-2 of {out}: the ranks do not see the same files in {out / 'checkpoint-2'}: "
            "rank 1 on node-1 wrote rng_state_1.pth, which rank 0 on node-0 does not see. Nothing was recorded. "
            "Every rank must write its files into one folder that every node sees at the same path (a shared "
            "filesystem); node-local output folders cannot hold a checkpoint that every rank resumes from.")
    assert [e["step"] for e in done] == [2, 2] and steps(local[0]) == []
    # 2. Node 0's checkpoint-2 recorded by rank 0 alone (what trainstatus did before ranks took
    #    part): rank 0 would resume from it, rank 1 finds only its own RNG state there. Every rank
    #    raises the same error naming rank 1 and its host, before anything is loaded.
    with StatusStore(local[0] / "training_status.json") as store:
        entry = CheckpointList(store, "transformers", root=local[0]).add(2, "checkpoint-2")
    assert sorted(os.listdir(local[1] / "checkpoint-2")) == ["rng_state_1.pth"]
    groups = launch(max_steps=4)
    resumed = [groups[k].event("resumed", k) for k in (0, 1)]
    for group in groups:
        group.close()
    message = same_error(resumed)
    first = next(iter(entry["files"]))
    if isolated:
        assert message == (
            f"Not every rank can resume from the newest whole checkpoint of {out}: rank 1 on node-1: "
            f"{out / first} is not there. Every rank must see the same checkpoint "
            "folder (rank 1 cannot), so none resumes. Put the checkpoints on storage every node mounts at the "
            "same path (a shared filesystem), or copy the folder to every node's path, and start again.")
    else:
        assert f"rank 1 on {socket.gethostname()}: " in message


def _run(python: Path, code: str, **env: str) -> list[str]:
    """``code`` run by ``python`` (.venv-torch's); the warnings and result lines it printed."""
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **ENV, "PYTHONWARNINGS": "ignore", **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def _resumed(python: Path, code: str) -> tuple[str | None, list[str]]:
    """What ``code`` (ending in ``_CALL``) printed last: the path chosen and the warnings."""
    [line] = _run(python, code)[-1:]
    path, warned = json.loads(line)
    return path, warned


_CALL = """
import json, sys, warnings
from trainstatus.integrations.transformers import last_complete_checkpoint
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    path = last_complete_checkpoint(sys.argv[1] if len(sys.argv) > 1 else {folder!r})
print(json.dumps([path, [str(w.message) for w in caught]]))
"""


def test_a_torch_file_without_its_zip_directory_is_not_whole(torch_python: Path, tmp_path: Path) -> None:
    # torch.save writes a zip archive whose directory comes last: a file recorded whole and then
    # damaged at its end (its size kept, so the size check passes) is passed over, found by its
    # directory alone.
    folder = tmp_path / "out"
    code = f"""
import json, os, torch
from trainstatus import CheckpointList, StatusStore
for step in (2, 4):
    os.makedirs({str(folder)!r} + f"/checkpoint-{{step}}")
    torch.save({{"state": torch.zeros(1000)}}, {str(folder)!r} + f"/checkpoint-{{step}}/optimizer.pt")
    with open({str(folder)!r} + f"/checkpoint-{{step}}/trainer_state.json", "w") as f:
        json.dump({{"global_step": step}}, f)
    with StatusStore({str(folder / "training_status.json")!r}) as store:
        CheckpointList(store, "transformers", root={str(folder)!r}).add(step, f"checkpoint-{{step}}")
with open({str(folder)!r} + "/checkpoint-4/optimizer.pt", "r+b") as f:
    f.seek(-22, os.SEEK_END)
    f.write(bytes(22))
""" + _CALL.format(folder=str(folder))
    path, warned = _resumed(torch_python, code)
    assert path == str(folder / "checkpoint-2")
    assert warned == [
        f"{folder / 'checkpoint-2'} is the newest whole checkpoint recorded in {folder / 'training_status.json'}; the "
        "newer ones cannot be resumed from: checkpoint-4/optimizer.pt: its zip central directory cannot be read "
        "(File is not a zip file). They are left on disk: a run saves over each folder when it reaches its "
        f"step. If you have whole copies of them, stop, put them back in {folder} and start again to resume from "
        "the newest."]


def test_a_rank_that_has_not_joined_its_process_group_is_warned_that_it_chose_alone(
        torch_python: Path, tmp_path: Path) -> None:
    # Launched as one of 2 (WORLD_SIZE=2), called before TrainingArguments joined the group.
    folder = tmp_path / "out"
    [line] = _run(torch_python, _CALL.format(folder=str(folder)), WORLD_SIZE="2")[-1:]
    assert json.loads(line) == [None, [
        f"last_complete_checkpoint({str(folder)!r}) ran in one of 2 processes (WORLD_SIZE=2) before this one "
        "joined their torch.distributed process group: it chose alone, and the ranks may resume from different "
        "checkpoints. Call it after TrainingArguments(...) is made (that joins the group), as in "
        "trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir)), or pass "
        "resume_from_checkpoint=True to a Trainer holding TrainStatusCallback."]]


def test_a_checkpoint_of_two_ranks_resumed_by_one_process_names_the_rng_state_not_used(
        torch_python: Path, tmp_path: Path) -> None:
    # Entries record world_size; nothing compared it (issue 38): Transformers logs at info level
    # that rng_state_1.pth is not used, or nothing when a rank has none.
    folder = tmp_path / "out"
    code = f"""
import json, os, torch
from trainstatus import CheckpointList, StatusStore
os.makedirs({str(folder)!r} + "/checkpoint-2")
for rank in (0, 1):
    torch.save({{"python": 1}}, {str(folder)!r} + f"/checkpoint-2/rng_state_{{rank}}.pth")
with open({str(folder)!r} + "/checkpoint-2/trainer_state.json", "w") as f:
    json.dump({{"global_step": 2}}, f)
with StatusStore({str(folder / "training_status.json")!r}) as store:
    CheckpointList(store, "transformers", root={str(folder)!r})._add(2, "checkpoint-2", fields={{"world_size": 2}})
""" + _CALL.format(folder=str(folder))
    path, warned = _resumed(torch_python, code)
    assert path == str(folder / "checkpoint-2")
    assert warned == [
        f"{folder / 'checkpoint-2'} was saved by 2 ranks and this run has 1: no RNG state is restored (a run of one "
        "process reads rng_state.pth, which a run of several does not write), so the data order and dropout differ "
        "from a run that was not interrupted (the weights and optimizer state are restored as the Trainer does). "
        "Resume with the same number of ranks to have every rank's RNG state back."]
    more = """
import json, warnings
from trainstatus.integrations._transformers.folders import note_world_size
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for world in (2, 3, 4):
        note_world_size({"world_size": 2}, "out/checkpoint-2", "out/training_status.json", "transformers", world)
    note_world_size({"world_size": 4}, "out/checkpoint-2", "out/training_status.json", "transformers", 2)
    note_world_size({"world_size": 4}, "out/checkpoint-2", "out/training_status.json", "transformers", 3)
print(json.dumps([str(w.message).split(":")[1].split(",")[0] for w in caught]))
"""
    [line] = _run(torch_python, more)[-1:]
    assert json.loads(line) == [" rank 2 finds no RNG state of its own and starts from a fresh one",
                                " ranks 2-3 find no RNG state of theirs and start from fresh ones",
                                " the RNG states of ranks 2-3 are not used",
                                " the RNG state of rank 3 is not used"]


def test_an_elastic_restart_resumes_every_rank_from_the_newest_recorded_checkpoint(torch_python: Path,
                                                                                   tmp_path: Path) -> None:
    # torchrun --max-restarts=1: rank 1 dies once checkpoint-2 is recorded; torchrun ends rank 0
    # and starts both again, which resume from checkpoint-2 together and finish.
    directory = tmp_path / "out"
    launch = elastic(torch_python, RANKS, {"dir": str(directory), "max_steps": 6, "exit_once": [1, 2]}, tmp_path,
                     env=ENV, bound=BOUND)
    after = restarted(launch)
    assert [(e["path"], e["warnings"]) for e in after] == [(str(directory / "checkpoint-2"), [])] * 2
    assert [e["steps"] for e in _launch.recorded(directory / "training_status.json", "transformers")][-1] == 6
