"""Where a DeepSpeed run's tag folders and status file are, and what to say when a path or a tag
given is not the right one: a tag folder where ``save_dir`` is expected, a status file inside a tag
folder, a tag that is not one folder's name, tag folders nothing recorded.

A mistake must never pass for a fresh run (``load_checkpoint`` returning ``(None, None)`` and the
run starting over from step 0) nor unlist anything: each is refused before anything is read or
written, or said in a warning that names the folders.
"""

from __future__ import annotations

import os
from typing import Any

from ..._errors import TrainingStatusCheckpointWarning, TrainingStatusTypeError, TrainingStatusValueError, warn
from .._formats.deepspeed_tags import MODEL_STATES, is_tag
from .._shared.inside import inside

__all__ = ["CATEGORY", "STATUS_FILE", "check_tag", "refuse_status_inside", "refuse_tag_folder", "save_root",
           "unrecorded", "warn_unrecorded"]

STATUS_FILE = "training_status.json"
CATEGORY = "deepspeed"
# Names DeepSpeed or trainstatus give files beside the tags: a tag of one of these names would
# be a folder in their place.
_NOT_TAGS = {"latest", "latest_universal", "zero_to_fp32.py", "zero_to_torch.py", STATUS_FILE}


def save_root(given: Any, action: str) -> str:
    """``given`` (``save_dir``/``load_dir``) as an absolute local path, or refused."""
    if not isinstance(given, (str, os.PathLike)) or "://" in os.fspath(given) or not os.fspath(given):
        raise TrainingStatusTypeError(
            f"trainstatus.integrations.deepspeed cannot {action} {given!r}: give the folder that holds the tag "
            "folders as a local path (str or os.PathLike), the save_dir given to engine.save_checkpoint. DeepSpeed's "
            "torch checkpoint engine writes only to a local (or mounted) filesystem. Nothing was read or written."
        )
    return os.path.abspath(os.fspath(given))


def check_tag(tag: Any, root: str) -> str:
    """``tag`` as DeepSpeed names the folder (``str(tag)``), or refused: it must be one folder's name."""
    name = str(tag)
    if (not name or name in (os.curdir, os.pardir) or os.sep in name or (os.altsep and os.altsep in name)
            or name in _NOT_TAGS):
        raise TrainingStatusValueError(
            f"save_checkpoint(..., tag={tag!r}) into {root}: a tag names one folder inside save_dir, and this one "
            f"cannot ({'it is a file DeepSpeed or trainstatus writes beside the tags' if name in _NOT_TAGS else 'it is not one folder name'}). "
            "Pass a plain name (DeepSpeed's default is global_step<N>), or tag=None. Nothing was saved."
        )
    return name


def refuse_tag_folder(root: str, shown: str, status_path: str, call: str) -> None:
    """A tag folder given where ``save_dir`` is expected (it holds ``*_model_states.pt``) is
    refused, naming the folder above it."""
    if is_tag(root) and not os.path.exists(os.path.join(root, STATUS_FILE)):
        raise TrainingStatusValueError(
            f"{call}({shown!r}): {root} is a DeepSpeed tag folder itself (it holds *{MODEL_STATES}). Pass the "
            f"folder above it, {os.path.dirname(root)}, the save_dir the tags were saved into, which holds the "
            f"status file {STATUS_FILE} beside them. Nothing was read or changed.",
            path=status_path,
        )


def refuse_status_inside(status_path: str, folder: str | None, action: str, *, look: bool = True) -> None:
    """A status file inside a tag folder is refused: DeepSpeed saves over that folder, and ``keep``
    removes it whole, the status file along with it. ``look=False``: from the paths alone (the same on
    every rank, so safe before a collective), not whether the folder above the status file is a tag
    folder on this host's disk (rank 0 checks that, and its error reaches every rank)."""
    where = inside(status_path, folder, look=is_tag if look else None)
    if where is not None:
        raise TrainingStatusValueError(
            f"trainstatus.integrations.deepspeed cannot {action}: the status file {status_path} would lie inside "
            f"the tag folder {where}. Keep it beside the tag folders (the default: {STATUS_FILE} in save_dir), or "
            "pass status_path= outside every tag folder. Nothing was read or changed.",
            path=status_path,
        )


def unrecorded(root: str, listed: set[str]) -> list[str]:
    """The tag folders of ``root`` that no entry lists, by name (one listing of ``root`` and one
    of each folder in it: rank 0 alone calls it, when it found nothing to resume from)."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [name for name in names if name not in listed and is_tag(os.path.join(root, name))]


def warn_unrecorded(names: list[str], root: str, status_path: str) -> None:
    """Say which tag folders nothing recorded: the resume does not return them."""
    if not names:
        return
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    warn(TrainingStatusCheckpointWarning(
        f"Passed over {shown} in {root}: DeepSpeed tag folders not recorded in {status_path} (a save that did not "
        "finish, one saved over in place while the run stopped, or one saved by engine.save_checkpoint without "
        "trainstatus.integrations.deepspeed.save_checkpoint), so not known to be whole. The resume starts from "
        "scratch. If one of them is whole and yours, load it yourself (engine.load_checkpoint(save_dir, "
        "tag=...)); if the status file is elsewhere, pass status_path=.",
        path=status_path, category=CATEGORY,
    ))

