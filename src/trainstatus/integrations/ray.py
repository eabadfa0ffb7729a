"""Ray Train (Train v2): a resume that survives a torn snapshot, a deleted folder and a lost worker.

Ray Train's controller registers a checkpoint once every worker reported it, writes its own list,
``checkpoint_manager_snapshot.json``, in place (no temp file, no rename, no fsync), removes the
folders beyond ``CheckpointConfig(num_to_keep=...)``, and on a restart under the same
``RunConfig(name=...)`` resumes from the newest checkpoint that snapshot names. A snapshot cut short
stops the run (``CheckpointManagerInitializationError``); a listed folder that is gone stops it too
("a corrupted run directory"), with no fall back to the other checkpoints. Here:

- ``TrainStatusCallback`` is a ``ray.train.UserCallback``: on the controller, after Ray registered
  a checkpoint (and removed the folders ``num_to_keep`` drops), it records the folder, every file in
  it with its size and the metrics reported with it in the status file, and unlists the folders Ray
  removed: the list stays in step with Ray's, and nothing is deleted by trainstatus.
- ``last_complete_checkpoint(run_path)`` is the newest recorded checkpoint whose files are all there
  with their recorded sizes, as a ``ray.train.Checkpoint``, for a new run to start from.

Usage (Ray Train v2's own resume recipe, and the callback)::

    import ray.train
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from trainstatus.integrations.ray import TrainStatusCallback, last_complete_checkpoint

    def train_func(config):
        checkpoint = ray.train.get_checkpoint() or config.get("resume_from")
        ...

    resume_from = last_complete_checkpoint("/mnt/runs/run-1")      # <storage_path>/<name>
    trainer = TorchTrainer(
        train_func, train_loop_config={"resume_from": resume_from},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run-2", storage_path="/mnt/runs",   # a new name
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             callbacks=[TrainStatusCallback()]),
    )
    trainer.fit()

The record is made on the controller, never in the training function: a worker's ``report()``
returns before the controller registers the checkpoint (about 2 s later, measured), and a worker
lost in between leaves a folder Ray never resumes from.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from collections.abc import Mapping
from typing import Any

from ray.train import Checkpoint, UserCallback

from .._checkpoints.entries import new_entry
from .._checkpoints.files import CHECKPOINTS, FILES
from .._checkpoints.folders import sync_entry
from .._checkpoints.roots import rebase
from .._committing import retold
from .._errors import TrainingStatusTypeError, TrainingStatusValueError
from .._remote.location import url_scheme
from .._store import StatusStore
from ._ray.storage import STATUS_FILE, Storage, is_checkpoint_name
from ._ray.resume import newest_whole
from ._shared.inside import inside

__all__ = ["CATEGORY", "STATUS_FILE", "TrainStatusCallback", "last_complete_checkpoint"]

CATEGORY = "ray"
"""The category of the status file the checkpoints are listed under (``ray/checkpoints``)."""

PathLike = str | os.PathLike[str]


class TrainStatusCallback(UserCallback):
    """A ``ray.train.UserCallback`` that records each checkpoint Ray Train registers, on the controller.

    ``RunConfig(callbacks=[TrainStatusCallback()])``. Ray calls ``after_report`` on its controller
    once every worker reported (``ray.train.report``) and the checkpoint is registered: Ray has
    written its snapshot and removed the folders beyond ``CheckpointConfig(num_to_keep=...)``. Then:

    - the checkpoint's folder is recorded under ``ray/checkpoints`` of the status file: its name in
      the run's folder (``file_path``), every file in it with its size (``files``), the metrics the
      first worker reported with it (``metrics``, what Ray keeps with the checkpoint), the score Ray
      ranks it by when ``checkpoint_score_attribute`` is set (``reward``), and ``steps``, its place in
      the run (1 for the first checkpoint recorded, then one more each). On a local disk (or a
      shared filesystem) each file, the folder and the folders above it are fsynced first; on an
      object store the sizes come from one listing of the folder (an object is durable once its
      upload was acknowledged).
    - with ``num_to_keep`` set, the entries of folders Ray removed are dropped from the list in the
      same write: the list names what Ray keeps. Nothing is deleted by this callback.

    ``status_path``: the status file; by default ``training_status.json`` in the run's folder
    (``<storage_path>/<name>``): a local file, or an object beside the checkpoints on ``s3://`` or
    ``gs://`` (written with the store's conditional writes; credentials and endpoint from the
    environment, as Ray's own filesystem takes them, or ``storage_options=``). Ray's other storages
    (a custom ``storage_filesystem`` of another kind) need ``status_path``.

    An error while recording (the status file cannot be written) is raised on the controller: Ray's
    failure policy does not retry an error of a callback, so the run stops and ``trainer.fit()``
    raises it (in Ray's ``ControllerError``). A run that went on while nothing was recorded could
    not resume from its later checkpoints.
    """

    def __init__(self, status_path: PathLike | None = None, *,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if status_path is not None and not isinstance(status_path, (str, os.PathLike)):
            raise TrainingStatusTypeError(
                f"TrainStatusCallback status_path= must be a file path or an s3://, gs:// or az:// URL (str or "
                f"os.PathLike), or None (training_status.json in the run's folder), not "
                f"{type(status_path).__name__!r} ({status_path!r})."
            )
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TrainingStatusTypeError(
                f"TrainStatusCallback storage_options= must be a mapping (the object store's options) or None, "
                f"not {type(storage_options).__name__!r} ({storage_options!r})."
            )
        self.status_path = _status(status_path)
        if self.status_path is not None:
            _refuse_inside(self.status_path, "TrainStatusCallback")  # before the run, not at its first report
        self.storage_options = None if storage_options is None else dict(storage_options)

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        if checkpoint is None:
            return
        config = run_context.run_config
        run = Storage.of_run(config.storage_path, config.name, checkpoint.filesystem)
        keep = config.checkpoint_config.num_to_keep
        score = config.checkpoint_config.checkpoint_score_attribute
        first = metrics[0] if metrics else {}
        record(run, checkpoint.path, first, keep=keep, reward=_score(first, score),
               status_path=self.status_path, storage_options=self.storage_options)


def record(run: Storage, folder: str, metrics: Mapping[str, Any], *, keep: int | None, reward: float | None,
           status_path: str | None, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Record the checkpoint folder ``folder`` of ``run`` (what ``after_report`` does); the entry recorded."""
    name = run.name_of(folder)
    path = run.status_path(status_path)
    where, context = f"{CATEGORY}/{CHECKPOINTS} in {path}", {"path": path, "category": CATEGORY, "key": CHECKPOINTS}
    store = StatusStore(path, storage_options=storage_options) if url_scheme(path) else StatusStore(path)
    try:
        steps = _next(store.get(CATEGORY, CHECKPOINTS))
        if run.local:
            entry, targets = new_entry(steps, name, reward, (), None, False, root=run.root, where=where,
                                       context=context)
            # Up to the status file's folder when it is a local file, else up to the run's folder.
            sync_entry(entry, targets, path if url_scheme(path) is None else run.join(STATUS_FILE), where, context)
        else:
            entry = {"steps": steps, "file_path": name, "reward": reward, "creation_time": time.time(),
                     "auxillary_file_paths": [], FILES: run.sizes(name)}
            if not entry[FILES]:
                raise TrainingStatusValueError(
                    f"Cannot record the checkpoint {name} of {run.shown()}: its folder holds no file. Nothing was "
                    "recorded.", **context)
        entry["metrics"] = _plain(dict(metrics))

        def body(store: StatusStore) -> None:
            keys = dict(store.to_dict().get(CATEGORY) or {})
            if run.local:  # relative paths under the run's folder, found from any current directory
                for key, value in rebase(CATEGORY, keys, run.root, path).items():
                    store.set(CATEGORY, key, value)
                    keys[key] = value
            current = keys.get(CHECKPOINTS) or []
            if not isinstance(current, list):
                raise TrainingStatusValueError(
                    f"{where} holds a {type(current).__name__}, not a list of checkpoints; fix it, or delete it "
                    f"(trainstatus delete {path} {CATEGORY} {CHECKPOINTS}) to start a new list.", **context)
            # The folder written again (a name the training function gives) replaces its entry; with
            # num_to_keep, the folders Ray removed before calling us leave the list.
            kept = [e for e in current if not (isinstance(e, Mapping) and (
                e.get("file_path") == name or (keep is not None and isinstance(e.get("file_path"), str)
                                               and not run.exists(e["file_path"]))))]
            entry["steps"] = max(entry["steps"], _next(current))
            store.set(CATEGORY, CHECKPOINTS, [*kept, entry])

        with retold("record the checkpoint again"):
            store.run_transaction(body)
        return dict(entry)
    finally:
        store.close()


def last_complete_checkpoint(run_path: PathLike, *, status_path: PathLike | None = None,
                             storage_filesystem: Any = None,
                             storage_options: Mapping[str, Any] | None = None) -> Checkpoint | None:
    """The newest checkpoint of the run ``run_path`` whose files are all there, or None.

    ``run_path`` is the run's folder, ``<storage_path>/<name>`` of its ``RunConfig``: a local path,
    or an ``s3://`` or ``gs://`` URL (or a path on ``storage_filesystem``, as Ray takes
    ``RunConfig(storage_filesystem=...)``). Reads what ``TrainStatusCallback`` (same
    ``status_path``, same ``storage_options``) recorded; newest is the last one recorded. A
    checkpoint counts when every file recorded in it is there with its recorded size (a listing:
    no file is read). Newer recorded checkpoints passed over are named, with the reason, in one
    ``TrainingStatusCheckpointWarning``; so, in another, are the folders named as Ray names its
    checkpoints that were never recorded (uploads Ray had not registered when the run stopped,
    which its ``num_to_keep`` never removes). Nothing is removed.

    Returns a ``ray.train.Checkpoint`` on the run's filesystem, for a new run: pass it in
    ``train_loop_config`` and take ``ray.train.get_checkpoint() or config["resume_from"]`` in the
    training function, under a new ``RunConfig(name=...)`` (the same name makes Ray read its own
    snapshot again). None when nothing recorded is whole, or nothing is recorded (a fresh run).
    """
    if not isinstance(run_path, (str, os.PathLike)):
        raise TrainingStatusTypeError(
            f"last_complete_checkpoint() takes the run's folder (<storage_path>/<name>) as a path or an s3:// or "
            f"gs:// URL, not {type(run_path).__name__!r} ({run_path!r})."
        )
    given = os.fspath(run_path)
    trimmed = given.rstrip("/" + os.sep)
    if is_checkpoint_name(trimmed.rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1]):
        # From the name alone (the same on a disk and an object store): Ray names its checkpoint
        # folders so, and never a run's. Read as a run, it would answer None: a run from scratch.
        parent = trimmed[:max(trimmed.rfind("/"), trimmed.rfind(os.sep))] or os.curdir
        raise TrainingStatusValueError(
            f"last_complete_checkpoint({given!r}): {trimmed} is one of a run's checkpoint folders, named as Ray "
            f"names them. Pass the run's folder that holds them (<storage_path>/<name>), {parent}: the answer is "
            "the newest whole checkpoint recorded there. Nothing was read."
        )
    run = Storage.of_path(given, storage_filesystem)
    path = run.status_path(_status(status_path))
    _refuse_inside(path, f"last_complete_checkpoint({given!r})")
    entry = newest_whole(run, path, CATEGORY, storage_options)
    if entry is None:
        return None
    folder = run.join(entry["file_path"])
    return Checkpoint(folder) if run.local else Checkpoint(folder, filesystem=run.fs)


# -- helpers ------------------------------------------------------------------------------------


def _refuse_inside(status_path: str, action: str) -> None:
    """Refuse a status file (a path or a URL) inside one of a run's checkpoint folders, by the name
    Ray gives them: Ray's ``num_to_keep`` removes such a folder whole, the status file with it."""
    where = inside(status_path, named=is_checkpoint_name)
    if where is not None:
        raise TrainingStatusValueError(
            f"{action}: the status file {status_path} would lie inside the checkpoint folder "
            f"{os.path.basename(where)}, which Ray "
            "removes whole when num_to_keep drops it, the status file with it. Keep it in the run's folder (the "
            "default), or pass status_path= outside every checkpoint folder. Nothing was read or changed.",
            path=status_path)


def _status(given: PathLike | None) -> str | None:
    if given is None:
        return None
    text = os.fspath(given)
    return text if url_scheme(text) is not None else os.path.abspath(text)


def _next(entries: Any) -> int:
    """One more than the highest ``steps`` of ``entries``; 1 for none."""
    steps = [e.get("steps") for e in entries if isinstance(e, Mapping)] if isinstance(entries, list) else []
    return max([s for s in steps if type(s) is int], default=0) + 1


def _score(metrics: Mapping[str, Any], attribute: str | None) -> float | None:
    """The value Ray ranks the checkpoint by (``checkpoint_score_attribute``), when it is a number."""
    value = metrics.get(attribute) if attribute else None
    if type(value) is bool or not isinstance(value, numbers.Real) or math.isinf(float(value)):
        return None
    return float(value)


def _plain(value: Any) -> Any:
    """``value`` as the status file can hold it: numbers, strings, lists and maps of them; anything
    else (a tensor, a date) as its ``str``."""
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)
