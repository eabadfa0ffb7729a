"""Functions run in child processes by the concurrency and locking tests.

Imported by name in children started with the "spawn" context, so they live in their own module
(not in a test file, which a spawned child would import with all of pytest's fixtures).
Each worker reports failures by raising (non-zero exit code) or through the queue/pipe it gets.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

from trainstatus import StatusStore, TrainingStatusLockTimeout

COUNTER = ("shared", "count")
KEYS = 50  # own keys per worker; set i goes to key i % KEYS, so each key has a known last value


def expected_own(worker: int, sets: int) -> dict[str, Any]:
    """What ``work`` leaves in the worker's own category."""
    return {f"k{i % KEYS}": [worker, i] for i in range(sets)}


def own_category(worker: int) -> str:
    return f"worker{worker}"


def work(store: StatusStore, worker: int, sets: int) -> None:
    """The shared workload: a plain set of an own key, then an increment inside a transaction."""
    category = own_category(worker)
    for i in range(sets):
        store.set(category, f"k{i % KEYS}", [worker, i])
        with store.transaction():
            count = store.get(*COUNTER, 0)
            store.set(*COUNTER, count + 1)


def counting_worker(path: str, worker: int, sets: int, durable: bool, start: Any) -> None:
    """Open a store of our own on ``path`` and run the shared workload once ``start`` is set."""
    store = StatusStore(path, durable=durable, lock_timeout=60)
    if not start.wait(60):
        raise RuntimeError("never started")
    work(store, worker, sets)
    store.close()


def same_key_writer(path: str, value: str, sets: int, start: Any) -> None:
    """Set one shared key over and over to ``value``; a reader checks the file always parses."""
    store = StatusStore(path, durable=False, lock_timeout=60)
    if not start.wait(60):
        raise RuntimeError("never started")
    for i in range(sets):
        store.set("shared", "same", {"writer": value, "i": i})
    store.close()


def hold_transaction(path: str, held: Any, release: Any, key: str = "holder") -> None:
    """Open a transaction, set ``holder/<key>``, signal ``held``, wait for ``release``, commit."""
    store = StatusStore(path, durable=False, lock_timeout=10)
    with store.transaction():
        store.set("holder", key, os.getpid())
        held.set()
        if not release.wait(60):
            raise RuntimeError("never released")
    store.close()


def try_set(path: str, lock_timeout: float, result: Any) -> None:
    """Try one set with a short lock_timeout; put ("timeout", lock_file, message), ("ok",) or an error."""
    try:
        store = StatusStore(path, durable=False, lock_timeout=lock_timeout)
        store.set("intruder", "k", os.getpid())
    except TrainingStatusLockTimeout as exc:
        result.put(("timeout", exc.lock_file, str(exc), isinstance(exc, TimeoutError)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        result.put(("error", traceback.format_exc()))
    else:
        result.put(("ok",))
