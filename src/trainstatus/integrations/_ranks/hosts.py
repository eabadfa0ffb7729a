"""Who this process is in a process group: its rank, the world size, and the host it runs on.

A host, for the many-rank protocol, is a view of the files: one kernel (its page cache, which an
fsync flushes, belongs to the machine, not to a rank) and one mount namespace (what the paths
name). Ranks that share one need only one of them to fsync and list a checkpoint folder; the
lowest rank of each host does (``Hosts.leads``). The key (``Distributed.machine``) is the host
name, the kernel's boot id and the mount namespace: two containers given the same host name on
two machines differ by their boot ids, two containers of one machine with folders of their own by
their mount namespaces. Where ``/proc`` cannot tell, every rank is a host of its own (each fsyncs
and lists: slower, never wrong).

``Distributed`` is the seam tests replace (tests/_fake_group.py): this process's way to
``torch.distributed``, its host, and what the collectives keep per process. torch is never
imported here: a process group exists only if the program imported ``torch.distributed``, so
``sys.modules`` says whether there is one.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import uuid
from typing import Any

__all__ = ["Distributed", "Hosts", "Ranks", "distributed", "numbers", "ranks"]


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place in the default process group."""

    rank: int
    world_size: int
    host: str


@dataclasses.dataclass(frozen=True)
class Hosts:
    """The hosts of a process group. ``leading``: the lowest rank of each host, the one that
    fsyncs, lists and checks files for every rank there (every rank knows these). ``names`` and
    ``leaders`` (for each rank, its host's name and its host's leader) are known on rank 0 alone,
    which alone words the messages: every rank learning every rank's host would cost ranks squared."""

    leading: frozenset[int]
    names: tuple[str, ...] = ()
    leaders: tuple[int, ...] = ()

    @classmethod
    def of(cls, seen: list[tuple[str, str]]) -> Hosts:
        """From each rank's ``(machine key, host name)``, in rank order (rank 0's view)."""
        first: dict[str, int] = {}
        for rank, (key, _) in enumerate(seen):
            first.setdefault(key, rank)
        return cls(frozenset(first.values()), tuple(name for _, name in seen), tuple(first[key] for key, _ in seen))

    def leads(self, rank: int) -> bool:
        return rank in self.leading

    def on_host_of(self, rank: int) -> list[int]:
        """Every rank on ``rank``'s host, ``rank`` among them (rank 0 only)."""
        leader = self.leaders[rank]
        return [other for other, lead in enumerate(self.leaders) if lead == leader]

    def covered(self, rank: int, strays: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """The ranks ``rank``'s walk or check stood for: a stray's own (a rank that named another
        folder than its host's leader, and walked its own), or its host's ranks but the strays."""
        return [rank] if rank in strays else [other for other in self.on_host_of(rank) if other not in strays]


def numbers(ranks: list[int]) -> str:
    """``1``, ``1, 3``, or ``4-7`` for a run of ranks (a host's), so a message stays short at scale."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    shown = ", ".join(str(rank) for rank in ranks[:8])
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


class Distributed:
    """This process's way to ``torch.distributed``, and what the collectives keep per process: the
    gloo groups made (by timeout, with the hosts of their ranks) and the progress noted in the
    process group's store.

    ``module()`` is ``torch.distributed`` if the program imported it, else None; ``host()`` names
    this machine in messages; ``machine()`` is the key ranks that share one view of the files have
    in common (module docstring). A stand-in (tests/_fake_group.py) overrides the three and answers
    every call the collectives make of the real module, as torch does.
    """

    def __init__(self) -> None:
        self.links: dict[float, Any] = {}  # timeout: collectives.Link, the gloo group made for it
        self.progress: Any = None  # collectives.Progress, made on first use

    def module(self) -> Any:
        return sys.modules.get("torch.distributed")

    def host(self) -> str:
        return socket.gethostname()

    def machine(self) -> str:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
                boot = f.read().strip()
            mounts = os.stat("/proc/self/ns/mnt").st_ino
        except OSError:
            # Cannot tell: a host of its own. Not the pid: two machines' processes may share one.
            return f"{self.host()}/process {_PROCESS_TOKEN}"
        return f"{self.host()}/{boot}/{mounts}"

    def loaded(self) -> Any:
        """``module()``, which is there once ``ranks()`` found a process group."""
        dist = self.module()
        assert dist is not None, "a collective ran without a process group (ranks() is None)"
        return dist


def distributed() -> Distributed:
    """The ``Distributed`` the collectives of this process (of this rank) run on: the one over the
    real ``torch.distributed``. Tests replace this function (see the module docstring)."""
    return _PROCESS


def ranks() -> Ranks | None:
    """This process's rank, the world size and this host, or None when no process group of two or
    more ranks is initialized (then every call of the protocol is the one-process call it wraps)."""
    place = distributed()
    dist = place.module()
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = int(dist.get_world_size())
    if world < 2:
        return None
    return Ranks(int(dist.get_rank()), world, place.host())


_PROCESS_TOKEN = uuid.uuid4().hex
_PROCESS = Distributed()  # this process's, over the real torch.distributed
