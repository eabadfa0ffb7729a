"""A trainer that drives ML-Agents 1.1.0's own status code, run in the ML-Agents environment.

Run by tests/test_mlagents_plugin.py with the interpreter of tests/_mlagents_env.py. What can be
imported without torch is ML-Agents' real code, unmodified: ``RunOptions``,
``EnvironmentParameterManager`` (``update_lessons``, ``restore=``), ``ModelCheckpointManager``
(``add_checkpoint``, ``get_checkpoints``, ``track_final_checkpoint``), ``ModelCheckpoint``,
``GlobalTrainingStatus``, ML-Agents' logging. What imports torch (``learn.py``, the trainer
controller, ``RLTrainer``, ``GhostTrainer``, the plugin loaders) is transcribed here line for line,
in ``run_training``'s order; tests/test_mlagents_plugin.py checks these lines against the installed
sources, so the transcription cannot drift from ML-Agents:

    parse_command_line:   register_trainer_plugins()       -> every mlagents.trainer_type entry point
    run_training:         os.makedirs(run_logs_dir, exist_ok=True)
                          if resume: GlobalTrainingStatus.load_state(run_logs_dir/training_status.json)
                          register_stats_writer_plugins(options) -> every mlagents.stats_writer one
                          EnvironmentParameterManager(options.environment_parameters, seed, restore=resume)
    GhostTrainer.__init__: initial_elo = get_parameter_state(brain_name, ELO) or initial_elo
    RLTrainer._checkpoint: ModelCheckpointManager.add_checkpoint(brain_name, checkpoint, keep)
    TrainerController.start_learning: on KeyboardInterrupt join the trainer threads, then
                          _save_models(): GhostTrainer.save_model sets ELO, RLTrainer.save_model
                          checkpoints and track_final_checkpoint
    run_training finally: write_training_status(run_logs_dir) -> GlobalTrainingStatus.save_state

Every status call that returned is reported on stdout as a JSON line (``{"ack": ...}``) before the
trainer goes on, so the test knows what a kill must not lose. ``--report`` resumes the run the way
ML-Agents does and prints what ML-Agents' own managers then see, without training or saving.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import signal
import sys
import threading
import time
from typing import Any

from mlagents.trainers.environment_parameter_manager import EnvironmentParameterManager
from mlagents.trainers.policy.checkpoint_manager import ModelCheckpoint, ModelCheckpointManager
from mlagents.trainers.settings import RunOptions
from mlagents.trainers.training_status import GlobalTrainingStatus, StatusType
from mlagents_envs import logging_util

logger = logging_util.get_logger("mlagents.trainers.learn")

PARAMS = ("wall_height", "goal_size")
LESSONS = 8
GHOST = "SoccerTwos"  # a self-play behavior: its ELO is the ghost trainer's
_out = threading.Lock()


def say(**record: Any) -> None:
    with _out:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def options_for(args: argparse.Namespace) -> RunOptions:
    lesson = {
        "completion_criteria": {"measure": "reward", "behavior": "Walker", "threshold": 0.5,
                                "min_lesson_length": 1, "signal_smoothing": False},
    }
    curriculum = {
        name: {"curriculum": [{**({} if i == LESSONS - 1 else lesson), "name": f"L{i}", "value": float(i)}
                              for i in range(LESSONS)]}
        for name in PARAMS
    }
    return RunOptions.from_dict({
        "checkpoint_settings": {
            "run_id": args.run_id, "results_dir": args.results_dir, "resume": args.resume,
            "force": args.force, "inference": args.inference, "initialize_from": args.initialize_from,
        },
        "environment_parameters": curriculum,
    })


def load_plugins(group: str, *call_args: Any) -> None:
    """ML-Agents' register_*_plugins loop (mlagents/plugins/*.py), for one entry-point group.

    ML-Agents' own "default" entry points import torch (trainer classes, TensorBoard): they are
    the only ones left out.
    """
    for entry_point in importlib.metadata.entry_points(group=group):
        if entry_point.value.startswith("mlagents.plugins."):
            continue
        try:
            logger.debug(f"Initializing plugins: {entry_point.name}")
            entry_point.load()(*call_args)
        except BaseException:
            logger.exception(
                f"Error initializing plugins for {entry_point.name}. This plugin will not be used."
            )


class Trainer:
    """The status calls of one behavior's trainer (RLTrainer, and GhostTrainer for GHOST)."""

    def __init__(self, name: str, write_path: str, keep: int, ghost: bool) -> None:
        self.name, self.write_path, self.keep, self.ghost = name, write_path, keep, ghost
        kept = ModelCheckpointManager.get_checkpoints(name)
        self.step = max((c["steps"] for c in kept), default=0)  # the model resumes at its checkpoint
        if ghost:
            initial = GlobalTrainingStatus.get_parameter_state(name, StatusType.ELO)
            self.elo = 1200.0 if initial is None else initial
        self.stop = threading.Event()

    def checkpoint(self) -> dict[str, Any]:
        folder = os.path.join(self.write_path, self.name)
        os.makedirs(folder, exist_ok=True)
        onnx = os.path.join(folder, f"{self.name}-{self.step}.onnx")
        pt = os.path.join(folder, f"{self.name}-{self.step}.pt")
        for path in (onnx, pt):  # the model saver writes the files before they are recorded
            with open(path, "wb") as f:
                f.write(b"model")
        reward = (None, float("nan"), self.step / 100.0)[self.step % 3]
        new = ModelCheckpoint(int(self.step), onnx, reward, time.time(), auxillary_file_paths=[pt])
        ModelCheckpointManager.add_checkpoint(self.name, new, self.keep)
        say(ack="checkpoints", behavior=self.name,
            steps=[c["steps"] for c in ModelCheckpointManager.get_checkpoints(self.name)])
        return {"steps": new.steps, "file_path": new.file_path}

    def save_model(self) -> None:
        if self.ghost:
            GlobalTrainingStatus.set_parameter_state(self.name, StatusType.ELO, self.elo)
            say(ack="elo", behavior=self.name, elo=self.elo)
        self.step += 1
        last = self.checkpoint()
        final = ModelCheckpoint(last["steps"], os.path.join(self.write_path, f"{self.name}.onnx"),
                                None, time.time(), auxillary_file_paths=[])
        ModelCheckpointManager.track_final_checkpoint(self.name, final)
        say(ack="final", behavior=self.name, steps=final.steps)

    def advance(self, every: int) -> None:
        self.step += 1
        if self.step % every == 0:
            if self.ghost:
                self.elo += 1.5
                GlobalTrainingStatus.set_parameter_state(self.name, StatusType.ELO, self.elo)
                say(ack="elo", behavior=self.name, elo=self.elo)
            self.checkpoint()

    def run_threaded(self, every: int, tick: float) -> None:
        while not self.stop.is_set():
            self.advance(every)
            time.sleep(tick)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--run-id", default="run")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--inference", action="store_true")
    parser.add_argument("--initialize-from", default=None)
    parser.add_argument("--report", action="store_true", help="resume, print what ML-Agents sees, stop")
    parser.add_argument("--threaded", action="store_true")
    parser.add_argument("--behaviors", type=int, default=2)
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--every", type=int, default=2, help="checkpoint every N steps")
    parser.add_argument("--tick", type=float, default=0.0, help="seconds per environment step")
    parser.add_argument("--max-steps", type=int, default=10**9)
    parser.add_argument("--pretend-mlagents-version", default=None)
    parser.add_argument("--hold-at-binding", action="store_true",
                        help="once the stats_writer plugins ran (before any status call), say so and wait to be killed")
    args = parser.parse_args()
    if args.report:
        args.resume = True
    if args.pretend_mlagents_version:
        import mlagents.trainers

        mlagents.trainers.__version__ = args.pretend_mlagents_version
    logging_util.set_log_level(logging_util.INFO)  # run_cli

    load_plugins("mlagents.trainer_type")  # parse_command_line
    options = options_for(args)
    settings = options.checkpoint_settings
    run_logs_dir = settings.run_logs_dir
    os.makedirs(run_logs_dir, exist_ok=True)
    if settings.resume:
        GlobalTrainingStatus.load_state(os.path.join(run_logs_dir, "training_status.json"))
    load_plugins("mlagents.stats_writer", options)
    if args.hold_at_binding:  # not ML-Agents': the test looks at the file before anything is set
        say(ack="bound")
        threading.Event().wait()
    manager = EnvironmentParameterManager(options.environment_parameters, 1, restore=settings.resume)
    names = [f"Behavior{i}" for i in range(args.behaviors - 1)] + [GHOST]
    trainers = [Trainer(n, settings.write_path, args.keep, n == GHOST) for n in names]

    if args.report:
        say(report={
            "lessons": manager.get_current_lesson_number(),
            "checkpoints": {n: ModelCheckpointManager.get_checkpoints(n) for n in names},
            "final": {n: GlobalTrainingStatus.get_parameter_state(n, StatusType.FINAL_CHECKPOINT) for n in names},
            "elo": GlobalTrainingStatus.get_parameter_state(GHOST, StatusType.ELO),
            "unknown_category": GlobalTrainingStatus.saved_state["NoSuchBehavior"],
            "unknown_key": GlobalTrainingStatus.get_parameter_state("NoSuchBehavior", StatusType.ELO),
        })
        return 0

    say(ack="started", lessons=manager.get_current_lesson_number(),
        steps={t.name: t.step for t in trainers})
    threads = []
    if args.threaded and not settings.inference:  # an inference run trains, and so checkpoints, nothing
        threads = [threading.Thread(target=t.run_threaded, args=(args.every, args.tick), daemon=True)
                   for t in trainers]
        for thread in threads:
            thread.start()
    try:
        step, done = 0, False
        while step < args.max_steps:
            step += 1
            lessons = manager.get_current_lesson_number()
            if all(n == LESSONS - 1 for n in lessons.values()):
                if not done:  # from now on the main thread makes no status call
                    say(ack="curriculum_done")
                    done = True
            else:
                rewards = [1.0] if step % 3 == 0 else [0.0]
                updated, _ = manager.update_lessons({"Walker": step}, {"Walker": 10**9}, {"Walker": rewards})
                if updated:
                    say(ack="lessons", lessons=manager.get_current_lesson_number())
            if not args.threaded and not settings.inference:
                for trainer in trainers:
                    trainer.advance(args.every)
            time.sleep(args.tick)
    except KeyboardInterrupt:
        say(ack="interrupted")
        for trainer in trainers:  # join_threads()
            trainer.stop.set()
        for thread in threads:
            thread.join()
    if not settings.inference:
        for trainer in trainers:  # _save_models(), in finally:
            trainer.save_model()
    # run_training's finally: write_training_status(run_logs_dir)
    GlobalTrainingStatus.save_state(os.path.join(run_logs_dir, "training_status.json"))
    say(ack="saved")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
