"""The fake process group of tests/_fake_group.py keeps torch's contract where a protocol bug would
otherwise pass unseen: collectives called in another order on two ranks fail loudly, and so does a
collective on a group that was not made."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fake_group import World

from trainstatus.integrations._ranks import collectives, hosts


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    return World(tmp_path, monkeypatch)


def test_collectives_in_another_order_on_two_ranks_fail_loudly(world: World) -> None:
    def rank_0(rank: int) -> None:
        me = hosts.ranks()
        assert me is not None
        collectives.broadcast("chosen", collectives.group(5), me, "choosing")

    def rank_1(rank: int) -> None:
        me = hosts.ranks()
        assert me is not None
        collectives.gather("view", collectives.group(5), me, "checking")

    outcomes = world.run(rank_0, rank_1)
    assert isinstance(outcomes[1].error, AssertionError)
    assert str(outcomes[1].error) == ("rank 1 ran gather_object sizes #1 on group 0 while rank 0 ran "
                                      "broadcast_object_list #1 on group 0")


def test_each_rank_has_its_own_place_and_the_test_thread_none(world: World) -> None:
    seen = world.run(lambda r: hosts.ranks(), lambda r: hosts.ranks())
    assert [outcome.result() for outcome in seen] == [hosts.Ranks(0, 2, "node-a"), hosts.Ranks(1, 2, "node-b")]
    assert hosts.ranks() is None  # the test's own thread: no process group (no torch here)
