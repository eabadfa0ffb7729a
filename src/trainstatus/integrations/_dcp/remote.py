"""DCP folders on an object store: ``dcp.save(state_dict, checkpoint_id="s3://bucket/ckpt/step-4")``.

torch writes there through fsspec (``FsspecWriter``): each rank uploads its ``.distcp`` files, then
the coordinator ``.metadata``, once every rank's write returned; an object is seen whole or not at
all. What the store does not give is the record. Here, through the checkpoint-storage seam shared
with the Ray and Lightning integrations (``_shared.folder``):

- ``record``: once every rank's ``dcp.save`` returned, rank 0 lists the folder (every object with
  its size, ``.metadata`` included) and records it in the status file beside the checkpoint folders
  (an object too, written with the store's conditional writes); every rank returns that entry.
  There is nothing to fsync, and no host to check apart: every host reads the same store.
- ``unlist``: before ``save`` writes into a folder that is listed (``ckpt/latest``), its entry
  leaves the list in one write, and no rank begins to save before that.
- ``newest``: the newest recorded folder whose objects are all there with their recorded sizes and
  whose ``.metadata`` (read with torch's ``FsspecReader``) names only bytes inside them.
- ``keep=N``: the oldest entries beyond N leave the list, and only then are their folders removed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..._checkpoints.files import FILES
from ..._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusError,
    TrainingStatusValueError,
    TrainingStatusWriteError,
    warn,
)
from .._formats.dcp_metadata import METADATA, whole
from .._ranks.collectives import barrier, group
from .._ranks.hosts import ranks
from .._ranks.resuming import decide
from .._ranks.saving import entry_fields
from .._shared import lease as _lease
from .._shared.choice import later
from .._shared.folder import Folder, choose, is_remote, listed_entries, open_status, rewrite
from .places import refuse_status_inside, warn_passed_over, warn_saved_over, warn_unrecorded

__all__ = ["is_remote", "last_complete", "record", "split", "unlist"]

CATEGORY = "dcp"
STATUS_FILE = "training_status.json"
_WHOSE = "the DCP checkpoint folders"


def split(url: str) -> tuple[str, str]:
    """A checkpoint folder's URL as the URL of the folder above it and its name; a bucket itself
    (``s3://bucket``) is refused: the status file and the other checkpoint folders go above it."""
    root, _, name = url.rstrip("/").rpartition("/")
    if root.endswith(":/"):
        raise TrainingStatusValueError(
            f"trainstatus.integrations.dcp cannot save into or record {url}: it is a bucket, not a checkpoint folder "
            f"in one. Give each checkpoint a folder of its own below a prefix ({url}/ckpt/step-4), as "
            "dcp.save(checkpoint_id=...) does; the status file goes beside those folders.", path=url)
    return root, name


def _safe(name: Any) -> bool:
    """A checkpoint folder's name this integration would remove: one path segment, as ``record`` writes
    them (an entry edited by hand, "" or "../x", must never make it remove the folder above, or another)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _place(root_url: str, status_path: str | None, url: str | None = None) -> tuple[Folder, str]:
    """The folder above the checkpoint folders, and the status file; one inside the checkpoint
    folder ``url`` is refused (a save into it writes around it), from the paths alone."""
    folder = Folder.of_url(root_url)
    path = folder.status_path(status_path, STATUS_FILE, _WHOSE)
    if url is not None:
        refuse_status_inside(path, url, f"record {url}", look=False)
    return folder, path


def _names(entry: Any, name: str) -> bool:
    return isinstance(entry, Mapping) and entry.get("file_path") == name


def unlist(url: str, status_path: str | None, timeout: float | None) -> None:
    """Drop the entries of the folder ``url`` (rank 0, one write), before every rank saves into it."""
    root_url, name = split(url)
    folder, path = _place(root_url, status_path, url)

    def drop() -> None:
        _lease.take(path, "trainstatus.integrations.dcp.save")  # a local status file's (lease.py); none on a store
        store = open_status(path)
        try:
            if any(_names(e, name) for e in listed_entries(store, CATEGORY)):
                rewrite(store, CATEGORY, lambda current: [e for e in current if not _names(e, name)])
        finally:
            store.close()

    decide(drop, lambda _: {}, root_url, what=f"the entry of {url} to drop before it is saved over", timeout=timeout)


def record(url: str, step: int, status_path: str | None, keep: int | None, reward: float | None,
           timeout: float | None) -> dict[str, Any]:
    """``dcp.record`` of the folder ``url`` on an object store: the entry rank 0 recorded, on every rank."""
    root_url, name = split(url)
    folder, path = _place(root_url, status_path, url)
    fields = entry_fields()  # world_size: every rank's, the same
    what = f"recording {url} (step {step})"
    me = ranks()
    if me is not None:  # every rank's save returned (a rank that stopped after its save is named here)
        barrier(group(timeout, what), me, what)

    def write() -> dict[str, Any]:
        _lease.take(path, "trainstatus.integrations.dcp.record",
                    stopped=f"Nothing was recorded; {url} is left as dcp.save wrote it.")
        files = folder.sizes(name)
        if f"{name}/{METADATA}" not in files:
            raise TrainingStatusCheckpointError(
                f"Cannot record {url}: it has no {METADATA}, which torch.distributed.checkpoint writes last. Call "
                "record() after dcp.save() returned on every rank (or after dcp.async_save()'s future completed), "
                "with the folder given to it as checkpoint_id. Nothing was recorded.",
                path=path, category=CATEGORY, file_path=name)
        entry = {"steps": int(step), "file_path": name, "reward": reward, "creation_time": time.time(),
                 "auxillary_file_paths": [], FILES: files, **fields}
        gone: list[str] = []

        over: list[Any] = []

        def change(current: list[Any]) -> list[Any]:
            # Entries of later steps (a run that went back saves over their folders) and this
            # folder's own leave the list; keep=N drops the oldest beyond N, removed below. (A
            # transaction may run this again on a newer list: what it found is set afresh each time.)
            over[:] = [e for e in current if _names(e, name) and e.get("steps") != int(step)]
            kept = [e for e in current if not (_names(e, name) or (isinstance(e, Mapping) and later(e, int(step))))]
            kept.append(entry)
            dropped: set[int] = set()
            if keep is not None and len(kept) > keep:
                order = sorted(range(len(kept)), key=lambda i: (_steps(kept[i]), i))
                dropped = set(order[:len(kept) - keep]) - {len(kept) - 1}
            left = [e for i, e in enumerate(kept) if i not in dropped]
            still = {e.get("file_path") for e in left if isinstance(e, Mapping)}  # two entries may name one folder
            gone[:] = [kept[i]["file_path"] for i in sorted(dropped)
                       if _is_entry(kept[i]) and kept[i]["file_path"] not in still]
            return left

        store = open_status(path)
        try:
            rewrite(store, CATEGORY, change)
        finally:
            store.close()
        if over:  # as on a disk (dcp.record): the save is whole now; the window behind it was not
            warn_saved_over(url, over[0].get("steps"), step, path)
        _remove(folder, [old for old in gone if old != name], path)
        return entry

    return decide(write, lambda _: {}, root_url, what=what, timeout=timeout)


def _remove(folder: Folder, names: list[str], path: str) -> None:
    """Remove the folders ``keep`` dropped, unlisted already (a listed folder is never gone). One that
    cannot be removed is said, not raised: the record is written, and the run goes on."""
    for name in names:
        if not _safe(name):
            warn(TrainingStatusCheckpointWarning(
                f"Not removing {name!r}, dropped from {path} by keep=: not the name of a checkpoint folder in "
                f"{folder.shown()} (an entry edited by hand?). Remove what it names yourself, if anything.",
                path=path, category=CATEGORY))
            continue
        try:
            if folder.exists(name):
                folder.remove(name)
        except TrainingStatusError as exc:
            warn(TrainingStatusCheckpointWarning(
                f"{folder.shown(name)} was dropped from {path} by keep= but could not be removed ({exc.__cause__ or exc}); "
                "it is no longer listed and takes space: remove it yourself, or give this job delete permission.",
                path=path, category=CATEGORY))


def last_complete(root_url: str, status_path: str | None, timeout: float | None,
                  note: Callable[[Mapping[str, Any], str, str], None]) -> str | None:
    """``dcp.last_complete_checkpoint`` of folders on an object store: the folder's URL, or None.
    ``note(entry, url, status_path)`` says what to say of the folder chosen (rank 0)."""
    folder, path = _place(root_url, status_path)

    def unlist_passed(skipped: list[tuple[Any, str]]) -> TrainingStatusWriteError | None:
        """Drop the newer entries passed over (this run saves over their folders as it reaches their
        steps, and one half saved over must never be found listed, as on a disk); the refusal of
        that write, if the store refused it (they stay listed, and the warning says so)."""
        passed = [e for e, _ in skipped]
        try:
            store = open_status(path)
            try:
                rewrite(store, CATEGORY, lambda current: [e for e in current if e not in passed])
            finally:
                store.close()
        except TrainingStatusWriteError as exc:
            return exc
        return None

    def pick() -> dict[str, Any] | None:
        if folder.kind(METADATA) == "file":  # a checkpoint folder given for the folder above it: not a fresh run
            above = split(root_url)[0]
            raise TrainingStatusValueError(
                f"last_complete_checkpoint({root_url!r}): {root_url} is a torch.distributed.checkpoint folder itself "
                f"(it holds {METADATA}). Pass the folder above it, {above}, which holds the checkpoint folders and the "
                "status file training_status.json that record() writes beside them. Nothing was read or changed.",
                path=path)
        store = open_status(path)
        try:
            entries = listed_entries(store, CATEGORY)
        finally:
            store.close()
        entry, skipped = choose(folder, entries, whole(root_url))
        if skipped:
            warn_passed_over(entry, skipped, path, root_url, root_url, unlist_passed(skipped))
        if entry is not None:
            note(entry, f"{root_url}/{entry['file_path']}", path)
        if entry is None:
            listed = {e.get("file_path") for e in entries if isinstance(e, Mapping)}
            left = [n for n, kind in folder.children() if kind == "directory" and n not in listed
                    and folder.kind(f"{n}/{METADATA}") == "file"]
            warn_unrecorded(left, root_url, path, None)
        return entry

    entry = decide(pick, lambda _: {}, root_url, what=f"the newest complete checkpoint of {root_url}",
                   timeout=timeout)
    return None if entry is None else f"{root_url}/{entry['file_path']}"


def _is_entry(entry: Any) -> bool:
    return isinstance(entry, Mapping) and isinstance(entry.get("file_path"), str)


def _steps(entry: Any) -> int:
    steps = entry.get("steps") if isinstance(entry, Mapping) else None
    return steps if type(steps) is int else -1
