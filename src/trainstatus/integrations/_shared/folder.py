"""A folder of checkpoints on a local disk or an object store, and what is in it, by metadata alone.

The one checkpoint-storage seam of the integrations whose libraries write to object stores. Ray
Train reaches its storage through a ``pyarrow.fs`` filesystem; Lightning (``ModelCheckpoint``'s
``dirpath`` on ``s3://``, ``gs://``, ``az://``) through an ``fsspec`` one. ``Folder`` answers the
same questions for a local folder and for either kind of filesystem: which files a checkpoint (a
folder, or one object) holds and their sizes, whether it is there, whether a recorded one is still
whole, and what the folder holds. ``choose`` is the resume's rule over an object store's list.

Metadata only: a listing and the sizes in it (one LIST request per checkpoint on an object store);
no object is opened. An object on a store is whole once its upload was acknowledged (a PUT, or a
multipart upload completed, is seen whole or not at all), so the size recorded then, read again
from a listing, says whether the object is still the one recorded.

Imports no filesystem library itself: the caller hands in the filesystem (Ray's), or ``of_url``
asks fsspec for the one the URL names (the instance Lightning itself writes with: fsspec caches
them by their arguments).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping
from typing import Any

from ..._checkpoints.checkpoint_list import as_list
from ..._checkpoints.files import CHECKPOINTS, FILES
from ..._errors import TrainingStatusCheckpointError, TrainingStatusError, TrainingStatusValueError

__all__ = ["Folder", "choose", "given_status", "is_remote", "listed_entries", "open_status", "refuse_remote_status",
           "rewrite"]

# A filesystem's name -> the URL scheme trainstatus opens a status file of that store with
# (_remote.location), where the folder's path on that filesystem is the same bucket/prefix. pyarrow's
# type_name: its Azure filesystem ("abfs") is left out, as its path drops the storage account. An
# fsspec folder's own URL scheme: adlfs's az://container/path names the account as trainstatus's
# Azure store does (from the environment or storage options); abfs[s]://c@account... does not.
_ARROW_SCHEMES = {"s3": "s3", "gcs": "gs"}
_FSSPEC_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az"}


def is_remote(path: str) -> bool:
    """A URL of a filesystem other than the local one (``file://`` is local)."""
    return "://" in path and not path.startswith("file://")


class Folder:
    """A folder of checkpoints: ``root`` on the local disk (``fs`` None), or on the pyarrow or
    fsspec filesystem ``fs`` (``root`` then as that filesystem names it: ``bucket/prefix``)."""

    def __init__(self, root: str, fs: Any = None) -> None:
        self.fs: Any = None if fs is None or _name(fs) in ("local", "file") else fs
        self.root = os.path.abspath(root) if self.fs is None else root.rstrip("/")
        self.url: str | None = None  # the URL it was made from (of_url), as the user gave it
        self._files: _Arrow | _Fsspec | None = (None if self.fs is None else
                                                _Arrow(self.fs) if hasattr(self.fs, "type_name") else _Fsspec(self.fs))

    @classmethod
    def of_url(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> Folder:
        """The folder ``url`` (``s3://bucket/prefix``) on the fsspec filesystem it names; a local
        path is a local folder. Raises ``TrainingStatusValueError`` when fsspec cannot reach it."""
        if not is_remote(url):
            return cls(url[len("file://"):] if url.startswith("file://") else url)
        try:
            import fsspec.core

            fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except (ImportError, ValueError) as exc:  # fsspec or the scheme's filesystem missing, or a bad URL
            raise TrainingStatusValueError(
                f"Cannot reach the checkpoint folder {url}: {exc}. If the fsspec filesystem of that store is not "
                "installed, install it (s3fs for s3://, gcsfs for gs://, adlfs for az://), as the training library "
                "itself needs it to write there; else fix the URL or the store's settings.",
                path=url,
            ) from exc
        made = cls(root, fs)
        made.url = url.rstrip("/")
        return made

    @property
    def local(self) -> bool:
        return self.fs is None

    @property
    def scheme(self) -> str | None:
        """The URL scheme of the status file on this folder's store, or None (local, or a store trainstatus
        keeps no status file on)."""
        if self.fs is None:
            return None
        if self._files is not None and isinstance(self._files, _Arrow):
            return _ARROW_SCHEMES.get(_name(self.fs))
        given = (self.url or "").partition("://")[0]
        return _FSSPEC_SCHEMES.get(given.lower())

    def shown(self, name: str | None = None) -> str:
        """The folder (or its checkpoint ``name``) as a user names it: a local path or a URL."""
        path = self.root if name is None else self.join(name)
        if self.fs is None:
            return path
        if self.url is not None:
            return self.url if name is None else f"{self.url}/{name}"
        return f"{self.scheme}://{path}" if self.scheme else f"{path} (on the {_name(self.fs)!r} filesystem)"

    def status_path(self, given: str | None, file_name: str, whose: str) -> str:
        """``given``, or the status file ``file_name`` in this folder: a local path or an object's URL.
        ``whose`` names the folder in the refusal (``the Ray Train run``)."""
        if given is not None:
            return given
        if self.fs is None:
            return os.path.join(self.root, file_name)
        if self.scheme is None:
            raise TrainingStatusValueError(
                f"Cannot tell where to keep the status file of {whose} in {self.url or self.root}: its storage is the "
                f"{_name(self.fs)!r} filesystem, and trainstatus keeps a status file on a local disk or on s3://, gs:// "
                f"and az:// by itself. Pass status_path= (a local path, or an s3://, gs:// or az:// URL).",
                path=self.root,
            )
        return f"{self.scheme}://{self.root}/{file_name}"

    def join(self, name: str) -> str:
        return os.path.join(self.root, name) if self.fs is None else posixpath.join(self.root, name)

    # -- what is there (an object store's: a local folder is read by _checkpoints) -------------

    def _ask(self, question: Callable[[], Any], about: str, doing: str = "list") -> Any:
        """``question()`` of the store, its failure (credentials, endpoint, permissions, a network
        error: the filesystem's own exception) as a ``TrainingStatusCheckpointError`` naming the folder."""
        try:
            return question()
        except TrainingStatusError:
            raise
        except Exception as exc:  # noqa: BLE001 - s3fs, gcsfs, adlfs and pyarrow each raise their own
            raise TrainingStatusCheckpointError(
                f"Cannot {doing} {self.shown(about or None)}: {type(exc).__name__}: {exc}. Check the store's "
                "credentials, endpoint and permissions (the training library reaches it with the same ones).",
                path=self.shown()) from exc

    def sizes(self, name: str) -> dict[str, int]:
        """Every file of the checkpoint ``name`` (a folder, or one object) with its size, keyed
        ``name`` for an object and ``name/relative/path`` for a folder's, as local ones are recorded."""
        assert self._files is not None, "sizes() lists an object store's; a local checkpoint is read by new_entry"
        files = self._files
        path = self.join(name)
        found = self._ask(lambda: files.files(path), name)
        return dict(sorted((name if relative == "" else posixpath.join(name, relative), size)
                           for relative, size in found.items()))

    def exists(self, name: str) -> bool:
        """Is the checkpoint ``name`` there (a folder, or an object)?"""
        return self.kind(name) is not None

    def kind(self, name: str) -> str | None:
        """``"file"``, ``"directory"`` or None (not there) for ``name`` in this folder."""
        if self._files is None:
            path = self.join(name)
            return "directory" if os.path.isdir(path) else "file" if os.path.exists(path) else None
        files = self._files
        return self._ask(lambda: files.kind(self.join(name)), name)  # type: ignore[no-any-return]

    def children(self) -> list[tuple[str, str]]:
        """The names in this folder, each with its kind (``"file"`` or ``"directory"``); none when it is not there."""
        if self._files is None:
            try:
                return sorted((n, "directory" if os.path.isdir(self.join(n)) else "file") for n in os.listdir(self.root))
            except OSError:
                return []
        files = self._files
        return self._ask(lambda: files.children(self.root), "")  # type: ignore[no-any-return]

    def remove(self, name: str) -> None:
        """Remove the checkpoint ``name`` of an object store's folder (every object under it)."""
        assert self._files is not None, "remove() is an object store's; a local folder is removed by _shared.upkeep"
        files = self._files
        self._ask(lambda: files.remove(self.join(name)), name, "remove")

    def problem(self, entry: Mapping[str, Any]) -> str | None:
        """Why the recorded checkpoint ``entry`` (on an object store) is not whole, or None: each
        recorded file there with its recorded size, read from one listing."""
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
                return f"{path} has {found[path]:,} bytes, {size:,} recorded" if type(size) is int else (
                    f"{path} has {found[path]:,} bytes, and its recorded size {size!r} is not a number")
        return None


def given_status(path: str) -> str:
    """A status path as given: a URL as it is, a local path absolute."""
    return path if "://" in path else os.path.abspath(path)


def open_status(path: str) -> Any:
    """The status file of checkpoints on an object store: an object (one not there reads as empty),
    or a local file put back from its history when it was lost, as every local resume does."""
    from ..._store import StatusStore
    from .choice import recorded

    return StatusStore(path) if is_remote(path) else StatusStore(path, resume=recorded(path))


def rewrite(store: Any, category: str, change: Callable[[list[Any]], list[Any]]) -> None:
    """Set ``category``'s checkpoints to ``change(the list now)``, in one transaction (run again on a
    newer list when another writer came first)."""
    from ..._committing import retold

    def body(store: Any) -> None:
        store.set(category, CHECKPOINTS, change(listed_entries(store, category)))

    with retold("record the checkpoint again"):
        store.run_transaction(body)


def refuse_remote_status(given: str | None, folder: str, listed: str, instead: str) -> None:
    """Refuse a status file on remote storage for checkpoints in the local ``folder``: made absolute
    as a local path (``<cwd>/s3:/...``) it would never be found again, every resume a fresh run.
    ``listed`` names what it would list, ``instead`` the remote form that keeps one there."""
    if given is not None and is_remote(given):
        raise TrainingStatusValueError(
            f"The status file {given} is on remote storage and the {listed} it would list are in the local folder "
            f"{folder}: trainstatus keeps a status file on an object store for {listed} there ({instead}). Pass a "
            f"local status_path=, or none (training_status.json beside the {listed}). Nothing was read or changed.",
            path=given)


def listed_entries(store: Any, category: str) -> list[Any]:
    """The checkpoints ``category`` of the status file ``store`` lists (none when it lists none), or
    a ``TrainingStatusValueError`` saying how to fix a value that is not a list."""
    return list(as_list(store.get(category, CHECKPOINTS), store.path, category))


def choose(folder: Folder, entries: list[Any], check: Callable[[dict[str, Any]], bool] | None = None
           ) -> tuple[dict[str, Any] | None, list[tuple[Any, str]]]:
    """The resume's rule on an object store (``_shared.choice.choose``'s, by listings): the entry
    with the highest ``steps`` (the later recorded of equal ones) whose files are all there with
    their recorded sizes, and that ``check`` passes (it raises a ValueError saying why not, as the
    checks of ``_formats`` do), and the newer ones passed over with why, newest first."""

    def newness(index: int) -> tuple[bool, int, int]:
        steps = entries[index].get("steps") if isinstance(entries[index], Mapping) else None
        return (True, steps, index) if type(steps) is int else (False, 0, index)

    skipped: list[tuple[Any, str]] = []
    for index in sorted(range(len(entries)), key=newness, reverse=True):
        entry = entries[index]
        if not (isinstance(entry, Mapping) and isinstance(entry.get("file_path"), str)
                and type(entry.get("steps")) is int):
            skipped.append((entry, f"an item of the list is not a checkpoint entry: {str(entry)[:80]}"))
            continue
        why = folder.problem(entry)
        if why is None and check is not None:
            try:
                check(dict(entry))
            except ValueError as exc:
                why = str(exc)
        if why is None:
            return dict(entry), skipped
        skipped.append((entry, why))
    return None, skipped


# -- the two kinds of filesystem ----------------------------------------------------------------


def _name(fs: Any) -> str:
    """pyarrow's ``type_name``, or fsspec's first protocol."""
    if hasattr(fs, "type_name"):
        return str(fs.type_name)
    protocol = getattr(fs, "protocol", "")
    return str(protocol[0] if isinstance(protocol, (tuple, list)) else protocol)


class _Arrow:
    """A ``pyarrow.fs`` filesystem (Ray's)."""

    def __init__(self, fs: Any) -> None:
        import pyarrow.fs

        self.fs, self._pa = fs, pyarrow.fs

    def files(self, path: str) -> dict[str, int]:
        """Each file under ``path`` (relative to it), or ``path`` itself (keyed ``""``) when it is a file."""
        selector = self._pa.FileSelector(path, recursive=True, allow_not_found=True)
        found = {posixpath.relpath(i.path, path): int(i.size) for i in self.fs.get_file_info(selector)
                 if i.type == self._pa.FileType.File}
        if found:  # a folder (Ray's checkpoints): one LIST
            return found
        info = self.fs.get_file_info(path)
        return {"": int(info.size)} if info.type == self._pa.FileType.File else {}

    def kind(self, path: str) -> str | None:
        found = self.fs.get_file_info(path).type
        return ("file" if found == self._pa.FileType.File else
                "directory" if found == self._pa.FileType.Directory else None)

    def remove(self, path: str) -> None:
        self.fs.delete_dir(path)

    def children(self, path: str) -> list[tuple[str, str]]:
        selector = self._pa.FileSelector(path, recursive=False, allow_not_found=True)
        return sorted((posixpath.basename(i.path), "directory" if i.type == self._pa.FileType.Directory else "file")
                      for i in self.fs.get_file_info(selector) if i.type != self._pa.FileType.NotFound)


class _Fsspec:
    """An fsspec filesystem (Lightning's). Its listings are cached per instance (s3fs's dircache):
    every question drops the cache of the path first, so another process's upload is seen."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def _fresh(self, path: str) -> None:
        # s3fs and gcsfs drop the listings above a path with it; adlfs only the path's own entry.
        self.fs.invalidate_cache(path)
        self.fs.invalidate_cache(posixpath.dirname(path))

    def files(self, path: str) -> dict[str, int]:
        self._fresh(path)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return {}
        if info.get("type") == "file":
            return {"": int(info["size"])}
        found = self.fs.find(path, detail=True)
        return {posixpath.relpath(p.rstrip("/"), path): int(i["size"]) for p, i in found.items()
                if i.get("type") == "file"}

    def kind(self, path: str) -> str | None:
        self._fresh(path)
        try:
            found = self.fs.info(path).get("type")
        except FileNotFoundError:
            return None
        return "file" if found == "file" else "directory"

    def remove(self, path: str) -> None:
        self.fs.rm(path, recursive=True)
        self.fs.invalidate_cache(path)

    def children(self, path: str) -> list[tuple[str, str]]:
        self._fresh(path)
        try:
            listed = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        return sorted((posixpath.basename(i["name"].rstrip("/")), "file" if i.get("type") == "file" else "directory")
                      for i in listed)
