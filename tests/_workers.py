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


# -- object stores (tests/test_object_store_processes.py, test_s3_processes.py) ----------------------


def object_counting_worker(url: str, options: dict[str, Any], worker: int, sets: int, counter: bool,
                           start: Any, results: Any) -> None:
    """Own keys by plain sets (and the shared counter by ``run_transaction``) on an object store URL.

    Puts (worker, conflicts, requests) on ``results``, or ("error", traceback) and exits non-zero.
    """
    try:
        store = StatusStore(url, storage_options=options, lock_timeout=60)  # type: ignore[call-arg]
        if not start.wait(60):
            raise RuntimeError("never started")
        category = own_category(worker)
        for i in range(sets):
            store.set(category, f"k{i % KEYS}", [worker, i])
            if counter:
                store.run_transaction(lambda s: s.set(*COUNTER, s.get(*COUNTER, 0) + 1))  # type: ignore[attr-defined]
        results.put((worker, store._storage.conflicts, store._storage.requests))  # type: ignore[attr-defined]
        store.close()
    except BaseException:
        results.put(("error", traceback.format_exc()))
        raise


def object_outage_worker(url: str, options: dict[str, Any], worker: int, after: int, start: Any, restarted: Any,
                         acknowledged: Any, failures: Any, results: Any) -> None:
    """Set ``s<i>`` = i in the worker's own category, through a server outage, until ``after`` sets
    were acknowledged once ``restarted`` is set. A failed set must raise ``TrainingStatusWriteError``
    (its PUT failed) or ``TrainingStatusReadError`` (the read before it failed) and leave the
    worker's category in memory as it was.

    ``start`` is a Barrier the parent joins too. ``acknowledged[worker]`` / ``failures[worker]``
    count as it goes; at the end puts (worker, [acknowledged i...], [failed i...], first failure
    message) on ``results``.
    """
    import time

    from trainstatus import TrainingStatusReadError, TrainingStatusWriteError

    try:
        store = StatusStore(url, storage_options=options, lock_timeout=60)  # type: ignore[call-arg]
        start.wait(60)  # all writers open before any writes
        category = own_category(worker)
        done: list[int] = []
        failed: list[int] = []
        message = None
        since_restart = 0
        give_up = time.monotonic() + 90
        i = 0
        while since_restart < after:
            if time.monotonic() > give_up:
                raise RuntimeError("the parent never restarted the server")
            back = restarted.is_set()
            # Only this worker writes its category: the rest of memory may legitimately take in
            # other writers' values read during the failed call.
            before = store.to_dict().get(category)
            try:
                store.set(category, f"s{i}", i)
            except (TrainingStatusWriteError, TrainingStatusReadError) as exc:
                failed.append(i)
                message = message or str(exc)
                failures[worker] += 1
                after_failure = store.to_dict().get(category)
                if after_failure != before:
                    raise AssertionError(f"memory changed by a failed set: {before} -> {after_failure}") from exc
                time.sleep(0.02)
            else:
                done.append(i)
                acknowledged[worker] += 1
                since_restart += back
                if store.get(category, f"s{i}") != i:
                    raise AssertionError(f"acknowledged s{i} not in memory")
                time.sleep(0.01)  # a trainer's pace, not a tight loop
            i += 1
        results.put((worker, done, failed, message))
        store.close()
    except BaseException:
        results.put(("error", traceback.format_exc()))
        raise
