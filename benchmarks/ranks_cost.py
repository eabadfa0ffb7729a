"""What a checkpoint's record and a resume decision cost at many ranks (issue 41): metadata
operations on the checkpoint's files, bytes gathered, collectives, wall time.

    .venv-torch/bin/python benchmarks/ranks_cost.py                      # the figures of docs/distributed.md
    .venv-torch/bin/python benchmarks/ranks_cost.py --before /tmp/old    # and an older src/ side by side
    .venv/bin/python benchmarks/ranks_cost.py --simulated-only           # no torch: the simulated ranks alone
    .venv-torch/bin/python benchmarks/ranks_cost.py --quick              # the smoke test's small run

Two parts:

- ``real``: ``torchrun --nproc_per_node=N`` (2, 4, 8) on this machine, gloo, and 4 and 8 ranks on
  2 simulated hosts (a torchrun a host, each in a UTS namespace of its own: ``unshare --uts``, root). Each rank
  ``dcp.save``s a small state dict of its own (a shard a rank and ``.metadata``: N + 1 files) into
  ``step-K``, then every rank calls ``trainstatus.integrations.dcp.record``; after the rounds,
  ``last_complete_checkpoint`` (the decision). Each rank counts what it did (tests/_opcount.py:
  fsyncs, opens, stats and listings of the checkpoint's files; the torch collectives it entered and
  the bytes of the objects it gathered or broadcast) and the wall time of each call. With
  ``--before SRC`` (a ``src`` folder from ``git archive``), the same runs with that trainstatus
  first on ``PYTHONPATH``, run after this one at each rank count.
- ``simulated``: tests/_fake_group.py's process group of threads, 256 ranks on 32 hosts and 1,024 on
  128 (8 a host), one shared folder, the same N + 1 files written from each rank's host; the record
  is ``dcp.record``, the decision ``_ranks.resuming.decide`` over ``CheckpointList.latest`` (the
  DCP metadata check needs torch's ``.metadata``). Counts and bytes only: the threads' wall time
  says nothing of a cluster's.

Writes ``results/ranks_cost.json`` (or ``--json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path.insert(0, HERE)
from _common import describe_machine, machine, now, table, write_json  # noqa: E402

KINDS = ("fsync", "fsync_dir", "open", "stat", "listing")
COLLECTIVES = ("monitored_barrier", "gather_object", "all_gather_object", "broadcast_object_list")


# -- the worker (one rank under torchrun) -------------------------------------------------------


def _watch_collectives(dist: Any) -> dict[str, Any]:
    """Count the collectives this rank enters, and the bytes of the objects it sends to be gathered
    (``gather_object``, ``all_gather_object``) or broadcast (at the source)."""
    seen: dict[str, Any] = {"calls": dict.fromkeys(COLLECTIVES, 0), "gathered_bytes": 0, "broadcast_bytes": 0}
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def wrapper(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            seen["calls"][_name] += 1
            if _name == "gather_object":
                seen["gathered_bytes"] += len(pickle.dumps(args[0] if args else kwargs["obj"]))
            elif _name == "all_gather_object":
                seen["gathered_bytes"] += len(pickle.dumps(args[1] if len(args) > 1 else kwargs["obj"]))
            elif _name == "broadcast_object_list" and dist.get_rank() == kwargs.get("src", 0):
                seen["broadcast_bytes"] += len(pickle.dumps(args[0] if args else kwargs["object_list"]))
            return _real(*args, **kwargs)

        setattr(dist, name, wrapper)
    return seen


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    sys.path.insert(0, TESTS)
    from _opcount import Count

    from trainstatus.integrations import dcp as ours

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    root = Path(args.dir)
    seen = _watch_collectives(dist)
    records: list[dict[str, Any]] = []
    state = {f"layer{rank}": torch.full((256,), float(rank))}
    for step in range(1, args.rounds + 1):
        folder = root / f"step-{step}"
        dcp.save(state, checkpoint_id=str(folder))
        before = json.loads(json.dumps(seen))
        with Count(folder) as count:
            start = time.perf_counter()
            ours.record(folder, step)
            seconds = time.perf_counter() - start
        records.append({"seconds": seconds, "ops": count.summary(), "folder_listings": count.of("listing")[str(folder)],
                        **_since(before, seen)})
    folder = root / f"step-{args.rounds}"
    before = json.loads(json.dumps(seen))
    with Count(folder) as count:
        start = time.perf_counter()
        chosen = ours.last_complete_checkpoint(root)
        seconds = time.perf_counter() - start
    assert chosen == str(folder), chosen
    decision = {"seconds": seconds, "ops": count.summary(), **_since(before, seen)}
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "records": records, "decision": decision}, f)
    dist.destroy_process_group()


def _since(before: dict[str, Any], now_seen: dict[str, Any]) -> dict[str, Any]:
    return {"collectives": sum(now_seen["calls"][n] - before["calls"][n] for n in COLLECTIVES),
            "gathered_bytes": now_seen["gathered_bytes"] - before["gathered_bytes"],
            "broadcast_bytes": now_seen["broadcast_bytes"] - before["broadcast_bytes"]}


# -- the driver ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_real(ranks: int, hosts: int, args: argparse.Namespace, directory: str, src: str | None) -> dict[str, Any]:
    """One run of ``ranks`` ranks on ``hosts`` hosts: one torchrun, or one a host, each in a UTS
    namespace of its own with the host name ``node<i>`` (``unshare --uts``: root), all on the one
    folder; per call, the counts summed over the ranks (the last round's: the group and its hosts
    made), rank 0's collectives, and the wall time's median over rounds."""
    work = tempfile.mkdtemp(dir=directory)
    out = tempfile.mkdtemp(dir=directory)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if src is not None:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    worker = [os.path.abspath(__file__), "--worker", "--dir", work, "--out", out, "--rounds", str(args.rounds)]
    if hosts == 1:
        commands = [[sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                     *worker]]
    else:
        port = _free_port()
        commands = [["unshare", "--uts", "sh", "-c", f"hostname node{node} && exec " + shlex.join(
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes={hosts}", f"--node_rank={node}",
             f"--nproc_per_node={ranks // hosts}", "--master_addr=127.0.0.1", f"--master_port={port}", *worker])]
                    for node in range(hosts)]
    launched = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL) for command in commands]
    try:
        codes = [process.wait(timeout=1800) for process in launched]
    finally:
        for process in launched:
            if process.poll() is None:
                process.kill()
                process.wait()
    if any(codes):
        raise RuntimeError(f"a run of {ranks} ranks on {hosts} hosts failed: exit statuses {codes}")
    per_rank = [json.load(open(os.path.join(out, f"rank-{rank}.json"))) for rank in range(ranks)]
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)

    def summed(calls: list[dict[str, Any]]) -> dict[str, Any]:
        return {**{kind: sum(c["ops"][kind] for c in calls) for kind in KINDS},
                "collectives_rank_0": calls[0]["collectives"],
                "gathered_bytes": sum(c["gathered_bytes"] for c in calls),
                "broadcast_bytes": calls[0]["broadcast_bytes"]}

    record = summed([r["records"][-1] for r in per_rank])  # the last round: the group and its hosts made
    record["folder_listings"] = sum(r["records"][-1]["folder_listings"] for r in per_rank)
    record["median_ms"] = round(statistics.median(max(r["records"][i]["seconds"] for r in per_rank)
                                                  for i in range(1, args.rounds)) * 1000, 2)
    decision = summed([r["decision"] for r in per_rank])
    decision["ms"] = round(max(r["decision"]["seconds"] for r in per_rank) * 1000, 2)
    return {"ranks": ranks, "hosts": hosts, "files": ranks + 1, "version": "before" if src else "this",
            "record": record, "decision": decision}


class _Patches:
    """pytest's ``MonkeyPatch.setattr`` and its undo, which the fake group needs (this may run
    where pytest is not installed: .venv-torch)."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []

    def setattr(self, owner: Any, name: str, value: Any) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def __enter__(self) -> _Patches:
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, value in reversed(self.saved):
            setattr(owner, name, value)


def run_simulated(ranks: int, per_host: int, directory: str) -> dict[str, Any]:
    sys.path.insert(0, TESTS)
    from _fake_group import World
    from _opcount import Count

    from trainstatus import CheckpointList, StatusStore
    from trainstatus.integrations import dcp
    from trainstatus.integrations._ranks import resuming

    hosts = [f"node-{rank // per_host}" for rank in range(ranks)]
    with _Patches() as monkeypatch:
        world = World(Path(tempfile.mkdtemp(dir=directory)), monkeypatch, hosts=hosts)
        root = world.root(0)
        folder = root / "step-3"
        for rank in range(ranks):
            world.write(rank, folder / f"__{rank}_0.distcp", b"x" * 1024)
        world.write(0, folder / ".metadata", b"plan" * 64)

        def collectives_of_rank_0() -> int:
            return sum(n for (rank, op), n in world.calls.items() if rank == 0 and op in COLLECTIVES)

        def measure(work: Any) -> dict[str, Any]:
            sent, calls = dict(world.sent), collectives_of_rank_0()
            with Count(folder, who=world.rank) as count:
                start = time.perf_counter()
                outcomes = world.run(*[work] * ranks, within=600)
                seconds = time.perf_counter() - start
            for outcome in outcomes:
                outcome.result()
            return {**count.summary(), "folder_listings": count.of("listing")[str(folder)],
                    "collectives_rank_0": collectives_of_rank_0() - calls,
                    "gathered_bytes": sum(world.sent[op] - sent.get(op, 0) for op in ("gather_object", "all_gather_object")),
                    "broadcast_bytes": world.sent["broadcast_object_list"] - sent.get("broadcast_object_list", 0),
                    "threads_s": round(seconds, 2)}

        def choose() -> dict[str, Any] | None:
            with StatusStore(root / dcp.STATUS_FILE) as store:
                return CheckpointList(store, dcp.CATEGORY, keep=None, root=root).latest()

        record = measure(lambda rank: dcp.record(folder, 3, timeout=600))
        decision = measure(lambda rank: resuming.decide(choose, resuming.entry_files, str(root), what="the newest",
                                                        timeout=600))
    return {"ranks": ranks, "hosts": ranks // per_host, "files": ranks + 1, "record": record, "decision": decision}


def render(report: dict[str, Any]) -> str:
    lines = [describe_machine(report["machine"]), ""]
    heads = ["ranks", "hosts", "files", "version", "call", "fsyncs", "dir fsyncs", "opens", "stats", "listings",
             "of the folder", "collectives", "gathered B", "broadcast B", "ms"]
    rows = []
    for run in report["real"] + report["simulated"]:
        for call in ("record", "decision"):
            c = run[call]
            rows.append([str(run["ranks"]), str(run.get("hosts", 1)), str(run["files"]), run.get("version", "sim"),
                         call, str(c["fsync"]), str(c["fsync_dir"]), str(c["open"]), str(c["stat"]), str(c["listing"]),
                         str(c.get("folder_listings", "-")), str(c["collectives_rank_0"]), str(c["gathered_bytes"]),
                         str(c["broadcast_bytes"]), str(c.get("median_ms", c.get("ms", "-")))])
    lines.append(table(heads, rows))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--dir", help="where the checkpoints are written (default: a new folder in the system's temp)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ranks", default="2,4,8,4/2,8/2",
                        help="rank counts of the real part (ranks/hosts: on that many hosts, UTS namespaces)")
    parser.add_argument("--simulated", default="256/8,1024/8", help="ranks/ranks-a-host of the simulated part")
    parser.add_argument("--before", help="a src/ folder of another trainstatus, run side by side at real ranks")
    parser.add_argument("--simulated-only", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2 real ranks, 2 rounds, 16 simulated: the smoke test")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "ranks_cost.json"))
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.ranks, args.rounds, args.simulated = "2", 2, "16/4"
    directory = tempfile.mkdtemp(prefix="trainstatus-bench-", dir=args.dir)
    try:
        real: list[dict[str, Any]] = []
        if not args.simulated_only:
            for spec in args.ranks.split(","):
                ranks, _, hosts = spec.partition("/")
                for src in ([None, os.path.abspath(args.before)] if args.before else [None]):
                    real.append(run_real(int(ranks), int(hosts or 1), args, directory, src))
        simulated = [run_simulated(int(r), int(h), directory)
                     for r, h in (spec.split("/") for spec in args.simulated.split(",") if spec)]
        report = {"when": now(), "machine": machine(directory), "rounds": args.rounds, "real": real,
                  "simulated": simulated}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    write_json(args.json, report)
    print(render(report))


if __name__ == "__main__":
    main()
