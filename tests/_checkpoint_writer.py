"""The checkpointing trainer that tests/test_checkpoints.py SIGKILLs, and the fork server that runs it.

The server (``serve``: tests/_forkserver.py's, run by tests/_launch.py's ``Workers``) is one
interpreter with trainstatus imported that forks a writer per run, so a kill costs a fork rather
than an interpreter start. A writer opens the status file,
continues after the newest checkpoint listed and loops: write the checkpoint file in chunks (each
flushed, so a kill leaves it part-written on disk) and a small auxiliary file, then
``CheckpointList.add`` them, until killed.

``stop_at`` makes the writer SIGKILL itself at one named point of the checkpoint save, found by
hooks on ``os.fsync`` and ``os.remove`` filtered to the checkpoint folder, so that each state is
certainly reached. ``order="mlagents"`` records the way ML-Agents 1.1.0's checkpoint manager does
(remove the dropped files, then set the list), to show the checks catch that order.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import _forkserver

from trainstatus import CheckpointList, StatusStore

CATEGORY = "Walker"
STEP = 1000
SIZE = 96 * 1024
CHUNK = 8 * 1024
# Where a writer can stop itself, in the order a checkpoint save reaches them.
STOP_POINTS = ("mid-write", "before-add", "after-file-fsync", "before-record", "after-record",
               "mid-remove", "after-add")


def status_path(run_dir: str) -> str:
    return os.path.join(run_dir, "run_logs", "training_status.json")


def file_name(steps: int) -> str:
    return os.path.join("models", f"{CATEGORY}-{steps}.ckpt")


def aux_name(steps: int) -> str:
    return os.path.join("models", f"{CATEGORY}-{steps}.meta")


def content(steps: int) -> bytes:
    """The bytes of the checkpoint at ``steps``: every line names its steps, SIZE bytes in all."""
    line = f"{steps:015d}\n".encode()
    return (line * (SIZE // len(line) + 1))[:SIZE]


def complete(run_dir: str, entry: dict[str, Any]) -> bool:
    """The check= of the tests: the file holds exactly the bytes of its steps."""
    with open(os.path.join(run_dir, entry["file_path"]), "rb") as f:
        return f.read() == content(entry["steps"])


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _hook(models: str, stop_at: str, state: dict[str, Any]) -> None:
    """SIGKILL this process at ``stop_at`` once ``state["armed"]`` is set."""
    real_fsync, real_remove = os.fsync, os.remove

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if not state["armed"]:
            return
        target = os.readlink(f"/proc/self/fd/{fd}")
        if stop_at == "after-file-fsync" and os.path.dirname(target) == models:
            _die()
        if stop_at == "before-record" and target == models:  # the folder: the last sync before the record
            _die()

    def remove(path: Any, *args: Any, **kwargs: Any) -> None:
        inside = state["armed"] and os.path.dirname(os.path.abspath(path)) == models
        if inside and stop_at == "after-record":
            _die()
        real_remove(path, *args, **kwargs)
        if inside and stop_at == "mid-remove":
            _die()

    os.fsync = fsync
    os.remove = remove  # type: ignore[assignment]


def _add_like_mlagents(store: StatusStore, run_dir: str, entry: dict[str, Any], keep: int) -> None:
    checkpoints = store.get(CATEGORY, "checkpoints", [])
    checkpoints.append(entry)
    while len(checkpoints) > keep:
        old = checkpoints.pop(0)
        for path in [old["file_path"], *old["auxillary_file_paths"]]:
            if os.path.exists(os.path.join(run_dir, path)):
                os.remove(os.path.join(run_dir, path))
    store.set(CATEGORY, "checkpoints", checkpoints)


def writer(run_dir: str, keep: int, stop_at: str | None = None, stop_after: int = 0,
           order: str = "trainstatus") -> None:
    """Checkpoint until killed; with ``stop_at``, die there in the ``stop_after``-th save."""
    models = os.path.realpath(os.path.join(run_dir, "models"))  # as /proc/self/fd names it
    os.makedirs(models, exist_ok=True)
    state = {"armed": False}
    if stop_at is not None:
        _hook(models, stop_at, state)
    store = StatusStore(status_path(run_dir))
    checkpoints = CheckpointList(store, CATEGORY, keep=keep, root=run_dir)
    listed = checkpoints.entries()
    steps = listed[-1]["steps"] if listed else 0
    saves = 0
    while True:
        steps += STEP
        saves += 1
        state["armed"] = saves == stop_after
        data = content(steps)
        with open(os.path.join(run_dir, file_name(steps)), "wb") as f:
            for start in range(0, SIZE, CHUNK):
                f.write(data[start:start + CHUNK])
                f.flush()  # a kill now leaves what was written so far in the file
                if state["armed"] and stop_at == "mid-write" and start >= SIZE // 2:
                    _die()
        with open(os.path.join(run_dir, aux_name(steps)), "w") as f:
            f.write(str(steps))
        if state["armed"] and stop_at == "before-add":
            _die()
        if order == "mlagents":
            entry = {"steps": steps, "file_path": file_name(steps), "reward": None,
                     "creation_time": 0.0, "auxillary_file_paths": [aux_name(steps)]}
            _add_like_mlagents(store, run_dir, entry, keep)
        else:
            checkpoints.add(steps, file_name(steps), reward=float(saves), auxillary_file_paths=[aux_name(steps)])
        if state["armed"] and stop_at == "after-add":
            _die()


def serve() -> None:
    """The fork server (tests/_forkserver.py): a writer per run, until it is SIGKILLed."""
    # What the first write imports on first use (filelock): loaded here, once, so that each forked
    # writer writes at once, as the random kill delays assume.
    from trainstatus._lock import path_lock as _locking

    assert _locking.filelock.Timeout
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _forkserver.serve(lambda options: writer(**options))


if __name__ == "__main__":
    serve()
