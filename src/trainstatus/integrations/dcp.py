"""``torch.distributed.checkpoint`` (DCP): a save recorded once every rank's shards are durable, and
one resume decision for every rank.

DCP saves a folder (each rank's ``.distcp`` files, then ``.metadata`` by the coordinator) and
``dcp.load`` reads whatever folder it is given; which folder is the newest complete one is the
training loop's business, and a loop that takes the highest step number resumes from a save a kill
cut short. Here:

- ``record(checkpoint_dir, step)``: every rank calls it after ``dcp.save`` returned (or its
  ``dcp.async_save`` future completed). The ranks wait for each other (``torch.distributed``'s own
  collectives, on a gloo group); one rank per host fsyncs what its host sees of the folder; rank 0
  checks it sees every host's files with the same sizes and records the folder (every file with its size,
  ``.metadata`` included) in the status file, once; every rank returns when that record is on disk.
- ``last_complete_checkpoint(directory)``: rank 0 picks the newest recorded folder whose files are
  all there with their recorded sizes and whose ``.metadata`` names only bytes inside them (no
  tensor is read); one rank per host checks its host sees that folder, and every rank gets the same
  answer.

Usage (two lines beside DCP's own)::

    import torch.distributed.checkpoint as dcp
    from trainstatus.integrations.dcp import last_complete_checkpoint, record

    resume = last_complete_checkpoint("ckpt")          # every rank: the same folder, or None
    if resume is not None:
        dcp.load(state_dict, checkpoint_id=resume)
    ...
    folder = f"ckpt/step-{step}"
    dcp.save(state_dict, checkpoint_id=folder)
    record(folder, step, keep=3)                       # every rank

A folder saved over in place (``ckpt/latest`` every step) is saved with ``save(state_dict, folder,
step)`` instead of ``dcp.save`` and ``record``: it is unlisted before DCP writes into it, so a kill
in the middle never leaves a torn folder listed. ``record`` of a folder listed under another step
(saved over in place while listed) records it once, complete, and warns, pointing at ``save``.

Without an initialized process group (one process) all three work the same, without the collectives.
``torch`` is imported only to read ``.metadata`` (``last_complete_checkpoint``).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

from .._checkpoints.checkpoint_list import CheckpointList
from .._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    warn,
)
from .._remote.location import file_url_advice
from .._store import StatusStore
from ._ranks.resuming import decide, entry_files
from ._ranks.saving import entry_fields
from ._ranks.saving import record as _record
from ._shared import lease as _lease
from ._shared.choice import choose_unlisting, later, recorded
from ._dcp import remote as _remote
from ._shared.folder import given_status, refuse_remote_status
from ._dcp.places import (refuse_checkpoint_folder, refuse_status_inside, unrecorded, warn_alone, warn_passed_over,
                          warn_saved_over, warn_unrecorded)
from ._ranks.hosts import ranks
from ._formats.dcp_metadata import METADATA, reader, whole
from ._shared.upkeep import drop

__all__ = ["CATEGORY", "STATUS_FILE", "last_complete_checkpoint", "record", "save"]

STATUS_FILE = "training_status.json"
"""The status file's name in the folder that holds the checkpoint folders, unless ``status_path`` says otherwise."""

CATEGORY = "dcp"
"""The category of the status file the checkpoints are listed under (``dcp/checkpoints``)."""

PathLike = str | os.PathLike[str]


def record(checkpoint_dir: PathLike, step: int, *, status_path: PathLike | None = None, keep: int | None = None,
           reward: float | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Record the DCP folder ``checkpoint_dir`` at ``step`` once every rank's files are durable.

    Every rank calls it, with the same arguments, after ``dcp.save(state_dict,
    checkpoint_id=checkpoint_dir)`` returned, or after the future of ``dcp.async_save`` completed
    (never before: the record names the files with the sizes they have then). The status file is
    ``training_status.json`` beside ``checkpoint_dir`` (in its parent folder) unless
    ``status_path`` names another; the folder is recorded under ``dcp/checkpoints`` relative to
    that parent folder, with every file in it and its size, ``.metadata`` included.

    - Once every rank's save returned, one rank per host fsyncs each file its host sees in the
      folder, the folder and the folders above it up to the status file's; rank 0 records only
      after every host did, and only if it sees every file each host sees, with the same size
      (``TrainingStatusCheckpointNotShared`` on every rank if not: node-local folders). Every rank returns the entry recorded, once it is on disk.
    - Entries of steps after ``step`` are dropped from the list first (a run that went back to an
      older checkpoint saves over those folders; their files stay on disk).
    - ``keep=N``: after the record is on disk, the oldest entries beyond N are dropped from the list
      in one write and only then their folders removed; a folder never recorded (a save in
      progress, or one a kill cut short) is never removed. ``None`` keeps every folder.
    - ``reward``: a score to keep with the entry (a validation loss), or None.
    - ``timeout``: seconds every collective waits for every rank (default 1800, torch's own);
      a rank that does not answer in time is named in a ``TrainingStatusCollectiveError``.
    """
    folder = _folder(checkpoint_dir, "record")
    _check_step(step, checkpoint_dir, "record")
    if _remote.is_remote(folder):  # on an object store (_dcp/remote.py): no fsync, no host apart
        _check_keep(keep, folder)
        return _remote.record(folder, int(step), _given(status_path), keep, reward, timeout)
    root, name = os.path.split(folder)
    path = _status_path(root, status_path)
    refuse_status_inside(path, folder, f"record {folder}", look=False)
    warn_alone(f"record({os.fspath(checkpoint_dir)!r}, {step})", path, ranks() is not None)

    def write(synced: bool) -> dict[str, Any]:
        # Rank 0's checks: their error reaches every rank (another rank may see another filesystem,
        # and a rank raising alone leaves the others in the collective).
        refuse_status_inside(path, folder, f"record {folder}")
        _lease.take(path, "trainstatus.integrations.dcp.record",  # one job per status file (lease.py)
                    stopped=f"Nothing was recorded; {folder} is left as dcp.save wrote it.")
        if not os.path.isfile(os.path.join(folder, METADATA)):
            raise TrainingStatusCheckpointError(
                f"Cannot record {folder}: it has no {METADATA}, which torch.distributed.checkpoint writes last. "
                "Call record() after dcp.save() returned on every rank (or after dcp.async_save()'s future "
                "completed), with the folder given to it as checkpoint_id. Nothing was recorded.",
                path=path, category=CATEGORY, file_path=name,
            )
        store = StatusStore(path)
        try:
            over = [e for e in _listed_as(store, folder) if e.get("steps") != step]
            if over:  # complete now (every rank's dcp.save returned): recorded; the window behind it is said
                warn_saved_over(folder, over[0].get("steps"), step, path)
            checkpoints = CheckpointList(store, CATEGORY, keep=keep, root=root)
            # The entries of steps after this one, and those naming this folder under another step
            # (its files are this step's now), leave the list; no file is removed.
            drop(checkpoints, lambda entry: later(entry, int(step)) or (bool(over) and entry in over))
            return checkpoints._add(int(step), name, reward=reward, synced=synced, fields=entry_fields())
        finally:
            store.close()

    return _record(folder, path, write, what=f"{folder} (step {step})", timeout=timeout)


def save(state_dict: Any, checkpoint_dir: PathLike, step: int, *, status_path: PathLike | None = None,
         keep: int | None = None, reward: float | None = None, timeout: float | None = None,
         **save_options: Any) -> dict[str, Any]:
    """``torch.distributed.checkpoint.save(state_dict, checkpoint_id=checkpoint_dir, **save_options)``,
    then ``record(checkpoint_dir, step, ...)``: every rank calls it, with the same arguments.

    Saving into a folder that is listed (``ckpt/latest`` every step, or a step folder saved again
    after a resume) would leave it listed while DCP writes over it, shard by shard: a kill in the
    middle leaves a folder mixing two steps' shards of the same sizes, which the size check passes
    and a resume loads. So the folder is first unlisted, in one durable write by rank 0, and no
    rank begins to save before that write is on disk; it is listed again once the save returned
    on every rank and every file is durable. A kill in between leaves it unlisted:
    ``last_complete_checkpoint`` returns the newest other recorded folder, or None with a warning
    that names it. Returns the entry recorded; ``keep``, ``reward``, ``timeout`` and
    ``status_path`` are ``record``'s.
    """
    folder = _folder(checkpoint_dir, "save into")
    _check_step(step, checkpoint_dir, "save")
    if _remote.is_remote(folder):
        _check_keep(keep, folder)
        _remote.unlist(folder, _given(status_path), timeout)
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        dcp_save(state_dict, checkpoint_id=folder, **save_options)
        return _remote.record(folder, int(step), _given(status_path), keep, reward, timeout)
    root = os.path.dirname(folder)
    path = _status_path(root, status_path)
    refuse_status_inside(path, folder, f"save into {folder}", look=False)

    def unlist() -> None:
        refuse_status_inside(path, folder, f"save into {folder}")  # rank 0's: its error reaches every rank
        _lease.take(path, "trainstatus.integrations.dcp.save")  # one job per status file (lease.py)
        if not recorded(path):
            return  # nothing is listed: nothing to drop
        store = StatusStore(path)
        try:
            if _listed_as(store, folder):
                drop(CheckpointList(store, CATEGORY, keep=None), lambda entry: _names(store, entry, folder))
        finally:
            store.close()

    decide(unlist, lambda _: {}, root, what=f"the entry of {folder} to drop before it is saved over",
           timeout=timeout)
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    dcp_save(state_dict, checkpoint_id=folder, **save_options)
    return record(checkpoint_dir, step, status_path=status_path, keep=keep, reward=reward, timeout=timeout)


def last_complete_checkpoint(directory: PathLike, *, status_path: PathLike | None = None,
                             timeout: float | None = None) -> str | None:
    """The newest recorded DCP folder of ``directory`` that is whole, or None: for ``dcp.load``.

    ``directory`` holds the checkpoint folders and, unless ``status_path`` says otherwise, the
    status file ``training_status.json`` (what ``record`` writes by default). Newest is the highest
    step. A folder counts when every file recorded in it is there with its recorded size, and
    ``.metadata`` was recorded and names only bytes inside the recorded files (no tensor is read).
    Newer recorded folders passed over are named, with the reason, in one
    ``TrainingStatusCheckpointWarning``, and dropped from the list: this run saves over them as it
    reaches their steps, and a folder half saved over must never be found listed (same-size shards
    would pass the size check). Their files stay on disk.

    Under a process group every rank calls it: rank 0 reads the status file and the metadata, once;
    one rank per host checks its host sees the chosen folder with every recorded size, and every
    rank gets the same path;
    if any rank cannot see it, every rank raises the same ``TrainingStatusCheckpointNotShared``
    naming the ranks and hosts. None when nothing is recorded (a fresh run) or nothing recorded is whole.
    """
    root = _folder(directory, "read")
    if _remote.is_remote(root):
        reader(root)  # without torch, raise rather than find every folder unreadable
        return _remote.last_complete(root, _given(status_path), timeout, _note_world_size)
    path = _status_path(root, status_path)
    shown = os.fspath(directory)
    warn_alone(f"last_complete_checkpoint({shown!r})", path, ranks() is not None)

    def pick() -> dict[str, Any] | None:
        # Rank 0's checks: their error reaches every rank (another rank may see another filesystem).
        refuse_checkpoint_folder(root, shown, path)
        refuse_status_inside(path, None, f"read {path}")
        if not recorded(path):
            warn_unrecorded(unrecorded(root, set()), root, path, None)
            return None
        reader(root)  # before the store: without torch, raise rather than find every folder unreadable
        store = StatusStore(path, resume=True)
        try:
            checkpoints = CheckpointList(store, CATEGORY, keep=None, root=root)
            entry, skipped, refused = choose_unlisting(checkpoints, whole(root))
            if skipped:
                warn_passed_over(entry, skipped, path, root, shown, refused)
            if entry is not None:
                _note_world_size(entry, os.path.join(shown, entry["file_path"]), path)
            if entry is None:  # never a bare None while checkpoint folders lie there: name them
                listed = {e["file_path"] for e in checkpoints.entries()
                          if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)}
                warn_unrecorded(unrecorded(root, listed), root, path, None)
            return entry
        finally:
            store.close()

    entry = decide(pick, entry_files, root, what=f"the newest complete checkpoint of {shown}", timeout=timeout)
    return None if entry is None else os.path.join(shown, entry["file_path"])


def _listed_as(store: StatusStore, folder: str) -> list[dict[str, Any]]:
    """The entries of ``store`` that name ``folder`` (resolved as the list resolves them, under the
    root it records: another folder of the same name elsewhere is not it)."""
    return [entry for entry in CheckpointList(store, CATEGORY, keep=None).entries() if _names(store, entry, folder)]


def _names(store: StatusStore, entry: Any, folder: str) -> bool:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("file_path"), str):
        return False
    found = CheckpointList(store, CATEGORY, keep=None).resolve(entry["file_path"])
    return os.path.realpath(found) == os.path.realpath(folder)


def _note_world_size(entry: Mapping[str, Any], shown: str, path: str) -> None:
    """Say, once (rank 0), that the checkpoint chosen was saved by another number of ranks: DCP
    reshards what it knows to be sharded, not what a loop saved per rank under one key."""
    saved, me = entry.get("world_size"), ranks()
    now = 1 if me is None else me.world_size
    if type(saved) is int and saved != now:
        warn(TrainingStatusCheckpointWarning(
            f"{shown} was saved by {saved} ranks and this run has {now}: torch.distributed.checkpoint reshards "
            "the state as dcp.load reads it (sharded tensors, DTensors, FSDP's state dicts); a tensor a loop saved "
            "per rank under one key is not resharded (each rank loads the one saved under its key, or none). "
            "Resume with the same number of ranks to have every rank's own state back.",
            path=path, category=CATEGORY,
        ))


def _check_step(step: Any, given: PathLike, action: str) -> None:
    integer = type(step) is not bool and isinstance(step, numbers.Integral)
    if not integer or step < 0:
        raise (TrainingStatusValueError if integer else TrainingStatusTypeError)(
            f"{action}({os.fspath(given)!r}, step=...) needs the training step as an int >= 0, not {step!r}."
        )



def _folder(given: Any, action: str) -> str:
    if not isinstance(given, (str, os.PathLike)):
        raise TrainingStatusTypeError(
            f"trainstatus.integrations.dcp cannot {action} {given!r}: give the checkpoint folder as a path (str or "
            "os.PathLike) or an fsspec URL (s3://...), the one passed to dcp.save(checkpoint_id=...)."
        )
    text = os.fspath(given)
    if text.startswith("file://"):  # the local path it names (dcp.save writes there); another host's is refused
        if not text.startswith("file:///"):
            raise TrainingStatusValueError(f"trainstatus.integrations.dcp cannot {action} {text!r}: "
                                           f"{file_url_advice(text)}")
        text = text[len("file://"):]
    return text.rstrip("/") if _remote.is_remote(text) else os.path.abspath(text)


def _check_keep(keep: Any, folder: str) -> None:
    """``keep`` as ``CheckpointList`` takes it (a local folder's list checks it there), before any collective."""
    if keep is not None and (type(keep) is not int or keep < 1):
        raise (TrainingStatusValueError if type(keep) is int else TrainingStatusTypeError)(
            f"keep= must be a number of checkpoint folders >= 1, or None to keep every one, not {keep!r}, for "
            f"{folder}.", path=folder)


def _given(status_path: PathLike | None) -> str | None:
    return None if status_path is None else given_status(os.fspath(status_path))


def _status_path(root: str, status_path: PathLike | None) -> str:
    refuse_remote_status(None if status_path is None else os.fspath(status_path), root, "checkpoint folders",
                         "checkpoint_id='s3://...'")
    return os.path.join(root, STATUS_FILE) if status_path is None else os.path.abspath(os.fspath(status_path))

