"""A run's resume decision, the same on every rank, as collectives of ``torch.distributed``.

1. Rank 0 chooses the checkpoint (``choose``: the status file and the checkpoints' metadata read
   once, not once per rank) and broadcasts it.
2. One rank per host (``hosts.Hosts.leads``) checks that its host sees each recorded file with its
   recorded size (``views.unseen``); the verdicts are gathered to rank 0.
3. If any host cannot, rank 0 raises ``TrainingStatusCheckpointNotShared`` naming the ranks and
   hosts that cannot, and every rank raises the same (``collectives.from_rank_0``); else every
   rank returns the same choice.

Every rank of a host sees the same files: one check a host, never one a rank, against a (often
shared, network) filesystem. Without a process group of two ranks or more, ``decide`` is
``choose()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..._checkpoints.files import FILES
from ..._errors import TrainingStatusCheckpointNotShared
from .collectives import from_rank_0, gather, group, hosts_of
from .hosts import Hosts, numbers
from .hosts import ranks
from .views import place, unseen

__all__ = ["decide", "entry_files"]

T = TypeVar("T")


def decide(choose: Callable[[], T], files: Callable[[T], Mapping[str, int]], root: str, *, what: str,
           timeout: float | None = None) -> T:
    """The resume decision ``choose()`` (rank 0 runs it), the same on every rank.

    ``files(chosen)`` are the chosen checkpoint's recorded files (paths relative to ``root``, with
    their sizes): one rank per host checks its host sees each with its size. If any cannot, every
    rank raises the same ``TrainingStatusCheckpointNotShared``; an error ``choose`` raised is
    raised on every rank. Without a process group: ``choose()``.
    """
    me = ranks()
    if me is None:
        return choose()
    doing = f"choosing {what}"
    link = group(timeout, doing)
    chosen = from_rank_0(choose, me, link, doing)
    hosts = hosts_of(link, me, doing)
    problem = None
    if chosen is not None and hosts.leads(me.rank):
        problem = unseen(root, files(chosen))
    # Every rank says which folder it names: one that names another than its host's leader (a
    # relative path from another working folder) checks its own below.
    reports = gather((place(root), problem), link, me, doing, "the check")
    failed: list[tuple[int, str]] = []

    def verdict() -> list[int]:
        assert reports is not None
        failed.extend((rank, why) for rank, (_, why) in enumerate(reports) if why is not None)
        strays = [rank for rank, (named, _) in enumerate(reports) if named != reports[hosts.leaders[rank]][0]]
        if failed and not strays:
            raise _not_shared(failed, hosts, set(), what)
        return strays

    strays = from_rank_0(verdict, me, link, doing, "the check")
    if strays:
        problem = unseen(root, files(chosen)) if chosen is not None and me.rank in strays else None
        more = gather(problem, link, me, doing, "the check")

        def again() -> None:
            assert more is not None
            failed.extend((rank, why) for rank, why in enumerate(more) if why is not None)
            if failed:
                raise _not_shared(sorted(failed), hosts, set(strays), what)

        from_rank_0(again, me, link, doing, "the check")
    return chosen


def _not_shared(failed: list[tuple[int, str]], hosts: Hosts, strays: set[int],
                what: str) -> TrainingStatusCheckpointNotShared:
    """The error every rank raises when the ranks ``failed`` (a host's leader, or a stray) checked
    for cannot resume."""
    every = sorted(rank for leader, _ in failed for rank in hosts.covered(leader, strays))
    listed = "; ".join(f"rank{'s' if len(hosts.covered(leader, strays)) > 1 else ''} "
                       f"{numbers(hosts.covered(leader, strays))} on {hosts.names[leader]}: {why}"
                       for leader, why in failed)
    return TrainingStatusCheckpointNotShared(
        f"Not every rank can resume from {what}: {listed}. Every rank must see the same checkpoint "
        f"folder (rank{'s' if len(every) > 1 else ''} {numbers(every)} cannot), so none resumes. Put the "
        "checkpoints on storage every node mounts at the same path (a shared filesystem), or copy "
        "the folder to every node's path, and start again.",
        ranks=every, hosts=sorted({hosts.names[leader] for leader, _ in failed}),
    )


def entry_files(entry: Mapping[str, Any] | None) -> dict[str, int]:
    """A recorded entry's files with their sizes (``files``), for ``decide``."""
    if entry is None or not isinstance(entry.get(FILES), Mapping):
        return {}
    return {name: size for name, size in entry[FILES].items() if type(size) is int}
