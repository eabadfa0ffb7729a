"""Whether a recorded ``torch.distributed.checkpoint`` folder is whole, from its metadata alone.

A DCP save writes each rank's ``__<rank>_<n>.distcp`` files, then the coordinator writes
``.metadata`` last (the plan: each tensor's chunk, in which file, at which offset, how long).
What is recorded (``CheckpointList``) holds every file of the folder with its size, taken after
every rank's fsync; ``CheckpointList``'s own check finds a file gone or of another size. This
check adds what the metadata says, without reading any tensor: ``.metadata`` was recorded and
unpickles, and every chunk it names lies in a recorded file, inside that file's recorded size.

It does not read the tensors: a bit flipped in a shard is not caught. The shards were fsynced
before the record and are the bytes written; a resume reading every byte of a multi-GB checkpoint
on every start is what this avoids (docs/distributed.md has the figures).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ..._checkpoints.files import FILES
from ..._errors import TrainingStatusCheckpointError

__all__ = ["METADATA", "chunks", "reader", "whole"]

METADATA = ".metadata"  # torch.distributed.checkpoint.filesystem._metadata_fn: written last, by the coordinator


def chunks(folder: str) -> list[tuple[str, int, int]]:
    """The chunks ``folder/.metadata`` names: (file relative to the folder, offset, length).

    Reads ``.metadata`` only (a pickle of a few KB per thousand tensors), with torch's own reader.
    Raises ValueError naming the file when it cannot be read.
    """
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    try:
        if "://" in folder:  # on an object store, through fsspec (_dcp.remote): one GET of .metadata
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

            try:
                metadata = FsspecReader(folder).read_metadata()
            except FileNotFoundError:
                raise
            except OSError as exc:  # the store did not answer (credentials, throttling): not "not whole"
                raise TrainingStatusCheckpointError(
                    f"Cannot read {folder}/{METADATA}: {type(exc).__name__}: {exc}. Check the store's credentials, "
                    "endpoint and permissions, and try again; nothing was chosen, unlisted or started over.",
                    path=folder) from exc
        else:
            metadata = FileSystemReader(folder).read_metadata()
    except TrainingStatusCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to unpickle means "not whole"
        raise ValueError(f"{os.path.join(os.path.basename(folder), METADATA)} cannot be read "
                         f"({type(exc).__name__}: {exc})") from None
    found: list[tuple[str, int, int]] = []
    for info in (metadata.storage_data or {}).values():
        found.append((str(info.relative_path), int(info.offset), int(info.length)))
    return found


def reader(root: str) -> None:
    """Import torch's reader of ``.metadata`` now, or raise ModuleNotFoundError saying why: without
    it ``whole``'s check would find every folder unreadable, and a resume would drop them all."""
    try:
        import torch.distributed.checkpoint.filesystem  # noqa: F401
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"Cannot tell whether the checkpoints recorded under {root} are whole: reading their {METADATA} "
            f"needs torch.distributed.checkpoint, which cannot be imported here ({exc}). Nothing was read or "
            "dropped; call last_complete_checkpoint() where torch is installed (where the run loads it).",
            name=exc.name,
        ) from exc


def whole(root: str) -> Callable[[dict[str, Any]], bool]:
    """The check of a recorded DCP folder (paths under ``root``) beyond its files' sizes; raises a
    ValueError naming what is wrong."""

    def check(entry: dict[str, Any]) -> bool:
        folder = entry["file_path"]
        files: Mapping[str, Any] = entry[FILES] if isinstance(entry.get(FILES), Mapping) else {}
        if os.path.join(folder, METADATA) not in files:
            raise ValueError(f"{folder} has no {METADATA} recorded: not a finished torch.distributed.checkpoint save")
        for name, offset, length in chunks(os.path.join(root, folder)):
            recorded = files.get(os.path.join(folder, name))
            if type(recorded) is not int:
                raise ValueError(f"{os.path.join(folder, METADATA)} names {name}, which was not recorded with the folder")
            if offset + length > recorded:
                raise ValueError(f"{os.path.join(folder, METADATA)} names bytes {offset:,}-{offset + length:,} of "
                                 f"{os.path.join(folder, name)}, which has {recorded:,} bytes recorded")
        return True

    return check
