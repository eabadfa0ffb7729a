#!/usr/bin/env python3
"""What a write-through StatusStore costs, next to what a user would otherwise do.

For training states of 1 KB, 32 KB, 1 MB and 10 MB (an ML-Agents-like document: one behavior with
a list of checkpoints sized to reach the state size, a curriculum lesson, an ELO, the metadata
block) this measures p50 and p99 latency of:

  floor          the same document orjson-serialized (OPT_INDENT_2, what the store writes) and
                 written by the bare durable protocol: temp file, write, fsync, rename, directory
                 fsync. No lock, no store: the physical reference.
  set            StatusStore.set, durable (the default; history=20 keeps each replaced version)
  set h0         the same with history=0: what the history costs per set
  set (None)     the same list with every third reward None (ML-Agents writes None before a
                 checkpoint's first evaluation): a value whose JSON holds null, so the store must
                 tell a None from a NaN (orjson writes both as null)
  set nd         StatusStore.set with durable=False
  tx100          a transaction() of 100 sets (durable), one write at the end
  mlagents       ML-Agents' save: json.dump(state, f, indent=4) into the opened target file
                 (neither atomic nor durable): what users have today
  sqlite         SQLite, WAL mode, synchronous=FULL, one upsert per set (one commit each):
                 what a user would pick instead
  get            StatusStore.get (a fresh copy, decoded from the stored bytes); a burst of 10
                 per round (3 at 10 MB), each timed alone

Two changes are measured where it matters which key a set changes: a small key
(wall_height/lesson_num, an int) and the big one (Walker/checkpoints, the whole list: nearly the
whole file). The floor and ML-Agents' save always write the whole document, so one row each.

Runs are interleaved: each round runs every method once, in an order rotated from round to round,
so a slow spell of the machine hits all of them alike and the ratios hold on a noisy machine.
Between two writing methods the disk is synced (os.sync, untimed), so each starts from a clean
page cache: otherwise the dirty data of a non-durable write (ML-Agents' save, durable=False) is
written by the next fsync, and charged to whichever durable method runs next.

Output: a table on stdout, the same figures as JSON (--json, default
benchmarks/results/write_overhead.json), and, when matplotlib is installed (the ``bench`` extra),
a log-log plot of p50 latency against state size (--plot, default beside the JSON).

  python benchmarks/write_overhead.py            # the full run, about two minutes on 2 cores
  python benchmarks/write_overhead.py --quick    # 1 KB and 32 KB, a few rounds: a smoke test (CI)
  python benchmarks/write_overhead.py --profile 1KB   # cProfile of durable small-key sets
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from trainstatus import StatusStore  # noqa: E402

SIZES = {"1KB": 1 << 10, "32KB": 32 << 10, "1MB": 1 << 20, "10MB": 10 << 20}
ROUNDS = {"1KB": 400, "32KB": 300, "1MB": 100, "10MB": 25}
QUICK_SIZES = ("1KB", "32KB")
QUICK_ROUNDS = 20
WARMUP = 3
GET_BURST = 10

SMALL = ("wall_height", "lesson_num")
BIG = ("Walker", "checkpoints")

# Row order of the table; the label says what each measures.
METHODS = {
    "floor": "floor: orjson + temp, write, fsync, rename, dir fsync",
    "set_small": "set, durable (small key)",
    "set_h0_small": "set, durable, history=0 (small key)",
    "set_big": "set, durable (checkpoints list)",
    "set_none": "set, durable (checkpoints list, rewards None)",
    "set_nd_small": "set, durable=False (small key)",
    "set_nd_big": "set, durable=False (checkpoints list)",
    "tx100": "transaction of 100 sets (small key), durable",
    "mlagents": "ML-Agents save: json.dump(indent=4)",
    "sqlite_small": "SQLite WAL FULL upsert (small key)",
    "sqlite_big": "SQLite WAL FULL upsert (checkpoints list)",
    "get_small": "get (small key)",
    "get_big": "get (checkpoints list)",
}

_OPEN_TEMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


# -- the state -----------------------------------------------------------------------------------


def checkpoint(i: int) -> dict[str, Any]:
    """One entry of ML-Agents' checkpoint list, as its checkpoint manager writes it."""
    steps = 500_000 * i
    return {
        "steps": steps,
        "file_path": f"results/run1/Walker/Walker-{steps}.onnx",
        "reward": round(100.0 + 0.37 * i, 2),
        "creation_time": 1764665000.0 + 600.0 * i,
        "auxillary_file_paths": [f"results/run1/Walker/Walker-{steps}.pt"],
    }


def categories(count: int) -> dict[str, dict[str, Any]]:
    checkpoints = [checkpoint(i) for i in range(1, count + 1)]
    return {
        "Walker": {"checkpoints": checkpoints, "final_checkpoint": checkpoints[-1]},
        "wall_height": {"lesson_num": 3},
        "SoccerTwos?team=0": {"elo": 1234.5},
    }


def file_bytes(document: dict[str, Any]) -> bytes:
    """What the store writes for ``document`` (metadata included): orjson's 2-space indent."""
    return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


def checkpoint_count(target: int) -> int:
    """How many checkpoints make the file about ``target`` bytes."""
    metadata = {"metadata": {"stats_format_version": "0.3.0", "trainstatus_version": "0.0.0"}}
    base = len(file_bytes({**categories(1), **metadata}))
    per_item = (len(file_bytes({**categories(101), **metadata})) - base) / 100
    return max(1, round(1 + (target - base) / per_item))


def with_none_rewards(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The list with every third reward None, as ML-Agents leaves checkpoints not yet evaluated."""
    return [dict(c, reward=None) if i % 3 == 0 else c for i, c in enumerate(checkpoints)]


def other_list(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same list with a newer last checkpoint: what a trainer sets after saving one."""
    changed = [dict(c) for c in checkpoints]
    changed[-1]["reward"] += 1.5
    changed[-1]["creation_time"] += 60.0
    return changed


# -- the methods ---------------------------------------------------------------------------------


def floor_write(path: str, data: bytes) -> None:
    """The bare durable protocol, nothing else."""
    directory, name = os.path.split(path)
    temp = os.path.join(directory, f".{name}.tmp")
    fd = os.open(temp, _OPEN_TEMP, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    dir_fd = os.open(directory, _DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Bench:
    """One state size: its files, stores and databases, and a function per method."""

    def __init__(self, directory: str, count: int) -> None:
        self.directory = directory
        self.count = count
        self.cleanup: list[Callable[[], None]] = []
        base = categories(count)
        self.lists = [base["Walker"]["checkpoints"], other_list(base["Walker"]["checkpoints"])]

        self.stores = {
            "set": self._store("set.json", base, durable=True),
            "set_h0": self._store("set_h0.json", base, durable=True, history=0),
            "set_nd": self._store("set_nd.json", base, durable=False),
            "tx100": self._store("tx100.json", base, durable=True),
            "set_none": self._store("set_none.json", base, durable=True),
        }
        self.none_lists = [with_none_rewards(checkpoints) for checkpoints in self.lists]
        reference = self.stores["set"]
        self.document = reference.to_dict()  # metadata included, last
        self.state_bytes = len(file_bytes(self.document))
        # The floor writes exactly the store's bytes: check it once.
        with open(reference.path, "rb") as f:
            on_disk = f.read()
        if on_disk != file_bytes(self.document):
            raise AssertionError("the floor would not write the same bytes as the store")
        self.floor_path = os.path.join(directory, "floor.json")
        self.floor_document = json.loads(on_disk)
        floor_write(self.floor_path, on_disk)
        self.mlagents_path = os.path.join(directory, "mlagents.json")
        self.mlagents_document = json.loads(on_disk)
        self.sqlite = self._sqlite(base)

    def _store(self, name: str, base: dict[str, dict[str, Any]], *, durable: bool, history: int | None = None) -> StatusStore:
        store = StatusStore(os.path.join(self.directory, name), durable=durable, history=history)
        with store.transaction():
            for category, entries in base.items():
                for key, value in entries.items():
                    store.set(category, key, value)
        self.cleanup.append(store.close)
        return store

    def _sqlite(self, base: dict[str, dict[str, Any]]) -> sqlite3.Connection:
        connection = sqlite3.connect(os.path.join(self.directory, "status.sqlite"), isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute(
            "CREATE TABLE status (category TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, "
            "PRIMARY KEY (category, key))"
        )
        for category, entries in base.items():
            for key, value in entries.items():
                self._upsert(connection, category, key, value)
        self.cleanup.append(connection.close)
        return connection

    @staticmethod
    def _upsert(connection: sqlite3.Connection, category: str, key: str, value: Any) -> None:
        connection.execute(
            "INSERT INTO status (category, key, value) VALUES (?, ?, ?) "
            "ON CONFLICT (category, key) DO UPDATE SET value = excluded.value",
            (category, key, orjson.dumps(value)),
        )

    def methods(self) -> dict[str, Callable[[int], Any]]:
        lists = self.lists
        store, store_nd, tx_store = self.stores["set"], self.stores["set_nd"], self.stores["tx100"]

        def floor(i: int) -> None:
            self.floor_document["wall_height"]["lesson_num"] = i
            floor_write(self.floor_path, orjson.dumps(self.floor_document, option=orjson.OPT_INDENT_2) + b"\n")

        def set_small(i: int) -> None:
            store.set(*SMALL, i)

        def set_big(i: int) -> None:
            store.set(*BIG, lists[i % 2])

        def set_h0_small(i: int) -> None:
            self.stores["set_h0"].set(*SMALL, i)

        def set_none(i: int) -> None:
            self.stores["set_none"].set(*BIG, self.none_lists[i % 2])

        def set_nd_small(i: int) -> None:
            store_nd.set(*SMALL, i)

        def set_nd_big(i: int) -> None:
            store_nd.set(*BIG, lists[i % 2])

        def tx100(i: int) -> None:
            with tx_store.transaction():
                for j in range(100):
                    tx_store.set(*SMALL, 100 * i + j)

        def mlagents(i: int) -> None:
            self.mlagents_document["wall_height"]["lesson_num"] = i
            with open(self.mlagents_path, "w") as f:
                json.dump(self.mlagents_document, f, indent=4)

        def sqlite_small(i: int) -> None:
            self._upsert(self.sqlite, *SMALL, i)

        def sqlite_big(i: int) -> None:
            self._upsert(self.sqlite, *BIG, lists[i % 2])

        def get_small(i: int) -> Any:
            return store.get(*SMALL)

        def get_big(i: int) -> Any:
            return store.get(*BIG)

        table = {f.__name__: f for f in (floor, set_small, set_h0_small, set_big, set_none, set_nd_small, set_nd_big, tx100,
                                         mlagents, sqlite_small, sqlite_big, get_small, get_big)}
        return {name: table[name] for name in METHODS}

    def close(self) -> None:
        for step in reversed(self.cleanup):
            step()


def run_size(directory: str, target: int, rounds: int, warmup: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Interleaved rounds of every method at one state size: (size info, method -> summary)."""
    count = checkpoint_count(target)
    bench = Bench(directory, count)
    try:
        methods = bench.methods()
        names = list(methods)
        samples: dict[str, list[int]] = {name: [] for name in names}
        clock = time.perf_counter_ns
        # A get takes microseconds: a burst of them per round, each timed on its own, so the p50
        # is a get in a busy loop and the p99 the first one after a write (cold caches).
        burst = GET_BURST if target <= 1 << 20 else 3
        for r in range(warmup + rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:  # rotated: no method always runs first
                op = methods[name]
                for _ in range(burst if name.startswith("get") else 1):
                    start = clock()
                    op(r)
                    elapsed = clock() - start
                    if r >= warmup:
                        samples[name].append(elapsed)
                if not name.startswith("get"):
                    # Untimed: flush what this method left dirty. On ext4 (data=ordered) the next
                    # fsync would otherwise write it, charging a non-durable method's data to
                    # whichever durable method comes next.
                    os.sync()
        info = {"target_bytes": target, "file_bytes": bench.state_bytes, "checkpoints": count, "rounds": rounds}
        return info, {name: _common.summary_us(values) for name, values in samples.items()}
    finally:
        bench.close()


# -- import time ---------------------------------------------------------------------------------


def import_cost(runs: int) -> dict[str, Any]:
    """``import trainstatus`` in a fresh interpreter (what the CLI pays), from ``-X importtime``."""
    code = "import sys, trainstatus; print(sorted(m for m in ('numpy', 'sqlite3', 'json') if m in sys.modules))"
    times, heavy = [], []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                              check=True)
        for line in done.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|\s?(\S.*)$", line)
            if m and m.group(3).strip() == "trainstatus":
                times.append(int(m.group(2)))
        heavy = json.loads(done.stdout.replace("'", '"'))
    return {
        "trainstatus_ms": round(statistics.median(times) / 1000, 2) if times else None,
        "runs": runs,
        "numpy_imported": "numpy" in heavy,
        "also_imported": heavy,
    }


# -- targets -------------------------------------------------------------------------------------


def ratio(results: dict[str, Any], size: str, a: str, b: str) -> float | None:
    if size not in results:
        return None
    return round(results[size][a]["p50_us"] / results[size][b]["p50_us"], 3)


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 4, as a ratio of p50s measured side by side in this run."""
    out: list[dict[str, Any]] = []

    def add(name: str, size: str, value: float | None, limit: float, at_most: bool, what: str) -> None:
        if value is None:
            return
        met = value <= limit if at_most else value >= limit
        out.append({"target": name, "size": size, "value": value, "limit": limit,
                    "comparison": "<=" if at_most else ">=", "met": met, "what": what})

    for size in results:
        limit = 1.15 if size in ("1KB", "32KB") else 1.05
        for variant in ("small", "big"):
            add(f"durable set / floor ({variant})", size, ratio(results, size, f"set_{variant}", "floor"), limit, True,
                f"set_{variant} p50 / floor p50")
        if size != "1KB":
            for variant in ("small", "big"):
                add(f"ML-Agents save / durable set ({variant})", size,
                    ratio(results, size, "mlagents", f"set_{variant}"), 8.0 if size == "1MB" else 1.0, False,
                    f"mlagents p50 / set_{variant} p50 (how many times faster the durable set is)")
        if size == "1KB":
            add("durable=False set / ML-Agents save", size, ratio(results, size, "set_nd_small", "mlagents"), 0.6,
                True, "set_nd_small p50 / mlagents p50")
        add("durable set, history=20 / history=0", size, ratio(results, size, "set_small", "set_h0_small"), 1.1,
            True, "set_small p50 / set_h0_small p50 (what keeping the replaced version costs)")
        add("100-set transaction / one set", size, ratio(results, size, "tx100", "set_small"), 1.3, True,
            "tx100 p50 / set_small p50")
        if size == "32KB":
            for variant in ("small", "big"):
                add(f"get p50 in us ({variant})", size, results[size][f"get_{variant}"]["p50_us"], 10.0, True,
                    f"get_{variant} p50, microseconds (a copy included)")
    return out


# -- output --------------------------------------------------------------------------------------


def human(us: float) -> str:
    if us < 10:
        return f"{us:.1f} µs"
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 10_000:
        return f"{us / 1000:.2f} ms"
    if us < 100_000:
        return f"{us / 1000:.1f} ms"
    return f"{us / 1000:.0f} ms"


def render(report: dict[str, Any]) -> str:
    results = report["results"]
    sizes = list(results)
    lines = [
        f"trainstatus write overhead, {report['date']}",
        f"machine: {_common.describe_machine(report['machine'])}",
        "state: " + ", ".join(f"{s} = {report['sizes'][s]['file_bytes']} bytes "
                              f"({report['sizes'][s]['checkpoints']} checkpoints, {report['sizes'][s]['rounds']} rounds)"
                              for s in sizes),
        f"small key: {'/'.join(SMALL)} (an int); checkpoints list: {'/'.join(BIG)} (nearly the whole file)",
        "",
        "latency p50 / p99 (interleaved rounds)",
    ]
    rows = [[METHODS[m]] + [f"{human(results[s][m]['p50_us'])} / {human(results[s][m]['p99_us'])}" for s in sizes]
            for m in METHODS]
    lines.append(_common.table(["method", *sizes], rows))
    lines += ["", "p50 relative to the floor (same run)"]
    rows = [[METHODS[m]] + [f"{results[s][m]['p50_us'] / results[s]['floor']['p50_us']:.2f}x" for s in sizes]
            for m in METHODS if not m.startswith("get")]
    lines.append(_common.table(["method", *sizes], rows))
    lines += ["", "targets (issue 4), ratios of p50s from this run"]
    rows = [[t["target"], t["size"], f"{t['value']}", f"{t['comparison']} {t['limit']}", "met" if t["met"] else "MISSED"]
            for t in report["targets"]]
    lines.append(_common.table(["target", "size", "value", "limit", ""], rows))
    imp = report["import"]
    lines += ["", f"import trainstatus: {imp['trainstatus_ms']} ms (median of {imp['runs']}, -X importtime, "
                  f"cumulative); numpy imported: {'yes' if imp['numpy_imported'] else 'no'}"]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str) -> str | None:
    plt = _common.matplotlib_pyplot()
    if plt is None:
        return None
    sizes = list(report["results"])
    x = [report["sizes"][s]["file_bytes"] for s in sizes]
    fig, ax = plt.subplots(figsize=(9, 6))
    colors = plt.get_cmap("tab20").colors
    for (method, label), color in zip(METHODS.items(), colors[::2] + colors[1::2]):
        y = [report["results"][s][method]["p50_us"] / 1000 for s in sizes]
        style = "-" if not method.startswith("get") else ":"
        ax.plot(x, y, style, marker="o", color="black" if method == "floor" else color,
                linewidth=2.5 if method == "floor" else 1.3, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("state size (bytes of the status file)")
    ax.set_ylabel("p50 latency (ms)")
    ax.set_title(f"trainstatus write overhead ({report['date'][:10]}, {report['machine']['filesystem']['type']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return _common.save_figure(plt, fig, path)


# -- profile -------------------------------------------------------------------------------------


def profile(directory: str, size: str, count: int) -> None:
    """cProfile of durable small-key sets at one state size: where the time of a set goes."""
    bench = Bench(directory, checkpoint_count(SIZES[size]))
    try:
        store = bench.stores["set"]
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(count):
            store.set(*SMALL, i)
        profiler.disable()
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(25)
    finally:
        bench.close()


# -- main ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def work_directory(parent: str | None) -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="trainstatus-bench-", dir=parent)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 KB and 32 KB, few rounds: a smoke test")
    parser.add_argument("--sizes", help="comma-separated subset of " + ",".join(SIZES))
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of rounds")
    _common.add_output_options(parser, "write_overhead")
    parser.add_argument("--dir", help="directory to measure in (default: a new temp dir; its filesystem matters)")
    parser.add_argument("--profile", metavar="SIZE", help="only profile durable small-key sets at SIZE")
    args = parser.parse_args(argv)

    if args.profile:
        with work_directory(args.dir) as directory:
            profile(directory, args.profile, 300 if SIZES[args.profile] <= 1 << 20 else 30)
        return 0

    sizes = list(QUICK_SIZES) if args.quick else list(SIZES)
    if args.sizes:
        sizes = [s for s in args.sizes.split(",") if s]
        unknown = set(sizes) - set(SIZES)
        if unknown:
            parser.error(f"unknown sizes {sorted(unknown)}; choose from {', '.join(SIZES)}")
    json_path, plot_path = _common.output_paths(args, "write_overhead")

    report: dict[str, Any] = {"benchmark": "write_overhead", "format": 1, "quick": args.quick, "date": _common.now(),
                              "methods": METHODS, "small_key": "/".join(SMALL), "big_key": "/".join(BIG),
                              "sizes": {}, "results": {}}
    with work_directory(args.dir) as directory:
        report["machine"] = _common.machine(directory)
        for size in sizes:
            rounds = QUICK_ROUNDS if args.quick else max(3, round(ROUNDS[size] * args.scale))
            _common.print_flush(f"measuring {size} ({rounds} rounds)...")
            sub = os.path.join(directory, size)
            os.mkdir(sub)
            info, results = run_size(sub, SIZES[size], rounds, 1 if args.quick else WARMUP)
            report["sizes"][size] = info
            report["results"][size] = results
            shutil.rmtree(sub, ignore_errors=True)
    report["targets"] = targets(report["results"])
    report["import"] = import_cost(3 if args.quick else 15)
    report["plot"] = None if args.no_plot else plot(report, plot_path)
    _common.publish(report, json_path, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
