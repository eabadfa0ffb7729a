#!/usr/bin/env python3
"""What locking the status file's versions costs a set (issue 42, ``trainstatus._lock.version``).

A writer that holds the lock also ``flock``s the version of the status file it builds on and its
new version before the rename, so that a lock file deleted by hand never lets two writers in at
once. Measured here, round by round and interleaved (a slow spell of the machine hits every
variant alike), on a small (about 1 KB) status file, one writer:

  set           StatusStore.set, durable, as shipped (versions locked)
  set-unlocked  the same with the versions' locks turned off (the code before issue 42)
  fast          StatusStore(durable=False).set, versions locked
  fast-unlocked the same, turned off
  floor         the bare durable protocol of the same bytes: temp file, write, fsync, rename,
                directory fsync (what no durable write can do without)
  check         the lock's own system calls alone, as one write makes them: take the version
                (dup, flock, stat), adopt the new one (dup, flock), let both go (flock, close)

Reported: p50 and p99 latency and p50 CPU per call, and the ratios that matter: what the lock adds
to a durable set and to a non-durable one, against the floor.

  python benchmarks/version_lock.py           # 7 rounds of 300 calls per variant
  python benchmarks/version_lock.py --quick   # 1 round of 20: a smoke test (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from trainstatus import StatusStore  # noqa: E402
from trainstatus._lock import version as _version  # noqa: E402  (turned off for the "-unlocked" rows)

NAME = "version_lock"
VARIANTS = ("set", "set-unlocked", "fast", "fast-unlocked", "floor", "check")


def floor_write(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    temp = os.path.join(directory, ".floor.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class Unlocked:
    """Within it, versions are not locked (``VersionLocks.usable`` says no): the code before."""

    def __enter__(self) -> None:
        self._usable = _version.VersionLocks.usable
        _version.VersionLocks.usable = lambda self, device=None: False  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        _version.VersionLocks.usable = self._usable  # type: ignore[method-assign]


def measure(call: Callable[[int], None], n: int) -> tuple[list[int], list[int]]:
    """(wall ns, process CPU ns) of each of ``n`` calls."""
    wall, cpu = [], []
    for i in range(n):
        w0, c0 = time.perf_counter_ns(), time.process_time_ns()
        call(i)
        cpu.append(time.process_time_ns() - c0)
        wall.append(time.perf_counter_ns() - w0)
    return wall, cpu


def run(directory: str, rounds: int, calls: int) -> dict[str, Any]:
    durable = StatusStore(os.path.join(directory, "durable", "status.json"))
    fast = StatusStore(os.path.join(directory, "fast", "status.json"), durable=False)
    for store in (durable, fast):
        _common.prefill(store)
    floor_path = os.path.join(directory, "floor", "status.json")
    os.makedirs(os.path.dirname(floor_path))
    data = open(durable.path, "rb").read()
    check_path = os.path.join(directory, "check", "status.json")
    os.makedirs(os.path.dirname(check_path))
    with open(check_path, "wb") as f:
        f.write(data)
    locks = _version.VersionLocks(check_path + ".lock")
    check_fd = os.open(check_path, os.O_RDONLY)
    st = os.fstat(check_fd)
    key = (st.st_dev, st.st_ino)
    new_fd = os.open(os.path.join(directory, "check", "new"), os.O_RDONLY | os.O_CREAT, 0o600)
    new_st = os.fstat(new_fd)

    def check(i: int) -> None:
        locks.take(check_fd, key, check_path, None, None, path=check_path)
        locks.adopt(new_fd, new_st)
        locks.release()

    def setter(store: StatusStore, unlocked: bool) -> Callable[[int], None]:
        def call(i: int) -> None:
            if unlocked:
                with Unlocked():
                    store.set("wall_height", "lesson_num", i)
            else:
                store.set("wall_height", "lesson_num", i)
        return call

    variants: dict[str, Callable[[int], None]] = {
        "set": setter(durable, False), "set-unlocked": setter(durable, True),
        "fast": setter(fast, False), "fast-unlocked": setter(fast, True),
        "floor": lambda i: floor_write(floor_path, data), "check": check,
    }
    wall: dict[str, list[int]] = {name: [] for name in VARIANTS}
    cpu: dict[str, list[int]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name in VARIANTS:
            w, c = measure(variants[name], calls)
            wall[name] += w
            cpu[name] += c
    os.close(check_fd)
    os.close(new_fd)
    durable.close()
    fast.close()
    results = {}
    for name in VARIANTS:
        summary = _common.summary_us(wall[name])
        summary["cpu_p50_us"] = round(_common.percentile(cpu[name], 50) / 1000, 2)
        results[name] = summary
    return results


def ratios(results: dict[str, Any]) -> dict[str, float]:
    def p50(name: str) -> float:
        return float(results[name]["p50_us"])

    return {
        "set_over_unlocked": round(p50("set") / p50("set-unlocked"), 3),
        "fast_over_unlocked": round(p50("fast") / p50("fast-unlocked"), 3),
        "check_over_floor": round(p50("check") / p50("floor"), 4),
        "check_over_fast_unlocked": round(p50("check") / p50("fast-unlocked"), 4),
    }


def render(report: dict[str, Any]) -> str:
    results = report["results"]
    rows = [[name, f"{results[name]['p50_us']:.1f}", f"{results[name]['p99_us']:.1f}",
             f"{results[name]['cpu_p50_us']:.1f}"] for name in VARIANTS]
    r = report["ratios"]
    return "\n".join([
        _common.table(["variant", "p50 µs", "p99 µs", "CPU p50 µs"], rows),
        "",
        f"durable set, versions locked / not locked (p50): {r['set_over_unlocked']:.3f}",
        f"durable=False set, locked / not locked (p50):     {r['fast_over_unlocked']:.3f}",
        f"the lock's own calls / the fsync floor (p50):      {r['check_over_floor']:.4f}",
        f"the lock's own calls / a durable=False set (p50):  {r['check_over_fast_unlocked']:.4f}",
    ])


def plot(report: dict[str, Any], path: str) -> str | None:
    plt = _common.matplotlib_pyplot()
    if plt is None:
        return None
    results = report["results"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(VARIANTS, [results[name]["p50_us"] for name in VARIANTS], color="#4477aa")
    ax.set_ylabel("p50 latency (µs)")
    ax.set_title("Locking the status file's versions (issue 42)")
    fig.tight_layout()
    return _common.save_figure(plt, fig, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round of 20 calls: a smoke test")
    parser.add_argument("--rounds", type=int, help="rounds (variants interleaved), default 7")
    parser.add_argument("--calls", type=int, help="calls per variant and round, default 300")
    parser.add_argument("--dir", help="measure on this filesystem (default: a temp folder)")
    _common.add_output_options(parser, NAME)
    args = parser.parse_args()
    if args.from_json:
        return _common.replot(parser, args, NAME, plot)
    rounds = args.rounds or (1 if args.quick else 7)
    calls = args.calls or (20 if args.quick else 300)
    directory = tempfile.mkdtemp(prefix="trainstatus-bench-", dir=args.dir)
    try:
        results = run(directory, rounds, calls)
        report: dict[str, Any] = {
            "benchmark": NAME, "quick": args.quick, "when": _common.now(), "rounds": rounds, "calls": calls,
            "machine": _common.machine(directory), "results": results,
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    report["ratios"] = ratios(results)
    json_path, plot_path = _common.output_paths(args, NAME)
    report["plot"] = None if args.no_plot else plot(report, plot_path)
    _common.publish(report, json_path, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
