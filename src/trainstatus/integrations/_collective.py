"""A checkpoint's record and a run's resume decision as collectives of ``torch.distributed``.

When several processes write one checkpoint (each rank its RNG state, under FSDP, DeepSpeed or DCP
its shards), the record must wait for all of them, and every rank must resume from the same one.
This module rides on the process group the training engine already made (``torchrun``,
Accelerate, Lightning, Ray Train all initialize one): no barrier over files, no server of ours.

- ``record``: every rank calls it once its own save returned. Each rank fsyncs every file it sees
  in the checkpoint folder (its own among them: a writer's dirty pages are only flushed from its
  own machine), and the folders above; a ``monitored_barrier`` waits for every rank (naming the
  ones that do not arrive within the timeout); the ranks then gather to rank 0 what each sees of
  the folder (each file with its size, and the host); rank 0 checks that it sees every file any
  rank sees, with the same size, and only then records (``write``); its outcome (the entry, or the
  error) is broadcast, so every rank returns the same entry or raises the same error, and no rank
  goes on (and no rotation removes anything) before the record is on disk.
- ``decide``: rank 0 chooses the checkpoint (reading the status file and the checkpoints' metadata
  once, not once per rank) and broadcasts it; every rank checks it sees each recorded file with its
  recorded size; if any cannot, every rank raises the same ``TrainingStatusCheckpointNotShared``
  naming the ranks and hosts that cannot.

The collectives run on a gloo group of their own, made once per timeout (under NCCL too: objects
are gathered through gloo, never files' contents through anything). Without an initialized process
group of two or more ranks, ``record`` and ``decide`` are the one-process calls they wrap.

torch is never imported here: a process group exists only if the program imported
``torch.distributed``, so ``sys.modules`` says whether there is one.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .._checkpoints.files import FILES
from .._checkpoints.folders import sync_folders_above
from .._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointNotShared,
    TrainingStatusError,
)
from .._storage import atomic as _atomic
from ._collectives import DEFAULT_TIMEOUT, Ranks, ranks
from ._collectives import all_gather as _all_gather
from ._collectives import barrier as _barrier
from ._collectives import broadcast as _broadcast
from ._collectives import gather as _gather
from ._collectives import group as _group

__all__ = ["DEFAULT_TIMEOUT", "Ranks", "decide", "entry_fields", "entry_files", "ranks", "record"]

T = TypeVar("T")


def entry_fields() -> dict[str, Any]:
    """What a record made under a process group keeps in the checkpoint's entry besides ML-Agents'
    fields and ``files``: ``world_size``, the number of ranks that wrote it (none without a group).
    Pass it to ``CheckpointList._add(..., fields=...)`` in ``write``."""
    me = ranks()
    return {} if me is None else {"world_size": me.world_size}


def record(folder: str, status_path: str, write: Callable[[bool], dict[str, Any]], *, what: str,
           timeout: float | None = None) -> dict[str, Any]:
    """Record the checkpoint folder ``folder`` once every rank's files in it are durable.

    ``write(synced)`` records it (``CheckpointList.add``) and returns the entry; it runs on rank 0
    only, with ``synced=True`` (every file, the folder and the folders above up to
    ``status_path``'s are fsynced). Every rank returns the entry rank 0 recorded, or raises the
    error it raised. ``what`` names the checkpoint in messages (``"checkpoint-30 of /runs/a"``).
    Without a process group: ``write(False)`` (``add`` syncs the files itself).
    """
    me = ranks()
    if me is None:
        return write(False)
    group, seconds = _group(timeout)
    # 1. What this rank wrote is complete (its save returned): make it, and what it sees of the
    #    others', durable. A failure here is reported to rank 0 through the gather, not raised
    #    alone (a rank raising alone leaves the others waiting until the timeout).
    problem: str | None = None
    try:
        _sync_folder(folder, status_path)
    except OSError as exc:
        problem = f"syncing {exc.filename or folder} failed ({exc.strerror or exc})"
    # 2. Every rank's save has returned: from here on the files are final.
    _barrier(group, seconds, me, f"recording {what}")
    view: Mapping[str, int] | None = None
    if problem is None:
        try:
            view = _sizes(folder)
        except OSError as exc:
            problem = f"listing {exc.filename or folder} failed ({exc.strerror or exc})"
    doing = f"recording {what}"
    views = _gather((me.rank, me.host, view, problem), group, seconds, me, doing)
    own: dict[str, int] = {}  # rank 0's view, revalidated where another rank's differs

    def checked_write() -> dict[str, Any] | _Ask:
        assert views is not None
        own.update(_check_views(views, folder, what))
        missing = _missing(views, own)
        return _Ask(missing) if missing else write(True)

    # 3. Rank 0 checks what each rank sees against its own view, both ways, and writes; or, where
    #    another rank's listing lacks a file rank 0 sees (or shows another size), first asks that
    #    rank to open it (a listing may be stale on a network filesystem): only then is it refused.
    outcome = _from_rank_0(checked_write, me, group, seconds, doing)
    if isinstance(outcome, _Ask):
        asked = outcome.names.get(me.rank, [])
        answer = {name: _opened_size(os.path.join(folder, name)) for name in asked}
        answers = _gather((me.rank, me.host, answer), group, seconds, me, doing)

        def rechecked_write() -> dict[str, Any]:
            assert answers is not None
            _check_answers(answers, own, views[0][1] if views else "", folder, what)
            return write(True)

        outcome = _from_rank_0(rechecked_write, me, group, seconds, doing)
    return dict(outcome)


def decide(choose: Callable[[], T], files: Callable[[T], Mapping[str, int]], root: str, *, what: str,
           timeout: float | None = None) -> T:
    """The resume decision ``choose()`` (rank 0 runs it), the same on every rank.

    ``files(chosen)`` are the chosen checkpoint's recorded files (paths relative to ``root``, with
    their sizes): every rank checks it sees each with its size. If any rank cannot, every rank
    raises the same ``TrainingStatusCheckpointNotShared``; an error ``choose`` raised is raised on
    every rank. Without a process group: ``choose()``.
    """
    me = ranks()
    if me is None:
        return choose()
    group, seconds = _group(timeout)
    chosen = _from_rank_0(choose, me, group, seconds, f"choosing {what}")
    problem = None if chosen is None else _unseen(root, files(chosen))
    reports = _all_gather((me.rank, me.host, problem), group, seconds, me, f"choosing {what}")
    failed = [(rank, host, why) for rank, host, why in reports if why is not None]
    if failed:
        listed = "; ".join(f"rank {rank} on {host}: {why}" for rank, host, why in sorted(failed))
        which = ", ".join(str(rank) for rank, _, _ in sorted(failed))
        raise TrainingStatusCheckpointNotShared(
            f"Not every rank can resume from {what}: {listed}. Every rank must see the same checkpoint "
            f"folder (rank{'s' if len(failed) > 1 else ''} {which} cannot), so none resumes. Put the "
            "checkpoints on storage every node mounts at the same path (a shared filesystem), or copy "
            "the folder to every node's path, and start again.",
            ranks=[rank for rank, _, _ in sorted(failed)], hosts=sorted({host for _, host, _ in failed}),
        )
    return chosen


def _from_rank_0(produce: Callable[[], T], me: Ranks, group: Any, seconds: float, doing: str) -> T:
    """What ``produce()`` returns on rank 0, on every rank; if it raises, every rank raises it (the
    others a copy, ``_shipped``) and no rank waits for an answer that will not come."""
    outcome: Any = None
    if me.rank == 0:
        try:
            outcome = produce()
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, then rank 0 raises it
            _broadcast(_shipped(exc, me, doing), group, seconds, me, doing)
            raise
    outcome = _broadcast(outcome, group, seconds, me, doing)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome  # type: ignore[no-any-return]


def _shipped(exc: Exception, me: Ranks, doing: str) -> TrainingStatusError:
    """What the other ranks raise for the error rank 0 met: the same error when it is one of ours
    (they pickle whole), else a ``TrainingStatusError`` that names it (any other may not pickle)."""
    if isinstance(exc, TrainingStatusError):
        return exc
    return TrainingStatusError(
        f"Rank 0 on {me.host} failed {doing}: {type(exc).__name__}: {exc}. Rank 0 raised it; its output "
        "has the whole traceback."
    )


# -- the steps ----------------------------------------------------------------------------------


def _sync_folder(folder: str, status_path: str) -> None:
    """fsync every regular file under ``folder``, each folder in it (deepest first), ``folder``, and
    the folders above it up to ``status_path``'s.

    Another rank's save may still be running: a file or folder inside that is gone by the time it
    is opened (a temp file renamed to its final name: safetensors writes so) is passed by. Its
    writer's rank syncs what it became, once its own save returned, before the barrier."""
    folders: list[str] = []

    def gone_inside(exc: OSError) -> None:
        if not (isinstance(exc, FileNotFoundError) and exc.filename != folder):
            raise exc

    for current, subfolders, names in os.walk(folder, onerror=gone_inside):
        subfolders.sort()
        folders.append(current)
        for name in sorted(names):
            path = os.path.join(current, name)
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                continue
            try:
                _atomic.sync_file(fd)
            finally:
                os.close(fd)
    for current in reversed(folders):
        try:
            _atomic.sync_directory(current)
        except FileNotFoundError:
            if current == folder:
                raise
    sync_folders_above([folder], status_path)


def _sizes(folder: str) -> dict[str, int]:
    """Each regular file under ``folder`` (relative path) with its size: what this rank sees."""
    sizes: dict[str, int] = {}
    for current, subfolders, names in os.walk(folder, onerror=_raise):
        subfolders.sort()
        for name in sorted(names):
            path = os.path.join(current, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                sizes[os.path.relpath(path, folder)] = info.st_size
    return sizes


def _raise(exc: OSError) -> None:
    raise exc


class _Ask:
    """Rank 0's question instead of an outcome: the files (rank -> names) a rank's listing lacks or
    shows with another size than rank 0 sees; each such rank opens them and answers."""

    def __init__(self, names: dict[int, list[str]]) -> None:
        self.names = names


def _missing(views: list[Any], own: Mapping[str, int]) -> dict[int, list[str]]:
    """For each rank, the files of rank 0's view ``own`` that its view lacks or shows otherwise."""
    return {rank: names for rank, _, view, _ in views[1:]
            if (names := sorted(name for name, size in own.items() if view.get(name) != size))}


def _check_answers(answers: list[Any], own: Mapping[str, int], host_0: str, folder: str, what: str) -> None:
    """Rank 0's check of what the ranks it asked found when they opened the files (see ``_Ask``)."""
    problems = []
    for rank, host, answer in answers:
        unseen = sorted(name for name, size in answer.items() if size is None)
        differ = sorted(name for name, size in answer.items() if size is not None and size != own[name])
        if unseen:
            problems.append((rank, host, f"rank {rank} on {host} does not see {_some(unseen)}, which rank 0 on "
                                         f"{host_0} sees"))
        if differ:
            shown = ", ".join(f"{name} ({answer[name]} bytes, rank 0 sees {own[name]})" for name in differ[:3])
            problems.append((rank, host, f"rank {rank} on {host} sees {shown}{' and more' if len(differ) > 3 else ''}"))
    if problems:
        raise _not_shared(what, folder, [why for _, _, why in problems], [r for r, _, _ in problems],
                          [h for _, h, _ in problems])


def _not_shared(what: str, folder: str, problems: list[str], ranks: list[int],
                hosts: list[str]) -> TrainingStatusCheckpointNotShared:
    return TrainingStatusCheckpointNotShared(
        f"Cannot record {what}: the ranks do not see the same files in {folder}: {'; '.join(problems)}. "
        "Nothing was recorded. Every rank must write its files into one folder that every node sees at "
        "the same path (a shared filesystem); node-local output folders cannot hold a checkpoint that "
        "every rank resumes from.",
        ranks=sorted(set(ranks)), hosts=sorted(set(hosts)), file_path=folder,
    )


def _check_views(views: list[Any], folder: str, what: str) -> dict[str, int]:
    """Rank 0's check of what every rank sees: each file any rank sees is seen by rank 0, with the
    same size; rank 0's view (revalidated where another differs). Raises the error every rank will
    raise. (The other way, files rank 0 sees that another rank's listing lacks: ``_missing``.)"""
    failed = [f"rank {rank} on {host}: {problem}" for rank, host, _, problem in views if problem is not None]
    if failed:
        raise TrainingStatusCheckpointError(
            f"Cannot record {what}: {'; '.join(failed)}. Nothing was recorded. Check that rank's disk and the "
            "folder's permissions; the next save is recorded as usual once they are fixed.",
            file_path=folder,
        )
    problems: list[str] = []
    own = dict(views[0][2])
    for rank, host, view, _ in views:
        for name, size in view.items():
            if own.get(name) != size:  # rank 0's listing may be stale (NFS caches them): open it to be sure
                fresh = _opened_size(os.path.join(folder, name))
                if fresh is not None:
                    own[name] = fresh
        unseen = sorted(name for name in view if name not in own)
        differ = sorted(name for name, size in view.items() if name in own and own[name] != size)
        if unseen:
            problems.append(f"rank {rank} on {host} wrote {_some(unseen)}, which rank 0 on {views[0][1]} does not see")
        if differ:
            shown = ", ".join(f"{name} ({view[name]} bytes, rank 0 sees {own[name]})" for name in differ[:3])
            problems.append(f"rank {rank} on {host} sees {shown}{' and more' if len(differ) > 3 else ''}")
    if problems:
        odd = [(rank, host) for rank, host, view, _ in views if any(own.get(n) != z for n, z in view.items())]
        raise _not_shared(what, folder, problems, [rank for rank, _ in odd], [host for _, host in odd])
    return own


def _opened_size(path: str) -> int | None:
    """The size of ``path`` as opening it shows (which revalidates a network filesystem's cached
    attributes, where a listing or a ``stat`` may be stale), or None when it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _unseen(root: str, files: Mapping[str, int]) -> str | None:
    """Why this rank cannot use the recorded files (relative to ``root``), or None."""
    for name, size in files.items():
        path = os.path.join(root, name)
        try:
            seen: int | None = os.stat(path).st_size
        except OSError:
            seen = None
        if seen != size:
            seen = _opened_size(path)  # a stale cached attribute (NFS) or negative lookup is not the answer
        if seen is None:
            return f"{path} is not there"
        if seen != size:
            return f"{path} has {seen} bytes, {size} recorded"
    return None


def entry_files(entry: Mapping[str, Any] | None) -> dict[str, int]:
    """A recorded entry's files with their sizes (``files``), for ``decide``."""
    if entry is None or not isinstance(entry.get(FILES), Mapping):
        return {}
    return {name: size for name, size in entry[FILES].items() if type(size) is int}
