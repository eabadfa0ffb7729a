"""The collectives the record and the resume decision run, on a gloo group of their own, and the
errors that name the rank a failed one waited for.

Each is one ``torch.distributed`` call (``monitored_barrier``, ``gather_object``,
``broadcast_object_list``) wrapped so that a failure (a timeout, a peer that
died) becomes a ``TrainingStatusCollectiveError`` naming the ranks that did not answer: rank 0's
``monitored_barrier`` names them itself; for the others, each rank notes in the process group's
own store which collective it entered (``Progress``), so the failing rank can tell which ranks
never reached it.

torch is never imported here: every call reaches ``torch.distributed`` through
``hosts.distributed()``, which finds it in ``sys.modules`` (a process group exists only if the
program imported it). That function is the seam tests replace: tests/_fake_group.py runs each rank
as a thread with a ``Distributed`` of its own (a stand-in for ``torch.distributed`` over queues, a
host, its own groups and progress), so the protocol runs in milliseconds without torch.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
from collections.abc import Callable
from typing import Any, TypeVar

from ..._errors import TrainingStatusCollectiveError, TrainingStatusError
from . import hosts as _hosts
from .hosts import Hosts, Ranks

__all__ = ["DEFAULT_TIMEOUT", "Link", "Progress", "barrier", "broadcast", "from_rank_0", "gather", "group", "hosts_of", "on_rank_0"]

DEFAULT_TIMEOUT = 1800.0
"""Seconds a collective waits for every rank when no timeout is given: torch's own default
(``torch.distributed.default_pg_timeout``), which no public API reads back from a process group."""

T = TypeVar("T")


@dataclasses.dataclass
class Link:
    """What a collective runs on: our gloo group, its timeout in seconds, and the hosts of its ranks
    (``hosts_of``: found at the first collective that needs them)."""

    group: Any
    seconds: float
    hosts: Hosts | None = None


def group(timeout: float | None, doing: str = "making the group of trainstatus's collectives") -> Link:
    """The gloo group of this process group and ``timeout`` (made on first use: every rank makes it
    at the same call, as ``new_group`` requires), with its timeout in seconds.

    A group destroyed since (``destroy_process_group()`` destroys every group; a run may then
    initialize a new one) is no longer in torch's registry of groups, and is made again. Only our
    own group is kept: holding the default group's object past its ``destroy_process_group()``
    made torch abort at exit ("terminate called without an active exception") now and then.
    """
    place = _hosts.distributed()
    dist = place.loaded()
    seconds = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    link = place.links.get(seconds)
    if link is None or link.group not in dist.distributed_c10d._world.pg_map:
        try:
            made = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds))
        except RuntimeError as exc:  # torch's DistStoreError, DistNetworkError: the ranks did not all come
            if not (type(exc).__name__ in ("DistStoreError", "DistNetworkError") or "time" in str(exc).lower()):
                raise  # another failure (a torch without gloo...): torch's own words
            me = Ranks(int(dist.get_rank()), int(dist.get_world_size()), place.host())
            raise TrainingStatusCollectiveError(
                f"Rank {me.rank} of {me.world_size} on {me.host}, {doing}: not every rank made trainstatus's gloo "
                f"group of collectives within {seconds:g} s ({type(exc).__name__}: {exc}). Every rank must call "
                "the same trainstatus function at the same point, with the same timeout=; look at the output of "
                "the ranks that did not (a save still running, a rank that stopped or crashed). Nothing was "
                "recorded or chosen by this rank.",
                rank=me.rank,
            ) from exc
        if not place.links:
            atexit.register(place.links.clear)  # released before the interpreter's own teardown
        link = place.links[seconds] = Link(made, seconds)
    return link


def hosts_of(link: Link, me: Ranks, doing: str) -> Hosts:
    """The hosts of ``link``'s ranks, found once per group (every rank calls this at the same step
    of the protocol the first time, as a collective requires) and kept with it: each rank's
    machine key and host name gathered to rank 0, which broadcasts which ranks lead their host
    (``Hosts``: the whole map stays on rank 0)."""
    if link.hosts is None:
        place = _hosts.distributed()
        seen = gather((place.machine(), me.host), link, me, doing, "the hosts")
        mapped = Hosts.of(seen) if seen is not None else None
        leading = from_rank_0(lambda: mapped.leading if mapped is not None else frozenset(), me, link, doing,
                              "the hosts")
        link.hosts = mapped if mapped is not None else Hosts(leading)
    return link.hosts


def _failed(me: Ranks, doing: str, seconds: float, who: str, exc: BaseException) -> TrainingStatusCollectiveError:
    return TrainingStatusCollectiveError(
        f"Rank {me.rank} of {me.world_size} on {me.host}, {doing}: {who} within {seconds:g} s ({exc}). "
        "Nothing more was recorded or chosen by this rank. Look at that rank's own output (it may have "
        "crashed or be stuck in its save); a larger timeout= helps only a rank that is slow, not one that stopped.",
        rank=me.rank,
    )


def _collective(step: str, call: Callable[[], T], seconds: float, me: Ranks, doing: str, unnamed: str) -> T:
    """``call()`` (one collective), named ``step``; when it fails, the error names the ranks that
    have not reached it, as far as torch's own store says (``Progress``), else ``unnamed``."""
    place = _hosts.distributed()
    if place.progress is None:
        place.progress = Progress(place)
    progress: Progress = place.progress
    progress.enter(me, step)
    try:
        return call()
    except RuntimeError as exc:
        if progress.late_self(me):
            raise TrainingStatusCollectiveError(
                f"Rank {me.rank} of {me.world_size} on {me.host}, {doing}: this rank was the late one. It reached "
                f"{step} after every other rank had given up waiting for it there ({seconds:g} s) ({exc}). "
                "Nothing more was recorded or chosen by this rank. Look at what held it before this call (its "
                "save still running, the process stopped or in a debugger); a larger timeout= helps only a rank "
                "that is slow, not one that stopped.",
                rank=me.rank,
            ) from exc
        who = progress.behind(me) or unnamed
        progress.gave_up(me)
        raise _failed(me, doing, seconds, who, exc) from exc


class Progress:
    """Where each rank is in the sequence of collectives, in the process group's own key-value
    store (``torch.distributed``'s TCPStore, which ``torchrun`` and ``init_process_group`` make):
    one key per rank, set before each collective. When a collective fails (a rank that died
    between two of them leaves only "connection reset by peer" and an address), the ranks whose
    key is behind are the ones that did not answer. Any failure of the store itself leaves the
    error unnamed: this is for the message, never for the protocol."""

    def __init__(self, place: Any) -> None:
        self.place = place
        self.count = 0  # collectives entered by this process: the same on every rank
        self.store: Any = None
        self.of: Any = None  # the store the clone was made from
        self.unsure = False  # this rank's own last set failed: its key (and so every count) may be stale
        self.arrival = 0  # how many ranks had come to this rank's last collective, this one included

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
            store = self._store()
            store.set(f"trainstatus/progress/{me.rank}", f"{self.count} {step}")
            self.arrival = int(store.add(f"trainstatus/progress/arrived/{self.count}", 1))
            if me.rank == 0 and self.count > 2:  # the store keeps a count a collective: two at a time
                store.delete_key(f"trainstatus/progress/arrived/{self.count - 2}")
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
                count, step = self._key(store, rank)
                if count < self.count:
                    late.append(f"rank {rank} (the last it reached: {step})")
        except Exception:  # noqa: BLE001 - see the class docstring
            return None
        if not late:
            return None
        return f"{', '.join(late)} did not answer"

    def _key(self, store: Any, rank: int) -> tuple[int, str]:
        key = f"trainstatus/progress/{rank}"
        if not store.check([key]):
            return 0, "none yet"
        count, step = store.get(key).decode().split(" ", 1)
        return int(count), step

    def gave_up(self, me: Ranks) -> None:
        """Note in the store that this rank's collective failed (it gave up there): a rank that
        comes to it later finds every other rank's note, and knows it was the late one."""
        if self.unsure:
            return
        try:
            self._store().set(f"trainstatus/progress/gave-up/{me.rank}", f"{self.count} {self.arrival}")
        except Exception:  # noqa: BLE001 - see the class docstring
            pass

    def late_self(self, me: Ranks) -> bool:
        """Whether every other rank gave up at this rank's collective (``gave_up``) before this rank
        came to it (when each gave up, fewer than all had come: the store's count of arrivals, not
        clocks, which differ between hosts): a stopped or slow rank that goes on finds them gone,
        and must not blame them. A rank that crashed leaves no note: no rank is then called late."""
        if self.unsure:
            return False
        try:
            store = self._store()
            for rank in range(me.world_size):
                if rank == me.rank:
                    continue
                key = f"trainstatus/progress/gave-up/{rank}"
                if not store.check([key]):
                    return False
                count, arrived = (int(part) for part in store.get(key).decode().split())
                if count != self.count or arrived >= me.world_size:
                    return False
        except Exception:  # noqa: BLE001 - see the class docstring
            return False
        return me.world_size > 1


def barrier(link: Link, me: Ranks, doing: str) -> None:
    dist = _hosts.distributed().loaded()
    # Rank 0 hears from each rank (torch's own message names those that did not answer: "Ranks 1, 3
    # failed to pass monitoredBarrier"); the others only hear from rank 0.
    unnamed = "some ranks did not arrive (a save still running, or a rank that stopped)" if me.rank == 0 else \
        "rank 0 did not answer"
    _collective(f"the barrier of {doing}", lambda: dist.monitored_barrier(
        group=link.group, timeout=datetime.timedelta(seconds=link.seconds), wait_all_ranks=True), link.seconds, me,
        doing, unnamed)


def gather(item: Any, link: Link, me: Ranks, doing: str, step: str = "the gather") -> list[Any] | None:
    """Every rank's ``item`` on rank 0 (in rank order), None on the others. ``step`` names it in
    messages ("rank 1 (the last it reached: the gather of recording ...)")."""
    dist = _hosts.distributed().loaded()
    out: list[Any] | None = [None] * me.world_size if me.rank == 0 else None
    _collective(f"{step} of {doing}", lambda: dist.gather_object(item, out, dst=0, group=link.group),
                link.seconds, me, doing, "a rank stopped answering")
    return out


def broadcast(item: Any, link: Link, me: Ranks, doing: str, step: str = "the outcome") -> Any:
    """Rank 0's ``item`` on every rank."""
    dist = _hosts.distributed().loaded()
    box = [item]
    _collective(f"{step} of {doing}", lambda: dist.broadcast_object_list(box, src=0, group=link.group),
                link.seconds, me, doing, "rank 0 did not answer" if me.rank else "a rank stopped answering")
    return box[0]


def from_rank_0(produce: Callable[[], T], me: Ranks, link: Link, doing: str, step: str = "the outcome") -> T:
    """What ``produce()`` returns on rank 0, on every rank; if it raises, every rank raises it (the
    others a copy, ``_shipped``) and no rank waits for an answer that will not come."""
    outcome: Any = None
    if me.rank == 0:
        try:
            outcome = produce()
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, then rank 0 raises it
            broadcast(_shipped(exc, me, doing), link, me, doing, step)
            raise
    outcome = broadcast(outcome, link, me, doing, step)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome  # type: ignore[no-any-return]


def on_rank_0(produce: Callable[[], T], timeout: float | None, doing: str) -> T:
    """``produce()`` run by rank 0 alone, its outcome (or its error) on every rank; without a
    process group of two ranks or more, ``produce()``. Every rank calls it at the same step."""
    me = _hosts.ranks()
    if me is None:
        return produce()
    return from_rank_0(produce, me, group(timeout, doing), doing)


def _shipped(exc: Exception, me: Ranks, doing: str) -> TrainingStatusError:
    """What the other ranks raise for the error rank 0 met: the same error when it is one of ours
    (they pickle whole), else a ``TrainingStatusError`` that names it (any other may not pickle)."""
    if isinstance(exc, TrainingStatusError):
        return exc
    return TrainingStatusError(
        f"Rank 0 on {me.host} failed {doing}: {type(exc).__name__}: {exc}. Rank 0 raised it; its output "
        "has the whole traceback."
    )
