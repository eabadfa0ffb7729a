"""trainstatus.integrations.accelerate on Hugging Face Accelerate's real saves and loads: 2 CPU
processes (gloo) started by ``torchrun`` (``python -m torch.distributed.run``) or forked the way
torchrun starts them, and one process alone.

The children are tests/_accelerate_trainer.py, run by .venv-torch's interpreter (the
``torch_python`` fixture puts these tests in the ``integrations`` group): the ``base`` run under
torchrun, the others forked by one server process that imports torch and Accelerate once
(``Workers``: the kill test makes twenty-odd runs). The random-kill test measures, on the same
kills, how often Accelerate's own resume (``accelerator.load_state()``: the highest-numbered
``checkpoint_<n>``) fails or loads without a process's RNG state, and prints both figures:
docs/accelerate.md quotes them.

Every process is killed by pid, and none outlives its test: a launch ends with all of its processes
(``Launch.ended``), and the ``workers`` fixture kills, and fails a test that leaves, any worker of
the runs the test started.
"""

from __future__ import annotations

import collections
import json
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _launch
import pytest
from _launch import Launch, Run, Workers, elastic, leftovers, restarted
from _lease_holder import another_job
from _trainer_child import users_line

TRAINER = Path(__file__).resolve().parent / "_accelerate_trainer.py"
BOUND = 180.0  # seconds: a generous bound for "within a bound", and every child's timeout
ENV = {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
LOADED = users_line(TRAINER, "path = load_state(")  # where the warnings of these calls point
SAVED = users_line(TRAINER, "saved = save_state(")


# -- the children -------------------------------------------------------------------------------


def torchrun(python: Path, where: Path, **options: Any) -> Launch:
    """``python -m torch.distributed.run --standalone --nproc_per_node=2`` of the child."""
    return Launch([str(python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(TRAINER),
                   json.dumps({"timeout": BOUND, **options})], where / f"torchrun-{time.monotonic_ns()}.err",
                  env=ENV, stdin=subprocess.DEVNULL, bound=BOUND)


@pytest.fixture(scope="module")
def server(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """tests/_accelerate_trainer.py's fork server (tests/_forkserver.py): a run starts in about a
    second, not the ten or twenty of three fresh interpreters importing torch on two busy cores, and
    the kill test makes twenty-odd. The workers run the code they run under torchrun (the ``base``
    run is one); when one is killed, the test takes the agent's part and stops the other."""
    with Workers(torch_python, TRAINER, tmp_path_factory.mktemp("accelerate_workers"), env=ENV, bound=BOUND,
                 defaults={"timeout": BOUND}) as started:
        yield started


# -- reading what a run left --------------------------------------------------------------------


def recorded(project: Path) -> list[dict[str, Any]]:
    return _launch.recorded(project / "training_status.json", "accelerate")


def counters(project: Path) -> list[int]:
    return [e["steps"] for e in recorded(project)]


def on_disk(project: Path) -> list[str]:
    folder = project / "checkpoints"
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(names, key=lambda name: int(name.split("_")[1]))


def files(folder: Path, project: Path) -> dict[str, int]:
    return {str(p.relative_to(project)): p.stat().st_size for p in folder.iterdir()}


# -- a run of 4 steps, the ground of the tests that damage it -----------------------------------


@pytest.fixture(scope="module")
def base(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Launch]:
    """A torchrun run of 4 steps, a save after each (counters 0-3), total_limit=2."""
    where = tmp_path_factory.mktemp("accelerate_base")
    launch = torchrun(torch_python, where, dir=str(where / "project"), steps=4)
    try:
        launch.finished()
    finally:
        leftovers(str(where))
    return where / "project", launch


def copy_of(base: tuple[Path, Launch], tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(base[0], project)
    return project


def test_every_process_s_files_are_recorded_and_total_limit_applies_after_the_record(
        base: tuple[Path, Launch]) -> None:
    project, launch = base
    # Accelerate's own rotation (before the save) was off: when its save returned, every listed
    # folder was still there; ours kept total_limit=2 after each record.
    assert [e["gone"] for e in launch.all("written")] == [[]] * 4
    assert [e["folders"] for e in launch.all("saved")] == [
        ["checkpoint_0"], ["checkpoint_0", "checkpoint_1"], ["checkpoint_1", "checkpoint_2"],
        ["checkpoint_2", "checkpoint_3"]]
    entries = recorded(project)
    assert [(e["steps"], e["file_path"]) for e in entries] == [(2, "checkpoints/checkpoint_2"),
                                                                (3, "checkpoints/checkpoint_3")]
    for entry in entries:
        folder = project / entry["file_path"]
        assert entry["files"] == files(folder, project)
        assert {"random_states_0.pkl", "random_states_1.pkl", "model.safetensors", "optimizer.bin",
                "custom_checkpoint_0.pkl"} == {name.rsplit("/", 1)[1] for name in entry["files"]}
        assert entry["world_size"] == 2
    # Both processes returned each save's folder.
    for rank in (0, 1):
        assert [e["path"] for e in launch.all("saved", rank)] == [
            str(project / "checkpoints" / f"checkpoint_{n}") for n in range(4)]
    assert not (project / "checkpoints" / "training_status.json").exists()  # beside checkpoints/, never in it


def rng_at(launch: Launch, step: int, rank: int) -> str:
    """The digest of the torch RNG state process ``rank`` had when it saved after step ``step``."""
    return str(launch.event("save-begin", rank, step=step)["rng"])


def test_a_newest_folder_without_a_process_s_random_states_is_passed_over(workers: Workers, tmp_path: Path,
                                                                          base: tuple[Path, Launch]) -> None:
    # What a kill of process 1 in a save leaves: checkpoint_4 with every file but its
    # random_states_1.pkl (process 0 finished), never recorded. And checkpoint_3's weights damaged
    # after their record, their size kept (a header overwritten).
    project, ran = copy_of(base, tmp_path), base[1]
    checkpoints = project / "checkpoints"
    shutil.copytree(checkpoints / "checkpoint_3", checkpoints / "checkpoint_4")
    (checkpoints / "checkpoint_4" / "random_states_1.pkl").unlink()
    with open(checkpoints / "checkpoint_3" / "model.safetensors", "r+b") as f:
        f.seek(8)
        f.write(b"\0" * 16)
    launch = workers.start(dir=str(project), steps=6, theirs=True)
    launch.finished()
    # Accelerate's own resume loads checkpoint_4 on both processes without a word; process 1's RNG
    # is simply not restored (it keeps the state it started with).
    theirs = launch.each("theirs")
    assert [(e["path"], e["ok"], e["rng_file"]) for e in theirs] == [(str(checkpoints / "checkpoint_4"), True, True),
                                                                      (str(checkpoints / "checkpoint_4"), True, False)]
    assert theirs[0]["rng"] == rng_at(ran, 4, 0)
    assert theirs[1]["rng"] == theirs[1]["fresh"] != rng_at(ran, 4, 1)
    # Ours: checkpoint_2 on both processes, every process's RNG state restored, the save counter after it.
    resumed = launch.each("resumed")
    assert [(e["path"], e["step"], e["counter"]) for e in resumed] == [(str(checkpoints / "checkpoint_2"), 3, 3)] * 2
    assert [e["rng"] for e in resumed] == [rng_at(ran, 3, 0), rng_at(ran, 3, 1)]
    status = project / "training_status.json"
    header = "its header is not JSON (Expecting value: line 1 column 1 (char 0))"
    assert resumed[0]["warnings"] == [
        f"TrainingStatusCheckpointWarning: {checkpoints / 'checkpoint_2'} is the newest whole checkpoint recorded in "
        f"{status}; the newer ones cannot be resumed from: checkpoints/checkpoint_3/model.safetensors: {header}. "
        "They are left as they are: this run's save_state() unlists each before it saves over its folder. If you "
        f"have whole copies of them, stop, put them back in {project} and start again to resume from the newest.",
        f"TrainingStatusCheckpointWarning: Passed over checkpoints/checkpoint_4 in {project}: not recorded in "
        f"{status} (a save that did not finish, or one made without trainstatus.integrations.accelerate.save_state), "
        "so not known to be whole; Accelerate's own load_state() would load the newest of them. They are left on "
        "disk: this run's save_state() removes each before it saves into its name."]
    assert resumed[0]["where"] == [LOADED] * 2
    assert resumed[1]["warnings"] == []  # the main process reads and warns; the others take its choice
    # The run saved over checkpoint_3 and the partial checkpoint_4 (each unlisted, then removed,
    # before Accelerate saved into its name, where it would raise), and kept total_limit=2.
    assert [e["path"] for e in launch.all("saved")] == [str(checkpoints / f"checkpoint_{n}") for n in (3, 4, 5)]
    assert [e["gone"] for e in launch.all("written")] == [[]] * 3
    assert counters(project) == [4, 5] and on_disk(project) == ["checkpoint_4", "checkpoint_5"]
    assert recorded(project)[0]["files"] == files(checkpoints / "checkpoint_4", project)


def test_after_accelerate_s_own_load_its_saves_overwrite_the_rotation_and_then_fail(
        workers: Workers, tmp_path: Path, base: tuple[Path, Launch]) -> None:
    # Accelerate's own way on the run of 4 steps (checkpoint_2 and checkpoint_3 on disk), one
    # process: accelerator.load_state() loads checkpoint_3 and leaves the save counter at 0. Its
    # saves go to checkpoint_0, 1, 2, each time removing the lowest-numbered folder first (the one
    # saved the step before), and the fourth runs into checkpoint_3 and raises.
    project = copy_of(base, tmp_path)
    checkpoints = project / "checkpoints"
    launch = workers.start(1, dir=str(project), steps=8, mode="accelerate")
    [done] = launch.finished(failed=1)
    resumed = launch.event("resumed", 0)
    assert (resumed["path"], resumed["error"], resumed["step"], resumed["counter"]) == (
        str(checkpoints / "checkpoint_3"), None, 4, 0)
    assert [(e["path"], e["folders"]) for e in launch.all("saved")] == [
        (str(checkpoints / "checkpoint_0"), ["checkpoint_0", "checkpoint_3"]),
        (str(checkpoints / "checkpoint_1"), ["checkpoint_1", "checkpoint_3"]),
        (str(checkpoints / "checkpoint_2"), ["checkpoint_2", "checkpoint_3"])]
    error = launch.event("error", 0)
    assert (error["step"], error["type"], error["message"]) == (8, "ValueError", (
        f"Checkpoint directory {checkpoints / 'checkpoint_3'} (3) already exists. Please manually override "
        "`self.save_iteration` with what iteration to start with."))
    # The run trained to step 8; what Accelerate resumes from next (the highest number) is step 4,
    # and the saves of steps 5-7 are gone.
    assert done["step"] == 8 and on_disk(project) == ["checkpoint_3"]


def test_trainstatus_save_state_after_accelerate_s_own_load_warns_and_saves(
        workers: Workers, tmp_path: Path, base: tuple[Path, Launch]) -> None:
    # The same load, then trainstatus' save_state: the counter at 0 over recorded checkpoints is
    # said (with the way to continue), they are unlisted, and every save works, over the old folders.
    project = copy_of(base, tmp_path)
    checkpoints, status = project / "checkpoints", project / "training_status.json"
    launch = workers.start(1, dir=str(project), steps=8, mode="mixed")
    launch.finished()
    assert launch.event("resumed", 0)["path"] == str(checkpoints / "checkpoint_3")
    saved = launch.all("saved")
    assert [e["path"] for e in saved] == [str(checkpoints / f"checkpoint_{n}") for n in range(4)]
    assert saved[0]["warnings"] == [
        f"TrainingStatusCheckpointWarning: save_state() saves checkpoints/checkpoint_0 with Accelerate's save counter "
        f"at 0 (accelerator.project_configuration.iteration) in {project}, where {status} recorded checkpoints up to "
        "counter 3: they are no longer listed, and this run saves over their folders as its counter reaches them. If "
        f"you meant to continue, stop and load the newest whole one, {checkpoints / 'checkpoint_3'}, with "
        f"accelerator.load_state({str(checkpoints / 'checkpoint_3')!r}) and set "
        "accelerator.project_configuration.iteration = 4 (Accelerate's load_state() leaves the counter where it was; "
        "load_state(accelerator) of trainstatus.integrations.accelerate sets it), before this run saves over it; to "
        "start over without this warning, give Accelerate another project_dir."]
    assert saved[0]["where"] == [SAVED] and all(e["warnings"] == [] for e in saved[1:])
    assert counters(project) == [2, 3] and on_disk(project) == ["checkpoint_2", "checkpoint_3"]
    assert recorded(project)[1]["files"] == files(checkpoints / "checkpoint_3", project)


def test_the_calls_errors_and_folders_of_your_own_naming(workers: Workers, tmp_path: Path,
                                                         base: tuple[Path, Launch]) -> None:
    project, explicit, sharded = copy_of(base, tmp_path), tmp_path / "ckpt", tmp_path / "sharded"
    launch = workers.start(1, role="api", project=str(project), explicit=str(explicit), sharded=str(sharded))
    results = launch.event("api", 0)["results"]
    assert launch.exits() == [0], launch.stderr()
    checkpoints = project / "checkpoints"
    assert results["project"] == {"value": str(checkpoints / "checkpoint_3"), "warnings": []}
    assert results["checkpoints"]["error"] == (
        f"TrainingStatusValueError: {checkpoints} has no training_status.json: it is Accelerate's checkpoints/ folder; "
        "the status file lies in project_dir, above it. Give the folder that holds the status file (project_dir with "
        f"automatic checkpoint naming): pass {str(project)!r}. Nothing was read or loaded.")
    assert results["folder"]["error"] == (
        f"TrainingStatusValueError: {checkpoints / 'checkpoint_3'} has no training_status.json: it is a checkpoint "
        "folder itself (it holds random_states_0.pkl). Give the folder that holds the status file (project_dir with "
        f"automatic checkpoint naming): pass the folder above it, or load it with "
        f"accelerator.load_state({str(checkpoints / 'checkpoint_3')!r}). Nothing was read or loaded.")
    assert results["not an accelerator"]["error"].startswith(
        "TrainingStatusTypeError: save_state(accelerator, ...) needs the accelerate.Accelerator of the run, not "
        "'object' (<object object at ")
    assert results["no input_dir"]["error"] == (
        "TrainingStatusValueError: load_state(accelerator) needs input_dir=, the folder that holds your checkpoint "
        "folders and the status file training_status.json, when automatic checkpoint naming is off (as "
        "accelerator.load_state() does); with ProjectConfiguration(automatic_checkpoint_naming=True) it is "
        "project_dir. Nothing was loaded.")
    assert results["no output_dir"]["error"] == (
        "TrainingStatusValueError: save_state(accelerator) needs output_dir=, the checkpoint folder, when automatic "
        "checkpoint naming is off; the status file training_status.json goes in the folder above it. Nothing was "
        "saved.")
    assert results["no project_dir"]["error"] == (
        "TrainingStatusValueError: save_state() with automatic checkpoint naming needs the Accelerator's project_dir "
        "(ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)): its checkpoints/ folder holds the "
        "checkpoints, and training_status.json lies beside it. Nothing was saved.")
    # Folders of your own naming: the status file in the folder above them; load_state(input_dir=
    # that folder) loads the newest and sets the save counter after it; a folder saved into again
    # is unlisted before the save, and recorded again after.
    assert [results[k]["value"] for k in ("save a", "save b", "load", "save a again")] == [
        str(explicit / "a"), str(explicit / "b"), str(explicit / "b"), str(explicit / "a")]
    assert results["counter"] == 2 and results["entries"] == [[1, "b"], [2, "a"]]
    # A torch.distributed.checkpoint folder inside (FSDP's sharded state): .metadata checked.
    assert [results[k]["value"] for k in ("sharded 0", "sharded 1", "sharded")] == [
        str(sharded / "checkpoints" / "checkpoint_0"), str(sharded / "checkpoints" / "checkpoint_1"),
        str(sharded / "checkpoints" / "checkpoint_0")]
    shard = "checkpoints/checkpoint_1/pytorch_model_fsdp_0/__0_0.distcp"
    [warning] = results["sharded"]["warnings"]
    assert warning.startswith(
        f"TrainingStatusCheckpointWarning: {sharded / 'checkpoints' / 'checkpoint_0'} is the newest whole checkpoint "
        f"recorded in {sharded / 'training_status.json'}; the newer ones cannot be resumed from: "
        "checkpoints/checkpoint_1/pytorch_model_fsdp_0/.metadata: names bytes 0-"), warning
    assert f" of __0_0.distcp, which has {(sharded / shard).stat().st_size:,} bytes recorded. They are left" in warning


def test_kills_at_random_moments_resume_from_the_newest_recorded_save(workers: Workers, tmp_path: Path,
                                                                      seed: int) -> None:
    """SIGKILL one process or both, at random moments, a good share inside saves, 20 times, with
    total_limit=2 and a save every step. After each kill (every process ended) the status file is
    read; the next run resumes from exactly its newest save, on both processes; the same run first
    measures Accelerate's own resume (``accelerator.load_state()``, the highest-numbered folder). At
    the end: total_limit folders recorded and on disk, and the parameters equal to those of an
    uninterrupted run of as many steps, bit for bit (every process's RNG state restored each time)."""
    rng = random.Random(seed)
    project = tmp_path / "project"
    checkpoints = project / "checkpoints"
    kills, newest, resumes = 20, -1, 0  # newest: the highest save counter recorded
    tally: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()  # the errors Accelerate's own resume raised
    # Seconds Accelerate's own save took (writing to written) and the whole save_state call
    # (save-begin to saved), to aim kills inside saves.
    writes, saves = [0.02], [0.05]
    runs: list[Run] = []
    for number in range(kills + 1):
        final = number == kills
        run = workers.start(dir=str(project), steps=newest + 4 if final else 10**6, theirs=True, width=1024,
                            params=True)
        runs.append(run)
        victims: list[int] = []
        if final:
            done = run.finished()
        else:
            moment = rng.choice(["start", "any", "in Accelerate's save", "in save"])
            # The last kill goes inside Accelerate's own save when none has yet (its writes take
            # some 20 ms: seen once, none of 20 random kills landed there), at once on "writing".
            forced = number == kills - 1 and tally["inside Accelerate's save"] == 0
            moment = "in Accelerate's save" if forced else moment
            if moment == "start":  # in the set-up, Accelerate's own load, or ours
                time.sleep(rng.uniform(0.0, 1.0))
            else:
                run.each("resumed")
            victims = rng.choice([[0], [1], [0, 1]])
            if moment == "any":
                time.sleep(rng.uniform(0.0, 0.6))
            elif moment == "in save":
                run.event("save-begin", victims[-1], step=newest + 1 + rng.randint(1, 3))
                time.sleep(rng.uniform(0.0, sorted(saves)[len(saves) // 2]))
            elif moment == "in Accelerate's save":
                run.event("writing", victims[-1], step=newest + 1 + rng.randint(1, 3))
                time.sleep(0.0 if forced else rng.uniform(0.0, sorted(writes)[len(writes) // 2]))
            run.kill(victims)
            if len(victims) == 1:  # torchrun's agent stops the other process soon after
                time.sleep(rng.uniform(0.0, 0.3))
                run.kill([0, 1])
            run.exits()
        events = run.events
        # Both processes resumed from exactly the newest recorded save (or the kill came first).
        for resumed in (e for e in events if e["event"] == "resumed"):
            expected = str(checkpoints / f"checkpoint_{newest}") if newest >= 0 else None
            assert (resumed["path"], resumed["step"], resumed["counter"]) == (expected, newest + 1, newest + 1), (
                number, resumed)
            # The only warnings: the folders of saves the kills cut short, passed over.
            assert all(w.startswith("TrainingStatusCheckpointWarning: Passed over checkpoints/checkpoint_")
                       for w in resumed["warnings"]), (number, resumed)
            resumes += resumed["rank"] == 0 and resumed["path"] is not None
        theirs = [e for e in events if e["event"] == "theirs"]
        if len(theirs) == 2 and theirs[0]["path"] is not None:
            tally["theirs tried"] += 1
            if not all(e["ok"] for e in theirs):
                tally["theirs failed"] += 1
                kinds.update({e["error"].split(":", 1)[0] for e in theirs if not e["ok"]})
            elif not all(e["rng_file"] for e in theirs):
                tally["theirs without an RNG state"] += 1
        if final:
            break
        tally["both" if len(victims) == 2 else "one"] += 1
        landed = set()
        for rank in victims:
            mine = [(e["event"], e.get("step")) for e in events if e["rank"] == rank]
            begun = {e["step"]: e["t"] for e in events if e["rank"] == rank and e["event"] == "save-begin"}
            writing = {e["step"]: e["t"] for e in events if e["rank"] == rank and e["event"] == "writing"}
            writes += [e["t"] - writing[e["step"]] for e in events if e["rank"] == rank and e["event"] == "written"]
            saves += [e["t"] - begun[e["step"]] for e in events if e["rank"] == rank and e["event"] == "saved"]
            last = max(begun, default=0)
            if last and ("saved", last) not in mine:
                landed.add("before" if ("writing", last) not in mine else
                           "write" if ("written", last) not in mine else "record")
        tally["inside Accelerate's save"] += "write" in landed
        tally["in the record"] += landed == {"record"}
        tally["inside save_state"] += bool(landed)
        # No listed folder was gone when Accelerate's save returned (its rotation comes first).
        assert all(e["gone"] == [] for e in events if e["event"] == "written" and e["rank"] == 0), number
        # The status file after the kill: in order, at most total_limit=2 entries, every folder
        # there with each recorded file, never behind what it recorded before.
        entries = recorded(project)
        found = [e["steps"] for e in entries]
        assert found == sorted(found) and len(found) <= 2, (number, found)
        assert all((project / name).is_file() for e in entries for name in e["files"]), (number, entries)
        assert not found or found[-1] >= newest, (number, found, newest)
        newest = found[-1] if found else -1
    assert tally["inside Accelerate's save"] > 0, tally
    # After the clean finish: total_limit folders recorded, and only those on disk.
    assert counters(project) == [newest + 2, newest + 3]
    assert on_disk(project) == [f"checkpoint_{newest + 2}", f"checkpoint_{newest + 3}"]
    # An uninterrupted run of as many steps: every step any run saved, it saved with that run's
    # parameters and RNG states, and the runs end with the same parameters, bit for bit.
    reference = workers.start(dir=str(tmp_path / "reference"), steps=newest + 4, width=1024, params=True)
    expected = reference.finished()
    uninterrupted = {(e["step"], e["rank"]): (e["params"], e["rng"]) for e in reference.all("save-begin", 0)
                     + reference.all("save-begin", 1)}
    diverged = sorted((e["run"], e["step"], e["rank"]) for run in runs for e in run.events if e["event"] == "save-begin"
                      and uninterrupted.get((e["step"], e["rank"])) != (e["params"], e["rng"]))
    if diverged:  # what the first run that went astray began from, and what it was told
        by_number = {run.number: run for run in runs}
        first, step, rank = diverged[0]
        [seen] = [e for e in by_number[first].all("save-begin", rank) if e["step"] == step]
        began = [e for e in by_number[first].events if e["event"] in ("theirs", "resumed")]
        before = by_number[first - 1].events[-10:] if first - 1 in by_number else []
        pytest.fail(f"runs left the uninterrupted run's path at (run, step, rank) {diverged[:6]}: at the first, "
                    f"parameters {'equal' if seen['params'] == uninterrupted[step, rank][0] else 'differ'}, RNG "
                    f"{'equal' if seen['rng'] == uninterrupted[step, rank][1] else 'differs'}; run {first} began "
                    f"with {began}; the run before ended with {before}")
    assert done[0]["digest"] == expected[0]["digest"] is not None
    inside, record = tally["inside Accelerate's save"], tally["in the record"]
    print(f"\nAccelerate (2 processes, total_limit=2, a save every step), {kills} SIGKILLs at random moments "
          f"({tally['one']} of one process, {tally['both']} of both; {tally['inside save_state']} inside save_state(): "
          f"{inside} in Accelerate's own save, {record} after it, in the record):\n"
          f"  trainstatus load_state: {resumes} resumes from a checkpoint, 0 failed, 0 went back past the newest "
          "record; final parameters equal to an uninterrupted run's, bit for bit\n"
          f"  accelerator.load_state() (Accelerate's own): {tally['theirs failed']} of {tally['theirs tried']} resumes "
          f"failed ({', '.join(f'{kind} {n}' for kind, n in kinds.most_common()) or 'none'}), "
          f"{tally['theirs without an RNG state']} more loaded without a process's RNG state")
    sys.stdout.flush()


DISAGREEING = r"""
import json, os, sys
from accelerate import Accelerator
from trainstatus.integrations.accelerate import save_state
accelerator = Accelerator()  # under torchrun without cpu=True on a machine with no GPU: 1 process a rank
try:
    said = ["saved", accelerator.num_processes]
    save_state(accelerator, os.path.join(sys.argv[1], "checkpoint"))
except Exception as exc:
    said = [type(exc).__name__, str(exc)]
with open(os.path.join(sys.argv[2], "said-" + os.environ["RANK"] + ".json"), "w") as f:  # not stdout: the
    json.dump(said, f)  # ranks' lines interleave there
"""


def test_accelerate_and_torch_counting_other_processes_is_refused_before_any_save(torch_python: Path,
                                                                                   tmp_path: Path) -> None:
    # Accelerate believed it had 1 process on each of 2 torchrun ranks: both wrote
    # random_states_0.pkl, trainstatus recorded world_size 2, refused every checkpoint at the resume,
    # and the run started over at step 0. Now the first save is refused, saying what to set.
    script = tmp_path / "disagreeing.py"
    script.write_text(DISAGREEING)
    done = subprocess.run([str(torch_python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(tmp_path / "run"), str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [json.loads((tmp_path / f"said-{rank}.json").read_text()) for rank in (0, 1)]
    assert [kind for kind, _ in said] == ["TrainingStatusError"] * 2, said
    for rank, (_, message) in enumerate(said):
        assert message.startswith(f"save_state() on rank {rank}: Accelerate counts 1 process(es), but "
                                  "torch.distributed has 2 ranks."), message
        assert "Accelerator(cpu=True)" in message and "ACCELERATE_USE_DEEPSPEED=true" in message
    assert not (tmp_path / "run").exists()


def test_an_elastic_restart_resumes_every_process_from_the_newest_recorded_checkpoint(torch_python: Path,
                                                                                      tmp_path: Path) -> None:
    # torchrun --max-restarts=1: rank 1 dies once step 2's folder is recorded; torchrun ends rank 0
    # and starts both again, which load it together and finish.
    where = tmp_path / "project"
    launch = elastic(torch_python, TRAINER, {"dir": str(where), "steps": 4, "exit_once": [1, 2]}, tmp_path, env=ENV,
                     bound=BOUND)
    after = restarted(launch)
    assert [e["step"] for e in after] == [2, 2] and after[0]["path"] == after[1]["path"] is not None, after


def test_a_second_job_on_the_project_is_refused_on_every_process_before_it_saves(workers: Workers,
                                                                                  tmp_path: Path) -> None:
    # Another job holds the run lease of project/training_status.json: the first save_state stops on
    # both processes alike, naming it, before Accelerate writes a file. Once it is gone, this one runs.
    project = tmp_path / "project"
    with another_job(str(project / "training_status.json"), run="first-job") as job:
        launch = workers.start(2, dir=str(project), steps=2)
        launch.finished(failed=2)
    for rank in (0, 1):
        error = launch.event("error", rank)
        assert (error["step"], error["type"]) == (1, "TrainingStatusInUseError"), error
        assert error["message"].startswith(
            f"trainstatus.integrations.accelerate.save_state: another job is training on "
            f"{project / 'training_status.json'}: process {job.pid} on "), error["message"]
    assert on_disk(project) == [] and recorded(project) == []
    workers.start(2, dir=str(project), steps=2).finished()
    assert counters(project) == [0, 1]

