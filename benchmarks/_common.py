"""What both benchmarks share: the machine's description, percentiles, the JSON file, the plot.

Imported by ``write_overhead.py`` and ``concurrency.py``, which run as scripts from any working
directory (``python benchmarks/write_overhead.py``), so this file sits beside them.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``samples``; with fewer than 100 samples the
    p99 is the largest one."""
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary_us(samples_ns: Sequence[int]) -> dict[str, Any]:
    """p50 and p99 in microseconds of latencies measured in nanoseconds."""
    return {
        "p50_us": round(percentile(samples_ns, 50) / 1000, 2),
        "p99_us": round(percentile(samples_ns, 99) / 1000, 2),
        "n": len(samples_ns),
    }


def _first_line(path: str, prefix: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def filesystem_of(path: str) -> dict[str, str]:
    """The mount holding ``path``: its filesystem type, device and mount point (Linux only)."""
    best: tuple[int, dict[str, str]] = (-1, {"type": "unknown", "device": "unknown", "mount_point": "unknown"})
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                device, mount_point, fstype = line.split()[:3]
                mount_point = mount_point.replace("\\040", " ")
                inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) > best[0]:
                    best = (len(mount_point), {"type": fstype, "device": device, "mount_point": mount_point})
    except OSError:
        pass
    return best[1]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine(directory: str) -> dict[str, Any]:
    """What the figures depend on: CPU, cores, memory, OS, filesystem, Python and libraries."""
    memory_kb = _first_line("/proc/meminfo", "MemTotal")
    return {
        "cpu": _first_line("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory_kb.split()[0]) / 2**20, 1) if memory_kb else None,
        "os": f"{platform.system()} {platform.release()}",
        "filesystem": filesystem_of(directory),
        "directory": directory,
        "python": platform.python_version(),
        "trainstatus": _version("trainstatus"),
        "orjson": _version("orjson"),
        "filelock": _version("filelock"),
        "sqlite": sqlite3.sqlite_version,
    }


def describe_machine(info: dict[str, Any]) -> str:
    fs = info["filesystem"]
    return (
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB; {info['os']}; "
        f"{fs['type']} on {fs['device']} ({info['directory']}); Python {info['python']}; "
        f"trainstatus {info['trainstatus']}, orjson {info['orjson']}, filelock {info['filelock']}, "
        f"SQLite {info['sqlite']}"
    )


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def write_json(path: str, report: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


def matplotlib_pyplot() -> Any:
    """matplotlib's pyplot with a file-only backend, or None when the ``bench`` extra is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt: Any, fig: Any, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def add_output_options(parser: argparse.ArgumentParser, name: str) -> None:
    """--json, --plot and --no-plot, with results/<name>[-quick].json as the default."""
    parser.add_argument("--json", help=f"where to write the JSON (default benchmarks/results/{name}[-quick].json)")
    parser.add_argument("--plot", help="where to write the PNG (default: beside the JSON)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--from-json", metavar="PATH",
                        help="measure nothing: draw the plot again from a JSON report this script wrote "
                             "(beside it, or at --plot); the report itself is left as it is")


def add_round_options(parser: argparse.ArgumentParser) -> None:
    """--quick, --duration and --rounds of the benchmarks that run writers for a while."""
    parser.add_argument("--quick", action="store_true", help="one short round: a smoke test")
    parser.add_argument("--duration", type=float, help="seconds per configuration and round")
    parser.add_argument("--rounds", type=int, help="rounds (configurations interleaved)")


def rounds_of(args: argparse.Namespace) -> tuple[float, int]:
    """(seconds per configuration and round, rounds) from ``add_round_options``' options."""
    return args.duration or (0.25 if args.quick else 2.0), args.rounds or (1 if args.quick else 3)


def output_paths(args: argparse.Namespace, name: str) -> tuple[str, str]:
    """(JSON path, PNG path) from ``add_output_options``' options (and ``--quick``)."""
    json_path = args.from_json or args.json or os.path.join(RESULTS, f"{name}{'-quick' if args.quick else ''}.json")
    return json_path, args.plot or os.path.splitext(json_path)[0] + ".png"


def replot(parser: argparse.ArgumentParser, args: argparse.Namespace, name: str,
           plot: Callable[[dict[str, Any], str], str | list[str] | None]) -> int:
    """``--from-json``: the plot of a saved report, without measuring again. The report is only
    read: its figures stay exactly as the measuring run wrote them."""
    if args.no_plot or args.json:
        parser.error("--from-json draws the plot of a saved report: it takes neither --no-plot nor --json")
    try:
        with open(args.from_json, encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError) as exc:
        parser.error(f"--from-json: cannot read {args.from_json}: {exc}")
    if not isinstance(report, dict) or report.get("benchmark") != name:
        found = report.get("benchmark") if isinstance(report, dict) else None
        parser.error(f"--from-json: {args.from_json} is not a report of {name}.py (its benchmark is {found!r})")
    if matplotlib_pyplot() is None:
        print("plot: not made (install the bench extra: matplotlib)", file=sys.stderr)
        return 1
    _, plot_path = output_paths(args, name)
    print(f"plot: {plot_names(plot(report, plot_path))}")
    return 0


def plot_names(plot: str | list[str] | None) -> str:
    """Where the plot went (one PNG, or one per shape), for the last line of a run."""
    if not plot:
        return "not made (install the bench extra: matplotlib)"
    return plot if isinstance(plot, str) else ", ".join(plot)


def run_writer_processes(context: Any, target: Callable[..., None], args_for: Callable[[int], tuple[Any, ...]],
                         workers: int, timeout: float) -> tuple[list[Any], float]:
    """Run ``workers`` processes of ``target(*args_for(w), barrier, queue)``, released together by
    the barrier; (their reports from the queue, the monotonic time they were released). A report
    that does not start with "ok" raises."""
    barrier, queue = context.Barrier(workers + 1), context.Queue()
    processes = [context.Process(target=target, args=(*args_for(w), barrier, queue)) for w in range(workers)]
    for process in processes:
        process.start()
    barrier.wait(timeout)
    start = time.monotonic()
    reports = [queue.get(timeout=timeout) for _ in processes]
    for process in processes:
        process.join(timeout)
    failed = [r for r in reports if r[0] != "ok"]
    if failed:
        raise RuntimeError(f"writer processes failed: {failed}")
    return reports, start


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table, first column left-aligned, the others right-aligned."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def print_flush(*args: Any) -> None:
    print(*args)
    sys.stdout.flush()


def publish(report: dict[str, Any], json_path: str, rendered: Callable[[dict[str, Any]], str]) -> None:
    """Write the JSON report, then print the table and where the JSON and the plot went."""
    write_json(json_path, report)
    print()
    print(rendered(report))
    print()
    print(f"JSON: {json_path}")
    print(f"plot: {plot_names(report['plot'])}")


def prefill(store: Any) -> None:
    """A small status document, as a trainer has it (about 1 KB), in one transaction of ``store``."""
    with store.transaction():
        store.set("wall_height", "lesson_num", 3)
        store.set("SoccerTwos?team=0", "elo", 1234.5)
        store.set("Walker", "checkpoints", [
            {"steps": 500_000 * i, "file_path": f"results/run1/Walker/Walker-{500_000 * i}.onnx",
             "reward": 100.0 + i, "creation_time": 1764665000.0 + 600 * i,
             "auxillary_file_paths": [f"results/run1/Walker/Walker-{500_000 * i}.pt"]} for i in range(1, 3)
        ])
