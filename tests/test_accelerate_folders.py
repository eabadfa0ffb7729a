"""The checks trainstatus.integrations.accelerate makes of a recorded folder before Accelerate loads
it (``_accelerate.folders``, ``_formats.safetensors``), on files made here: no torch or Accelerate needed,
so they run in the default suite. tests/test_integration_accelerate.py runs them on real saves."""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest

from trainstatus.integrations._formats import safetensors as _safetensors
from trainstatus.integrations._accelerate.folders import sweep, unrecorded, whole

FOLDER = "checkpoints/checkpoint_3"


def safetensors(path: Path, tensors: int = 2, size: int = 16) -> None:
    header = {f"t{i}": {"dtype": "F32", "shape": [size // 4], "data_offsets": [i * size, (i + 1) * size]}
              for i in range(tensors)}
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (tensors * size))


def torch_zip(path: Path) -> None:
    """A zip laid out as torch.save lays it out (``<name>/data.pkl``, ``<name>/version``)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00." * 20)
        archive.writestr("archive/version", b"3\n")


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A folder as a save by 2 processes leaves it, and its entry as recorded."""
    folder = tmp_path / FOLDER
    folder.mkdir(parents=True)
    safetensors(folder / "model.safetensors")
    for name in ("optimizer.bin", "random_states_0.pkl", "random_states_1.pkl", "custom_checkpoint_0.pkl"):
        torch_zip(folder / name)
    files = {f"{FOLDER}/{p.name}": p.stat().st_size for p in folder.iterdir()}
    return tmp_path, {"steps": 3, "file_path": FOLDER, "files": files, "world_size": 2}


def why(root: Path, entry: dict[str, Any], **fields: Any) -> str | None:
    try:
        assert whole(str(root))({**entry, **fields}) is True
    except ValueError as exc:
        return str(exc)
    return None


def test_a_whole_folder_passes(checkpoint: tuple[Path, dict[str, Any]]) -> None:
    root, entry = checkpoint
    assert why(root, entry) is None


def test_every_process_s_random_states_must_be_recorded(checkpoint: tuple[Path, dict[str, Any]]) -> None:
    root, entry = checkpoint
    del entry["files"][f"{FOLDER}/random_states_1.pkl"]
    assert why(root, entry) == (
        f"{FOLDER} was saved by 2 processes, but random_states_1.pkl was not recorded with it")
    assert why(root, entry, world_size=4) == (
        f"{FOLDER} was saved by 4 processes, but random_states_1.pkl, random_states_2.pkl and random_states_3.pkl "
        "were not recorded with it")
    assert why(root, entry, world_size=1) is None
    del entry["world_size"]  # recorded without a process group: by one process
    assert why(root, entry) is None
    del entry["files"][f"{FOLDER}/random_states_0.pkl"]
    assert why(root, entry) == f"{FOLDER} was saved by 1 process, but random_states_0.pkl was not recorded with it"
    for world in (0, "2", None):
        assert why(root, entry, world_size=world) == (
            f"{FOLDER} has world_size {world!r} recorded, not a number of processes, so whether every process's "
            "random_states_0.pkl is there cannot be told")


def test_a_safetensors_header_must_account_for_the_file(checkpoint: tuple[Path, dict[str, Any]]) -> None:
    root, entry = checkpoint
    weights = root / FOLDER / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:  # its header overwritten, its size kept
        f.seek(8)
        f.write(b"\0" * 16)
    assert why(root, entry) == (
        f"{FOLDER}/model.safetensors: its header is not JSON (Expecting value: line 1 column 1 (char 0))")
    with open(weights, "r+b") as f:  # cut short
        f.truncate(size - 4)
    assert _safetensors.problem(str(weights)) is not None


def test_a_torch_save_file_must_have_its_zip_directory(checkpoint: tuple[Path, dict[str, Any]]) -> None:
    # Cut short and recorded at that size (what a record made before the file was finished holds).
    root, entry = checkpoint
    states = root / FOLDER / "random_states_1.pkl"
    with open(states, "r+b") as f:
        f.truncate(states.stat().st_size - 30)
    entry["files"][f"{FOLDER}/random_states_1.pkl"] = states.stat().st_size
    problem = why(root, entry)
    assert problem is not None and problem.startswith(
        f"{FOLDER}/random_states_1.pkl: its zip central directory cannot be read (")
    states.write_bytes(b"legacy pickle, not a zip")  # another format: left to the size check
    entry["files"][f"{FOLDER}/random_states_1.pkl"] = states.stat().st_size
    assert why(root, entry) is None


@pytest.mark.parametrize(("data", "problem"), [
    (b"\1\0\0", "is too short for a safetensors header"),
    (struct.pack("<Q", 100) + b"{}", "its header claims 100 bytes, the file has 10"),
    (struct.pack("<Q", 2) + b"[]", "its header is not a JSON object"),
    (struct.pack("<Q", 11) + b'{"t": {}}  ', "its header has a tensor without data_offsets"),
    (struct.pack("<Q", 32) + json.dumps({"t": {"data_offsets": [0, 8]}}).encode().ljust(32) + b"\0" * 4,
     "its tensors end at byte 48, the file has 44"),
    (struct.pack("<Q", 2) + b"\xff\xfe", "its header is not JSON ("),
])
def test_safetensors_problems_are_named(tmp_path: Path, data: bytes, problem: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    found = _safetensors.problem(str(path))
    assert found is not None and found.startswith(problem), found


def test_unrecorded_and_swept_folders(tmp_path: Path) -> None:
    for n in (1, 2, 3, 4, 6):
        (tmp_path / "checkpoints" / f"checkpoint_{n}").mkdir(parents=True)
    (tmp_path / "checkpoints" / "checkpoint_9").write_text("a file, not a folder")
    (tmp_path / "checkpoints" / "notes").mkdir()
    listed = [{"steps": n, "file_path": f"checkpoints/checkpoint_{n}"} for n in (2, 3)]
    assert unrecorded(str(tmp_path), listed, 3) == ["checkpoints/checkpoint_4", "checkpoints/checkpoint_6"]
    assert unrecorded(str(tmp_path), [], -1)[0] == "checkpoints/checkpoint_1"
    # After a record of checkpoint_4: the older folders no longer listed go (a removal a kill
    # interrupted); the newer, the listed and what is not Accelerate's stay.
    sweep(str(tmp_path), {"accelerate": {"checkpoints": listed}}, "accelerate", 4)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [
        "checkpoint_2", "checkpoint_3", "checkpoint_4", "checkpoint_6", "checkpoint_9", "notes"]


def with_deepspeed_tag(checkpoint: tuple[Path, dict[str, Any]], ranks: tuple[int, ...]) -> dict[str, Any]:
    """The folder with a DeepSpeedPlugin's ``pytorch_model/`` tag holding the shards of ``ranks``."""
    root, entry = checkpoint
    tag = root / FOLDER / "pytorch_model"
    tag.mkdir()
    torch_zip(tag / "mp_rank_00_model_states.pt")
    for rank in ranks:
        torch_zip(tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    return {**entry, "files": {**entry["files"], **{f"{FOLDER}/pytorch_model/{p.name}": p.stat().st_size
                                                    for p in tag.iterdir()}}}


def test_a_deepspeed_plugin_s_tag_with_every_rank_s_shard_passes(checkpoint: tuple[Path, dict[str, Any]]) -> None:
    assert why(checkpoint[0], with_deepspeed_tag(checkpoint, (0, 1))) is None


def test_a_deepspeed_plugin_s_tag_without_a_rank_s_shard_is_not_whole(checkpoint: tuple[Path, dict[str, Any]]) -> None:
    # Rank 1's ZeRO shard missing from the record between ranks 0 and 2 (a status file edited, or
    # written by another tool): a load would fail in DeepSpeed on rank 1.
    assert why(checkpoint[0], with_deepspeed_tag(checkpoint, (0, 2))) == (
        f"{FOLDER}/pytorch_model has no ZeRO optimizer shard of rank 1 recorded "
        "(zero_pp_rank_<rank>_mp_rank_00_optim_states.pt)")
