"""Many writer processes on one object, on every object store, and a server killed mid-run.

Real processes (spawn) against real servers on loopback: moto's S3 server (tests/_s3server.py),
fake-gcs-server and Azurite (tests/_objectservers.py). Nothing here measures time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _processes import (
    SPAWN,
    TIMEOUT,
    assert_nothing_lost,
    run_workers,
    started,
    wait_until,
)
from _workers import COUNTER, object_counting_worker, object_outage_worker, own_category

ROOT = Path(__file__).resolve().parent.parent

# Real processes against real servers (3 to 15 s each): the long group, a step of its own in .ci/run.
pytestmark = pytest.mark.long

# Fail fast while the S3 server is down: one attempt per request (the default is botocore's 3).
FAST_FAIL = {"retries": {"total_max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10}


def stored(bucket: Any) -> dict[str, Any]:
    data = bucket.read()
    assert data is not None
    return json.loads(data)  # type: ignore[no-any-return]


def assert_refuses_a_stale_condition(bucket: Any, key: str = "probe/stale-condition.json") -> None:
    """The server refuses a create over an object and an upload on a version gone (so a pass means something)."""
    assert bucket.put_if(b"first", None, key) and not bucket.put_if(b"again", None, key)
    version = bucket.etag(key)
    assert bucket.put_if(b"second", version, key) and not bucket.put_if(b"stale", version, key)


def test_the_servers_refuse_a_stale_condition(bucket: Any) -> None:
    assert_refuses_a_stale_condition(bucket)


def test_processes_write_own_keys_and_count_with_run_transaction(bucket: Any, reliability: Any) -> None:
    workers, sets = 4, 12
    reports = run_workers(object_counting_worker, lambda w: (bucket.url(), bucket.storage_options, w, sets, True), workers)
    document = stored(bucket)
    assert_nothing_lost(document, workers, sets)
    assert document[COUNTER[0]] == {COUNTER[1]: workers * sets}  # exact: no increment lost or doubled
    assert all(requests > 0 for _, _, requests in reports)
    assert sum(conflicts for _, conflicts, _ in reports) > 0, "the writers never raced: this tested nothing"
    reliability.add("concurrent_writers", workers, source=f"test_object_store_processes[{bucket.scheme}]")
    reliability.add("concurrent_sets", 2 * workers * sets, source=f"test_object_store_processes[{bucket.scheme}]")


@pytest.fixture(params=["s3", "gcs", "azure"])
def own_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A server of this test's own, which it may kill; it keeps objects across restarts."""
    if request.param == "s3":
        from _s3server import S3Server

        with S3Server(persistent=True) as server:
            yield server
        return
    import _objectservers

    if request.param == "gcs":
        with _objectservers.GCSServer(persistent=True) as server:
            yield server
        return
    # Azurite loses its last acknowledged writes to a SIGKILL (see OutageProxy): the endpoint
    # vanishes in front of it instead.
    with _objectservers.AzuriteServer() as azurite:
        proxy = _objectservers.OutageProxy(azurite).start()
        try:
            yield proxy
        finally:
            proxy.close()


def test_server_killed_mid_run_then_restarted_loses_nothing_acknowledged(own_server: Any) -> None:
    workers, after = 3, 5
    if not hasattr(own_server, "container"):  # moto's S3Server
        from _s3server import Bucket

        bucket: Any = Bucket(own_server, own_server.new_bucket())
        options = {**own_server.storage_options, "config_kwargs": FAST_FAIL}
    else:
        bucket = own_server.container(own_server.new_bucket())
        options = own_server.storage_options
    assert_refuses_a_stale_condition(bucket)  # this server of its own too
    acknowledged, failures = SPAWN.Array("i", workers), SPAWN.Array("i", workers)
    start, restarted, results = SPAWN.Barrier(workers + 1), SPAWN.Event(), SPAWN.Queue()
    processes = [SPAWN.Process(target=object_outage_worker,
                               args=(bucket.url(), options, w, after, start, restarted, acknowledged, failures, results))
                 for w in range(workers)]
    with started(processes, results) as reports:
        start.wait(TIMEOUT)
        wait_until(lambda: min(acknowledged) >= 3, "every writer had sets acknowledged", processes, results)
        own_server.kill()
        wait_until(lambda: min(failures) >= 1, "every writer saw the server gone", processes, results)
        own_server.start()  # same port, same objects
        restarted.set()
    document = stored(bucket)
    for worker, done, failed, message in reports:
        assert len(done) >= 3 + after and failed
        # Its upload failing, or the read before an upload (after a conflict) failing.
        assert message.startswith((f"Could not save {bucket.url()}: the endpoint could not be reached (",
                                   f"Cannot read {bucket.url()}: the endpoint could not be reached ("))
        found = document[own_category(worker)]
        assert {f"s{i}": i for i in done}.items() <= found.items(), f"worker {worker} lost acknowledged sets"
        assert set(found) <= {f"s{i}" for i in done + failed}  # nothing it never set


# -- the benchmark still runs -------------------------------------------------------------------------


def test_benchmark_quick_smoke(tmp_path: Path) -> None:
    json_path = tmp_path / "object_store_writers.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "object_store_writers.py"), "--quick", "--json", str(json_path),
         "--no-plot"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads(json_path.read_text())
    assert report["benchmark"] == "object_store_writers" and report["quick"] is True
    assert [(e["backend"], e["workers"], e["bare"]) for e in report["results"]] == [
        (backend, workers, bare) for backend in ("s3", "gcs", "azure") for workers, bare in ((1, False), (4, False), (1, True))]
    for entry in report["results"]:
        assert entry["sets"] > 0 and entry["sets_per_s"] > 0
        assert 0 < entry["p50_us"] <= entry["p99_us"]
        assert entry["conflicts_per_set"] == round(entry["conflicts"] / entry["sets"], 3)
        assert entry["requests_per_set"] >= 1
        if entry["workers"] == 1:
            assert entry["conflicts"] == 0  # one writer never conflicts
    assert f"JSON: {json_path}" in done.stdout
    assert "conflicts/set" in done.stdout
    assert {p.name for p in tmp_path.iterdir()} == {"object_store_writers.json"}
