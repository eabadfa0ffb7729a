"""Where an Accelerate run's checkpoints and status file are: the folder of the status file
(``project_dir`` with automatic checkpoint naming, else the folder above the checkpoint folders),
the checkpoint folder a save goes into, and what to say when the folder given is not the right one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from ..._errors import TrainingStatusTypeError, TrainingStatusValueError
from .folders import CHECKPOINTS_DIR, random_states

__all__ = ["CATEGORY", "STATUS_FILE", "Place", "place", "project", "refuse_misplaced", "saving", "shown_path"]

STATUS_FILE = "training_status.json"
CATEGORY = "accelerate"

PathLike = str | os.PathLike[str]


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a run's checkpoints are recorded."""

    root: str  # the folder of the status file, absolute; entries' paths are relative to it
    shown: str  # that folder as the user gave it (project_dir, input_dir, directory)

    @property
    def status(self) -> str:
        return os.path.join(self.root, STATUS_FILE)


def _local(given: Any, call: str, what: str) -> str:
    if not isinstance(given, (str, os.PathLike)) or "://" in os.fspath(given):
        raise TrainingStatusTypeError(
            f"{call}: {what} must be a local folder path (str or os.PathLike), not {given!r}."
        )
    return os.fspath(given)


def place(given: Any, call: str) -> Place:
    """The place whose status file lies in the folder ``given`` (to ``call``)."""
    shown = _local(given, call, "the folder of the status file")
    return Place(os.path.abspath(shown), shown)


def project(accelerator: Any, call: str) -> Place:
    """The place of an Accelerator with automatic checkpoint naming: its ``project_dir``."""
    project_dir = accelerator.project_configuration.project_dir
    if project_dir is None:
        raise TrainingStatusValueError(
            f"{call}() with automatic checkpoint naming needs the Accelerator's project_dir "
            "(ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)): its checkpoints/ "
            f"folder holds the checkpoints, and {STATUS_FILE} lies beside it. Nothing was "
            f"{'saved' if call == 'save_state' else 'loaded'}."
        )
    return place(project_dir, call)


def saving(accelerator: Any, output_dir: PathLike | None) -> tuple[Place, str]:
    """Where this save goes: the status file's place and the checkpoint folder (absolute)."""
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming:
        found = project(accelerator, "save_state")
        return found, os.path.join(found.root, CHECKPOINTS_DIR, f"checkpoint_{int(config.iteration)}")
    if output_dir is None:
        raise TrainingStatusValueError(
            "save_state(accelerator) needs output_dir=, the checkpoint folder, when automatic checkpoint naming "
            f"is off; the status file {STATUS_FILE} goes in the folder above it. Nothing was saved."
        )
    folder = os.path.abspath(_local(output_dir, "save_state", "output_dir"))
    return Place(os.path.dirname(folder), os.path.dirname(folder)), folder


def shown_path(place: Place, entry: Mapping[str, Any] | None) -> str | None:
    """The entry's folder as the user would write it: under the folder as they gave it."""
    return None if entry is None else os.path.join(place.shown, entry["file_path"])


def refuse_misplaced(place: Place) -> None:
    """No status file: say so when the folder given is a checkpoint, or Accelerate's checkpoints/."""
    if os.path.exists(os.path.join(place.root, random_states(0))):
        instead = f"a checkpoint folder itself (it holds {random_states(0)})"
        fix = f"pass the folder above it, or load it with accelerator.load_state({place.shown!r})"
    elif os.path.basename(place.root) == CHECKPOINTS_DIR and os.path.exists(
            os.path.join(os.path.dirname(place.root), STATUS_FILE)):
        instead = "Accelerate's checkpoints/ folder; the status file lies in project_dir, above it"
        fix = f"pass {os.path.dirname(place.shown.rstrip(os.sep)) or os.curdir!r}"
    else:
        return
    raise TrainingStatusValueError(
        f"{place.shown} has no {STATUS_FILE}: it is {instead}. Give the folder that holds the status file "
        f"(project_dir with automatic checkpoint naming): {fix}. Nothing was read or loaded.",
        path=place.status, category=CATEGORY,
    )


