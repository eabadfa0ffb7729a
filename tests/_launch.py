"""The children of the integration tests that run several ranks (``torchrun``'s agent and workers,
or ranks started directly): their JSON event lines read as they come, waited for within a bound,
and every process killed by pid, never a pid another process was given since.

Shared by tests/test_integration_dcp.py and tests/test_integration_accelerate.py.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


class Launch:
    """One process started for a test (a rank started directly, or the torchrun agent, whose workers
    write to the same pipe), its JSON lines read as they come by a thread."""

    def __init__(self, argv: list[str], stderr: Path, *, env: dict[str, str] | None = None,
                 stdin: int = subprocess.PIPE, bound: float = 120.0) -> None:
        self.bound = bound  # seconds: every wait of this launch, unless told
        self.stderr_path = stderr
        self.marker = argv[-1]  # the child's options: in the command line of each of its processes
        with open(stderr, "w") as err:
            self.process = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=err, text=True,
                                            env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
                                                 **(env or {})})
        self.events: list[dict[str, Any]] = []
        self.fresh: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with open(self.stderr_path.with_suffix(".out"), "w") as raw:  # every line, for a failure's post-mortem
            for line in self.process.stdout:
                raw.write(line)
                raw.flush()
                try:
                    fields = json.loads(line) if line.startswith("{") else None
                except ValueError:
                    continue
                if isinstance(fields, dict) and "event" in fields:
                    self.events.append(fields)
                    self.fresh.put(fields)
        self.fresh.put(None)  # the end: every process holding the pipe has ended

    def until(self, test: Callable[[dict[str, Any]], bool], what: str, timeout: float | None = None) -> dict[str, Any]:
        """The first event (from the start) that passes ``test``; fail with the children's stderr if
        they end first, or after ``timeout`` seconds."""
        timeout = self.bound if timeout is None else timeout
        for fields in list(self.events):
            if test(fields):
                return fields
        deadline = time.monotonic() + timeout
        while True:
            try:
                fields = self.fresh.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                for pid in holding(self.marker, self.pids()[1:]):  # the workers' stacks, into stderr (faulthandler)
                    os.kill(pid, signal.SIGUSR1)
                time.sleep(1)
                pytest.fail(f"no {what} in {timeout} s; the last events: {self.events[-6:]}\n{self.stderr()}")
            if fields is None:
                self.fresh.put(None)
                pytest.fail(f"the children ended before {what}:\n{self.stderr()}")
            if test(fields):
                return fields

    def event(self, name: str, rank: int, **match: Any) -> dict[str, Any]:
        return self.until(lambda f: f["event"] == name and f["rank"] == rank
                          and all(f.get(k) == v for k, v in match.items()), f"{name!r} of rank {rank} {match or ''}")

    def each(self, name: str, ranks: int = 2) -> list[dict[str, Any]]:
        return [self.event(name, rank) for rank in range(ranks)]

    def all(self, name: str, rank: int = 0) -> list[dict[str, Any]]:
        return [f for f in self.events if f["event"] == name and f["rank"] == rank]

    def pids(self) -> list[int]:
        """This process and the workers that printed their pid (after faulthandler's SIGUSR1 was set)."""
        return [self.process.pid] + [f["pid"] for f in self.events if f["event"] == "pid"]

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
        """Kill this process and its workers (by pid), if still there, and close the pipes."""
        kill(self.pids(), self.marker)
        self.process.wait(timeout=self.bound)
        self.reader.join(self.bound)  # the pipe's end: every worker gone too
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except BrokenPipeError:  # stdin with a line the child never read
                    pass

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-6000:]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def holding(marker: str, pids: list[int] | None = None) -> list[int]:
    """Those of ``pids`` (default: every process but this one) that run and whose command line holds
    ``marker`` (a test's temporary folder, a child's options)."""
    found = []
    for pid in pids if pids is not None else [int(n) for n in os.listdir("/proc") if n.isdigit()]:
        if pid != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read() and alive(pid):
                        found.append(pid)
            except OSError:
                continue
    return found


def kill(pids: list[int], marker: str) -> None:
    """SIGKILL each of ``pids`` that still runs a command line holding ``marker`` (a pid of ours that
    ended may have been given to another process since)."""
    for pid in pids:
        if pid in holding(marker, [pid]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
