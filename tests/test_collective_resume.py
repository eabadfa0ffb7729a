"""``_ranks.resuming.decide`` under a process group, rule by rule (tests/_fake_group.py: ranks as
threads on hosts of their own, in milliseconds without torch): rank 0 chooses, once; every rank
checks that it sees each recorded file with its recorded size, and all resume or none does; what
rank 0's choice raised is raised on every rank; a rank that stops is named."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _fake_group import World, stop

from trainstatus import (
    CheckpointList,
    StatusStore,
    TrainingStatusCheckpointNotShared,
    TrainingStatusCollectiveError,
    TrainingStatusCorruptError,
    TrainingStatusError,
)
from trainstatus.integrations._ranks import resuming

STATUS = "training_status.json"
NAME = "checkpoint-30"
WHAT = "the newest checkpoint of the run"
SECONDS = 5.0
MODEL = 300  # bytes of the recorded model file


@pytest.fixture
def apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    """Two hosts with a folder each, both holding a copy of one recorded checkpoint."""
    world = World(tmp_path, monkeypatch, shared=False)
    root = world.root(0)
    (root / NAME).mkdir()
    (root / NAME / "model.safetensors").write_bytes(b"m" * MODEL)
    (root / NAME / "rng_state_1.pth").write_bytes(b"r" * 40)
    with StatusStore(root / STATUS) as store:  # recorded by one process (no group in this thread)
        CheckpointList(store, "ckpt", keep=None, root=root).add(30, NAME)
    shutil.copytree(root, world.root(1), dirs_exist_ok=True)
    return world


def latest(world: World, calls: list[int | None] | None = None) -> Callable[[], dict[str, Any] | None]:
    def choose() -> dict[str, Any] | None:
        if calls is not None:
            calls.append(world.rank())
        root = world.root(0)
        with StatusStore(root / STATUS) as store:
            return CheckpointList(store, "ckpt", keep=None, root=root).latest()

    return choose


def resume(world: World, rank: int, choose: Callable[[], Any] | None = None) -> Any:
    return resuming.decide(choose or latest(world), resuming.entry_files, str(world.root(rank)), what=WHAT,
                              timeout=SECONDS)


def both(world: World, choose: Callable[[], Any] | None = None) -> list[Any]:
    return world.run(lambda r: resume(world, r, choose), lambda r: resume(world, r, choose))


def not_shared(which: str, listed: str) -> str:
    return (f"Not every rank can resume from {WHAT}: {listed}. Every rank must see the same checkpoint folder "
            f"({which} cannot), so none resumes. Put the checkpoints on storage every node mounts at the same path "
            "(a shared filesystem), or copy the folder to every node's path, and start again.")


def cut(path: Path, size: int) -> None:
    os.truncate(path, size)


def grow(path: Path, size: int) -> None:
    with open(path, "ab") as f:
        f.write(b"+" * (size - path.stat().st_size))


def foreign(path: Path, size: int) -> None:
    path.unlink()  # another run's file of the same name on this node
    path.write_bytes(b"f" * size)


@pytest.mark.parametrize("change, size", [(cut, MODEL - 1), (grow, MODEL + 1), (foreign, MODEL + 7),
                                          (foreign, MODEL - 7), (cut, MODEL)],
                         ids=["one byte short", "one byte long", "foreign, longer", "foreign, shorter", "whole"])
def test_every_rank_checks_each_recorded_size_and_none_resumes_if_one_cannot(
        apart: World, change: Callable[[Path, int], None], size: int) -> None:
    model = apart.root(1) / NAME / "model.safetensors"
    change(model, size)
    outcomes = both(apart)
    if size == MODEL:
        entry, same = (outcome.result() for outcome in outcomes)
        assert entry == same and entry["files"][f"{NAME}/model.safetensors"] == MODEL
        return
    first, second = (outcome.error for outcome in outcomes)
    assert type(first) is type(second) is TrainingStatusCheckpointNotShared
    assert str(first) == str(second) == not_shared("rank 1", f"rank 1 on node-b: {model} has {size} bytes, "
                                                             f"{MODEL} recorded")
    assert (first.ranks, first.hosts, second.ranks, second.hosts) == ([1], ["node-b"], [1], ["node-b"])


def test_a_recorded_file_a_rank_lacks_is_named(apart: World) -> None:
    gone = apart.root(1) / NAME / "rng_state_1.pth"
    gone.unlink()
    first, second = (outcome.error for outcome in both(apart))
    assert str(first) == str(second) == not_shared("rank 1", f"rank 1 on node-b: {gone} is not there")


def test_every_rank_that_cannot_is_named(apart: World) -> None:
    # Rank 0 chose an entry whose model both nodes have since rewritten, one byte longer.
    choose = latest(apart)

    def chosen() -> dict[str, Any]:
        entry = choose()
        assert entry is not None
        return {**entry, "files": {**entry["files"], f"{NAME}/model.safetensors": MODEL + 1}}

    first, second = (outcome.error for outcome in both(apart, chosen))
    assert isinstance(first, TrainingStatusCheckpointNotShared)
    listed = "; ".join(f"rank {rank} on {host}: {apart.root(rank) / NAME / 'model.safetensors'} has {MODEL} bytes, "
                       f"{MODEL + 1} recorded" for rank, host in ((0, "node-a"), (1, "node-b")))
    assert str(first) == str(second) == not_shared("ranks 0, 1", listed)
    assert (first.ranks, first.hosts) == ([0, 1], ["node-a", "node-b"])


def test_rank_0_alone_chooses_and_every_rank_gets_its_choice(apart: World) -> None:
    calls: list[int | None] = []
    entry, same = (outcome.result() for outcome in both(apart, latest(apart, calls)))
    assert calls == [0]
    assert entry == same and (entry["steps"], entry["file_path"]) == (30, NAME)


def test_nothing_to_resume_from_is_none_on_every_rank_without_a_check(apart: World) -> None:
    shutil.rmtree(apart.root(1) / NAME)  # no file checked: None names none
    assert [outcome.result() for outcome in both(apart, lambda: None)] == [None, None]


def test_an_error_of_ours_in_the_choice_is_raised_whole_on_every_rank(apart: World) -> None:
    error = TrainingStatusCorruptError("training_status.json is not JSON.", path="training_status.json")

    def failing() -> Any:
        raise error

    first, second = (outcome.error for outcome in both(apart, failing))
    assert first is error
    assert type(second) is TrainingStatusCorruptError and str(second) == str(error) and vars(second) == vars(error)


def test_another_error_in_the_choice_is_named_on_every_other_rank(apart: World) -> None:
    def failing() -> Any:
        raise KeyError("steps")

    first, second = (outcome.error for outcome in both(apart, failing))
    assert type(first) is KeyError
    assert type(second) is TrainingStatusError
    assert str(second) == (f"Rank 0 on node-a failed choosing {WHAT}: KeyError: 'steps'. Rank 0 raised it; its output "
                           "has the whole traceback.")


@pytest.mark.parametrize("stopped", [0, 1])
def test_a_rank_that_stops_before_the_decision_is_named(apart: World, stopped: int) -> None:
    # Rank 0 ends while choosing (before it answers); rank 1 ends before it reaches the decision.
    def choose() -> Any:
        stop()

    work = [lambda r: resume(apart, r, choose), lambda r: resume(apart, r)] if stopped == 0 else \
        [lambda r: resume(apart, r), lambda r: stop()]
    outcomes = apart.run(*work)
    assert outcomes[stopped].stopped
    error, me = outcomes[1 - stopped].error, 1 - stopped
    assert isinstance(error, TrainingStatusCollectiveError)
    assert str(error).startswith(
        f"Rank {me} of 2 on {apart.hosts[me]}, choosing {WHAT}: rank {stopped} (the last it reached: none yet) did not "
        f"answer within {SECONDS:g} s ("), str(error)
