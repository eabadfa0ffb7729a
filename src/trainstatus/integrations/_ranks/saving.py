"""A checkpoint's record once every rank's files in it are durable, as collectives of
``torch.distributed``: every rank calls ``record`` once its own save returned.

1. A barrier (``monitored_barrier``, naming the ranks that do not arrive within the timeout): every
   rank's save has returned, so from here on the files are final.
2. One rank per host (``hosts.Hosts.leads``) fsyncs every file its host sees in the folder, the
   folders in it and the folders above, and lists them with their sizes, in one walk
   (``views.survey``): a writer's dirty pages are flushed only from its own machine, and every
   rank of a machine sees the same files, so one walk a host covers every file written there.
3. The hosts' views are gathered to rank 0 as digests (``views.digest``): on a shared filesystem
   every host sees the same, and rank 0 compares one short string per host with its own. Hosts
   whose digest differs are sent rank 0's view and answer with the differences: each first opens
   the files of rank 0's view its listing lacks or shows with another size (a listing may be stale on a
   network filesystem), and rank 0 opens those of theirs it lacks, before anything is refused.
4. Rank 0 records (``write``) only when every host sees every file with the same size; its outcome
   (the entry, or the error) is broadcast, so every rank returns the same entry or raises the same
   error, and no rank goes on (and no rotation removes anything) before the record is on disk.

What reaches rank 0 grows with the hosts (a digest each, and the differences of the hosts that
differ), not with ranks times files; the collectives run on a gloo group of their own
(``collectives``). Without a process group of two ranks or more, ``record`` is the one-process
write it wraps.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ..._errors import TrainingStatusCheckpointError, TrainingStatusCheckpointNotShared
from .collectives import barrier, from_rank_0, gather, group, hosts_of
from .hosts import Hosts, numbers
from .hosts import ranks
from .views import digest, opened_size, place, survey

__all__ = ["entry_fields", "record"]


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
    doing = f"recording {what}"
    link = group(timeout, doing)
    barrier(link, me, doing)
    hosts = hosts_of(link, me, doing)
    leads = hosts.leads(me.rank)
    view: dict[str, int] = {}
    problem: str | None = None
    if leads:
        view, problem = _walk(folder, status_path)
    # A failure of a host's walk is reported to rank 0 through the gather, not raised alone (a rank
    # raising alone leaves the others waiting until the timeout). Every rank says which folder it
    # names: one that names another than its host's leader walks its own below.
    reports = gather((place(folder), digest(view), problem) if leads else (place(folder),), link, me, doing)

    def first() -> dict[str, Any] | _Ask:
        assert reports is not None
        _refuse_failures([(rank, report[2]) for rank, report in enumerate(reports) if len(report) == 3],
                         hosts, set(), folder, what)
        mine = digest(view)
        differ = [rank for rank, report in enumerate(reports) if len(report) == 3 and report[1] != mine]
        strays = [rank for rank, report in enumerate(reports) if report[0] != reports[hosts.leaders[rank]][0]]
        return _Ask(differ + strays, view, strays) if differ or strays else write(True)

    outcome = from_rank_0(first, me, link, doing)
    if not isinstance(outcome, _Ask):
        return dict(outcome)
    asked = outcome
    strays = set(asked.strays)
    answer: tuple[Any, ...] | None = None
    if me.rank in strays:
        view, problem = _walk(folder, status_path)
        if problem is not None:
            answer = ({}, {}, f"{problem}; this rank names another folder than its host's other ranks")
    if me.rank in asked.ranks and answer is None:
        # Only the differences: this host's files rank 0 lists otherwise or not at all, and rank
        # 0's files this host lists otherwise, opened (a stale listing is not the answer).
        extra = {name: size for name, size in view.items() if asked.view.get(name) != size}
        answer = (extra, {name: opened_size(os.path.join(folder, name))
                          for name, size in asked.view.items() if view.get(name) != size}, None)
    answers = gather(answer, link, me, doing)
    own: dict[str, int] = {}

    def second() -> dict[str, Any] | _Confirm:
        assert answers is not None
        _refuse_failures([(rank, answer[2]) for rank, answer in enumerate(answers) if answer is not None],
                         hosts, strays, folder, what)
        own.update(_compare(view, answers, hosts, strays, folder, what))
        # Files rank 0 found only by opening them (its own listing was stale): every other host
        # must see them too, the hosts that were not asked (their digest matched the stale
        # listing) as much as those that were.
        added = {name: size for name, size in own.items() if view.get(name) != size}
        return _Confirm(added) if added else write(True)

    checked = from_rank_0(second, me, link, doing)
    if not isinstance(checked, _Confirm):
        return dict(checked)
    names = checked.names
    confirm = None
    if me.rank != 0 and (leads or me.rank in strays):
        confirm = {name: opened_size(os.path.join(folder, name)) for name in names}
    confirms = gather(confirm, link, me, doing)

    def third() -> dict[str, Any]:
        assert confirms is not None
        _compare(own, [None if seen is None else ({}, seen, None) for seen in confirms], hosts, strays, folder,
                 what, listed=names)
        return write(True)

    return dict(from_rank_0(third, me, link, doing))


def _walk(folder: str, status_path: str) -> tuple[dict[str, int], str | None]:
    """``views.survey``, or what failed, said for rank 0's message (never raised alone: see ``record``)."""
    try:
        return survey(folder, status_path), None
    except (OSError, ValueError) as exc:
        return {}, f"syncing {getattr(exc, 'filename', None) or folder} failed ({getattr(exc, 'strerror', None) or exc})"


class _Confirm:
    """Rank 0's second question: the files it found only by opening them, with their sizes; every
    host's leader and every stray opens them and answers."""

    def __init__(self, names: dict[str, int]) -> None:
        self.names = names


class _Ask:
    """Rank 0's question instead of an outcome: the ranks that answer (host leaders whose view's
    digest differs from rank 0's, and ``strays``, ranks naming another folder than their host's
    leader, which walk their own first), and rank 0's view, so that each answers with the
    differences, having opened the files of it its own listing lacks."""

    def __init__(self, ranks: list[int], view: dict[str, int], strays: list[int]) -> None:
        self.ranks, self.view, self.strays = ranks, view, strays


def _refuse_failures(problems: list[tuple[int, str | None]], hosts: Hosts, strays: set[int], folder: str,
                     what: str) -> None:
    """Refuse when a walk failed: named by the ranks it stood for (a host's, or a stray's own)."""
    failed = [f"{_who(hosts.covered(rank, strays))} on {hosts.names[rank]}: {problem}"
              for rank, problem in problems if problem is not None]
    if failed:
        raise TrainingStatusCheckpointError(
            f"Cannot record {what}: {'; '.join(failed)}. Nothing was recorded. Check that rank's disk and the "
            "folder's permissions; the next save is recorded as usual once they are fixed.",
            file_path=folder,
        )


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {numbers(ranks)}"


def _compare(own: Mapping[str, int], answers: list[Any], hosts: Hosts, strays: set[int], folder: str,
             what: str, listed: Mapping[str, int] | None = None) -> dict[str, int]:
    """Rank 0's check of the hosts it asked (see ``_Ask``), from the differences each sent: each
    file any host sees, rank 0 sees with the same size, and each file rank 0 sees, every host does.
    Where they differ, rank 0 first opens the file itself (its own listing may be the stale one)."""
    own = dict(own)
    listed = dict(own if listed is None else listed)  # what the asked hosts were asked of (and opened)
    seen: list[tuple[int, dict[str, int | None]]] = []
    for rank, answer in enumerate(answers):
        if answer is None:
            continue
        extra, reopened, _ = answer
        theirs: dict[str, int | None] = {**listed, **extra, **reopened}  # the host's view
        for name, size in extra.items():
            if own.get(name) != size:
                fresh = opened_size(os.path.join(folder, name))
                if fresh is not None:
                    own[name] = fresh
        seen.append((rank, theirs))
    host_0 = hosts.names[0]
    problems: list[tuple[int, str]] = []  # what the hosts saw that rank 0 does not
    lacking: list[tuple[int, str]] = []  # what rank 0 sees that a host does not: said when nothing else is
    for rank, theirs in seen:
        ranks = hosts.covered(rank, strays)
        who = _who(ranks)
        sees, does = ("sees", "does") if len(ranks) == 1 else ("see", "do")
        host = hosts.names[rank]
        unseen_by_0 = sorted(name for name, size in theirs.items() if size is not None and name not in own)
        differ = sorted(name for name, size in theirs.items() if size is not None and name in own and own[name] != size)
        unseen_by_them = sorted(name for name in listed if theirs.get(name) is None)
        if unseen_by_0:
            problems.append((rank, f"{who} on {host} wrote {_some(unseen_by_0)}, which rank 0 on {host_0} does not "
                                   "see"))
        if differ:
            shown = ", ".join(f"{name} ({theirs[name]} bytes, rank 0 sees {own[name]})" for name in differ[:3])
            problems.append((rank, f"{who} on {host} {sees} {shown}{' and more' if len(differ) > 3 else ''}"))
        if unseen_by_them:
            lacking.append((rank, f"{who} on {host} {does} not see {_some(unseen_by_them)}, which rank 0 on {host_0} "
                                  "sees"))
    problems = problems or lacking
    if problems:
        named = sorted({rank for rank, _ in problems})
        raise TrainingStatusCheckpointNotShared(
            f"Cannot record {what}: the ranks do not see the same files in {folder}: "
            f"{'; '.join(why for _, why in problems)}. Nothing was recorded. Every rank must write its files into "
            "one folder that every node sees at the same path (a shared filesystem); node-local output folders "
            "cannot hold a checkpoint that every rank resumes from.",
            ranks=sorted(rank for leader in named for rank in hosts.covered(leader, strays)),
            hosts=sorted({hosts.names[rank] for rank in named}), file_path=folder,
        )
    return own


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

