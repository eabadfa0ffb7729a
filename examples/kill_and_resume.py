"""Kill a training run with SIGKILL, resume it, and see what each design remembers.

A toy curriculum trainer runs in a child process: it advances a lesson every few "steps", saves a
checkpoint each time (keeping the 3 newest), and updates an ELO. The parent kills it with SIGKILL
once it reports lesson 4, then resumes. The same trainer runs twice:

- ML-Agents style: the status lives in a class-level dict and is dumped with json.dump at exit.
  SIGKILL means there is no exit, so the resume finds no file and starts at lesson 0.
- trainstatus: ``GlobalTrainingStatus`` from trainstatus, bound to the file. Every set is on disk
  before it returns, so the resume starts at the lesson the trainer had reached.

Run: python examples/kill_and_resume.py   (exit status 0 when trainstatus resumed exactly)
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from typing import Any

KILL_AT_LESSON = 4
STEPS_PER_LESSON = 5
KEEP_CHECKPOINTS = 3


class SaveAtExitStatus:
    """ML-Agents' GlobalTrainingStatus design, reduced: a class-level dict dumped once, at exit."""

    saved_state: dict[str, dict[str, Any]] = defaultdict(dict)

    @staticmethod
    def load_state(path: str) -> None:
        try:
            with open(path) as f:
                SaveAtExitStatus.saved_state.update(json.load(f))
        except FileNotFoundError:
            print("  [ml-agents style] Training status file not found. Not all functions will resume properly.")

    @staticmethod
    def save_state(path: str) -> None:
        with open(path, "w") as f:
            json.dump(SaveAtExitStatus.saved_state, f, indent=4)

    @staticmethod
    def set_parameter_state(category: str, key: str, value: Any) -> None:
        SaveAtExitStatus.saved_state[category][key] = value

    @staticmethod
    def get_parameter_state(category: str, key: str) -> Any:
        return SaveAtExitStatus.saved_state[category].get(key)


def train(design: str, run_dir: str) -> None:
    """The child: a toy trainer that never stops on its own."""
    path = os.path.join(run_dir, "run_logs", "training_status.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if design == "trainstatus":
        from trainstatus import GlobalTrainingStatus, StatusType

        GlobalTrainingStatus.start_fresh(path)
        status: Any = GlobalTrainingStatus
        lesson_key, checkpoints_key, elo_key = StatusType.LESSON_NUM, StatusType.CHECKPOINTS, StatusType.ELO
    else:
        status = SaveAtExitStatus
        atexit.register(SaveAtExitStatus.save_state, path)  # what ML-Agents does on a clean exit
        lesson_key, checkpoints_key, elo_key = "lesson_num", "checkpoints", "elo"

    step = 0
    while True:
        step += 1
        time.sleep(0.01)  # the "training"
        if step % STEPS_PER_LESSON:
            continue
        lesson = (status.get_parameter_state("wall_height", lesson_key) or 0) + 1
        checkpoint_file = os.path.join(run_dir, f"Walker-{step}.onnx")
        open(checkpoint_file, "wb").close()
        kept = status.get_parameter_state("Walker", checkpoints_key) or []
        kept.append({"steps": step, "file_path": checkpoint_file, "reward": None})
        while len(kept) > KEEP_CHECKPOINTS:
            os.remove(kept.pop(0)["file_path"])
        status.set_parameter_state("Walker", checkpoints_key, kept)
        status.set_parameter_state("Walker", elo_key, 1200.0 + 10 * lesson)
        status.set_parameter_state("wall_height", lesson_key, lesson)
        print(f"lesson {lesson}", flush=True)  # printed only after the set returned


def run_and_kill(design: str, run_dir: str) -> int:
    """Start the trainer, SIGKILL it once it reports KILL_AT_LESSON; the last lesson it reported."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", design, run_dir], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    reported = 0
    for line in child.stdout:
        reported = int(line.split()[1])
        if reported >= KILL_AT_LESSON:
            child.send_signal(signal.SIGKILL)
            break
    rest = child.stdout.read()  # anything it acknowledged before the signal landed
    child.wait()
    for line in rest.splitlines():
        reported = int(line.split()[1])
    print(f"  trainer killed with SIGKILL (exit status {child.returncode}) after it reported lesson {reported}")
    return reported


def resume(design: str, run_dir: str) -> tuple[int, int, int]:
    """What a resumed run sees: (lesson, kept checkpoints that exist on disk, kept checkpoints listed)."""
    path = os.path.join(run_dir, "run_logs", "training_status.json")
    if design == "trainstatus":
        from trainstatus import GlobalTrainingStatus, StatusType

        GlobalTrainingStatus.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            GlobalTrainingStatus.load_state(path)
        for warning in caught:
            print(f"  [trainstatus] {warning.message}")
        lesson = GlobalTrainingStatus.get_parameter_state("wall_height", StatusType.LESSON_NUM) or 0
        kept = GlobalTrainingStatus.get_parameter_state("Walker", StatusType.CHECKPOINTS) or []
    else:
        SaveAtExitStatus.saved_state.clear()
        SaveAtExitStatus.load_state(path)
        lesson = SaveAtExitStatus.get_parameter_state("wall_height", "lesson_num") or 0
        kept = SaveAtExitStatus.get_parameter_state("Walker", "checkpoints") or []
    on_disk = sum(os.path.exists(c["file_path"]) for c in kept)
    return lesson, on_disk, len(kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("DESIGN", "RUN_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        train(*args.child)
        return 0

    results = {}
    with tempfile.TemporaryDirectory(prefix="trainstatus-demo-") as root:
        for design in ("ml-agents", "trainstatus"):
            title = "ML-Agents style (save at exit)" if design == "ml-agents" else "trainstatus (write-through)"
            print(f"{title}:")
            run_dir = os.path.join(root, design)
            reported = run_and_kill(design, run_dir)
            lesson, on_disk, listed = resume(design, run_dir)
            print(f"  resumed at lesson {lesson}; knows {listed} kept checkpoint(s), {on_disk} of them on disk\n")
            results[design] = (reported, lesson, listed)

    reported, lesson, listed = results["trainstatus"]
    # The kill can land after a set returned but before "lesson N" was printed: one more is fine.
    exact = lesson in (reported, reported + 1) and listed == KEEP_CHECKPOINTS
    lost = results["ml-agents"][1] == 0
    print(f"trainstatus resumed at the lesson the trainer reached: {'yes' if exact else 'NO'}")
    print(f"ML-Agents-style save at exit lost it (restarted at lesson 0): {'yes' if lost else 'no'}")
    return 0 if exact and lost else 1


if __name__ == "__main__":
    sys.exit(main())
