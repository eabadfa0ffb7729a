"""PyTorch Lightning: checkpoints that a kill cannot leave half-written, and a resume that finds them.

Lightning's ``ModelCheckpoint`` saves through the strategy's ``CheckpointIO`` plugin and removes
its old top-k files through it too; ``trainer.fit(ckpt_path="last")`` then loads whatever the
newest ``last*.ckpt`` holds. Here:

- ``TrainStatusCheckpointIO`` is a ``CheckpointIO`` plugin wrapping the default one
  (``TorchCheckpointIO``): each save goes to a temp name in the checkpoint's folder, is fsynced
  and renamed into place (then the folder fsynced), and only then recorded in a
  ``CheckpointList``; ``remove_checkpoint`` drops the entry from the list (one write) before it
  removes the file.
- ``last_complete_checkpoint(dirpath)`` is the newest recorded ``.ckpt`` that is whole, for
  ``trainer.fit(ckpt_path=...)``.

Usage (two lines differ from Lightning's own recipe)::

    from trainstatus.integrations.lightning import TrainStatusCheckpointIO, last_complete_checkpoint

    trainer = Trainer(callbacks=[ModelCheckpoint(dirpath="ckpts/", save_last=True)],
                      plugins=[TrainStatusCheckpointIO()])
    trainer.fit(model, ckpt_path=last_complete_checkpoint("ckpts/"))
"""

from __future__ import annotations

import math
import os
import re
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

from lightning.pytorch.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO

from .._storage import atomic as _atomic, filenames as _names
from .._checkpoints.checkpoint_list import CheckpointList
from .._checkpoints.folders import sync_folders_above
from .._errors import TrainingStatusCheckpointError, TrainingStatusError, TrainingStatusTypeError
from .._store import StatusStore
from ._common import Words, drop, newest_whole, remove_stale_temps

__all__ = ["CATEGORY", "STATUS_FILE", "TrainStatusCheckpointIO", "last_complete_checkpoint"]

STATUS_FILE = "training_status.json"
"""The status file's name in the checkpoint's folder when no ``status_path`` is given."""

CATEGORY = "lightning"
"""The category of the status file the checkpoints are listed under (``lightning/checkpoints``)."""

_WORDS = Words(
    left="They are left on disk: the checkpoints this run saves take their place.",
    fresh="trainer.fit(ckpt_path=None) starts at step 0 and saves its checkpoints beside these.",
    elsewhere="give ModelCheckpoint another dirpath",
)

_TEMP = re.compile(r"\..*\.ckpt\.trainstatus-[0-9a-f]{16}\.tmp")  # _storage.filenames.temp_name of a *.ckpt


class TrainStatusCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` plugin: each checkpoint written atomically, recorded once durable.

    ``Trainer(plugins=[TrainStatusCheckpointIO()])``. It wraps ``checkpoint_io`` (default: a new
    ``TorchCheckpointIO``, what Lightning uses on CPU and GPU) and changes what happens around it:

    - ``save_checkpoint(checkpoint, path)`` has the wrapped plugin write a temp file in ``path``'s
      folder (``.<name>.trainstatus-<hex>.tmp``, which ``*.ckpt`` does not match), fsyncs it,
      renames it to ``path`` (so ``last.ckpt`` saved over again is the old checkpoint or the new
      one, never half of one), fsyncs the folder, and only then records the checkpoint in
      ``lightning/checkpoints`` of the status file (``steps``: the checkpoint's ``global_step``;
      ``reward``: the score a ``ModelCheckpoint`` of that folder monitors, when it has one).
      Older entries that named the same file (``last.ckpt``) are dropped afterwards.
    - ``remove_checkpoint(path)`` (``ModelCheckpoint`` dropping an old top-k file) first drops the
      file's entry from the list, in one write, then has the wrapped plugin remove the file: a kill
      in between leaves a file no longer listed, never a listed file that is gone.
    - ``load_checkpoint`` is the wrapped plugin's.

    ``status_path``: the status file (default: ``training_status.json`` in the folder of each
    checkpoint saved, which is ``ModelCheckpoint``'s ``dirpath``). Paths must be local files.

    ``ModelCheckpoint(save_last="link")`` is supported: Lightning then makes ``last.ckpt`` a
    symlink to the newest top-k file itself, with ``os.remove`` and ``os.symlink``, past this
    plugin. The files the links point to are the ones saved and recorded here, so
    ``last_complete_checkpoint`` never needs the link; an entry whose file Lightning has since
    replaced by a link is dropped at the next save and never returned.
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None,
                 status_path: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_io is None:
            checkpoint_io = TorchCheckpointIO()
        if not isinstance(checkpoint_io, CheckpointIO) or isinstance(checkpoint_io, (AsyncCheckpointIO,
                                                                                     TrainStatusCheckpointIO)):
            raise TrainingStatusTypeError(
                f"TrainStatusCheckpointIO checkpoint_io= must be a Lightning CheckpointIO that has written "
                f"the file when save_checkpoint returns (TorchCheckpointIO, the default), not "
                f"{type(checkpoint_io).__name__!r}: an asynchronous save or a second TrainStatusCheckpointIO "
                "would be recorded before its file is whole. Pass checkpoint_io=None for the default."
            )
        if status_path is not None and not isinstance(status_path, (str, os.PathLike)):
            raise TrainingStatusTypeError(
                f"TrainStatusCheckpointIO status_path= must be a file path (str or os.PathLike) or None "
                f"(training_status.json in the checkpoints' folder), not {type(status_path).__name__!r} "
                f"({status_path!r})."
            )
        self.checkpoint_io = checkpoint_io
        self.status_path = None if status_path is None else os.path.abspath(os.fspath(status_path))
        self._lists: dict[str, CheckpointList] = {}  # by folder

    def checkpoints(self, dirpath: str | os.PathLike[str]) -> CheckpointList:
        """The ``CheckpointList`` the checkpoints saved in ``dirpath`` are recorded in (opened on first use)."""
        folder = os.path.abspath(os.fspath(dirpath))
        checkpoints = self._lists.get(folder)
        if checkpoints is None:
            store = StatusStore(_status_path(folder, self.status_path))
            checkpoints = CheckpointList(store, CATEGORY, keep=None, root=folder)
            self._lists[folder] = checkpoints
            _remove_stale_temps(folder)
            # The folder may be new (save_checkpoint makes it): its entry, and those of the
            # folders made with it, must be durable before a checkpoint in it is recorded.
            try:
                sync_folders_above([folder], store.path)
            except OSError as exc:
                raise TrainingStatusCheckpointError(
                    f"Cannot make {folder} durable before recording checkpoints in it: syncing the "
                    f"folder {exc.filename} failed ({exc.strerror or exc}). Check the disk.",
                    path=store.path, category=CATEGORY, errno=exc.errno,
                ) from exc
        return checkpoints

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        target = _local(path, "save")
        folder, name = os.path.split(target)
        os.makedirs(folder, exist_ok=True)
        checkpoints = self.checkpoints(folder)  # before the save: a bad status file fails first
        temp = os.path.join(folder, _names.temp_name(name, _atomic.token()))
        try:
            self.checkpoint_io.save_checkpoint(checkpoint, temp, storage_options)
            fd = os.open(temp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                _atomic.sync_file(fd)
            finally:
                os.close(fd)
            _atomic.replace(temp, target)
        except BaseException:
            _atomic.discard_temp(-1, temp)
            raise
        _atomic.sync_directory(folder)
        steps = checkpoint.get("global_step", 0)
        # The file and the folder are durable (above): synced=True skips a second fsync. keep=None:
        # ModelCheckpoint decides what goes, through remove_checkpoint.
        recorded = checkpoints.add(steps if type(steps) is int else 0, name, reward=_score(checkpoint, folder),
                                   synced=True)
        # One entry per file: the older ones naming this file (saved over: last.ckpt) name a
        # checkpoint that is gone, as do those whose file Lightning replaced by a link.
        drop(checkpoints, lambda entry: _replaced(checkpoints, entry, name), keep=recorded)

    def remove_checkpoint(self, path: Any) -> None:
        target = _local(path, "remove")
        folder, name = os.path.split(target)
        if os.path.exists(_status_path(folder, self.status_path)) or folder in self._lists:
            checkpoints = self.checkpoints(folder)
            drop(checkpoints, lambda entry: checkpoints.resolve(entry["file_path"]) == target)
        self.checkpoint_io.remove_checkpoint(path)

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        loaded: dict[str, Any] = self.checkpoint_io.load_checkpoint(path, map_location=map_location,
                                                                    weights_only=weights_only)
        return loaded

    def teardown(self) -> None:
        self.checkpoint_io.teardown()
        for checkpoints in self._lists.values():
            checkpoints.store.close()
        self._lists.clear()


def last_complete_checkpoint(dirpath: str | os.PathLike[str], *,
                             status_path: str | os.PathLike[str] | None = None) -> str | None:
    """The newest recorded ``.ckpt`` in ``dirpath`` that is whole, or None: for ``trainer.fit(ckpt_path=...)``.

    In place of ``ckpt_path="last"``. Reads what ``TrainStatusCheckpointIO`` (same
    ``status_path``) recorded for the checkpoints saved in ``dirpath`` (``ModelCheckpoint``'s
    ``dirpath``); newest means the highest ``global_step``, then the later saved (``last.ckpt``
    after the top-k file of the same step). A checkpoint counts when its file is the one saved
    (not a link Lightning made in its place) and opens as torch's zip archive with its
    ``data.pkl`` and ``version`` members, every member passing its CRC check. Newer checkpoints
    passed over are named, with the reason, in one ``TrainingStatusCheckpointWarning``; nothing is
    removed. None when nothing was recorded (no status file yet, nor a history to put it back from:
    a fresh run, which ``ckpt_path=None`` starts) or nothing recorded is whole.
    """
    folder = os.path.abspath(os.fspath(dirpath))
    path = _status_path(folder, None if status_path is None else os.path.abspath(os.fspath(status_path)))
    entry = newest_whole(path, CATEGORY, folder, _whole(folder), _WORDS, os.fspath(dirpath))
    if entry is None:
        return None
    return os.path.join(os.fspath(dirpath), entry["file_path"])


# -- helpers ------------------------------------------------------------------------------------


def _status_path(folder: str, status_path: str | None) -> str:
    return os.path.join(folder, STATUS_FILE) if status_path is None else status_path


def _local(path: Any, action: str) -> str:
    given = os.fspath(path)
    if not isinstance(given, str) or "://" in given:
        raise TrainingStatusError(
            f"TrainStatusCheckpointIO cannot {action} {given!r}: it makes local files durable (fsync and "
            "rename in their folder), and this is not a local path. Give ModelCheckpoint a local dirpath, "
            "or leave the plugin out for remote storage."
        )
    return os.path.abspath(given)


def _score(checkpoint: Mapping[str, Any], folder: str) -> float | None:
    """The score the folder's ``ModelCheckpoint`` monitors, as its saved state holds it, or None."""
    states = checkpoint.get("callbacks")
    if not isinstance(states, Mapping):
        return None
    for state in states.values():
        if not isinstance(state, Mapping) or state.get("dirpath") is None:
            continue
        if os.path.abspath(os.fspath(state["dirpath"])) != folder or state.get("current_score") is None:
            continue
        try:
            score = float(state["current_score"])
        except (TypeError, ValueError):
            return None
        return score if math.isfinite(score) or math.isnan(score) else None
    return None


def _replaced(checkpoints: CheckpointList, entry: Mapping[str, Any], saved: str) -> bool:
    """Whether ``entry`` names a file that no longer holds its checkpoint: the file just saved
    again under the same name (``last.ckpt``), or a link Lightning put in the place of the file."""
    path = checkpoints.resolve(entry["file_path"])
    return path == checkpoints.resolve(saved) or os.path.islink(path)


def _remove_stale_temps(folder: str) -> None:
    """Remove the temp files a killed save left in ``folder`` (they never became checkpoints)."""
    remove_stale_temps(folder, _TEMP)


def _whole(folder: str) -> Callable[[dict[str, Any]], bool]:
    def check(entry: dict[str, Any]) -> bool:
        path = os.path.join(folder, entry["file_path"])
        if os.path.islink(path):
            raise ValueError(f"{entry['file_path']} is now a link Lightning made (save_last='link'), not the file saved")
        try:
            archive = zipfile.ZipFile(path)
        except zipfile.BadZipFile as exc:
            raise ValueError(f"{entry['file_path']} is not a whole torch checkpoint ({exc})") from None
        with archive:
            names = archive.namelist()
            missing = [member for member in ("data.pkl", "version")
                       if not any(n.rsplit("/", 1)[-1] == member for n in names)]
            if missing:
                raise ValueError(f"{entry['file_path']} is not a whole torch checkpoint (no {', '.join(missing)})")
            broken = archive.testzip()
        if broken is not None:
            raise ValueError(f"{entry['file_path']}: member {broken} fails its CRC check")
        return True

    return check
