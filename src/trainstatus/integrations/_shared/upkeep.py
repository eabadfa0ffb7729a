"""What the integrations do to the files and the list they keep: temp files that never became
checkpoints removed, and entries dropped from a checkpoint list in one write."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..._checkpoints.checkpoint_list import CheckpointList
from ..._checkpoints.files import CHECKPOINTS
from ..._store import StatusStore


def remove_stale_temps(folder: str, pattern: re.Pattern[str]) -> None:
    """Remove the files of ``folder`` whose names match ``pattern`` (temp files that never became
    checkpoints); a folder that cannot be listed, or a file already gone, is left to the next run."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if pattern.fullmatch(name):
            try:
                os.remove(os.path.join(folder, name))
            except OSError:
                pass


def drop(checkpoints: CheckpointList, stale: Callable[[Mapping[str, Any]], bool], *,
         keep: Mapping[str, Any] | None = None) -> tuple[list[Any], dict[str, Any]]:
    """Drop from ``checkpoints``, in one write (none if nothing matches), the entries ``stale``
    picks, except ``keep`` (the entry just recorded: same file, steps and creation time).

    Returns the entries dropped and the document as written, for ``remove_unlisted``: removing
    their files is the caller's, after this returned (never a listed file that is gone).
    """
    mark = None if keep is None else (keep["file_path"], keep["steps"], keep["creation_time"])

    def body(store: StatusStore) -> tuple[list[Any], dict[str, Any]]:
        current = store.get(checkpoints.category, CHECKPOINTS) or []
        kept: list[Any] = []
        dropped: list[Any] = []
        for e in current:
            picked = (isinstance(e, Mapping) and isinstance(e.get("file_path"), str) and stale(e)
                      and (e.get("file_path"), e.get("steps"), e.get("creation_time")) != mark)
            (dropped if picked else kept).append(e)
        if dropped:
            store.set(checkpoints.category, CHECKPOINTS, kept)
        return dropped, store.to_dict()

    return checkpoints.store.run_transaction(body)
