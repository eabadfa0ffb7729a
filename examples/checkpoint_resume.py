"""Kill a trainer in the middle of a checkpoint save, resume, and see which checkpoint gets picked.

A toy trainer runs in a child process and saves a checkpoint every few steps: a file with a
header, its weights and a checksum, written in chunks (a real save of a large model takes seconds),
then recorded with ``CheckpointList.add`` (keeping the 3 newest). The parent SIGKILLs it halfway
through writing its 5th checkpoint file, then resumes:

- "newest file on disk" (what a script that globs the checkpoint folder does) picks the
  half-written file, and loading it fails;
- ``CheckpointList.latest(check=...)`` picks the newest recorded checkpoint whose file loads:
  the last one the trainer finished saving.

Last, the newest recorded file is damaged after the fact (a disk error, a bad copy):
``latest`` skips it with a warning and goes back one more.

Run: python examples/checkpoint_resume.py   (exit status 0 when each resume picked the last
complete checkpoint)
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

from trainstatus import CheckpointList, StatusStore

KEEP = 3
KILL_DURING_SAVE = 5
STEPS_PER_CHECKPOINT = 1000
CHUNKS, CHUNK = 8, 64 * 1024
MAGIC = b"TOYCKPT1"
HEADER = struct.Struct("<8sqq")  # magic, steps, payload length; the payload's sha256 follows it


def status_path(run_dir: str) -> str:
    return os.path.join(run_dir, "run_logs", "training_status.json")


def load(path: str) -> int:
    """The toy loader: the checkpoint's steps, or an error for a short or damaged file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER.size:
        raise ValueError(f"{len(data)} bytes: too short for a header")
    magic, steps, length = HEADER.unpack_from(data)
    payload, digest = data[HEADER.size:HEADER.size + length], data[HEADER.size + length:]
    if magic != MAGIC or len(payload) != length:
        raise ValueError(f"truncated: {len(payload)} of {length} bytes of weights")
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError("checksum mismatch")
    return int(steps)


def train(run_dir: str) -> None:
    """The child: trains forever, saving a checkpoint every STEPS_PER_CHECKPOINT steps."""
    os.makedirs(os.path.join(run_dir, "models"), exist_ok=True)
    checkpoints = CheckpointList(StatusStore(status_path(run_dir)), "Walker", keep=KEEP, root=run_dir)
    steps = 0
    while True:
        steps += STEPS_PER_CHECKPOINT
        weights = hashlib.sha256(str(steps).encode()).digest() * (CHUNKS * CHUNK // 32)
        name = os.path.join("models", f"Walker-{steps}.ckpt")
        print(f"saving {steps}", flush=True)
        with open(os.path.join(run_dir, name), "wb") as f:
            f.write(HEADER.pack(MAGIC, steps, len(weights)))
            for i in range(CHUNKS):
                f.write(weights[i * CHUNK:(i + 1) * CHUNK])
                f.flush()
                print(f"chunk {i + 1}", flush=True)
                time.sleep(0.01)  # a big model takes a while to write
            f.write(hashlib.sha256(weights).digest())
        checkpoints.add(steps, name, reward=steps / 100)
        print(f"saved {steps}", flush=True)


def run_and_kill(run_dir: str) -> int:
    """Start the trainer and SIGKILL it halfway through a save; the last save it finished."""
    child = subprocess.Popen([sys.executable, __file__, "--child", run_dir], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    saves, saved = 0, 0
    for line in child.stdout:
        word, number = line.split()
        if word == "saving":
            saves += 1
        elif word == "saved":
            saved = int(number)
        elif saves == KILL_DURING_SAVE and int(number) == CHUNKS // 2:
            child.send_signal(signal.SIGKILL)
            break
    child.stdout.read()
    child.wait()
    print(f"  trainer killed with SIGKILL (exit status {child.returncode}) while writing checkpoint "
          f"{saves}; the last save it finished: steps {saved}")
    return saved


def loads(path: str) -> str:
    try:
        return f"loads (steps {load(path)})"
    except ValueError as exc:
        return f"does not load: {exc}"


def resume(run_dir: str) -> dict[str, Any] | None:
    """What a resume picks with trainstatus, the warnings it gave printed."""
    store = StatusStore(status_path(run_dir), resume=True)
    checkpoints = CheckpointList(store, "Walker", keep=KEEP, root=run_dir)

    def usable(entry: dict[str, Any]) -> bool:
        return load(checkpoints.resolve(entry["file_path"])) == entry["steps"]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        best = checkpoints.latest(check=usable)
    for warning in caught:
        print(f"  [warning] {warning.message}")
    listed = checkpoints.entries()
    present = sum(os.path.exists(checkpoints.resolve(e["file_path"])) for e in listed)
    print(f"  the status lists {len(listed)} checkpoint(s), {present} of them on disk")
    if best is None:
        print("  CheckpointList.latest(): none")
    else:
        print(f"  CheckpointList.latest(): {best['file_path']}, which {loads(checkpoints.resolve(best['file_path']))}")
    store.close()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", metavar="RUN_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        train(args.child)
        return 0

    with tempfile.TemporaryDirectory(prefix="trainstatus-checkpoints-") as run_dir:
        print("Killed during a checkpoint save:")
        saved = run_and_kill(run_dir)
        files = sorted(glob.glob(os.path.join(run_dir, "models", "*.ckpt")),
                       key=lambda f: int(os.path.basename(f).split("-")[1].split(".")[0]))
        names = ", ".join(f"{os.path.basename(f)} ({os.path.getsize(f):,} bytes)" for f in files)
        print(f"  on disk: {names}")
        print(f"  newest file on disk: {os.path.basename(files[-1])}, which {loads(files[-1])}")
        best = resume(run_dir)
        first = best is not None and best["steps"] == saved and load(os.path.join(run_dir, best["file_path"])) == saved

        print("\nThen the newest recorded checkpoint file is damaged:")
        damaged = os.path.join(run_dir, "models", f"Walker-{saved}.ckpt")
        with open(damaged, "r+b") as f:
            f.seek(HEADER.size + 100)
            f.write(b"\0" * 16)
        print(f"  16 bytes of {os.path.basename(damaged)} overwritten with zeros")
        best = resume(run_dir)
        earlier = saved - STEPS_PER_CHECKPOINT
        second = best is not None and best["steps"] == earlier

    print(f"\nresumed from the last complete checkpoint (steps {saved}): {'yes' if first else 'NO'}")
    print(f"skipped the damaged one for steps {earlier}: {'yes' if second else 'NO'}")
    return 0 if first and second else 1


if __name__ == "__main__":
    sys.exit(main())
