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
  ``trainer.fit(ckpt_path=...)``; it reads the status file and each candidate's metadata, never its
  data.
- ``TrainStatusCallback`` is a ``Callback`` for several processes and sharded strategies: at
  set-up it checks the strategy, records the sharded saves that FSDP, ModelParallel and DeepSpeed
  make past ``CheckpointIO`` (once every rank's files are durable), refuses what cannot be
  recorded, and checks that every rank resumes from the same checkpoint (and, under DeepSpeed,
  that it was saved by as many ranks, before DeepSpeed loads it).

Usage (two lines differ from Lightning's own recipe)::

    from trainstatus.integrations.lightning import TrainStatusCheckpointIO, last_complete_checkpoint

    trainer = Trainer(callbacks=[ModelCheckpoint(dirpath="ckpts/", save_last=True)],
                      plugins=[TrainStatusCheckpointIO()])
    trainer.fit(model, ckpt_path=last_complete_checkpoint("ckpts/"))

With a sharded strategy (or to have every rank's resume checked), add the callback too::

    trainer = Trainer(strategy=ModelParallelStrategy(), plugins=[TrainStatusCheckpointIO()],
                      callbacks=[ModelCheckpoint(dirpath="ckpts/", save_last=True), TrainStatusCallback()])

Why a callback beside the plugin: a ``CheckpointIO`` plugin is handed checkpoints, never the
strategy, and a sharded strategy never calls it to save; a ``Callback`` gets ``setup(trainer, ...)``
on every rank, once the process group exists and before anything is restored or saved, with
``trainer.strategy`` in hand.
"""

from __future__ import annotations

import os
import re
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.plugins.io import (
    AsyncCheckpointIO,
    CheckpointIO,
    TorchCheckpointIO,
)

from .._checkpoints.checkpoint_list import CheckpointList
from .._checkpoints.folders import sync_folders_above
from .._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusTypeError,
)
from .._storage import atomic as _atomic
from .._storage import filenames as _names
from .._store import StatusStore
from ._lightning import remote as _remote
from ._lightning.resume import decide
from ._shared.folder import given_status
from ._lightning import strategies as _strategies
from ._lightning.common import (
    CATEGORY,
    STATUS_FILE,
    local,
    refuse_remote,
    refuse_status_inside,
    replaced,
    resume_folder,
    score,
    status_files,
)
from ._lightning.common import status_path as _status_path
from ._ranks import hosts as _hosts
from ._ranks.collectives import on_rank_0
from ._shared import lease as _lease
from ._shared.upkeep import drop, remove_stale_temps

__all__ = ["CATEGORY", "STATUS_FILE", "TrainStatusCallback", "TrainStatusCheckpointIO", "last_complete_checkpoint"]

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
        self.status_path = None if status_path is None else given_status(os.fspath(status_path))
        self._lists: dict[str, CheckpointList] = {}  # by folder
        self._remote: dict[str, _remote.RemoteList] = {}  # by folder URL: ModelCheckpoint's dirpath on an object store

    def checkpoints(self, dirpath: str | os.PathLike[str]) -> CheckpointList:
        """The ``CheckpointList`` the checkpoints saved in ``dirpath`` are recorded in (opened on first use)."""
        folder = os.path.abspath(os.fspath(dirpath))
        checkpoints = self._lists.get(folder)
        if checkpoints is None:
            path = _status_path(folder, self.status_path)  # absolute: both are
            refuse_status_inside(folder, path, "TrainStatusCheckpointIO")
            # One job per status file (the callback takes it before the first step; alone, the
            # plugin before its first write), until teardown.
            _lease.take(path, "TrainStatusCheckpointIO", stopped="Nothing was saved or recorded.")
            store = StatusStore(path)
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
        if _remote.is_remote(os.fspath(path)):  # one upload, seen whole or not at all: recorded once it returned
            return _remote.save(self.checkpoint_io, self._remote, self.status_path, checkpoint, os.fspath(path),
                                storage_options)
        target = local(path, "save")
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
        recorded = checkpoints.add(steps if type(steps) is int else 0, name, reward=score(checkpoint, folder),
                                   synced=True)
        # One entry per file: the older ones naming this file (saved over: last.ckpt) name a
        # checkpoint that is gone, as do those whose file Lightning replaced by a link.
        drop(checkpoints, lambda entry: replaced(checkpoints, entry, name), keep=recorded)

    def remove_checkpoint(self, path: Any) -> None:
        if _remote.is_remote(os.fspath(path)):
            return _remote.remove(self.checkpoint_io, self._remote, self.status_path, os.fspath(path))
        target = local(path, "remove")
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
            _lease.release(checkpoints.store.path)
            checkpoints.store.close()
        for listing in self._remote.values():
            listing.close()
        self._lists.clear()
        self._remote.clear()


class TrainStatusCallback(pl.Callback):
    """A Lightning ``Callback`` for several processes and sharded strategies, beside the plugin.

    ``Trainer(plugins=[TrainStatusCheckpointIO()], callbacks=[..., TrainStatusCallback()])``. At
    ``setup`` (every rank, once the process group exists, before any checkpoint is restored or
    saved) it looks at ``trainer.strategy``:

    - Strategies that save through ``CheckpointIO`` (DDP, one device; FSDP with
      ``state_dict_type="full"``, ``ModelParallelStrategy(save_distributed_checkpoint=False)``):
      global rank 0 saves each ``.ckpt`` through the plugin, which records it; nothing more to do.
    - ``FSDPStrategy(state_dict_type="sharded")`` and ``ModelParallelStrategy()`` (the default
      ``save_distributed_checkpoint=True``) save each checkpoint as a folder (a
      ``torch.distributed.checkpoint`` folder, with Lightning's ``meta.pt``) on every rank without
      calling ``CheckpointIO``: the callback wraps the strategy's ``save_checkpoint`` so that a
      folder about to be saved over is dropped from the list before any rank writes into it, and
      the new folder is recorded (every file with its size, under ``lightning/checkpoints`` like the
      files) only once every rank's save returned and every rank's files are durable
      (``torch.distributed`` collectives; rank 0 writes the status file, once).
    - ``DeepSpeedStrategy`` saves each checkpoint as a folder too (DeepSpeed's engine on every rank:
      each rank's ZeRO shard under ``<name>.ckpt/checkpoint/``, the module's states, ``latest``):
      the same wrapping, the folder recorded once DeepSpeed's save has returned on every rank and
      its files are durable, and only if every rank's shard, the module's states and ``latest`` are
      there. Its ``load_checkpoint`` is wrapped too: a checkpoint recorded as saved by another
      number of ranks is refused before DeepSpeed loads it (``TrainingStatusCheckpointError`` naming
      both numbers and DeepSpeed's universal checkpoint; DeepSpeed would raise partway through the
      load), whatever path Lightning was given and at any stage. A decoupled DeepSpeed checkpoint
      engine (it writes after the save returns) is refused at the first save, and a subclass that
      overrides ``DeepSpeedStrategy.save_checkpoint`` at set-up.
    - A strategy of your own that overrides ``save_checkpoint``
      is refused, unless ``sharded`` says how it saves: ``True`` if every rank saves a
      ``torch.distributed.checkpoint`` folder at the path it is given, ``False`` if it saves one
      file through its ``checkpoint_io``. (Lightning's own strategies are known: ``sharded`` is
      not read for them.)
    - The plugin must be the strategy's ``checkpoint_io`` (it records the files, and drops a
      folder's or file's entry before Lightning removes an old top-k checkpoint).

    Under a process group it also checks that every rank resumes from the same checkpoint: when
    ``last_complete_checkpoint`` ran in each process before ``trainer.fit`` (Lightning's launcher
    and ``torchrun`` start the process group inside ``fit``), the ranks take the decision again
    together here, and if any rank cannot see the chosen checkpoint, or was given another one, every
    rank raises the same ``TrainingStatusCheckpointNotShared``, naming the ranks and hosts, before
    anything is loaded.

    Collectives wait for every rank for the strategy's own ``timeout`` (``DDPStrategy(timeout=...)``,
    30 minutes by default); a rank that does not answer is named in a ``TrainingStatusCollectiveError``.
    """

    def __init__(self, *, sharded: bool | None = None) -> None:
        if sharded is not None and type(sharded) is not bool:
            raise TrainingStatusTypeError(
                f"TrainStatusCallback sharded= must be True, False or None (decide from Lightning's strategy), "
                f"not {type(sharded).__name__!r} ({sharded!r})."
            )
        self.sharded = sharded
        self._undo: list[Any] = []  # what unwraps the strategy's methods
        self._wrapped: Any = None  # the strategy wrapped, while it is
        self._leases: list[str] = []  # the status files whose run lease on_fit_start took

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        plugin = strategy.checkpoint_io
        if not isinstance(plugin, TrainStatusCheckpointIO):
            raise TrainingStatusTypeError(
                f"TrainStatusCallback needs TrainStatusCheckpointIO as the strategy's checkpoint_io, and "
                f"{type(strategy).__name__} has {type(plugin).__name__}: add plugins=[TrainStatusCheckpointIO()] "
                "to the Trainer. Nothing would be recorded without it."
            )
        how = _strategies.how_it_saves(strategy, self.sharded)
        timeout = _strategies.timeout_of(strategy)
        if how in (_strategies.SHARDED, _strategies.DEEPSPEED) and self._wrapped is not strategy:
            self._unwrap()  # a strategy of an earlier fit, whose teardown did not come (a fit that raised)
            undo = [_strategies.record_sharded_saves(strategy, plugin, timeout, how)]
            if how == _strategies.DEEPSPEED:
                undo.append(_strategies.refuse_reshard_at_load(strategy, plugin, timeout))
            self._undo, self._wrapped = undo, strategy
        if stage == "fit":
            # This fit's answer, taken: a later fit without a new call has nothing to check.
            _strategies.agree(_RESUMED.pop("last", None), lambda given, shown: decide(given, timeout, shown)[0],
                              timeout)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After every ModelCheckpoint's setup (Lightning runs theirs last), which resolves a dirpath
        # of None from the logger's save_dir or default_root_dir; before any step.
        how = _strategies.how_it_saves(trainer.strategy, self.sharded)
        refuse_remote(trainer.checkpoint_callbacks, _strategies.remote_refusal(trainer.strategy, how))
        plugin = trainer.strategy.checkpoint_io
        given = plugin.status_path if isinstance(plugin, TrainStatusCheckpointIO) else None
        paths = status_files(trainer.checkpoint_callbacks, given)
        if paths:  # one job per status file: rank 0 takes each's run lease now (till teardown), for every rank
            self._leases = paths  # before: a refusal of the second must give the first back (on_exception)
            # (No lease on an object store: its status file is read once instead, to fail before any step.)
            on_rank_0(lambda: [_remote.reach(path) if "://" in path else _lease.take(path, "TrainStatusCallback")
                               for path in paths],
                      _strategies.timeout_of(trainer.strategy), "taking the run lease of " + ", ".join(paths))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._end()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._end()  # Lightning does not call teardown after an exception

    def _end(self) -> None:
        self._unwrap()
        for path in self._leases:
            _lease.release(path)  # nothing where this process holds none (a rank other than 0)
        self._leases = []

    def _unwrap(self) -> None:
        for undo in self._undo:
            undo()
        self._undo, self._wrapped = [], None


def last_complete_checkpoint(dirpath: str | os.PathLike[str], *, status_path: str | os.PathLike[str] | None = None,
                             timeout: float | None = None) -> str | None:
    """The newest recorded checkpoint in ``dirpath`` that is whole, or None: for ``trainer.fit(ckpt_path=...)``.

    In place of ``ckpt_path="last"``. Reads what ``TrainStatusCheckpointIO`` (same
    ``status_path``) and ``TrainStatusCallback`` recorded for the checkpoints saved in ``dirpath``
    (``ModelCheckpoint``'s ``dirpath``); newest means the highest ``global_step``, then the later
    saved (``last.ckpt`` after the top-k file of the same step). Newer checkpoints passed over are
    named, with the reason, in one ``TrainingStatusCheckpointWarning``; nothing is removed. None
    when nothing was recorded (no status file yet, nor a history to put it back from: a fresh run,
    which ``ckpt_path=None`` starts) or nothing recorded is whole.

    What "whole" means, read from metadata, never from the data (a checkpoint of many GB costs
    the same few KB of reads as a small one):

    - every recorded file is there with its recorded size (a file cut short or grown fails);
    - a ``.ckpt`` file is the one saved (not a link Lightning made in its place) and torch's zip
      archive opens: its central directory reads, ``data.pkl`` and ``version`` are members, and each
      member's local header and data lie inside the file (each member's 30-byte header is read,
      not its data);
    - a sharded checkpoint (a folder, saved by FSDP or ModelParallel) has ``.metadata`` recorded,
      every chunk it names inside a recorded file, and its ``meta.pt`` passes the check above.
    - a DeepSpeed checkpoint (a folder, saved by ``DeepSpeedStrategy``) has ``latest`` recorded,
      naming a tag folder whose recorded files hold every rank's ZeRO shard and the module's
      states, and each of its ``.pt`` files passes the zip check above.

    Not caught: bytes changed inside a member's data with the size kept (a bit flipped on the disk,
    or a program writing into the file, after the save); ``torch.load`` does not check the zip's
    CRCs either and loads such bytes as they are. What the record guards against is a save that did
    not finish: the file was fsynced before it was recorded with its size, so one a kill cut short is
    never listed.

    Under a process group (``torch.distributed`` initialized with two or more ranks) every rank
    calls it: rank 0 reads the status file and the metadata, once; one rank per host checks its host
    sees the chosen checkpoint's files with their recorded sizes, and every rank gets the same path;
    if any host cannot,
    every rank raises the same ``TrainingStatusCheckpointNotShared`` naming the ranks and hosts.
    ``timeout``: seconds those collectives wait for every rank (default 1800, torch's own). Without
    a process group (Lightning starts its own inside ``trainer.fit``) each process reads alone, and
    ``TrainStatusCallback`` checks at set-up that every rank got the same answer.

    Checkpoints in ``dirpath`` that the list has never recorded are named in a
    ``TrainingStatusCheckpointWarning``, with what records them, and not returned: a sharded save
    (a sharded strategy without ``TrainStatusCallback``, which saves past the plugin), a DeepSpeed
    save (the same), and, when the list is empty, ``.ckpt`` files (saved without the plugin). A checkpoint
    given in place of ``dirpath``, or a remote ``dirpath``, raises ``TrainingStatusValueError``.
    """
    folder = resume_folder(dirpath)
    status = None if status_path is None else given_status(os.fspath(status_path))
    if _remote.is_remote(folder):  # the status file's URL is known once fsspec made the filesystem (decide)
        path = status
    else:
        path = _status_path(folder, status)
        refuse_status_inside(folder, path, f"last_complete_checkpoint({os.fspath(dirpath)!r})")
    given = _strategies.Resumed(folder, path, None, _hosts.ranks() is not None)
    name, shown = decide(given, timeout, os.fspath(dirpath))
    _RESUMED["last"] = given._replace(name=name)
    return None if name is None else _remote.join(shown, name) if _remote.is_remote(folder) else os.path.join(shown, name)


_RESUMED: dict[str, _strategies.Resumed] = {}  # this process's last answer, for TrainStatusCallback.setup


# -- helpers ------------------------------------------------------------------------------------


def _remove_stale_temps(folder: str) -> None:
    """Remove the temp files a killed save left in ``folder`` (they never became checkpoints)."""
    remove_stale_temps(folder, _TEMP)

