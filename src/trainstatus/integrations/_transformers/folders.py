"""Transformers' checkpoint folders: whether a recorded ``checkpoint-<step>/`` is whole, and the
newer folders that nothing recorded.

What ``trainstatus.integrations.transformers`` checks before it hands a folder to the Trainer (its
``last_complete_checkpoint``, the resumed best checkpoint, ``resume_from_checkpoint=True``): each
recorded file there with its size (``CheckpointList``'s own check), ``trainer_state.json`` readable
as JSON, each ``.safetensors`` file's header accounting for its length (``_safetensors``), and each
file ``torch.save`` wrote (``.pt``, ``.pth``, ``.bin``: a zip archive) whole by its zip directory
(``_torch_zip``). Metadata only: sizes, headers, directories; never the weights (a file recorded
after its fsync with its size is what was written). Under a process group rank 0 alone runs these.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..._checkpoints.checkpoint_list import CheckpointList
from ..._checkpoints.files import CHECKPOINTS, FILES, _faults
from ..._errors import TrainingStatusCheckpointError, TrainingStatusCheckpointWarning, TrainingStatusValueError, warn
from ..._store import StatusStore
from .._formats import safetensors as _safetensors
from .._formats import torch_zip as _torch_zip
from .._formats.deepspeed_tags import refusal, shards_problem, tags_in
from .._shared.inside import inside

__all__ = ["TRAINER_STATE", "problem", "refuse_reshard", "refuse_status_inside", "unrecorded", "warn_unrecorded",
           "whole"]

TRAINER_STATE = "trainer_state.json"  # the Trainer's TRAINER_STATE_NAME: written last, read on resume

_TORCH_SAVED = (".pt", ".pth", ".bin")  # torch.save's files of a checkpoint: optimizer, scheduler, RNG states, args
_ZIP = b"PK\x03\x04"  # a zip archive's first bytes: torch.save's format since torch 1.6

_FOLDER = re.compile(re.escape(PREFIX_CHECKPOINT_DIR) + r"-([0-9]+)")  # get_last_checkpoint's pattern, whole name


def whole(root: str) -> Callable[[dict[str, Any]], bool]:
    """The check of a recorded folder beyond its files' sizes (which ``CheckpointList`` checks);
    it raises a ValueError naming the file that is not whole."""

    def check(entry: dict[str, Any]) -> bool:
        folder = entry["file_path"]
        files: Mapping[str, Any] = entry[FILES] if isinstance(entry.get(FILES), Mapping) else {}
        state = os.path.join(folder, TRAINER_STATE)
        if state not in files:
            raise ValueError(f"{folder} has no {TRAINER_STATE} recorded: not a Trainer checkpoint")
        with open(os.path.join(root, state), "rb") as f:
            try:
                json.load(f)
            except ValueError as exc:
                raise ValueError(f"{state} is not JSON ({exc})") from None
        for tag, names in sorted(tags_in(folder, files).items()):  # deepspeed=: every rank's ZeRO shard
            why = shards_problem(os.path.join(folder, tag), names)
            if why is not None:
                raise ValueError(why)
        for name in files:
            path = os.path.join(root, name)
            why = (_safetensors.problem(path) if name.endswith(".safetensors")
                   else _torch_zip.problem(path) if name.endswith(_TORCH_SAVED) and _zipped(path) else None)
            if why is not None:
                raise ValueError(f"{name} {why}" if why.startswith("is ") else f"{name}: {why}")
        return True

    return check


def problem(checkpoints: CheckpointList, entry: Mapping[str, Any] | None, folder: str) -> str | None:
    """Why ``folder`` (with its entry, if recorded) is no whole checkpoint, or None."""
    if entry is None:
        return None if os.path.isdir(folder) else "is missing"
    for _, _, why in _faults(entry, checkpoints.root):
        return why
    try:
        whole(checkpoints.resolve(os.curdir))(dict(entry))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:  # a header of the wrong shape too
        return str(exc)
    return None


def unrecorded(root: str, status_path: str, category: str, chosen: int) -> list[str]:
    """The ``checkpoint-*`` folders of ``root`` newer than step ``chosen`` that nothing recorded,
    oldest first."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    folders = {int(m.group(1)): name for name in names if (m := _FOLDER.fullmatch(name))
               and int(m.group(1)) > chosen and os.path.isdir(os.path.join(root, name))}
    if not folders:
        return []
    recorded: set[str] = set()
    if os.path.exists(status_path):
        with StatusStore(status_path) as store:
            entries = store.get(category, CHECKPOINTS) or []
        recorded = {os.path.abspath(os.path.join(root, e["file_path"])) for e in entries
                    if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)}
    return [name for _, name in sorted(folders.items()) if os.path.join(root, name) not in recorded]


def warn_unrecorded(names: list[str], root: str, status_path: str, category: str) -> None:
    """Warn that the folders ``names`` of ``root``, newer than the one returned, were passed over."""
    warn(TrainingStatusCheckpointWarning(
        f"Passed over {', '.join(names)} in {root}: not recorded in {status_path} (a save that did not "
        "finish, or one made without TrainStatusCallback), so not known to be whole; get_last_checkpoint() "
        "would return the newest of them. They are left on disk: a run saves over each when it reaches its step.",
        path=status_path, category=category,
    ))


def _zipped(path: str) -> bool:
    """Does the file begin as a zip archive (``torch.save``'s format since torch 1.6)? A file in
    another format (``torch.save``'s legacy pickle) is left to the size check."""
    with open(path, "rb") as f:
        return f.read(len(_ZIP)) == _ZIP


def output_folder(output_dir: str | os.PathLike[str]) -> str:
    """``output_dir`` as the local folder that holds the ``checkpoint-<step>`` folders, or refused:
    a mistake must not pass for a fresh run (None, the run starting over from step 0, and the
    callback then unlisting the checkpoints it would save over)."""
    given = os.fspath(output_dir)
    if "://" in given:
        raise TrainingStatusValueError(
            f"last_complete_checkpoint({given!r}): the Trainer saves its checkpoints into a local output_dir, "
            "and this is not a local path. Pass the local output_dir of the run (copy a checkpoint folder back "
            "from remote storage into it first). Nothing was read."
        )
    root = os.path.abspath(given)
    named = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-[0-9]+", os.path.basename(root))
    holds_list = os.path.exists(os.path.join(root, "training_status.json"))  # an output_dir of that name
    if named and not holds_list and os.path.isfile(os.path.join(root, "trainer_state.json")):
        raise TrainingStatusValueError(
            f"last_complete_checkpoint({given!r}): {root} is a checkpoint folder itself. Pass the folder above "
            f"it, the run's output_dir, {os.path.dirname(root)}: the answer is the newest whole checkpoint "
            "recorded there. Nothing was read or changed."
        )
    return root


def refuse_status_inside(root: str, status_path: str, action: str) -> None:
    """Refuse a status file inside a ``checkpoint-<step>`` folder of ``root``: the Trainer saves into
    that folder and its rotation removes it, the status file (the whole list) with it. From the
    paths alone: the same on every rank, before any collective."""
    where = inside(status_path, named=lambda name: _FOLDER.fullmatch(name) is not None, under=root)
    if where is not None:
        raise TrainingStatusValueError(
            f"{action}: the status file {status_path} would lie inside the checkpoint folder {where}, which the "
            "Trainer saves into and its rotation removes, the status file with it. Keep it beside the checkpoint "
            "folders (the default: training_status.json in output_dir), or pass status_path= outside every "
            f"{PREFIX_CHECKPOINT_DIR}-<step> folder. Nothing was read or changed.",
            path=status_path,
        )


def refuse_reshard(entry: Mapping[str, Any], shown: str, status_path: str, category: str, world: int) -> None:
    """Refuse, before the Trainer hands it to DeepSpeed, a checkpoint whose DeepSpeed ZeRO folder
    (``global_step<N>/``, saved with ``deepspeed=``) was saved by another number of ranks than
    ``world`` (``deepspeed_tags.refusal``): DeepSpeed raises ``ZeRORuntimeException`` partway through."""
    why = refusal(entry, shown, world)
    if why is not None:
        raise TrainingStatusCheckpointError(f"Cannot resume from {shown}: {why}. Nothing was loaded.",
                                            path=status_path, category=category, file_path=entry["file_path"])


def note_world_size(entry: Mapping[str, Any], shown: str, status_path: str, category: str, world: int) -> None:
    """Warn, once (rank 0), when the checkpoint chosen was saved by another number of ranks than
    ``world``: the Trainer restores each rank's RNG state from its ``rng_state_<rank>.pth``, and
    logs at info level (or not at all) when a rank has none."""
    saved = entry.get("world_size")
    if type(saved) is not int or saved == world:
        return
    if world == 1:
        fate = ("no RNG state is restored (a run of one process reads rng_state.pth, which a run of several "
                "does not write)")
    elif world - saved == 1:
        fate = f"rank {saved} finds no RNG state of its own and starts from a fresh one"
    elif world > saved:
        fate = f"ranks {_span(saved, world)} find no RNG state of theirs and start from fresh ones"
    else:
        fate = f"the RNG state{'s' if saved - world > 1 else ''} of rank{'s' if saved - world > 1 else ''} " \
               f"{_span(world, saved)} {'are' if saved - world > 1 else 'is'} not used"
    warn(TrainingStatusCheckpointWarning(
        f"{shown} was saved by {saved} ranks and this run has {world}: {fate}, so the data order and dropout "
        "differ from a run that was not interrupted (the weights and optimizer state are restored as the Trainer "
        "does). Resume with the same number of ranks to have every rank's RNG state back.",
        path=status_path, category=category,
    ))


def _span(first: int, end: int) -> str:
    return str(first) if end - first == 1 else f"{first}-{end - 1}"
