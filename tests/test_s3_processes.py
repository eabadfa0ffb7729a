"""S3 only: a 412 storm, threads, one store through an outage, an emptied server.

What every object store must pass (4 processes, a counter, a server killed mid-run) runs on S3 too,
in test_object_store_processes.py.

Real processes (spawn) and threads against moto's server on loopback (tests/_s3server.py, which
serializes requests so that conditional PUTs are atomic as on S3). Nothing here measures time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3  # noqa: F401 - in the test extra: missing must fail, not skip
import moto  # noqa: F401
import pytest
from _helpers import run_threads
from _processes import assert_nothing_lost, run_workers
from _s3server import Bucket, S3Server
from _workers import object_counting_worker, own_category

from trainstatus import StatusStore, TrainingStatusWriteError

ROOT = Path(__file__).resolve().parent.parent
# Fail fast while the server is down: one attempt per request (the default is botocore's 3).
FAST_FAIL = {"retries": {"total_max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10}

# Real processes against a real S3 server (3 to 9 s each): the long group, a step of its own in .ci/run.
pytestmark = pytest.mark.long


def stored(s3: Bucket) -> dict[str, Any]:
    data = s3.read()
    assert data is not None
    return json.loads(data)  # type: ignore[no-any-return]


def test_412_storm_on_one_object_loses_nothing(s3: Bucket, reliability: Any) -> None:
    workers, sets = 5, 12
    reports = run_workers(object_counting_worker, lambda w: (s3.url(), s3.storage_options, w, sets, False), workers)
    assert_nothing_lost(stored(s3), workers, sets)
    conflicts = sum(c for _, c, _ in reports)
    assert conflicts > 0, "no 412 at all: the writers never raced, so this test tested nothing"
    # Each conflict costs a GET and one more PUT, on top of one PUT per set.
    assert sum(r for _, _, r in reports) >= workers * sets + 2 * conflicts
    reliability.add("concurrent_writers", workers, source="test_s3_processes")
    reliability.add("concurrent_sets", workers * sets, source="test_s3_processes")


def test_threads_with_a_store_each_and_sharing_one(s3: Bucket) -> None:
    sets = 15
    own = [StatusStore(s3.url(), storage_options=s3.storage_options, lock_timeout=60)  # type: ignore[call-arg]
           for _ in range(4)]
    shared = StatusStore(s3.url(), storage_options=s3.storage_options, lock_timeout=60)  # type: ignore[call-arg]

    def writer(store: StatusStore, w: int) -> Any:
        def run() -> None:
            for i in range(sets):
                store.set(own_category(w), f"k{i}", [w, i])
        return run

    run_threads([writer(store, w) for w, store in enumerate(own)]
                + [writer(shared, w) for w in range(4, 8)])
    assert_nothing_lost(stored(s3), 8, sets)
    assert sum(store._storage.conflicts for store in [*own, shared]) > 0  # type: ignore[attr-defined]


# -- the server dies and comes back -------------------------------------------------------------------


@pytest.fixture
def own_server() -> Iterator[S3Server]:
    """A server of this test's own, which it may kill; it keeps objects across restarts like S3."""
    with S3Server(persistent=True) as server:
        yield server


def test_one_store_through_an_outage_keeps_memory_and_catches_up(own_server: S3Server) -> None:
    bucket = Bucket(own_server, own_server.new_bucket())
    store = StatusStore(bucket.url(), storage_options=own_server.storage_options)  # type: ignore[call-arg]
    for i in range(5):
        store.set("before", f"k{i}", i)
    memory = store.to_dict()
    own_server.kill()
    with pytest.raises(TrainingStatusWriteError) as caught:  # after botocore's default retries
        store.set("during", "k", 1)
    assert isinstance(caught.value, OSError) and caught.value.path == bucket.url()
    assert store.to_dict() == memory
    own_server.start()
    other = StatusStore(bucket.url(), storage_options=own_server.storage_options)  # type: ignore[call-arg]
    other.set("other", "k", "meanwhile")
    store.set("after", "k", 2)
    document = stored(bucket)
    assert document["before"] == {f"k{i}": i for i in range(5)}
    assert document["other"] == {"k": "meanwhile"} and document["after"] == {"k": 2}
    assert "during" not in document  # it never reached the server
    assert store.to_dict() == document


def test_a_restarted_empty_server_gets_back_everything_the_store_knew() -> None:
    # A server that lost everything (moto without --state: the bucket too). Once the bucket exists
    # again, the next write finds no object (If-Match answers 404) and writes what the store knew.
    with S3Server() as server:
        bucket = Bucket(server, server.new_bucket())
        store = StatusStore(bucket.url(), storage_options={**server.storage_options,  # type: ignore[call-arg]
                                                            "config_kwargs": FAST_FAIL})
        store.set("a", "x", 1)
        store.set("b", "y", [1, 2])
        server.restart()
        server.client().create_bucket(Bucket=bucket.name)
        store.set("c", "z", 3)
        assert stored(bucket) == store.to_dict()
        assert {k: stored(bucket)[k] for k in "abc"} == {"a": {"x": 1}, "b": {"y": [1, 2]}, "c": {"z": 3}}
