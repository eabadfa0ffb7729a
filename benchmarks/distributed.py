"""What the records and resume decisions of several processes cost (issue 33): run with torch.

    .venv-torch/bin/python benchmarks/distributed.py            # the figures of docs/distributed.md
    .venv-torch/bin/python benchmarks/distributed.py --quick    # the smoke test's small run

Three parts, each in fresh processes (``torch.distributed.run`` for two ranks and more, one plain
process for one rank), rounds interleaved so the ratios hold on a noisy machine:

- ``save``: a model of ``--size-mb`` (100 MB; split between the ranks) saved the way the
  integrations' libraries save it, without and with trainstatus's record, beside the physical
  floor of the same bytes (written, then fsynced). Two ways: ``dcp.save`` (which fsyncs its files
  itself) then ``trainstatus.integrations.dcp.record``; and each rank's ``torch.save`` of its part
  (what the Transformers Trainer and Lightning do: no fsync) then the collective record the
  Transformers callback makes. The record's cost beside the fsync of the same bytes is the figure.
- ``collective``: one record (of a folder of four small files, recorded again in place) and one
  resume decision, at 1 rank (no process group) and at 2 and 4: the collectives' own cost.
- ``resume``: ``last_complete_checkpoint`` on a recorded DCP folder and on a Lightning ``.ckpt`` of
  ``--big-gb`` (1 GB) of random bytes: wall time and bytes read (``/proc/self/io`` rchar), beside a
  full read of the same file (``zipfile.testzip``, what the Lightning check did before).

Writes ``results/distributed.json`` (or ``--json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import describe_machine, machine, now, table, write_json  # noqa: E402


# -- workers (run under torch.distributed.run, or alone for one rank) ---------------------------


def _init() -> tuple[int, int, Any]:
    import torch.distributed as dist

    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size(), dist
    return 0, 1, None


def _sync(dist: Any) -> None:
    if dist is not None:
        dist.barrier()


def _fsync_write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def worker_save(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp

    from trainstatus import CheckpointList, StatusStore
    from trainstatus.integrations._ranks import saving
    from trainstatus.integrations.dcp import record

    rank, world, dist = _init()
    torch.manual_seed(rank)
    part = torch.randn(int(args.size_mb * 2**20 / 4 / world))
    state = {f"w{rank}": part}
    data = part.numpy().tobytes()
    root = os.path.join(args.dir, "save")
    status = os.path.join(root, "torch-save", "training_status.json")
    if rank == 0:
        os.makedirs(os.path.join(root, "torch-save"), exist_ok=True)
    _sync(dist)
    times: dict[str, list[float]] = {k: [] for k in ("write", "floor", "dcp", "dcp+record", "torch.save",
                                                     "torch.save+record")}
    kinds = list(times)
    for round_ in range(args.rounds):
        for kind in kinds[round_ % len(kinds):] + kinds[:round_ % len(kinds)]:
            folder = os.path.join(root, kind.replace("+", "_"), f"step-{round_}")
            os.makedirs(folder, exist_ok=True)
            _sync(dist)
            start = time.perf_counter()
            if kind in ("write", "floor"):
                path = os.path.join(folder, f"part-{rank}.bin")
                if kind == "floor":
                    _fsync_write(path, data)
                else:
                    with open(path, "wb") as f:
                        f.write(data)
            elif kind.startswith("dcp"):
                dcp.save(state, checkpoint_id=folder)
                if kind == "dcp+record":
                    record(folder, round_)
            else:
                torch.save(state, os.path.join(folder, f"rank-{rank}.pt"))
                if kind == "torch.save+record":
                    def write(synced: bool, folder: str = folder, step: int = round_) -> dict[str, Any]:
                        with StatusStore(status) as store:
                            return CheckpointList(store, "bench", keep=None, root=os.path.dirname(folder)).add(
                                step, os.path.basename(folder), synced=synced)

                    saving.record(folder, status, write, what=folder)
            _sync(dist)
            times[kind].append(time.perf_counter() - start)
            _sync(dist)
            if rank == 0:  # the next round's bytes must not wait behind these in the page cache
                shutil.rmtree(folder)
            os.sync() if rank == 0 else None
            _sync(dist)
    return {"ranks": world, "size_mb": args.size_mb, "rounds": args.rounds,
            "median_s": {k: round(statistics.median(v), 4) for k, v in times.items()}}


def worker_collective(args: argparse.Namespace) -> dict[str, Any]:
    from trainstatus import CheckpointList, StatusStore
    from trainstatus.integrations._ranks import resuming, saving

    rank, world, dist = _init()
    root = os.path.join(args.dir, f"collective-{world}")
    folder = os.path.join(root, "step-1")
    status = os.path.join(root, "training_status.json")
    os.makedirs(folder, exist_ok=True)
    _fsync_write(os.path.join(folder, f"rank-{rank}.bin"), os.urandom(4096))
    _sync(dist)

    def write(synced: bool) -> dict[str, Any]:
        with StatusStore(status) as store:
            return CheckpointList(store, "bench", keep=None, root=root).add(1, "step-1", synced=synced)

    def choose() -> dict[str, Any] | None:
        with StatusStore(status) as store:
            return CheckpointList(store, "bench", keep=None, root=root).latest()

    records, decisions = [], []
    for _ in range(args.rounds * 6):
        _sync(dist)
        start = time.perf_counter()
        saving.record(folder, status, write, what=folder)
        records.append(time.perf_counter() - start)
        _sync(dist)
        start = time.perf_counter()
        resuming.decide(choose, resuming.entry_files, root, what=root)
        decisions.append(time.perf_counter() - start)
    return {"ranks": world, "n": len(records), "record_median_ms": round(statistics.median(records) * 1000, 2),
            "decide_median_ms": round(statistics.median(decisions) * 1000, 2)}


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def worker_resume(args: argparse.Namespace) -> dict[str, Any]:
    import zipfile

    import torch
    import torch.distributed.checkpoint as dcp

    from trainstatus import CheckpointList, StatusStore
    from trainstatus.integrations import dcp as ts_dcp
    from trainstatus.integrations import lightning as ts_lightning

    size = int(args.big_gb * 2**30)
    tensors = {f"t{i}": torch.randn(size // 4 // 4) for i in range(4)}
    dcp_root = os.path.join(args.dir, "resume-dcp")
    dcp.save(tensors, checkpoint_id=os.path.join(dcp_root, "step-1"))
    ts_dcp.record(os.path.join(dcp_root, "step-1"), 1)
    ckpt_root = os.path.join(args.dir, "resume-lightning")
    os.makedirs(ckpt_root, exist_ok=True)
    ckpt = os.path.join(ckpt_root, "last.ckpt")
    torch.save({"state_dict": tensors, "global_step": 1}, ckpt)
    with StatusStore(os.path.join(ckpt_root, "training_status.json")) as store:
        CheckpointList(store, "lightning", keep=None, root=ckpt_root).add(1, "last.ckpt")
    del tensors

    def measure(call: Any) -> dict[str, Any]:
        walls, reads = [], []
        for _ in range(args.rounds):
            before, start = _rchar(), time.perf_counter()
            call()
            walls.append(time.perf_counter() - start)
            reads.append(_rchar() - before)
        return {"median_ms": round(statistics.median(walls) * 1000, 2), "bytes_read": max(reads)}

    def full_read() -> None:
        with zipfile.ZipFile(ckpt) as archive:
            assert archive.testzip() is None

    stored = sum(os.path.getsize(os.path.join(dcp_root, "step-1", n)) for n in os.listdir(os.path.join(dcp_root, "step-1")))
    return {
        "dcp_bytes": stored, "ckpt_bytes": os.path.getsize(ckpt),
        "dcp.last_complete_checkpoint": measure(lambda: ts_dcp.last_complete_checkpoint(dcp_root)),
        "lightning.last_complete_checkpoint": measure(lambda: ts_lightning.last_complete_checkpoint(ckpt_root)),
        "full read (zipfile.testzip)": measure(full_read),
    }


WORKERS = {"save": worker_save, "collective": worker_collective, "resume": worker_resume}


# -- the driver ---------------------------------------------------------------------------------


def launch(kind: str, ranks: int, args: argparse.Namespace, directory: str) -> dict[str, Any]:
    out = os.path.join(directory, f"{kind}-{ranks}.json")
    worker = [os.path.abspath(__file__), "--worker", kind, "--out", out, "--dir", directory,
              "--size-mb", str(args.size_mb), "--big-gb", str(args.big_gb), "--rounds", str(args.rounds)]
    if ranks == 1:
        command = [sys.executable, *worker]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *worker]
    subprocess.run(command, check=True, timeout=3600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    with open(out) as f:
        result: dict[str, Any] = json.load(f)
    return result


def render(report: dict[str, Any]) -> str:
    lines = [describe_machine(report["machine"]), ""]
    rows = []
    for run in report["save"]:
        m = run["median_s"]
        fsync = m["floor"] - m["write"]
        for way, plain in (("dcp", "dcp"), ("torch.save", "torch.save")):
            added = m[f"{way}+record"] - m[plain]
            rows.append([str(run["ranks"]), way, f"{m[plain] * 1000:.1f}", f"{m[way + '+record'] * 1000:.1f}",
                         f"{added * 1000:.1f}", f"{fsync * 1000:.1f}", f"{added / fsync:.2f}" if fsync > 0 else "-"])
    lines.append(f"save of {report['save'][0]['size_mb']} MB (median ms of {report['save'][0]['rounds']} rounds)")
    lines.append(table(["ranks", "way", "without", "with record", "added", "fsync floor", "added/floor"], rows))
    lines.append("")
    lines.append(table(["ranks", "record ms", "decision ms"],
                       [[str(r["ranks"]), str(r["record_median_ms"]), str(r["decide_median_ms"])]
                        for r in report["collective"]]))
    resume = report["resume"]
    lines.append("")
    lines.append(f"resume check on {resume['dcp_bytes'] / 2**30:.2f} GB (DCP) and {resume['ckpt_bytes'] / 2**30:.2f} GB (.ckpt)")
    lines.append(table(["call", "median ms", "bytes read"],
                       [[k, str(v["median_ms"]), str(v["bytes_read"])] for k, v in resume.items() if isinstance(v, dict)]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=sorted(WORKERS))
    parser.add_argument("--out")
    parser.add_argument("--dir", help="where the checkpoints are written (default: a new folder in the system's temp)")
    parser.add_argument("--size-mb", type=float, default=100.0)
    parser.add_argument("--big-gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", default="1,2", help="rank counts of the save part")
    parser.add_argument("--collective-ranks", default="1,2,4")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds: the smoke test")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "distributed.json"))
    args = parser.parse_args()
    if args.worker:
        result = WORKERS[args.worker](args)
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group()  # torch aborts at exit now and then without it (SIGABRT)
        if int(os.environ.get("RANK", "0")) == 0:
            with open(args.out, "w") as f:
                json.dump(result, f)
        return
    if args.quick:
        args.size_mb, args.big_gb, args.rounds, args.collective_ranks = 2.0, 0.01, 2, "1,2"
    directory = tempfile.mkdtemp(prefix="trainstatus-bench-", dir=args.dir)
    try:
        report = {
            "when": now(), "machine": machine(directory),
            "save": [launch("save", int(n), args, directory) for n in args.ranks.split(",")],
            "collective": [launch("collective", int(n), args, directory) for n in args.collective_ranks.split(",")],
            "resume": launch("resume", 1, args, directory),
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    write_json(args.json, report)
    print(render(report))


if __name__ == "__main__":
    main()
