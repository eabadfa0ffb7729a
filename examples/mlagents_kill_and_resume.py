"""Kill an ML-Agents trainer and resume it, with ML-Agents' own curriculum and checkpoint managers.

Needs ML-Agents (release 22) in the environment, as in any ML-Agents project:

    pip install mlagents==1.1.0 trainstatus      # then: python examples/mlagents_kill_and_resume.py

(The suite runs it in its torch-free ML-Agents environment, tests/_mlagents_env.py.)

A child process trains a toy curriculum: ML-Agents' ``EnvironmentParameterManager`` moves it one
lesson up every few steps and ML-Agents' ``ModelCheckpointManager`` records a checkpoint at each
step, keeping 3. It is SIGKILLed once it reports lesson 4 and then resumed the way
``mlagents-learn --resume`` does. First with ``TRAINSTATUS_MLAGENTS=off`` (ML-Agents as it ships:
the status is saved only at exit, so the resume starts at lesson 0 knowing no checkpoint), then
with the trainstatus plugin on (the resume starts at lesson 4, or later if the trainer got further
before the kill landed, with its 3 checkpoints). Exits 0 when trainstatus resumed that.

The child enters the plugin as ``mlagents-learn`` does: it calls every entry point of the groups
``mlagents.trainer_type`` and ``mlagents.stats_writer`` (ML-Agents' own loaders import torch,
so they are not called here), in ``run_training``'s order.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

CHILD = r'''
import importlib.metadata, os, sys, time
from mlagents.trainers.settings import RunOptions
from mlagents.trainers.training_status import GlobalTrainingStatus
from mlagents.trainers.environment_parameter_manager import EnvironmentParameterManager
from mlagents.trainers.policy.checkpoint_manager import ModelCheckpoint, ModelCheckpointManager

results, resume = sys.argv[1], sys.argv[2] == "resume"
lesson = {"completion_criteria": {"measure": "reward", "behavior": "Walker", "threshold": 0.5,
                                  "min_lesson_length": 1, "signal_smoothing": False}}
options = RunOptions.from_dict({
    "checkpoint_settings": {"run_id": "demo", "results_dir": results, "resume": resume},
    "environment_parameters": {"wall_height": {"curriculum": [
        {**(lesson if i < 9 else {}), "name": f"L{i}", "value": float(i)} for i in range(10)]}},
})

def plugins(group, *args):  # mlagents/plugins/*.py: load and call each entry point
    for ep in importlib.metadata.entry_points(group=group):
        if not ep.value.startswith("mlagents.plugins."):
            ep.load()(*args)

plugins("mlagents.trainer_type")                          # parse_command_line
run_logs = options.checkpoint_settings.run_logs_dir      # run_training, in its order:
os.makedirs(run_logs, exist_ok=True)
if resume:
    GlobalTrainingStatus.load_state(os.path.join(run_logs, "training_status.json"))
plugins("mlagents.stats_writer", options)
curriculum = EnvironmentParameterManager(options.environment_parameters, 1, restore=resume)
if resume:
    kept = [c["steps"] for c in ModelCheckpointManager.get_checkpoints("Walker")]
    print(f"resumed at lesson {curriculum.get_current_lesson_number()['wall_height']}, checkpoints {kept}", flush=True)
    sys.exit(0)
step = 0
while True:
    step += 1
    ModelCheckpointManager.add_checkpoint(
        "Walker", ModelCheckpoint(step, f"Walker-{step}.onnx", float(step), time.time()), 3)
    updated, _ = curriculum.update_lessons({"Walker": step}, {"Walker": 10**6}, {"Walker": [1.0 if step % 2 == 0 else 0.0]})
    if updated:
        print(f"lesson {curriculum.get_current_lesson_number()['wall_height']}", flush=True)
    time.sleep(0.01)
'''


def trial(plugin_on: bool) -> str:
    env = dict(os.environ, TRAINSTATUS_MLAGENTS="on" if plugin_on else "off")
    with tempfile.TemporaryDirectory() as results:
        child = subprocess.Popen([sys.executable, "-c", CHILD, results, "fresh"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, env=env)
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        for line in child.stdout:
            if line.strip() == "lesson 4" or time.monotonic() > deadline:
                break
        child.send_signal(signal.SIGKILL)
        child.communicate()
        resumed = subprocess.run([sys.executable, "-c", CHILD, results, "resume"], capture_output=True,
                                 text=True, env=env, timeout=60)
        lines = [x for x in resumed.stdout.splitlines() if x.startswith("resumed")]
        return lines[-1] if lines else f"resume failed: {resumed.stderr.strip()[-300:]}"


def main() -> int:
    if not any(e.name == "trainstatus" for e in importlib.metadata.entry_points(group="mlagents.stats_writer")):
        print("trainstatus is not installed in this environment (pip install trainstatus)")
        return 2
    without = trial(plugin_on=False)
    print(f"ML-Agents alone (save at exit), killed at lesson 4: {without}")
    with_plugin = trial(plugin_on=True)
    print(f"with trainstatus installed,      killed at lesson 4: {with_plugin}")
    # The kill lands a few milliseconds after "lesson 4" was printed: the trainer may have gone on.
    found = re.fullmatch(r"resumed at lesson (\d+), checkpoints \[(\d+), (\d+), (\d+)\]", with_plugin)
    ok = found is not None and int(found.group(1)) >= 4
    print("trainstatus resumed exactly" if ok else "trainstatus did NOT resume exactly")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
