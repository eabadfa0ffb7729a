"""trainstatus.integrations.dcp on torch.distributed.checkpoint's real saves: FSDP2 (``fully_shard``)
on 2 CPU processes with gloo, started by ``torchrun`` or directly, and one process without a
process group.

The children are tests/_dcp_trainer.py, run by .venv-torch's interpreter (the ``torch_python``
fixture puts these tests in the ``integrations`` group), but for the import tests without torch,
which run in this interpreter. The random-kill test measures, on the same kills, how often a loop
without trainstatus (resume from the highest ``step-*`` folder) would fail to load, and prints both
figures: docs/distributed.md quotes them.

torchrun starts its workers in sessions of their own: the children print their pids, the tests
kill by pid, and every test ends by killing, by pid, any process whose command line holds the
test's own temporary folder (``no_leftovers``).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _launch
import pytest
from _forkserver import environment
from _launch import Launch, Workers, elastic, free_port, leftovers, restarted

TRAINER = Path(__file__).resolve().parent / "_dcp_trainer.py"
BOUND = 120.0  # seconds: a generous bound for "within a bound", and every child's timeout
HOST = socket.gethostname()


# -- the children -------------------------------------------------------------------------------


@pytest.fixture
def no_leftovers(tmp_path: Path) -> Iterator[None]:
    """No process of the test outlives it: any left is killed by pid, and fails a test that passed."""
    yield
    left = leftovers(str(tmp_path))
    assert not left, f"processes {left} outlived the test"


def torchrun(python: Path, tmp_path: Path, **options: Any) -> Launch:
    """``python -m torch.distributed.run --standalone --nproc_per_node=2`` of the child."""
    stderr = tmp_path / f"torchrun-{time.monotonic_ns()}.err"
    return Launch([str(python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(TRAINER),
                   json.dumps(options)], stderr)


def started_directly(python: Path, tmp_path: Path, options: dict[str, Any],
                     wrap: Callable[[int, list[str]], list[str]] | None = None) -> list[Launch]:
    """Ranks 0 and 1 of the child, each started as its own process with the environment
    ``init_process_group`` reads (what a launcher sets), ``wrap`` making each command line."""
    port = free_port()
    launches = []
    for rank in (0, 1):
        argv = [str(python), str(TRAINER), json.dumps(options)]
        env = {**environment(rank, 2, port), "GLOO_SOCKET_IFNAME": "lo"}
        launches.append(Launch(wrap(rank, argv) if wrap else argv, tmp_path / f"rank{rank}.err", env=env))
    return launches


def finished(launches: list[Launch]) -> None:
    for launch in launches:
        assert launch.process.stdin is not None
        launch.process.stdin.close()
    for launch in launches:
        assert launch.ended() == 0, launch.stderr()


def recorded(status: Path) -> list[dict[str, Any]]:
    return _launch.recorded(status, "dcp")


def on_disk(folder: Path) -> dict[str, int]:
    return {f"{folder.name}/{p.name}": p.stat().st_size for p in folder.iterdir()}


# -- one process, no process group --------------------------------------------------------------

SCENARIOS = ["keep", "no_metadata", "truncated", "past_end", "boundary", "rolled_back"]


@pytest.fixture(scope="module")
def alone(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    """One child running every scenario of tests/_dcp_trainer.py's ``alone`` role, each in a folder
    of its own; its events by scenario."""
    base = tmp_path_factory.mktemp("dcp_alone")
    launch = Launch([str(torch_python), str(TRAINER), json.dumps({"role": "alone", "dir": str(base),
                                                                  "scenarios": SCENARIOS})], base / "child.err")
    try:
        assert launch.ended() == 0, launch.stderr()
    finally:
        launch.close()
        leftovers(str(base))
    by: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for fields in launch.events:
        by[fields.get("scenario", "")].append(fields)
    return base, by


def only(events: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [found] = [e for e in events if e["event"] == name]
    return found


def test_record_and_resume_round_trip_and_keep_removes_folders_only_after_the_record(
        alone: tuple[Path, dict[str, list[dict[str, Any]]]]) -> None:
    base, by = alone
    directory, events = base / "keep", by["keep"]
    # Importing the module and a resume that finds no status file loaded no torch module.
    assert only(by[""], "imported") == {**only(by[""], "imported"), "torch": [], "fresh": None}
    assert [e["names"] for e in events if e["event"] == "folders"] == [
        ["step-1"], ["step-1", "step-2"], ["step-2", "step-3"], ["step-3", "step-4"], ["step-4", "step-5"]]
    # Each file of a folder beyond keep=2 was removed only once the status file on disk listed
    # the new step and no longer the removed one.
    assert [(e["path"], e["listed"]) for e in events if e["event"] == "removing"] == [
        (f"step-{n}/{name}", [n + 1, n + 2]) for n in (1, 2, 3) for name in (".metadata", "__0_0.distcp")]
    entries = only(events, "entries")
    assert entries["steps"] == [4, 5]
    assert entries["files"] == [on_disk(directory / "step-4"), on_disk(directory / "step-5")]
    assert set(entries["files"][1]) == {"step-5/.metadata", "step-5/__0_0.distcp"}
    resumed = only(events, "resumed")
    assert (resumed["path"], resumed["warnings"]) == (str(directory / "step-5"), [])
    assert only(events, "loaded")["weight"] == [5.0]  # dcp.load of it gave back what step 5 saved


def test_a_folder_without_metadata_is_refused_by_name(alone: tuple[Path, dict[str, list[dict[str, Any]]]]) -> None:
    base, by = alone
    error, entries = only(by["no_metadata"], "error"), only(by["no_metadata"], "entries")
    folder = base / "no_metadata" / "step-1"
    assert error["type"] == "TrainingStatusCheckpointError"
    assert error["message"] == (
        f"Cannot record {folder}: it has no .metadata, which torch.distributed.checkpoint writes last. Call record() "
        "after dcp.save() returned on every rank (or after dcp.async_save()'s future completed), with the folder "
        "given to it as checkpoint_id. Nothing was recorded.")
    assert entries["steps"] == []


def test_a_recorded_folder_cut_short_is_passed_over_and_dropped(
        alone: tuple[Path, dict[str, list[dict[str, Any]]]]) -> None:
    base, by = alone
    directory = base / "truncated"
    whole = (directory / "step-2" / "__0_0.distcp").stat().st_size  # every step saves the same shapes
    resumed, entries = only(by["truncated"], "resumed"), only(by["truncated"], "entries")
    status = directory / "training_status.json"
    assert resumed["path"] == str(directory / "step-2")
    assert resumed["warnings"] == [(
        f"TrainingStatusCheckpointWarning: {directory / 'step-2'} is the newest whole checkpoint recorded in {status}; "
        f"the newer ones cannot be resumed from: step-4/__0_0.distcp is missing; step-3/__0_0.distcp has "
        f"{whole // 2:,} bytes, {whole:,} recorded. They are no longer listed (this run saves over their folders as it "
        "reaches their steps, and a folder half saved over must not be found listed); their files are left in "
        f"{directory}. To keep them, stop and move them out of {directory}, or save into another folder.")]
    assert entries["steps"] == [1, 2]  # the newer entries dropped on resume
    assert (directory / "step-3").is_dir() and (directory / "step-4").is_dir()  # their files left alone


def test_metadata_naming_bytes_past_a_recorded_size_is_passed_over(
        alone: tuple[Path, dict[str, list[dict[str, Any]]]]) -> None:
    # The shard cut to half and that size recorded: the size check passes, .metadata does not.
    base, by = alone
    directory = base / "past_end"
    half = (directory / "step-2" / "__0_0.distcp").stat().st_size
    resumed, entries = only(by["past_end"], "resumed"), only(by["past_end"], "entries")
    assert resumed["path"] == str(directory / "step-1")
    [warning] = resumed["warnings"]
    start = (f"TrainingStatusCheckpointWarning: {directory / 'step-1'} is the newest whole checkpoint recorded in "
             f"{directory / 'training_status.json'}; the newer ones cannot be resumed from: step-2/.metadata names "
             "bytes 0-")
    assert warning.startswith(start), warning
    end = warning[len(start):].split(" ", 1)
    assert int(end[0].replace(",", "")) > half
    assert end[1].startswith(f"of step-2/__0_0.distcp, which has {half:,} bytes recorded. They are no longer listed")
    assert entries["steps"] == [1]


def test_a_shard_one_byte_short_of_the_end_metadata_names_is_passed_over(
        alone: tuple[Path, dict[str, list[dict[str, Any]]]]) -> None:
    # step-2's shard as saved (ending where its last chunk ends), one byte longer, one byte shorter:
    # each size recorded, so only the check of .metadata's chunks can tell.
    base, by = alone
    directory = base / "boundary"
    end = only(by["boundary"], "end")
    assert end["size"] == end["end"]  # a shard ends exactly where its last chunk does
    exact, longer, shorter = (e for e in by["boundary"] if e["event"] == "resumed")
    assert (exact["path"], exact["warnings"]) == (str(directory / "step-2"), [])
    assert (longer["path"], longer["warnings"]) == (str(directory / "step-2"), [])
    assert shorter["path"] == str(directory / "step-1")
    assert shorter["warnings"] == [(
        f"TrainingStatusCheckpointWarning: {directory / 'step-1'} is the newest whole checkpoint recorded in "
        f"{directory / 'training_status.json'}; the newer ones cannot be resumed from: step-2/.metadata names bytes "
        f"{end['start']:,}-{end['end']:,} of step-2/__0_0.distcp, which has {end['end'] - 1:,} bytes recorded. They "
        "are no longer listed (this run saves over their folders as it reaches their steps, and a folder half saved "
        f"over must not be found listed); their files are left in {directory}. To keep them, stop and move them out "
        f"of {directory}, or save into another folder.")]
    assert only(by["boundary"], "entries")["steps"] == [1]


def test_a_run_that_went_back_drops_the_later_entries_when_it_records(
        alone: tuple[Path, dict[str, list[dict[str, Any]]]]) -> None:
    base, by = alone
    directory = base / "rolled_back"
    assert only(by["rolled_back"], "entries")["steps"] == [1, 2]
    resumed = only(by["rolled_back"], "resumed")
    assert (resumed["path"], resumed["warnings"]) == (str(directory / "step-2"), [])
    # Their folders stay (a run saves over each as it reaches its step).
    assert sorted(p.name for p in directory.glob("step-*")) == ["step-1", "step-2", "step-3", "step-4"]


IMPORT_CHECK = """
import os, sys
import trainstatus.integrations.dcp as dcp
from trainstatus.integrations._ranks import hosts
directory = sys.argv[1]
folder = os.path.join(directory, "step-1")
os.makedirs(folder)
for name, data in ((".metadata", b"plan"), ("__0_0.distcp", b"0" * 10)):
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
print(dcp.last_complete_checkpoint(directory), hosts.ranks())
print(sorted(dcp.record(folder, 1)["files"].items()))
print(sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
"""


def imports_no_torch(python: str, tmp_path: Path) -> None:
    done = subprocess.run([python, "-c", IMPORT_CHECK, str(tmp_path / "ckpt")], capture_output=True, text=True,
                          timeout=BOUND, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "None None\n[('step-1/.metadata', 4), ('step-1/__0_0.distcp', 10)]\n[]\n"


def test_importing_and_recording_without_a_process_group_import_no_torch(tmp_path: Path) -> None:
    # The default environment (no torch): the module imports, records, and finds nothing to resume.
    imports_no_torch(sys.executable, tmp_path)


def test_importing_and_recording_import_no_torch_where_it_is_installed(torch_python: Path, tmp_path: Path) -> None:
    imports_no_torch(str(torch_python), tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed in this environment")
def test_a_resume_without_torch_says_so_and_drops_nothing(tmp_path: Path) -> None:
    # Without torch the .metadata check cannot run: that is said, not taken for "every folder
    # unreadable" (which would drop them all from the list).
    directory = tmp_path / "ckpt"
    imports_no_torch(sys.executable, tmp_path)
    code = ("import sys\nfrom trainstatus.integrations.dcp import last_complete_checkpoint\n"
            "try:\n    last_complete_checkpoint(sys.argv[1])\nexcept ModuleNotFoundError as e:\n    print(e.name, e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True, timeout=BOUND,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"torch Cannot tell whether the checkpoints recorded under {directory} are whole: reading their .metadata needs "
        "torch.distributed.checkpoint, which cannot be imported here (No module named 'torch'). Nothing was read or "
        "dropped; call last_complete_checkpoint() where torch is installed (where the run loads it).\n")
    assert [e["steps"] for e in recorded(directory / "training_status.json")] == [1]


# -- two ranks ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def late(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Launch]:
    """A torchrun run of one step where rank 1 writes a file of its own into the folder after the
    save, half of it, then the rest 2 s later, and only then reaches ``record``."""
    base = tmp_path_factory.mktemp("dcp_late")
    launch = torchrun(torch_python, base, dir=str(base / "ckpt"), steps=1, late=True)
    try:
        launch.each("done")
        assert launch.ended() == 0, launch.stderr()
    finally:
        launch.close()
        leftovers(str(base))
    return base / "ckpt", launch


def test_the_record_waits_for_every_rank_and_lists_its_files_whole(late: tuple[Path, Launch]) -> None:
    directory, launch = late
    arrived = launch.event("arrive", 1)
    ours, theirs = launch.each("recorded")
    # Rank 0's record() returned only after rank 1 reached its own; both got the same entry.
    assert ours["t"] >= arrived["t"]
    assert ours["files"] == theirs["files"] == on_disk(directory / "step-1")
    assert ours["files"]["step-1/extra-rank1.bin"] == 100_000  # its final size, not the half written at first
    assert {"step-1/.metadata", "step-1/__0_0.distcp", "step-1/__1_0.distcp"} < set(ours["files"])
    [entry] = recorded(directory / "training_status.json")
    assert (entry["steps"], entry["file_path"], entry["files"]) == (1, "step-1", ours["files"])


@pytest.fixture(scope="module")
def server(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """tests/_dcp_trainer.py's fork server: torch, FSDP and DCP imported once for the campaigns'
    forty-odd runs, each forked with torchrun's environment."""
    where = tmp_path_factory.mktemp("dcp_workers")
    with Workers(torch_python, TRAINER, where, env={"GLOO_SOCKET_IFNAME": "lo"}, bound=BOUND,
                 defaults={"timeout": BOUND}) as started:
        yield started


@pytest.mark.parametrize("layout", ["folders", "inplace"])
def test_kills_at_random_moments_resume_from_the_newest_recorded_step(workers: Workers, tmp_path: Path,
                                                                      seed: int, layout: str) -> None:
    """SIGKILL one rank or both at random moments, a good share inside saves, 20 times. After each
    kill (every process ended) the status file is read; the next run resumes from exactly its newest
    step, on both ranks; the same run measures what the library's own way would load.

    - ``folders``: ``dcp.save`` into ``step-<n>``, then ``record(keep=3)``; theirs: the highest
      ``step-*`` folder (what a loop without trainstatus takes) must load.
    - ``inplace``: every step saved into ``latest`` with ``trainstatus.integrations.dcp.save``;
      theirs: DCP's own load of ``latest``, judged by the digest of the model it holds against the
      digests recorded at every step (deterministic: the same step gives the same bytes in every
      run). A digest of no step is a torn folder loaded without a word; trainstatus's resume from
      ``latest`` must find exactly the newest recorded step's digest there. A kill inside the save
      of the only folder leaves nothing recorded: the run starts over, saying why.

    At the end the parameters equal those of an uninterrupted run of as many steps, bit for bit."""
    rng = random.Random(seed)
    inplace = layout == "inplace"
    directory, status = tmp_path / "ckpt", tmp_path / "ckpt" / "training_status.json"
    kills, newest, resumes = 20, 0, 0
    digests: dict[int, str] = {}  # the model's digest on disk as each step's save left it (inplace)
    tally: collections.Counter[str] = collections.Counter()
    saves = [0.05]  # seconds each save took (save-begin to its end), to aim kills inside saves
    end = "recorded" if inplace else "save-end"
    for kill_number in range(kills + 1):
        final = kill_number == kills
        options: dict[str, Any] = {"dir": str(directory), "steps": newest + 4 if final else 10**6, "theirs": True}
        options.update({"inplace": True} if inplace else {"keep": 3})
        # Named at the resume: a save of the first folder killed after its .metadata, before the record.
        unrecorded = not newest and any((folder / ".metadata").is_file()
                                        for folder in directory.glob("latest" if inplace else "step-*"))
        run = workers.start(**options)
        victims = [0, 1]
        try:
            run.each("pid")
            moment = "final" if final else rng.choice(["start", "any", "in save", "in save"])
            if moment == "start":  # in the check of the library's own way, the resume, or the first step
                time.sleep(rng.uniform(0.0, 1.5))
            else:
                run.each("resumed")
            if final:
                done = run.finished()
            else:
                victims = rng.choice([[0], [1], [0, 1]])
                if moment == "any":
                    time.sleep(rng.uniform(0.0, 0.6))
                elif moment == "in save":
                    run.event("save-begin", victims[-1], step=newest + rng.randint(1, 3))
                    time.sleep(rng.uniform(0.0, sorted(saves)[len(saves) // 2]))
                run.kill(victims)
                run.kill([0, 1])  # the survivor, once its collectives fail (or at once)
                run.exits()
        finally:
            run.kill([0, 1])
        events = run.events
        digests.update({e["step"]: e["digest"] for e in events if e["event"] == "recorded" and e["rank"] == 0
                        and e.get("digest")})
        # Both ranks resumed from exactly the newest recorded step (or the kill came first).
        for resumed in (e for e in events if e["event"] == "resumed"):
            where = (directory / "latest" if inplace else directory / f"step-{newest}") if newest else None
            assert (resumed["path"], resumed["step"]) == (str(where) if where else None, newest), (kill_number,
                                                                                                  resumed)
            expected = []
            if unrecorded and resumed["rank"] == 0:
                expected = [f"TrainingStatusCheckpointWarning: Passed over {'latest' if inplace else 'step-'}"]
            assert [w[:len(x)] for w, x in zip(resumed["warnings"], expected)] == expected, (kill_number, resumed)
            assert len(resumed["warnings"]) == len(expected), (kill_number, resumed)
            resumes += resumed["rank"] == 0 and resumed["path"] is not None
        theirs = sorted((e for e in events if e["event"] == "theirs"), key=lambda e: e["rank"])
        if len(theirs) == 2 and theirs[0]["path"] is not None:
            tally["theirs tried"] += 1
            loaded = all(e["ok"] for e in theirs)
            tally["theirs failed"] += not loaded
            if inplace and loaded:  # rank 0 says the digest of what it loaded
                tally["theirs torn"] += theirs[0]["digest"] not in digests.values()
                # trainstatus resumes from this very folder: it must hold the newest record's bytes
                # (unknown when the kill fell between the record's write and its event: the final
                # run's parameters, equal to an uninterrupted run's, still show any torn resume)
                if newest in digests:
                    assert theirs[0]["digest"] == digests[newest], (kill_number, newest)
        if final:
            break
        # Where the kill landed, as the children printed it.
        tally["group" if len(victims) == 2 else "one rank"] += 1
        landed = set()
        for rank in (0, 1):
            mine = [(e["event"], e.get("step")) for e in events if e["rank"] == rank]
            begun = {e["step"]: e["t"] for e in events if e["rank"] == rank and e["event"] == "save-begin"}
            saves += [e["t"] - begun[e["step"]] for e in events if e["rank"] == rank and e["event"] == end]
            last = max(begun, default=0)
            if rank in victims and last and (end, last) not in mine:
                landed.add("save")
            elif rank in victims and last and ("recorded", last) not in mine:
                landed.add("record")
        tally["inside a save"] += "save" in landed
        tally["in a record"] += landed == {"record"}
        # The status file after the kill: in order, at most keep=3 entries (one in place), every
        # folder there with its .metadata, never behind what it recorded before, unless the only
        # folder was being saved over (then nothing is listed).
        entries = recorded(status)
        steps = [e["steps"] for e in entries]
        assert steps == sorted(steps) and len(steps) <= (1 if inplace else 3), (kill_number, steps)
        assert all((directory / e["file_path"] / ".metadata").is_file() for e in entries), (kill_number, entries)
        assert not steps or steps[-1] >= newest, (kill_number, steps, newest)
        if inplace and not steps:
            tally["started over"] += newest > 0
        newest = steps[-1] if steps else 0
    assert tally["inside a save"] > 0, tally
    # An uninterrupted run of as many steps ends with the same parameters, bit for bit.
    reference = workers.start(dir=str(tmp_path / "reference"), steps=newest + 4,
                              **({"inplace": True} if inplace else {"keep": 3}))
    assert reference.finished()[0]["digest"] == done[0]["digest"] is not None
    how = ("saved in place into latest with dcp.save (trainstatus's)" if inplace else
           "dcp.save into step-<n>, then record(keep=3)")
    theirs_way = ("DCP's own load of latest" if inplace else "the highest step-* folder (a loop without trainstatus)")
    print(f"\nDCP with FSDP2 (2 ranks, forked with torchrun's environment), {how}: {kills} SIGKILLs at random "
          f"moments ({tally['one rank']} of one rank, {tally['group']} of both; {tally['inside a save']} inside a "
          f"save, {tally['in a record']} after a save, before its record returned):\n"
          f"  last_complete_checkpoint: {resumes} resumes from a checkpoint, 0 failed, 0 torn, 0 went back past the "
          f"newest record" + (f"; {tally['started over']} started over, saying so (the only folder was being saved "
                               "over)" if inplace else "") +
          "; final parameters equal to an uninterrupted run's, bit for bit\n"
          f"  {theirs_way}: {tally['theirs failed']} of {tally['theirs tried']} would have failed to load"
          + (f", {tally['theirs torn']} loaded a torn folder without a word" if inplace else ""))
    sys.stdout.flush()


def test_an_elastic_restart_resumes_every_rank_from_the_newest_recorded_step(torch_python: Path, tmp_path: Path,
                                                                             no_leftovers: None) -> None:
    # torchrun --max-restarts=1: rank 1 dies once step 2 is recorded; torchrun ends rank 0 and
    # starts both again, which resume from step 2 together and finish.
    directory = tmp_path / "ckpt"
    launch = elastic(torch_python, TRAINER, {"dir": str(directory), "steps": 4, "keep": 3, "exit_once": [1, 2],
                                             "timeout": BOUND}, tmp_path, bound=BOUND)
    after = restarted(launch)
    assert [(e["path"], e["step"], e["warnings"]) for e in after] == [(str(directory / "step-2"), 2, [])] * 2
    assert [e["steps"] for e in recorded(directory / "training_status.json")] == [2, 3, 4]


# -- a rank that stops, and node-local folders -------------------------------------------------


def error_once_rank_1_left(python: Path, tmp_path: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's ``error`` when rank 1 leaves (exit status 3) as ``options`` say; rank 0 ends well."""
    launches = started_directly(python, tmp_path, options)
    with launches[0], launches[1]:
        error = launches[0].event("error", 0)
        assert launches[1].ended() == 3, launches[1].stderr()
        finished(launches[:1])
    return error


def test_a_rank_that_leaves_before_its_record_is_named_by_rank_0(torch_python: Path, tmp_path: Path,
                                                                  no_leftovers: None) -> None:
    # Rank 1 ends (os._exit) after its dcp.save returned, before record(): rank 0's record raises
    # within the timeout given (5 s), naming rank 1, and records nothing.
    directory = tmp_path / "ckpt"
    error = error_once_rank_1_left(torch_python, tmp_path, {"dir": str(directory), "steps": 1, "timeout": 5,
                                                             "exit_before_record": 1})
    assert error["type"] == "TrainingStatusCollectiveError"
    assert error["message"] == (
        f"Rank 0 of 2 on {HOST}, recording {directory / 'step-1'} (step 1): rank 1 (the last it reached: the check "
        f"of choosing the newest complete checkpoint of {directory}) did not answer within 5 s ([Rank 0]: Ranks 1 "
        "failed to pass monitoredBarrier in 5000 ms). Nothing more was recorded or chosen by this rank. Look at that "
        "rank's own output (it may have crashed or be stuck in its save); a larger timeout= helps only a rank that "
        "is slow, not one that stopped.")
    assert error["seconds"] < BOUND
    assert recorded(directory / "training_status.json") == []


def test_a_rank_that_leaves_after_the_barrier_is_named_by_rank_0(torch_python: Path, tmp_path: Path,
                                                                 no_leftovers: None) -> None:
    # Rank 1 passes the record's barrier, then ends before the gather of the ranks' views.
    directory = tmp_path / "ckpt"
    error = error_once_rank_1_left(torch_python, tmp_path, {"dir": str(directory), "steps": 1, "timeout": 5,
                                                             "exit_after": [1, "monitored_barrier"]})
    assert recorded(directory / "training_status.json") == []
    assert error["type"] == "TrainingStatusCollectiveError"
    # Torch's own error names a peer address only; the store of the process group says which rank
    # never reached the gather.
    assert error["message"].startswith(
        f"Rank 0 of 2 on {HOST}, recording {directory / 'step-1'} (step 1): rank 1 (the last it reached: the "
        f"barrier of recording {directory / 'step-1'} (step 1)) did not answer within 5 s ("), error["message"]


def test_a_rank_late_past_the_timeout_is_named_and_raises_too(torch_python: Path, tmp_path: Path,
                                                              no_leftovers: None) -> None:
    # Rank 1 waits (for the test) before its record until rank 0's has raised, naming it; then its
    # own record raises too, saying it came late. Neither hangs; nothing is recorded.
    directory = tmp_path / "ckpt"
    launches = started_directly(torch_python, tmp_path, {"dir": str(directory), "steps": 1, "timeout": 5,
                                                          "hold_before_record": 1, "linger": True})
    with launches[0], launches[1]:
        first = launches[0].event("error", 0)
        assert launches[1].process.stdin is not None
        launches[1].process.stdin.write("go\n")
        launches[1].process.stdin.flush()
        second = launches[1].event("error", 1)
        finished(launches)
    assert (first["type"], second["type"]) == ("TrainingStatusCollectiveError",) * 2
    what = f"recording {directory / 'step-1'} (step 1)"
    assert first["message"].startswith(
        f"Rank 0 of 2 on {HOST}, {what}: rank 1 (the last it reached: the check of choosing the newest complete "
        f"checkpoint of {directory}) did not answer within 5 s ([Rank 0]: Ranks 1 failed to pass monitoredBarrier "
        "in 5000 ms). "), first["message"]
    # Rank 1 says it was the late one (issue 38: it used to say "rank 0 did not answer").
    assert second["message"].startswith(
        f"Rank 1 of 2 on {HOST}, {what}: this rank was the late one. It reached the barrier of {what} "), \
        second["message"]
    assert first["seconds"] < BOUND and second["seconds"] < BOUND
    assert recorded(directory / "training_status.json") == []


def errors_on_nodes(python: Path, tmp_path: Path, root: Path, options: dict[str, Any]) -> list[dict[str, Any]]:
    """Ranks 0 and 1 as if on two machines: each in a mount namespace of its own where ``root`` is
    its node's folder (``tmp_path/node0``, ``node1``: two local disks), under hostname node0, node1;
    the ``error`` of each, once both ended well."""
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir(exist_ok=True)
    root.mkdir()

    def wrap(rank: int, argv: list[str]) -> list[str]:
        script = (f"hostname node{rank} && mount --bind {shlex.quote(str(nodes[rank]))} {shlex.quote(str(root))} "
                  f"&& exec {shlex.join(argv)}")
        return ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", script]

    launches = started_directly(python, tmp_path, {"dir": str(root), "timeout": BOUND, **options}, wrap)
    with launches[0], launches[1]:
        errors = [launch.event("error", rank) for rank, launch in enumerate(launches)]
        finished(launches)
    return errors


def test_a_save_into_node_local_folders_is_refused_on_every_rank(torch_python: Path, tmp_path: Path,
                                                                  no_leftovers: None) -> None:
    # dcp.save succeeds (each rank writes into its own node's folder; .metadata on node 0's), but
    # the record sees rank 1's shard missing from rank 0's view: both ranks raise the same error.
    root = tmp_path / "ckpt"
    errors = errors_on_nodes(torch_python, tmp_path, root, {"steps": 1})
    folder = root / "step-1"
    for error in errors:
        assert (error["type"], error["ranks"], error["hosts"]) == ("TrainingStatusCheckpointNotShared", [1], ["node1"])
        assert error["message"] == (
            f"Cannot record {folder} (step 1): the ranks do not see the same files in {folder}: rank 1 on node1 wrote "
            "__1_0.distcp, which rank 0 on node0 does not see. Nothing was recorded. Every rank must write its files "
            "into one folder that every node sees at the same path (a shared filesystem); node-local output folders "
            "cannot hold a checkpoint that every rank resumes from.")
        assert error["seconds"] < BOUND
    assert sorted(os.listdir(tmp_path / "node0" / "step-1")) == [".metadata", "__0_0.distcp"]
    assert sorted(os.listdir(tmp_path / "node1" / "step-1")) == ["__1_0.distcp"]
    assert not (tmp_path / "node0" / "training_status.json").exists()


def test_a_resume_from_a_checkpoint_only_node_0_has_is_refused_on_every_rank(
        torch_python: Path, tmp_path: Path, late: tuple[Path, Launch], no_leftovers: None) -> None:
    # Node 0's folder holds a whole recorded checkpoint (made by a run on one shared folder), node
    # 1's is empty: last_complete_checkpoint raises the same error on both ranks, naming rank 1.
    shutil.copytree(late[0], tmp_path / "node0")
    root = tmp_path / "ckpt"
    errors = errors_on_nodes(torch_python, tmp_path, root, {"steps": 1})
    for error in errors:
        assert (error["type"], error["ranks"], error["hosts"]) == ("TrainingStatusCheckpointNotShared", [1], ["node1"])
        assert error["message"] == (
            f"Not every rank can resume from the newest complete checkpoint of {root}: rank 1 on node1: "
            f"{root / 'step-1' / '.metadata'} is not there. Every rank must see the same "
            "checkpoint folder (rank 1 cannot), so none resumes. Put the checkpoints on storage every node mounts at "
            "the same path (a shared filesystem), or copy the folder to every node's path, and start again.")
        assert error["seconds"] < BOUND
    assert [e["steps"] for e in recorded(tmp_path / "node0" / "training_status.json")] == [1]  # nothing dropped
    assert os.listdir(tmp_path / "node1") == []


# -- a folder saved over in place (issue 38) -------------------------------------------------------


def test_a_folder_saved_over_in_place_with_save_is_never_loaded_torn(torch_python: Path, tmp_path: Path,
                                                                      no_leftovers: None) -> None:
    # Every step saved into ckpt/latest with trainstatus.integrations.dcp.save. At step 3 rank 1 is
    # killed once the save is planned, before its shard is written; rank 0 writes its shard of step
    # 3 over step 2's. The folder then mixes two steps with the same sizes: DCP's own load of it
    # succeeds, and gives a model that is neither step 2's nor step 3's. trainstatus had unlisted
    # it before the save: the resume does not load it, and says so.
    directory = tmp_path / "ckpt"
    first = torchrun(torch_python, tmp_path, dir=str(directory), steps=5, inplace=True, die_in_write=[1, 3],
                     timeout=BOUND)
    try:
        assert first.ended() != 0
    finally:
        first.close()
    saved = {e["step"]: e["digest"] for e in first.events if e["event"] == "recorded" and e["rank"] == 0}
    assert sorted(saved) == [1, 2] and None not in saved.values()
    assert [e["type"] for e in first.events if e["event"] == "error"] != []  # rank 0's save failed
    assert recorded(directory / "training_status.json") == []  # unlisted before step 3's save
    second = torchrun(torch_python, tmp_path, dir=str(directory), steps=2, inplace=True, theirs=True,
                      timeout=BOUND)
    try:
        theirs = second.each("theirs")
        resumed = second.each("resumed")
        assert second.ended() == 0, second.stderr()
    finally:
        second.close()
    assert all(e["ok"] for e in theirs)  # DCP's own load of latest raised nothing...
    assert theirs[0]["digest"] not in saved.values()  # ...and loaded neither step 2 nor step 3: torn
    status = directory / "training_status.json"
    for event in resumed:
        assert (event["path"], event["step"]) == (None, 0)
    assert resumed[0]["warnings"] == [
        f"TrainingStatusCheckpointWarning: Passed over latest in {directory}: torch.distributed.checkpoint folders "
        f"not recorded in {status} (a save that did not finish, one saved over in place while the run stopped, or "
        "one saved without trainstatus.integrations.dcp.record or save), so not known to be whole. "
        "last_complete_checkpoint() returns None: the run starts from scratch. If one of them is whole and yours, "
        "record it (record(folder, step)) or load it yourself; if the status file is elsewhere, pass status_path=."]
    assert resumed[1]["warnings"] == []
    assert [(e["file_path"], e["steps"]) for e in recorded(status)] == [("latest", 2)]  # saved over, listed again


def test_a_folder_saved_over_in_place_resumes_from_its_newest_step(torch_python: Path, tmp_path: Path,
                                                                    no_leftovers: None) -> None:
    directory = tmp_path / "ckpt"
    for steps in (3, 5):
        launch = torchrun(torch_python, tmp_path, dir=str(directory), steps=steps, inplace=True, timeout=BOUND)
        try:
            resumed = launch.each("resumed")
            assert launch.ended() == 0, launch.stderr()
        finally:
            launch.close()
        assert [(e["path"], e["step"]) for e in resumed] == [
            (str(directory / "latest") if steps == 5 else None, 3 if steps == 5 else 0)] * 2
        assert [(e["file_path"], e["steps"]) for e in recorded(directory / "training_status.json")] == [
            ("latest", steps)]


WORLD_SIZE_CHECK = r"""
import sys, warnings
from trainstatus.integrations.dcp import last_complete_checkpoint
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(last_complete_checkpoint(sys.argv[1]))
for w in caught:
    print(f"{w.category.__name__}: {w.message}")
"""


def test_a_checkpoint_of_two_ranks_resumed_by_one_process_says_so(torch_python: Path, tmp_path: Path,
                                                                   late: tuple[Path, Launch]) -> None:
    # DCP reshards (the resume proceeds); the recorded world_size is compared, and the change said once.
    directory = tmp_path / "ckpt"
    shutil.copytree(late[0], directory)
    done = subprocess.run([str(torch_python), "-c", WORLD_SIZE_CHECK, str(directory)], capture_output=True,
                          text=True, timeout=BOUND, check=False)
    assert done.returncode == 0, done.stderr
    chosen, warning = done.stdout.splitlines()
    assert chosen == str(directory / "step-1")
    assert warning == (
        f"TrainingStatusCheckpointWarning: {directory / 'step-1'} was saved by 2 ranks and this run has 1: "
        "torch.distributed.checkpoint reshards the state as dcp.load reads it (sharded tensors, DTensors, FSDP's "
        "state dicts); a tensor a loop saved per rank under one key is not resharded (each rank loads the one saved "
        "under its key, or none). Resume with the same number of ranks to have every rank's own state back.")


# -- folders on an object store (issue 38, item 2) -------------------------------------------------

REMOTE = Path(__file__).resolve().parent / "_dcp_remote.py"


def test_folders_on_s3_are_recorded_by_every_rank_and_never_resumed_torn(torch_python: Path, s3_server: Any,
                                                                        tmp_path: Path) -> None:
    # dcp.save(checkpoint_id="s3://...") through torch's FsspecWriter (s3fs; moto's S3 server), 2 ranks:
    # each folder recorded once every rank's save returned (its objects and their sizes, world_size
    # 2), keep=2 removing the oldest only after it left the list; a resume on both ranks from the
    # newest. Then ckpt/latest saved over in place, rank 1 killed before its shard's upload at step
    # 2: latest had left the list first, and the resume names it and starts over.
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ckpt"
    client = s3_server.client()
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_server.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def run(where: str, mode: str, steps: int, *die: int, ranks: int = 2) -> tuple[int, list[dict[str, Any]]]:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
        done = subprocess.run([str(torch_python), *launcher, str(REMOTE), where, mode, str(steps), *map(str, die)],
                              capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        return done.returncode, events

    def listed(prefix: str) -> list[dict[str, Any]]:
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/training_status.json")["Body"].read()
        return list(json.loads(body)["dcp"]["checkpoints"])

    def folders(prefix: str) -> list[str]:
        found = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
        return sorted({o["Key"].split("/")[1] for o in found if o["Key"].count("/") > 1})

    code, events = run(url, "steps", 3)
    assert code == 0, events
    shards = {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    entries = listed("ckpt")
    assert [(e["file_path"], e["steps"], e["world_size"]) for e in entries] == [("step-2", 2, 2), ("step-3", 3, 2)]
    for entry in entries:
        assert {f.split("/", 1)[1] for f in entry["files"]} == shards
    assert folders("ckpt") == ["step-2", "step-3"]  # step-1 removed, after it left the list
    code, events = run(url, "steps", 1)
    assert code == 0, events
    assert sorted((e["rank"], e["path"], e["step"], e["w"]) for e in events if e["event"] == "resumed") == [
        (0, f"{url}/step-3", 3, 3.0), (1, f"{url}/step-3", 3, 4.0)]  # each rank its own shard of step 3

    # A shard of the newest folder replaced by an object of another size: passed over, and said.
    client.put_object(Bucket=bucket, Key="ckpt/step-4/__1_0.distcp", Body=b"another")
    code, events = run(url, "steps", 0, ranks=1)
    [resumed] = [e for e in events if e["event"] == "resumed"]
    assert (resumed["path"], resumed["step"]) == (f"{url}/step-3", 3), resumed
    assert resumed["warnings"][0].startswith(
        f"{url}/step-3 is the newest whole checkpoint recorded in {url}/training_status.json; the newer ones cannot "
        "be resumed from: step-4/__1_0.distcp has 7 bytes, "), resumed
    assert any("was saved by 2 ranks and this run has 1" in w for w in resumed["warnings"]), resumed
    # A checkpoint folder given for the folder above it: refused, naming it.
    code, events = run(f"{url}/step-3", "steps", 0, ranks=1)
    [refused] = [e for e in events if e["event"] == "refused"]
    assert (code, refused["type"]) == (3, "TrainingStatusValueError"), (code, events)
    assert refused["message"].startswith(f"last_complete_checkpoint('{url}/step-3'): {url}/step-3 is a "
                                         f"torch.distributed.checkpoint folder itself (it holds .metadata). Pass the "
                                         f"folder above it, {url},"), refused

    inplace = f"s3://{bucket}/inplace"
    code, events = run(inplace, "inplace", 1)
    assert code == 0 and [e["file_path"] for e in listed("inplace")] == ["latest"]
    code, events = run(inplace, "inplace", 1, 2)  # rank 1 killed inside the save of step 2
    assert code != 0
    assert listed("inplace") == []  # unlisted before any rank wrote into it
    # DCP's own load of it (what a loop that loads latest does) succeeds: torn (w0 2.0 of step 2
    # beside w1 2.0 of step 1, never saved together; "step" is the copy of whichever rank DCP kept)
    # once rank 0's upload finished before torchrun stopped it, else step 1 as it was ("1 1.0 2.0").
    theirs = subprocess.run([str(torch_python), "-c", (
        "import sys, torch, torch.distributed.checkpoint as dcp\n"
        "state = {'w0': torch.zeros(4), 'w1': torch.zeros(4), 'step': torch.tensor(0)}\n"
        "dcp.load(state, checkpoint_id=sys.argv[1])\n"
        "print(int(state['step']), float(state['w0'][0]), float(state['w1'][0]))"), f"{inplace}/latest"],
        capture_output=True, text=True, timeout=120, env=env)
    assert theirs.stdout.split() in (["1", "2.0", "2.0"], ["2", "2.0", "2.0"], ["1", "1.0", "2.0"]), (
        theirs.stdout + theirs.stderr[-2000:])
    print(f"DCP's own load of the latest folder after the kill: {theirs.stdout.strip()}")  # -s shows it
    code, events = run(inplace, "inplace", 0)
    assert code == 0
    for event in (e for e in events if e["event"] == "resumed"):
        assert (event["path"], event["step"]) == (None, 0)
    warned = [w for e in events if e["event"] == "resumed" for w in e["warnings"]]
    assert warned == [f"Passed over latest in {inplace}: torch.distributed.checkpoint folders not recorded in "
                      f"{inplace}/training_status.json (a save that did not finish, one saved over in place while the "
                      "run stopped, or one saved without trainstatus.integrations.dcp.record or save), so not known to "
                      "be whole. last_complete_checkpoint() returns None: the run starts from scratch. If one of them "
                      "is whole and yours, record it (record(folder, step)) or load it yourself; if the status file is "
                      "elsewhere, pass status_path=."], warned
