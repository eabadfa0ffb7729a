"""Where a Ray Train run keeps its files, and what a checkpoint folder holds there.

A run's folder is ``<storage_path>/<name>`` (Ray's ``experiment_fs_path``): its checkpoint folders
(``checkpoint_<timestamp>`` unless the training function names them), Ray's snapshot
``checkpoint_manager_snapshot.json`` and, by default, the status file. The storage is a local folder
(a shared filesystem on a cluster) or an object store Ray reaches through a ``pyarrow.fs``
filesystem (``s3://``, ``gs://``). ``Storage`` answers, the same way for both, the questions the
record and the resume ask: which files a checkpoint folder holds and their sizes, whether a folder
is still there, whether a recorded one is still whole, and which folders nothing recorded.

Metadata only: a listing and the sizes in it (one LIST request per folder on an object store, an
``os.stat`` per file on disk); no file is opened. On a local disk the record fsyncs the files first
(``_checkpoints.folders``); an object is durable once its upload was acknowledged.

Imports ``pyarrow.fs`` (which Ray installs) only for a storage that is not local.
"""

from __future__ import annotations

import os
import posixpath
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

from ..._errors import TrainingStatusCheckpointError
from ..._remote.location import url_scheme
from .._shared.folder import Folder

__all__ = ["STATUS_FILE", "Storage", "is_checkpoint_name"]

STATUS_FILE = "training_status.json"

# Ray's own name for a checkpoint folder (StorageContext.make_default_checkpoint_dir_name): the time
# of the report, to the microsecond, so names sort as the reports came.
_RAY_NAME = re.compile(r"checkpoint_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{6}")


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is the name Ray gives a checkpoint folder it makes."""
    return _RAY_NAME.fullmatch(name) is not None


class Storage(Folder):
    """A run's folder: ``root`` on the local disk (``fs`` None) or on the pyarrow filesystem ``fs``."""

    @classmethod
    def of_run(cls, storage_path: str, name: str, fs: Any) -> Storage:
        """The folder of the run ``name`` under Ray's ``RunConfig(storage_path=...)``, on ``fs``
        (the filesystem Ray wrote the checkpoint with)."""
        if fs is None or fs.type_name == "local":
            return cls(os.path.join(os.path.expanduser(storage_path), name))
        if url_scheme(storage_path) is not None:
            # What pyarrow's FileSystem.from_uri makes of it (bucket/prefix), without making a
            # filesystem, which may ask the object store where the bucket is on every report.
            parts = urllib.parse.urlsplit(storage_path)
            storage_path = parts.netloc + parts.path
        return cls(posixpath.join(storage_path, name), fs)

    @classmethod
    def of_path(cls, run_path: str, fs: Any = None) -> Storage:
        """The run folder ``run_path``: a local path, an ``s3://`` or ``gs://`` URL, or a path on ``fs``."""
        if fs is None and url_scheme(run_path) is not None:
            import pyarrow.fs

            fs, run_path = pyarrow.fs.FileSystem.from_uri(run_path)
        return cls(run_path, fs)

    def status_path(self, given: str | None, file_name: str = STATUS_FILE,
                    whose: str = "the Ray Train run") -> str:
        return super().status_path(given, file_name, whose)

    def name_of(self, path: str) -> str:
        """The name of the checkpoint folder ``path`` relative to the run folder; raises if outside it."""
        relative = (os.path.relpath(os.path.abspath(path), self.root) if self.fs is None
                    else posixpath.relpath(path, self.root))
        first = relative.split(os.sep if self.fs is None else "/")[0]
        if relative == os.curdir or first == os.pardir or os.path.isabs(relative):
            raise TrainingStatusCheckpointError(
                f"Cannot record the checkpoint {path}: it is not inside the run's folder {self.shown()}, where "
                "Ray Train keeps the checkpoints it registers (RunConfig(storage_path=..., name=...)). Nothing "
                "was recorded.",
                file_path=path,
            )
        return relative

    def unrecorded(self, recorded: Iterable[str]) -> list[str]:
        """The folders of the run named as Ray names its checkpoints that are not in ``recorded``:
        uploads Ray had not registered when the run stopped (a worker or the controller lost in
        between), which its ``num_to_keep`` never removes. Oldest first."""
        names = [name for name, kind in self.children() if kind == "directory"]
        listed = set(recorded)
        return sorted(n for n in names if _RAY_NAME.fullmatch(n) and n not in listed)
