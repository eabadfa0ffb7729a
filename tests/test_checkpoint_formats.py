"""Every check that compares a size, at its boundary: one byte short, one byte long, exactly at the
end. safetensors headers (``_formats.safetensors``), torch.save's zip directory (``_formats.torch_zip``) and the
recorded sizes of ``CheckpointList``, on files built here byte by byte from their formats (no
torch). The DCP chunk check reads ``.metadata``, a pickle of torch's classes: its boundary is in
tests/test_integration_dcp.py (``boundary``); Ray's on an object store (pyarrow) in
tests/test_integration_ray.py."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import pytest

from trainstatus import CheckpointList, StatusStore, TrainingStatusCheckpointWarning
from trainstatus.integrations._formats import safetensors as _safetensors
from trainstatus.integrations._formats import torch_zip as _torch_zip

BOUNDARY = pytest.mark.parametrize("delta", [-1, 0, 1], ids=["one byte short", "exactly at the end", "one byte long"])

# -- safetensors: 8 bytes of header length, the JSON header, then the tensors' bytes -------------


def safetensors(data_bytes: int | None = None, *, claimed: int | None = None) -> bytes:
    """Two tensors of 16 bytes each; ``data_bytes`` of data follow the header (32 if None),
    ``claimed`` is the header length the first 8 bytes give (its true length if None)."""
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]},
              "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if claimed is None else claimed) + raw + b"\0" * (
        32 if data_bytes is None else data_bytes)


def problem_of(tmp_path: Path, data: bytes) -> str | None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    return _safetensors.problem(str(path))


@BOUNDARY
def test_safetensors_tensors_must_end_where_the_file_ends(tmp_path: Path, delta: int) -> None:
    whole = safetensors()
    found = problem_of(tmp_path, safetensors(32 + delta))
    if delta == 0:
        assert found is None
    else:
        assert found == f"its tensors end at byte {len(whole):,}, the file has {len(whole) + delta:,}"


@BOUNDARY
def test_safetensors_header_length_must_fit_in_the_file(tmp_path: Path, delta: int) -> None:
    # A file of a header alone (no tensor in it): the length claimed is one short, exact, one past.
    raw = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    found = problem_of(tmp_path, struct.pack("<Q", len(raw) + delta) + raw)
    if delta == 1:
        assert found == f"its header claims {len(raw) + 1:,} bytes, the file has {len(raw) + 8:,}"
    elif delta == 0:
        assert found is None
    else:
        assert found is not None and found.startswith("its header is not JSON (")


@pytest.mark.parametrize("size", [7, 8])
def test_safetensors_needs_its_8_bytes_of_length(tmp_path: Path, size: int) -> None:
    found = problem_of(tmp_path, b"\0" * size)
    if size == 7:
        assert found == "is too short for a safetensors header"
    else:  # the length read, a header of 0 bytes
        assert found is not None and found.startswith("its header is not JSON (")


# -- torch.save's zip: members, then the central directory with each member's offset and size ----

_CENTRAL = b"PK\x01\x02"
_CSIZE, _NAME_LENGTH, _OFFSET = 20, 28, 42  # field offsets in a central directory entry


def torch_zip() -> bytes:
    """A zip laid out as torch.save lays it out (``<archive>/data.pkl``, ``<archive>/version``), stored."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00." * 20)
        archive.writestr("archive/version", b"3\n")
    return buffer.getvalue()


def central_entry(data: bytes, member: str) -> int:
    """Where ``member``'s entry starts in the central directory of ``data`` (no zip comment)."""
    start = int(struct.unpack_from("<L", data, len(data) - 22 + 16)[0])
    while data[start:start + 4] == _CENTRAL:
        name_length, extra_length, comment_length = struct.unpack_from("<3H", data, start + _NAME_LENGTH)
        if data[start + 46:start + 46 + name_length] == member.encode():
            return start
        start += 46 + name_length + extra_length + comment_length
    raise AssertionError(f"no {member} in the central directory")


def with_field(data: bytes, member: str, field: int, value: int) -> bytes:
    at = central_entry(data, member) + field
    return data[:at] + struct.pack("<L", value) + data[at + 4:]


def zip_problem(tmp_path: Path, data: bytes) -> str | None:
    path = tmp_path / "optimizer.bin"
    path.write_bytes(data)
    return _torch_zip.problem(str(path))


@BOUNDARY
def test_a_zip_member_s_bytes_must_end_inside_the_file(tmp_path: Path, delta: int) -> None:
    # The last member's compressed size stretched to end one byte before the file's end, at it, past it.
    data = torch_zip()
    member = "archive/version"
    (offset,) = struct.unpack_from("<L", data, central_entry(data, member) + _OFFSET)
    name_length, extra_length = struct.unpack_from("<2H", data, offset + 26)
    start = offset + 30 + name_length + extra_length
    found = zip_problem(tmp_path, with_field(data, member, _CSIZE, len(data) + delta - start))
    if delta == 1:
        assert found == f"member {member} ends at byte {len(data) + 1:,}, past the file's end ({len(data):,} bytes)"
    else:
        assert found is None
    assert zip_problem(tmp_path, data) is None


@BOUNDARY
def test_a_zip_member_s_local_header_must_lie_inside_the_file(tmp_path: Path, delta: int) -> None:
    # The central directory puts the member's local header (30 bytes and its name) ending one byte
    # before the file's end, at it, past it: past it is "past the end"; inside, no header is there.
    data = torch_zip()
    member = "archive/version"
    offset = len(data) - 30 - len(member) + delta
    found = zip_problem(tmp_path, with_field(data, member, _OFFSET, offset))
    if delta == 1:
        assert found == f"member {member} starts at byte {offset:,}, past the file's end ({len(data):,} bytes)"
    else:
        assert found == f"member {member} has no local header at byte {offset:,}, where the central directory puts it"


# -- the sizes a record keeps ------------------------------------------------------------------


@BOUNDARY
def test_a_recorded_file_must_have_its_recorded_size_exactly(tmp_path: Path, delta: int) -> None:
    with StatusStore(tmp_path / "training_status.json") as store:
        checkpoints = CheckpointList(store, "Walker", keep=None, root=tmp_path)
        for steps, name in ((100, "a"), (200, "b")):
            (tmp_path / f"{name}.pt").write_bytes(b"x" * 1000)
            checkpoints.add(steps, f"{name}.pt")
        (tmp_path / "b.pt").write_bytes(b"y" * (1000 + delta))  # rewritten: one byte off, or the same size
        if delta == 0:
            assert checkpoints.latest()["steps"] == 200  # type: ignore[index]
            return
        with pytest.warns(TrainingStatusCheckpointWarning) as caught:
            assert checkpoints.latest()["steps"] == 100  # type: ignore[index]
    assert f"steps 200 (b.pt has {1000 + delta:,} bytes, 1,000 recorded)" in str(caught[0].message)
