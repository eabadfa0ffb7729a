#!/usr/bin/env python3
"""Writer processes on one status object, per object store: sets/s, latency, conflict retries.

For S3, GCS and Azure Blob, each against its server on loopback, started here as in the tests
(moto's server mode, tests/_s3server.py, requests served one at a time so that conditional writes
are atomic as on S3; fake-gcs-server and Azurite, tests/_objectservers.py): 1 and 4 processes,
each with its own StatusStore on the same object, each setting its own key over and over for a
fixed time, and, as the floor, one process sending the bare conditional upload of the same bytes
with the SDK (the adapter's one request, no store: no encoding, no merge, no memory). There is no
lock: every set is one conditional upload, and a writer that loses the race (412, or 409 for a
create on Azure) reads the object again, lays its change over it and retries.

Reported per configuration: aggregate sets/s (median of the rounds), p50 and p99 latency of a set,
conflicts per set and requests per set. After every run the object is read back: each writer's
key must hold the last value its set acknowledged. Configurations are interleaved round by round,
so a slow spell of the machine hits all of them alike.

What it measures is the protocol's cost against a server one hop away that answers in about a
millisecond; a real endpoint answers in tens of milliseconds, so absolute rates there are lower
and, with more time in flight per write, conflicts per set higher.

  python benchmarks/object_store_writers.py              # 3 rounds of 2 s per configuration, about 2 minutes
  python benchmarks/object_store_writers.py --quick      # 1 round of 0.25 s: a smoke test
  python benchmarks/object_store_writers.py --backend gcs
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the tests' loopback servers
import _common  # noqa: E402
from _objectservers import AzuriteServer, GCSServer  # noqa: E402
from _s3server import Bucket, S3Server  # noqa: E402

from trainstatus import StatusStore  # noqa: E402

BACKENDS = ("s3", "gcs", "azure")
# (label, writer processes, bare): "bare" is the SDK's conditional upload alone
CONFIGS = (("1 writer", 1, False), ("4 writers", 4, False), ("bare upload", 1, True))
CATEGORY = "writers"
KEY = "run/run_logs/training_status.json"
TIMEOUT = 120.0
# fork where there is one: writers start in milliseconds with the SDKs already imported (each still
# makes its own client, after the fork). The parent runs no threads, so forking it is safe.
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def prefill(url: str, options: dict[str, Any]) -> None:
    with StatusStore(url, storage_options=options) as store:  # type: ignore[call-arg]
        _common.prefill(store)


def writer(url: str, options: dict[str, Any], key: str, duration: float, bare: bool, barrier: Any, queue: Any) -> None:
    """One writer process: its own store on the shared object (or, ``bare``, the SDK's conditional
    upload of the document's bytes, each on the version the last one made); reports through ``queue``."""
    try:
        store = StatusStore(url, storage_options=options, lock_timeout=TIMEOUT)  # type: ignore[call-arg]
        store.set(CATEGORY, key, -1)  # the client is made and connected before the clock starts
        storage: Any = store._storage
        conflicts0, requests0 = storage.conflicts, storage.requests
        data = storage.read()  # the bytes a set writes, give or take the changed value
        version = storage._version
        latencies: list[int] = []
        clock = time.perf_counter_ns
        barrier.wait(TIMEOUT)
        deadline = time.monotonic() + duration
        i = 0
        while time.monotonic() < deadline:
            start = clock()
            if bare:
                version = storage._put(storage._connection(), storage.name, data, version)
            else:
                store.set(CATEGORY, key, i)
            latencies.append(clock() - start)
            i += 1
        end = time.monotonic()
        if bare:
            storage.forget()
            store.set(CATEGORY, key, i - 1)  # what verify() expects of this writer
        queue.put(("ok", key, i, latencies, end, storage.conflicts - conflicts0, storage.requests - requests0))
        store.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put(("error", key, repr(exc)))


def run(server: Any, container: Any, workers: int, bare: bool, duration: float) -> dict[str, Any]:
    url = container.url(KEY)
    options = server.storage_options
    prefill(url, options)
    reports, start = _common.run_writer_processes(
        multiprocessing.get_context(START_METHOD), writer, lambda w: (url, options, f"p{w}", duration, bare),
        workers, TIMEOUT)
    verify(container, {r[1]: r[2] - 1 for r in reports})
    sets = sum(r[2] for r in reports)
    conflicts = sum(r[5] for r in reports)
    requests = sum(r[6] for r in reports)
    seconds = max(r[4] for r in reports) - start
    return {
        "sets": sets,
        "seconds": round(seconds, 4),
        "sets_per_s": round(sets / seconds, 1),
        "conflicts": conflicts,
        "conflicts_per_set": round(conflicts / sets, 3),
        "requests_per_set": round(requests / sets, 3),
        **_common.summary_us([value for r in reports for value in r[3]]),
    }


def verify(container: Any, last: dict[str, int]) -> None:
    """Every writer's key holds the last value its set acknowledged."""
    document = json.loads(container.read(KEY))
    found = {key: document.get(CATEGORY, {}).get(key) for key in last}
    wrong = {key: (found[key], value) for key, value in last.items() if found[key] != value}
    if wrong:
        raise AssertionError(f"acknowledged values missing from {container.url(KEY)} (found, acknowledged): {wrong}")


def new_container(backend: str, server: Any) -> Any:
    name = server.new_bucket("bench")
    return Bucket(server, name) if backend == "s3" else server.container(name)


def describe_machine(info: dict[str, Any]) -> str:
    versions = ", ".join(f"{name} {info[name]}" for name in ("boto3", "moto", "google-cloud-storage",
                                                              "azure-storage-blob") if name in info)
    return (
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB; {info['os']}; Python {info['python']}; "
        f"trainstatus {info['trainstatus']}, orjson {info['orjson']}, {versions}"
    )


def render(report: dict[str, Any]) -> str:
    lines = [
        f"trainstatus on object stores (servers on loopback), {report['date']}",
        f"machine: {describe_machine(report['machine'])}",
        f"servers: {'; '.join(f'{b}: {s}' for b, s in report['servers'].items())}",
        f"each writer process sets its own key on one ~1 KB object; {report['rounds']} round(s) of "
        f"{report['duration_s']} s per configuration, interleaved; sets/s is the median of the rounds; "
        "bare upload: the SDK's conditional upload of the same bytes, no store",
        "",
    ]
    rows = [[e["backend"], e["config"], f"{e['sets_per_s']:.0f}", f"{e['p50_us'] / 1000:.2f} ms",
             f"{e['p99_us'] / 1000:.2f} ms", f"{e['conflicts_per_set']:.2f}", f"{e['requests_per_set']:.2f}"]
            for e in report["results"]]
    lines.append(_common.table(["store", "writers", "sets/s", "p50", "p99", "conflicts/set", "requests/set"], rows))
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str) -> str | None:
    plt = _common.matplotlib_pyplot()
    if plt is None:
        return None
    entries = report["results"]
    backends = list(dict.fromkeys(e["backend"] for e in entries))
    configs = list(dict.fromkeys(e["config"] for e in entries))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.8 / len(configs)
    for c, config in enumerate(configs):
        xs = [b + (c - (len(configs) - 1) / 2) * width for b in range(len(backends))]
        chosen = [next(e for e in entries if e["backend"] == backend and e["config"] == config) for backend in backends]
        left.bar(xs, [e["sets_per_s"] for e in chosen], width, label=config)
        right.bar(xs, [e["p50_us"] / 1000 for e in chosen], width, label=f"{config} p50")
        right.scatter(xs, [e["p99_us"] / 1000 for e in chosen], marker="_", s=200, color="black",
                      label="p99" if c == 0 else None, zorder=3)
    left.set_ylabel("aggregate sets/s")
    right.set_ylabel("latency of one set (ms, log; p99 as a dash)")
    right.set_yscale("log")
    right.set_ylim(top=max(e["p99_us"] for e in entries) / 1000 * 2)  # scatter points do not widen the limits
    for ax in (left, right):
        ax.set_xticks(range(len(backends)))
        ax.set_xticklabels(backends)
        ax.grid(True, axis="y", alpha=0.3)
    left.legend(fontsize=8, loc="upper right")
    right.legend(fontsize=8, loc="lower center", ncol=2)  # the p99 dashes are at the top
    fig.suptitle(f"trainstatus on object stores against loopback servers ({report['date'][:10]})")
    fig.tight_layout()
    return _common.save_figure(plt, fig, path)


SERVERS = {
    "s3": (S3Server, "moto server mode on 127.0.0.1, requests serialized (conditional PUT atomic)"),
    "gcs": (GCSServer, "fake-gcs-server (memory backend) on 127.0.0.1"),
    "azure": (AzuriteServer, "Azurite blob (in-memory) on 127.0.0.1"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=BACKENDS,
                        help="measure only this object store (repeat for several; default: all)")
    _common.add_round_options(parser)
    _common.add_output_options(parser, "object_store_writers")
    args = parser.parse_args(argv)
    if args.from_json:
        return _common.replot(parser, args, "object_store_writers", plot)

    duration, rounds = _common.rounds_of(args)
    json_path, plot_path = _common.output_paths(args, "object_store_writers")
    backends = [b for b in BACKENDS if b in (args.backend or BACKENDS)]

    info = _common.machine(HERE)
    info.pop("filesystem")  # the object lives in the server's memory, not on a filesystem
    info.pop("directory")
    for name in ("boto3", "moto", "google-cloud-storage", "azure-storage-blob"):
        info[name] = _common._version(name)
    results = []
    for backend in backends:
        server_class, _ = SERVERS[backend]
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in CONFIGS}
        with server_class() as server:
            for r in range(rounds):
                shift = r % len(CONFIGS)
                for label, workers, bare in CONFIGS[shift:] + CONFIGS[:shift]:
                    _common.print_flush(f"{backend}, round {r + 1}/{rounds}: {label}...")
                    runs[label].append(run(server, new_container(backend, server), workers, bare, duration))
        for label, workers, bare in CONFIGS:
            measured = runs[label]
            middle = sorted(measured, key=lambda m: m["sets_per_s"])[len(measured) // 2]  # the median round
            results.append({"backend": backend, "config": label, "workers": workers, "bare": bare, **middle,
                            "sets_per_s_rounds": [m["sets_per_s"] for m in measured]})
    report: dict[str, Any] = {
        "benchmark": "object_store_writers", "format": 2, "quick": args.quick, "date": _common.now(), "machine": info,
        "servers": {b: SERVERS[b][1] for b in backends},
        "duration_s": duration, "rounds": rounds, "results": results,
    }
    report["plot"] = None if args.no_plot else plot(report, plot_path)
    _common.publish(report, json_path, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
