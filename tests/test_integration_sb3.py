"""trainstatus.integrations.sb3 on Stable-Baselines3's real training loop (PPO and DQN on CartPole).

Every test runs the real library in children started with .venv-torch's interpreter
(tests/_sb3_trainer.py), so they are all in the ``integrations`` group (the ``torch_python``
fixture marks them). The random-kill test measures, on the same kills, how often SB3's usual
resume (the newest ``*.zip``) fails to load and prints both figures: docs/sb3.md
quotes them.
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _lease_holder import another_job
from _trainer_child import ChildTrainer, OwnResume, users_line

from trainstatus import StatusStore

TRAINER = Path(__file__).resolve().parent / "_sb3_trainer.py"
SAVE_FREQ = 64  # one save per PPO rollout (n_steps=64)
CALLED, LEARNED = users_line(TRAINER, "last_complete_checkpoint("), users_line(TRAINER, "model.learn(")


class Trainer(ChildTrainer):
    """One run of tests/_sb3_trainer.py."""

    script = TRAINER


def recorded(directory: Path, prefix: str = "rl_model", status: Path | None = None) -> list[dict[str, Any]]:
    status = status or directory / "training_status.json"
    if not status.exists():
        return []  # killed before the first checkpoint
    with StatusStore(status) as store:
        return list(store.get(prefix, "checkpoints") or [])


def zips(directory: Path) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(str(directory / "*.zip")))


@pytest.fixture(scope="module")
def trained(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of a PPO run of 384 timesteps with keep=3: checkpoints at 256, 320 and 384."""
    directory = tmp_path_factory.mktemp("sb3") / "logs"
    Trainer(torch_python, dir=str(directory), save_freq=SAVE_FREQ, keep=3, steps=384).finish()
    return directory


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained folder for one test to damage."""
    directory = tmp_path / "logs"
    shutil.copytree(trained, directory)
    return directory


def test_keep_leaves_exactly_the_newest_n_checkpoints(trained: Path) -> None:
    assert zips(trained) == ["rl_model_256_steps.zip", "rl_model_320_steps.zip", "rl_model_384_steps.zip"]
    entries = recorded(trained)
    assert [(e["steps"], e["file_path"], e["auxillary_file_paths"]) for e in entries] == [
        (256, "rl_model_256_steps.zip", []), (320, "rl_model_320_steps.zip", []), (384, "rl_model_384_steps.zip", []),
    ]
    # No temp file of a save is left, and nothing else but the status file and its own files.
    assert not [n for n in os.listdir(trained) if n.endswith(".tmp")]


def test_a_zip_cut_in_half_is_skipped_with_a_warning(torch_python: Path, run: Path) -> None:
    newest = run / "rl_model_384_steps.zip"
    whole = newest.stat().st_size
    with open(newest, "r+b") as f:
        f.truncate(whole // 2)
    resumed = Trainer(torch_python, dir=str(run), save_freq=SAVE_FREQ, keep=3).finish()["resumed"]
    assert resumed["path"] == str(run / "rl_model_320_steps.zip")
    assert resumed["steps"] == 320  # PPO.load succeeded on it in the child
    # The size recorded with the entry catches it first; said in an SB3 user's words, at the call.
    assert resumed["warnings"] == [
        f"TrainingStatusCheckpointWarning: {run / 'rl_model_320_steps.zip'} is the newest whole checkpoint recorded "
        f"in {run / 'training_status.json'}; the newer ones cannot be resumed from: rl_model_384_steps.zip has "
        f"{whole // 2:,} bytes, {whole:,} recorded. They are left on disk: a run saves over each file when it "
        f"reaches its steps. If you have whole copies of them, stop, put them back in {run} and start again to "
        "resume from the newest."]
    assert resumed["where"] == [CALLED]


def test_a_zip_damaged_in_place_is_skipped_by_the_zip_check(torch_python: Path, run: Path) -> None:
    # Its recorded size intact (overwritten in the middle): the zip check catches it.
    newest = run / "rl_model_384_steps.zip"
    size = newest.stat().st_size
    with open(newest, "r+b") as f:
        f.seek(size // 3)
        f.write(b"\0" * (size // 3))
    resumed = Trainer(torch_python, dir=str(run), save_freq=SAVE_FREQ, keep=3).finish()["resumed"]
    assert (resumed["path"], resumed["steps"]) == (str(run / "rl_model_320_steps.zip"), 320)
    [warning] = resumed["warnings"]
    # Its size as recorded: the zip check names the member the damage hit (the zip's layout).
    assert re.fullmatch(
        re.escape(f"TrainingStatusCheckpointWarning: {run / 'rl_model_320_steps.zip'} is the newest whole checkpoint "
                  f"recorded in {run / 'training_status.json'}; the newer ones cannot be resumed from: "
                  "rl_model_384_steps.zip: ")
        + r"member \S+ fails its CRC check"
        + re.escape(". They are left on disk: a run saves over each file when it reaches its steps. If you have whole "
                    f"copies of them, stop, put them back in {run} and start again to resume from the newest."),
        warning), warning


def test_a_listed_file_deleted_by_hand_is_skipped(torch_python: Path, run: Path) -> None:
    (run / "rl_model_384_steps.zip").unlink()
    (run / "rl_model_320_steps.zip").unlink()
    resumed = Trainer(torch_python, dir=str(run), save_freq=SAVE_FREQ, keep=3).finish()["resumed"]
    assert (resumed["path"], resumed["steps"]) == (str(run / "rl_model_256_steps.zip"), 256)
    [warning] = resumed["warnings"]
    assert "rl_model_384_steps.zip is missing" in warning and "rl_model_320_steps.zip is missing" in warning


def test_nothing_recorded_starts_fresh_and_nothing_whole_warns(torch_python: Path, run: Path, tmp_path: Path) -> None:
    for name in zips(run):  # the recorded sizes kept: the zip check is what refuses them
        size = (run / name).stat().st_size
        (run / name).write_bytes(b"PK\x03\x04 not a whole zip".ljust(size, b"\0"))
    events = Trainer(torch_python, dir=str(run), save_freq=SAVE_FREQ, steps=64).finish()
    resumed, status = events["resumed"], run / "training_status.json"
    assert (resumed["path"], resumed["steps"]) == (None, 0)
    why = "; ".join(f"rl_model_{n}_steps.zip is not a whole SB3 model zip (File is not a zip file)" for n in (384, 320, 256))
    # In an SB3 user's words, pointing at the user's calls: what last_complete_checkpoint found,
    # then what the new run at 0 timesteps does over those files (not "load its checkpoint",
    # which the user just tried).
    assert resumed["warnings"] == [
        f"TrainingStatusCheckpointWarning: No checkpoint recorded in {status} can be resumed from: {why}. "
        "last_complete_checkpoint() returns None: a new model starts at 0 timesteps and saves over these files as "
        f"it reaches their steps. To keep these files, stop and move them out of {run}, or use another save_path or "
        f"name_prefix; if you have whole copies of them, put them back in {run} and start again."]
    assert events["done"]["warnings"] == [
        f"TrainingStatusCheckpointWarning: This run starts at 0 timesteps in {run}, where {status} recorded "
        f"checkpoints up to 384 steps, none of them whole ({why}). This run's checkpoints replace their files as it "
        "reaches the same steps; until then a resume passes over them with a warning. To keep them, stop and move "
        f"them out of {run}, or use another save_path or name_prefix."]
    assert (resumed["where"], events["done"]["where"]) == ([CALLED], [LEARNED])


def test_a_new_model_over_whole_checkpoints_is_told_how_to_continue(torch_python: Path, run: Path) -> None:
    events = Trainer(torch_python, dir=str(run), save_freq=SAVE_FREQ, keep=3, steps=64, fresh=True).finish()
    newest = run / "rl_model_384_steps.zip"
    assert events["done"]["warnings"] == [
        f"TrainingStatusCheckpointWarning: This run starts at 0 timesteps in {run}, where {run / 'training_status.json'} "
        f"recorded checkpoints up to 384 steps: last_complete_checkpoint() returns {newest} of that run until this one "
        "passes 384 steps, and this run's checkpoints replace that run's files of the same names. If you meant to "
        f"continue, stop, load it (PPO.load({str(newest)!r}, env=env)) and call learn(..., reset_num_timesteps=False); "
        "to start over without this warning, use another save_path or name_prefix."]
    assert events["done"]["where"] == [LEARNED]


def test_resume_continues_from_the_recorded_step_count(torch_python: Path, run: Path) -> None:
    events = Trainer(torch_python, dir=str(run), save_freq=SAVE_FREQ, keep=3, steps=128).finish()
    assert events["resumed"]["steps"] == 384
    assert events["done"]["steps"] == 384 + 128
    assert [e["steps"] for e in recorded(run)] == [384, 448, 512]
    assert zips(run) == ["rl_model_384_steps.zip", "rl_model_448_steps.zip", "rl_model_512_steps.zip"]


def test_status_path_and_name_prefix_put_the_record_where_they_say(torch_python: Path, tmp_path: Path) -> None:
    directory, status = tmp_path / "logs", tmp_path / "elsewhere" / "status.json"
    options = {"dir": str(directory), "status_path": str(status), "name_prefix": "cartpole", "save_freq": SAVE_FREQ}
    Trainer(torch_python, **options, steps=128).finish()
    assert zips(directory) == ["cartpole_128_steps.zip", "cartpole_64_steps.zip"]
    assert not (directory / "training_status.json").exists()
    assert [e["steps"] for e in recorded(directory, "cartpole", status)] == [64, 128]
    with StatusStore(status) as store:  # outside the status file's folder: recorded absolute
        assert store.get("cartpole", "checkpoint_root") == str(directory)
    resumed = Trainer(torch_python, **options).finish()["resumed"]
    assert (resumed["path"], resumed["steps"]) == (str(directory / "cartpole_128_steps.zip"), 128)


def test_replay_buffer_and_vecnormalize_files_are_named_as_sb3_names_them(torch_python: Path, tmp_path: Path) -> None:
    # DQN (it has a replay buffer) with VecNormalize, SB3's own CheckpointCallback beside ours in
    # the same run: the two folders hold the same names; ours lists the .pkl files in the entry.
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    Trainer(torch_python, algo="dqn", vecnormalize=True, dir=str(ours), sb3_dir=str(theirs), save_freq=SAVE_FREQ,
            save_replay_buffer=True, save_vecnormalize=True, steps=128).finish()
    names = sorted(n for n in os.listdir(theirs))
    assert names == ["rl_model_128_steps.zip", "rl_model_64_steps.zip",
                     "rl_model_replay_buffer_128_steps.pkl", "rl_model_replay_buffer_64_steps.pkl",
                     "rl_model_vecnormalize_128_steps.pkl", "rl_model_vecnormalize_64_steps.pkl"]
    assert sorted(n for n in os.listdir(ours) if not n.startswith(".") and "training_status" not in n) == names
    assert [(e["steps"], e["file_path"], e["auxillary_file_paths"]) for e in recorded(ours)] == [
        (64, "rl_model_64_steps.zip", ["rl_model_replay_buffer_64_steps.pkl", "rl_model_vecnormalize_64_steps.pkl"]),
        (128, "rl_model_128_steps.zip", ["rl_model_replay_buffer_128_steps.pkl", "rl_model_vecnormalize_128_steps.pkl"]),
    ]
    # A replay buffer cut short makes its checkpoint incomplete.
    buffer = ours / "rl_model_replay_buffer_128_steps.pkl"
    size = buffer.stat().st_size
    with open(buffer, "r+b") as f:
        f.truncate(size - 100)
    resumed = Trainer(torch_python, algo="dqn", vecnormalize=True, dir=str(ours), save_freq=SAVE_FREQ).finish()["resumed"]
    assert (resumed["path"], resumed["steps"]) == (str(ours / "rl_model_64_steps.zip"), 64)
    assert f"rl_model_replay_buffer_128_steps.pkl has {size - 100:,} bytes, {size:,} recorded" in resumed["warnings"][0]


CURRICULUM_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sb3_curriculum.py"


def test_the_curriculum_example_restores_its_lesson_from_the_status_file(torch_python: Path, tmp_path: Path) -> None:
    directory = tmp_path / "run"
    directory.mkdir()
    with StatusStore(directory / "training_status.json") as store:
        store.set("cartpole", "lesson", 2)  # as a run that reached lesson 2 left it

    def example(steps: int) -> list[str]:
        result = subprocess.run([str(torch_python), str(CURRICULUM_EXAMPLE), "--dir", str(directory),
                                 "--steps", str(steps), "--save-freq", "128"],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    assert example(256) == ["resumed from None at step 0, lesson 2", "trained to step 256, lesson 2"]
    # PPO trains whole rollouts (n_steps=256): 128 more steps are one rollout, to step 512.
    assert example(128) == [f"resumed from {directory}/rl_model_256_steps.zip at step 256, lesson 2",
                            "trained to step 512, lesson 2"]


def test_import_trainstatus_imports_neither_torch_nor_sb3_where_they_are_installed(torch_python: Path) -> None:
    code = ("import sys, trainstatus, trainstatus.integrations\n"
            "trainstatus.StatusStore, trainstatus.CheckpointList\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'stable_baselines3', 'gymnasium')))\n")
    result = subprocess.run([str(torch_python), "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


ATOMIC_WRITE = """
import os, sys
from trainstatus.integrations.sb3 import _write_atomically
target = os.path.join(sys.argv[1], "rl_model_64_steps.zip")
with open(target, "wb") as f:
    f.write(b"old")
def half(file, temp):
    file.write(b"half of the new")
    raise RuntimeError("killed in the middle")
try:
    _write_atomically(target, half)
except RuntimeError:
    pass
print(open(target, "rb").read().decode(), sorted(os.listdir(sys.argv[1])))
_write_atomically(target, lambda file, temp: file.write(b"new"))
print(open(target, "rb").read().decode(), sorted(os.listdir(sys.argv[1])), oct(os.stat(target).st_mode & 0o777))
"""


def test_a_failed_save_leaves_the_old_file_and_no_temp(torch_python: Path, tmp_path: Path) -> None:
    result = subprocess.run([str(torch_python), "-c", ATOMIC_WRITE, str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "old ['rl_model_64_steps.zip']",
        f"new ['rl_model_64_steps.zip'] {oct(0o666 & ~_umask())}",  # as SB3's own open() would make it
    ]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_random_kills_resume_from_the_last_recorded_checkpoint(torch_python: Path, tmp_path: Path, seed: int) -> None:
    """SIGKILL a PPO run at random moments (20 kills), saves slowed by a wide network, with SB3's
    own CheckpointCallback and ours in the same run. After each kill, the next run resumes from
    ``last_complete_checkpoint``: it loads, it is the newest recorded checkpoint (never older), and
    training goes on; the same child tries SB3's usual resume, the newest ``*.zip``."""
    rng = random.Random(seed)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    kills = 20
    own = OwnResume()
    mid_save = resumes = 0
    last_recorded = 0
    for kill in range(kills + 1):
        trainer = Trainer(torch_python, dir=str(ours), sb3_dir=str(theirs), save_freq=SAVE_FREQ, keep=2,
                          width=1024, seed=kill, steps=10**6 if kill < kills else 128)
        try:
            resumed = trainer.until("resumed")
            # Never behind what was recorded before the kill; PPO.load succeeded in the child.
            assert resumed["steps"] == last_recorded, (kill, resumed)
            if last_recorded:
                assert resumed["path"] == str(ours / f"rl_model_{last_recorded}_steps.zip")
            assert resumed["warnings"] == []
            resumes += resumed["path"] is not None
            own.add(trainer.until("glob"))
            trainer.until("ready")
            if kill == kills:
                done = trainer.finish()["done"]  # training goes on after the last kill, to its end
                assert done["steps"] == last_recorded + 128
                break
            time.sleep(rng.uniform(0.0, 2.0))  # a random moment: in a rollout, an update or a save
        finally:
            trainer.kill()
        mid_save += ours.exists() and any(n.endswith(".tmp") for n in os.listdir(ours))
        steps = [e["steps"] for e in recorded(ours)]
        assert steps == sorted(steps) and len(steps) <= 2
        assert not steps or steps[-1] >= last_recorded
        last_recorded = steps[-1] if steps else 0
        # SB3's folder keeps every save (as CheckpointCallback does): keep the newest two, for disk space.
        for name in sorted(glob.glob(str(theirs / "*.zip")), key=os.path.getmtime)[:-2]:
            os.remove(name)
    # The temp files of the saves the kills cut short were removed by the next run's callback.
    assert not [n for n in os.listdir(ours) if n.endswith(".tmp")]
    print(f"\nSB3 integration, {kills} SIGKILLs at random moments ({mid_save} inside a trainstatus save):\n"
          f"  last_complete_checkpoint: {resumes} resumes from a checkpoint, 0 failed to load, "
          "0 went back past the last recorded one\n"
          f"  newest *.zip (SB3's usual resume): {own.failed} of {own.tried} failed to load")
    sys.stdout.flush()


REVIEW_CASES = r"""
import json, os, sys, warnings
import gymnasium as gym
from stable_baselines3 import PPO
import trainstatus._checkpoints.folders as checkpoints
from trainstatus import TrainingStatusCheckpointWarning, TrainingStatusError
from trainstatus.integrations.sb3 import TrainStatusCheckpointCallback, _remove_stale_temps, last_complete_checkpoint

copy, fresh = sys.argv[1], sys.argv[2]
out = {}

# Stale temp files: this prefix's only, never a save in progress under another prefix.
temps = os.path.join(fresh, "temps")
os.makedirs(temps)
for name in ("rl_model_64_steps.zip", "rl_model_replay_buffer_64_steps.pkl", "rl_model_best_64_steps.zip"):
    open(os.path.join(temps, "." + name + ".trainstatus-0123456789abcdef.tmp"), "wb").close()
_remove_stale_temps(temps, "rl_model")
out["temps_left"] = sorted(os.listdir(temps))

# SB3's positional save_replay_buffer=True lands on keep=: the error says so.
try:
    TrainStatusCheckpointCallback(64, fresh, "rl_model", True)
except TrainingStatusError as exc:
    out["keep_error"] = str(exc)

# The status file deleted, its history kept: the store puts the newest version back.
os.remove(os.path.join(copy, "training_status.json"))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    found = last_complete_checkpoint(copy)
out["from_history"] = None if found is None else os.path.basename(found)

# A new save_path (and its new parent) under a run folder whose run_logs/ holds the status: the
# callback syncs the folders above before recording anything; and a run that starts below the
# recorded steps (reset_num_timesteps left at True) is warned about.
synced = []
real = checkpoints._fsync
checkpoints._fsync = lambda path, directory=False: (synced.append(os.path.realpath(path)), real(path, directory=directory))[1]
run = os.path.join(fresh, "run")
os.makedirs(os.path.join(run, "run_logs"))
save_path = os.path.join(run, "models", "new")
status = os.path.join(run, "run_logs", "training_status.json")
from trainstatus import StatusStore
with StatusStore(status) as store:
    store.set("rl_model", "checkpoints", [{"steps": 384, "file_path": "gone.zip", "reward": None,
                                           "creation_time": 1.0, "auxillary_file_paths": []}])
model = PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=64, batch_size=64, n_epochs=1, seed=0)
callback = TrainStatusCheckpointCallback(1000, save_path, status_path=status)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model.learn(64, callback=callback)
out["synced_above"] = [p for p in synced if p in (os.path.join(run, "models"), run)]
out["reset_warnings"] = [str(w.message) for w in caught if issubclass(w.category, TrainingStatusCheckpointWarning)]
print(json.dumps(out))
"""


def test_the_reviews_cases(torch_python: Path, run: Path, tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    done = subprocess.run([str(torch_python), "-c", REVIEW_CASES, str(run), str(fresh)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["temps_left"] == [".rl_model_best_64_steps.zip.trainstatus-0123456789abcdef.tmp"]
    assert out["keep_error"].endswith(
        "not True (the fourth argument is keep=, where SB3's CheckpointCallback has save_replay_buffer: "
        "pass save_replay_buffer= by name).")
    assert out["from_history"] is not None and out["from_history"].endswith("_steps.zip")
    assert out["synced_above"] == [str(fresh / "run" / "models"), str(fresh / "run")]
    save_path, status = fresh / "run" / "models" / "new", fresh / "run" / "run_logs" / "training_status.json"
    assert out["reset_warnings"] == [
        f"This run starts at 0 timesteps in {save_path}, where {status} recorded checkpoints up to 384 steps, none of "
        "them whole (gone.zip is missing). This run's checkpoints replace their files as it reaches the same steps; "
        f"until then a resume passes over them with a warning. To keep them, stop and move them out of {save_path}, "
        "or use another save_path or name_prefix."]


def test_the_run_folder_is_checked_from_any_current_directory(trained: Path) -> None:
    # The status file records where its relative paths are rooted (the run folder itself: "."),
    # so `trainstatus check --files` finds every file from the project folder too.
    directory = trained
    status = directory / "training_status.json"
    with StatusStore(status) as store:
        assert store.get("rl_model", "checkpoint_root") == "."
    done = subprocess.run([sys.executable, "-m", "trainstatus", "check", "--files", f"{directory.name}/training_status.json"],
                          cwd=directory.parent, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"info: rl_model: relative checkpoint paths are looked up under {directory}, recorded in "
            "rl_model/checkpoint_root\n") in done.stdout


WRONG_PATHS = r"""
import json, sys, warnings
from trainstatus.integrations.sb3 import last_complete_checkpoint
seen = []
for given in sys.argv[1:]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            seen.append(["returned", last_complete_checkpoint(given), [str(w.message) for w in caught]])
        except Exception as exc:
            seen.append([type(exc).__name__, str(exc), []])
print(json.dumps(seen))
"""


def test_a_wrong_or_remote_path_is_refused_and_unrecorded_checkpoints_are_named(torch_python: Path, run: Path,
                                                                               tmp_path: Path) -> None:
    # Each returned None in silence: a run from scratch beside whole checkpoints.
    bare = tmp_path / "copied"  # the zips without the status file (saved without the callback, or moved)
    bare.mkdir()
    for name in zips(run):
        shutil.copy(run / name, bare / name)
    done = subprocess.run([str(torch_python), "-c", WRONG_PATHS, str(run / "rl_model_384_steps.zip"),
                           "s3://bucket/logs", str(bare)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    checkpoint, remote, unrecorded = json.loads(done.stdout.splitlines()[-1])
    assert checkpoint[:2] == ["TrainingStatusValueError", (
        f"last_complete_checkpoint('{run / 'rl_model_384_steps.zip'}'): {run / 'rl_model_384_steps.zip'} is a "
        f"checkpoint itself. Pass the folder that holds the checkpoints, CheckpointCallback's save_path, {run}: the "
        "answer is the newest whole checkpoint recorded there. Nothing was read.")], checkpoint
    assert remote[0] == "TrainingStatusValueError" and "is not a local path" in remote[1], remote
    assert unrecorded[:2] == ["returned", None], unrecorded
    assert unrecorded[2] == [
        f"rl_model_256_steps.zip, rl_model_320_steps.zip, rl_model_384_steps.zip in {bare} are checkpoints that "
        f"{bare / 'training_status.json'} has never recorded (saved without TrainStatusCheckpointCallback, or with "
        "another name_prefix or status_path, or a first save cut short before its record), so "
        "last_complete_checkpoint() returns None: a new model starts at 0 timesteps. Load one yourself if you know "
        "it is whole (PPO.load(path)), or pass last_complete_checkpoint the name_prefix and status_path the callback "
        "was given."], unrecorded


def test_a_second_job_on_the_save_path_is_refused_before_it_learns(torch_python: Path, tmp_path: Path) -> None:
    # Another job holds the run lease of logs/training_status.json: learn() stops at the callback's
    # start, naming it, with no timestep taken and no checkpoint written. Once it is gone, this one runs.
    directory = tmp_path / "logs"
    with another_job(str(directory / "training_status.json"), run="first-job") as job:
        child = Trainer(torch_python, dir=str(directory), save_freq=SAVE_FREQ, steps=128)
        child.until("ready")
        child.process.wait(timeout=300)
        stderr = child.process.stderr.read() if child.process.stderr else ""
        child.kill()
    assert child.process.returncode != 0 and "done" not in child.events
    assert (f"TrainingStatusInUseError: TrainStatusCheckpointCallback: another job is training on "
            f"{directory / 'training_status.json'}: process {job.pid} on ") in stderr, stderr[-3000:]
    assert zips(directory) == [] and recorded(directory) == []
    Trainer(torch_python, dir=str(directory), save_freq=SAVE_FREQ, steps=128).finish()
    assert zips(directory) == ["rl_model_128_steps.zip", "rl_model_64_steps.zip"]

