"""A process group for tests: ranks as threads of this process, each on a host of its own, running
``trainstatus.integrations._ranks`` (the record and the resume decision) over a stand-in for ``torch.distributed`` that passes
pickled objects through queues, in milliseconds and without torch.

    world = World(tmp_path, monkeypatch, hosts=("node-a", "node-b"))
    outcomes = world.run(lambda rank: record(...), lambda rank: record(...))  # one callable per rank

The stand-in answers every call ``_ranks.collectives`` makes of ``torch.distributed`` (``monitored_barrier``,
``gather_object``, ``all_gather_object``, ``broadcast_object_list``, ``new_group``, the default
store ``_Progress`` notes its steps in, ``is_initialized``...) with torch's semantics as far as the
protocol can tell: objects are pickled on the way (an error that does not pickle fails as it
would), rank 0's ``monitored_barrier`` names the ranks that did not arrive within the timeout,
``gather_object`` waits for every rank (torch all-gathers the sizes first; here through the
destination), a wait on a rank whose
thread ended (a process that exited) fails at once with gloo's "Connection closed by peer", a wait
on a rank that is only late fails after the timeout, and collectives called in another order on
two ranks fail loudly (torch would hang or mix them up). It is injected through the documented seam
``_ranks.hosts.distributed``, so the protocol runs the same code as under torch.

Faults and delays: ``world.at(rank, op, before=..., after=...)`` runs a callable before or after
that rank's call of ``op`` (a torch function's name, or a store method's: ``set``, ``get``,
``check``, ``add``, ``delete_key``); ``stop()`` ends the rank there as ``os._exit`` would, ``fail()`` makes the call raise
as torch does when a peer fails, ``time.sleep`` delays it.

Hosts and fsyncs: ``world.root(rank)`` is the run folder as that rank sees it (one shared folder,
or one per host: node-local disks); ``world.write(rank, path, data)`` writes a file as that rank,
leaving its data dirty in that host's page cache; ``_atomic.sync_file`` and ``sync_directory`` are
recorded per rank (``world.synced``), and only an fsync from the writer's host makes a file
durable (``world.dirty``): on a shared filesystem another node's fsync flushes nothing of it.
Several ranks may share a host (``hosts=("node-a", "node-a", "node-b", "node-b")``): they see the
same files and the same page cache, as ranks of one machine do.

What crosses the wires: ``world.sent`` (bytes of pickled objects, by torch function) and
``world.messages`` (how many), for the costs tests/test_ranks_cost.py bounds.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import os
import pickle
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:  # pytest is imported by the tests, not by benchmarks/ranks_cost.py, which runs this without it
    import pytest

from trainstatus._storage import atomic as _atomic
from trainstatus.integrations._ranks import hosts as _hosts

POLL = 0.002  # seconds between looks at a peer that may have ended, while waiting for it


class RankStopped(BaseException):
    """Raised in a rank's thread to end it where ``os._exit`` would end its process."""


def stop() -> None:
    raise RankStopped


def fail(message: str = "Connection reset by peer") -> Callable[[], None]:
    """An action that makes the collective raise what torch raises when a peer's socket fails."""

    def failing() -> None:
        raise RuntimeError(f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] {message}")

    return failing


@dataclasses.dataclass
class Outcome:
    """What a rank's callable did: returned ``value``, raised ``error``, or was stopped."""

    value: Any = None
    error: BaseException | None = None
    stopped: bool = False

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        assert not self.stopped, "the rank was stopped"
        return self.value


@dataclasses.dataclass(eq=False)  # a group is a key of pg_map by identity, as torch's are
class Group:
    number: int
    timeout: datetime.timedelta


class _Message:
    def __init__(self, group: Group, seq: int, op: str, payload: Any) -> None:
        self.group, self.seq, self.op, self.payload = group, seq, op, payload


class _Store:
    """The process group's key-value store (torch's TCPStore), shared by every rank."""

    def __init__(self, world: World, rank: int, data: dict[str, bytes]) -> None:
        self.world, self.rank, self.data = world, rank, data
        self.timeout = datetime.timedelta(seconds=300)

    def clone(self) -> _Store:
        return _Store(self.world, self.rank, self.data)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.timeout = timeout

    def set(self, key: str, value: str | bytes) -> None:
        with self.world.step(self.rank, "set"):
            self.data[key] = value.encode() if isinstance(value, str) else value

    def add(self, key: str, amount: int) -> int:
        with self.world.step(self.rank, "add"), self.world.lock:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    def delete_key(self, key: str) -> bool:
        with self.world.step(self.rank, "delete_key"):
            return self.data.pop(key, None) is not None

    def check(self, keys: list[str]) -> bool:
        with self.world.step(self.rank, "check"):
            return all(key in self.data for key in keys)

    def get(self, key: str) -> bytes:
        with self.world.step(self.rank, "get"):
            deadline = time.monotonic() + self.timeout.total_seconds()
            while key not in self.data:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Timeout waiting for key: {key} after {self.timeout}")
                time.sleep(POLL)
            return self.data[key]


class _C10d:
    """``torch.distributed.distributed_c10d``: the registry of groups and the default store."""

    def __init__(self, world: World, rank: int) -> None:
        self._world = world  # its pg_map is torch's _world.pg_map
        self.store = _Store(world, rank, world.store_data)

    def _get_default_store(self) -> _Store:
        return self.store


class FakeDistributed:
    """``torch.distributed`` as one rank sees it."""

    def __init__(self, world: World, rank: int) -> None:
        self.world, self.rank = world, rank
        self.distributed_c10d = _C10d(world, rank)
        self.seq: dict[int, int] = {}  # group number: collectives this rank ran on it
        self.groups_made = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.world.initialized

    def get_world_size(self) -> int:
        return self.world.size

    def get_rank(self) -> int:
        return self.rank

    def new_group(self, backend: str | None = None, timeout: datetime.timedelta | None = None) -> Group:
        # Every rank makes the n-th group at its n-th call, as torch requires; each gets the same one.
        with self.world.step(self.rank, "new_group"):
            assert backend == "gloo", backend
            assert timeout is not None
            with self.world.lock:
                made = self.world.groups.setdefault(self.groups_made, Group(self.groups_made, timeout))
                self.world.pg_map[made] = backend
            assert made.timeout == timeout, "ranks made the same group with other timeouts"
            self.groups_made += 1
            return made

    # -- the collectives ------------------------------------------------------------------------

    def monitored_barrier(self, group: Group | None = None, timeout: datetime.timedelta | None = None,
                          wait_all_ranks: bool = False) -> None:
        with self.world.step(self.rank, "monitored_barrier"):
            group, seconds = self._group(group, timeout)
            seq, deadline = self._next(group), time.monotonic() + seconds
            if self.rank != 0:
                self._send(0, group, seq, "monitored_barrier", None)
                try:
                    self._receive(0, group, seq, "monitored_barrier", deadline)
                except RuntimeError as exc:
                    raise RuntimeError(f"Rank {self.rank} successfully reached monitoredBarrier, but received errors "
                                       f"while waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                                       f"rank. Original exception: {exc}") from None
                return
            failed = []
            for peer in range(1, self.world.size):
                try:
                    self._receive(peer, group, seq, "monitored_barrier", deadline)
                except RuntimeError:
                    failed.append(peer)
                    if not wait_all_ranks:
                        break
            if failed:
                raise RuntimeError(f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass monitoredBarrier in "
                                   f"{round(seconds * 1000)} ms")
            for peer in range(1, self.world.size):
                self._send(peer, group, seq, "monitored_barrier", None)

    def gather_object(self, obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0,
                      group: Group | None = None) -> None:
        with self.world.step(self.rank, "gather_object"):
            if (object_gather_list is not None) != (self.rank == dst):
                raise ValueError("Argument ``gather_list`` must be specified on destination rank only.")
            group, seconds = self._group(group, None)
            seq, deadline = self._next(group), time.monotonic() + seconds
            payload = pickle.dumps(obj)
            self._rendezvous(dst, group, seq, "gather_object sizes", len(payload), deadline)  # torch's sizes first
            if self.rank != dst:
                self._send(dst, group, seq, "gather_object", payload)
                return
            assert object_gather_list is not None and len(object_gather_list) == self.world.size
            for peer in range(self.world.size):
                got = payload if peer == self.rank else self._receive(peer, group, seq, "gather_object", deadline)
                object_gather_list[peer] = pickle.loads(got)

    def all_gather_object(self, object_list: list[Any], obj: Any, group: Group | None = None) -> None:
        with self.world.step(self.rank, "all_gather_object"):
            group, seconds = self._group(group, None)
            seq, deadline = self._next(group), time.monotonic() + seconds
            payload = pickle.dumps(obj)
            got = self._everyone(group, seq, "all_gather_object", payload, deadline)
            for peer in range(self.world.size):
                object_list[peer] = pickle.loads(payload if peer == self.rank else got[peer])

    def broadcast_object_list(self, object_list: list[Any], src: int = 0, group: Group | None = None) -> None:
        with self.world.step(self.rank, "broadcast_object_list"):
            group, seconds = self._group(group, None)
            seq, deadline = self._next(group), time.monotonic() + seconds
            if self.rank == src:
                payload = pickle.dumps(list(object_list))  # what does not pickle fails here, on the sender
                for peer in range(self.world.size):
                    if peer != src:
                        self._send(peer, group, seq, "broadcast_object_list", payload)
                return
            object_list[:] = pickle.loads(self._receive(src, group, seq, "broadcast_object_list", deadline))

    # -- the wires -------------------------------------------------------------------------------

    def _group(self, group: Group | None, timeout: datetime.timedelta | None) -> tuple[Group, float]:
        assert group is not None, "_ranks.collectives runs every collective on a group of its own"
        assert group in self.world.pg_map, "a collective on a group that was not made (or was destroyed)"
        return group, (timeout or group.timeout).total_seconds()

    def _next(self, group: Group) -> int:
        self.seq[group.number] = self.seq.get(group.number, 0) + 1
        return self.seq[group.number]

    def _send(self, peer: int, group: Group, seq: int, op: str, payload: Any) -> None:
        if isinstance(payload, bytes):  # a pickled object (not gather's sizes, nor a barrier's token)
            with self.world.lock:
                self.world.sent[op] += len(payload)
                self.world.messages[op] += 1
        self.world.wire(self.rank, peer).put(_Message(group, seq, op, payload))

    def _everyone(self, group: Group, seq: int, op: str, payload: Any, deadline: float) -> dict[int, Any]:
        for peer in range(self.world.size):
            if peer != self.rank:
                self._send(peer, group, seq, op, payload)
        return {peer: self._receive(peer, group, seq, op, deadline) for peer in range(self.world.size)
                if peer != self.rank}

    def _rendezvous(self, root: int, group: Group, seq: int, op: str, payload: Any, deadline: float) -> None:
        """No rank goes on before every rank arrived (torch all-gathers the sizes before a gather),
        through ``root``: each rank tells it, it answers each once all did. Ranks times two
        messages, where an all-gather's ranks squared would make a world of 1,024 threads crawl."""
        if self.rank != root:
            self._send(root, group, seq, op, payload)
            self._receive(root, group, seq, op, deadline)
            return
        for peer in range(self.world.size):
            if peer != root:
                self._receive(peer, group, seq, op, deadline)
        for peer in range(self.world.size):
            if peer != root:
                self._send(peer, group, seq, op, None)

    def _receive(self, peer: int, group: Group, seq: int, op: str, deadline: float) -> Any:
        wire = self.world.wire(peer, self.rank)
        poll = max(POLL, self.world.size * POLL / 16)  # hundreds of waiting threads waking every 2 ms thrash
        while True:
            try:
                message = wire.get(timeout=poll)
                break
            except queue.Empty:
                if peer in self.world.gone and wire.empty():
                    raise RuntimeError(f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                                       f"peer [{self.world.hosts[peer]}]:{29500 + peer}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                                       f"waiting for recv operation from rank {peer} to complete") from None
        if (message.group, message.seq, message.op) != (group, seq, op):
            # torch would hang or mix two collectives' bytes up: a protocol bug, made loud.
            raise AssertionError(f"rank {self.rank} ran {op} #{seq} on group {group.number} while rank {peer} ran "
                                 f"{message.op} #{message.seq} on group {message.group.number}")
        return message.payload


class _Place(_hosts.Distributed):
    """A rank's ``_ranks.hosts.Distributed``: its stand-in for torch.distributed and its host (whose
    name is also its machine: ranks on hosts of one name share a view of the files)."""

    def __init__(self, dist: FakeDistributed, host: str) -> None:
        super().__init__()
        self.dist, self.name = dist, host

    def module(self) -> Any:
        return self.dist

    def host(self) -> str:
        return self.name

    def machine(self) -> str:
        return self.name


class World:
    """A process group of ``len(hosts)`` ranks, rank ``r`` on ``hosts[r]``, for one test; the
    folders under ``base`` (``root(rank)``) and the fsyncs each rank makes (module docstring)."""

    def __init__(self, base: Path, monkeypatch: pytest.MonkeyPatch, *, hosts: Iterable[str] = ("node-a", "node-b"),
                 shared: bool = True) -> None:
        self.base, self.hosts, self.shared = base, list(hosts), shared
        self.size = len(self.hosts)
        self.initialized = True
        self.lock = threading.Lock()
        self.groups: dict[int, Group] = {}
        self.pg_map: dict[Group, str] = {}
        self.store_data: dict[str, bytes] = {}
        # One queue a pair of ranks, made when first used: a world of 1,024 ranks uses a few thousand of its million.
        self.wires: dict[tuple[int, int], queue.Queue[_Message]] = {}
        self.gone: set[int] = set()
        self.sent: collections.Counter[str] = collections.Counter()  # op: bytes of pickled objects sent
        self.messages: collections.Counter[str] = collections.Counter()  # op: how many of them
        self.places = [_Place(FakeDistributed(self, rank), host) for rank, host in enumerate(self.hosts)]
        self.actions: dict[tuple[int, str, str], list[tuple[int | None, Callable[[], None]]]] = {}
        self.calls: dict[tuple[int, str], int] = {}
        self.entered: list[threading.Event] = [threading.Event() for _ in self.hosts]  # a first collective
        self.synced: list[tuple[int | None, str]] = []  # (rank or None: the test's thread, path) per fsync
        self.dirty: dict[str, str] = {}  # path: the host whose page cache holds its unsynced data
        self.sync_fault: Callable[[int | None, str], None] | None = None
        self._local = threading.local()
        monkeypatch.setattr(_hosts, "distributed", self.distributed)
        monkeypatch.setattr(_atomic, "sync_file", self._sync_file)
        monkeypatch.setattr(_atomic, "sync_directory", self._sync_directory)

    # -- ranks -----------------------------------------------------------------------------------

    def distributed(self) -> _hosts.Distributed:
        rank = self.rank()
        return _hosts._PROCESS if rank is None else self.places[rank]

    def wire(self, sender: int, receiver: int) -> queue.Queue[_Message]:
        with self.lock:
            return self.wires.setdefault((sender, receiver), queue.Queue())

    def rank(self) -> int | None:
        """The rank of the calling thread, None for the test's own."""
        return getattr(self._local, "rank", None)

    def run(self, *work: Callable[[int], Any], within: float = 10.0) -> list[Outcome]:
        """Each ``work[rank](rank)`` in a thread of its own, at once; what each did. A rank still
        running after ``within`` seconds fails the test with every rank's stack."""
        assert len(work) == self.size
        outcomes = [Outcome() for _ in work]
        self.gone.clear()  # a world run again (a record, then a resume): every rank is back

        def main(rank: int) -> None:
            self._local.rank = rank
            try:
                outcomes[rank].value = work[rank](rank)
            except RankStopped:
                outcomes[rank].stopped = True
            except BaseException as exc:  # noqa: BLE001 - the test asserts on it
                outcomes[rank].error = exc
            finally:
                self.gone.add(rank)  # its sockets close: peers waiting on it hear so at once

        threads = [threading.Thread(target=main, args=(rank,), name=f"rank {rank}", daemon=True)
                   for rank in range(self.size)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + within
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        hung = [thread for thread in threads if thread.is_alive()]
        if hung:
            frames = sys._current_frames()
            stacks = "\n".join(f"{thread.name}:\n{''.join(traceback.format_stack(frames[thread.ident]))}"
                               for thread in hung if thread.ident in frames)
            raise AssertionError(f"{', '.join(t.name for t in hung)} still running after {within} s:\n{stacks}")
        return outcomes

    def at(self, rank: int, op: str, *, before: Callable[[], None] | None = None,
           after: Callable[[], None] | None = None, nth: int | None = None) -> None:
        """Run ``before``/``after`` around ``rank``'s ``nth`` call of ``op`` (every call if None)."""
        for when, action in (("before", before), ("after", after)):
            if action is not None:
                self.actions.setdefault((rank, op, when), []).append((nth, action))

    def reached(self, rank: int, op: str, within: float = 5.0) -> bool:
        """Wait until ``rank`` has entered ``op`` (a test's way to order one rank after another)."""
        deadline = time.monotonic() + within
        while self.calls.get((rank, op), 0) == 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL)
        return True

    def step(self, rank: int, op: str) -> _Step:
        return _Step(self, rank, op)

    # -- hosts and files -------------------------------------------------------------------------

    def root(self, rank: int) -> Path:
        """The run folder as ``rank`` sees it: the one shared folder, or its host's own."""
        folder = self.base / ("shared" if self.shared else self.hosts[rank])
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def write(self, rank: int, path: Path, data: bytes) -> None:
        """Write ``path`` as ``rank`` does (no fsync): its data dirty on that rank's host."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.dirty[os.path.realpath(path)] = self.hosts[rank]

    def synced_by(self, rank: int | None) -> list[str]:
        return [path for who, path in self.synced if who == rank]

    def _sync_file(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        self._synced(path)
        rank = self.rank()
        if rank is not None and self.dirty.get(path) == self.hosts[rank]:
            del self.dirty[path]  # only the writer's host holds its dirty pages

    def _sync_directory(self, directory: str) -> None:
        self._synced(os.path.realpath(directory))

    def _synced(self, path: str) -> None:
        if self.sync_fault is not None:
            self.sync_fault(self.rank(), path)
        with self.lock:
            self.synced.append((self.rank(), path))


class _Step:
    """The actions ``World.at`` registered around one call, and the first-collective event."""

    def __init__(self, world: World, rank: int, op: str) -> None:
        self.world, self.rank, self.op = world, rank, op

    def _run(self, when: str) -> None:
        count = self.world.calls[(self.rank, self.op)]
        for nth, action in self.world.actions.get((self.rank, self.op, when), []):
            if nth is None or nth == count:
                action()

    def __enter__(self) -> None:
        key = (self.rank, self.op)
        self.world.calls[key] = self.world.calls.get(key, 0) + 1
        if self.op not in ("set", "get", "check", "add", "delete_key", "new_group"):
            self.world.entered[self.rank].set()
        self._run("before")

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if kind is None:
            self._run("after")
