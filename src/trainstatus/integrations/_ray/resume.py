"""The resume decision of ``trainstatus.integrations.ray``: the newest recorded checkpoint of a Ray
Train run that is whole, and the warnings that name what it passed over.

The choice is ``CheckpointList``'s (``_common.choose``: the entry with the highest ``steps`` whose
files are all there with their recorded sizes), made on the local disk with ``os.stat``; on an
object store the same rule reads one listing per folder (``_shared.folder.choose``). Ray's
own snapshot is never read: it may be what is damaged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..._checkpoints.checkpoint_list import CheckpointList
from ..._errors import TrainingStatusCheckpointWarning, TrainingStatusValueError, warn
from ..._remote.location import url_scheme
from ..._storage import history as _history
from ..._store import StatusStore
from .._shared.choice import choose, reasons
from .._shared.folder import choose as choose_listed
from .._shared.folder import listed_entries
from .storage import Storage

__all__ = ["newest_whole"]


def newest_whole(run: Storage, status_path: str, category: str,
                 storage_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The newest whole checkpoint recorded for ``run`` in ``status_path``, or None; warns about the
    newer recorded ones passed over, and about the checkpoint folders nothing recorded."""
    store = _open(status_path, storage_options)
    if store is None:
        entries: list[Any] = []
        entry: dict[str, Any] | None = None
        skipped: list[tuple[Any, str]] = []
    else:
        try:
            if run.local:
                checkpoints = CheckpointList(store, category, keep=None, root=run.root)
                entries = checkpoints.entries()
                entry, skipped = choose(checkpoints, lambda _: True)
            else:
                entries = listed_entries(store, category)
                entry, skipped = choose_listed(run, entries)
        finally:
            store.close()
    if skipped:
        _warn_passed_over(run, entry, skipped, status_path, category)
    recorded = [e["file_path"] for e in entries if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)]
    left = run.unrecorded(recorded)
    if left:
        _warn_unrecorded(run, left, status_path, category)
    return entry


def _open(status_path: str, storage_options: Mapping[str, Any] | None) -> StatusStore | None:
    """The status file, read only when it is there (or its history is): a wrong ``run_path`` creates nothing."""
    if url_scheme(status_path) is not None:  # an object that is not there reads as a fresh run: no list
        return StatusStore(status_path, storage_options=storage_options)
    if storage_options is not None:
        raise TrainingStatusValueError(
            f"storage_options= is for a status file on an object store; {status_path} is a local path. Leave "
            "storage_options out, or give the status file's s3://, gs:// or az:// URL.", path=status_path)
    folder, name = os.path.split(status_path)
    if not os.path.exists(status_path) and not _history.versions(folder, name):
        return None
    return StatusStore(status_path, resume=True)


def _warn_passed_over(run: Storage, entry: Mapping[str, Any] | None, skipped: list[tuple[Any, str]],
                      status_path: str, category: str) -> None:
    if entry is not None:
        start = (f"{run.shown(entry['file_path'])} is the newest whole checkpoint recorded in {status_path}; the "
                 "newer ones cannot be resumed from")
        end = ""
    else:
        start = f"No checkpoint recorded in {status_path} can be resumed from"
        end = " last_complete_checkpoint() returns None: a run started with it starts from scratch."
    warn(TrainingStatusCheckpointWarning(
        f"{start}: {reasons(skipped)}.{end} Nothing was removed: a new run (a new RunConfig(name=...)) writes "
        f"into a folder of its own and leaves {run.shown()} as it is. If you have whole copies of them, put them "
        "back and call last_complete_checkpoint() again.",
        skipped=list(skipped), path=status_path, category=category,
    ))


def _warn_unrecorded(run: Storage, names: list[str], status_path: str, category: str) -> None:
    warn(TrainingStatusCheckpointWarning(
        f"Passed over {', '.join(names)} in {run.shown()}: not recorded in {status_path}: uploads Ray Train had "
        "not registered when the run stopped (a worker or the controller lost after the upload), or folders of a "
        "run without TrainStatusCallback; nothing says they are whole. Ray's num_to_keep never removes them: "
        "remove them by hand when you no longer need them.",
        path=status_path, category=category,
    ))
