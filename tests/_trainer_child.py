"""A training run in a child process, read line by line: the integrations' tests' one harness.

The child (tests/_sb3_trainer.py, tests/_lightning_trainer.py, tests/_transformers_trainer.py)
prints one JSON object with an ``event`` a line, flushed; other lines (a library's own output) are
skipped. A thread reads them as they come: a selector on the pipe would not see lines already read
into the text buffer.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest


class ChildTrainer:
    """One run of ``script`` (set by a subclass) with ``options`` as its JSON argument."""

    script: Path

    def __init__(self, python: Path, env: dict[str, str] | None = None, **options: Any) -> None:
        self.process = subprocess.Popen(
            self.command(python, json.dumps(options)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
        )
        self.events: dict[str, dict[str, Any]] = {}  # the last of each kind
        self.removed: list[dict[str, Any]] = []  # every "removed" event, in order
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def command(self, python: Path, options: str) -> list[str]:
        """The command line of the run: ``script`` with its options (a launcher's, in a subclass)."""
        return [str(python), str(self.script), options]

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            # A library's own lines may look like JSON objects too (the Trainer prints its logs as
            # Python dicts): only the child's events count.
            try:
                fields = json.loads(line) if line.startswith("{") else None
            except ValueError:
                continue
            if isinstance(fields, dict) and "event" in fields:
                self.lines.put(line)
        self.lines.put("")  # the end

    def until(self, event: str, timeout: float = 120.0) -> dict[str, Any]:
        """Read lines until ``event``; fail with the child's stderr if it ends first."""
        deadline = time.monotonic() + timeout
        while event not in self.events:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                pytest.fail(f"the trainer printed no {event!r} line in {timeout} s")
            if not line:
                self.process.wait()
                stderr = self.process.stderr.read() if self.process.stderr else ""
                pytest.fail(f"the trainer ended (exit {self.process.returncode}) before {event!r}:\n{stderr[-5000:]}")
            fields = json.loads(line)
            if fields["event"] == "removed":
                self.removed.append(fields)
            self.events[fields["event"]] = fields
        return self.events[event]

    def finish(self) -> dict[str, dict[str, Any]]:
        """Wait for the run's end (exit 0); its events, the last one ``done``."""
        try:
            self.until("done", timeout=300)
            assert self.process.wait(timeout=60) == 0
        finally:
            self.kill()
        return self.events

    def kill_after(self, seconds: float) -> None:
        """SIGKILL the run after ``seconds``: a random moment of it."""
        time.sleep(seconds)
        self.kill()

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.reader.join()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def users_line(script: Path, call: str) -> str:
    """``name:line`` of the line of ``script`` marked "# the user's call" that holds ``call``: where
    a warning issued inside that call (by trainstatus, or by the training library's machinery
    running an integration) should point."""
    for number, text in enumerate(script.read_text().splitlines(), 1):
        if call in text and "# the user's call" in text:
            return f"{script.name}:{number}"
    raise AssertionError(f"no line of {script} holds {call!r} marked as the user's call")


class OwnResume:
    """How often a library's own resume failed on the same kills, as the children report it: an
    event whose ``ok`` is True, False, or None when there was nothing to resume from."""

    def __init__(self) -> None:
        self.tried = self.failed = 0

    def add(self, fields: dict[str, Any]) -> None:
        if fields["ok"] is not None:
            self.tried += 1
            self.failed += not fields["ok"]
