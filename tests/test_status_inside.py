"""``_shared.inside``: whether a status file would lie inside a checkpoint folder (every
integration refuses it: a save writes around it, a rotation removes it with the folder), in
microseconds, from paths and, with ``look``, this disk."""

from __future__ import annotations

import re
from pathlib import Path

from trainstatus.integrations._shared.inside import inside

STEP = re.compile(r"checkpoint-[0-9]+")


def named(name: str) -> bool:
    return STEP.fullmatch(name) is not None


def test_the_folder_being_saved_holds_it_or_a_folder_below_it() -> None:
    assert inside("/out/step-3/training_status.json", "/out/step-3") == "/out/step-3"
    assert inside("/out/step-3/meta/training_status.json", "/out/step-3") == "/out/step-3"
    assert inside("/out/training_status.json", "/out/step-3") is None
    assert inside("/out/step-30/training_status.json", "/out/step-3") is None  # a name that only begins alike


def test_a_checkpoint_folder_by_name_below_the_library_s_folder() -> None:
    assert inside("/out/checkpoint-2/training_status.json", named=named, under="/out") == "/out/checkpoint-2"
    assert inside("/out/checkpoint-2/sub/training_status.json", named=named, under="/out") == "/out/checkpoint-2"
    assert inside("/out/training_status.json", named=named, under="/out") is None
    assert inside("/out/checkpoints/training_status.json", named=named, under="/out") is None
    # A folder of that name above the library's folder is the user's own: not a checkpoint of it.
    assert inside("/checkpoint-5/out/training_status.json", named=named, under="/checkpoint-5/out") is None
    assert inside("/elsewhere/checkpoint-2/training_status.json", named=named, under="/out") is None


def test_look_asks_the_disk_about_the_folder_holding_it(tmp_path: Path) -> None:
    (tmp_path / "tag").mkdir()
    (tmp_path / "tag" / "mp_rank_00_model_states.pt").write_bytes(b"")

    def is_tag(folder: str) -> bool:
        return (Path(folder) / "mp_rank_00_model_states.pt").exists()

    assert inside(str(tmp_path / "tag" / "training_status.json"), look=is_tag) == str(tmp_path / "tag")
    assert inside(str(tmp_path / "training_status.json"), look=is_tag) is None
    assert inside(str(tmp_path / "tag" / "training_status.json")) is None  # without look: the path alone


def test_without_a_bound_any_folder_above_by_name_a_url_too() -> None:
    # Ray's checkpoint names are no user's: every folder above is looked at, on a disk or in a bucket.
    def ray(name: str) -> bool:
        return name.startswith("checkpoint_2026")

    assert inside("s3://b/run/checkpoint_2026-12-07/x/status.json", named=ray) == "s3://b/run/checkpoint_2026-12-07"
    assert inside("/runs/checkpoint_2026-12-07/status.json", named=ray) == "/runs/checkpoint_2026-12-07"
    assert inside("s3://b/run/status.json", named=ray) is None
    assert inside("/status.json", named=ray) is None
