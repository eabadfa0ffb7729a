"""The collectives ``_collective`` runs, on a gloo group of their own, and the errors that name the
rank a failed one waited for.

Each is one ``torch.distributed`` call (``monitored_barrier``, ``gather_object``,
``all_gather_object``, ``broadcast_object_list``) wrapped so that a failure (a timeout, a peer that
died) becomes a ``TrainingStatusCollectiveError`` naming the ranks that did not answer: rank 0's
``monitored_barrier`` names them itself; for the others, each rank notes in the process group's
own store which collective it entered (``_Progress``), so the failing rank can tell which ranks
never reached it.

torch is never imported here: every call reaches ``torch.distributed`` through ``distributed()``,
which finds it in ``sys.modules`` (a process group exists only if the program imported it). That
function is the seam tests replace: tests/_fake_group.py runs each rank as a thread with a
``Distributed`` of its own (a stand-in for ``torch.distributed`` over queues, a host name, its own
groups and progress), so the protocol of ``_collective`` runs in milliseconds without torch.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import socket
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .._errors import TrainingStatusCollectiveError

__all__ = ["DEFAULT_TIMEOUT", "Distributed", "Ranks", "all_gather", "barrier", "broadcast", "distributed", "gather",
           "group", "ranks"]

DEFAULT_TIMEOUT = 1800.0
"""Seconds a collective waits for every rank when no timeout is given: torch's own default
(``torch.distributed.default_pg_timeout``), which no public API reads back from a process group."""

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place in the default process group."""

    rank: int
    world_size: int
    host: str


class Distributed:
    """This process's way to ``torch.distributed``, and what the collectives keep per process: the
    gloo groups made (by timeout) and the progress noted in the process group's store.

    ``module()`` is ``torch.distributed`` if the program imported it, else None; ``host()`` names
    this machine in messages. A stand-in (tests/_fake_group.py) overrides both and answers every
    call this module makes of the real one, as torch does.
    """

    def __init__(self) -> None:
        self.groups: dict[float, Any] = {}  # timeout: the gloo group made for it
        self.progress = _Progress(self)

    def module(self) -> Any:
        return sys.modules.get("torch.distributed")

    def host(self) -> str:
        return socket.gethostname()

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
    more ranks is initialized (then every call of this module is the one-process call it wraps)."""
    place = distributed()
    dist = place.module()
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = int(dist.get_world_size())
    if world < 2:
        return None
    return Ranks(int(dist.get_rank()), world, place.host())


def group(timeout: float | None) -> tuple[Any, float]:
    """The gloo group of this process group and ``timeout`` (made on first use: every rank makes it
    at the same call, as ``new_group`` requires), and the timeout in seconds.

    A group destroyed since (``destroy_process_group()`` destroys every group; a run may then
    initialize a new one) is no longer in torch's registry of groups, and is made again. Only our
    own group is kept: holding the default group's object past its ``destroy_process_group()``
    made torch abort at exit ("terminate called without an active exception") now and then.
    """
    place = distributed()
    dist = place.loaded()
    seconds = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    group = place.groups.get(seconds)
    if group is None or group not in dist.distributed_c10d._world.pg_map:
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds))
        if not place.groups:
            atexit.register(place.groups.clear)  # released before the interpreter's own teardown
        place.groups[seconds] = group
    return group, seconds


def _failed(me: Ranks, doing: str, seconds: float, who: str, exc: BaseException) -> TrainingStatusCollectiveError:
    return TrainingStatusCollectiveError(
        f"Rank {me.rank} of {me.world_size} on {me.host}, {doing}: {who} within {seconds:g} s ({exc}). "
        "Nothing more was recorded or chosen by this rank. Look at that rank's own output (it may have "
        "crashed or be stuck in its save); a larger timeout= helps only a rank that is slow, not one that stopped.",
        rank=me.rank,
    )


def _collective(step: str, call: Callable[[], T], seconds: float, me: Ranks, doing: str, unnamed: str) -> T:
    """``call()`` (one collective), named ``step``; when it fails, the error names the ranks that
    have not reached it, as far as torch's own store says (``_Progress``), else ``unnamed``."""
    progress = distributed().progress
    progress.enter(me, step)
    try:
        return call()
    except RuntimeError as exc:
        raise _failed(me, doing, seconds, progress.behind(me) or unnamed, exc) from exc


class _Progress:
    """Where each rank is in the sequence of collectives, in the process group's own key-value
    store (``torch.distributed``'s TCPStore, which ``torchrun`` and ``init_process_group`` make):
    one key per rank, set before each collective. When a collective fails (a rank that died
    between two of them leaves only "connection reset by peer" and an address), the ranks whose
    key is behind are the ones that did not answer. Any failure of the store itself leaves the
    error unnamed: this is for the message, never for the protocol."""

    def __init__(self, place: Distributed) -> None:
        self.place = place
        self.count = 0  # collectives entered by this process: the same on every rank
        self.store: Any = None
        self.of: Any = None  # the store the clone was made from
        self.unsure = False  # this rank's own last set failed: its key (and so every count) may be stale

    def _store(self) -> Any:
        default: Any = self.place.loaded().distributed_c10d._get_default_store()  # Any: clone() is not in its stubs
        if self.of is not default:
            # A clone with its own short timeout: the default store's is the group's (30 min).
            clone = default.clone()
            clone.set_timeout(datetime.timedelta(seconds=10))
            self.store, self.of = clone, default
        return self.store

    def enter(self, me: Ranks, step: str) -> None:
        self.count += 1
        try:
            self._store().set(f"trainstatus/progress/{me.rank}", f"{self.count} {step}")
            self.unsure = False
        except Exception:  # noqa: BLE001 - a store that fails only makes the message less precise
            self.store = self.of = None
            self.unsure = True

    def behind(self, me: Ranks) -> str | None:
        if self.unsure:
            return None
        try:
            store = self._store()
            late = []
            for rank in range(me.world_size):
                if rank == me.rank:
                    continue  # the rank that raises reached this collective, whatever its key says
                key = f"trainstatus/progress/{rank}"
                count, step = store.get(key).decode().split(" ", 1) if store.check([key]) else ("0", "none yet")
                if int(count) < self.count:
                    late.append(f"rank {rank} (the last it reached: {step})")
        except Exception:  # noqa: BLE001 - see the class docstring
            return None
        if not late:
            return None
        return f"{', '.join(late)} did not answer"


_PROCESS = Distributed()  # this process's, over the real torch.distributed


def barrier(group: Any, seconds: float, me: Ranks, doing: str) -> None:
    dist = distributed().loaded()
    # Rank 0 hears from each rank (torch's own message names those that did not answer: "Ranks 1, 3
    # failed to pass monitoredBarrier"); the others only hear from rank 0.
    unnamed = "some ranks did not arrive (a save still running, or a rank that stopped)" if me.rank == 0 else \
        "rank 0 did not answer"
    _collective(f"the barrier of {doing}", lambda: dist.monitored_barrier(
        group=group, timeout=datetime.timedelta(seconds=seconds), wait_all_ranks=True), seconds, me, doing, unnamed)


def gather(item: Any, group: Any, seconds: float, me: Ranks, doing: str) -> list[Any] | None:
    dist = distributed().loaded()
    out: list[Any] | None = [None] * me.world_size if me.rank == 0 else None
    _collective(f"the gather of {doing}", lambda: dist.gather_object(item, out, dst=0, group=group), seconds, me,
                doing, "a rank stopped answering")
    return out


def all_gather(item: Any, group: Any, seconds: float, me: Ranks, doing: str) -> list[Any]:
    dist = distributed().loaded()
    out: list[Any] = [None] * me.world_size
    _collective(f"the check of {doing}", lambda: dist.all_gather_object(out, item, group=group), seconds, me,
                doing, "a rank stopped answering")
    return out


def broadcast(item: Any, group: Any, seconds: float, me: Ranks, doing: str) -> Any:
    dist = distributed().loaded()
    box = [item]
    _collective(f"the outcome of {doing}", lambda: dist.broadcast_object_list(box, src=0, group=group), seconds,
                me, doing, "rank 0 did not answer" if me.rank else "a rank stopped answering")
    return box[0]
