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
from collections.abc import Iterable, Mapping
from typing import Any

from ..._checkpoints.files import FILES
from ..._errors import TrainingStatusCheckpointError, TrainingStatusValueError
from ..._remote.location import url_scheme

__all__ = ["STATUS_FILE", "Storage", "is_checkpoint_name"]

STATUS_FILE = "training_status.json"

# pyarrow filesystem type -> the URL scheme trainstatus opens a status file of that store with.
_SCHEMES = {"s3": "s3", "gcs": "gs"}
# Ray's own name for a checkpoint folder (StorageContext.make_default_checkpoint_dir_name): the time
# of the report, to the microsecond, so names sort as the reports came.
_RAY_NAME = re.compile(r"checkpoint_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{6}")


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is the name Ray gives a checkpoint folder it makes."""
    return _RAY_NAME.fullmatch(name) is not None


class Storage:
    """A run's folder: ``root`` on the local disk (``fs`` None) or on the pyarrow filesystem ``fs``."""

    def __init__(self, root: str, fs: Any = None) -> None:
        self.fs = None if fs is None or fs.type_name == "local" else fs
        self.root = os.path.abspath(root) if self.fs is None else root.rstrip("/")

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

    @property
    def local(self) -> bool:
        return self.fs is None

    def shown(self, name: str | None = None) -> str:
        """The run folder (or its folder ``name``) as a user names it: a local path or a URL."""
        path = self.root if name is None else self.join(name)
        if self.fs is None:
            return path
        scheme = _SCHEMES.get(self.fs.type_name)
        return f"{scheme}://{path}" if scheme else f"{path} (on Ray's {self.fs.type_name} filesystem)"

    def status_path(self, given: str | None) -> str:
        """``given``, or the status file in the run folder: a local path, or the URL of the object."""
        if given is not None:
            return given
        if self.fs is None:
            return os.path.join(self.root, STATUS_FILE)
        scheme = _SCHEMES.get(self.fs.type_name)
        if scheme is None:
            raise TrainingStatusValueError(
                f"Cannot tell where to keep the status file of the Ray Train run in {self.root}: its storage is "
                f"Ray's {self.fs.type_name!r} filesystem, and trainstatus keeps a status file on a local disk or "
                f"on s3:// and gs:// by itself. Pass status_path= (a local path, or an s3://, gs:// or az:// URL).",
                path=self.root,
            )
        return f"{scheme}://{self.root}/{STATUS_FILE}"

    def join(self, name: str) -> str:
        return os.path.join(self.root, name) if self.fs is None else posixpath.join(self.root, name)

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

    # -- what is there ----------------------------------------------------------------------

    def sizes(self, name: str) -> dict[str, int]:
        """Every file in the checkpoint folder ``name`` (an object store's) with its size, keyed
        ``name/relative/path`` as a local folder's are recorded."""
        import pyarrow.fs

        folder, fs = self.join(name), self.fs
        assert fs is not None, "sizes() lists an object store's folder; a local one is read by new_entry"
        found = {}
        for info in fs.get_file_info(pyarrow.fs.FileSelector(folder, recursive=True, allow_not_found=True)):
            if info.type == pyarrow.fs.FileType.File:
                found[posixpath.join(name, posixpath.relpath(info.path, folder))] = int(info.size)
        return dict(sorted(found.items()))

    def exists(self, name: str) -> bool:
        """Is the folder ``name`` there (Ray removes the folders beyond ``num_to_keep``)?"""
        if self.fs is None:
            return os.path.isdir(self.join(name))
        import pyarrow.fs

        return bool(self.fs.get_file_info(self.join(name)).type != pyarrow.fs.FileType.NotFound)

    def problem(self, entry: Mapping[str, Any]) -> str | None:
        """Why the recorded checkpoint ``entry`` (on an object store) is not whole, or None: each
        recorded file there with its recorded size, read from one listing of its folder."""
        name = entry["file_path"]
        recorded = entry.get(FILES)
        if not isinstance(recorded, Mapping) or not recorded:
            return f"{name} has no files recorded"
        found = self.sizes(name)
        if not found:
            return f"{name} is missing"
        for path, size in recorded.items():
            if path not in found:
                return f"{path} is missing"
            if found[path] != size:
                return f"{path} has {found[path]:,} bytes, {size:,} recorded"
        return None

    def unrecorded(self, recorded: Iterable[str]) -> list[str]:
        """The folders of the run named as Ray names its checkpoints that are not in ``recorded``:
        uploads Ray had not registered when the run stopped (a worker or the controller lost in
        between), which its ``num_to_keep`` never removes. Oldest first."""
        if self.fs is None:
            try:
                names = [n for n in os.listdir(self.root) if os.path.isdir(os.path.join(self.root, n))]
            except OSError:
                return []
        else:
            import pyarrow.fs

            selector = pyarrow.fs.FileSelector(self.root, recursive=False, allow_not_found=True)
            names = [posixpath.basename(info.path) for info in self.fs.get_file_info(selector)
                     if info.type == pyarrow.fs.FileType.Directory]
        listed = set(recorded)
        return sorted(n for n in names if _RAY_NAME.fullmatch(n) and n not in listed)
