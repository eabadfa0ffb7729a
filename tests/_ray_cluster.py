"""The local Ray cluster of tests/test_integration_ray.py, and its driver (tests/_ray_trainer.py).

The driver starts a cluster of its own (``ray.init`` with 2 CPUs and a temp folder of the test's
own: never another Ray on the machine) and serves the test's requests. Every process of that cluster
(the driver, Ray's GCS and raylet, the controller and worker actors) carries one environment variable
with a value no other process has (``MARKER``): ``processes()`` finds them all in ``/proc`` whatever
their parents, ``kill_everything()`` SIGKILLs them (the test's "driver and every Ray process killed"),
and the module's teardown checks that none outlives it (tests/_launch.py's ``holding`` and
``leftovers``, by the environment).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _launch import Launch, holding, leftovers

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
    """One driver (and the cluster it started) at a time; ``start()`` again after ``kill_everything()``.
    The driver is a ``Launch`` of tests/_launch.py (its answers read as they come, bounded waits);
    the cluster's processes are found, and killed, by the marker in their environment."""

    def __init__(self, python: Path, env: dict[str, str]) -> None:
        self.python = python
        self.marker = uuid.uuid4().hex
        self.needle = f"{MARKER}={self.marker}\0"  # in /proc/<pid>/environ of every process of the cluster
        # Short: Ray's socket paths under it must stay below the 107 characters of a unix socket.
        self.temp_dir = tempfile.mkdtemp(prefix="tsray-")
        # RAY_TMPDIR: Ray Train's lock files (TempFileLock) go to $RAY_TMPDIR/_ray_lockfiles, else
        # /tmp/_ray_lockfiles, a folder the first user to run Ray on the machine owns: another user's
        # run then fails on it (PermissionError). The cluster's own folder instead.
        self.env = {**SETTINGS, **env, MARKER: self.marker, "RAY_TMPDIR": self.temp_dir}
        self.driver: Launch | None = None
        self.answered = 0  # the driver's lines taken so far: the next answer is the one after them
        self.starts = 0

    @property
    def process(self) -> subprocess.Popen[str] | None:
        return None if self.driver is None else self.driver.process

    def start(self, timeout: float = 300) -> None:
        self.starts += 1
        self.log = Path(self.temp_dir) / f"driver-{self.starts}.err"
        # A session of its own: the cluster is killed by pid, never by a signal to the test's group.
        self.driver = Launch([str(self.python), str(DRIVER), json.dumps({"temp_dir": self.temp_dir})], self.log,
                             env=self.env, bound=600, session=True)
        self.answered = 0
        self._next("ready", timeout)

    def _next(self, event: str, timeout: float) -> dict[str, Any]:
        assert self.driver is not None
        fields = self.driver.until(lambda f: True, f"the Ray driver's {event!r} line", timeout, since=self.answered)
        self.answered += 1
        assert fields["event"] == event, fields
        assert "failed" not in fields, fields["failed"]
        return fields

    def send(self, **request: Any) -> None:
        assert self.driver is not None
        self.driver.send(request)

    def ask(self, timeout: float = 600, **request: Any) -> dict[str, Any]:
        """Send ``request`` and wait for its answer."""
        self.send(**request)
        return self._next("answer", timeout)

    def tail(self) -> str:
        """The end of the driver's stderr (Ray's own lines), for a failure's message."""
        return self.log.read_text(errors="replace")[-5000:]

    def processes(self) -> list[int]:
        """Every live process of this cluster (zombies have no environment left to read)."""
        return holding(self.needle, environ=True)

    def kill_everything(self, timeout: float = 60) -> int:
        """SIGKILL the driver and every process of its cluster, until none is left; how many."""
        killed = leftovers(self.needle, environ=True, timeout=timeout)
        if self.driver is not None:
            self.driver.close()  # nothing left to kill: the driver reaped, its pipes closed
            self.driver = None
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
