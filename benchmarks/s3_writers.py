#!/usr/bin/env python3
"""Writer processes on one s3:// status object: aggregate sets/s, latency and conflict retries.

1, 2, 4 and 8 processes, each with its own StatusStore on the same object, each setting its own
key over and over for a fixed time, against an S3-compatible server on loopback (moto's server
mode, started here as in the tests: tests/_s3server.py, requests served one at a time so that
conditional writes are atomic as on S3). There is no lock: every set is one conditional PUT, and a
writer that loses the race (412) reads the object again, lays its change over it and retries.

Reported per configuration: aggregate sets/s (median of the rounds), p50 and p99 latency of a set,
conflicts (412 answers) per set and requests per set. After every run the object is read back:
each writer's key must hold the last value its set acknowledged. Configurations are interleaved
round by round, so a slow spell of the machine hits all of them alike.

What it measures is the protocol's cost against a server one hop away that answers in about a
millisecond; a real S3 endpoint answers in tens of milliseconds, so absolute rates there are lower
and, with more time in flight per write, conflicts per set higher.

  python benchmarks/s3_writers.py           # 3 rounds of 2 s per configuration, about a minute
  python benchmarks/s3_writers.py --quick   # 1 round of 0.25 s: a smoke test
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
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the tests' loopback server
import _common  # noqa: E402
from _s3server import S3Server  # noqa: E402

from trainstatus import StatusStore  # noqa: E402

WORKERS = (1, 2, 4, 8)
CATEGORY = "writers"
KEY = "run/run_logs/training_status.json"
TIMEOUT = 120.0
# fork where there is one: writers start in milliseconds with boto3 already imported (each still
# makes its own client, after the fork). The parent runs no threads, so forking it is safe.
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def prefill(url: str, options: dict[str, Any]) -> None:
    """A small status document, as a trainer has it (about 1 KB)."""
    with StatusStore(url, storage_options=options) as store, store.transaction():  # type: ignore[call-arg]
        store.set("wall_height", "lesson_num", 3)
        store.set("SoccerTwos?team=0", "elo", 1234.5)
        store.set("Walker", "checkpoints", [
            {"steps": 500_000 * i, "file_path": f"results/run1/Walker/Walker-{500_000 * i}.onnx",
             "reward": 100.0 + i, "creation_time": 1764665000.0 + 600 * i,
             "auxillary_file_paths": [f"results/run1/Walker/Walker-{500_000 * i}.pt"]} for i in range(1, 3)
        ])


def writer(url: str, options: dict[str, Any], key: str, duration: float, barrier: Any, queue: Any) -> None:
    """One writer process: its own store on the shared object; reports through ``queue``."""
    try:
        store = StatusStore(url, storage_options=options, lock_timeout=TIMEOUT)  # type: ignore[call-arg]
        store.set(CATEGORY, key, -1)  # the client is made and connected before the clock starts
        storage: Any = store._storage
        conflicts0, requests0 = storage.conflicts, storage.requests
        latencies: list[int] = []
        clock = time.perf_counter_ns
        barrier.wait(TIMEOUT)
        deadline = time.monotonic() + duration
        i = 0
        while time.monotonic() < deadline:
            start = clock()
            store.set(CATEGORY, key, i)
            latencies.append(clock() - start)
            i += 1
        end = time.monotonic()
        queue.put(("ok", key, i, latencies, end, storage.conflicts - conflicts0, storage.requests - requests0))
        store.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put(("error", key, repr(exc)))


def run(server: S3Server, workers: int, duration: float) -> dict[str, Any]:
    bucket = server.new_bucket("bench")
    url = f"s3://{bucket}/{KEY}"
    options = server.storage_options
    prefill(url, options)
    reports, start = _common.run_writer_processes(
        multiprocessing.get_context(START_METHOD), writer, lambda w: (url, options, f"p{w}", duration), workers, TIMEOUT)
    verify(server, bucket, {r[1]: r[2] - 1 for r in reports})
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


def verify(server: S3Server, bucket: str, last: dict[str, int]) -> None:
    """Every writer's key holds the last value its set acknowledged."""
    data = server.client().get_object(Bucket=bucket, Key=KEY)["Body"].read()
    document = json.loads(data)
    found = {key: document.get(CATEGORY, {}).get(key) for key in last}
    wrong = {key: (found[key], value) for key, value in last.items() if found[key] != value}
    if wrong:
        raise AssertionError(f"acknowledged values missing from s3://{bucket}/{KEY} (found, acknowledged): {wrong}")


def describe_machine(info: dict[str, Any]) -> str:
    return (
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB; {info['os']}; Python {info['python']}; "
        f"trainstatus {info['trainstatus']}, orjson {info['orjson']}, boto3 {info['boto3']}, moto {info['moto']}"
    )


def render(report: dict[str, Any]) -> str:
    lines = [
        f"trainstatus on s3:// (moto server on loopback), {report['date']}",
        f"machine: {describe_machine(report['machine'])}",
        f"each writer process sets its own key on one ~1 KB object; {report['rounds']} round(s) of "
        f"{report['duration_s']} s per configuration, interleaved; sets/s is the median of the rounds",
        "",
    ]
    rows = [[str(e["workers"]), f"{e['sets_per_s']:.0f}", f"{e['p50_us'] / 1000:.2f} ms",
             f"{e['p99_us'] / 1000:.2f} ms", f"{e['conflicts_per_set']:.2f}", f"{e['requests_per_set']:.2f}"]
            for e in report["results"]]
    lines.append(_common.table(["processes", "sets/s", "p50", "p99", "conflicts/set", "requests/set"], rows))
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str) -> str | None:
    plt = _common.matplotlib_pyplot()
    if plt is None:
        return None
    entries = report["results"]
    n = [e["workers"] for e in entries]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.plot(n, [e["sets_per_s"] for e in entries], marker="o", label="sets/s")
    left.set_ylabel("aggregate sets/s")
    twin = left.twinx()
    twin.plot(n, [e["conflicts_per_set"] for e in entries], marker="s", color="tab:red", label="conflicts/set")
    twin.set_ylabel("conflicts (412) per set")
    right.plot(n, [e["p50_us"] / 1000 for e in entries], marker="o", linestyle=":", label="p50")
    right.plot(n, [e["p99_us"] / 1000 for e in entries], marker="o", label="p99")
    right.set_ylabel("latency of one set (ms, log)")
    right.set_yscale("log")
    for ax in (left, right):
        ax.set_xlabel("writer processes")
        ax.set_xticks(list(WORKERS))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    twin.legend(fontsize=8, loc="upper right")
    fig.suptitle(f"trainstatus on s3:// against a loopback server ({report['date'][:10]})")
    fig.tight_layout()
    return _common.save_figure(plt, fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_round_options(parser)
    _common.add_output_options(parser, "s3_writers")
    args = parser.parse_args(argv)
    if args.from_json:
        return _common.replot(parser, args, "s3_writers", plot)

    duration, rounds = _common.rounds_of(args)
    json_path, plot_path = _common.output_paths(args, "s3_writers")

    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in WORKERS}
    with S3Server() as server:
        info = _common.machine(HERE)
        info.pop("filesystem")  # the object lives in the server's memory, not on a filesystem
        info.pop("directory")
        info["boto3"], info["moto"] = _common._version("boto3"), _common._version("moto")
        for r in range(rounds):
            shift = r % len(WORKERS)
            for n in WORKERS[shift:] + WORKERS[:shift]:
                _common.print_flush(f"round {r + 1}/{rounds}: {n} writer process(es)...")
                runs[n].append(run(server, n, duration))

    results = []
    for n in WORKERS:
        measured = runs[n]
        middle = sorted(measured, key=lambda m: m["sets_per_s"])[len(measured) // 2]  # the median round
        results.append({"workers": n, **middle, "sets_per_s_rounds": [m["sets_per_s"] for m in measured]})
    report: dict[str, Any] = {
        "benchmark": "s3_writers", "format": 1, "quick": args.quick, "date": _common.now(), "machine": info,
        "server": "moto server mode on 127.0.0.1, requests serialized (conditional PUT atomic)",
        "duration_s": duration, "rounds": rounds, "results": results,
    }
    report["plot"] = None if args.no_plot else plot(report, plot_path)
    _common.publish(report, json_path, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
