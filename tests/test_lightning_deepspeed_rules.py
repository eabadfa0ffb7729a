"""The rules of recording and resuming Lightning's ``DeepSpeedStrategy`` checkpoints, in
milliseconds, on folders shaped as DeepSpeed writes them (tests/_deepspeed_fake.py's files): what a
save must hold to be recorded (``_lightning.common.deepspeed_problem``), what a recorded one must
hold to be resumed (``whole``), and when one nothing recorded is named (``unrecorded``). Lightning
itself is not needed here: these helpers import neither it nor torch. The real strategy, on CPU
ranks, is in tests/test_integration_deepspeed.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _deepspeed_fake import file_names, torch_saved

from trainstatus.integrations._lightning.common import (
    deepspeed_problem,
    unrecorded,
    whole,
)


def saved(folder: Path, name: str = "last.ckpt", *, stage: int = 2, ranks: int = 2, tag: str = "checkpoint",
          latest: str | None = "checkpoint") -> Path:
    """A DeepSpeedStrategy save of ``ranks`` ranks: ``folder/name/<tag>/`` and ``latest``."""
    target = folder / name
    (target / tag).mkdir(parents=True)
    for rank in range(ranks):
        for file in file_names(stage, rank):
            (target / tag / file).write_bytes(torch_saved(f"{name} {rank}".encode()))
    if latest is not None:
        (target / "latest").write_text(latest)
    (target / "zero_to_fp32.py").write_text("# DeepSpeed's recovery script\n")
    return target


def entry(folder: Path, name: str = "last.ckpt") -> dict[str, Any]:
    """The entry a record of ``folder/name`` makes: every file in it with its size, by path relative to ``folder``."""
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted((folder / name).rglob("*")) if p.is_file()}
    return {"file_path": name, "steps": 2, "files": files, "world_size": 2}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_whole_save_is_recordable_and_resumable(tmp_path: Path, stage: int) -> None:
    target = saved(tmp_path, stage=stage)
    assert deepspeed_problem(str(target)) is None
    assert whole(str(tmp_path))(entry(tmp_path)) is True


def test_a_save_missing_a_rank_s_shard_is_not_recorded(tmp_path: Path) -> None:
    target = saved(tmp_path, ranks=3)
    (target / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert deepspeed_problem(str(target)) == (
        "last.ckpt/checkpoint has no ZeRO optimizer shard of rank 1 recorded "
        "(zero_pp_rank_<rank>_mp_rank_00_optim_states.pt)")


@pytest.mark.parametrize("latest, said", [
    (None, "last.ckpt has no latest file (DeepSpeedStrategy's load reads the tag from it)"),
    ("", "last.ckpt/latest names '', which is not a DeepSpeed tag folder in it (checkpoint is)"),
    ("global_step9", ("last.ckpt/latest names 'global_step9', which is not a DeepSpeed tag folder in it "
                      "(checkpoint is)")),
])
def test_a_save_whose_latest_does_not_name_its_tag_is_not_recorded(tmp_path: Path, latest: str | None,
                                                                   said: str) -> None:
    assert deepspeed_problem(str(saved(tmp_path, latest=latest))) == said


def test_a_folder_without_a_tag_is_not_recorded(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    (target / "checkpoint").mkdir(parents=True)
    (target / "latest").write_text("checkpoint")
    assert deepspeed_problem(str(target)) == (
        f"{target} holds no DeepSpeed tag folder (no *_model_states.pt in a folder inside it)")


def test_a_recorded_save_is_resumed_only_with_every_shard_latest_and_whole_zips(tmp_path: Path) -> None:
    saved(tmp_path, ranks=3)  # rank 1 of 3: a gap (the highest rank's absence shows in the recorded sizes only)
    recorded = entry(tmp_path)
    check = whole(str(tmp_path))
    shard = "last.ckpt/checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt"

    without_shard = {**recorded, "files": {k: v for k, v in recorded["files"].items() if k != shard}}
    with pytest.raises(ValueError, match=r"last\.ckpt/checkpoint has no ZeRO optimizer shard of rank 1 recorded"):
        check(without_shard)
    without_latest = {**recorded, "files": {k: v for k, v in recorded["files"].items() if k != "last.ckpt/latest"}}
    with pytest.raises(ValueError, match="has no latest file"):
        check(without_latest)
    # The zip's central directory zeroed at the same size (a size check alone passes it)
    data = bytearray((tmp_path / shard).read_bytes())
    data[-22:] = bytes(22)
    (tmp_path / shard).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{shard} is not a whole torch file"):
        check(recorded)


def test_deepspeed_folders_are_named_only_when_the_list_never_recorded_one(tmp_path: Path) -> None:
    saved(tmp_path, "epoch=0-step=2.ckpt")
    saved(tmp_path, "last.ckpt")
    status = str(tmp_path / "training_status.json")
    said = unrecorded(str(tmp_path), status, [])
    assert said is not None and said.startswith(
        f"epoch=0-step=2.ckpt, last.ckpt in {tmp_path} are DeepSpeed checkpoints (saved by DeepSpeedStrategy, past "
        f"TrainStatusCheckpointIO) that {status} has never recorded"), said
    assert said.endswith("Add TrainStatusCallback() to the Trainer's callbacks beside the plugin: it records "
                         "DeepSpeedStrategy's saves."), said
    # One recorded: the other, not listed beside it, is a save a kill cut short or one saved over
    # (last.ckpt, unlisted before it was saved over), which the resume passes over in silence.
    assert unrecorded(str(tmp_path), status, [entry(tmp_path, "epoch=0-step=2.ckpt")]) is None
