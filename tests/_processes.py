"""Running many writer processes on one status document, for the object store process tests."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

from _workers import expected_own, own_category

SPAWN = multiprocessing.get_context("spawn")
TIMEOUT = 120


@contextlib.contextmanager
def started(processes: list[Any], results: Any) -> Iterator[list[Any]]:
    """Start ``processes``; on leaving the block, put one report of each (from ``results``) into
    the list yielded, sorted, and join them; kill any still alive. A child that reported an error
    (or hung) fails the test, with the child's traceback."""
    reports: list[Any] = []
    for process in processes:
        process.start()
    try:
        yield reports
        reports.extend(results.get(timeout=TIMEOUT) for _ in processes)
        for process in processes:
            process.join(TIMEOUT)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    errors = [r[1] for r in reports if r[0] == "error"]
    assert not errors, errors[0]
    reports.sort()


def run_workers(target: Any, args_for: Any, workers: int) -> list[Any]:
    """Run ``workers`` spawned processes on ``target(*args_for(w), start, results)`` at once;
    their reports, sorted by worker."""
    start, results = SPAWN.Event(), SPAWN.Queue()
    processes = [SPAWN.Process(target=target, args=(*args_for(w), start, results)) for w in range(workers)]
    with started(processes, results) as reports:
        start.set()
    assert [p.exitcode for p in processes] == [0] * workers
    return reports


def assert_nothing_lost(document: dict[str, Any], workers: int, sets: int) -> None:
    for w in range(workers):
        assert document[own_category(w)] == expected_own(w, sets), f"worker {w} lost sets"


def wait_until(condition: Any, what: str, processes: list[Any], results: Any, timeout: float = 60) -> None:
    """Poll ``condition``; fail at once, with the child's traceback, if a worker died first."""
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not condition():
            if any(not p.is_alive() for p in processes):
                report = results.get(timeout=10)
                raise AssertionError(f"a worker ended before {what}: {report[1] if report[0] == 'error' else report}")
            if done.wait(0.01):
                raise AssertionError(f"timed out waiting until {what}")
    finally:
        deadline.cancel()
