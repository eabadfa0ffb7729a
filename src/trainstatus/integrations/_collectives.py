"""The collectives ``_collective`` runs, on a gloo group of their own, and the errors that name the
rank a failed one waited for.

Each is one ``torch.distributed`` call (``monitored_barrier``, ``gather_object``,
``all_gather_object``, ``broadcast_object_list``) wrapped so that a failure (a timeout, a peer that
died) becomes a ``TrainingStatusCollectiveError`` naming the ranks that did not answer: rank 0's
``monitored_barrier`` names them itself; for the others, each rank notes in the process group's
own store which collective it entered (``_Progress``), so the failing rank can tell which ranks
never reached it. torch is imported inside the calls only.
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

__all__ = ["DEFAULT_TIMEOUT", "Ranks", "all_gather", "barrier", "broadcast", "gather", "group", "ranks"]

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


def ranks() -> Ranks | None:
    """This process's rank, the world size and this host, or None when no process group of two or
    more ranks is initialized (then every call of this module is the one-process call it wraps)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = int(dist.get_world_size())
    if world < 2:
        return None
    return Ranks(int(dist.get_rank()), world, socket.gethostname())

_GROUPS: dict[float, Any] = {}  # timeout: the gloo group made for it


def group(timeout: float | None) -> tuple[Any, float]:
    """The gloo group of this process group and ``timeout`` (made on first use: every rank makes it
    at the same call, as ``new_group`` requires), and the timeout in seconds.

    A group destroyed since (``destroy_process_group()`` destroys every group; a run may then
    initialize a new one) is no longer in torch's registry of groups, and is made again. Only our
    own group is kept: holding the default group's object past its ``destroy_process_group()``
    made torch abort at exit ("terminate called without an active exception") now and then.
    """
    import torch.distributed as dist

    seconds = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    group = _GROUPS.get(seconds)
    if group is None or group not in dist.distributed_c10d._world.pg_map:
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds))
        if not _GROUPS:
            atexit.register(_GROUPS.clear)  # released before the interpreter's own teardown
        _GROUPS[seconds] = group
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
    _PROGRESS.enter(me, step)
    try:
        return call()
    except RuntimeError as exc:
        raise _failed(me, doing, seconds, _PROGRESS.behind(me) or unnamed, exc) from exc


class _Progress:
    """Where each rank is in the sequence of collectives, in the process group's own key-value
    store (``torch.distributed``'s TCPStore, which ``torchrun`` and ``init_process_group`` make):
    one key per rank, set before each collective. When a collective fails (a rank that died
    between two of them leaves only "connection reset by peer" and an address), the ranks whose
    key is behind are the ones that did not answer. Any failure of the store itself leaves the
    error unnamed: this is for the message, never for the protocol."""

    def __init__(self) -> None:
        self.count = 0  # collectives entered by this process: the same on every rank
        self.store: Any = None
        self.of: Any = None  # the store the clone was made from

    def _store(self) -> Any:
        import torch.distributed as dist

        default: Any = dist.distributed_c10d._get_default_store()  # Any: clone() is not in its stubs
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
        except Exception:  # noqa: BLE001 - a store that fails only makes the message less precise
            self.store = self.of = None

    def behind(self, me: Ranks) -> str | None:
        try:
            store = self._store()
            late = []
            for rank in range(me.world_size):
                key = f"trainstatus/progress/{rank}"
                count, step = store.get(key).decode().split(" ", 1) if store.check([key]) else ("0", "none yet")
                if int(count) < self.count:
                    late.append(f"rank {rank} (the last it reached: {step})")
        except Exception:  # noqa: BLE001 - see the class docstring
            return None
        if not late:
            return None
        return f"{', '.join(late)} did not answer"


_PROGRESS = _Progress()


def barrier(group: Any, seconds: float, me: Ranks, doing: str) -> None:
    import torch.distributed as dist

    # Rank 0 hears from each rank (torch's own message names those that did not answer: "Ranks 1, 3
    # failed to pass monitoredBarrier"); the others only hear from rank 0.
    unnamed = "some ranks did not arrive (a save still running, or a rank that stopped)" if me.rank == 0 else \
        "rank 0 did not answer"
    _collective(f"the barrier of {doing}", lambda: dist.monitored_barrier(
        group=group, timeout=datetime.timedelta(seconds=seconds), wait_all_ranks=True), seconds, me, doing, unnamed)


def gather(item: Any, group: Any, seconds: float, me: Ranks, doing: str) -> list[Any] | None:
    import torch.distributed as dist

    out: list[Any] | None = [None] * me.world_size if me.rank == 0 else None
    _collective(f"the gather of {doing}", lambda: dist.gather_object(item, out, dst=0, group=group), seconds, me,
                doing, "a rank stopped answering")
    return out


def all_gather(item: Any, group: Any, seconds: float, me: Ranks, doing: str) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * me.world_size
    _collective(f"the check of {doing}", lambda: dist.all_gather_object(out, item, group=group), seconds, me,
                doing, "a rank stopped answering")
    return out


def broadcast(item: Any, group: Any, seconds: float, me: Ranks, doing: str) -> Any:
    import torch.distributed as dist

    box = [item]
    _collective(f"the outcome of {doing}", lambda: dist.broadcast_object_list(box, src=0, group=group), seconds,
                me, doing, "rank 0 did not answer" if me.rank else "a rank stopped answering")
    return box[0]
