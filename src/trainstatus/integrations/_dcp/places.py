"""Where a DCP run's checkpoint folders and status file are, and what to say when a path given is
not the right one: a checkpoint folder where the folder above it is expected, a status file inside
a checkpoint folder, checkpoint folders that nothing recorded.

A mistake in a path must never pass for a fresh run (``last_complete_checkpoint`` returning None,
and the run starting over from step 0) nor unlist anything: each is refused before anything is
read or written, or said in a warning that names the folders.
"""

from __future__ import annotations

import os

from collections.abc import Mapping
from typing import Any

from ..._errors import TrainingStatusCheckpointWarning, TrainingStatusValueError, TrainingStatusWriteError, warn
from .._formats.dcp_metadata import METADATA
from .._shared.choice import left_listed, reasons
from .._shared.inside import inside

__all__ = ["refuse_checkpoint_folder", "refuse_status_inside", "unrecorded", "warn_alone", "warn_passed_over", "warn_saved_over",
           "warn_unrecorded"]


def _is_checkpoint(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, METADATA))


def warn_alone(call: str, status_path: str, grouped: bool) -> None:
    """Warn when this process is one of several a launcher started (``WORLD_SIZE``) but no process
    group of theirs is initialized (``grouped`` False): it decides or records alone, and the ranks
    may resume from different folders."""
    world = os.environ.get("WORLD_SIZE", "")
    if world.isdigit() and int(world) > 1 and not grouped:
        warn(TrainingStatusCheckpointWarning(
            f"{call} ran in one of {world} processes (WORLD_SIZE={world}) before this one joined their "
            "torch.distributed process group: it ran alone, and the ranks may resume from (or record) different "
            "checkpoints. Call torch.distributed.init_process_group(...) first, then call it on every rank.",
            path=status_path, category="dcp",
        ))


def refuse_checkpoint_folder(directory: str, shown: str, status_path: str) -> None:
    """``last_complete_checkpoint(directory)`` names the folder that holds the checkpoint folders:
    a checkpoint folder itself (it holds ``.metadata``) is refused, naming the folder above it."""
    if _is_checkpoint(directory):
        raise TrainingStatusValueError(
            f"last_complete_checkpoint({shown!r}): {directory} is a torch.distributed.checkpoint folder itself (it "
            f"holds {METADATA}). Pass the folder above it, {os.path.dirname(directory)}, which holds the checkpoint "
            "folders and the status file training_status.json that record() writes beside them. Nothing was read "
            "or changed.",
            path=status_path,
        )


def refuse_status_inside(status_path: str, folder: str | None, action: str, *, look: bool = True) -> None:
    """A status file inside a checkpoint folder is refused: a save into that folder would write
    around it (or ``dcp.save`` would overwrite it), and a folder removed by a rotation takes it along.
    ``look=False``: from the paths alone (the same on every rank, so safe before a collective), not
    whether the folder above the status file is a checkpoint folder on this host's disk (rank 0
    checks that, and its error reaches every rank)."""
    where = inside(status_path, folder, look=_is_checkpoint if look else None)
    if where is not None:
        raise TrainingStatusValueError(
            f"trainstatus.integrations.dcp cannot {action}: the status file {status_path} would lie inside the "
            f"checkpoint folder {where}. Keep it beside the checkpoint folders (the default: training_status.json "
            "in the folder that holds them), or pass status_path= outside every checkpoint folder. Nothing was "
            "read or changed.",
            path=status_path,
        )


def unrecorded(root: str, listed: set[str]) -> list[str]:
    """The checkpoint folders of ``root`` (holding ``.metadata``) that no entry lists, by name. One
    listing of ``root`` and a ``stat`` a folder: rank 0 alone calls it, when it found nothing to
    resume from."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [name for name in names if name not in listed and _is_checkpoint(os.path.join(root, name))]


def warn_unrecorded(names: list[str], root: str, status_path: str, returned: str | None) -> None:
    """Say which checkpoint folders nothing recorded, and what ``last_complete_checkpoint`` returns."""
    if not names:
        return
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    answer = ("returns None: the run starts from scratch" if returned is None
              else f"returns {returned}, the newest one recorded whole")  # (a caller may pass one)
    warn(TrainingStatusCheckpointWarning(
        f"Passed over {shown} in {root}: torch.distributed.checkpoint folders not recorded in {status_path} (a save "
        "that did not finish, one saved over in place while the run stopped, or one saved without "
        "trainstatus.integrations.dcp.record or save), so not known to be whole. last_complete_checkpoint() "
        f"{answer}. If one of them is whole and yours, record it (record(folder, step)) or load it yourself; "
        "if the status file is elsewhere, pass status_path=.",
        path=status_path, category="dcp",
    ))


def warn_saved_over(folder: str, listed: object, step: int, status_path: str) -> None:
    """Say that ``folder``, listed as step ``listed``, was saved over in place (``dcp.save`` then
    ``record``): recorded now, complete; the window behind it was unsafe, which only a warning can name."""
    warn(TrainingStatusCheckpointWarning(
        f"{folder} was listed as step {listed} while this save (step {step}) went into it in place: a kill during "
        "such a save leaves the folder listed with two steps' shards of the same sizes, and a resume loads it. It is "
        "recorded now, complete. Save with trainstatus.integrations.dcp.save(state_dict, folder, step), which "
        "unlists the folder before it saves over it, or save each step into a folder of its own.",
        path=status_path, category="dcp",
    ))


def warn_passed_over(entry: Mapping[str, Any] | None, skipped: list[tuple[Any, str]], path: str, root: str,
                      shown: str, refused: TrainingStatusWriteError | None) -> None:
    """Say which newer recorded folders a resume passed over, and that they are no longer listed
    (or, ``refused``, that the status file could not be written to unlist them). ``shown`` and
    ``root``: the folder as given and as read (a local path, or the URL of one on an object store)."""
    if entry is not None:
        start = (f"{os.path.join(shown, entry['file_path'])} is the newest whole checkpoint recorded in {path}; "
                 "the newer ones cannot be resumed from")
        fresh = ""
    else:
        start = f"No checkpoint recorded in {path} can be resumed from"
        fresh = " last_complete_checkpoint() returns None: the run starts from scratch."
    left = left_listed(path, refused) if refused is not None else (
        f"They are no longer listed "
        f"(this run saves over their folders as it reaches their steps, and a folder half saved over must not "
        f"be found listed); their files are left in {root}. To keep them, stop and move them out of {root}, "
        "or save into another folder.")
    warn(TrainingStatusCheckpointWarning(f"{start}: {reasons(skipped)}.{fresh} {left}",
                                         skipped=list(skipped), path=path, category="dcp"))
