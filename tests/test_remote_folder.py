"""The checkpoint-storage seam on an fsspec filesystem (``integrations/_shared/folder.py``) and the
Lightning plugin's record on an object store (``integrations/_lightning/remote.py``), by their rules.

fsspec's ``memory://`` filesystem stands for the store here: the rules (what is unlisted before an
upload, what is recorded after it, what a resume passes over and says) run in milliseconds. The
status file is local (trainstatus keeps none on ``memory://``). A real Lightning run on a real S3
server (moto, s3fs) is in tests/test_integration_lightning.py.
"""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path
from typing import Any

import fsspec
import pytest

from trainstatus import StatusStore, TrainingStatusCheckpointWarning, TrainingStatusValueError
from trainstatus.integrations._lightning import remote
from trainstatus.integrations._lightning.common import WORDS, local, refuse_remote, resume_folder, status_path
from trainstatus.integrations._shared.folder import Folder

MEMORY = fsspec.filesystem("memory")


@pytest.fixture
def folder() -> str:
    """A folder of its own on the process's memory:// filesystem (shared by every test)."""
    return f"memory://bucket-{uuid.uuid4().hex[:8]}/ckpts"


def key(url: str) -> str:
    return url[len("memory://"):]


class Uploads:
    """A CheckpointIO that uploads like Lightning's TorchCheckpointIO (the whole object at once),
    and notes what the status file listed at each upload and removal."""

    def __init__(self, status: Path, fail: bool = False) -> None:
        self.status, self.fail = status, fail
        self.seen: list[tuple[str, str, list[str]]] = []

    def listed(self) -> list[str]:
        if not self.status.exists():
            return []
        with StatusStore(self.status) as store:
            return [e["file_path"] for e in store.get("lightning", "checkpoints") or []]

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: Any = None) -> None:
        self.seen.append(("upload", path.rsplit("/", 1)[1], self.listed()))
        if self.fail:
            raise OSError("the connection was reset")
        MEMORY.pipe(key(path), b"x" * int(checkpoint["size"]))

    def remove_checkpoint(self, path: str) -> None:
        self.seen.append(("remove", path.rsplit("/", 1)[1], self.listed()))
        MEMORY.rm(key(path))


def entries(status: Path) -> list[tuple[int, str, dict[str, int]]]:
    with StatusStore(status) as store:
        return [(e["steps"], e["file_path"], e["files"]) for e in store.get("lightning", "checkpoints") or []]


def test_a_name_uploaded_again_is_unlisted_before_the_upload_and_recorded_after(folder: str, tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    io, lists = Uploads(status), {}  # type: ignore[var-annotated]
    remote.save(io, lists, str(status), {"global_step": 2, "size": 10}, f"{folder}/epoch=0-step=2.ckpt", None)
    remote.save(io, lists, str(status), {"global_step": 2, "size": 11}, f"{folder}/last.ckpt", None)
    remote.save(io, lists, str(status), {"global_step": 4, "size": 12}, f"{folder}/last.ckpt", None)
    assert io.seen == [
        ("upload", "epoch=0-step=2.ckpt", []),
        ("upload", "last.ckpt", ["epoch=0-step=2.ckpt"]),
        # last.ckpt of step 2 left the list before its object was replaced: never listed as what it is not
        ("upload", "last.ckpt", ["epoch=0-step=2.ckpt"]),
    ]
    assert entries(status) == [(2, "epoch=0-step=2.ckpt", {"epoch=0-step=2.ckpt": 10}),
                               (4, "last.ckpt", {"last.ckpt": 12})]
    assert remote.newest(folder, str(status), WORDS) == "last.ckpt"


def test_a_failed_upload_leaves_its_name_unlisted_and_the_resume_takes_the_one_before(folder: str,
                                                                                    tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    lists = {}  # type: ignore[var-annotated]
    remote.save(Uploads(status), lists, str(status), {"global_step": 2, "size": 10}, f"{folder}/a.ckpt", None)
    remote.save(Uploads(status), lists, str(status), {"global_step": 2, "size": 10}, f"{folder}/last.ckpt", None)
    with pytest.raises(OSError, match="reset"):
        remote.save(Uploads(status, fail=True), lists, str(status), {"global_step": 4, "size": 10},
                    f"{folder}/last.ckpt", None)
    assert [name for _, name, _ in entries(status)] == ["a.ckpt"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a.ckpt whole, nothing newer listed: nothing to say
        assert remote.newest(folder, str(status), WORDS) == "a.ckpt"


def test_a_removed_checkpoint_leaves_the_list_before_its_object_goes(folder: str, tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    io, lists = Uploads(status), {}  # type: ignore[var-annotated]
    remote.save(io, lists, str(status), {"global_step": 2, "size": 10}, f"{folder}/epoch=0-step=2.ckpt", None)
    remote.save(io, lists, str(status), {"global_step": 4, "size": 10}, f"{folder}/epoch=1-step=4.ckpt", None)
    remote.remove(io, lists, str(status), f"{folder}/epoch=0-step=2.ckpt")
    assert io.seen[-1] == ("remove", "epoch=0-step=2.ckpt", ["epoch=1-step=4.ckpt"])
    assert not MEMORY.exists(key(f"{folder}/epoch=0-step=2.ckpt"))


@pytest.mark.parametrize("damage", ["resized", "deleted"])
def test_the_resume_passes_over_a_changed_or_missing_object_and_says_so(folder: str, tmp_path: Path,
                                                                       damage: str) -> None:
    status = tmp_path / "status.json"
    io, lists = Uploads(status), {}  # type: ignore[var-annotated]
    for step in (2, 4):
        remote.save(io, lists, str(status), {"global_step": step, "size": 100}, f"{folder}/step={step}.ckpt", None)
    newest = key(f"{folder}/step=4.ckpt")
    if damage == "resized":
        MEMORY.pipe(newest, b"y" * 60)  # another upload under its name, of another size
    else:
        MEMORY.rm(newest)
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert remote.newest(folder, str(status), WORDS) == "step=2.ckpt"
    why = "step=4.ckpt has 60 bytes, 100 recorded" if damage == "resized" else "step=4.ckpt is missing"
    [warning] = caught
    assert str(warning.message).startswith(
        f"{folder}/step=2.ckpt is the newest whole checkpoint recorded in {status}; the newer ones cannot be "
        f"resumed from: {why}."), warning.message
    assert [name for _, name, _ in entries(status)] == ["step=2.ckpt", "step=4.ckpt"]  # nothing unlisted by a read


def test_checkpoints_nothing_recorded_are_named_and_a_fresh_folder_says_nothing(folder: str, tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert remote.newest(folder, str(status), WORDS) is None  # nothing there, nothing recorded: a fresh run
    assert not status.exists()  # a read creates nothing
    MEMORY.pipe(key(f"{folder}/epoch=0-step=2.ckpt"), b"c")  # saved without the plugin
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert remote.newest(folder, str(status), WORDS) is None
    assert str(caught[0].message).startswith(
        f"epoch=0-step=2.ckpt in {folder} is a checkpoint that {status} has never recorded"), caught[0].message


def test_a_checkpoint_given_for_its_folder_is_refused_and_a_folder_named_like_one_is_not(folder: str) -> None:
    MEMORY.pipe(key(f"{folder}/last.ckpt"), b"c")
    MEMORY.pipe(key(f"{folder}/sharded.ckpt/meta.pt"), b"m")
    MEMORY.pipe(key(f"{folder}/runs.ckpt/training_status.json"), b"{}")  # a dirpath named so: it holds the list
    MEMORY.pipe(key(f"{folder}/runs.ckpt/meta.pt"), b"m")
    for name in ("last.ckpt", "sharded.ckpt"):
        with pytest.raises(TrainingStatusValueError) as raised:
            remote.refuse_checkpoint_given(f"{folder}/{name}")
        assert str(raised.value).startswith(
            f"last_complete_checkpoint('{folder}/{name}'): {folder}/{name} is a checkpoint itself. Pass the folder "
            f"that holds the checkpoints (ModelCheckpoint's dirpath), {folder}:"), raised.value
    remote.refuse_checkpoint_given(f"{folder}/runs.ckpt")
    remote.refuse_checkpoint_given(f"{folder}/absent.ckpt")


def test_a_store_that_keeps_no_status_file_is_refused_unless_one_is_given(folder: str, tmp_path: Path) -> None:
    with pytest.raises(TrainingStatusValueError) as raised:
        remote.RemoteList(folder, None, "TrainStatusCheckpointIO")
    assert str(raised.value) == (
        f"Cannot tell where to keep the status file of ModelCheckpoint's dirpath in {folder}: its storage is the "
        "'memory' filesystem, and trainstatus keeps a status file on a local disk or on s3://, gs:// and az:// by "
        "itself. Pass status_path= (a local path, or an s3://, gs:// or az:// URL).")
    assert remote.RemoteList(folder, str(tmp_path / "s.json"), "TrainStatusCheckpointIO").path == str(tmp_path / "s.json")


def test_a_filesystem_fsspec_does_not_know_names_what_to_install() -> None:
    with pytest.raises(TrainingStatusValueError) as raised:
        Folder.of_url("nosuchstore://bucket/ckpts")
    assert str(raised.value).startswith("Cannot reach the checkpoint folder nosuchstore://bucket/ckpts: "), raised.value
    assert ("If the fsspec filesystem of that store is not installed, install it (s3fs for s3://, gcsfs for gs://, "
            "adlfs for az://)") in str(raised.value)


def test_a_folder_s_files_are_keyed_as_a_local_folder_s_and_an_object_by_its_name(folder: str) -> None:
    MEMORY.pipe(key(f"{folder}/one.ckpt"), b"12345")
    MEMORY.pipe(key(f"{folder}/sharded.ckpt/meta.pt"), b"123")
    MEMORY.pipe(key(f"{folder}/sharded.ckpt/sub/__0_0.distcp"), b"1234567")
    seen = Folder.of_url(folder)
    assert seen.sizes("one.ckpt") == {"one.ckpt": 5}
    assert seen.sizes("sharded.ckpt") == {"sharded.ckpt/meta.pt": 3, "sharded.ckpt/sub/__0_0.distcp": 7}
    assert seen.sizes("absent.ckpt") == {}
    assert (seen.kind("one.ckpt"), seen.kind("sharded.ckpt"), seen.kind("absent.ckpt")) == ("file", "directory", None)
    assert seen.children() == [("one.ckpt", "file"), ("sharded.ckpt", "directory")]
    assert seen.shown("one.ckpt") == f"{folder}/one.ckpt"  # as the user named the folder


class Callback:
    def __init__(self, dirpath: str | None) -> None:
        self.dirpath = dirpath


def test_a_remote_folder_the_strategy_cannot_have_recorded_is_refused_and_a_local_one_is_not() -> None:
    callbacks = [Callback(None), Callback("/local/ckpts"), Callback("s3://bucket/ckpts")]
    refuse_remote(callbacks, None)  # one file through CheckpointIO, the URL as given: recorded there
    refuse_remote(callbacks[:2] + [Callback("file:///local/other")], "it saves folders")  # all local
    with pytest.raises(TrainingStatusValueError) as raised:
        refuse_remote(callbacks, "it saves folders")  # why: strategies.remote_refusal's (integrations leg)
    assert str(raised.value).startswith(
        "TrainStatusCallback: the checkpoints would go to s3://bucket/ckpts, remote storage, and it saves folders, "
        "so nothing could be recorded there."), raised.value
    assert str(raised.value).endswith("Nothing was trained.")


def test_a_url_a_pathlib_path_collapsed_is_refused_never_written_locally() -> None:
    # FSDPStrategy (full state dict) hands CheckpointIO Path("s3://bucket/x.ckpt"): "s3:/bucket/x.ckpt".
    with pytest.raises(TrainingStatusValueError) as raised:
        local("s3:/bucket/ckpts/last.ckpt", "save")
    assert str(raised.value).startswith("TrainStatusCheckpointIO cannot save 's3:/bucket/ckpts/last.ckpt': it looks "
                                        "like a URL whose '//' a pathlib.Path collapsed"), raised.value
    assert local("ckpts/a:/b.ckpt", "save").endswith("ckpts/a:/b.ckpt")  # a colon inside a local path is one


def test_a_file_url_is_the_local_folder_it_names(tmp_path: Path) -> None:
    assert resume_folder(f"file://{tmp_path}") == str(tmp_path)
    with pytest.raises(TrainingStatusValueError):
        resume_folder("file://otherhost/ckpts")


def test_a_local_status_file_lost_with_its_history_kept_is_put_back(folder: str, tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    io, lists = Uploads(status), {}  # type: ignore[var-annotated]
    for step in (2, 4):
        remote.save(io, lists, str(status), {"global_step": step, "size": 10}, f"{folder}/s{step}.ckpt", None)
    for listing in lists.values():
        listing.close()
    assert [p.name for p in tmp_path.iterdir() if ".history-" in p.name], list(tmp_path.iterdir())
    status.unlink()  # the file lost, its kept versions there
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The newest version kept (the history holds the versions each write replaced): not a fresh run.
        assert remote.newest(folder, str(status), WORDS) in ("s2.ckpt", "s4.ckpt")
    assert not [w for w in caught if "never recorded" in str(w.message)], [str(w.message) for w in caught]


def test_a_remote_status_file_for_a_local_folder_is_refused(tmp_path: Path) -> None:
    # It used to be made absolute as a local path ("<cwd>/s3:/bucket/status.json"); read back as a
    # URL it would never be found, and every resume would start over.
    with pytest.raises(TrainingStatusValueError) as raised:
        status_path(str(tmp_path), "s3://bucket/status.json")
    assert str(raised.value).startswith(
        f"The status file s3://bucket/status.json is on remote storage and the checkpoints it would list are in the "
        f"local folder {tmp_path}:"), raised.value
    assert status_path(str(tmp_path), None) == str(tmp_path / "training_status.json")
