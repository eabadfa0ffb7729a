"""Lightning's checkpoints on an object store: ``ModelCheckpoint(dirpath="s3://bucket/ckpts")``.

Lightning writes a ``.ckpt`` there through fsspec (``TorchCheckpointIO``: the whole file in one
upload, ``fs.pipe``), which the store shows whole or not at all: no temp name, fsync or rename to
make it so. What an upload does not give is the record: which checkpoints are whole, and which is
the newest. Here, through the checkpoint-storage seam shared with the Ray integration
(``_shared.folder``):

- ``RemoteList.record``: once the upload returned, the object's size is read from a listing and
  the checkpoint recorded in the status file beside it (``training_status.json`` in the
  ``dirpath``, an object too, written with the store's conditional writes).
- ``RemoteList.unlist``: before an object listed is uploaded again (``last.ckpt``) or removed
  (``ModelCheckpoint`` dropping an old top-k file), its entry leaves the list in one write.
- ``newest``: the newest recorded checkpoint whose objects are all there with their recorded
  sizes (a listing; no object is read), as a URL for ``trainer.fit(ckpt_path=...)``.

Only strategies that save one file through ``CheckpointIO`` (one device, DDP, FSDP with a full
state dict) are recorded there; a sharded save to an object store is refused at set-up.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..._checkpoints.files import CHECKPOINTS, FILES
from ..._errors import TrainingStatusCheckpointError, TrainingStatusCheckpointWarning, TrainingStatusValueError, warn
from ..._store import StatusStore
from .._shared.choice import Words, warn_passed_over
from .._shared.folder import Folder, choose, is_remote, listed_entries, open_status, rewrite
from .common import CATEGORY, LIGHTNING_META, STATUS_FILE, refuse_status_inside, score

__all__ = ["RemoteList", "is_remote", "join", "newest", "reach", "refuse_checkpoint_given", "remove", "save", "split"]

_WHOSE = "ModelCheckpoint's dirpath"
_METADATA = ".metadata"  # a DCP folder's (a sharded strategy's .ckpt folder)


def join(folder_url: str, name: str) -> str:
    return f"{folder_url.rstrip('/')}/{name}"


def split(url: str) -> tuple[str, str]:
    """A checkpoint's URL as its folder's URL and its name."""
    folder, _, name = url.rstrip("/").rpartition("/")
    return folder, name


class RemoteList:
    """The checkpoints of one folder on an object store and the status file that lists them."""

    def __init__(self, folder_url: str, status_path: str | None, who: str) -> None:
        self.folder = Folder.of_url(folder_url)
        self.path = self.folder.status_path(status_path, STATUS_FILE, _WHOSE)
        refuse_status_inside(folder_url, self.path, who)
        self.store = open_status(self.path)
        self._where = f"{CATEGORY}/{CHECKPOINTS} in {self.path}"

    def record(self, name: str, steps: int, reward: float | None) -> dict[str, Any]:
        """Record the checkpoint ``name`` just uploaded (its objects and their sizes, from a listing)."""
        files = self.folder.sizes(name)
        if not files:
            raise TrainingStatusCheckpointError(
                f"Cannot record the checkpoint {self.folder.shown(name)}: the save returned, and the store does not "
                "list it. Check that nothing else removes objects in that folder (a lifecycle rule, another job). "
                "Nothing was recorded.", path=self.path, category=CATEGORY, file_path=name)
        entry = {"steps": steps, "file_path": name, "reward": reward, "creation_time": time.time(),
                 "auxillary_file_paths": [], FILES: files}
        rewrite(self.store, CATEGORY, lambda current: [*[e for e in current if not _names(e, name)], entry])
        return entry

    def unlist(self, name: str) -> None:
        """Drop the entries that name ``name`` (one write; none when nothing names it)."""
        if any(_names(e, name) for e in self.entries()):
            rewrite(self.store, CATEGORY, lambda current: [e for e in current if not _names(e, name)])

    def entries(self) -> list[Any]:
        return listed_entries(self.store, CATEGORY)

    def close(self) -> None:
        self.store.close()


def _names(entry: Any, name: str) -> bool:
    return isinstance(entry, Mapping) and entry.get("file_path") == name


def reach(status_url: str) -> bool:
    """Read the status file ``status_url`` once (rank 0, at the start of fit): credentials, endpoint
    or bucket wrong are said before the first step, not at the first save. True: it was read."""
    store = StatusStore(status_url)
    try:
        store.to_dict()
    finally:
        store.close()
    return True


def refuse_checkpoint_given(url: str) -> None:
    """Refuse a checkpoint's URL given where its folder is expected (``.../last.ckpt``): read as a
    folder it would answer None, and the run would start over."""
    folder_url, name = split(url)
    if not name.endswith(".ckpt"):
        return
    folder = Folder.of_url(folder_url)
    kind = folder.kind(name)
    if kind == "directory":  # a sharded or DeepSpeed save is a .ckpt folder; a dirpath may be named so too
        inside = {n for n, _ in Folder.of_url(url).children()}
        kind = "file" if inside & {LIGHTNING_META, _METADATA, "latest", "checkpoint"} and STATUS_FILE not in inside else None
    if kind == "file":
        raise TrainingStatusValueError(
            f"last_complete_checkpoint({url!r}): {url} is a checkpoint itself. Pass the folder that holds the "
            f"checkpoints (ModelCheckpoint's dirpath), {folder_url}: the answer is the newest whole checkpoint "
            "recorded there. Nothing was read or changed.", path=url)


def newest(folder_url: str, status_path: str | None, words: Words) -> str | None:
    """The name of the newest recorded checkpoint of ``folder_url`` whose objects are all there with
    their recorded sizes, or None; warns about the newer ones passed over, and about checkpoints
    there that nothing recorded. Reads the status file and listings; writes nothing."""
    listing = RemoteList(folder_url, status_path, f"last_complete_checkpoint({folder_url!r})")
    try:
        entries = listing.entries()
    finally:
        listing.close()
    entry, skipped = choose(listing.folder, entries)
    if skipped:
        returned = None if entry is None else f"{folder_url}/{entry['file_path']}"
        warn_passed_over(returned, skipped, listing.path, CATEGORY, folder_url, words)
    if not any(isinstance(e, Mapping) and isinstance(e.get(FILES), Mapping) for e in entries):
        found = [name for name, _ in listing.folder.children() if name.endswith(".ckpt")]
        if found:
            shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
            warn(TrainingStatusCheckpointWarning(
                f"{shown} in {folder_url} {'is a checkpoint' if len(found) == 1 else 'are checkpoints'} that "
                f"{listing.path} has never recorded (saved without TrainStatusCheckpointIO as the strategy's "
                "checkpoint_io, or under another status_path, or a first save cut short before its record), so "
                "last_complete_checkpoint() does not return "
                f"{'it' if len(found) == 1 else 'them'}. Give the Trainer plugins=[TrainStatusCheckpointIO()], and "
                "pass last_complete_checkpoint the same status_path.", path=listing.path, category=CATEGORY))
    return None if entry is None else str(entry["file_path"])


def listing_of(lists: dict[str, RemoteList], folder_url: str, status_path: str | None) -> RemoteList:
    """The list of ``folder_url``'s checkpoints, opened on first use and kept in ``lists``."""
    listing = lists.get(folder_url)
    if listing is None:
        listing = lists[folder_url] = RemoteList(folder_url, status_path, "TrainStatusCheckpointIO")
    return listing


def save(checkpoint_io: Any, lists: dict[str, RemoteList], status_path: str | None, checkpoint: dict[str, Any],
         url: str, storage_options: Any) -> None:
    """``TrainStatusCheckpointIO.save_checkpoint`` to an object store: unlist the name if listed
    (``last.ckpt`` uploaded again), have ``checkpoint_io`` upload it, record it."""
    folder_url, name = split(url)
    listing = listing_of(lists, folder_url, status_path)  # before the upload: a bad status file fails first
    listing.unlist(name)
    checkpoint_io.save_checkpoint(checkpoint, url, storage_options)
    steps = checkpoint.get("global_step", 0)
    listing.record(name, steps if type(steps) is int else 0, score(checkpoint, folder_url))


def remove(checkpoint_io: Any, lists: dict[str, RemoteList], status_path: str | None, url: str) -> None:
    """``TrainStatusCheckpointIO.remove_checkpoint`` on an object store: unlist, then remove."""
    folder_url, name = split(url)
    listing_of(lists, folder_url, status_path).unlist(name)
    checkpoint_io.remove_checkpoint(url)
