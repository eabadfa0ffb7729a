"""Accelerate's checkpoint folders: whether a recorded one is whole, which newer ones nothing
recorded, and the old ones a rotation interrupted by a kill left behind.

What ``trainstatus.integrations.accelerate`` checks before it hands a folder to
``accelerator.load_state`` (``whole``), beyond ``CheckpointList``'s own check (each recorded file
there with its recorded size):

- every process's ``random_states_<i>.pkl`` was recorded, for the number of processes recorded
  with the checkpoint (its ``world_size``; one when there is none: a record without a process
  group); Accelerate itself loads a folder without one in silence: that process's RNG is simply
  not restored;
- each ``.safetensors`` file's header accounts for its length (``_safetensors``);
- each file ``torch.save`` wrote (``.bin``, ``.pkl``, ``.pt``, ``.pth``: a zip archive) has its
  central directory and its members' headers where it says (``_torch_zip``);
- each ``.metadata`` of a ``torch.distributed.checkpoint`` folder inside it (FSDP's sharded state)
  names only bytes inside the recorded files (``_dcp_folders``).

Metadata only: sizes, headers, directories; never the weights. Under a process group rank 0 alone
runs these checks.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from ..._checkpoints.files import CHECKPOINTS, FILES
from .._formats import safetensors as _safetensors
from .._formats import torch_zip as _torch_zip
from .._formats.deepspeed_tags import shards_problem, tags_in

__all__ = ["CHECKPOINTS_DIR", "number", "random_states", "sweep", "unrecorded", "whole"]

CHECKPOINTS_DIR = "checkpoints"  # Accelerate's folder of checkpoint_<n> in project_dir (automatic naming)

_FOLDER = re.compile(r"checkpoint_([0-9]+)")  # Accelerate's automatic name, whole
_TORCH_SAVED = (".bin", ".pkl", ".pt", ".pth")
_ZIP = b"PK\x03\x04"  # torch.save's format since torch 1.6
_METADATA = ".metadata"  # torch.distributed.checkpoint's plan, written last
WORLD_SIZE = "world_size"  # the entry's field _ranks.saving.entry_fields() writes


def random_states(process: int) -> str:
    """The file each process writes into a checkpoint (accelerate.utils.RNG_STATE_NAME)."""
    return f"random_states_{process}.pkl"


def number(name: str) -> int | None:
    """``n`` of a folder named ``checkpoint_<n>``, else None."""
    match = _FOLDER.fullmatch(name)
    return None if match is None else int(match.group(1))


def whole(root: str) -> Callable[[dict[str, Any]], bool]:
    """The check of a recorded folder (paths under ``root``) beyond its files' sizes. Raises a
    ValueError naming what is wrong."""

    def check(entry: dict[str, Any]) -> bool:
        folder = entry["file_path"]
        files: Mapping[str, Any] = entry[FILES] if isinstance(entry.get(FILES), Mapping) else {}
        # The number of processes that wrote it: recorded under a process group, else one.
        world = entry.get(WORLD_SIZE, 1)
        if type(world) is not int or world < 1:
            raise ValueError(f"{folder} has {WORLD_SIZE} {world!r} recorded, not a number of processes, so whether "
                             f"every process's {random_states(0)} is there cannot be told")
        absent = [random_states(i) for i in range(world) if os.path.join(folder, random_states(i)) not in files]
        if absent:
            raise ValueError(f"{folder} was saved by {world} process{'es' if world > 1 else ''}, but {_listed(absent)} "
                             f"{'was' if len(absent) == 1 else 'were'} not recorded with it")
        for tag, names in sorted(tags_in(folder, files).items()):  # a DeepSpeedPlugin's: every rank's ZeRO shard
            why = shards_problem(os.path.join(folder, tag), names)
            if why is not None:
                raise ValueError(why)
        for name in files:
            path = os.path.join(root, name)
            why = None
            if name.endswith(".safetensors"):
                why = _safetensors.problem(path)
            elif name.endswith(_TORCH_SAVED):
                why = _zip_problem(path)
            elif os.path.basename(name) == _METADATA:
                why = _dcp_problem(root, name, files)
            if why is not None:
                raise ValueError(f"{name}: {why}")
        return True

    return check


def _zip_problem(path: str) -> str | None:
    with open(path, "rb") as f:
        if f.read(len(_ZIP)) != _ZIP:
            return None  # another format (a legacy pickle): left to the size check
    return _torch_zip.problem(path)


def _dcp_problem(root: str, name: str, files: Mapping[str, Any]) -> str | None:
    from .._formats.dcp_metadata import chunks  # torch.distributed.checkpoint: only for a sharded save

    folder = os.path.dirname(name)
    try:
        found = chunks(os.path.join(root, folder))
    except ValueError as exc:
        return str(exc)
    for shard, offset, length in found:
        recorded = files.get(os.path.join(folder, shard))
        if type(recorded) is not int:
            return f"names {shard}, which was not recorded with the folder"
        if offset + length > recorded:
            return f"names bytes {offset:,}-{offset + length:,} of {shard}, which has {recorded:,} bytes recorded"
    return None


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def unrecorded(root: str, entries: list[Any], chosen: int) -> list[str]:
    """The ``checkpoints/checkpoint_<n>`` folders of ``root`` with ``n`` above ``chosen`` that no
    entry lists, oldest first (as ``checkpoints/checkpoint_<n>``)."""
    listed = _listed_folders(root, entries)
    found = sorted((n, name) for name, n in _numbered(root) if n > chosen)
    return [os.path.join(CHECKPOINTS_DIR, name) for n, name in found
            if os.path.join(root, CHECKPOINTS_DIR, name) not in listed]


def sweep(root: str, document: Mapping[str, Any], category: str, below: int) -> None:
    """Remove the ``checkpoint_<n>`` folders with ``n`` below ``below`` that ``document`` no longer
    lists: those a rotation dropped from the list and a kill stopped it from removing (the list
    was written first). Accelerate's ``total_limit`` counts every folder; so does this."""
    keys = document.get(category)
    entries = keys.get(CHECKPOINTS) if isinstance(keys, Mapping) else None
    listed = _listed_folders(root, entries if isinstance(entries, list) else [])
    for name, n in _numbered(root):
        path = os.path.join(root, CHECKPOINTS_DIR, name)
        if n < below and path not in listed:
            shutil.rmtree(path, ignore_errors=True)  # what is left is swept at the next save


def _numbered(root: str) -> list[tuple[str, int]]:
    folder = os.path.join(root, CHECKPOINTS_DIR)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        n = number(name)
        if n is not None and os.path.isdir(os.path.join(folder, name)):
            found.append((name, n))
    return found


def _listed_folders(root: str, entries: list[Any]) -> set[str]:
    return {os.path.normpath(os.path.join(root, e["file_path"])) for e in entries
            if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)}
