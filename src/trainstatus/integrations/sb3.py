"""Stable-Baselines3: checkpoints that a kill cannot leave half-written, and a resume that finds them.

SB3's ``CheckpointCallback`` writes ``rl_model_<steps>_steps.zip`` (and the replay buffer and
VecNormalize statistics beside it) straight under their final names, and nothing records which save
finished: a kill during a save leaves a truncated newest ``.zip``, and the usual resume (the newest
``*.zip`` in the folder) fails on it. Here:

- ``TrainStatusCheckpointCallback`` takes ``CheckpointCallback``'s arguments and writes the same
  files, each to a temp name in the same folder, fsynced and renamed into place (then the folder
  fsynced), and records the checkpoint in a ``CheckpointList`` only once every file is durable.
  ``keep=N`` removes the files of older checkpoints only after the shorter list is on disk.
- ``last_complete_checkpoint(save_path)`` is the newest recorded model ``.zip`` whose files are all
  there and whole, for ``PPO.load(...)``.

Usage (two lines differ from SB3's own recipe)::

    from trainstatus.integrations.sb3 import TrainStatusCheckpointCallback, last_complete_checkpoint

    path = last_complete_checkpoint("./logs/")
    model = PPO.load(path, env=env) if path else PPO("MlpPolicy", env)
    model.learn(100_000, callback=TrainStatusCheckpointCallback(1000, "./logs/"), reset_num_timesteps=False)
"""

from __future__ import annotations

import io
import os
import re
import zipfile
from collections.abc import Callable
from typing import Any

from stable_baselines3.common.callbacks import CheckpointCallback

from .._storage import atomic as _atomic, filenames as _names
from .._checkpoints.checkpoint_list import CheckpointList
from .._checkpoints.folders import sync_folders_above
from .._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    warn,
)
from .._store import StatusStore
from ._shared import lease as _lease
from ._shared.choice import Words, choose, pick, reasons, warn_passed_over
from ._shared.upkeep import remove_stale_temps

__all__ = ["STATUS_FILE", "TrainStatusCheckpointCallback", "last_complete_checkpoint"]

STATUS_FILE = "training_status.json"
"""The status file's name in ``save_path`` when no ``status_path`` is given."""

_WORDS = Words(
    left="They are left on disk: a run saves over each file when it reaches its steps.",
    fresh="a new model starts at 0 timesteps and saves over these files as it reaches their steps.",
    elsewhere="use another save_path or name_prefix",
)

_MODEL_MEMBERS = ("data", "_stable_baselines3_version")  # in every zip BaseAlgorithm.save writes
_PICKLE_STOP = b"."  # the last byte of every pickle (the STOP opcode)


class TrainStatusCheckpointCallback(CheckpointCallback):
    """SB3's ``CheckpointCallback``, with each checkpoint written atomically and recorded once durable.

    Same arguments, same file names as ``stable_baselines3.common.callbacks.CheckpointCallback``
    (``<name_prefix>_<steps>_steps.zip``, ``<name_prefix>_replay_buffer_<steps>_steps.pkl``,
    ``<name_prefix>_vecnormalize_<steps>_steps.pkl`` in ``save_path``), plus:

    - ``keep``: how many checkpoints to keep; the files of older ones are removed once the list
      without them is on disk. ``None`` (the default) keeps every one, as SB3 does.
    - ``status_path``: the status file the checkpoints are recorded in (default
      ``<save_path>/training_status.json``). Its category is ``name_prefix``, so several
      callbacks with different prefixes can share one folder and one file.

    Each file is written to a temp name in ``save_path`` (``.<name>.trainstatus-<hex>.tmp``, which
    ``*.zip`` does not match), fsynced and renamed into place, and the folder fsynced; only then is
    the checkpoint recorded (``steps``: the model's ``num_timesteps``; ``reward``: the mean episode
    reward SB3 keeps in ``ep_info_buffer``, or None before the first episode ends).
    """

    def __init__(
        self,
        save_freq: int,
        save_path: str,
        name_prefix: str = "rl_model",
        keep: int | None = None,
        save_replay_buffer: bool = False,
        save_vecnormalize: bool = False,
        verbose: int = 0,
        *,
        status_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if type(save_freq) is not int or save_freq < 1:
            raise (TrainingStatusValueError if type(save_freq) is int else TrainingStatusTypeError)(
                f"TrainStatusCheckpointCallback save_freq= must be a number of calls >= 1, not {save_freq!r}."
            )
        if keep is not None and (type(keep) is not int or keep < 1):
            # A bool here is most likely SB3's fourth positional argument, save_replay_buffer.
            positional = (" (the fourth argument is keep=, where SB3's CheckpointCallback has "
                          "save_replay_buffer: pass save_replay_buffer= by name)") if type(keep) is bool else ""
            raise (TrainingStatusValueError if type(keep) is int else TrainingStatusTypeError)(
                f"TrainStatusCheckpointCallback keep= must be a number of checkpoints >= 1, or None to "
                f"keep every one (as SB3's CheckpointCallback does), not {keep!r}{positional}."
            )
        super().__init__(save_freq, os.fspath(save_path), name_prefix=name_prefix,
                         save_replay_buffer=save_replay_buffer, save_vecnormalize=save_vecnormalize,
                         verbose=verbose)
        self.keep = keep
        self.status_path = _status_path(self.save_path, status_path)
        self._checkpoints: CheckpointList | None = None

    @property
    def checkpoints(self) -> CheckpointList:
        """The ``CheckpointList`` the checkpoints are recorded in (opened on first use)."""
        if self._checkpoints is None:
            store = StatusStore(self.status_path)
            self._checkpoints = CheckpointList(store, self.name_prefix, keep=self.keep,
                                               root=self.save_path)
        return self._checkpoints

    def _init_callback(self) -> None:
        super()._init_callback()  # makes save_path (and the folders above it that were missing)
        # One job per status file, until learn() ends; before anything here touches its folder
        # (the temp files below may be another job's saves in progress).
        _lease.take(self.status_path, "TrainStatusCheckpointCallback")
        _remove_stale_temps(self.save_path, self.name_prefix)
        checkpoints = self.checkpoints  # open the status file now: a bad one fails before training
        # save_path may be new (and its parents): its entry must be durable before a checkpoint
        # in it is recorded, or a power loss could lose the folder while the list names its files.
        try:
            sync_folders_above([self.save_path], checkpoints.store.path)
        except OSError as exc:
            raise TrainingStatusCheckpointError(
                f"Cannot make {self.save_path} durable before recording checkpoints in it: syncing the "
                f"folder {exc.filename} failed ({exc.strerror or exc}). Check the disk.",
                path=checkpoints.store.path, category=self.name_prefix, errno=exc.errno,
            ) from exc
        # learn() resets num_timesteps to 0 unless told not to: a run that did so (on a loaded
        # model or a new one) over recorded checkpoints. (A resume that fell back past a damaged
        # newest checkpoint starts at its own steps, above 0, and re-records the same names.)
        recorded = [e.get("steps") for e in checkpoints.entries() if isinstance(e, dict)]
        newest = max((n for n in recorded if type(n) is int), default=0)
        if self.model.num_timesteps == 0 and newest > 0:
            self._warn_restart(checkpoints, newest)

    def _warn_restart(self, checkpoints: CheckpointList, newest: int) -> None:
        """Warn that this run starts at 0 timesteps over checkpoints recorded up to ``newest`` steps."""
        chosen, skipped = choose(checkpoints, _whole(self.save_path))
        start = (f"This run starts at 0 timesteps in {self.save_path}, where {checkpoints.store.path} recorded "
                 f"checkpoints up to {newest} steps")
        if chosen is None:
            message = (f"{start}, none of them whole ({reasons(skipped)}). This run's checkpoints replace their "
                       "files as it reaches the same steps; until then a resume passes over them with a warning. "
                       f"To keep them, stop and move them out of {self.save_path}, or use another save_path or "
                       "name_prefix.")
        else:
            path = os.path.join(self.save_path, chosen["file_path"])
            message = (f"{start}: last_complete_checkpoint() returns {path} of that run until this one passes "
                       f"{newest} steps, and this run's checkpoints replace that run's files of the same names. "
                       f"If you meant to continue, stop, load it ({type(self.model).__name__}.load({path!r}, "
                       "env=env)) and call learn(..., reset_num_timesteps=False); to start over without this "
                       "warning, use another save_path or name_prefix.")
        warn(TrainingStatusCheckpointWarning(message, path=checkpoints.store.path, category=self.name_prefix))

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq != 0:
            return True
        model_path = self._checkpoint_path(extension="zip")
        _write_atomically(model_path, lambda file, _: self.model.save(file))
        if self.verbose >= 2:
            print(f"Saving model checkpoint to {model_path}")
        extra: list[str] = []
        # As CheckpointCallback asks: any model with a replay buffer, not only OffPolicyAlgorithm's.
        model: Any = self.model
        if self.save_replay_buffer and getattr(model, "replay_buffer", None) is not None:
            replay_buffer_path = self._checkpoint_path("replay_buffer_", extension="pkl")
            _write_atomically(replay_buffer_path, lambda file, _: model.save_replay_buffer(file))
            extra.append(replay_buffer_path)
            if self.verbose > 1:
                print(f"Saving model replay buffer checkpoint to {replay_buffer_path}")
        vec_normalize = self.model.get_vec_normalize_env() if self.save_vecnormalize else None
        if vec_normalize is not None:
            vec_normalize_path = self._checkpoint_path("vecnormalize_", extension="pkl")
            # VecNormalize.save takes a path only: it writes the temp file under its own handle.
            _write_atomically(vec_normalize_path, lambda _, temp: vec_normalize.save(temp))
            extra.append(vec_normalize_path)
            if self.verbose >= 2:
                print(f"Saving model VecNormalize to {vec_normalize_path}")
        # Each file and the folder are durable (_write_atomically): synced=True skips a second fsync.
        self.checkpoints.add(self.num_timesteps, os.path.basename(model_path), reward=self._reward(),
                             auxillary_file_paths=[os.path.basename(p) for p in extra], synced=True)
        return True

    def _reward(self) -> float | None:
        episodes = getattr(self.model, "ep_info_buffer", None) or []
        rewards = [float(info["r"]) for info in episodes if "r" in info]
        return sum(rewards) / len(rewards) if rewards else None

    def _on_training_end(self) -> None:
        _lease.release(self.status_path)
        if self._checkpoints is not None:
            self._checkpoints.store.close()
            self._checkpoints = None


def last_complete_checkpoint(save_path: str | os.PathLike[str], *, name_prefix: str = "rl_model",
                             status_path: str | os.PathLike[str] | None = None) -> str | None:
    """The newest recorded model ``.zip`` in ``save_path`` whose files are all there and whole, or None.

    For ``PPO.load(last_complete_checkpoint(save_path), env=env)`` after a kill, in place of the
    newest ``*.zip`` in the folder. Reads what ``TrainStatusCheckpointCallback`` (same
    ``name_prefix`` and ``status_path``) recorded; a checkpoint counts when its ``.zip`` opens as
    SB3's zip archive (with its ``data`` member) whose every member passes its CRC check and its
    replay buffer and VecNormalize
    files (same steps, SB3's names) are there and end as a pickle does. Newer checkpoints passed
    over are named, with the reason, in one ``TrainingStatusCheckpointWarning``; nothing is removed.
    None when nothing was recorded (no status file yet: a fresh run) or nothing recorded is whole.
    """
    given = os.fspath(save_path)
    if "://" in given:
        raise TrainingStatusValueError(
            f"last_complete_checkpoint({given!r}): SB3's CheckpointCallback saves into a local save_path, and this "
            "is not a local path. Pass the run's local save_path (copy the checkpoints back from remote storage "
            "into it first). Nothing was read."
        )
    root = os.path.abspath(given)
    if os.path.isfile(root):
        raise TrainingStatusValueError(
            f"last_complete_checkpoint({given!r}): {root} is "
            f"{'a checkpoint itself' if root.endswith('.zip') else 'a file, not a folder'}. Pass the folder that "
            f"holds the checkpoints, CheckpointCallback's save_path, {os.path.dirname(root)}: the answer is the "
            "newest whole checkpoint recorded there. Nothing was read."
        )
    path = _status_path(given, status_path)
    listed: list[Any] = []
    entry, skipped = pick(path, name_prefix, root, _whole(root), listed)
    if skipped:
        warn_passed_over(None if entry is None else os.path.join(given, entry["file_path"]), skipped, path,
                         name_prefix, root, _WORDS)
    if entry is None:
        _warn_unrecorded(root, name_prefix, path, listed)
        return None
    return os.path.join(given, entry["file_path"])


# -- helpers ------------------------------------------------------------------------------------


def _warn_unrecorded(root: str, name_prefix: str, status_path: str, listed: list[Any]) -> None:
    """Name the model ``.zip`` files of this prefix that the list never recorded, when the resume
    found nothing to return: never a bare None while checkpoints lie there."""
    pattern = re.compile(re.escape(name_prefix) + r"_(\d+)_steps\.zip")
    recorded = {e.get("file_path") for e in listed if isinstance(e, dict)}
    try:
        names = [n for n in os.listdir(root) if pattern.fullmatch(n) and n not in recorded]
    except OSError:
        return
    if not names:
        return
    names.sort(key=lambda n: int(pattern.fullmatch(n).group(1)))  # type: ignore[union-attr]
    shown = ", ".join(names[-5:]) + (f" and {len(names) - 5} older" if len(names) > 5 else "")
    warn(TrainingStatusCheckpointWarning(
        f"{shown} in {root} {'is a checkpoint' if len(names) == 1 else 'are checkpoints'} that {status_path} has "
        f"never recorded (saved without TrainStatusCheckpointCallback, or with another name_prefix or status_path, "
        f"or a first save cut short before its record), so last_complete_checkpoint() returns None: a new model "
        "starts at 0 timesteps. Load one yourself if you know it is whole (PPO.load(path)), or pass "
        "last_complete_checkpoint the name_prefix and status_path the callback was given.",
        path=status_path, category=name_prefix))


def _status_path(save_path: str, status_path: str | os.PathLike[str] | None) -> str:
    return os.path.join(save_path, STATUS_FILE) if status_path is None else os.fspath(status_path)


def _write_atomically(target: str, save: Callable[[io.BufferedWriter, str], object]) -> None:
    """Run ``save(file, temp_path)`` into a temp file beside ``target``, then make it ``target``.

    The write protocol of ``trainstatus._storage.atomic`` (temp in the same folder, fsync, rename, folder
    fsync), with the temp file created under the process's umask, as SB3's own ``open`` would.
    On any failure the temp file is removed and the first error re-raised; ``target`` is untouched.
    """
    directory, name = os.path.split(target)
    temp = os.path.join(directory, _names.temp_name(name, _atomic.token()))
    file = open(temp, "xb")  # noqa: SIM115 - closed below, before the rename
    try:
        save(file, temp)
        file.flush()
        _atomic.sync_file(file.fileno())
        file.close()
        _atomic.replace(temp, target)
    except BaseException:
        file.close()
        _atomic.discard_temp(-1, temp)
        raise
    _atomic.sync_directory(directory or ".")


def _remove_stale_temps(save_path: str, name_prefix: str) -> None:
    """Remove the temp files a killed save of this prefix left (they never became checkpoints)."""
    # This prefix's names only (rl_model_<steps>_steps.zip and its two .pkl), so that a save in
    # progress under another prefix (rl_model_best_...) in the same folder is never touched.
    remove_stale_temps(save_path, re.compile(re.escape("." + name_prefix + "_") + r"(?:replay_buffer_|vecnormalize_)?"
                                             r"\d+_steps\.(?:zip|pkl)\.trainstatus-[0-9a-f]{16}\.tmp"))


def _whole(root: str) -> Callable[[dict[str, Any]], bool]:
    def check(entry: dict[str, Any]) -> bool:
        try:
            archive = zipfile.ZipFile(os.path.join(root, entry["file_path"]))
        except zipfile.BadZipFile as exc:
            raise ValueError(f"{entry['file_path']} is not a whole SB3 model zip ({exc})") from None
        with archive:
            # A model zip cut short may still open: torch.save's own archives are stored inside it
            # uncompressed, and zipfile then finds the end of one of those. SB3's members say
            # whose end it found.
            missing = [name for name in _MODEL_MEMBERS if name not in archive.namelist()]
            if missing:
                raise ValueError(f"{entry['file_path']} is not a whole SB3 model zip (no {', '.join(missing)})")
            broken = archive.testzip()
        if broken is not None:
            raise ValueError(f"{entry['file_path']}: member {broken} fails its CRC check")
        for name in entry.get("auxillary_file_paths") or []:
            with open(os.path.join(root, name), "rb") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() == 0:
                    raise ValueError(f"{name} is empty")
                f.seek(-1, os.SEEK_END)
                if f.read(1) != _PICKLE_STOP:
                    raise ValueError(f"{name} does not end as a pickle does (cut short)")
        return True

    return check
