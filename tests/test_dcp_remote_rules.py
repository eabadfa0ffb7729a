"""DCP folders on an object store (``integrations/_dcp/remote.py``), by their rules, on fsspec's
``memory://`` filesystem with a local status file: what ``record`` lists and removes (``keep``),
what a resume unlists and says. No torch: the folders are objects written here, and the check of
``.metadata`` (torch's reader) is replaced where a resume needs it. Real ranks, torch's
``FsspecWriter`` and an S3 server are in tests/test_integration_dcp.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest

from trainstatus import (
    StatusStore,
    TrainingStatusCheckpointWarning,
    TrainingStatusMissingWarning,
    TrainingStatusTypeError,
    TrainingStatusValueError,
)
from trainstatus.integrations import dcp
from trainstatus.integrations._dcp import remote
from trainstatus.integrations._shared.folder import Folder

MEMORY = fsspec.filesystem("memory")


@pytest.fixture
def root() -> str:
    return f"memory://bucket-{uuid.uuid4().hex[:8]}/ckpt"


def saved(root: str, name: str, shard: int = 8) -> str:
    """A folder as DCP leaves it once every rank's save returned: shards, then .metadata."""
    base = f"{root}/{name}"[len("memory://"):]
    MEMORY.pipe(f"{base}/__0_0.distcp", b"s" * shard)
    MEMORY.pipe(f"{base}/.metadata", b"m" * 4)
    return f"{root}/{name}"


def listed(status: Path) -> list[tuple[int, str]]:
    with StatusStore(status) as store:
        return [(e["steps"], e["file_path"]) for e in store.get("dcp", "checkpoints") or []]


def test_keep_removes_the_oldest_folder_only_once_it_left_the_list(root: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    status = tmp_path / "status.json"
    seen: list[tuple[str, list[tuple[int, str]]]] = []
    removing = Folder.remove

    def remove(self: Folder, name: str) -> None:
        seen.append((name, listed(status)))
        removing(self, name)

    monkeypatch.setattr(Folder, "remove", remove)
    for step in (1, 2, 3):
        entry = remote.record(saved(root, f"step-{step}"), step, str(status), 2, None, None)
    assert entry["files"] == {"step-3/.metadata": 4, "step-3/__0_0.distcp": 8}
    assert listed(status) == [(2, "step-2"), (3, "step-3")]
    assert seen == [("step-1", [(2, "step-2"), (3, "step-3")])]  # unlisted first, removed after
    assert not MEMORY.exists(f"{root}/step-1"[len("memory://"):])


def test_a_folder_that_cannot_be_removed_is_said_and_the_record_stands(root: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    status = tmp_path / "status.json"
    remote.record(saved(root, "step-1"), 1, str(status), 1, None, None)

    def refuse(path: str, recursive: bool = False) -> None:
        raise PermissionError(13, "Access Denied")

    monkeypatch.setattr(MEMORY, "rm", refuse)
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        remote.record(saved(root, "step-2"), 2, str(status), 1, None, None)
    assert listed(status) == [(2, "step-2")]
    assert str(caught[0].message).startswith(f"{root}/step-1 was dropped from {status} by keep= but could not be "
                                             "removed"), caught[0].message


@pytest.mark.parametrize("name", ["", "..", "../other"])
def test_an_entry_edited_by_hand_never_makes_keep_remove_another_folder(root: str, tmp_path: Path,
                                                                        name: str) -> None:
    status = tmp_path / "status.json"
    with StatusStore(status) as store:
        store.set("dcp", "checkpoints", [{"steps": 0, "file_path": name, "files": {}}])
    above = saved(root.rsplit("/", 1)[0], "other")  # beside ckpt: what "../other" names
    with pytest.warns(TrainingStatusCheckpointWarning, match="Not removing"):
        remote.record(saved(root, "step-1"), 1, str(status), 1, None, None)
    assert MEMORY.exists(f"{above}/.metadata"[len("memory://"):])
    assert MEMORY.exists(f"{root}/step-1/.metadata"[len("memory://"):])


def test_a_resume_unlists_the_newer_folders_it_passes_over_and_says_so(root: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A folder passed over stays on the store; left listed, a later save into it (the run reaches
    # its step again) would be listed while half written, and a kill then leaves it loadable torn.
    status = tmp_path / "status.json"
    for step in (1, 2):
        remote.record(saved(root, f"step-{step}"), step, str(status), None, None, None)
    MEMORY.pipe(f"{root}/step-2/__0_0.distcp"[len("memory://"):], b"x")  # another upload, of another size
    monkeypatch.setattr(remote, "whole", lambda root: lambda entry: True)  # .metadata's check needs torch
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert remote.last_complete(root, str(status), None, lambda *_: None) == f"{root}/step-1"
    said = str(caught[0].message)
    assert said.startswith(f"{root}/step-1 is the newest whole checkpoint recorded in {status}; the newer ones cannot "
                           "be resumed from: step-2/__0_0.distcp has 1 bytes, 8 recorded. They are no longer listed"), said
    assert listed(status) == [(1, "step-1")]


def test_a_bucket_a_bad_keep_and_a_folder_without_metadata_are_refused(root: str, tmp_path: Path) -> None:
    status = str(tmp_path / "status.json")
    with pytest.raises(TrainingStatusValueError, match="it is a bucket, not a checkpoint folder in one"):
        remote.record("memory://bucket", 1, status, None, None, None)
    for keep, kind in ((0, TrainingStatusValueError), ("3", TrainingStatusTypeError), (True, TrainingStatusTypeError)):
        with pytest.raises(kind, match="keep= must be a number of checkpoint folders >= 1"):
            dcp.record(saved(root, "step-1"), 1, status_path=status, keep=keep)  # type: ignore[arg-type]
    MEMORY.pipe(f"{root}/step-2/__0_0.distcp"[len("memory://"):], b"s")
    with pytest.raises(OSError, match=r"Cannot record .*step-2: it has no \.metadata"):
        remote.record(f"{root}/step-2", 2, status, None, None, None)
    assert listed(tmp_path / "status.json") == []


def test_a_file_url_is_the_local_folder_it_names(tmp_path: Path) -> None:
    assert dcp._folder(f"file://{tmp_path}/step-1", "record") == str(tmp_path / "step-1")
    with pytest.raises(TrainingStatusValueError):
        dcp._folder("file://otherhost/ckpt/step-1", "record")


def test_the_status_file_of_remote_folders_is_put_back_from_its_history(root: str, tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    for step in (1, 2):
        remote.record(saved(root, f"step-{step}"), step, str(status), None, None, None)
    status.unlink()  # lost; its kept versions are there
    with pytest.warns(TrainingStatusMissingWarning, match="was put back in its place"):  # said, as for any resume
        remote.record(saved(root, "step-3"), 3, str(status), None, None, None)
    assert [name for _, name in listed(status)][-1] == "step-3" and len(listed(status)) >= 2, listed(status)


def test_entries_are_recorded_with_the_folder_s_objects_only(root: str, tmp_path: Path) -> None:
    entry: Any = remote.record(saved(root, "step-1", shard=5), 1, str(tmp_path / "s.json"), None, 0.5, None)
    assert (entry["steps"], entry["file_path"], entry["reward"], entry["files"]) == (
        1, "step-1", 0.5, {"step-1/.metadata": 4, "step-1/__0_0.distcp": 5})
