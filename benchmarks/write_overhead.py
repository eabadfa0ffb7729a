#!/usr/bin/env python3
"""What a write-through StatusStore costs, next to what a user would otherwise do.

For training states of 1 KB, 32 KB, 1 MB and 10 MB (an ML-Agents-like document: one behavior with
a list of checkpoints sized to reach the state size, a curriculum lesson, an ELO, the metadata
block) this measures p50 and p99 latency of:

  floor          the same document orjson-serialized (OPT_INDENT_2, what the store writes) and
                 written by the bare durable protocol: temp file, write, fsync, rename, directory
                 fsync. No lock, no store: the physical reference.
  floor bytes    the store's file bytes, prepared once, written by the same protocol: what a write
                 costs with no serializing at all (issue 23's floor)
  set            StatusStore.set, durable (the default; history=20 keeps each replaced version)
  set h0         the same with history=0: what the history costs per set
  set (None)     the same list with every third reward None (ML-Agents writes None before a
                 checkpoint's first evaluation): a value whose JSON holds null, so the store must
                 tell a None from a NaN (orjson writes both as null)
  set nd         StatusStore.set with durable=False
  tx100          a transaction() of 100 sets (durable), one write at the end
  bare locked    the bare locked rewrite of a durable=False write: flock on a lock file kept open,
                 orjson, temp file, write, close, rename, unlock (no fsync): what set nd cannot
                 go below without giving up atomicity or the lock
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
log-log plots of p50 latency against state size, one per shape (--plot PATH makes PATH-list.png
and so on; by default beside the JSON). --from-json draws them again from a saved report.

  python benchmarks/write_overhead.py            # the full run, about two minutes on 2 cores
  python benchmarks/write_overhead.py --quick    # 1 KB and 32 KB, a few rounds: a smoke test (CI)
  python benchmarks/write_overhead.py --profile 1KB   # cProfile of durable small-key sets
  python benchmarks/write_overhead.py --from-json benchmarks/results/write_overhead.json   # replot
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import fcntl
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
import _shapes  # noqa: E402

from trainstatus import StatusStore  # noqa: E402

SIZES = {"1KB": 1 << 10, "32KB": 32 << 10, "1MB": 1 << 20, "10MB": 10 << 20}
ROUNDS = {"1KB": 400, "32KB": 300, "1MB": 100, "10MB": 25}
# The other shapes measure the core rows only, with fewer rounds: five shapes at 10 MB add up.
SHAPE_ROUNDS = {"1KB": 200, "32KB": 150, "1MB": 50, "10MB": 15}
QUICK_SIZES = ("1KB", "32KB")
QUICK_ROUNDS = 20
WARMUP = 3
GET_BURST = 10

SMALL = _shapes.SMALL
BIG = ("Walker", "checkpoints")

# Row order of the table; the label says what each measures. CORE rows are measured for every
# shape, the others for the list shape (the benchmark's first one) only.
METHODS = {
    "floor": "floor: orjson + temp, write, fsync, rename, dir fsync",
    "floor_bytes": "floor of the bytes: prepared bytes + temp, write, fsync, rename, dir fsync",
    "set_small": "set, durable (small key)",
    "set_h0_small": "set, durable, history=0 (small key)",
    "set_big": "set, durable (big value)",
    "set_none": "set, durable (checkpoints list, rewards None)",
    "set_nd_small": "set, durable=False (small key)",
    "set_nd_big": "set, durable=False (big value)",
    "tx100": "transaction of 100 sets (small key), durable",
    "bare_locked": "bare locked rewrite: flock, orjson, temp, write, close, rename, unlock",
    "mlagents": "ML-Agents save: json.dump(indent=4)",
    "sqlite_small": "SQLite WAL FULL upsert (small key)",
    "sqlite_big": "SQLite WAL FULL upsert (big value)",
    "open": "open: StatusStore(path) (read, parse, validate)",
    "json_loads": "reference: read + json.loads of the file",
    "orjson_loads": "reference: read + orjson.loads of the file",
    "get_small": "get (small key)",
    "get_big": "get (big value)",
    "decode_big": "reference: loads of the big value's bytes",
}
CORE = ("floor", "floor_bytes", "set_small", "set_big", "open", "json_loads", "orjson_loads", "get_big", "decode_big")
# Not timed in every round: one call per round, or a burst of them (see run_size).
READS = ("open", "json_loads", "orjson_loads", "get_small", "get_big", "decode_big")

_OPEN_TEMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


# -- the methods ---------------------------------------------------------------------------------


def replace_with(path: str, data: bytes, *, durable: bool) -> None:
    """Temp file, write (and fsync if ``durable``), rename; then the directory fsync if durable."""
    directory, name = os.path.split(path)
    temp = os.path.join(directory, f".{name}.tmp")
    fd = os.open(temp, _OPEN_TEMP, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    if durable:
        dir_fd = os.open(directory, _DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def floor_write(path: str, data: bytes) -> None:
    """The bare durable protocol, nothing else."""
    replace_with(path, data, durable=True)


def bare_locked_write(path: str, lock_fd: int, document: dict[str, Any]) -> None:
    """The bare locked rewrite: what a durable=False set must do at least (no fsync)."""
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        replace_with(path, orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n", durable=False)
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class Bench:
    """One shape at one state size: its files, stores and databases, and a function per method."""

    def __init__(self, directory: str, shape: _shapes.Shape, count: int, methods: tuple[str, ...]) -> None:
        self.directory = directory
        self.shape = shape
        self.count = count
        self.cleanup: list[Callable[[], None]] = []
        self.wanted = methods
        base = shape.document(count)
        self.versions = shape.versions(base)

        self.stores = {"set": self._store("set.json", base, durable=True)}
        if "set_h0_small" in methods:
            self.stores["set_h0"] = self._store("set_h0.json", base, durable=True, history=0)
        if "set_nd_small" in methods or "set_nd_big" in methods:
            self.stores["set_nd"] = self._store("set_nd.json", base, durable=False)
        if "tx100" in methods:
            self.stores["tx100"] = self._store("tx100.json", base, durable=True)
        if "set_none" in methods:
            self.stores["set_none"] = self._store("set_none.json", base, durable=True)
            self.none_lists = [with_none_rewards(checkpoints) for checkpoints in self.versions]
        reference = self.stores["set"]
        self.document = reference.to_dict()  # metadata included, last
        on_disk = read_file(reference.path)
        # The floor writes exactly the store's bytes: check it once.
        if on_disk != _shapes.file_bytes(self.document):
            raise AssertionError("the floor would not write the same bytes as the store")
        self.state_bytes = len(on_disk)
        self.floor_path = os.path.join(directory, "floor.json")
        # orjson cannot write NaN: the floor of a NaN-holding document serializes the same shape
        # with None in its place (the fastest serializer's cost for it) and writes the store's
        # exact bytes, NaN literals and all.
        self.nan_bytes = on_disk if _shapes._has_nan(self.document) else None
        self.floor_document = _shapes.without_nan(json.loads(on_disk))
        floor_write(self.floor_path, on_disk)
        # Two versions of the file's bytes (the small key at two values), so that every write of the
        # bytes floor changes the file, as every set does.
        self.prepared = [on_disk, on_disk.replace(b'"lesson_num": 3', b'"lesson_num": 4', 1)]
        # In a folder of its own, as a run's status file is (run_logs/): opening lists the folder
        # for temp files of killed writers, and this one holds every other method's files and
        # their histories (well over a hundred names: 90 µs of listing that a run folder lacks).
        os.makedirs(os.path.join(directory, "open"), exist_ok=True)
        self.open_path = os.path.join(directory, "open", "open.json")
        floor_write(self.open_path, on_disk)
        self.big_bytes = reference._lookup(*shape.big).raw  # what get decodes
        self.big_loads = json.loads if self.nan_bytes is not None else orjson.loads
        if "bare_locked" in methods:
            self.bare_path = os.path.join(directory, "bare_locked.json")
            self.bare_lock_fd = os.open(self.bare_path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            self.cleanup.append(lambda: os.close(self.bare_lock_fd))
            self.bare_document = json.loads(on_disk)
        if "mlagents" in methods:
            self.mlagents_path = os.path.join(directory, "mlagents.json")
            self.mlagents_document = json.loads(on_disk)
        if "sqlite_small" in methods:
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
        versions, big = self.versions, self.shape.big
        stores = self.stores
        store = stores["set"]

        def floor(i: int) -> None:
            self.floor_document["wall_height"]["lesson_num"] = i
            data = orjson.dumps(self.floor_document, option=orjson.OPT_INDENT_2) + b"\n"
            floor_write(self.floor_path, data if self.nan_bytes is None else self.nan_bytes)

        def floor_bytes(i: int) -> None:
            floor_write(self.floor_path, self.prepared[i % 2])

        def set_small(i: int) -> None:
            store.set(*SMALL, i)

        def set_big(i: int) -> None:
            store.set(*big, versions[i % 2])

        def set_h0_small(i: int) -> None:
            stores["set_h0"].set(*SMALL, i)

        def set_none(i: int) -> None:
            stores["set_none"].set(*big, self.none_lists[i % 2])

        def set_nd_small(i: int) -> None:
            stores["set_nd"].set(*SMALL, i)

        def set_nd_big(i: int) -> None:
            stores["set_nd"].set(*big, versions[i % 2])

        def tx100(i: int) -> None:
            tx_store = stores["tx100"]
            with tx_store.transaction():
                for j in range(100):
                    tx_store.set(*SMALL, 100 * i + j)

        def bare_locked(i: int) -> None:
            self.bare_document["wall_height"]["lesson_num"] = i
            bare_locked_write(self.bare_path, self.bare_lock_fd, self.bare_document)

        def mlagents(i: int) -> None:
            self.mlagents_document["wall_height"]["lesson_num"] = i
            with open(self.mlagents_path, "w") as f:
                json.dump(self.mlagents_document, f, indent=4)

        def sqlite_small(i: int) -> None:
            self._upsert(self.sqlite, *SMALL, i)

        def sqlite_big(i: int) -> None:
            self._upsert(self.sqlite, *big, versions[i % 2])

        def open_store(i: int) -> None:
            StatusStore(self.open_path).close()

        def json_loads(i: int) -> Any:
            return json.loads(read_file(self.open_path))

        def orjson_loads(i: int) -> Any:
            return orjson.loads(read_file(self.open_path))

        def get_small(i: int) -> Any:
            return store.get(*SMALL)

        def get_big(i: int) -> Any:
            return store.get(*big)

        def decode_big(i: int) -> Any:
            return self.big_loads(self.big_bytes)

        table: dict[str, Callable[[int], Any]] = {f.__name__: f for f in (floor, floor_bytes, set_small, set_h0_small, set_big, set_none, set_nd_small, set_nd_big, tx100,
                                         bare_locked, mlagents, sqlite_small, sqlite_big, open_store, json_loads, orjson_loads, get_small,
                                         get_big, decode_big)}
        table["open"] = table.pop("open_store")
        wanted = [name for name in self.wanted if not (name == "orjson_loads" and self.nan_bytes is not None)]
        return {name: table[name] for name in wanted}

    def close(self) -> None:
        for step in reversed(self.cleanup):
            step()


def with_none_rewards(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The list with every third reward None, as ML-Agents leaves checkpoints not yet evaluated."""
    return [dict(c, reward=None) if i % 3 == 0 else c for i, c in enumerate(checkpoints)]


def run_size(directory: str, shape: _shapes.Shape, target: int, rounds: int, warmup: int,
             methods: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Interleaved rounds of every method at one state size: (size info, method -> summary)."""
    count = _shapes.count_for(shape, target)
    bench = Bench(directory, shape, count, methods)
    try:
        ops = bench.methods()
        names = list(ops)
        samples: dict[str, list[int]] = {name: [] for name in names}
        # CPU of the whole process (every thread: the store's background closer too) per call: what
        # a write costs the machine, less moved than the wall clock by other processes' disk traffic.
        cpu_samples: dict[str, list[int]] = {name: [] for name in names}
        clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
        # A get takes microseconds: a burst of them per round, each timed on its own, so the p50
        # is a get in a busy loop and the p99 the first one after a write (cold caches).
        burst = GET_BURST if target <= 1 << 20 else 3
        for r in range(warmup + rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:  # rotated: no method always runs first
                op = ops[name]
                for _ in range(burst if name in READS else 1):
                    cpu_start = cpu_clock()
                    start = clock()
                    op(r)
                    elapsed = clock() - start
                    cpu_elapsed = cpu_clock() - cpu_start
                    if r >= warmup:
                        samples[name].append(elapsed)
                        cpu_samples[name].append(cpu_elapsed)
                if name not in READS:
                    # Untimed: flush what this method left dirty. On ext4 (data=ordered) the next
                    # fsync would otherwise write it, charging a non-durable method's data to
                    # whichever durable method comes next.
                    os.sync()
        info = {"target_bytes": target, "file_bytes": bench.state_bytes, "count": count, "unit": shape.unit,
                "rounds": rounds}
        return info, {name: {**_common.summary_us(values),
                             "cpu_p50_us": round(_common.percentile(cpu_samples[name], 50) / 1000, 2)}
                      for name, values in samples.items()}
    finally:
        bench.close()


# -- import time ---------------------------------------------------------------------------------


def _wall_ms(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def _run_ms(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall clock, user + system CPU) of one run of ``command``, in ms."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command)
    return wall * 1000, (usage.ru_utime + usage.ru_stime) * 1000


def _startup_env(directory: str, pythonpath: str | None = None) -> dict[str, str]:
    """The environment of the start-up runs: with bytecode caches, as an installed package has them.

    Without (PYTHONDONTWRITEBYTECODE set, as some CI and sandboxes do) every import compiles its
    module again, which is most of what a start-up figure would then show. The caches go to a
    directory of this run (PYTHONPYCACHEPREFIX), filled by a first, untimed round.
    """
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(directory, "pycache")
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (pythonpath, os.environ.get("PYTHONPATH"))))
    return env


def import_cost(runs: int, directory: str, before: str | None = None) -> dict[str, Any]:
    """Start-up costs in fresh interpreters, wall clock (median of ``runs``), interleaved.

    ``import trainstatus`` also from ``-X importtime`` (what it imports itself, cumulative), and
    which heavy modules it pulled in. The command line is run as the installed ``trainstatus``
    script when there is one beside this interpreter (what a user types), else ``-m trainstatus``.
    ``cpu_over_bare_ms``: the median over rounds of each command's CPU time minus the bare start's
    in the same round (the figure the machine's other work moves least). ``before``: the ``src``
    directory of another version, whose commands run in the same rounds (``before`` in the report).
    """
    code = "import sys, trainstatus; print(sorted(m for m in ('numpy', 'sqlite3', 'json', 'filelock') if m in sys.modules))"
    script = os.path.join(os.path.dirname(sys.executable), "trainstatus")
    cli = [script] if os.path.exists(script) else [sys.executable, "-m", "trainstatus"]
    status = os.path.join(directory, "show.json")
    with StatusStore(status) as store:
        store.set(*SMALL, 3)
    commands = {
        "bare_ms": [sys.executable, "-c", "pass"],
        "import_ms": [sys.executable, "-c", "import trainstatus"],
        "store_import_ms": [sys.executable, "-c", "from trainstatus import StatusStore"],
        "help_ms": [*cli, "--help"],
        "show_ms": [*cli, "show", status],
        # What show cannot go below: the re that pip's console script imports itself, and json.
        "re_json_ms": [sys.executable, "-c", "import re, json"],
    }
    env = _startup_env(directory)
    runs_of = {name: (command, env) for name, command in commands.items()}
    if before is not None:
        before_env = _startup_env(directory, before)
        runs_of.update({f"before:{name}": (command, before_env) for name, command in commands.items()
                        if name not in ("bare_ms", "re_json_ms")})
    for command, command_env in runs_of.values():  # fills the bytecode caches
        _run_ms(command, command_env)
    walls: dict[str, list[float]] = {name: [] for name in runs_of}
    cpus: dict[str, list[float]] = {name: [] for name in runs_of}
    for round_ in range(runs):
        names = list(runs_of)
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:  # the order rotates
            wall, cpu = _run_ms(*runs_of[name])
            walls[name].append(wall)
            cpus[name].append(cpu)
    times, heavy = [], []
    for _ in range(max(3, runs // 3)):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                              check=True, env=env)
        for line in done.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|\s?(\S.*)$", line)
            if m and m.group(3).strip() == "trainstatus":
                times.append(int(m.group(2)))
        heavy = json.loads(done.stdout.replace("'", '"'))
    over_bare = {name: round(statistics.median(c - b for c, b in zip(values, cpus["bare_ms"])), 2)
                 for name, values in cpus.items() if name != "bare_ms"}
    report = {
        "trainstatus_ms": round(statistics.median(times) / 1000, 2) if times else None,
        "runs": runs,
        **{name: round(statistics.median(values), 2) for name, values in walls.items() if ":" not in name},
        # User + system CPU of the process (medians): less moved by other processes than the wall clock.
        "cpu_ms": {name: round(statistics.median(values), 2) for name, values in cpus.items() if ":" not in name},
        "cpu_over_bare_ms": {name: value for name, value in over_bare.items() if ":" not in name},
        "numpy_imported": "numpy" in heavy,
        "also_imported": heavy,
    }
    if before is not None:
        report["before"] = {
            "src": before,
            **{name.split(":")[1]: round(statistics.median(values), 2) for name, values in walls.items() if ":" in name},
            "cpu_ms": {name.split(":")[1]: round(statistics.median(values), 2) for name, values in cpus.items()
                       if ":" in name},
            "cpu_over_bare_ms": {name.split(":")[1]: value for name, value in over_bare.items() if ":" in name},
        }
    return report


def memory_cost(directory: str, target: int) -> dict[str, Any]:
    """Peak memory of opening a store on a ``list`` state of about ``target`` bytes, in a fresh process.

    tracemalloc's peak while opening (every Python allocation: bytes read, parsed tree, stored
    entries) and what the open store keeps, against the file's size; and the process's peak RSS
    above what it had before opening.
    """
    path = os.path.join(directory, "memory.json")
    shape = _shapes.SHAPES["list"]
    with StatusStore(path) as store, store.transaction():
        for category, entries in shape.document(_shapes.count_for(shape, target)).items():
            for key, value in entries.items():
                store.set(category, key, value)
    code = (
        "import resource, sys, tracemalloc, trainstatus\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "tracemalloc.start()\n"
        "store = trainstatus.StatusStore(sys.argv[1])\n"
        "kept, peak = tracemalloc.get_traced_memory()\n"
        "tracemalloc.stop()\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(kept, peak, (after - before) * 1024)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True)
    kept, peak, rss = map(int, done.stdout.split())
    size = os.path.getsize(path)
    return {"file_bytes": size, "peak_traced_bytes": peak, "kept_traced_bytes": kept, "rss_growth_bytes": rss,
            "peak_ratio": round(peak / size, 2), "kept_ratio": round(kept / size, 2), "rss_ratio": round(rss / size, 2)}


# -- targets -------------------------------------------------------------------------------------


def ratio(results: dict[str, Any], size: str, a: str, b: str, figure: str = "p50_us") -> float | None:
    if size not in results or a not in results[size] or b not in results[size] or figure not in results[size][a]:
        return None
    return round(results[size][a][figure] / results[size][b][figure], 3)


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issues 4 and 13, as a ratio of p50s measured side by side in this run."""
    out: list[dict[str, Any]] = []

    def add(name: str, shape: str, size: str, value: float | None, limit: float, at_most: bool, what: str) -> None:
        if value is None:
            return
        met = value <= limit if at_most else value >= limit
        out.append({"target": name, "shape": shape, "size": size, "value": value, "limit": limit,
                    "comparison": "<=" if at_most else ">=", "met": met, "what": what})

    for shape, results in report["results"].items():
        for size in results:
            limit = 1.25 if size == "10MB" else 1.15
            for variant in ("small", "big"):
                add(f"durable set / floor ({variant})", shape, size, ratio(results, size, f"set_{variant}", "floor"),
                    limit, True, f"set_{variant} p50 / floor p50")
            if size == "1MB" and shape in ("categories", "keys", "nan", "behaviors", "small-keys"):
                # Issue 23: against the bytes floor (nothing serialized); for the NaN list the set
                # of the whole list, which must serialize it.
                variants = ("big",) if shape == "nan" else ("small", "big")
                for variant in variants:
                    limit = 1.5 if shape == "nan" else 1.15
                    add(f"durable set / bytes floor ({variant})", shape, size,
                        ratio(results, size, f"set_{variant}", "floor_bytes"), limit, True,
                        f"set_{variant} p50 / floor_bytes p50 (the store's bytes, prepared, written)")
                    add(f"durable set / bytes floor, CPU ({variant})", shape, size,
                        ratio(results, size, f"set_{variant}", "floor_bytes", "cpu_p50_us"), limit, True,
                        f"set_{variant} / floor_bytes, medians of the process's CPU time per call")
            add("open / json.loads", shape, size, ratio(results, size, "open", "json_loads"), 1.5, True,
                "open p50 / (read + json.loads) p50")
            add("open / orjson.loads", shape, size, ratio(results, size, "open", "orjson_loads"), 3.0, True,
                "open p50 / (read + orjson.loads) p50 (files without NaN)")
            add("get / loads of its bytes", shape, size, ratio(results, size, "get_big", "decode_big"), 1.2, True,
                "get_big p50 / loads of the same bytes p50 (orjson; json for NaN)")
            if shape != "list":
                continue
            if size != "1KB":
                for variant in ("small", "big"):
                    add(f"ML-Agents save / durable set ({variant})", shape, size,
                        ratio(results, size, "mlagents", f"set_{variant}"), 8.0 if size == "1MB" else 1.0, False,
                        f"mlagents p50 / set_{variant} p50 (how many times faster the durable set is)")
            if size == "1KB":
                add("durable=False set / ML-Agents save", shape, size, ratio(results, size, "set_nd_small", "mlagents"),
                    0.6, True, "set_nd_small p50 / mlagents p50")
                # Issue 23: against what any locked atomic rewrite must do, in wall clock and CPU.
                for figure, what in (("p50_us", "p50"), ("cpu_p50_us", "CPU")):
                    add(f"durable=False set / bare locked rewrite ({what})", shape, size,
                        ratio(results, size, "set_nd_small", "bare_locked", figure), 1.2, True,
                        f"set_nd_small / bare_locked, {what} medians")
            add("durable set, history=20 / history=0", shape, size, ratio(results, size, "set_small", "set_h0_small"),
                1.1, True, "set_small p50 / set_h0_small p50 (what keeping the replaced version costs)")
            add("100-set transaction / one set", shape, size, ratio(results, size, "tx100", "set_small"), 1.3, True,
                "tx100 p50 / set_small p50")
    imp = report.get("import")
    if imp:
        add("import trainstatus - bare start (ms)", "-", "-", round(imp["import_ms"] - imp["bare_ms"], 2), 40.0, True,
            "wall clock of python -c 'import trainstatus' minus python -c pass")
        for command in ("help", "show"):
            add(f"trainstatus {command} / bare start", "-", "-", round(imp[f"{command}_ms"] / imp["bare_ms"], 3), 3.0,
                True, f"wall clock of trainstatus {command} (1 KB file) / python -c pass")
        if "store_import_ms" in imp:  # issue 23's start-up figures, as differences of medians
            add("from trainstatus import StatusStore - bare start (ms)", "-", "-",
                round(imp["store_import_ms"] - imp["bare_ms"], 2), 20.0, True,
                "wall clock of python -c 'from trainstatus import StatusStore' minus python -c pass")
            add("trainstatus show - bare start (ms)", "-", "-", round(imp["show_ms"] - imp["bare_ms"], 2), 10.0, True,
                "wall clock of trainstatus show (1 KB file) minus python -c pass")
        if "cpu_over_bare_ms" in imp:  # the same, in CPU time, each run against the bare start of its round
            add("from trainstatus import StatusStore - bare start, CPU (ms)", "-", "-",
                imp["cpu_over_bare_ms"]["store_import_ms"], 20.0, True,
                "median over rounds of (CPU of python -c 'from trainstatus import StatusStore' - CPU of python -c pass)")
            add("trainstatus show - bare start, CPU (ms)", "-", "-", imp["cpu_over_bare_ms"]["show_ms"], 10.0, True,
                "median over rounds of (CPU of trainstatus show, 1 KB file - CPU of python -c pass)")
    memory = report.get("memory")
    if memory:
        add("open store peak memory / file size", "list", "10MB", memory["peak_ratio"], 3.0, True,
            "tracemalloc peak while opening / file bytes")
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


STARTUP_NAMES = {"import_ms": "import trainstatus", "store_import_ms": "from trainstatus import StatusStore",
                 "help_ms": "trainstatus --help", "show_ms": "trainstatus show",
                 "re_json_ms": "import re, json"}


def render(report: dict[str, Any]) -> str:
    lines = [
        f"trainstatus write overhead, {report['date']}",
        f"machine: {_common.describe_machine(report['machine'])}",
        f"small key: {'/'.join(SMALL)} (an int); big value: the shape's biggest value (nearly the whole file for "
        "list, nan, deep)",
    ]
    for shape, results in report["results"].items():
        sizes = list(results)
        infos = report["sizes"][shape]
        lines += [
            "",
            f"== shape {shape}: {_shapes.SHAPES[shape].what}; big value {'/'.join(_shapes.SHAPES[shape].big)}",
            "state: " + ", ".join(f"{s} = {infos[s]['file_bytes']} bytes ({infos[s]['count']} {infos[s]['unit']}, "
                                  f"{infos[s]['rounds']} rounds)" for s in sizes),
            "latency p50 / p99 (interleaved rounds)",
        ]
        methods = [m for m in METHODS if m in results[sizes[0]]]
        rows = [[METHODS[m]] + [f"{human(results[s][m]['p50_us'])} / {human(results[s][m]['p99_us'])}" for s in sizes]
                for m in methods]
        lines.append(_common.table(["method", *sizes], rows))
        lines += ["p50 relative to the floor (same run)"]
        rows = [[METHODS[m]] + [f"{results[s][m]['p50_us'] / results[s]['floor']['p50_us']:.2f}x" for s in sizes]
                for m in methods if m not in READS]
        lines.append(_common.table(["method", *sizes], rows))
    lines += ["", "targets (issues 4 and 13), ratios of p50s from this run"]
    rows = [[t["target"], t["shape"], t["size"], f"{t['value']}", f"{t['comparison']} {t['limit']}",
             "MET" if t["met"] else "MISSED"] for t in report["targets"]]
    lines.append(_common.table(["target", "shape", "size", "value", "limit", ""], rows))
    imp = report["import"]
    lines += ["", f"import trainstatus: {imp['trainstatus_ms']} ms (-X importtime, cumulative); wall clock: bare "
                  f"python {imp['bare_ms']} ms, import {imp['import_ms']} ms, "
                  f"from trainstatus import StatusStore {imp.get('store_import_ms', '-')} ms, trainstatus --help {imp['help_ms']} ms, "
                  f"show {imp['show_ms']} ms (medians of {imp['runs']}); numpy imported: "
                  f"{'yes' if imp['numpy_imported'] else 'no'}"]
    for label, figures in (("this version", imp), ("before", imp.get("before"))):
        if figures and "cpu_over_bare_ms" in figures:
            lines.append(f"CPU above a bare start, {label}: " + ", ".join(
                f"{STARTUP_NAMES[name]} +{value} ms" for name, value in figures["cpu_over_bare_ms"].items()))
    memory = report.get("memory")
    if memory:
        lines.append(f"memory, opening a {memory['file_bytes']}-byte file: tracemalloc peak {memory['peak_ratio']}x the "
                     f"file, kept {memory['kept_ratio']}x, RSS growth {memory['rss_ratio']}x")
    return "\n".join(lines)


# The methods that are not trainstatus's own: drawn dashed, so the store's lines stand out.
FLOORS = ("floor", "floor_bytes")  # drawn black: the floor solid, the bytes floor dashed
REFERENCES = ("floor", "floor_bytes", "mlagents", "sqlite_small", "sqlite_big", "json_loads", "orjson_loads", "decode_big")


def plot_paths(report: dict[str, Any], path: str) -> dict[str, str]:
    """One PNG per shape: ``write_overhead-list.png``, ``write_overhead-nan.png``... beside ``path``."""
    stem, ext = os.path.splitext(path)
    return {shape: f"{stem}-{shape}{ext or '.png'}" for shape in report["results"]}


def plot(report: dict[str, Any], path: str) -> list[str] | None:
    """p50 latency against state size, one figure per shape (``plot_paths``), each in two panels
    stacked so it reads at the width of a page: the writes (against the floor, ML-Agents' save and
    SQLite) above, the reads (open and get, against json/orjson loads) below."""
    plt = _common.matplotlib_pyplot()
    if plt is None:
        return None
    made = []
    for shape, shape_path in plot_paths(report, path).items():
        results = report["results"][shape]
        sizes = list(results)
        x = [report["sizes"][shape][s]["file_bytes"] for s in sizes]
        fig, axes = plt.subplots(2, 1, figsize=(9, 10))
        for ax, kind in zip(axes, ("writes", "reads")):
            # A method keeps its colour in every shape's figure.
            kind_methods = [m for m in METHODS if (m in READS) == (kind == "reads") and m not in FLOORS]
            colors = dict(zip(kind_methods, plt.get_cmap("tab20").colors))  # 11 write methods
            for method in METHODS:
                if (method in READS) != (kind == "reads") or method not in results[sizes[0]]:
                    continue
                floor = method == "floor"
                ax.plot(x, [results[s][method]["p50_us"] / 1000 for s in sizes],
                        "--" if method in REFERENCES and not floor else "-", marker="o",
                        color="black" if method in FLOORS else colors[method], linewidth=2.5 if floor else 1.5,
                        label=METHODS[method])
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(x, [s.replace("KB", " KB").replace("MB", " MB") for s in sizes])
            ax.minorticks_off()
            ax.set_xlabel("state size (the status file)")
            ax.set_ylabel("p50 latency of one call (ms, log)")
            ax.set_title(f"{kind}: trainstatus solid, references dashed", fontsize=10)
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=8, loc="upper left")
        what = report["shapes"][shape]["what"]
        fig.suptitle(f"{shape}: {what}\n({report['date'][:10]}, {report['machine']['filesystem']['type']})",
                     fontsize=11)
        fig.tight_layout()
        made.append(_common.save_figure(plt, fig, shape_path))
    return made


# -- profile -------------------------------------------------------------------------------------


def profile(directory: str, shape: _shapes.Shape, size: str, which: str) -> None:
    """cProfile of one method at one state size: where its time goes."""
    methods = tuple(dict.fromkeys((*CORE, which)))
    bench = Bench(directory, shape, _shapes.count_for(shape, SIZES[size]), methods)
    try:
        op = bench.methods()[which]
        count = 300 if SIZES[size] <= 1 << 20 else 30
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(count):
            op(i)
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
    parser.add_argument("--shape", default="list",
                        help="one of " + ", ".join(_shapes.SHAPES) + " (or several, comma-separated), or all")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of rounds")
    _common.add_output_options(parser, "write_overhead")
    parser.add_argument("--dir", help="directory to measure in (default: a new temp dir; its filesystem matters)")
    parser.add_argument("--profile", metavar="SIZE", help="only profile one method (--method) at SIZE")
    parser.add_argument("--method", default="set_small", help="the method --profile runs (default set_small)")
    parser.add_argument("--import-runs", type=int, default=15, help="fresh interpreters per start-up figure (median)")
    parser.add_argument("--startup", action="store_true",
                        help="measure only the start-up figures (no writes; JSON default "
                             "benchmarks/results/write_overhead-startup.json)")
    parser.add_argument("--startup-before", metavar="SRC",
                        help="also run the start-up commands with another version's src directory on PYTHONPATH, "
                             "in the same rounds (e.g. one made by git archive)")
    args = parser.parse_args(argv)
    if args.from_json:
        return _common.replot(parser, args, "write_overhead", plot)

    shapes = list(_shapes.SHAPES) if args.shape == "all" else [s for s in args.shape.split(",") if s]
    unknown_shapes = set(shapes) - set(_shapes.SHAPES)
    if unknown_shapes:
        parser.error(f"unknown shape {sorted(unknown_shapes)}; choose from {', '.join(_shapes.SHAPES)} or all")
    if args.profile:
        if args.profile not in SIZES or args.method not in METHODS:
            parser.error(f"--profile takes one of {', '.join(SIZES)}; --method one of {', '.join(METHODS)}")
        with work_directory(args.dir) as directory:
            profile(directory, _shapes.SHAPES[shapes[0]], args.profile, args.method)
        return 0

    sizes = list(QUICK_SIZES) if args.quick else list(SIZES)
    if args.sizes:
        sizes = [s for s in args.sizes.split(",") if s]
        unknown = set(sizes) - set(SIZES)
        if unknown:
            parser.error(f"unknown sizes {sorted(unknown)}; choose from {', '.join(SIZES)}")
    json_path, plot_path = _common.output_paths(args, "write_overhead-startup" if args.startup else "write_overhead")
    if args.startup:
        shapes = []

    report: dict[str, Any] = {"benchmark": "write_overhead", "format": 2, "quick": args.quick, "date": _common.now(),
                              "methods": METHODS, "core": list(CORE), "small_key": "/".join(SMALL),
                              "shapes": {name: {"what": _shapes.SHAPES[name].what,
                                                "big_key": "/".join(_shapes.SHAPES[name].big)} for name in shapes},
                              "sizes": {}, "results": {}}
    with work_directory(args.dir) as directory:
        report["machine"] = _common.machine(directory)
        for name in shapes:
            shape = _shapes.SHAPES[name]
            methods = tuple(METHODS) if name == "list" else CORE
            report["sizes"][name], report["results"][name] = {}, {}
            for size in sizes:
                table = ROUNDS if name == "list" else SHAPE_ROUNDS
                rounds = QUICK_ROUNDS if args.quick else max(3, round(table[size] * args.scale))
                _common.print_flush(f"measuring {name} {size} ({rounds} rounds)...")
                sub = os.path.join(directory, f"{name}-{size}")
                os.mkdir(sub)
                info, results = run_size(sub, shape, SIZES[size], rounds, 1 if args.quick else WARMUP, methods)
                report["sizes"][name][size] = info
                report["results"][name][size] = results
                shutil.rmtree(sub, ignore_errors=True)
        report["import"] = import_cost(3 if args.quick else args.import_runs, directory, args.startup_before)
        if not args.quick and not args.startup:
            report["memory"] = memory_cost(directory, SIZES["10MB"])
    report["targets"] = targets(report)
    report["plot"] = None if args.no_plot or args.startup else plot(report, plot_path)
    _common.publish(report, json_path, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
