"""What a record and a resume decision cost in metadata operations, on the fake process group
(tests/_fake_group.py: ranks as threads, several on one host where the test says so), counted by
tests/_opcount.py: issue 41's bounds, which hold at any number of ranks because one rank per host
walks and checks the folder, not every rank.

- A record of a folder of ``files`` files on one host: at most ``files + 1`` fsyncs of its files in
  all, at most 2 listings of the folder (the host's walk, and the entry's own at rank 0's write).
- A decision on one host: at most ``2 * files + 2`` stats and opens of its files in all (rank 0's
  choice, and the host's check of the chosen files).
- Two hosts on one shared folder: each file fsynced once from each host, by one rank of it.
- What rank 0 gathers grows with the hosts, not with the ranks times the files.

The real-rank figures (2 to 8 ranks, ``torchrun``) are benchmarks/ranks_cost.py's.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from _fake_group import World
from _opcount import Count

from trainstatus import CheckpointList, StatusStore
from trainstatus.integrations import dcp
from trainstatus.integrations._ranks import resuming

SECONDS = 10.0
STEP = 3


def dcp_folder(world: World) -> tuple[Path, int]:
    """A DCP-shaped checkpoint in the shared run folder: a shard per rank, each written from its
    rank's host, and ``.metadata`` from rank 0's; the folder and its number of files."""
    folder = world.root(0) / f"step-{STEP}"
    for rank in range(world.size):
        world.write(rank, folder / f"__{rank}_0.distcp", bytes([rank % 256]) * (64 + rank))
    world.write(0, folder / ".metadata", b"plan")
    return folder, world.size + 1


def record_all(world: World) -> list[Any]:
    folder = world.root(0) / f"step-{STEP}"
    outcomes = world.run(*[lambda rank: dcp.record(folder, STEP, timeout=SECONDS)] * world.size, within=60)
    return [outcome.result() for outcome in outcomes]


def decide_all(world: World) -> list[Any]:
    root = world.root(0)

    def choose() -> dict[str, Any] | None:
        with StatusStore(root / dcp.STATUS_FILE) as store:
            return CheckpointList(store, dcp.CATEGORY, keep=None, root=root).latest()

    outcomes = world.run(*[lambda rank: resuming.decide(choose, resuming.entry_files, str(root), what="the newest",
                                                        timeout=SECONDS)] * world.size, within=60)
    return [outcome.result() for outcome in outcomes]


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_record_on_one_host_syncs_each_file_once_and_lists_the_folder_at_most_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ranks: int) -> None:
    world = World(tmp_path, monkeypatch, hosts=["node-a"] * ranks)
    folder, files = dcp_folder(world)
    with Count(folder, who=world.rank) as count:
        entries = record_all(world)
    assert all(entry == entries[0] for entry in entries) and len(entries[0]["files"]) == files
    assert world.dirty == {}  # every file durable before the record
    assert count.total("fsync") <= files + 1, count.paths
    assert set(count.of("fsync").values()) == {1}  # each file once
    assert count.of("listing")[str(folder)] <= 2, count.paths
    # One rank walks for the host; the others touch nothing of the folder.
    assert {rank for rank, _, _ in count.paths} == {0}


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_decision_on_one_host_stats_and_opens_each_file_at_most_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ranks: int) -> None:
    world = World(tmp_path, monkeypatch, hosts=["node-a"] * ranks)
    folder, files = dcp_folder(world)
    record_all(world)
    with Count(folder, who=world.rank) as count:
        chosen = decide_all(world)
    assert all(entry == chosen[0] for entry in chosen) and chosen[0]["steps"] == STEP
    assert count.total("stat") + count.total("open") <= 2 * files + 2, count.paths
    assert {rank for rank, _, _ in count.paths} == {0}


def test_two_hosts_on_one_shared_folder_sync_each_file_once_from_each_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(tmp_path, monkeypatch, hosts=["node-a", "node-a", "node-b", "node-b"])
    folder, files = dcp_folder(world)
    with Count(folder, who=world.rank) as count:
        record_all(world)
    assert world.dirty == {}  # node-b's shards synced from node-b
    per_host = collections.Counter((world.hosts[rank], path) for rank, kind, path in count.paths if kind == "fsync")
    assert len(per_host) == 2 * files and set(per_host.values()) == {1}, per_host
    assert {rank for rank, _, _ in count.paths} == {0, 2}  # the lowest rank of each host
    with Count(folder, who=world.rank) as count:
        decide_all(world)
    assert {rank for rank, _, _ in count.paths} == {0, 2}


def test_what_rank_0_gathers_grows_with_the_hosts_not_the_files(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Eight ranks on two hosts writing 9 files, then 8 ranks on two hosts writing 33 files (four
    # shards a rank): the same bytes reach rank 0, one digest per host.
    gathered = []
    for shards in (1, 4):
        world = World(tmp_path / f"shards-{shards}", monkeypatch, hosts=["node-a"] * 4 + ["node-b"] * 4)
        folder = world.root(0) / f"step-{STEP}"
        for rank in range(world.size):
            for shard in range(shards):
                world.write(rank, folder / f"__{rank}_{shard}.distcp", b"x" * 64)
        world.write(0, folder / ".metadata", b"plan")
        record_all(world)
        gathered.append(world.sent["gather_object"])
    assert gathered[0] == gathered[1], gathered


def test_a_host_that_sees_otherwise_answers_with_the_differences_not_its_whole_view(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Node-local folders holding the same files, but node-b's also holds one of another run: node-b
    # is asked, and what it sends rank 0 does not grow with the files both hosts share.
    gathered = []
    for shards in (1, 8):
        world = World(tmp_path / f"shards-{shards}", monkeypatch, hosts=["node-a"] * 2 + ["node-b"] * 2, shared=False)
        for rank in range(world.size):
            for shard in range(shards):
                for host_rank in (0, 2):  # every file on both hosts' disks
                    world.write(rank, world.root(host_rank) / f"step-{STEP}" / f"__{rank}_{shard}.distcp", b"x" * 64)
        for host_rank in (0, 2):
            world.write(0, world.root(host_rank) / f"step-{STEP}" / ".metadata", b"plan")
        world.write(2, world.root(2) / f"step-{STEP}" / "stray.bin", b"s")
        outcomes = world.run(*[lambda rank: dcp.record(world.root(rank) / f"step-{STEP}", STEP, timeout=SECONDS)] * 4)
        assert all("ranks 2, 3 on node-b wrote stray.bin, which rank 0 on node-a does not see" in str(outcome.error)
                   for outcome in outcomes), outcomes
        gathered.append(world.sent["gather_object"])
    assert gathered[0] == gathered[1], gathered


def test_a_host_that_sees_otherwise_is_named_with_its_ranks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # node-b's disk is its own (node-local folders) and lacks rank 0's .metadata: its digest
    # differs, it answers with the differences, and every rank of node-b is named.
    world = World(tmp_path, monkeypatch, hosts=["node-a", "node-a", "node-b", "node-b"], shared=False)
    for rank in range(world.size):
        world.write(rank, world.root(rank) / f"step-{STEP}" / f"__{rank}_0.distcp", b"x" * 64)
    world.write(0, world.root(0) / f"step-{STEP}" / ".metadata", b"plan")
    outcomes = world.run(*[lambda rank: dcp.record(world.root(rank) / f"step-{STEP}", STEP, timeout=SECONDS)] * 4)
    errors = [outcome.error for outcome in outcomes]
    assert all(type(error).__name__ == "TrainingStatusCheckpointNotShared" for error in errors), errors
    message = str(errors[0])
    assert all(str(error) == message for error in errors)
    assert "ranks 2, 3 on node-b wrote __2_0.distcp, __3_0.distcp, which rank 0 on node-a does not see" in message
    assert "on node-b do not see" not in message  # what node-b lacks is said only when nothing else is wrong
    assert (errors[0].ranks, errors[0].hosts) == ([2, 3], ["node-b"])  # type: ignore[union-attr]


# -- a rank naming another folder than its host's leader ------------------------------------------


def test_a_rank_naming_another_folder_than_its_host_walks_its_own_and_is_named_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two ranks of one host, each given "its" folder (a relative path from two working folders, or
    # a run name computed apart on each rank): the host's one walk would say nothing of rank 1's.
    world = World(tmp_path, monkeypatch, hosts=["node-a", "node-a"])
    folders = [tmp_path / "run-0" / "step-3", tmp_path / "run-1" / "step-3"]
    world.write(0, folders[0] / "__0_0.distcp", b"x" * 64)
    world.write(0, folders[0] / ".metadata", b"plan")
    world.write(1, folders[1] / "__1_0.distcp", b"y" * 64)
    outcomes = world.run(*[lambda rank: dcp.record(folders[rank], STEP, timeout=SECONDS)] * 2)
    errors = [outcome.error for outcome in outcomes]
    assert all(type(error).__name__ == "TrainingStatusCheckpointNotShared" for error in errors), outcomes
    assert f"rank 1 on node-a wrote __1_0.distcp, which rank 0 on node-a does not see" in str(errors[0])
    assert str(errors[0]) == str(errors[1]) and errors[0].ranks == [1]  # type: ignore[union-attr]
    assert world.dirty == {}  # rank 1 synced its own folder
    assert not (tmp_path / "run-0" / dcp.STATUS_FILE).exists()


def test_a_rank_naming_another_folder_at_a_resume_checks_its_own_and_is_named_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(tmp_path, monkeypatch, hosts=["node-a", "node-a"])
    folder, _ = dcp_folder(world)
    record_all(world)
    elsewhere = tmp_path / "elsewhere"  # rank 1's root: no checkpoint there
    elsewhere.mkdir()
    root = world.root(0)

    def choose() -> dict[str, Any] | None:
        with StatusStore(root / dcp.STATUS_FILE) as store:
            return CheckpointList(store, dcp.CATEGORY, keep=None, root=root).latest()

    roots = [root, elsewhere]
    outcomes = world.run(*[lambda rank: resuming.decide(choose, resuming.entry_files, str(roots[rank]),
                                                        what="the newest", timeout=SECONDS)] * 2)
    errors = [outcome.error for outcome in outcomes]
    assert all(type(error).__name__ == "TrainingStatusCheckpointNotShared" for error in errors), outcomes
    assert str(errors[0]) == str(errors[1])
    assert str(errors[0]).startswith(f"Not every rank can resume from the newest: rank 1 on node-a: "
                                     f"{elsewhere / f'step-{STEP}'}"), str(errors[0])
    assert errors[0].ranks == [1]  # type: ignore[union-attr]
