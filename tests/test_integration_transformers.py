"""trainstatus.integrations.transformers on the Trainer's real training loop (a tiny torch module on
random tensors, no hub: HF_HUB_OFFLINE=1).

Every test runs the real library in children started with .venv-torch's interpreter
(tests/_transformers_trainer.py), so they are all in the ``integrations`` group (the ``torch_python``
fixture marks them). The random-kill test measures, on the same kills, how often Transformers' own
resume (``get_last_checkpoint``: the highest ``checkpoint-N``) fails and prints both figures:
docs/transformers.md quotes them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _trainer_child import ChildTrainer, OwnResume, users_line

from trainstatus import StatusStore

TRAINER = Path(__file__).resolve().parent / "_transformers_trainer.py"
OFFLINE = {"HF_HUB_OFFLINE": "1"}
CALLED = users_line(TRAINER, "last_complete_checkpoint(")  # where the warnings of these calls point
TRAINED = users_line(TRAINER, "run.train(")


class Trainer(ChildTrainer):
    """One run of tests/_transformers_trainer.py, offline."""

    script = TRAINER

    def __init__(self, python: Path, **options: Any) -> None:
        super().__init__(python, env=OFFLINE, **options)


def recorded(directory: Path, status: Path | None = None) -> list[dict[str, Any]]:
    status = status or directory / "training_status.json"
    if not status.exists():
        return []  # killed before the first checkpoint
    with StatusStore(status) as store:
        return list(store.get("transformers", "checkpoints") or [])


def steps(directory: Path, status: Path | None = None) -> list[int]:
    return [e["steps"] for e in recorded(directory, status)]


def folders(directory: Path) -> list[str]:
    names = [n for n in os.listdir(directory) if n.startswith("checkpoint-")] if directory.exists() else []
    return sorted(names, key=lambda n: int(n.split("-")[1]))


@pytest.fixture(scope="module")
def trained(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A run of 12 steps saving every 2 with save_total_limit=5, and its events."""
    directory = tmp_path_factory.mktemp("transformers") / "out"
    return directory, Trainer(torch_python, dir=str(directory), max_steps=12, limit=5).finish()


@pytest.fixture
def run(trained: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    """A copy of the trained folder for one test to damage."""
    directory = tmp_path / "out"
    shutil.copytree(trained[0], directory)
    return directory


def test_save_total_limit_is_applied_after_the_record_and_given_back(trained: tuple[Path, dict[str, Any]]) -> None:
    directory, events = trained
    # The Trainer did not rotate (the limit read None during training); the callback did, after
    # each record, and put the limit back on the arguments at the end.
    assert (events["ready"]["limit"], events["done"]["limit"]) == (None, 5)
    assert folders(directory) == [f"checkpoint-{n}" for n in (4, 6, 8, 10, 12)]
    entries = recorded(directory)
    assert [(e["steps"], e["file_path"]) for e in entries] == [(n, f"checkpoint-{n}") for n in (4, 6, 8, 10, 12)]
    newest = entries[-1]
    assert newest["files"] == {f"checkpoint-12/{name}": (directory / "checkpoint-12" / name).stat().st_size
                               for name in os.listdir(directory / "checkpoint-12")}
    assert "checkpoint-12/trainer_state.json" in newest["files"] and "checkpoint-12/model.safetensors" in newest["files"]
    assert newest["reward"] is None  # no metric_for_best_model: nothing ranked


def test_a_newest_folder_without_trainer_state_json_is_passed_over(torch_python: Path, run: Path) -> None:
    # What a kill inside a save leaves: checkpoint-14 with the weights written, trainer_state.json
    # (written last) not yet, nothing recorded. get_last_checkpoint returns it; the resume fails,
    # also trainer.train(resume_from_checkpoint=True), which calls it, in a Trainer without the
    # callback. With the callback, True resumes from last_complete_checkpoint, before loading.
    partial = run / "checkpoint-14"
    partial.mkdir()
    shutil.copy(run / "checkpoint-12" / "model.safetensors", partial)
    events = Trainer(torch_python, dir=str(run), max_steps=14, limit=5, theirs=True, resume=True).finish()
    passed_over = (f"TrainingStatusCheckpointWarning: Passed over checkpoint-14 in {run}: not recorded in "
                   f"{run / 'training_status.json'} (a save that did not finish, or one made without "
                   "TrainStatusCallback), so not known to be whole; get_last_checkpoint() would return the newest "
                   "of them. They are left on disk: a run saves over each when it reaches its step.")
    assert events["resumed"]["path"] == str(run / "checkpoint-12")
    assert (events["resumed"]["warnings"], events["resumed"]["where"]) == ([passed_over], [CALLED])
    theirs = events["theirs"]
    assert (theirs["path"], theirs["ok"]) == (str(partial), False)
    assert "FileNotFoundError" in theirs["error"] and "trainer_state.json" in theirs["error"]
    # train(resume_from_checkpoint=True) loaded checkpoint-12, said so where the user called it.
    assert events["done"]["error"] is None
    assert (events["ready"]["step"], events["done"]["step"]) == (12, 14)
    assert (events["ready"]["warnings"], events["ready"]["where"]) == ([passed_over], [TRAINED])
    # The run saved over the partial folder, then recorded it whole.
    assert steps(run) == [6, 8, 10, 12, 14] and "checkpoint-14/trainer_state.json" in recorded(run)[-1]["files"]


def test_damaged_or_deleted_recorded_folders_are_skipped_with_a_warning(torch_python: Path, run: Path) -> None:
    weights = run / "checkpoint-12" / "model.safetensors"
    whole = weights.stat().st_size
    with open(weights, "r+b") as f:  # cut short
        f.truncate(whole // 2)
    with open(run / "checkpoint-8" / "model.safetensors", "r+b") as f:  # its header damaged, its size kept
        f.seek(8)
        f.write(b"\0" * 16)
    (run / "checkpoint-6" / "trainer_state.json").unlink()
    shutil.rmtree(run / "checkpoint-10")  # a listed folder deleted by hand
    events = Trainer(torch_python, dir=str(run), max_steps=12, limit=5).finish()
    assert (events["resumed"]["path"], events["ready"]["step"]) == (str(run / "checkpoint-4"), 4)
    # In a Trainer user's words: what is resumed from, why not the newer ones, what becomes of them.
    assert events["resumed"]["warnings"] == [
        f"TrainingStatusCheckpointWarning: {run / 'checkpoint-4'} is the newest whole checkpoint recorded in "
        f"{run / 'training_status.json'}; the newer ones cannot be resumed from: checkpoint-12/model.safetensors "
        f"has {whole // 2:,} bytes, {whole:,} recorded; checkpoint-10 is missing; checkpoint-8/model.safetensors: "
        "its header is not JSON (Expecting value: line 1 column 1 (char 0)); checkpoint-6/trainer_state.json is "
        "missing. They are left on disk: a run saves over each folder when it reaches its step. If you have whole "
        f"copies of them, stop, put them back in {run} and start again to resume from the newest."]
    assert events["resumed"]["where"] == [CALLED]
    # Training went on from step 4 and saved over the damaged folders, each recorded again whole.
    assert steps(run) == [4, 6, 8, 10, 12] and folders(run) == [f"checkpoint-{n}" for n in (4, 6, 8, 10, 12)]
    assert recorded(run)[-1]["files"]["checkpoint-12/model.safetensors"] == whole


def test_a_kill_in_the_trainers_rotation_window_leaves_the_old_folder(torch_python: Path, tmp_path: Path) -> None:
    # save_total_limit=1: the Trainer removes checkpoint-2 inside its save of checkpoint-4, before
    # on_save. Killed in on_save at step 4 (before the record), checkpoint-2 must still be there.
    # The status file is elsewhere (status_path=).
    directory, status = tmp_path / "out", tmp_path / "run_logs" / "status.json"
    options = {"dir": str(directory), "status_path": str(status), "limit": 1}
    trainer = Trainer(torch_python, **options, max_steps=8, kill_on_save=4)
    trainer.until("ready")
    assert trainer.process.wait(timeout=120) == -9
    trainer.kill()
    assert folders(directory) == ["checkpoint-2", "checkpoint-4"] and steps(directory, status) == [2]
    assert not (directory / "training_status.json").exists()
    events = Trainer(torch_python, **options, max_steps=6).finish()
    assert events["resumed"]["path"] == str(directory / "checkpoint-2")
    assert "Passed over checkpoint-4" in events["resumed"]["warnings"][0]
    assert (events["ready"]["step"], events["done"]["step"]) == (2, 6)
    assert folders(directory) == ["checkpoint-6"] and steps(directory, status) == [6]
    # A run started afresh saves over the recorded folders: their entries go first, with a warning
    # (kept, step 6 would stay listed after the new step 2, and the limit would remove the newer).
    # With a best checkpoint (the first: tests/_transformers_trainer.py), the limit of 1 keeps it
    # and the newest during training, and only it at the end, as the Trainer does.
    events = Trainer(torch_python, **options, max_steps=4, fresh=True, best=True).finish()
    assert events["ready"]["warnings"] == [
        f"TrainingStatusCheckpointWarning: This run starts at step 0 in {directory}, where {status} recorded "
        "checkpoints up to step 6: they are no longer listed, and this run saves over their folders as it reaches "
        "their steps. If you meant to continue, stop and pass trainer.train(resume_from_checkpoint="
        f"{str(directory / 'checkpoint-6')!r}), the newest whole one, before this run saves over it; to start over "
        "without this warning, train into another output_dir."]
    assert events["ready"]["where"] == [TRAINED]
    assert events["done"]["best"] == str(directory / "checkpoint-2")
    assert folders(directory) == ["checkpoint-2", "checkpoint-6"] and steps(directory, status) == [2]


def test_every_recorded_checkpoint_damaged_is_told_in_a_trainer_users_words(torch_python: Path, run: Path) -> None:
    # Every recorded folder's weights cut short. trainer.train(resume_from_checkpoint=True) refuses
    # before loading anything; last_complete_checkpoint returns None and says why and what the
    # run then does; the run at step 0 says it saves over them (not "pass last_complete_checkpoint",
    # which the user just did).
    sizes = {}
    for n in (4, 6, 8, 10, 12):
        weights = run / f"checkpoint-{n}" / "model.safetensors"
        sizes[n] = weights.stat().st_size
        with open(weights, "r+b") as f:
            f.truncate(100)
    status = run / "training_status.json"
    why = "; ".join(f"checkpoint-{n}/model.safetensors has 100 bytes, {sizes[n]:,} recorded" for n in (12, 10, 8, 6, 4))
    events = Trainer(torch_python, dir=str(run), max_steps=2, resume=True).finish()
    assert events["done"]["error"] == (
        f"TrainingStatusCheckpointError: trainer.train(resume_from_checkpoint=True) found no checkpoint to resume "
        f"from in {run}: none of the checkpoints recorded in {status} is whole ({why}). Nothing was loaded. To start "
        "a new run there, pass resume_from_checkpoint=None (it saves over these folders as it reaches their steps); "
        "to resume from a folder you know is whole, pass that folder; to keep them, train into another output_dir.")
    assert "ready" not in events and steps(run) == [4, 6, 8, 10, 12]
    events = Trainer(torch_python, dir=str(run), max_steps=2).finish()
    assert events["resumed"]["path"] is None
    assert events["resumed"]["warnings"] == [
        f"TrainingStatusCheckpointWarning: No checkpoint recorded in {status} can be resumed from: {why}. "
        "last_complete_checkpoint() returns None: trainer.train(resume_from_checkpoint=None) starts at step 0 and "
        f"saves over these folders as it reaches their steps. To keep these files, stop and move them out of {run}, "
        f"or train into another output_dir; if you have whole copies of them, put them back in {run} and start again."]
    assert events["ready"]["warnings"] == [
        f"TrainingStatusCheckpointWarning: This run starts at step 0 in {run}, where {status} recorded checkpoints "
        f"up to step 12, none of them whole ({why}): they are no longer listed, and this run saves over their folders "
        f"as it reaches their steps. To keep them, stop and move them out of {run}, or train into another output_dir."]
    assert (events["resumed"]["where"], events["ready"]["where"]) == ([CALLED], [TRAINED])
    assert steps(run) == [2]


def test_a_run_rolled_back_to_an_older_checkpoint_drops_the_newer_entries(torch_python: Path, run: Path) -> None:
    # Resumed from checkpoint-6 by name while 8, 10 and 12 are recorded: the run saves over their
    # folders file by file, so their entries go before it does (else a kill while it saves
    # checkpoint-8 leaves checkpoint-12 of the abandoned run the newest recorded one, and
    # last_complete_checkpoint would resume from it). Their folders stay until saved over.
    events = Trainer(torch_python, dir=str(run), max_steps=8, limit=5, resume="checkpoint-6").finish()
    assert (events["ready"]["step"], events["done"]["step"], events["ready"]["warnings"]) == (6, 8, [])
    assert steps(run) == [4, 6, 8]
    assert folders(run) == [f"checkpoint-{n}" for n in (4, 6, 8, 10, 12)]


def test_save_total_limit_keeps_the_best_checkpoint_of_a_relative_output_dir(torch_python: Path,
                                                                              tmp_path: Path) -> None:
    # The best checkpoint is the first (tests/_transformers_trainer.py); output_dir is relative,
    # so state.best_model_checkpoint is "out/checkpoint-2" while the list resolves its folders
    # absolute. With a limit of 2 the rotation keeps the best and the newest, as the Trainer does.
    events = Trainer(torch_python, cwd=str(tmp_path), dir="out", max_steps=8, limit=2, best=True).finish()
    assert events["done"]["best"] == os.path.join("out", "checkpoint-2")
    assert folders(tmp_path / "out") == ["checkpoint-2", "checkpoint-8"] and steps(tmp_path / "out") == [2, 8]


def test_best_model_checkpoint_never_names_a_missing_or_damaged_folder(torch_python: Path, tmp_path: Path) -> None:
    # The evaluation gets worse as the model fits (tests/_transformers_trainer.py): checkpoint-2 is
    # the best, and every later trainer_state.json names it. output_dir is relative ("out", the
    # child in the run's folder), so the Trainer names it relative too and a copy of the run
    # names its own folders.
    base = tmp_path / "base"
    base.mkdir()
    events = Trainer(torch_python, cwd=str(base), dir="out", max_steps=8, best=True).finish()
    assert events["done"]["best"] == os.path.join("out", "checkpoint-2")
    rewards = {e["steps"]: e["reward"] for e in recorded(base / "out") if e["steps"] != 2}
    runner_up = min(rewards, key=rewards.__getitem__)
    for damage in ("checkpoint-2/model.safetensors has 100 bytes", "checkpoint-2 is missing"):
        run = tmp_path / damage.split()[-1]
        shutil.copytree(base, run)
        if damage.endswith("bytes"):  # the Trainer itself would load it at the end and fail
            with open(run / "out" / "checkpoint-2" / "model.safetensors", "r+b") as f:
                f.truncate(100)
        else:  # the Trainer itself forgets the folder, but keeps its best_metric
            shutil.rmtree(run / "out" / "checkpoint-2")
        events = Trainer(torch_python, cwd=str(run), dir="out", max_steps=10, best=True).finish()
        assert events["resumed"]["path"] == os.path.join("out", "checkpoint-8")
        ready = events["ready"]
        assert (ready["best"], ready["best_step"]) == (os.path.join("out", f"checkpoint-{runner_up}"), runner_up)
        [warning] = ready["warnings"]
        assert f"best checkpoint {os.path.join('out', 'checkpoint-2')} is not a whole checkpoint ({damage}" in warning
        assert (f"best_model_checkpoint is now {os.path.join('out', f'checkpoint-{runner_up}')} "
                f"(loss {rewards[runner_up]})") in warning


def test_import_trainstatus_imports_no_hugging_face_library_where_they_are_installed(torch_python: Path) -> None:
    code = ("import sys, trainstatus, trainstatus.integrations\n"
            "trainstatus.StatusStore, trainstatus.CheckpointList\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in\n"
            "             ('torch', 'transformers', 'accelerate', 'safetensors', 'huggingface_hub')))\n")
    result = subprocess.run([str(torch_python), "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def unrecorded_newer(directory: Path, entries: list[dict[str, Any]]) -> list[str]:
    """The checkpoint folders newer than the newest recorded one: saves a kill cut short."""
    newest = max((e["steps"] for e in entries), default=-1)
    return [n for n in folders(directory) if int(n.split("-")[1]) > newest]


def test_random_kills_resume_from_the_last_recorded_checkpoint(torch_python: Path, tmp_path: Path, seed: int) -> None:
    """SIGKILL a Trainer run at random moments (20 kills), saves slowed by wide layers, with
    save_total_limit=2. After each kill the next run resumes with ``last_complete_checkpoint``: the
    Trainer loads it, it is the newest recorded checkpoint (never older), and training goes on; the
    same child measures Transformers' own resume from ``get_last_checkpoint`` on the same folder."""
    rng = random.Random(seed)
    directory = tmp_path / "out"
    kills = 20
    own = OwnResume()
    mid_save = resumes = 0
    last_recorded = listed_before = 0
    for kill in range(kills + 1):
        trainer = Trainer(torch_python, dir=str(directory), theirs=True, every=3, limit=2, width=1024, seed=kill,
                          max_steps=10**6 if kill < kills else last_recorded + 6)
        try:
            resumed = trainer.until("resumed")
            assert resumed["path"] == (str(directory / f"checkpoint-{last_recorded}") if last_recorded else None)
            # The only warning: the folders of saves the kills cut short, passed over.
            assert all(w.startswith("TrainingStatusCheckpointWarning: Passed over checkpoint-")
                       for w in resumed["warnings"]), (kill, resumed)
            resumes += resumed["path"] is not None
            own.add(trainer.until("theirs"))
            # The Trainer loaded it in the child: never behind what was recorded before the kill.
            assert trainer.until("ready")["step"] == last_recorded, (kill, resumed)
        except BaseException:
            trainer.kill()
            raise
        if kill == kills:
            break
        trainer.kill_after(rng.uniform(0.0, 1.2))  # a random moment: in a step or a save
        entries = recorded(directory)
        mid_save += bool(unrecorded_newer(directory, entries))
        found = [e["steps"] for e in entries]
        # The list never names a folder that is gone, never goes back, and keeps save_total_limit=2:
        # one more after a kill between a record and the rotation that follows it in another write,
        # on what the run started with (a run killed in that window again, right after its first
        # record, holds one more than the kill before left: seen once, 4 after 3).
        assert found == sorted(found) and len(found) <= max(listed_before, 2) + 1, (kill, found, listed_before)
        listed_before = len(found)
        assert all((directory / e["file_path"]).is_dir() for e in entries)
        assert not found or found[-1] >= last_recorded
        last_recorded = found[-1] if found else 0
    # Training goes on after the last kill, to its end.
    assert trainer.finish()["done"]["step"] == last_recorded + 6
    assert steps(directory) == [last_recorded + 3, last_recorded + 6]  # the rotation caught up: 2 again
    print(f"\nTransformers integration, {kills} SIGKILLs at random moments ({mid_save} inside a save, before its "
          "record):\n"
          f"  last_complete_checkpoint: {resumes} resumes from a checkpoint, 0 failed, "
          "0 went back past the last recorded one\n"
          f"  get_last_checkpoint (Transformers' own): {own.failed} of {own.tried} resumes failed")
    sys.stdout.flush()


def test_the_run_folder_is_checked_from_any_current_directory(trained: tuple[Path, dict[str, Any]]) -> None:
    # The status file records where its relative paths are rooted (the run folder itself: "."),
    # so `trainstatus check --files` finds every file from the project folder too.
    directory, _ = trained
    status = directory / "training_status.json"
    with StatusStore(status) as store:
        assert store.get("transformers", "checkpoint_root") == "."
    done = subprocess.run([sys.executable, "-m", "trainstatus", "check", "--files", f"{directory.name}/training_status.json"],
                          cwd=directory.parent, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"info: transformers: relative checkpoint paths are looked up under {directory}, recorded in "
            "transformers/checkpoint_root\n") in done.stdout


WRONG_PATHS = r"""
import json, os, sys
from trainstatus.integrations.transformers import last_complete_checkpoint
out = sys.argv[1]
status = open(os.path.join(out, "training_status.json"), "rb").read()
seen = []
for given in (os.path.join(out, sorted(n for n in os.listdir(out) if n.startswith("checkpoint-"))[-1]),
              "s3://bucket/" + os.path.basename(out)):
    try:
        seen.append(["returned", last_complete_checkpoint(given)])
    except Exception as exc:
        seen.append([type(exc).__name__, str(exc)])
seen.append(["unchanged", open(os.path.join(out, "training_status.json"), "rb").read() == status])
named = os.path.join(sys.argv[2], "checkpoint-500")  # an output_dir of that name: it holds the list
os.makedirs(named)
for name in ("trainer_state.json", "training_status.json"):
    open(os.path.join(named, name), "w").write("{}")
seen.append(["returned", last_complete_checkpoint(named)])
print(json.dumps(seen))
"""


def test_a_checkpoint_folder_or_a_remote_path_is_refused_never_a_fresh_run(torch_python: Path, run: Path) -> None:
    # last_complete_checkpoint("out/checkpoint-212") used to return None: the run trained from step
    # 0, and the callback then unlisted checkpoints 210-212 (still on disk) as ones it saves over.
    done = subprocess.run([str(torch_python), "-c", WRONG_PATHS, str(run), str(run.parent)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (kind, message), (remote_kind, remote), unchanged, named = json.loads(done.stdout)
    assert named == ["returned", None]
    newest = sorted(folders(run))[-1]
    assert kind == "TrainingStatusValueError", message
    assert message.startswith(f"last_complete_checkpoint('{run / newest}'): {run / newest} is a checkpoint folder "
                              f"itself. Pass the folder above it, the run's output_dir, {run}:"), message
    assert remote_kind == "TrainingStatusValueError" and "this is not a local path" in remote, remote
    assert unchanged == ["unchanged", True]


STATUS_INSIDE = r"""
import json, os, sys
from transformers import TrainerControl, TrainerState, TrainingArguments
from trainstatus.integrations.transformers import TrainStatusCallback, last_complete_checkpoint
out = sys.argv[1]
inside = os.path.join(out, "checkpoint-2", "training_status.json")
seen = []
try:
    seen.append(["returned", last_complete_checkpoint(out, status_path=inside)])
except Exception as exc:
    seen.append([type(exc).__name__, str(exc)])
args = TrainingArguments(output_dir=out, report_to="none", use_cpu=True)
try:
    TrainStatusCallback(status_path=inside).on_train_begin(args, TrainerState(), TrainerControl())
    seen.append(["began", None])
except Exception as exc:
    seen.append([type(exc).__name__, str(exc)])
print(json.dumps([seen, os.path.exists(inside)]))
"""


def test_a_status_file_inside_a_checkpoint_folder_is_refused(torch_python: Path, tmp_path: Path) -> None:
    # The Trainer's rotation removes checkpoint-2 whole: the status file, the whole list, with it.
    out = tmp_path / "out"
    done = subprocess.run([str(torch_python), "-c", STATUS_INSIDE, str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen, made = json.loads(done.stdout.splitlines()[-1])
    inside = out / "checkpoint-2" / "training_status.json"
    said = (f"the status file {inside} would lie inside the checkpoint folder {out / 'checkpoint-2'}, which the "
            "Trainer saves into and its rotation removes, the status file with it.")
    [(read, message), (began, refusal)] = seen
    assert read == began == "TrainingStatusValueError", seen
    assert message.startswith(f"last_complete_checkpoint('{out}'): {said}"), message
    assert refusal.startswith(f"TrainStatusCallback: {said}"), refusal
    assert all(message.endswith("Nothing was read or changed.") for _, message in seen)
    assert not made


def test_a_second_job_on_the_output_dir_is_refused_before_it_trains(torch_python: Path, tmp_path: Path) -> None:
    # Job A trains into out/ (stopped by SIGSTOP once it began, holding its run lease); job B is
    # started on the same out/: it stops at on_train_begin naming A, with no step trained and no
    # folder written. A goes on to its end and leaves no lease; the next run resumes from A's.
    out = tmp_path / "out"
    first = Trainer(torch_python, dir=str(out), max_steps=8, limit=2)
    try:
        first.until("ready")
        os.kill(first.process.pid, signal.SIGSTOP)
        try:
            second = Trainer(torch_python, dir=str(out), max_steps=8).finish()
        finally:
            os.kill(first.process.pid, signal.SIGCONT)
        done = first.finish()["done"]
    finally:
        first.kill()
    error = second["done"]["error"]
    assert error.startswith(f"TrainingStatusInUseError: TrainStatusCallback: another job is training on "
                            f"{out / 'training_status.json'}: process {first.process.pid} on "), error
    assert ", started 20" in error and error.endswith("This job stopped before writing anything.")
    assert "ready" not in second and second["done"]["step"] == 0
    assert done["error"] is None and done["step"] == 8 and steps(out) == [6, 8] and folders(out) == [
        "checkpoint-6", "checkpoint-8"]
    assert (out / "training_status.json.run").read_bytes() == b""  # A ended: nothing for the next job to take over
    third = Trainer(torch_python, dir=str(out), max_steps=10).finish()
    assert third["resumed"]["path"] == str(out / "checkpoint-8") and third["done"]["error"] is None

