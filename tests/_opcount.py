"""Counting the metadata operations a record or a resume decision makes on a checkpoint's files.

    with Count(folder, who=world.rank) as count:      # or who=lambda: 0 in a process of one rank
        ...record or decide...
    count.total("fsync"), count.by("listing")        # all ranks; per rank

What is counted, each only for a path inside ``folder`` (the folder itself included):

- ``fsync``: ``trainstatus._storage.atomic.sync_file`` of a file there (whatever stands behind it:
  the real fsync, or tests/_fake_group.py's recorder); ``fsync_dir``: ``sync_directory`` of a folder;
- ``open``: ``os.open`` and the builtin ``open`` of a file (not of a folder: that is a listing or
  a folder's fsync);
- ``stat``: ``os.stat`` and ``os.lstat`` (``os.path.exists``/``isfile``/``getsize`` call these);
- ``listing``: ``os.scandir`` and ``os.listdir`` of a folder (``os.walk`` calls ``scandir``).

A ``stat`` a ``DirEntry`` makes by itself is not seen (on Linux ``is_dir``/``is_file`` come with
the listing). The counts are what the benchmark (benchmarks/ranks_cost.py) reports and what
tests/test_ranks_cost.py bounds; ``who()`` names the rank that made the call.
"""

from __future__ import annotations

import builtins
import collections
import io
import os
import threading
from collections.abc import Callable
from typing import Any

from trainstatus._storage import atomic as _atomic

KINDS = ("fsync", "fsync_dir", "open", "stat", "listing")


class Count:
    def __init__(self, folder: str | os.PathLike[str], who: Callable[[], int | None] = lambda: 0) -> None:
        self.folder = os.path.realpath(folder)
        self.who = who
        self.calls: collections.Counter[tuple[int | None, str]] = collections.Counter()
        self.paths: list[tuple[int | None, str, str]] = []
        self.lock = threading.Lock()
        self.saved: list[tuple[Any, str, Any]] = []

    def inside(self, path: Any) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        try:  # abspath: no system call of its own (realpath's lstat would be counted, and recurse)
            real = os.path.abspath(os.fsdecode(os.fspath(path)))
        except (TypeError, ValueError):
            return None
        if not (real == self.folder or real.startswith(self.folder + os.sep)):
            return None
        return real

    def note(self, kind: str, path: Any) -> None:
        real = self.inside(path)
        if real is not None:
            rank = self.who()
            with self.lock:
                self.calls[(rank, kind)] += 1
                self.paths.append((rank, kind, real))

    def total(self, kind: str) -> int:
        return sum(n for (_, k), n in self.calls.items() if k == kind)

    def by(self, kind: str) -> dict[int | None, int]:
        return {rank: n for (rank, k), n in sorted(self.calls.items(), key=lambda item: str(item[0])) if k == kind}

    def of(self, kind: str) -> collections.Counter[str]:
        """How many times each path was the subject of ``kind``."""
        return collections.Counter(path for _, k, path in self.paths if k == kind)

    def _patch(self, owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def __enter__(self) -> Count:
        real_open, real_os_open = builtins.open, os.open
        real_stat, real_lstat, real_scandir, real_listdir = os.stat, os.lstat, os.scandir, os.listdir
        real_sync_file, real_sync_directory = _atomic.sync_file, _atomic.sync_directory
        directory_flag = getattr(os, "O_DIRECTORY", 0)
        count = self

        def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if not flags & directory_flag:
                count.note("open", path)
            return real_os_open(path, flags, *args, **kwargs)

        def opened(file: Any, *args: Any, **kwargs: Any) -> Any:
            count.note("open", file)
            return real_open(file, *args, **kwargs)

        def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            count.note("stat", path)
            return real_stat(path, *args, **kwargs)

        def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            count.note("stat", path)
            return real_lstat(path, *args, **kwargs)

        def scandir(path: Any = ".") -> Any:
            count.note("listing", path)
            return real_scandir(path)

        def listdir(path: Any = ".") -> list[Any]:
            count.note("listing", path)
            return real_listdir(path)

        def sync_file(fd: int) -> None:
            count.note("fsync", os.readlink(f"/proc/self/fd/{fd}"))
            real_sync_file(fd)

        def sync_directory(directory: str) -> None:
            count.note("fsync_dir", directory)
            real_sync_directory(directory)

        for owner, name, wrapper in ((builtins, "open", opened), (io, "open", opened), (os, "open", os_open),
                                     (os, "stat", stat), (os, "lstat", lstat), (os, "scandir", scandir),
                                     (os, "listdir", listdir), (_atomic, "sync_file", sync_file),
                                     (_atomic, "sync_directory", sync_directory)):
            self._patch(owner, name, wrapper)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved.clear()

    def summary(self) -> dict[str, int]:
        return {kind: self.total(kind) for kind in KINDS}
