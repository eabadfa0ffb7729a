"""trainstatus.integrations.dcp without torch (issue 38): a folder saved over in place, wrong paths,
a status file inside a checkpoint folder, checkpoint folders nothing recorded. What needs torch's
own ``dcp.save`` and ``.metadata`` runs in tests/test_integration_dcp.py (the integrations group);
here the folders are made by hand (a shard a rank and a ``.metadata``), the ranks are threads
(tests/_fake_group.py), and ``torch.distributed.checkpoint`` is a stand-in module where a test
needs ``save`` to be called."""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
from _fake_group import World
from _lease_holder import another_job

from trainstatus import (
    CheckpointList,
    StatusStore,
    TrainingStatusCheckpointWarning,
    TrainingStatusInUseError,
    TrainingStatusValueError,
)
from trainstatus.integrations import dcp

SECONDS = 5.0


def made(folder: Path, fill: bytes = b"a", ranks: int = 2) -> Path:
    """A DCP-shaped folder: a shard a rank, then .metadata."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        (folder / f"__{rank}_0.distcp").write_bytes(fill * 64)
    (folder / ".metadata").write_bytes(b"plan")
    return folder


def listed(root: Path) -> list[tuple[str, int]]:
    with StatusStore(root / dcp.STATUS_FILE) as store:
        return [(e["file_path"], e["steps"]) for e in store.get(dcp.CATEGORY, "checkpoints") or []]


# -- a folder saved over in place -----------------------------------------------------------------


def test_record_of_a_folder_saved_over_in_place_warns_and_lists_it_once_under_its_new_step(tmp_path: Path) -> None:
    # dcp.save into the listed ckpt/latest, then record: the save is complete (it returned on every
    # rank), so it is recorded; the window behind it (listed while being written over) is named.
    latest = made(tmp_path / "ckpt" / "latest")
    dcp.record(latest, 1)
    made(latest, b"b")
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        entry = dcp.record(latest, 2)
    [message] = [str(w.message) for w in caught]
    assert message.startswith(f"{latest} was listed as step 1 while this save (step 2) went into it in place: a kill "
                              "during such a save leaves the folder listed"), message
    assert "trainstatus.integrations.dcp.save(state_dict, folder, step)" in message
    assert entry["steps"] == 2 and listed(tmp_path / "ckpt") == [("latest", 2)]  # once: a rotation of the old
    # entry would have removed the folder the new one lists


def test_a_folder_of_the_same_name_elsewhere_is_not_the_one_saved_over(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # One status file for two folders named latest (periodic/ and best/): saving into one neither
    # warns about nor unlists the other.
    status = tmp_path / "run" / dcp.STATUS_FILE
    periodic, best = made(tmp_path / "run" / "periodic" / "latest"), made(tmp_path / "run" / "best" / "latest")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dcp.record(periodic, 10, status_path=status)
        dcp.record(best, 20, status_path=status)
    saves: list[str] = []
    fake_torch_dcp(monkeypatch, lambda state_dict, checkpoint_id, **options: saves.append(checkpoint_id))
    dcp.save({}, best, 30, status_path=status)
    with StatusStore(status) as store:
        steps = {CheckpointList(store, dcp.CATEGORY, keep=None).resolve(e["file_path"]): e["steps"]
                 for e in store.get(dcp.CATEGORY, "checkpoints")}
    assert saves == [str(best)] and steps == {str(periodic): 10, str(best): 30}


def test_every_rank_returns_the_entry_of_a_folder_saved_over_in_place(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(tmp_path, monkeypatch)
    latest = made(world.root(0) / "latest")
    world.run(*[lambda rank: dcp.record(latest, 1, timeout=SECONDS)] * 2)
    made(latest, b"b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcomes = world.run(*[lambda rank: dcp.record(latest, 2, timeout=SECONDS)] * 2)
    assert [outcome.result()["steps"] for outcome in outcomes] == [2, 2]
    assert len([w for w in caught if issubclass(w.category, TrainingStatusCheckpointWarning)]) == 1  # rank 0's
    assert listed(world.root(0)) == [("latest", 2)]


def fake_torch_dcp(monkeypatch: pytest.MonkeyPatch, save: Any) -> None:
    """``import torch.distributed.checkpoint`` gives a module whose ``save`` is ``save`` (the ranks
    are threads whose process group is the fake one: torch itself is never asked)."""
    module = types.ModuleType("torch.distributed.checkpoint.state_dict_saver")
    module.save = save  # type: ignore[attr-defined]
    for name in ("torch", "torch.distributed", "torch.distributed.checkpoint"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    # The test's own thread has no process group: as torch.distributed says of a build without one.
    monkeypatch.setattr(sys.modules["torch.distributed"], "is_available", lambda: False, raising=False)
    monkeypatch.setitem(sys.modules, "torch.distributed.checkpoint.state_dict_saver", module)
    monkeypatch.setattr(sys.modules["torch.distributed.checkpoint"], "state_dict_saver", module, raising=False)


def test_save_unlists_the_folder_before_any_rank_writes_into_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(tmp_path, monkeypatch)
    root = world.root(0)
    latest = made(root / "latest")
    world.run(*[lambda rank: dcp.record(latest, 1, timeout=SECONDS)] * 2)
    seen_listed: list[list[tuple[str, int]]] = []

    def save(state_dict: Any, checkpoint_id: str, **options: Any) -> None:
        rank = world.rank()
        assert rank is not None
        seen_listed.append(listed(root))  # what a kill at this moment would leave for the resume
        (Path(checkpoint_id) / f"__{rank}_0.distcp").write_bytes(b"c" * 64)
        if rank == 0:
            (Path(checkpoint_id) / ".metadata").write_bytes(b"plan")

    fake_torch_dcp(monkeypatch, save)
    entries = world.run(*[lambda rank: dcp.save({"w": rank}, latest, 2, timeout=SECONDS)] * 2)
    assert seen_listed == [[], []]  # neither rank began its save while the folder was listed
    assert [outcome.result()["steps"] for outcome in entries] == [2, 2]
    assert listed(root) == [("latest", 2)]


def test_a_second_job_on_the_folder_is_refused_on_every_rank_before_it_saves(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Another job (its own process) trains into the same folder: this job's first save stops on
    # both ranks, naming it, before any rank writes a shard or the status file changes.
    world = World(tmp_path, monkeypatch)
    root = world.root(0)
    saves: list[str] = []
    fake_torch_dcp(monkeypatch, lambda state_dict, checkpoint_id, **options: saves.append(checkpoint_id))
    with another_job(str(root / dcp.STATUS_FILE), run="first-job") as job:
        outcomes = world.run(*[lambda rank: dcp.save({"w": rank}, root / "step-1", 1, timeout=SECONDS)] * 2)
        for outcome in outcomes:
            with pytest.raises(TrainingStatusInUseError, match=f"another job is training on .*: process {job.pid} on "):
                outcome.result()
        with pytest.raises(TrainingStatusInUseError, match="run 'first-job'"):  # record alone, too
            dcp.record(made(root / "step-0"), 0)
    assert saves == [] and not (root / dcp.STATUS_FILE).exists()


# -- wrong paths ----------------------------------------------------------------------------------


def test_a_checkpoint_folder_given_for_the_folder_above_it_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    step = made(tmp_path / "ck" / "step-4")
    dcp.record(step, 4)
    before = (tmp_path / "ck" / dcp.STATUS_FILE).read_bytes()
    with pytest.raises(TrainingStatusValueError) as info:
        dcp.last_complete_checkpoint(tmp_path / "ck" / "step-4")
    assert str(info.value).startswith(
        f"last_complete_checkpoint('{step}'): {step} is a torch.distributed.checkpoint folder itself (it holds "
        f".metadata). Pass the folder above it, {tmp_path / 'ck'}, which holds"), str(info.value)
    assert (tmp_path / "ck" / dcp.STATUS_FILE).read_bytes() == before


def test_checkpoint_folders_nothing_recorded_are_named_rather_than_a_bare_none(tmp_path: Path) -> None:
    # dcp.save without record (or the status file left elsewhere): no status file, folders there.
    for step in (1, 2):
        made(tmp_path / "ck" / f"step-{step}")
    (tmp_path / "ck" / "logs").mkdir()  # not a checkpoint folder: not named
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert dcp.last_complete_checkpoint(tmp_path / "ck") is None
    [warning] = [str(w.message) for w in caught]
    assert warning.startswith(f"Passed over step-1, step-2 in {tmp_path / 'ck'}: torch.distributed.checkpoint "
                              f"folders not recorded in {tmp_path / 'ck' / dcp.STATUS_FILE}"), warning
    assert "last_complete_checkpoint() returns None: the run starts from scratch" in warning


def test_a_fresh_run_says_nothing(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dcp.last_complete_checkpoint(tmp_path / "ck") is None


@pytest.mark.parametrize("call", ["record", "save", "last_complete_checkpoint"])
def test_a_status_file_inside_a_checkpoint_folder_is_refused(tmp_path: Path, call: str) -> None:
    step = made(tmp_path / "ck" / "step-1")
    inside = step / "training_status.json"
    with pytest.raises(TrainingStatusValueError) as info:
        if call == "record":
            dcp.record(step, 1, status_path=inside)
        elif call == "save":
            dcp.save({}, step, 1, status_path=inside)
        else:
            dcp.last_complete_checkpoint(tmp_path / "ck", status_path=inside)
    assert f"the status file {inside} would lie inside the checkpoint folder {step}" in str(info.value)
    assert not inside.exists()


# -- called before the process group ----------------------------------------------------------------


def test_a_rank_of_a_launch_without_its_process_group_is_warned(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun started 2 processes (WORLD_SIZE=2); this one calls before init_process_group: it
    # decides alone, and rank 1 may decide otherwise. (Transformers warned; DCP said nothing.)
    monkeypatch.setenv("WORLD_SIZE", "2")
    (tmp_path / "ck").mkdir()
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert dcp.last_complete_checkpoint(tmp_path / "ck") is None
    [message] = [str(w.message) for w in caught]
    assert message.startswith(f"last_complete_checkpoint('{tmp_path / 'ck'}') ran in one of 2 processes (WORLD_SIZE=2) "
                              "before this one joined their torch.distributed process group"), message
    step = made(tmp_path / "ck" / "step-1")
    with pytest.warns(TrainingStatusCheckpointWarning, match=r"^record\(.*step-1', 1\) ran in one of 2 processes"):
        dcp.record(step, 1)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dcp.record(step, 1)


def test_a_remote_status_file_for_local_folders_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It used to be made absolute as a local path ("<cwd>/s3:/bucket/..."): recorded there, never
    # found again by a resume given the URL. Folders on an object store take URLs themselves.
    monkeypatch.chdir(tmp_path)  # where the old code would have written it
    made(tmp_path / "step-1")
    for call in (lambda: dcp.record(tmp_path / "step-1", 1, status_path="s3://bucket/status.json"),
                 lambda: dcp.last_complete_checkpoint(tmp_path, status_path="s3://bucket/status.json")):
        with pytest.raises(TrainingStatusValueError) as raised:
            call()
        assert str(raised.value).startswith(
            f"The status file s3://bucket/status.json is on remote storage and the checkpoint folders it would list "
            f"are in the local folder {tmp_path}:"), raised.value
    assert not list(tmp_path.glob("s3*")) and not (tmp_path / "training_status.json").exists()
