"""ML-Agents 1.1.0's real training path (``mlagents.trainers.learn``) SIGKILLed and ``--resume``d.

Each run is ``mlagents-learn`` itself (tests/_mlagents_learn.py: ``learn.main()`` with the
suite's small environment in place of the Unity player) in ``.venv-mlagents-torch/``: PPO on torch
2.13 (CPU) with a tiny network, a curriculum of eight lessons that advances every few seconds,
a checkpoint (``.pt`` and an ``.onnx`` torch exports, a few seconds each) every 250 steps,
``keep_checkpoints: 3``. The run is killed (its process group: the trainer and the environment
worker) at a random moment after it started training, then resumed with ``--resume``, again and
again; the same is done with the plugin turned off (``TRAINSTATUS_MLAGENTS=off``) and both are
printed.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _mlagents_env
import pytest

HERE = Path(__file__).resolve().parent
LEARN = HERE / "_mlagents_learn.py"
LESSONS = 8
KEEP = 3
CONFIG = {
    "behaviors": {"Target": {
        "trainer_type": "ppo",
        "hyperparameters": {"batch_size": 16, "buffer_size": 64, "learning_rate": 0.003, "num_epoch": 1},
        "network_settings": {"hidden_units": 8, "num_layers": 1},
        "reward_signals": {"extrinsic": {"gamma": 0.9, "strength": 1.0}},
        "max_steps": 10**7,  # killed long before
        "time_horizon": 8,
        "summary_freq": 10**6,
        "checkpoint_interval": 250,
        "keep_checkpoints": KEEP,
    }},
    "environment_parameters": {"difficulty": {"curriculum": [
        {"name": f"L{i}", "value": float(i), **({} if i == LESSONS - 1 else {"completion_criteria": {
            # 25 episodes of 4 decisions, under a second; any reward passes (the task is not what is
            # tested). Lessons and checkpoints then alternate, a full curriculum taking ~6 checkpoints.
            "measure": "reward", "behavior": "Target", "threshold": -1.0,
            "min_lesson_length": 25, "signal_smoothing": False}})}
        for i in range(LESSONS)
    ]}},
}
LESSON = re.compile(r"Parameter 'difficulty' is in lesson 'L(\d+)'")
RESUMED_STEP = re.compile(r"Resuming training from step (\d+)\.")
EXPORTED = re.compile(r"\[INFO\] Exported (\S+)\.onnx")
EXPORT_START = "[torch.onnx] Obtain model graph"
CHAINS, KILLS_PER_CHAIN = 4, 5  # with trainstatus: 20 kills, each resumed and checked
BASELINE_KILLS = 3  # ML-Agents alone, on the first chain's kill moments
STARTUP = 180.0  # seconds a (loaded) machine may take to start training


@dataclass
class Run:
    """One ``mlagents-learn`` process and what it printed."""

    lines: list[str] = field(default_factory=list)
    returncode: int | None = None
    killed: bool = False

    def lessons(self) -> list[int]:
        return [int(m.group(1)) for line in self.lines if (m := LESSON.search(line))]

    def inside_export(self) -> bool:
        """Killed between the start of an ONNX export and its "Exported" line (inside a save)."""
        started = [i for i, line in enumerate(self.lines) if EXPORT_START in line]
        done = [i for i, line in enumerate(self.lines) if EXPORTED.search(line)]
        return bool(started) and started[-1] > max(done, default=-1)

    def text(self) -> str:
        return "".join(self.lines)


def learn(python: Path, cwd: Path, run_id: str, *, resume: bool, plugin: bool, kill_after: float) -> Run:
    """Start ``mlagents-learn``; SIGKILL it ``kill_after`` seconds after it announced its lesson
    (training starts then), unless it ends first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE", "PYTHON", "TRAINSTATUS"))}
    env.update(_mlagents_env.RUN_ENV, PYTHONUNBUFFERED="1")  # torch's export progress comes by print()
    if not plugin:
        env["TRAINSTATUS_MLAGENTS"] = "off"
    command = [str(python), str(LEARN), str(cwd / "config.json"), "--run-id", run_id,
               "--results-dir", "results", "--resume" if resume else "--force"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                            start_new_session=True)  # its own group: the kill takes the environment worker too
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    run = Run()
    deadline = time.monotonic() + STARTUP
    ended = False
    while not ended:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            ended = True
            break
        run.lines.append(line)
        if LESSON.search(line) and deadline - time.monotonic() > kill_after:
            deadline = time.monotonic() + kill_after  # from the first lesson: training has started
    if not ended:
        os.killpg(proc.pid, signal.SIGKILL)
        run.killed = True
    run.returncode = proc.wait(timeout=60)
    reader.join(timeout=60)
    assert proc.stdout is not None
    proc.stdout.close()
    while (line := lines.get_nowait() if not lines.empty() else None) is not None:
        run.lines.append(line)  # printed before the kill: it happened
    if run.killed and not run.lessons():
        raise AssertionError(f"mlagents-learn did not start training within {STARTUP} s:\n{run.text()}")
    return run


def status(cwd: Path, run_id: str) -> dict[str, Any]:
    path = cwd / "results" / run_id / "run_logs" / "training_status.json"
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text(), parse_constant=float))


def listed_files(state: dict[str, Any]) -> list[str]:
    return [p for c in state.get("Target", {}).get("checkpoints", []) for p in [c["file_path"], *c["auxillary_file_paths"]]]


# 20 mlagents-learn runs SIGKILLed and resumed, and 3 of ML-Agents alone: 175 s on busy cores, too
# close to the mlagents group's 600 s limit (tests/conftest.py).
@pytest.mark.timeout(1200)
def test_mlagents_learn_killed_at_random_moments_resumes_at_the_lesson_on_disk(
        mla_torch_python: Path, tmp_path: Path, seed: int, reliability: Any) -> None:
    rng = random.Random(seed)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))  # YAML is a superset of JSON
    moments = [[rng.uniform(0.3, 4.0) for _ in range(KILLS_PER_CHAIN)] for _ in range(CHAINS)]
    kills, at_lessons, inside_export, steps_kept, afresh = 0, [], 0, [], 0
    for chain, chain_moments in enumerate(moments):
        run_id = f"chain{chain}"
        run = learn(mla_torch_python, tmp_path, run_id, resume=False, plugin=True, kill_after=chain_moments[0])
        for i in range(KILLS_PER_CHAIN):
            assert run.killed, f"run {i} of {run_id} ended by itself ({run.returncode}):\n{run.text()}"
            kills += 1
            announced = run.lessons()[-1]
            on_disk = status(tmp_path, run_id)
            lesson = on_disk.get("difficulty", {}).get("lesson_num", 0)  # no file: ML-Agents resumes at 0
            # Every lesson change ML-Agents announced is on disk (the set returned before the log
            # line); one more may be, set but killed before its log line.
            assert announced <= lesson <= announced + 1, (run_id, i, announced, on_disk)
            listed = on_disk.get("Target", {}).get("checkpoints", [])
            assert len(listed) <= KEEP
            missing = [p for p in listed_files(on_disk) if not (tmp_path / p).exists()]
            assert missing == [], (run_id, i, missing, on_disk)
            at_lessons.append(lesson)
            if i == 0:  # the file exists from the fresh run's start, with ML-Agents' metadata block
                assert on_disk["metadata"]["mlagents_version"] == "1.1.0", on_disk
                assert on_disk["metadata"]["torch_version"].startswith("2.13.0"), on_disk
            inside_export += run.inside_export()
            steps_kept.append([c["steps"] for c in listed])
            last = i == KILLS_PER_CHAIN - 1
            resumed = learn(mla_torch_python, tmp_path, run_id, resume=True, plugin=True,
                            kill_after=1.0 if last else chain_moments[i + 1])
            assert resumed.killed, f"the --resume of {run_id} after kill {i} failed ({resumed.returncode}):\n{resumed.text()}"
            assert resumed.lessons()[0] == lesson, (run_id, i, lesson, resumed.lessons())
            # The model comes back no earlier than the newest listed checkpoint; with none listed
            # (killed before the first), it starts afresh where ML-Agents alone crashes.
            step = RESUMED_STEP.search(resumed.text())
            if listed:
                assert step is not None, resumed.text()
                assert int(step.group(1)) >= listed[-1]["steps"], (step.group(0), listed)
            elif step is None:  # neither a listed checkpoint nor checkpoint.pt (written before the record)
                assert "its model starts afresh, at step 0" in resumed.text(), resumed.text()
                afresh += 1
            run = resumed
    reliability.add("kills", kills, source="test_mlagents_learn.py")

    # ML-Agents alone (the plugin turned off), killed at the first chain's moments. A --resume that
    # crashes is started over (--force), as its user would have to.
    behind, lessons_lost, failed = 0, [], 0
    run = learn(mla_torch_python, tmp_path, "alone", resume=False, plugin=False, kill_after=moments[0][0])
    for i in range(BASELINE_KILLS):
        assert run.killed, run.text()
        announced = run.lessons()[-1]
        after = 1.0 if i == BASELINE_KILLS - 1 else moments[0][i + 1]
        resumed = learn(mla_torch_python, tmp_path, "alone", resume=True, plugin=False, kill_after=after)
        if not resumed.killed:
            failed += 1
            resumed = learn(mla_torch_python, tmp_path, "alone", resume=False, plugin=False, kill_after=after)
        if resumed.lessons()[0] < announced:
            behind += 1
            lessons_lost.append(announced - resumed.lessons()[0])
        run = resumed
    print(f"with trainstatus: {kills} SIGKILLs ({inside_export} inside an ONNX export) at lessons {sorted(at_lessons)}, every --resume back at the "
          f"lesson on disk, every listed checkpoint file present (kept steps after each kill: {steps_kept})")
    print(f"  of which {afresh} before the run's first checkpoint: the model started afresh, the lessons resumed")
    print(f"ML-Agents alone: {BASELINE_KILLS} SIGKILLs, {failed} --resume crashed (no checkpoint.pt yet) and was "
          f"started over, {behind} came back at an earlier lesson than announced (lessons lost: {lessons_lost})")


# -- what --resume loads: checkpoint.pt, or the newest listed checkpoint -----------------------------


def test_a_resume_that_cannot_load_checkpoint_pt_loads_the_newest_listed_one(mla_torch_python: Path, tmp_path: Path) -> None:
    short = {**CONFIG, "behaviors": {"Target": {**CONFIG["behaviors"]["Target"], "max_steps": 260}}}
    (tmp_path / "config.json").write_text(json.dumps(short))
    done = learn(mla_torch_python, tmp_path, "run", resume=False, plugin=True, kill_after=STARTUP)
    assert not done.killed and done.returncode == 0, done.text()
    folder = tmp_path / "results" / "run" / "Target"
    newest = status(tmp_path, "run")["Target"]["checkpoints"][-1]
    (folder / "checkpoint.pt").write_bytes(b"PK\x03\x04 cut short")  # as a kill inside torch.save leaves it

    # Killed as soon as it trains: the load is what is tested.
    resumed = learn(mla_torch_python, tmp_path, "run", resume=True, plugin=True, kill_after=0.0)
    assert resumed.killed, resumed.text()
    assert (f"resuming Target from its newest listed checkpoint, {newest['auxillary_file_paths'][0]} "
            f"(steps {newest['steps']})") in resumed.text(), resumed.text()
    assert f"Resuming training from step {newest['steps']}." in resumed.text()

    for pt in folder.glob("Target-*.pt"):  # no listed checkpoint left to load either
        pt.unlink()
    (folder / "checkpoint.pt").write_bytes(b"")
    afresh = learn(mla_torch_python, tmp_path, "run", resume=True, plugin=True, kill_after=0.0)
    assert afresh.killed, afresh.text()
    assert "no checkpoint of Target is listed: its model starts afresh, at step 0" in afresh.text(), afresh.text()

    # ML-Agents alone: the same --resume crashes in torch.load (and, on its way out, saves the
    # untrained model over checkpoint.pt: last, so that it changes nothing above).
    (folder / "checkpoint.pt").write_bytes(b"PK\x03\x04 cut short")
    alone = learn(mla_torch_python, tmp_path, "run", resume=True, plugin=False, kill_after=STARTUP)
    assert alone.returncode != 0 and "torch.load(load_path)" in alone.text(), alone.text()


KILLED_SAVING = r"""
import os, sys
import torch
from trainstatus._mlagents import plugin as _mlagents_plugin
if sys.argv[2] == "routed":
    _mlagents_plugin.trainer_types()
from mlagents.trainers.model_saver import torch_model_saver
saver = object.__new__(torch_model_saver.TorchModelSaver)  # what save_checkpoint uses of it
saver.model_path, saver.modules, saver.exporter = sys.argv[1], {"Policy": torch.nn.Linear(4, 4)}, None
saver.save_checkpoint("Target", 1)
real_save = torch.save


def killed_inside(obj, f, *args, **kwargs):
    if os.path.basename(str(f)) == "Target-2.pt":
        return real_save(obj, f, *args, **kwargs)
    with open(f, "wb") as out:  # checkpoint.pt (routed: its temp file) half written, then killed
        out.write(b"PK\x03\x04 cut short")
    os._exit(9)


torch.save = killed_inside
saver.save_checkpoint("Target", 2)
"""


SAVED_AGAIN = r"""
import sys
import torch
from trainstatus._mlagents import plugin as _mlagents_plugin
_mlagents_plugin.trainer_types()
from mlagents.trainers.model_saver import torch_model_saver
saver = object.__new__(torch_model_saver.TorchModelSaver)
saver.model_path, saver.modules, saver.exporter = sys.argv[1], {"Policy": torch.nn.Linear(4, 4)}, None
saver.save_checkpoint("Target", 3)
"""


@pytest.mark.parametrize("order", ["routed", "original"])
def test_a_kill_inside_the_save_of_checkpoint_pt_leaves_the_previous_one_whole(
        mla_torch_python: Path, tmp_path: Path, order: str) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE", "PYTHON"))}, **_mlagents_env.RUN_ENV}
    child = subprocess.run([str(mla_torch_python), "-c", KILLED_SAVING, str(tmp_path), order],
                           capture_output=True, text=True, env=env, timeout=300, check=False)
    assert child.returncode == 9, child.stderr
    load = subprocess.run([str(mla_torch_python), "-c", "import sys, torch; torch.load(sys.argv[1])",
                           str(tmp_path / "checkpoint.pt")], capture_output=True, text=True, env=env, timeout=300, check=False)
    if order == "routed":
        assert load.returncode == 0, load.stderr  # the checkpoint of step 1, whole
        assert [p.name for p in tmp_path.glob(".checkpoint.pt.trainstatus-*.tmp")] != []  # what the kill left
        again = subprocess.run([str(mla_torch_python), "-c", SAVED_AGAIN, str(tmp_path)],
                               capture_output=True, text=True, env=env, timeout=300, check=False)
        assert again.returncode == 0, again.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["Target-1.pt", "Target-2.pt", "Target-3.pt",
                                                              "checkpoint.pt"]  # the next save removed it
    else:  # ML-Agents' torch.save in place: what --resume would load is cut short
        assert load.returncode != 0 and "PytorchStreamReader" in load.stderr, load.stderr
