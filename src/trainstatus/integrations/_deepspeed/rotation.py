"""``keep``'s rotation made whole across kills: the tag folders it is about to remove are written
down first, so that one a kill stopped it from removing is removed at the next save.

``CheckpointList`` writes the shorter list first and only then removes the dropped folders: a kill
in between leaves a folder no entry names, which nothing would ever remove (only what was
recorded is ever removed, so a folder of the user's is never touched). Here, before the record,
the names of the entries the rotation will drop go under ``deepspeed/removing`` in the status
file; at the next rotation, any of those still on disk and listed by no entry is removed, and the
names are replaced by that rotation's own. Only names trainstatus recorded and rotated out are
ever there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from ..._checkpoints.checkpoint_list import CheckpointList
from ..._checkpoints.files import CHECKPOINTS
from ..._store import StatusStore
from .places import CATEGORY

__all__ = ["REMOVING", "before_add"]

REMOVING = "removing"


def before_add(store: StatusStore, checkpoints: CheckpointList, keep: int, tag: str) -> list[str]:
    """Remove what an earlier rotation left (its names, still on disk, listed by no entry, other
    than ``tag``, the one about to be recorded: a tag rotated out and saved again since), then
    write down the tags the coming ``add`` of ``tag`` (one more entry, trimmed to ``keep``, oldest
    first) will drop. Call it just before ``checkpoints._add``, with nothing naming ``tag`` listed
    (its entry then cannot replace one in place). The names removed now."""
    entries = store.get(CATEGORY, CHECKPOINTS) or []
    listed = {e["file_path"] for e in entries if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)}
    left = store.get(CATEGORY, REMOVING)
    removed = []
    for name in left if isinstance(left, list) else []:
        if isinstance(name, str) and name and name != tag and name not in listed and name == os.path.basename(name):
            folder = checkpoints.resolve(name)
            if os.path.isdir(folder) and not os.path.islink(folder):
                shutil.rmtree(folder, ignore_errors=True)  # what is left is removed at the next save
                removed.append(name)
    doomed = [e["file_path"] for e in entries[:max(0, len(entries) + 1 - keep)]
              if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)]
    if doomed != left and (doomed or left):
        store.set(CATEGORY, REMOVING, doomed)
    return removed
