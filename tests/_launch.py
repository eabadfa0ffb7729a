"""The test's half of the process tests' harness: children started, their JSON event lines read as
they come, waited for within a bound, and every process killed by pid, never a pid another process
was given since. The child's half is tests/_forkserver.py (its events, and the fork server).

- ``Launch``: one process (a rank started directly; the torchrun or ``accelerate launch`` agent,
  whose workers write to the same pipe; a Ray driver) and its events.
- ``Workers``: a fork server (``<script> serve``, tests/_forkserver.py) as a ``Launch``, for tests
  that start twenty-odd runs: a run's workers are forked in about a second, not the ten or more of
  fresh interpreters importing torch on two busy cores. ``Run``: one run of its workers.
- ``alive``, ``holding``, ``kill``, ``leftovers``: processes by pid, guarded by a marker their
  command line (or environment) holds; ``free_port``; ``recorded``: what the ranks recorded.

Used by the tests of many ranks (tests/test_integration_dcp.py, _accelerate.py, _lightning_ranks.py,
_transformers_ranks.py, and _ray.py through tests/_ray_cluster.py), by tests/test_checkpoints.py's
writers and tests/_objectservers.py's servers. A DeepSpeed test uses the same: ``Launch`` for
``torchrun``/``deepspeed`` (its environment in ``env=``), or ``Workers`` over a child whose
``serve`` forks the ranks.

torchrun starts each worker in a session of its own: killing the agent's process group leaves them
running. A ``Launch`` knows its workers by the ``pid`` each says first (``_forkserver.announce``) and
by the launcher's children in /proc (a worker killed before it spoke).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from glob import glob
from pathlib import Path
from typing import Any

import pytest

from trainstatus import StatusStore


class Launch:
    """One process started for a test, its JSON lines (those with an ``event``) read as they come by
    a thread; every line goes to ``<stderr>.out`` too, for a failure's post-mortem."""

    def __init__(self, argv: list[str], stderr: Path, *, env: dict[str, str] | None = None,
                 stdin: int = subprocess.PIPE, bound: float = 120.0, session: bool = False) -> None:
        self.bound = bound  # seconds: every wait of this launch, unless told
        self.stderr_path = stderr
        self.marker = argv[-1]  # the child's options: in the command line of each of its processes
        self.known: list[int] = []  # every worker pid seen, kept after the launcher is gone
        with open(stderr, "w") as err:
            self.process = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=err, text=True,
                                            start_new_session=session,
                                            env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
                                                 **(env or {})})
        self.events: list[dict[str, Any]] = []
        self.over = False  # the pipe closed: every process holding it has ended
        self.arrived = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with open(self.stderr_path.with_suffix(".out"), "w") as raw:
            for line in self.process.stdout:
                raw.write(line)
                raw.flush()
                # A library's own lines may look like JSON objects too (the Trainer prints its logs
                # as Python dicts): only the children's events count.
                try:
                    fields = json.loads(line) if line.startswith("{") else None
                except ValueError:
                    continue
                if isinstance(fields, dict) and "event" in fields:
                    with self.arrived:
                        self.events.append(fields)
                        self.arrived.notify_all()
        with self.arrived:
            self.over = True
            self.arrived.notify_all()

    def until(self, test: Callable[[dict[str, Any]], bool], what: str, timeout: float | None = None, *,
              since: int = 0) -> dict[str, Any]:
        """The first event from the ``since``-th on that passes ``test``; fail with the children's
        stderr if they end first, or after ``timeout`` seconds (their stacks asked for first)."""
        timeout = self.bound if timeout is None else timeout
        deadline = time.monotonic() + timeout
        seen = since
        with self.arrived:
            while True:
                while seen < len(self.events):
                    seen += 1
                    if test(self.events[seen - 1]):
                        return self.events[seen - 1]
                left = deadline - time.monotonic()
                if self.over or left <= 0:
                    break
                self.arrived.wait(left)
        if self.over:
            pytest.fail(f"the children ended before {what}:\n{self.stderr()}")
        # The stacks of the workers that said "pid" (faulthandler is set by then), into their stderr.
        for pid in holding(self.marker, [f["pid"] for f in self.events if f["event"] == "pid"]):
            os.kill(pid, signal.SIGUSR1)
        time.sleep(1)
        pytest.fail(f"no {what} in {timeout} s; the last events: {self.events[-6:]}\n{self.stderr()}")

    def event(self, name: str, rank: int, **match: Any) -> dict[str, Any]:
        return self.until(lambda f: f["event"] == name and f["rank"] == rank
                          and all(f.get(k) == v for k, v in match.items()), f"{name!r} of rank {rank} {match or ''}")

    def each(self, name: str, ranks: int = 2) -> list[dict[str, Any]]:
        return [self.event(name, rank) for rank in range(ranks)]

    def all(self, name: str, rank: int = 0) -> list[dict[str, Any]]:
        return [f for f in self.events if f["event"] == name and f["rank"] == rank]

    def finished(self, ranks: int = 2, failed: int = 0) -> list[dict[str, Any]]:
        """Every rank's ``done``, exit 0, every process gone, and ``failed`` events ``error`` (a
        child that stops at an error may end well: without this a run cut short would pass for whole)."""
        try:
            done = self.each("done", ranks)
            assert self.ended() == 0, self.stderr()
        finally:
            self.close()
        errors = [e for e in self.events if e["event"] == "error"]
        assert len(errors) == failed, errors
        return done

    def pids(self) -> list[int]:
        """This process, then every worker seen: those that said ``pid``, and its children (while it
        runs) that hold the marker (not a ``hostname`` a launch's shell ran, nor Ray's raylet)."""
        found = [f["pid"] for f in self.events if f["event"] == "pid"]
        if self.process.poll() is None:  # not reaped by us, its only reaper: the pid is still its own
            children = []
            for listing in glob(f"/proc/{self.process.pid}/task/*/children"):
                try:
                    with open(listing) as f:
                        children += [int(pid) for pid in f.read().split()]
                except OSError:
                    continue
            found += holding(self.marker, children)
        self.known += [pid for pid in dict.fromkeys(found) if pid not in self.known]
        return [self.process.pid, *self.known]

    def kill(self, ranks: list[int]) -> None:
        """SIGKILL the workers of ``ranks``, by the pid each said."""
        kill([self.event("pid", rank)["pid"] for rank in ranks], self.marker)

    def ended(self, timeout: float | None = None) -> int:
        """Wait until this process and every worker have ended (the pipe closed); the exit status."""
        timeout = self.bound if timeout is None else timeout
        code = self.process.wait(timeout=timeout)
        self.reader.join(timeout)
        assert not self.reader.is_alive(), f"a worker still holds the pipe {timeout} s after its launcher ended"
        deadline = time.monotonic() + timeout
        for pid in self.pids():  # a process closes its files before it has finished ending
            while alive(pid):
                assert time.monotonic() < deadline, f"process {pid} outlived its launcher by {timeout} s"
                time.sleep(0.01)
        self.close()
        return code

    def close(self) -> None:
        """Kill this process and its workers (by pid), if still there, wait for their end, and close
        the pipes."""
        pids = self.pids()
        kill(pids, self.marker)
        self.process.wait(timeout=self.bound)
        self.reader.join(self.bound)  # the pipe's end: every worker gone too
        deadline = time.monotonic() + self.bound
        while holding(self.marker, pids) and time.monotonic() < deadline:  # gone, not only its files closed
            time.sleep(0.01)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except BrokenPipeError:  # stdin with a line the child never read
                    pass

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send(self, fields: dict[str, Any]) -> None:
        """One JSON line to the child's stdin."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(fields) + "\n")
        self.process.stdin.flush()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-6000:]


ELASTIC = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""What ``torchrun --max-restarts`` needs on torch 2.13 with gloo to form its group again after a
restart (without it the restarted workers cannot rendezvous; torch's behaviour, with or without
trainstatus: docs/distributed.md)."""


def elastic(python: Path, script: Path, options: dict[str, Any], where: Path, *,
            env: dict[str, str] | None = None, bound: float = 120.0) -> Launch:
    """``torchrun --standalone --nproc_per_node=2 --max-restarts=1`` of ``script`` with ``options``
    (an ``exit_once`` among them: tests/_forkserver.py ``leave_once``)."""
    argv = [str(python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=1",
            "--monitor-interval=0.5", str(script), json.dumps(options)]
    return Launch(argv, where / f"elastic-{time.monotonic_ns()}.err", env={**ELASTIC, **(env or {})},
                  stdin=subprocess.DEVNULL, bound=bound)


def restarted(launch: Launch, name: str = "resumed") -> list[dict[str, Any]]:
    """The ``name`` events of every rank after the restart (those that came after ``leaving``), in
    rank order, once the run ended well: the restarted workers finished it."""
    try:
        code = launch.ended()
    finally:
        launch.close()
    assert code == 0, launch.stderr()
    events = launch.events
    [left] = [i for i, e in enumerate(events) if e["event"] == "leaving"]
    after = sorted((e for e in events[left + 1:] if e["event"] == name), key=lambda e: e["rank"])
    assert [e["rank"] for e in after] == [0, 1], events[left:]
    return after


class Workers(Launch):
    """``<script> serve`` in ``where`` (its stderr, and each worker's log): the fork server of
    tests/_forkserver.py. ``where`` is the marker that guards every kill: the workers, forked, carry
    the server's command line."""

    def __init__(self, python: Path, script: Path, where: Path, *, env: dict[str, str] | None = None,
                 bound: float = 120.0, defaults: dict[str, Any] | None = None) -> None:
        self.where = where
        self.defaults = defaults or {}  # options every run gets, unless it says otherwise
        self.runs: list[Run] = []
        super().__init__([str(python), str(script), "serve", str(where)], where / "server.err", env=env, bound=bound)

    def start(self, world: int = 2, **options: Any) -> Run:
        """Fork a run of ``world`` workers running ``options`` (the previous run must have ended)."""
        number, since = len(self.runs), len(self.events)
        logs = [str(self.where / f"run{number}-rank{rank}.log") for rank in range(world)]
        self.send({"run": number, "world": world, "port": free_port(), "logs": logs, "options": {**self.defaults, **options}})
        started = self.until(lambda f: f["event"] == "started" and f["run"] == number, f"run {number} started",
                             since=since)
        self.runs.append(Run(self, number, list(started["pids"]), logs, since))
        return self.runs[-1]

    def stop(self, first: int = 0) -> list[int]:
        """SIGKILL every worker still running of the runs from the ``first`` on, and wait for their
        end; those that were running."""
        left = [pid for run in self.runs[first:] for pid in holding(self.marker, run.pids)]
        kill(left, self.marker)
        for run in self.runs[first:]:
            run.exits()
        return left

    @contextlib.contextmanager
    def owned(self) -> Iterator[Workers]:
        """The server for one test: no worker of a run started meanwhile outlives it (one left is
        killed, and fails the test)."""
        first = len(self.runs)
        yield self
        left = self.stop(first)
        assert not left, f"workers {left} outlived the test"

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close, and kill anything of ``where`` left (a worker's own children too)."""
        try:
            self.close()
        finally:
            leftovers(str(self.where))

    def close(self) -> None:
        """Stop every run; the server ends with its stdin (then anything left is killed)."""
        try:
            self.stop()
        finally:
            if self.process.stdin is not None and not self.process.stdin.closed:
                self.process.stdin.close()
            try:
                self.process.wait(timeout=self.bound)
            except subprocess.TimeoutExpired:
                pass
            super().close()


class Run:
    """One run of ``Workers``: its events (the server tags them with its number), as ``Launch``
    gives a launch's."""

    def __init__(self, server: Workers, number: int, pids: list[int], logs: list[str], since: int) -> None:
        self.server, self.number, self.pids, self.logs, self.since = server, number, pids, logs, since

    @property
    def events(self) -> list[dict[str, Any]]:
        return [f for f in self.server.events[self.since:] if f["run"] == self.number]

    def event(self, name: str, rank: int, **match: Any) -> dict[str, Any]:
        """The run's first ``name`` event of ``rank`` that has the fields ``match``; fail once every
        worker of the run ended without it (or after the bound), with their output."""
        ended: set[int] = set()

        def wanted(f: dict[str, Any]) -> bool:
            if f["run"] != self.number:
                return False
            if f["event"] == "exited":
                ended.add(f["worker"])
            return len(ended) == len(self.pids) or (f["event"] == name and f["rank"] == rank
                                                    and all(f.get(k) == v for k, v in match.items()))

        what = f"{name!r} of run {self.number}, rank {rank} {match or ''}"
        try:
            found = self.server.until(wanted, what, since=self.since)
        except pytest.fail.Exception as exc:
            raise AssertionError(f"{exc}\n{self.stderr()}") from None
        if found["event"] != name:
            errors = [f"{e['type']}: {e['message']}" for e in self.events if e["event"] in ("error", "crashed")]
            raise AssertionError(f"every worker of run {self.number} ended before {what}; errors: {errors}\n"
                                 f"{self.stderr()}")
        return found

    def each(self, name: str) -> list[dict[str, Any]]:
        return [self.event(name, rank) for rank in range(len(self.pids))]

    def all(self, name: str, rank: int = 0) -> list[dict[str, Any]]:
        return [f for f in self.events if f["event"] == name and f["rank"] == rank]

    def exits(self) -> list[int]:
        """Wait for every worker of the run to end; their exit codes (negative: the signal), in rank order."""
        ended = [self.server.until(lambda f: f["event"] == "exited" and f["run"] == self.number
                                   and f["worker"] == rank, f"the end of run {self.number}, rank {rank}",
                                   since=self.since)
                 for rank in range(len(self.pids))]
        return [int(e["code"]) for e in ended]

    def finished(self, failed: int = 0) -> list[dict[str, Any]]:
        """Every rank's ``done``, exit 0, and ``failed`` events ``error`` (a child that stops at an
        error ends well: without this a run cut short would pass for whole)."""
        done = self.each("done")
        assert self.exits() == [0] * len(self.pids), self.stderr()
        errors = [e for e in self.events if e["event"] == "error"]
        assert len(errors) == failed, errors
        return done

    def kill(self, ranks: list[int]) -> None:
        """SIGKILL the workers of ``ranks`` that still run."""
        kill([self.pids[rank] for rank in ranks], self.server.marker)

    def stderr(self) -> str:
        return "".join(f"\n--- {Path(log).name}\n{Path(log).read_text(errors='replace')[-3000:]}"
                       for log in self.logs if os.path.exists(log))


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def holding(marker: str, pids: list[int] | None = None, *, environ: bool = False) -> list[int]:
    """Those of ``pids`` (default: every process but this one) that run and whose command line (or
    environment, with ``environ``) holds ``marker`` (a test's temporary folder, a child's options)."""
    found = []
    for pid in pids if pids is not None else [int(n) for n in os.listdir("/proc") if n.isdigit()]:
        if pid != os.getpid():
            try:
                with open(f"/proc/{pid}/{'environ' if environ else 'cmdline'}", "rb") as f:
                    if marker.encode() in f.read() and alive(pid):
                        found.append(pid)
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return found


def kill(pids: list[int], marker: str, *, environ: bool = False) -> None:
    """SIGKILL each of ``pids`` that still runs holding ``marker`` (a pid of ours that ended may
    have been given to another process since)."""
    for pid in pids:
        if holding(marker, [pid], environ=environ):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def leftovers(marker: str, *, environ: bool = False, timeout: float = 60.0) -> list[int]:
    """Every process but this one holding ``marker``, SIGKILLed until none is left; those found."""
    found: list[int] = []
    deadline = time.monotonic() + timeout
    while pids := holding(marker, environ=environ):
        assert time.monotonic() < deadline, f"processes {pids} holding {marker!r} outlived SIGKILL for {timeout} s"
        found += [pid for pid in pids if pid not in found]
        kill(pids, marker, environ=environ)
        time.sleep(0.05)
    return found


def recorded(status: Path, category: str) -> list[dict[str, Any]]:
    """The checkpoints the status file ``status`` lists under ``category`` (none before it exists):
    what the ranks recorded."""
    if not status.exists():
        return []
    with StatusStore(status) as store:
        return list(store.get(category, "checkpoints") or [])


def free_port() -> int:
    """A TCP port on loopback that nothing listens on (yet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
