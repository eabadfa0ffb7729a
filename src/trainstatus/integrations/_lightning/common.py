"""What the Lightning plugin, its callback and its resume share: where the status file is, which
paths are local, the score a checkpoint carries, and the check of a recorded checkpoint (a
``.ckpt`` file, or a sharded strategy's ``.ckpt`` folder) from its metadata alone."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..._checkpoints.files import FILES
from ..._errors import TrainingStatusError, TrainingStatusValueError
from .._formats import dcp_metadata as _dcp_folders
from .._formats import deepspeed_tags as _deepspeed_tags
from .._formats import torch_zip as _torch_zip
from .._shared.folder import Folder, is_remote, refuse_remote_status
from ..._remote.location import check_location, file_url_advice
from .._shared.choice import Words
from .._shared.inside import inside

__all__ = ["CATEGORY", "LIGHTNING_META", "STATUS_FILE", "WORDS", "deepspeed_problem", "local", "refuse_remote", "refuse_status_inside",
           "replaced", "resume_folder", "score", "status_files", "status_path", "whole"]

_COLLAPSED = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/[^/]")  # "s3:/bucket/...": a URL through pathlib.Path

STATUS_FILE = "training_status.json"
"""The status file's name in the checkpoint's folder when no ``status_path`` is given."""

CATEGORY = "lightning"
"""The category of the status file the checkpoints are listed under (``lightning/checkpoints``)."""

LIGHTNING_META = "meta.pt"  # lightning.fabric.utilities.load._METADATA_FILENAME: a sharded save's trainer state

# What last_complete_checkpoint's warnings say a Lightning user does about what they passed over.
WORDS = Words(
    left="They are left on disk: the checkpoints this run saves take their place.",
    fresh="trainer.fit(ckpt_path=None) starts at step 0 and saves its checkpoints beside these.",
    elsewhere="give ModelCheckpoint another dirpath",
)

LATEST = "latest"  # DeepSpeed's file naming the tag; DeepSpeedStrategy.load_checkpoint reads it


def status_path(folder: str, given: str | None) -> str:
    """The status file of the local folder ``folder``: ``given``, or the default beside the checkpoints."""
    refuse_remote_status(given, folder, "checkpoints", "ModelCheckpoint(dirpath='s3://...')")
    return os.path.join(folder, STATUS_FILE) if given is None else given


def refuse_status_inside(folder: str, status_path: str, action: str) -> None:
    """Refuse a status file inside a ``<name>.ckpt`` folder of ``folder`` (a sharded or DeepSpeed
    checkpoint): the strategy saves over that folder in place (``last.ckpt``) and
    ``ModelCheckpoint`` removes old ones, the status file (the whole list) with it. From the paths
    alone: the same on every rank."""
    where = inside(status_path, named=lambda name: name.endswith(".ckpt"), under=folder)
    if where is not None:
        raise TrainingStatusValueError(
            f"{action}: the status file {status_path} would lie inside the checkpoint {where}, which the strategy "
            "saves over and ModelCheckpoint removes, the status file with it. Keep it beside the checkpoints (the "
            "default: training_status.json in ModelCheckpoint's dirpath), or pass status_path= outside every "
            ".ckpt folder. Nothing was read or changed.",
            path=status_path,
        )


def local(path: Any, action: str) -> str:
    given = os.fspath(path)
    if isinstance(given, str) and _COLLAPSED.match(given):
        # pathlib.Path("s3://b/x.ckpt") is s3:/b/x.ckpt: a local path that reads as a folder named "s3:".
        raise TrainingStatusValueError(
            f"TrainStatusCheckpointIO cannot {action} {given!r}: it looks like a URL whose '//' a pathlib.Path "
            "collapsed (the strategy made a Path of ModelCheckpoint's remote dirpath), and would be written on this "
            "machine's disk, never where the dirpath says. Use a strategy that passes the URL as given (one device, "
            "DDP), or a local dirpath. Nothing was saved."
        )
    if not isinstance(given, str) or "://" in given:
        raise TrainingStatusError(
            f"TrainStatusCheckpointIO cannot {action} {given!r}: it makes local files durable (fsync and "
            "rename in their folder), and this is not a local path. Give ModelCheckpoint a local dirpath, "
            "or leave the plugin out for remote storage."
        )
    return os.path.abspath(given)


def score(checkpoint: Mapping[str, Any], folder: str) -> float | None:
    """The score the folder's ``ModelCheckpoint`` monitors, as its saved state holds it, or None."""
    states = checkpoint.get("callbacks")
    if not isinstance(states, Mapping):
        return None
    for state in states.values():
        if not isinstance(state, Mapping) or state.get("dirpath") is None:
            continue
        if _folder(os.fspath(state["dirpath"])) != folder or state.get("current_score") is None:
            continue
        try:
            value = float(state["current_score"])
        except (TypeError, ValueError):
            return None
        return value if math.isfinite(value) or math.isnan(value) else None
    return None


def _folder(dirpath: str) -> str:
    """``dirpath`` as the plugin keys its folders: a URL as given (no trailing slash), a local path
    absolute (a ``file:///`` URL, which Lightning writes to as the local path, as that path)."""
    if is_remote(dirpath):
        return dirpath.rstrip("/")
    return os.path.abspath(dirpath[len("file://"):] if dirpath.startswith("file:///") else dirpath)


def whole(folder: str) -> Callable[[dict[str, Any]], bool]:
    """The check of a recorded checkpoint of ``folder`` beyond its files' recorded sizes (which
    ``CheckpointList`` checks first), from metadata alone; raises a ValueError naming what is wrong.

    - A ``.ckpt`` file: ``_torch_zip.problem`` (the zip's central directory, ``data.pkl`` and
      ``version``, each member's local header inside the file; no member's data is read).
    - A sharded strategy's ``.ckpt`` folder (FSDP, ModelParallel: a DCP folder): ``_dcp_folders``'
      check (``.metadata`` recorded, every chunk it names inside a recorded file), then Lightning's
      ``meta.pt`` as a file above, when it was recorded.
    - ``DeepSpeedStrategy``'s ``.ckpt`` folder: ``_deepspeed_names`` (every rank's shard and the
      module's states recorded, ``latest`` recorded and naming that tag), each ``.pt`` zip directory.
    """
    dcp = _dcp_folders.whole(folder)

    def check(entry: dict[str, Any]) -> bool:
        name = entry["file_path"]
        path = os.path.join(folder, name)
        if os.path.islink(path):
            raise ValueError(f"{name} is now a link Lightning made (save_last='link'), not the file saved")
        files: Mapping[str, Any] = entry[FILES] if isinstance(entry.get(FILES), Mapping) else {}
        tags = _deepspeed_tags.tags_in(name, files)
        if tags:
            why = _deepspeed_names(name, tags, LATEST in (f[len(name) + 1:] for f in files), path)
            if why is not None:
                raise ValueError(why)
            for inside in sorted(f for f in files if f.endswith(".pt")):
                why = _torch_zip.problem(os.path.join(folder, inside))
                if why is not None:
                    raise ValueError(f"{inside} is not a whole torch file: {why}")
            return True
        if os.path.join(name, _dcp_folders.METADATA) in files:  # a folder: the zip files in it are checked below
            dcp(entry)
            if os.path.join(name, LIGHTNING_META) not in files:
                return True
            name, path = os.path.join(name, LIGHTNING_META), os.path.join(path, LIGHTNING_META)
        elif os.path.isdir(path):
            raise ValueError(f"{name} is a folder recorded without {_dcp_folders.METADATA}: not a sharded save "
                             "that finished")
        why = _torch_zip.problem(path)
        if why is not None:
            raise ValueError(f"{name} is not a whole torch checkpoint: {why}")
        return True

    return check


def deepspeed_problem(target: str) -> str | None:
    """Why the folder ``target`` that ``DeepSpeedStrategy`` just saved into (every rank's save has
    returned) is not a whole DeepSpeed checkpoint, by its file names, or None."""
    try:
        tags = {tag: os.listdir(os.path.join(target, tag)) for tag in os.listdir(target)
                if os.path.isdir(os.path.join(target, tag))}
    except OSError as exc:
        return f"its folder {target} cannot be listed ({exc.strerror or exc})"
    tags = {tag: names for tag, names in tags.items()
            if any(n.endswith(_deepspeed_tags.MODEL_STATES) for n in names)}
    if not tags:
        return f"{target} holds no DeepSpeed tag folder (no *{_deepspeed_tags.MODEL_STATES} in a folder inside it)"
    return _deepspeed_names(os.path.basename(target), tags, os.path.isfile(os.path.join(target, LATEST)), target)


def _deepspeed_names(name: str, tags: Mapping[str, list[str]], has_latest: bool, path: str) -> str | None:
    """Why the DeepSpeed checkpoint folder ``name`` (at ``path``), whose tag folders hold ``tags``
    (base names), cannot be loaded by ``DeepSpeedStrategy.load_checkpoint``, or None: the tag
    ``latest`` names must hold every rank's shard and the module's states."""
    if not has_latest:
        return f"{name} has no {LATEST} file (DeepSpeedStrategy's load reads the tag from it)"
    try:
        with open(os.path.join(path, LATEST), encoding="utf-8", errors="replace") as f:
            tag = f.read(256).strip()
    except OSError as exc:
        return f"{name}/{LATEST} cannot be read ({exc.strerror or exc})"
    if tag not in tags:
        return (f"{name}/{LATEST} names {tag!r}, which is not a DeepSpeed tag folder in it "
                f"({', '.join(sorted(tags))} {'is' if len(tags) == 1 else 'are'})")
    return _deepspeed_tags.shards_problem(os.path.join(name, tag), tags[tag])


def resume_folder(dirpath: str | os.PathLike[str]) -> str:
    """``dirpath`` as a local folder of checkpoints, or refused: a mistake must not pass for a fresh
    run (None, and the run starting over from step 0)."""
    given = os.fspath(dirpath)
    if is_remote(given):  # ModelCheckpoint's dirpath on an object store: remote.refuse_checkpoint_given checks it
        return given.rstrip("/")
    if given.startswith("file://") and not given.startswith("file:///"):
        raise TrainingStatusValueError(f"last_complete_checkpoint({given!r}): {file_url_advice(given)}")
    folder = _folder(given)
    sharded = os.path.isdir(folder) and any(os.path.exists(os.path.join(folder, name))
                                            for name in ("meta.pt", ".metadata"))  # a sharded strategy's .ckpt
    holds_list = os.path.exists(os.path.join(folder, "training_status.json"))  # a dirpath of that name
    if folder.endswith(".ckpt") and (os.path.isfile(folder) or sharded or _deepspeed(folder)) and not holds_list:
        raise TrainingStatusValueError(
            f"last_complete_checkpoint({given!r}): {folder} is a checkpoint itself. Pass the folder that holds "
            f"the checkpoints (ModelCheckpoint's dirpath), {os.path.dirname(folder)}: the answer is the newest "
            "whole checkpoint recorded there. Nothing was read or changed."
        )
    return folder


def refuse_remote(callbacks: list[Any], why: str | None) -> None:
    """Refuse, at the start of fit, before any step, a ``ModelCheckpoint`` whose folder (its
    dirpath, resolved by then from the logger's save_dir or default_root_dir when not given) is on
    remote storage (``s3://``, as Lightning allows through fsspec) when the strategy cannot have it
    recorded there (``why``, from ``strategies.remote_refusal``; None: it can). One file saved through
    ``CheckpointIO`` with the URL as given is recorded there (``_lightning.remote``)."""
    places = [str(callback.dirpath) for callback in callbacks if getattr(callback, "dirpath", None) is not None]
    remote = [place for place in places if is_remote(place)]
    if remote and why is not None:
        raise TrainingStatusValueError(
            f"TrainStatusCallback: the checkpoints would go to {remote[0]}, remote storage, and {why}, so nothing "
            "could be recorded there. Give ModelCheckpoint a local or shared dirpath (and copy the checkpoints out "
            "after the run), or use a strategy that saves one file through CheckpointIO with the path as given "
            "(one device, DDP), which trainstatus records on remote storage. Nothing was trained."
        )


def replaced(checkpoints: Any, entry: Mapping[str, Any], saved: str) -> bool:
    """Whether ``entry`` names a file that no longer holds its checkpoint: the file just saved
    again under the same name (``last.ckpt``), or a link Lightning put in the place of the file."""
    path = checkpoints.resolve(entry["file_path"])
    return path == checkpoints.resolve(saved) or os.path.islink(path)


def status_files(callbacks: list[Any], given: str | None) -> list[str]:
    """The status file of each ``ModelCheckpoint``'s folder (``given``: the plugin's status_path),
    at the start of fit; one given inside a folder's checkpoint is refused (every rank alike)."""
    folders = [_folder(os.fspath(c.dirpath)) for c in callbacks if getattr(c, "dirpath", None) is not None]
    for folder in folders:
        if given is not None:
            refuse_status_inside(folder, given, "TrainStatusCallback")
    return sorted({_remote_status(folder, given) if is_remote(folder) else status_path(folder, given)
                   for folder in folders})


def _remote_status(folder: str, given: str | None) -> str:
    """The status file of the folder ``folder`` on an object store; refused now, before the first
    step, when fsspec cannot reach it or trainstatus keeps no status file on that store."""
    path = Folder.of_url(folder).status_path(given, STATUS_FILE, "ModelCheckpoint's dirpath")
    check_location(path)  # a scheme trainstatus keeps no status file on (s3a://, memory://): refused now
    return path


def unrecorded(folder: str, status_path: str, entries: list[Any]) -> str | None:
    """What to say of the checkpoints in ``folder`` that ``status_path`` never recorded, or None:
    each shape a Lightning strategy saves, and what records it.

    - sharded saves (``torch.distributed.checkpoint`` folders: FSDP sharded, ModelParallel), when
      the list has never recorded one (one not listed beside recorded ones is a save a kill cut
      short, or one saved over);
    - DeepSpeed's (a folder holding ``latest`` or a ``checkpoint/`` of ``*_model_states.pt``),
      when the list has never recorded one: ``DeepSpeedStrategy`` saves past the plugin, and
      ``TrainStatusCallback`` records them;
    - ``.ckpt`` files, when the list records nothing: saved without ``TrainStatusCheckpointIO`` as
      the strategy's ``checkpoint_io`` (or a first save a kill cut short before its record).
    """
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    listed = [e for e in entries if isinstance(e, Mapping) and isinstance(e.get(FILES), Mapping)]
    said: list[str] = []

    def these(found: list[str], one: str, many: str) -> str:
        return (f"{', '.join(found[:5])}{f' and {len(found) - 5} more' if len(found) > 5 else ''} in {folder} "
                f"{one if len(found) == 1 else many}")

    def them(found: list[str]) -> str:
        return "it" if len(found) == 1 else "them"

    sharded = [name for name in names if os.path.isfile(os.path.join(folder, name, _dcp_folders.METADATA))]
    if sharded and not any(str(f).endswith(os.sep + _dcp_folders.METADATA) for e in listed for f in e[FILES]):
        said.append(
            f"{these(sharded, 'is a sharded checkpoint', 'are sharded checkpoints')} (torch.distributed.checkpoint "
            "folders, saved by FSDPStrategy(state_dict_type='sharded') or ModelParallelStrategy) that "
            f"{status_path} has never recorded: a sharded strategy saves past TrainStatusCheckpointIO, so nothing "
            f"records {them(sharded)}, and last_complete_checkpoint() does not return {them(sharded)}. Add "
            "TrainStatusCallback() to the Trainer's callbacks beside the plugin: it records sharded saves.")
    deepspeed = [name for name in names if _deepspeed(os.path.join(folder, name))]
    if deepspeed and not any(str(f).endswith(_deepspeed_tags.MODEL_STATES) for e in listed for f in e[FILES]):
        said.append(
            f"{these(deepspeed, 'is a DeepSpeed checkpoint', 'are DeepSpeed checkpoints')} (saved by "
            f"DeepSpeedStrategy, past TrainStatusCheckpointIO) that {status_path} has never recorded, so "
            f"last_complete_checkpoint() does not return {them(deepspeed)}. Add TrainStatusCallback() to the "
            "Trainer's callbacks beside the plugin: it records DeepSpeedStrategy's saves.")
    files = [name for name in names if name.endswith(".ckpt") and os.path.isfile(os.path.join(folder, name))]
    if files and not listed:
        said.append(
            f"{these(files, 'is a checkpoint', 'are checkpoints')} that {status_path} has never recorded (saved "
            "without TrainStatusCheckpointIO as the strategy's checkpoint_io, or under another status_path, or a "
            f"first save cut short before its record), so last_complete_checkpoint() does not return {them(files)}. "
            "Give the Trainer plugins=[TrainStatusCheckpointIO()], and pass last_complete_checkpoint the same "
            "status_path.")
    return " ".join(said) or None


def _deepspeed(path: str) -> bool:
    """A DeepSpeed checkpoint folder: a tag folder of ``*_model_states.pt`` files, the one its
    ``latest`` file names or Lightning's own ``checkpoint/`` (a folder that only holds a file named
    ``latest`` is not one)."""
    if not os.path.isdir(path):
        return False
    try:
        with open(os.path.join(path, "latest"), encoding="utf-8", errors="replace") as f:
            tags = [f.read(256).strip(), "checkpoint"]  # the tag latest names, and Lightning's own
    except OSError:
        tags = ["checkpoint"]
    for tag in tags:
        try:
            if tag and any(name.endswith("_model_states.pt") for name in os.listdir(os.path.join(path, tag))):
                return True
        except (OSError, ValueError):
            continue
    return False
