"""A small trainer with a curriculum and a checkpoint list, for the crash-recovery example tests.

Each training step saves a checkpoint file (a header, the "weights", their sha256), records it
with ``CheckpointList.add`` (keeping the 3 newest), then moves the curriculum on: the lesson is
``steps // LESSON_STEPS``, stored under ``wall_height/lesson_num`` as ML-Agents does. A restarted
trainer resumes from the newest recorded checkpoint that loads, and the lesson the status holds.

What must hold however the trainer died (checked by ``check_resume``):

- the status file opens cleanly (no damaged file kept aside);
- every checkpoint the status lists exists and loads: the record never gets ahead of the data;
- the lesson never runs ahead of the model: lesson <= (steps of the resumed checkpoint) // LESSON_STEPS.

``TOY_TRAINER_BUG`` selects a deliberately broken variant, which the example tests must catch:

- ``record-before-complete``: the checkpoint is recorded when only its header is written, and the
  weights are written afterwards;
- ``lesson-first``: the lesson moves on before the checkpoint of that step is recorded;
- ``not-durable``: the status is opened with ``durable=False`` (atomic, but not power-loss safe).
"""

from __future__ import annotations

import hashlib
import os
import struct
import warnings

from trainstatus import CheckpointList, StatusStore, TrainingStatusCheckpointWarning

BUG = os.environ.get("TOY_TRAINER_BUG", "")
BUGS = ("record-before-complete", "lesson-first", "not-durable")
if BUG and BUG not in BUGS:
    raise SystemExit(f"TOY_TRAINER_BUG={BUG!r}: choose one of {', '.join(BUGS)}, or leave it unset")

BEHAVIOR = "Walker"
CURRICULUM = ("wall_height", "lesson_num")
STEPS_PER_CHECKPOINT = 1000
LESSON_STEPS = 2000
KEEP = 3
MAGIC = b"TOYCKPT1"
HEADER = struct.Struct("<8sqq")  # magic, steps, payload length; the payload's sha256 follows


def status_path(run_dir: str) -> str:
    return os.path.join(run_dir, "run_logs", "training_status.json")


def weights(steps: int) -> bytes:
    return (f"weights after {steps} steps;".encode() * 8)[:200]


def load_checkpoint(path: str) -> int:
    """The checkpoint's steps, or ValueError for a short or damaged file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER.size:
        raise ValueError(f"{len(data)} bytes: too short for a header")
    magic, steps, length = HEADER.unpack_from(data)
    payload, digest = data[HEADER.size:HEADER.size + length], data[HEADER.size + length:]
    if magic != MAGIC or len(payload) != length or hashlib.sha256(payload).digest() != digest:
        raise ValueError("truncated or damaged")
    return int(steps)


class Trainer:
    """Opens (resumes) the run in ``run_dir``; ``train(n)`` runs ``n`` more steps."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.store = StatusStore(status_path(run_dir), durable=BUG != "not-durable")
        self.checkpoints = CheckpointList(self.store, BEHAVIOR, keep=KEEP, root=run_dir)
        with warnings.catch_warnings():
            # A listed checkpoint that does not load is skipped here; check_resume reports it.
            warnings.simplefilter("ignore", TrainingStatusCheckpointWarning)
            latest = self.checkpoints.latest(check=lambda e: load_checkpoint(self.checkpoints.resolve(e["file_path"])))
        self.steps = 0 if latest is None else int(latest["steps"])
        self.lesson = int(self.store.get(*CURRICULUM, 0))

    def close(self) -> None:
        self.store.close()

    def _save_checkpoint(self, steps: int) -> str:
        relative = os.path.join("models", f"{BEHAVIOR}-{steps}.ckpt")
        path = os.path.join(self.run_dir, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        payload = weights(steps)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, HEADER.pack(MAGIC, steps, len(payload)))
            if BUG == "record-before-complete":
                self.checkpoints.add(steps, relative)
            os.write(fd, payload + hashlib.sha256(payload).digest())
        finally:
            os.close(fd)
        return relative

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.steps += STEPS_PER_CHECKPOINT
            if BUG == "lesson-first":
                self.lesson = self.steps // LESSON_STEPS
                self.store.set(*CURRICULUM, self.lesson)
            relative = self._save_checkpoint(self.steps)
            if BUG != "record-before-complete":
                # CheckpointList.add fsyncs the file (and its folder) before recording it.
                self.checkpoints.add(self.steps, relative)
            if BUG != "lesson-first":
                self.lesson = self.steps // LESSON_STEPS
                self.store.set(*CURRICULUM, self.lesson)


def check_resume(run_dir: str) -> Trainer:
    """Start the trainer again on ``run_dir`` and assert what must hold after any crash."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a damaged status file kept aside would warn
        trainer = Trainer(run_dir)
    try:
        for entry in trainer.checkpoints.entries():
            path = trainer.checkpoints.resolve(entry["file_path"])
            assert os.path.exists(path), f"the status lists {entry['file_path']}, which is gone"
            try:
                load_checkpoint(path)
            except ValueError as exc:
                raise AssertionError(f"the status lists {entry['file_path']}, which does not load: {exc}") from None
        assert trainer.lesson <= trainer.steps // LESSON_STEPS, (
            f"lesson {trainer.lesson} is ahead of the model it resumes from (steps {trainer.steps})")
    except BaseException:
        # Closed now, not when the failure's traceback lets go of it: under pyfakefs that would be
        # after the fake filesystem is gone, and its descriptors' numbers would close real files
        # (pytest's own capture files, seen as "lost sys.stderr").
        trainer.close()
        raise
    return trainer
