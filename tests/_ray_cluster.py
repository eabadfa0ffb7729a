"""The local Ray cluster of tests/test_integration_ray.py, and its driver (tests/_ray_trainer.py).

The driver starts a cluster of its own (``ray.init`` with 2 CPUs and a temp folder of the test's
own: never another Ray on the machine) and serves the test's requests. Every process of that cluster
(the driver, Ray's GCS and raylet, the controller and worker actors) carries one environment variable
with a value no other process has (``MARKER``): ``processes()`` finds them all in ``/proc`` whatever
their parents, ``kill_everything()`` SIGKILLs them (the test's "driver and every Ray process killed"),
and the module's teardown checks that none outlives it.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

DRIVER = Path(__file__).resolve().parent / "_ray_trainer.py"
MARKER = "TRAINSTATUS_RAY_TEST"

# Ray's settings for a small test cluster: no token file in ~/.ray, no usage report (no network), no
# preemption watcher or metrics actors (two processes less per run), and the controller polling the
# workers every 0.2 s instead of 2 s (a report is registered sooner; the order of events is Ray's own).
SETTINGS = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "PYTHONWARNINGS": "ignore",
}


class Cluster:
    """One driver (and the cluster it started) at a time; ``start()`` again after ``kill_everything()``."""

    def __init__(self, python: Path, env: dict[str, str]) -> None:
        self.python = python
        self.marker = uuid.uuid4().hex
        # Short: Ray's socket paths under it must stay below the 107 characters of a unix socket.
        self.temp_dir = tempfile.mkdtemp(prefix="tsray-")
        # RAY_TMPDIR: Ray Train's lock files (TempFileLock) go to $RAY_TMPDIR/_ray_lockfiles, else
        # /tmp/_ray_lockfiles, a folder the first user to run Ray on the machine owns: another user's
        # run then fails on it (PermissionError). The cluster's own folder instead.
        self.env = {**os.environ, **SETTINGS, **env, MARKER: self.marker, "RAY_TMPDIR": self.temp_dir}
        self.process: subprocess.Popen[str] | None = None
        self.answers: queue.Queue[str] = queue.Queue()
        self.starts = 0

    def start(self, timeout: float = 300) -> None:
        self.starts += 1
        self.stderr = open(os.path.join(self.temp_dir, f"driver-{self.starts}.err"), "w+")
        self.process = subprocess.Popen(
            [str(self.python), str(DRIVER), json.dumps({"temp_dir": self.temp_dir})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=self.env,
            start_new_session=True,
        )
        self.answers = queue.Queue()
        self.reader = threading.Thread(target=self._read, args=(self.process, self.answers), daemon=True)
        self.reader.start()
        self._next("ready", timeout)

    def _read(self, process: subprocess.Popen[str], answers: queue.Queue[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith('{"event"'):
                answers.put(line)
        answers.put("")

    def _next(self, event: str, timeout: float) -> dict[str, Any]:
        try:
            line = self.answers.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"the Ray driver gave no {event!r} line in {timeout} s:\n{self.tail()}")
        if not line:
            pytest.fail(f"the Ray driver ended before its {event!r} line:\n{self.tail()}")
        fields: dict[str, Any] = json.loads(line)
        assert fields["event"] == event, fields
        assert "failed" not in fields, fields["failed"]
        return fields

    def send(self, **request: Any) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()

    def ask(self, timeout: float = 600, **request: Any) -> dict[str, Any]:
        """Send ``request`` and wait for its answer."""
        self.send(**request)
        return self._next("answer", timeout)

    def tail(self) -> str:
        """The end of the driver's stderr (Ray's own lines), for a failure's message."""
        with open(self.stderr.name) as f:
            return f.read()[-5000:]

    def processes(self) -> list[int]:
        """Every live process of this cluster (zombies have no environment left to read)."""
        needle = f"{MARKER}={self.marker}\0".encode()
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/environ", "rb") as f:
                        if needle in f.read():
                            found.append(int(name))
                except OSError:  # gone meanwhile
                    pass
        return found

    def kill_everything(self, timeout: float = 60) -> int:
        """SIGKILL the driver and every process of its cluster, until none is left; how many."""
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while pids := self.processes():
            assert time.monotonic() < deadline, f"processes of the test's Ray cluster still alive: {pids}"
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        if self.process is not None:
            self.process.wait(timeout=timeout)
            self.reader.join(timeout)
            for stream in (self.process.stdin, self.process.stdout, self.stderr):
                if stream is not None:
                    stream.close()
            self.process = None
        return len(killed)

    def close(self) -> list[int]:
        """Shut the cluster down; the processes that were still alive after it (killed then)."""
        if self.process is not None and self.process.poll() is None:
            try:
                self.send(do="quit")
                self.process.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                pass
        deadline = time.monotonic() + 30  # Ray's processes end a moment after ray.shutdown() returned
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.kill_everything()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left


def events(path: Path) -> list[dict[str, Any]]:
    """The training function's events so far (tests/_ray_trainer.py ``log``)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(path: Path, event: str, cluster: Cluster, timeout: float = 300) -> dict[str, Any]:
    """The first ``event`` of the training function; fails if the driver ended first."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in events(path) if e["event"] == event]
        if found:
            return found[0]
        if cluster.process is None or cluster.process.poll() is not None:
            pytest.fail(f"the Ray driver ended before the training function's {event!r}:\n{cluster.tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {event!r} from the training function in {timeout} s:\n{cluster.tail()}")
        time.sleep(0.2)
