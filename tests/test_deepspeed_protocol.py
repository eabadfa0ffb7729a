"""trainstatus.integrations.deepspeed's rules, in milliseconds and without torch or DeepSpeed: an
engine that writes what DeepSpeed's ``save_checkpoint`` writes (tests/_deepspeed_fake.py), alone
or on ranks that are threads (tests/_fake_group.py). The real engine, its ranks and kills run in
tests/test_integration_deepspeed.py (the deepspeed group)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _deepspeed_fake import FakeEngine, torch_saved
from _fake_group import World
from _lease_holder import another_job

from trainstatus import (
    StatusStore,
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusInUseError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusWriteError,
)
from trainstatus.integrations import deepspeed
from trainstatus.integrations._shared import choice as _choice
from trainstatus.integrations._shared import lease as _lease
from trainstatus.integrations._formats import deepspeed_tags as _tags

SECONDS = 5.0  # every collective's timeout: a bug fails, never hangs


def listed(root: Path) -> list[dict[str, Any]]:
    path = root / deepspeed.STATUS_FILE
    if not path.exists():
        return []
    with StatusStore(path) as store:
        return list(store.get(deepspeed.CATEGORY, "checkpoints") or [])


def saved(engine: FakeEngine, root: Path, steps: range, **options: Any) -> None:
    for step in steps:
        engine.global_steps = step
        deepspeed.save_checkpoint(engine, root, **options)


def messages(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, TrainingStatusCheckpointWarning)]


# -- one process --------------------------------------------------------------------------------


def test_saves_are_recorded_latest_names_the_newest_and_keep_removes_only_after_the_record(tmp_path: Path) -> None:
    engine = FakeEngine()
    removed: list[tuple[str, list[int]]] = []
    real_remove = os.remove

    def remove(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.path.basename(os.path.dirname(path)).startswith("global_step"):
            removed.append((os.path.basename(os.path.dirname(path)), [e["steps"] for e in listed(tmp_path)]))
        real_remove(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "remove", remove)
        saved(engine, tmp_path, range(1, 5), keep=2)
    assert [(e["steps"], e["file_path"]) for e in listed(tmp_path)] == [(3, "global_step3"), (4, "global_step4")]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step3", "global_step4"]
    # Each file of a tag beyond keep=2 went only once the list on disk no longer named the tag.
    assert removed == [("global_step1", [2, 3])] * 2 + [("global_step2", [3, 4])] * 2
    entry = listed(tmp_path)[-1]
    assert entry["files"] == {f"global_step4/{p.name}": p.stat().st_size for p in (tmp_path / "global_step4").iterdir()}
    assert "world_size" not in entry  # one process: no group
    # DeepSpeed's own write of latest is off; trainstatus's names the newest recorded tag.
    assert {save["save_latest"] for save in engine.saves} == {False}
    assert (tmp_path / "latest").read_text() == "global_step4"
    assert deepspeed.last_complete_checkpoint(tmp_path) == "global_step4"
    assert deepspeed.load_checkpoint(engine, tmp_path, load_module_strict=False) == (
        os.path.join(tmp_path, "global_step4"), {"tag": "global_step4"})
    assert engine.loads == [(os.fspath(tmp_path), "global_step4", {"load_module_strict": False})]


def test_save_latest_false_leaves_latest_alone(tmp_path: Path) -> None:
    engine = FakeEngine(steps=3)
    deepspeed.save_checkpoint(engine, tmp_path, save_latest=False, client_state={"epoch": 2})
    assert not (tmp_path / "latest").exists()
    assert engine.saves[0]["client_state"] == {"epoch": 2} and engine.saves[0]["tag"] == "global_step3"


def test_a_fresh_folder_resumes_from_nothing_in_silence(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert deepspeed.load_checkpoint(FakeEngine(), tmp_path / "new") == (None, None)


def test_tag_folders_nothing_recorded_are_named_when_the_resume_starts_over(tmp_path: Path) -> None:
    # DeepSpeed's own saves (engine.save_checkpoint, with latest): never a bare (None, None).
    engine = FakeEngine(steps=7)
    engine.save_checkpoint(str(tmp_path))
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert deepspeed.load_checkpoint(engine, tmp_path) == (None, None)
    [message] = messages(caught.list)
    assert "global_step7" in message and "not recorded" in message and "starts from scratch" in message
    assert engine.loads == []


@pytest.mark.parametrize("latest", [b"", b"global_st", b"global_step9"])
def test_latest_is_never_read(tmp_path: Path, latest: bytes) -> None:
    # Empty (a kill inside DeepSpeed's write), cut short, or naming a tag that is not whole.
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 3))
    (tmp_path / "latest").write_bytes(latest)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert deepspeed.load_checkpoint(engine, tmp_path)[0] == os.path.join(tmp_path, "global_step2")


@pytest.mark.parametrize("damage", ["cut", "deleted", "zip directory"])
def test_a_damaged_rank_shard_is_passed_over_by_name_and_unlisted(tmp_path: Path, damage: str) -> None:
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 4))
    shard = tmp_path / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    if damage == "cut":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "deleted":
        shard.unlink()
    else:  # same size, its central directory gone
        data = shard.read_bytes()
        shard.write_bytes(data[:-200] + b"\0" * 200)
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert deepspeed.last_complete_checkpoint(tmp_path) == "global_step2"
    [message] = messages(caught.list)
    assert "global_step2 is the newest whole tag" in message and "zero_pp_rank_0_mp_rank_00_optim_states.pt" in message
    assert [e["steps"] for e in listed(tmp_path)] == [1, 2]
    assert shard.parent.is_dir()  # its files are left on disk


@pytest.mark.parametrize(("stage", "left_out", "said"), [
    (2, "zero_pp_rank_1_mp_rank_00_optim_states.pt", "no ZeRO optimizer shard of rank 1 recorded"),
    (3, "zero_pp_rank_1_mp_rank_00_model_states.pt", "no ZeRO weights shard of rank 1 recorded"),
    (2, "mp_rank_00_model_states.pt", "no *_model_states.pt recorded"),
])
def test_a_tag_recorded_without_a_rank_s_file_is_passed_over(tmp_path: Path, stage: int, left_out: str,
                                                              said: str) -> None:
    # Three ranks' files, one left out of the record (a status file edited by hand, or written by
    # another tool): a load would fail in DeepSpeed on that rank.
    engine = FakeEngine(stage=stage)
    saved(engine, tmp_path, range(1, 3))
    tag = tmp_path / "global_step2"
    for rank in (1, 2):
        for name in __import__("_deepspeed_fake").file_names(stage, rank):
            (tag / name).write_bytes(torch_saved(b"x"))
    with StatusStore(tmp_path / deepspeed.STATUS_FILE) as store:
        entries = store.get(deepspeed.CATEGORY, "checkpoints")
        entries[-1]["files"] = {f"global_step2/{p.name}": p.stat().st_size for p in tag.iterdir() if p.name != left_out}
        store.set(deepspeed.CATEGORY, "checkpoints", entries)
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert deepspeed.last_complete_checkpoint(tmp_path) == "global_step1"
    assert f"global_step2 has {said}" in messages(caught.list)[0]


def test_a_tag_of_one_shard_group_s_optimizer_shards_is_whole(tmp_path: Path) -> None:
    # MiCS and ZeRO++'s hpZ save the optimizer shards of the first shard group only: fewer files
    # than the ranks that saved (here 1 of 4), every one from rank 0 up. Not a reason to pass it over.
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 2))
    [entry] = listed(tmp_path)
    assert _tags.whole(str(tmp_path))({**entry, "world_size": 4}) is True
    with pytest.raises(ValueError, match="no ZeRO optimizer shard of rank 0"):
        _tags.whole(str(tmp_path))({**entry, "files": {name: size for name, size in entry["files"].items()
                                                       if "zero_pp_rank_0" not in name} | {
            "global_step1/zero_pp_rank_1_mp_rank_00_optim_states.pt": 1}})


def test_a_run_that_went_back_drops_the_later_entries_when_it_saves(tmp_path: Path) -> None:
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 5))
    saved(engine, tmp_path, range(2, 3))
    assert [e["steps"] for e in listed(tmp_path)] == [1, 2]
    assert (tmp_path / "global_step4").is_dir()


# -- a tag saved over in place -------------------------------------------------------------------


class Killed(Exception):
    """Stands for a kill while DeepSpeed writes the tag's files."""


def test_a_tag_saved_over_in_place_is_unlisted_before_deepspeed_writes_into_it(tmp_path: Path) -> None:
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 2))
    saved(engine, tmp_path, range(2, 3), tag="last")
    seen: list[Any] = []

    def killed() -> None:
        seen.append(([e["file_path"] for e in listed(tmp_path)], (tmp_path / "latest").exists()))
        raise Killed

    engine.before_save = killed
    engine.global_steps = 3
    with pytest.raises(Killed):
        deepspeed.save_checkpoint(engine, tmp_path, tag="last")
    # When DeepSpeed began to write, "last" was no longer listed, and latest (which named it) was gone.
    assert seen == [(["global_step1"], False)]
    engine.before_save = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert deepspeed.last_complete_checkpoint(tmp_path) == "global_step1"
    # Saved again in place and recorded: listed once, at its new step.
    saved(engine, tmp_path, range(4, 5), tag="last")
    assert [(e["steps"], e["file_path"]) for e in listed(tmp_path)] == [(1, "global_step1"), (4, "last")]
    assert (tmp_path / "latest").read_text() == "last"


def test_the_only_tag_unlisted_by_a_kill_in_its_save_is_named_when_the_resume_starts_over(tmp_path: Path) -> None:
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 2), tag="last")

    def killed() -> None:
        raise Killed

    engine.before_save = killed
    with pytest.raises(Killed):
        deepspeed.save_checkpoint(engine, tmp_path, tag="last")
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert deepspeed.load_checkpoint(engine, tmp_path) == (None, None)
    [message] = messages(caught.list)
    assert "Passed over last in" in message and "saved over in place" in message


# -- world size ---------------------------------------------------------------------------------


def recorded_by(root: Path, world: int, stage: int) -> FakeEngine:
    """A tag of ``stage`` saved by ``world`` ranks (each rank's files), recorded as such."""
    engine = FakeEngine(stage=stage, steps=5)
    deepspeed.save_checkpoint(engine, root)
    for rank in range(1, world):
        for name in ("zero_pp_rank_{}_mp_rank_00_optim_states.pt",) + (
                ("zero_pp_rank_{}_mp_rank_00_model_states.pt",) if stage == 3 else ()):
            if stage:
                (root / "global_step5" / name.format(rank)).write_bytes(torch_saved(b"x" * 100))
    with StatusStore(root / deepspeed.STATUS_FILE) as store:
        [entry] = store.get(deepspeed.CATEGORY, "checkpoints")
        entry["files"] = {f"global_step5/{p.name}": p.stat().st_size for p in (root / "global_step5").iterdir()}
        entry["world_size"] = world
        store.set(deepspeed.CATEGORY, "checkpoints", [entry])
    return engine


@pytest.mark.parametrize("stage", [2, 3])
def test_a_zero_tag_of_another_world_size_is_refused_before_deepspeed_loads_it(tmp_path: Path, stage: int) -> None:
    engine = recorded_by(tmp_path, 2, stage)
    with pytest.raises(TrainingStatusCheckpointError) as raised:
        deepspeed.load_checkpoint(engine, tmp_path)
    message = str(raised.value)
    assert "saved by 2 ranks and this run has 1" in message and "Resume with 2 ranks" in message
    assert "ds_to_universal" in message and str(tmp_path / "global_step5") in message
    assert engine.loads == []
    assert [e["steps"] for e in listed(tmp_path)] == [5]  # nothing unlisted for it
    # last_complete_checkpoint (a tool of one process, zero_to_fp32) returns it, and says why a load would fail.
    with pytest.warns(TrainingStatusCheckpointWarning, match="saved by 2 ranks and this run has 1"):
        assert deepspeed.last_complete_checkpoint(tmp_path) == "global_step5"


def test_a_zero_2_tag_of_another_world_size_loads_without_its_optimizer_state_with_a_warning(tmp_path: Path) -> None:
    engine = recorded_by(tmp_path, 2, 2)
    with pytest.warns(TrainingStatusCheckpointWarning, match="saved by 2 ranks and this run has 1: its module"):
        deepspeed.load_checkpoint(engine, tmp_path, load_optimizer_states=False)
    assert [tag for _, tag, _ in engine.loads] == ["global_step5"]
    # ZeRO-3 partitions the weights too: refused even without the optimizer's state.
    engine = recorded_by(tmp_path / "z3", 2, 3)
    with pytest.raises(TrainingStatusCheckpointError, match="ZeRO-3 partitions the model's weights"):
        deepspeed.load_checkpoint(engine, tmp_path / "z3", load_module_only=True)


def test_a_stage_0_tag_of_another_world_size_loads_with_a_warning(tmp_path: Path) -> None:
    engine = recorded_by(tmp_path, 2, 0)
    with pytest.warns(TrainingStatusCheckpointWarning, match="module states load into any number of ranks"):
        assert deepspeed.load_checkpoint(engine, tmp_path)[0] == os.path.join(tmp_path, "global_step5")


# -- wrong paths and arguments ------------------------------------------------------------------


def test_a_second_job_on_the_folder_is_refused_before_deepspeed_saves(tmp_path: Path) -> None:
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 3))
    _lease.release_all()  # that job (this process) ended
    before = (tmp_path / deepspeed.STATUS_FILE).read_bytes()
    with another_job(str(tmp_path / deepspeed.STATUS_FILE), run="first-job") as job:
        engine.global_steps = 3
        with pytest.raises(TrainingStatusInUseError, match=f"process {job.pid} on .*, run 'first-job'"):
            deepspeed.save_checkpoint(engine, tmp_path)
    assert not (tmp_path / "global_step3").exists() and (tmp_path / "latest").read_text() == "global_step2"
    assert (tmp_path / deepspeed.STATUS_FILE).read_bytes() == before
    saved(engine, tmp_path, range(3, 4))  # once that job is gone, this one saves and records
    assert [e["steps"] for e in listed(tmp_path)] == [1, 2, 3]


def test_a_tag_folder_given_for_save_dir_is_refused_naming_the_folder_above(tmp_path: Path) -> None:
    engine = FakeEngine(steps=1)
    deepspeed.save_checkpoint(engine, tmp_path)
    for call in (lambda: deepspeed.load_checkpoint(engine, tmp_path / "global_step1"),
                 lambda: deepspeed.last_complete_checkpoint(tmp_path / "global_step1")):
        with pytest.raises(TrainingStatusValueError, match="is a DeepSpeed tag folder itself") as raised:
            call()
        assert f"Pass the folder above it, {tmp_path}," in str(raised.value)
    assert [e["steps"] for e in listed(tmp_path)] == [1]


@pytest.mark.parametrize("where", ["s3://bucket/ckpt", "", 7])
def test_a_remote_or_bad_save_dir_is_refused_before_anything(tmp_path: Path, where: Any) -> None:
    engine = FakeEngine()
    for call in (lambda: deepspeed.save_checkpoint(engine, where), lambda: deepspeed.load_checkpoint(engine, where),
                 lambda: deepspeed.last_complete_checkpoint(where)):
        with pytest.raises(TrainingStatusTypeError, match="local path"):
            call()
    assert engine.saves == engine.loads == []


@pytest.mark.parametrize("tag", ["a/b", "..", "latest", "training_status.json", ""])
def test_a_tag_that_is_not_one_folder_name_is_refused(tmp_path: Path, tag: str) -> None:
    engine = FakeEngine()
    with pytest.raises(TrainingStatusValueError, match="a tag names one folder"):
        deepspeed.save_checkpoint(engine, tmp_path, tag=tag)
    assert engine.saves == []


def test_a_status_file_inside_a_tag_folder_is_refused(tmp_path: Path) -> None:
    engine = FakeEngine(steps=1)
    deepspeed.save_checkpoint(engine, tmp_path)
    inside = tmp_path / "global_step1" / "status.json"
    with pytest.raises(TrainingStatusValueError, match="would lie inside the tag folder"):
        deepspeed.save_checkpoint(engine, tmp_path, tag="global_step1", status_path=inside)
    with pytest.raises(TrainingStatusValueError, match="would lie inside the tag folder"):
        deepspeed.load_checkpoint(engine, tmp_path, status_path=inside)
    assert len(engine.saves) == 1 and not inside.exists()


def test_a_tag_to_load_a_universal_config_and_a_decoupled_engine_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainingStatusTypeError, match="trainstatus chooses the tag"):
        deepspeed.load_checkpoint(FakeEngine(), tmp_path, tag="global_step1")
    with pytest.raises(TrainingStatusTypeError, match="load_universal"):
        deepspeed.load_checkpoint(FakeEngine(universal=True), tmp_path)
    engine = FakeEngine(decoupled=True)
    with pytest.raises(TrainingStatusTypeError, match="decoupled"):
        deepspeed.save_checkpoint(engine, tmp_path)
    assert engine.saves == [] and not (tmp_path / deepspeed.STATUS_FILE).exists()
    with pytest.raises(TrainingStatusTypeError, match="global_steps"):
        deepspeed.save_checkpoint(object(), tmp_path)


# -- ranks --------------------------------------------------------------------------------------


def engines(world: World, stage: int = 2, steps: int = 1) -> list[FakeEngine]:
    return [FakeEngine(rank, stage, steps=steps, write=lambda path, data, rank=rank: world.write(rank, path, data))
            for rank in range(world.size)]


@pytest.mark.parametrize("stage", [2, 3])
def test_every_rank_s_shards_are_durable_and_recorded_once_with_the_world_size(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch,
                                                                               stage: int) -> None:
    world = World(tmp_path, monkeypatch)
    root = world.root(0)
    ranked = engines(world, stage)
    outcomes = world.run(*[lambda rank: deepspeed.save_checkpoint(ranked[rank], root, timeout=SECONDS)] * 2)
    assert outcomes[0].value == outcomes[1].value is not None, outcomes
    assert world.dirty == {}  # every shard fsynced from the host that wrote it
    [entry] = listed(root)
    names = {f"global_step1/{name}" for rank in (0, 1) for name in __import__("_deepspeed_fake").file_names(stage, rank)}
    assert (set(entry["files"]), entry["world_size"]) == (names, 2)
    outcomes = world.run(*[lambda rank: deepspeed.load_checkpoint(ranked[rank], root, timeout=SECONDS)] * 2)
    assert [o.value[0] for o in outcomes] == [str(root / "global_step1")] * 2, outcomes
    # One process resuming the two ranks' ZeRO tag is refused (DeepSpeed would raise midway).
    with pytest.raises(TrainingStatusCheckpointError, match="saved by 2 ranks and this run has 1"):
        deepspeed.load_checkpoint(FakeEngine(stage=stage), root)


def test_no_rank_saves_over_a_listed_tag_before_its_entry_is_dropped_on_disk(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(tmp_path, monkeypatch)
    root = world.root(0)
    ranked = engines(world)
    world.run(*[lambda rank: deepspeed.save_checkpoint(ranked[rank], root, tag="last", timeout=SECONDS)] * 2)
    seen: list[list[str]] = []
    for engine in ranked:
        engine.global_steps = 2
        engine.before_save = lambda: seen.append([e["file_path"] for e in listed(root)])
    outcomes = world.run(*[lambda rank: deepspeed.save_checkpoint(ranked[rank], root, tag="last",
                                                                  timeout=SECONDS)] * 2)
    assert all(o.error is None for o in outcomes), outcomes
    assert seen == [[], []]  # neither rank began to write while "last" was listed
    assert [(e["steps"], e["file_path"]) for e in listed(root)] == [(2, "last")]
    assert (root / "latest").read_text() == "last"


# -- a checkpoint folder holding a tag (the Trainer's deepspeed=, Accelerate's DeepSpeedPlugin) ---


def trainer_entry(root: Path, world: int, stage: int) -> dict[str, Any]:
    """``checkpoint-4/`` as the Trainer saves it with ``deepspeed=`` by ``world`` ranks, recorded."""
    tag = root / "checkpoint-4" / "global_step4"
    tag.mkdir(parents=True)
    for rank in range(world):
        for name in __import__("_deepspeed_fake").file_names(stage, rank):
            (tag / name).write_bytes(torch_saved(b"x"))
    (root / "checkpoint-4" / "trainer_state.json").write_text("{}")
    files = {str(p.relative_to(root)): p.stat().st_size for p in (root / "checkpoint-4").rglob("*") if p.is_file()}
    return {"steps": 4, "file_path": "checkpoint-4", "files": files, "world_size": world}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_folder_whose_zero_tag_was_saved_by_other_ranks_is_refused_with_the_way_out(tmp_path: Path,
                                                                                        stage: int) -> None:
    entry = trainer_entry(tmp_path, 2, stage)
    shown = str(tmp_path / "checkpoint-4")
    why = _tags.refusal(entry, shown, 1)
    assert why is not None and why.startswith("it was saved by 2 ranks with DeepSpeed and this run has 1, and ")
    assert f"--input_folder {shown}/global_step4 " in why and why.endswith(f"then resume from {shown} again")
    assert _tags.refusal(entry, shown, 2) is None
    # Converted with ds_to_universal (latest_universal beside the converted tag): any number of ranks.
    (tmp_path / "checkpoint-4" / "latest_universal").write_text("global_step4_universal")
    assert _tags.refusal(entry, shown, 1) is None


def test_a_folder_whose_tag_holds_no_zero_shard_loads_into_any_number_of_ranks(tmp_path: Path) -> None:
    entry = trainer_entry(tmp_path, 2, 0)
    assert _tags.refusal(entry, str(tmp_path / "checkpoint-4"), 3) is None
    # One process recorded it (no world_size): one rank's ZeRO tag refused for two.
    single = trainer_entry(tmp_path / "one", 1, 2)
    del single["world_size"]
    assert "saved by 1 rank with" in (_tags.refusal(single, str(tmp_path / "one" / "checkpoint-4"), 2) or "")


def test_a_tag_a_kill_kept_the_rotation_from_removing_is_removed_at_the_next_save(tmp_path: Path) -> None:
    engine = FakeEngine()
    # The user's own DeepSpeed saves in the folder before trainstatus (global_step1, global_step2,
    # and one of a name of theirs): never recorded, so never removed.
    for step in (1, 2):
        engine.global_steps = step
        engine.save_checkpoint(str(tmp_path), save_latest=False)
    engine.save_checkpoint(str(tmp_path), tag="mine", save_latest=False)
    saved(engine, tmp_path, range(3, 6), keep=2)
    real_remove = os.remove

    def killed_in_the_removal(path: Any, *args: Any, **kwargs: Any) -> None:
        if "global_step4" in os.fspath(path):
            raise Killed  # the list on disk no longer names global_step4; its folder stays
        real_remove(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "remove", killed_in_the_removal)
        with pytest.raises(Killed):
            saved(engine, tmp_path, range(6, 7), keep=2)
    assert [e["file_path"] for e in listed(tmp_path)] == ["global_step5", "global_step6"]
    assert (tmp_path / "global_step4").is_dir()
    saved(engine, tmp_path, range(7, 8), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step1", "global_step2",
                                                                         "global_step6", "global_step7", "mine"]
    # Without keep, nothing but the list's own rotation is ever removed.
    (tmp_path / "global_step4").mkdir()
    saved(engine, tmp_path, range(8, 9))
    assert (tmp_path / "global_step4").is_dir()


def test_a_module_file_missing_for_a_model_parallel_rank_is_named() -> None:
    names = ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
             "zero_pp_rank_0_mp_rank_01_optim_states.pt"]
    assert _tags.shards_problem("g", names) == "g has no mp_rank_01_model_states.pt recorded (the module's states)"
    assert _tags.shards_problem("g", [*names, "mp_rank_01_model_states.pt"]) is None
    assert _tags.shards_problem("g", ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                      "mp_rank_00_model_states.pt"]) is None


def test_a_wrong_path_one_host_sees_is_refused_on_every_rank_alike(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Node-local disks: only rank 0's host holds a tag folder at the path given. Rank 0 checks it
    # and every rank raises its error (a rank raising alone would leave the other in a collective).
    world = World(tmp_path, monkeypatch, shared=False)
    tag = world.root(0) / "ckpt" / "global_step1"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(torch_saved(b"x"))
    given = [world.root(rank) / "ckpt" / "global_step1" for rank in (0, 1)]
    outcomes = world.run(*[lambda rank: deepspeed.load_checkpoint(FakeEngine(rank), given[rank], timeout=SECONDS)] * 2)
    assert [type(o.error) for o in outcomes] == [TrainingStatusValueError] * 2, outcomes
    assert "is a DeepSpeed tag folder itself" in str(outcomes[1].error)
    ranked = engines(world)
    inside = [world.root(rank) / "ckpt" / "global_step1" / "status.json" for rank in (0, 1)]
    outcomes = world.run(*[lambda rank: deepspeed.save_checkpoint(ranked[rank], world.root(rank) / "ckpt",
                                                                  status_path=inside[rank], timeout=SECONDS)] * 2)
    assert [type(o.error) for o in outcomes] == [TrainingStatusValueError] * 2, outcomes
    assert ranked[0].saves == ranked[1].saves == []


@pytest.mark.parametrize(("options", "error"), [({"keep": 0}, TrainingStatusValueError),
                                                ({"keep": "3"}, TrainingStatusTypeError),
                                                ({"reward": "best"}, TrainingStatusTypeError)])
def test_a_bad_keep_or_reward_is_refused_before_anything_is_unlisted_or_saved(tmp_path: Path, options: dict[str, Any],
                                                                              error: type[Exception]) -> None:
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 2), tag="last")
    with pytest.raises(error, match="Nothing was saved"):
        deepspeed.save_checkpoint(engine, tmp_path, tag="last", **options)
    assert len(engine.saves) == 1 and [e["file_path"] for e in listed(tmp_path)] == ["last"]


def test_a_tag_rotated_out_and_saved_again_is_not_removed_by_the_rotation_s_record(tmp_path: Path) -> None:
    # Tags of the user's names in a cycle, keep=2: "a" is rotated out when "c" is saved, then saved
    # again; the names the rotation wrote down must not take the new "a" with them.
    engine = FakeEngine()
    for step, tag in enumerate(["a", "b", "c", "a", "b"], start=1):
        engine.global_steps = step
        deepspeed.save_checkpoint(engine, tmp_path, tag=tag, keep=2)
    assert [(e["steps"], e["file_path"]) for e in listed(tmp_path)] == [(4, "a"), (5, "b")]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["a", "b"]
    assert deepspeed.last_complete_checkpoint(tmp_path) == "b"


# -- read-only ------------------------------------------------------------------------------------


@contextlib.contextmanager
def immutable(*paths: Path) -> Iterator[None]:
    """``paths`` marked immutable (``chattr +i``): refused to every writer, root included (EPERM),
    as a read-only mount refuses (EROFS); the marks lifted after."""
    subprocess.run(["chattr", "+i", *map(str, paths)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


needs_chattr = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("chattr") is None,
    reason="marks a folder immutable: needs root and chattr (e2fsprogs)")


@needs_chattr
def test_a_read_only_folder_resumes_past_a_damaged_tag_leaving_the_list_as_it_is(tmp_path: Path) -> None:
    # An evaluation job, a copy on a read-only mount: the newest tag is damaged. The resume passes
    # over it by name and loads the one before; unlisting the damaged tag cannot be written here,
    # which is said, and changes nothing (no run can save here either). It raised before.
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 4))
    (tmp_path / "training_status.json.lock").unlink()  # a copy made elsewhere has no lock file
    shard = tmp_path / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:100])
    before = (tmp_path / deepspeed.STATUS_FILE).read_bytes()
    with immutable(tmp_path, tmp_path / deepspeed.STATUS_FILE):
        with pytest.warns(TrainingStatusCheckpointWarning) as caught:
            path, _ = deepspeed.load_checkpoint(engine, tmp_path)
    assert path == os.path.join(tmp_path, "global_step2") and engine.loads[-1][1] == "global_step2"
    [said] = messages(caught.list)
    assert said.startswith("global_step2 is the newest whole tag"), said
    assert f"They stay listed: {tmp_path / deepspeed.STATUS_FILE} cannot be written here, and each resume passes " \
           "them over again (" in said, said
    assert "marked immutable" in said and "a run that saves checkpoints here needs to write the status file" in said
    assert "no longer listed" not in said
    assert (tmp_path / deepspeed.STATUS_FILE).read_bytes() == before


def test_a_status_file_that_fails_to_be_written_otherwise_is_raised(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A full disk is not a read-only folder: a run would then save over a damaged tag still listed.
    engine = FakeEngine()
    saved(engine, tmp_path, range(1, 4))
    shard = tmp_path / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:100])

    def full(*args: Any, **kwargs: Any) -> Any:
        raise TrainingStatusWriteError("No space left on device", errno=errno.ENOSPC)

    monkeypatch.setattr(_choice, "drop", full)
    with pytest.raises(TrainingStatusWriteError, match="No space left"), warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingStatusCheckpointWarning)
        deepspeed.last_complete_checkpoint(tmp_path)
    assert [e["steps"] for e in listed(tmp_path)] == [1, 2, 3]
