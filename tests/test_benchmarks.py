"""The benchmarks still run: each script's --quick mode, as a subprocess, with its JSON checked.

These are smoke tests so the scripts never rot. They check the shape of the output and that the
figures are sane (positive, p99 >= p50, ratios computed from the figures shown), never how fast
anything is: timing thresholds have no place in a test suite run on a loaded machine.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_quick(script: str, tmp_path: Path, plots: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """Run ``script --quick --plot plot.png`` writing into ``tmp_path``; its JSON report and stdout.
    ``plots``: the PNGs it makes instead of plot.png (write_overhead.py: one per shape)."""
    json_path, plot_path = tmp_path / "report.json", tmp_path / "plot.png"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", "--json", str(json_path), "--plot", str(plot_path),
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    report = json.loads(json_path.read_text())
    made = [tmp_path / name for name in plots] or [plot_path]
    if HAS_MATPLOTLIB:
        assert report["plot"] == ([str(p) for p in made] if plots else str(plot_path))
        for path in made:
            assert path.read_bytes().startswith(PNG_MAGIC)
    else:
        assert report["plot"] is None and not any(p.exists() for p in made)
        assert "not made (install the bench extra: matplotlib)" in done.stdout
    assert f"JSON: {json_path}" in done.stdout
    # Only the report and the plots are left behind: the measuring directory is removed.
    assert {p.name for p in tmp_path.iterdir()} <= {"report.json", *(p.name for p in made)}
    return report, done.stdout


def assert_latency(summary: dict[str, Any]) -> None:
    assert set(summary) >= {"p50_us", "p99_us", "n"}
    assert summary["n"] > 0
    assert 0 < summary["p50_us"] <= summary["p99_us"]
    assert math.isfinite(summary["p99_us"])


def assert_machine(info: dict[str, Any]) -> None:
    assert info["cores"] >= 1
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["filesystem"]["type"]
    for package in ("trainstatus", "orjson", "filelock"):
        assert info[package] != "not installed"


@pytest.mark.long
def test_write_overhead_quick(tmp_path: Path) -> None:
    report, stdout = run_quick("write_overhead.py", tmp_path, plots=("plot-list.png",))
    assert report["benchmark"] == "write_overhead" and report["quick"] is True and report["format"] == 2
    assert_machine(report["machine"])
    methods = report["methods"]
    assert list(methods) == ["floor", "floor_bytes", "set_small", "set_h0_small", "set_big", "set_none", "set_nd_small", "set_nd_big",
                             "tx100", "bare_locked", "mlagents", "sqlite_small", "sqlite_big", "open", "json_loads", "orjson_loads",
                             "get_small", "get_big", "decode_big"]
    assert report["small_key"] == "wall_height/lesson_num"
    assert list(report["shapes"]) == list(report["results"]) == ["list"]  # the default --shape
    assert report["shapes"]["list"]["big_key"] == "Walker/checkpoints"
    results_by_size, sizes = report["results"]["list"], report["sizes"]["list"]
    assert list(results_by_size) == list(sizes) == ["1KB", "32KB"]
    for size, info in sizes.items():
        assert 0.5 * info["target_bytes"] <= info["file_bytes"] <= 2 * info["target_bytes"]
        assert info["count"] >= 1 and info["unit"] == "checkpoints" and info["rounds"] >= 3
        results = results_by_size[size]
        assert list(results) == list(methods)
        for method, summary in results.items():
            assert_latency(summary)
            burst = summary["n"] // info["rounds"]
            assert summary["n"] == info["rounds"] * burst and burst >= 1
            reads = method in ("open", "json_loads", "orjson_loads") or method.startswith(("get", "decode"))
            assert (burst > 1) == reads
    assert sizes["1KB"]["count"] < sizes["32KB"]["count"]

    names = {(t["target"], t["shape"], t["size"]) for t in report["targets"]}
    for name, size in (("durable set / floor (small)", "1KB"), ("durable set / floor (big)", "32KB"),
                       ("durable=False set / ML-Agents save", "1KB"),
                       ("durable=False set / bare locked rewrite (p50)", "1KB"),
                       ("durable=False set / bare locked rewrite (CPU)", "1KB"), ("100-set transaction / one set", "32KB"),
                       ("durable set, history=20 / history=0", "1KB"), ("open / json.loads", "1KB"),
                       ("open / orjson.loads", "32KB"), ("get / loads of its bytes", "32KB")):
        assert (name, "list", size) in names, name
    for start in ("import trainstatus - bare start (ms)", "trainstatus help / bare start", "trainstatus show / bare start",
                  "from trainstatus import StatusStore - bare start (ms)", "trainstatus show - bare start (ms)"):
        assert (start, "-", "-") in names
    for target in report["targets"]:
        assert isinstance(target["met"], bool)
        assert target["value"] > 0 or target["target"].startswith("import")
        assert target["met"] == (target["value"] <= target["limit"] if target["comparison"] == "<="
                                 else target["value"] >= target["limit"])
    floor_ratio = next(t for t in report["targets"] if t["target"] == "durable set / floor (small)" and t["size"] == "1KB")
    one_kb = results_by_size["1KB"]
    assert floor_ratio["value"] == pytest.approx(one_kb["set_small"]["p50_us"] / one_kb["floor"]["p50_us"], rel=1e-2)

    start = report["import"]
    assert start["trainstatus_ms"] > 0 and start["bare_ms"] > 0 and start["help_ms"] > 0 and start["show_ms"] > 0
    assert start["store_import_ms"] > 0 and set(start["cpu_ms"]) == {"bare_ms", "import_ms", "store_import_ms", "help_ms",
                                                                    "show_ms", "re_json_ms"}
    assert start["numpy_imported"] is False  # heavy imports stay lazy
    assert "memory" not in report  # a full run only

    for label in methods.values():
        assert label in stdout
    assert "targets (issues 4 and 13)" in stdout and "import trainstatus:" in stdout
    assert "MET" in stdout or "MISSED" in stdout


@pytest.mark.long
def test_write_overhead_measures_every_shape(tmp_path: Path) -> None:
    json_path = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "write_overhead.py"), "--quick", "--shape", "all", "--sizes", "1KB",
         "--json", str(json_path), "--no-plot", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(json_path.read_text())
    assert list(report["results"]) == ["list", "categories", "keys", "nan", "deep", "behaviors", "small-keys"]
    for shape, by_size in report["results"].items():
        methods = by_size["1KB"]
        expected = {"floor", "floor_bytes", "set_small", "set_big", "open", "json_loads", "get_big", "decode_big"}
        assert expected <= set(methods), shape
        assert ("orjson_loads" in methods) == (shape != "nan")  # orjson cannot read NaN
        for summary in methods.values():
            assert_latency(summary)
    assert report["sizes"]["categories"]["1KB"]["unit"] == "categories"
    assert report["sizes"]["keys"]["1KB"]["unit"] == "keys"


def replot(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def test_write_overhead_replots_a_saved_report_without_measuring(tmp_path: Path) -> None:
    # The committed full run (five shapes, four sizes): one figure per shape, nothing measured
    # (no table printed), and the report only read, byte for byte as it was.
    saved = tmp_path / "saved.json"
    saved.write_bytes((RESULTS / "write_overhead.json").read_bytes())
    done = replot("write_overhead.py", "--from-json", str(saved), "--plot", str(tmp_path / "wo.png"), cwd=tmp_path)
    shapes = ["list", "categories", "keys", "nan", "deep"]
    made = [tmp_path / f"wo-{shape}.png" for shape in shapes]
    assert saved.read_bytes() == (RESULTS / "write_overhead.json").read_bytes()
    assert "measuring" not in done.stdout and "JSON:" not in done.stdout
    if HAS_MATPLOTLIB:
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == f"plot: {', '.join(str(p) for p in made)}\n"
        for path in made:
            assert path.read_bytes().startswith(PNG_MAGIC)
    else:
        assert done.returncode == 1
        assert done.stderr == "plot: not made (install the bench extra: matplotlib)\n"
    assert {p.name for p in tmp_path.iterdir()} == {"saved.json"} | ({p.name for p in made} if HAS_MATPLOTLIB else set())


def test_replot_refuses_another_benchmarks_report_and_measuring_options(tmp_path: Path) -> None:
    done = replot("write_overhead.py", "--from-json", str(RESULTS / "concurrency.json"), cwd=tmp_path)
    assert done.returncode == 2
    assert (f"--from-json: {RESULTS / 'concurrency.json'} is not a report of write_overhead.py "
            "(its benchmark is 'concurrency')") in done.stderr
    done = replot("concurrency.py", "--from-json", str(RESULTS / "concurrency.json"), "--no-plot", cwd=tmp_path)
    assert done.returncode == 2
    assert "--from-json draws the plot of a saved report: it takes neither --no-plot nor --json" in done.stderr
    done = replot("object_store_writers.py", "--from-json", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert done.returncode == 2 and f"--from-json: cannot read {tmp_path / 'missing.json'}" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="draws a plot: needs the bench extra (matplotlib)")
def test_concurrency_replots_a_saved_report(tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    saved.write_bytes((RESULTS / "concurrency.json").read_bytes())
    done = replot("concurrency.py", "--from-json", str(saved), "--plot", str(tmp_path / "c.png"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert saved.read_bytes() == (RESULTS / "concurrency.json").read_bytes()
    assert done.stdout == f"plot: {tmp_path / 'c.png'}\n"
    assert (tmp_path / "c.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.long
def test_concurrency_quick(tmp_path: Path) -> None:
    report, stdout = run_quick("concurrency.py", tmp_path)
    assert report["benchmark"] == "concurrency" and report["quick"] is True and report["durable"] is True
    assert_machine(report["machine"])
    for kind in ("threads", "processes"):
        entries = report["results"][kind]
        assert [e["workers"] for e in entries] == [1, 2, 4, 8]
        for entry in entries:
            assert_latency(entry)
            assert entry["sets"] == entry["n"] > 0  # one latency per acknowledged set
            assert entry["writes"] >= 1
            assert entry["sets_per_s"] == pytest.approx(entry["sets"] / entry["seconds"], rel=1e-2)
            # (rounded to 3 decimals in the report: a tiny speedup on a busy machine is off by more than 1%)
            assert entry["speedup"] == pytest.approx(entry["sets_per_s"] / entries[0]["sets_per_s"], rel=1e-2, abs=1e-3)
            assert entry["sets_per_write"] >= 1.0  # a write never carries less than one set
        assert entries[0]["sets_per_write"] == 1.0  # a single writer has nobody to share with
    target = report["target"]
    threads = report["results"]["threads"]
    assert target["value"] == pytest.approx(threads[-1]["sets_per_s"] / threads[0]["sets_per_s"], rel=1e-2)
    assert target["met"] == (target["value"] >= 4.0)
    assert "target (issue 4)" in stdout
    eight = report["results"]["processes"][-1]
    processes = report["process_target"]
    assert processes["value"] == pytest.approx(eight["sets_per_s"] / report["results"]["processes"][0]["sets_per_s"], rel=1e-2)
    assert processes["p99_over_p50"] == pytest.approx(eight["p99_us"] / eight["p50_us"], rel=1e-2)
    assert processes["met"] == (processes["value"] >= 1.0 and processes["p99_over_p50"] <= 4.0)
    assert "target (issue 23)" in stdout


def test_write_overhead_startup_measures_start_up_alone_against_another_version(tmp_path: Path) -> None:
    """--startup: the start-up rows only, with bytecode caches whatever the environment says, and
    --startup-before's version run in the same rounds (here this checkout's own src again)."""
    json_path = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "write_overhead.py"), "--startup", "--import-runs", "2",
         "--json", str(json_path), "--dir", str(tmp_path), "--startup-before", str(ROOT / "src")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads(json_path.read_text())
    assert report["results"] == {} and report["plot"] is None and "memory" not in report
    names = {"import_ms", "store_import_ms", "help_ms", "show_ms"}
    imp = report["import"]
    assert imp["runs"] == 2 and set(imp["cpu_over_bare_ms"]) == {*names, "re_json_ms"}
    assert set(imp["before"]["cpu_over_bare_ms"]) == names
    assert imp["before"]["src"] == str(ROOT / "src") and all(imp["before"][name] > 0 for name in names)
    cpu_rows = {t["target"]: t for t in report["targets"] if ", CPU" in t["target"]}
    assert cpu_rows["trainstatus show - bare start, CPU (ms)"]["value"] == imp["cpu_over_bare_ms"]["show_ms"]
    assert "CPU above a bare start, before: " in done.stdout
    assert {p.name for p in tmp_path.iterdir()} == {"report.json"}  # the caches went with the measuring directory


def test_start_up_runs_keep_bytecode_caches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without caches each run would compile every module again: not what an installed package costs."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    spec = importlib.util.spec_from_file_location("_write_overhead_under_test", BENCHMARKS / "write_overhead.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ first
    spec.loader.exec_module(module)
    env = module._startup_env(str(tmp_path), "/before/src")
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    assert env["PYTHONPATH"] == os.pathsep.join(("/before/src", "/elsewhere"))


def run_with_torch(torch_python: Path, script: str, tmp_path: Path) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """``script --quick`` run by .venv-torch's interpreter (the integrations group), writing into
    ``tmp_path``: its JSON report and the finished process."""
    json_path = tmp_path / "report.json"
    done = subprocess.run(
        [str(torch_python), str(BENCHMARKS / script), "--quick", "--json", str(json_path), "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return json.loads(json_path.read_text()), done


def test_the_distributed_benchmark_runs_and_reports_what_it_measured(torch_python: Path, tmp_path: Path) -> None:
    """benchmarks/distributed.py --quick (needs torch: .venv-torch, so the integrations group): every
    part ran, at the rank counts asked, and the table's ratios are computed from the JSON's medians."""
    report, done = run_with_torch(torch_python, "distributed.py", tmp_path)
    assert [run["ranks"] for run in report["save"]] == [1, 2]
    assert [run["ranks"] for run in report["collective"]] == [1, 2]
    for run in report["save"]:
        medians = run["median_s"]
        assert set(medians) == {"write", "floor", "dcp", "dcp+record", "torch.save", "torch.save+record"}
        assert all(value > 0 for value in medians.values())
        added = (medians["torch.save+record"] - medians["torch.save"]) * 1000
        assert f"{added:.1f}" in done.stdout
    resume = report["resume"]
    assert resume["full read (zipfile.testzip)"]["bytes_read"] >= resume["ckpt_bytes"]
    assert resume["lightning.last_complete_checkpoint"]["bytes_read"] < resume["ckpt_bytes"] // 10
    assert resume["dcp.last_complete_checkpoint"]["bytes_read"] < resume["dcp_bytes"] // 10
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # the checkpoints went with their folder


def test_the_ranks_cost_benchmark_counts_a_record_and_a_decision(torch_python: Path, tmp_path: Path) -> None:
    """benchmarks/ranks_cost.py --quick (needs torch): 2 real ranks and 16 simulated on 4 hosts; the
    counts are the protocol's (one host syncs each of the files once; 4 hosts, once each), and the
    table shows them."""
    report, done = run_with_torch(torch_python, "ranks_cost.py", tmp_path)
    (real,), (simulated,) = report["real"], report["simulated"]
    assert (real["ranks"], real["files"], simulated["ranks"], simulated["hosts"]) == (2, 3, 16, 4)
    assert real["record"]["fsync"] == 3 and real["record"]["folder_listings"] <= 2
    assert real["decision"]["stat"] + real["decision"]["open"] <= 2 * 3 + 2
    assert simulated["record"]["fsync"] == 4 * 17 and simulated["record"]["folder_listings"] == 4 + 1
    assert real["record"]["median_ms"] > 0 and real["decision"]["ms"] > 0
    row = done.stdout.splitlines()[-4].split()
    assert row[:6] == ["2", "1", "3", "this", "record", "3"], done.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_version_lock_quick(tmp_path: Path) -> None:
    report, stdout = run_quick("version_lock.py", tmp_path)
    assert report["benchmark"] == "version_lock" and report["quick"] is True
    assert_machine(report["machine"])
    results = report["results"]
    assert list(results) == ["set", "set-unlocked", "fast", "fast-unlocked", "floor", "check"]
    for name, summary in results.items():
        assert_latency(summary)
        assert summary["n"] == report["rounds"] * report["calls"] == 20, name
        assert 0 < summary["cpu_p50_us"]
    ratios = report["ratios"]
    assert ratios["set_over_unlocked"] == pytest.approx(results["set"]["p50_us"] / results["set-unlocked"]["p50_us"], abs=1e-3)
    assert ratios["check_over_floor"] == pytest.approx(results["check"]["p50_us"] / results["floor"]["p50_us"], abs=1e-4)
    assert "the lock's own calls / the fsync floor (p50)" in stdout
