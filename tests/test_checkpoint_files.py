"""Checkpoint folders and recorded sizes (_checkpoints/files.py, and their use in CheckpointList).

A checkpoint may be a folder (Transformers' ``checkpoint-500/``): the entry lists the folder as
``file_path`` and every file in it, with its size, in ``files``. Plain files get their sizes there
too. A listed file of another size than recorded makes the entry unusable, as a missing one does;
entries without ``files`` (ML-Agents', older trainstatus) are checked for existence only.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from _helpers import read_fresh, write

from trainstatus import CheckpointList, StatusStore, TrainingStatusCheckpointWarning
from trainstatus._cli import base as _cli, main as _cli_main
from trainstatus._checkpoints.files import changed_files
from trainstatus._checkpoints.files import missing_files

FOLDER = {"model.safetensors": b"w" * 10, "trainer_state.json": b"{}", "optim/state.pt": b"o" * 3}


@pytest.fixture
def store(tmp_path: Path) -> Any:
    opened = StatusStore(tmp_path / "run_logs" / "training_status.json")
    yield opened
    opened.close()


def folder(root: Path, name: str, files: dict[str, bytes] = FOLDER) -> str:
    for inside, data in files.items():
        write(root, f"{name}/{inside}", data)
    return name


def on_disk(store: StatusStore) -> dict[str, Any]:
    return read_fresh(store.path)


# -- recording -----------------------------------------------------------------------------------


def test_a_folder_is_recorded_with_each_file_and_its_size(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Trainer", root=tmp_path)
    (tmp_path / "checkpoint-500" / "empty").mkdir(parents=True)  # a folder without files: nothing to list
    entry = checkpoints.add(500, folder(tmp_path, "checkpoint-500"), auxillary_file_paths=[write(tmp_path, "run.yaml", b"abcd")],
                            creation_time=1.0)
    # ML-Agents' fields as they are: the folder is the main path.
    assert entry == {"steps": 500, "file_path": "checkpoint-500", "reward": None, "creation_time": 1.0,
                     "auxillary_file_paths": ["run.yaml"],
                     "files": {"checkpoint-500/model.safetensors": 10, "checkpoint-500/optim/state.pt": 3,
                               "checkpoint-500/trainer_state.json": 2, "run.yaml": 4}}
    assert list(on_disk(store)["Trainer"]["checkpoints"][0]["files"]) == list(entry["files"])  # sorted, as recorded
    assert checkpoints.latest() == entry
    assert missing_files(store.to_dict(), tmp_path) == [] and changed_files(store.to_dict(), tmp_path) == []
    assert checkpoints.set_final(500, "checkpoint-500")["files"] == {
        f"checkpoint-500/{name}": len(data) for name, data in sorted(FOLDER.items())}
    assert checkpoints.final() is not None


def test_every_file_and_folder_of_a_checkpoint_folder_is_synced_before_the_record(
        tmp_path: Path, store: StatusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainstatus._checkpoints.folders as module

    synced: list[tuple[str, bool, bool]] = []  # (path, directory, recorded yet)
    real = module._fsync

    def fsync(path: str, *, directory: bool = False) -> None:
        synced.append((os.path.relpath(path, tmp_path), directory, os.path.exists(store.path)))
        real(path, directory=directory)

    monkeypatch.setattr(module, "_fsync", fsync)
    store.set("Trainer", "lesson", 1)  # the status file exists: "recorded yet" looks at the list
    CheckpointList(store, "Trainer", root=tmp_path).add(500, folder(tmp_path, "out/checkpoint-500"))
    assert [path for path, directory, _ in synced if not directory] == [
        "out/checkpoint-500/model.safetensors", "out/checkpoint-500/trainer_state.json", "out/checkpoint-500/optim/state.pt"]
    # Each folder after what it holds: the inner folder, the checkpoint folder, its parent, then above.
    assert [path for path, directory, _ in synced if directory] == [
        "out/checkpoint-500/optim", "out/checkpoint-500", "out", "."]
    assert len(synced) == 7


def test_a_folder_synced_by_the_caller_is_recorded_with_its_sizes_and_not_synced_again(
        tmp_path: Path, store: StatusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainstatus._checkpoints.folders as module

    synced: list[str] = []
    monkeypatch.setattr(module, "_fsync", lambda path, directory=False: synced.append(path))
    entry = CheckpointList(store, "Trainer", root=tmp_path).add(1, folder(tmp_path, "checkpoint-1"), synced=True)
    assert entry["files"]["checkpoint-1/model.safetensors"] == 10 and len(entry["files"]) == 3
    assert synced == []


def test_a_folder_that_cannot_be_read_is_refused_before_anything_is_written(tmp_path: Path, store: StatusStore) -> None:
    folder(tmp_path, "checkpoint-1")
    os.symlink(tmp_path / "nowhere", tmp_path / "checkpoint-1" / "broken")
    with pytest.raises(Exception) as raised:
        CheckpointList(store, "Trainer", root=tmp_path).add(1, "checkpoint-1")
    assert str(raised.value) == (
        f"Cannot record the checkpoint at steps 1 of Trainer/checkpoints in {store.path}: reading its folder "
        f"checkpoint-1 failed at {tmp_path}/checkpoint-1/broken (No such file or directory). Check the "
        "folder's permissions and links. Nothing was recorded or removed.")
    assert not os.path.exists(store.path)


# -- sizes make an entry unusable ------------------------------------------------------------------


def test_a_file_of_another_size_than_recorded_is_skipped_and_pruned(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Walker", keep=None, root=tmp_path)
    checkpoints.add(100, write(tmp_path, "models/a.pt", b"x" * 1234))
    checkpoints.add(200, write(tmp_path, "models/b.pt", b"x" * 5678))
    checkpoints.set_final(200, "models/b.pt")
    (tmp_path / "models/b.pt").write_bytes(b"x" * 1234)  # overwritten, or cut off by a full disk
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert checkpoints.latest()["steps"] == 100  # type: ignore[index]
    assert str(caught[0].message) == (
        f"Skipped 1 newer checkpoint(s) of Walker/checkpoints in {store.path}: steps 200 (models/b.pt has "
        "1,234 bytes, 5,678 recorded). Using the checkpoint at steps 100 (models/a.pt). The entries stay "
        "listed; prune_missing() drops those whose files are gone.")
    with pytest.warns(TrainingStatusCheckpointWarning, match=r"steps 200 \(models/b.pt has 1,234 bytes, 5,678 recorded\)"):
        assert checkpoints.final() is None
    assert missing_files(store.to_dict(), tmp_path) == []
    assert changed_files(store.to_dict(), tmp_path) == [
        ("Walker", "checkpoints", "models/b.pt", "models/b.pt has 1,234 bytes, 5,678 recorded"),
        ("Walker", "final_checkpoint", "models/b.pt", "models/b.pt has 1,234 bytes, 5,678 recorded")]
    assert [e["steps"] for e in checkpoints.prune_missing()] == [200]
    assert [e["steps"] for e in on_disk(store)["Walker"]["checkpoints"]] == [100]
    assert (tmp_path / "models/b.pt").exists()  # prune_missing leaves files alone


def test_an_entry_without_sizes_is_checked_for_existence_only(tmp_path: Path, store: StatusStore) -> None:
    # What ML-Agents (and trainstatus before the field) wrote; a field edited into nonsense reads the same.
    write(tmp_path, "models/a.onnx", b"a")
    entries = [{"steps": n, "file_path": "models/a.onnx", "reward": None, "creation_time": 1.0,
                "auxillary_file_paths": [], **extra}
               for n, extra in [(1, {}), (2, {"files": {"models/a.onnx": "big"}}), (3, {"files": ["models/a.onnx"]})]]
    store.set("Walker", "checkpoints", entries)
    checkpoints = CheckpointList(store, "Walker", keep=None, root=tmp_path)
    assert checkpoints.latest() == entries[2]
    assert checkpoints.prune_missing() == []
    assert changed_files(store.to_dict(), tmp_path) == []


def test_a_changed_or_missing_file_in_a_folder_makes_it_unusable(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Trainer", keep=None, root=tmp_path)
    checkpoints.add(1, folder(tmp_path, "checkpoint-1"))
    checkpoints.add(2, folder(tmp_path, "checkpoint-2"))
    checkpoints.add(3, folder(tmp_path, "checkpoint-3"))
    (tmp_path / "checkpoint-3" / "optim" / "state.pt").unlink()  # the trainer was killed while saving
    (tmp_path / "checkpoint-2" / "model.safetensors").write_bytes(b"")
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert checkpoints.latest()["steps"] == 1  # type: ignore[index]
    assert [reason for _, reason in caught[0].message.skipped] == [  # type: ignore[union-attr]
        "checkpoint-3/optim/state.pt is missing", "checkpoint-2/model.safetensors has 0 bytes, 10 recorded"]
    assert missing_files(store.to_dict(), tmp_path) == [("Trainer", "checkpoints", "checkpoint-3/optim/state.pt")]
    assert [e["steps"] for e in checkpoints.prune_missing()] == [2, 3]
    assert checkpoints.latest()["steps"] == 1  # type: ignore[index]


def test_a_file_rewritten_bigger_than_recorded_is_not_usable_either(tmp_path: Path, store: StatusStore) -> None:
    """Not only a truncated file: one overwritten by a bigger one (another run's model saved over
    it, a writer appending to it) is not the checkpoint recorded either."""
    checkpoints = CheckpointList(store, "Trainer", keep=None, root=tmp_path)
    checkpoints.add(1, write(tmp_path, "models/a.pt", b"x" * 1234))
    checkpoints.add(2, write(tmp_path, "models/b.pt", b"x" * 5678))
    checkpoints.add(3, folder(tmp_path, "checkpoint-3"))
    (tmp_path / "models/b.pt").write_bytes(b"x" * 9000)
    with open(tmp_path / "checkpoint-3" / "trainer_state.json", "ab") as f:
        f.write(b"\n")
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        assert checkpoints.latest()["steps"] == 1  # type: ignore[index]
    assert [reason for _, reason in caught[0].message.skipped] == [  # type: ignore[union-attr]
        "checkpoint-3/trainer_state.json has 3 bytes, 2 recorded", "models/b.pt has 9,000 bytes, 5,678 recorded"]
    assert changed_files(store.to_dict(), tmp_path) == [
        ("Trainer", "checkpoints", "models/b.pt", "models/b.pt has 9,000 bytes, 5,678 recorded"),
        ("Trainer", "checkpoints", "checkpoint-3/trainer_state.json", "checkpoint-3/trainer_state.json has 3 bytes, 2 recorded")]
    assert [e["steps"] for e in checkpoints.prune_missing()] == [2, 3]


def test_a_folder_replaced_by_a_file_is_not_usable(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Trainer", keep=None, root=tmp_path)
    checkpoints.add(1, write(tmp_path, "model.pt"))
    (tmp_path / "model.pt").unlink()
    folder(tmp_path, "model.pt")  # recorded as a file: a folder there now is not that checkpoint
    with pytest.warns(TrainingStatusCheckpointWarning, match=r"steps 1 \(model.pt is not a file\)"):
        assert checkpoints.latest() is None


# -- removing a dropped folder --------------------------------------------------------------------


def test_a_dropped_folder_is_removed_with_its_recorded_files_only(tmp_path: Path, store: StatusStore,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    checkpoints = CheckpointList(store, "Trainer", keep=1, root=tmp_path)
    checkpoints.add(1, folder(tmp_path, "checkpoint-1"))
    checkpoints.add(2, folder(tmp_path, "checkpoint-2"))
    assert not (tmp_path / "checkpoint-1").exists()  # its files, its inner folder, then itself
    write(tmp_path, "checkpoint-2/notes.txt", b"mine")  # nobody recorded it: not ours to remove
    with caplog.at_level(logging.DEBUG, logger="trainstatus"):
        checkpoints.add(3, folder(tmp_path, "checkpoint-3"))
    assert sorted(p.relative_to(tmp_path / "checkpoint-2").as_posix() for p in (tmp_path / "checkpoint-2").rglob("*")) == [
        "notes.txt"]
    assert f"kept folder {tmp_path}/checkpoint-2 of an old checkpoint: it holds files not recorded" in caplog.text
    assert [e["steps"] for e in checkpoints.entries()] == [3]


def test_a_dropped_folder_another_entry_lists_is_kept_whole(tmp_path: Path, store: StatusStore) -> None:
    checkpoints = CheckpointList(store, "Trainer", keep=1, root=tmp_path)
    checkpoints.add(1, folder(tmp_path, "checkpoint-1"))
    os.symlink(tmp_path, tmp_path / "alias")
    checkpoints.set_final(1, "alias/checkpoint-1")  # the same folder and files, under other names
    checkpoints.add(2, folder(tmp_path, "checkpoint-2"))
    assert [e["steps"] for e in checkpoints.entries()] == [2]
    assert sorted(p.relative_to(tmp_path / "checkpoint-1").as_posix() for p in (tmp_path / "checkpoint-1").rglob("*")) == [
        "model.safetensors", "optim", "optim/state.pt", "trainer_state.json"]
    assert checkpoints.final() is not None


def test_a_dropped_folder_that_cannot_be_removed_is_warned_about(tmp_path: Path, store: StatusStore,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints = CheckpointList(store, "Trainer", keep=1, root=tmp_path)
    checkpoints.add(1, folder(tmp_path, "checkpoint-1"))
    real = os.rmdir

    def rmdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(path).endswith("checkpoint-1"):
            raise PermissionError(13, "Permission denied", path)
        real(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", rmdir)
    with pytest.warns(TrainingStatusCheckpointWarning) as caught:
        checkpoints.add(2, folder(tmp_path, "checkpoint-2"))
    assert str(caught[0].message) == (
        f"Old checkpoints of Trainer/checkpoints in {store.path} were dropped from the list but some of "
        "their files are still on disk: steps 1: the folder checkpoint-1 could not be removed (Permission "
        "denied). They are no longer listed; remove them by hand.")
    assert [p.name for p in (tmp_path / "checkpoint-1").iterdir()] == []


# -- the command line ------------------------------------------------------------------------------


def test_check_files_and_prune_missing_report_a_changed_size(tmp_path: Path, store: StatusStore,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    checkpoints = CheckpointList(store, "Trainer", keep=None, root=tmp_path)
    checkpoints.add(1, folder(tmp_path, "checkpoint-1"))
    checkpoints.add(2, folder(tmp_path, "checkpoint-2"))
    checkpoints.set_final(2, "checkpoint-2")
    store.close()
    status = store.path
    assert _cli_main.main(["check", "--files", "--root", str(tmp_path), status]) == 0
    assert f"ok: every checkpoint file listed exists with its recorded size (12 files, under {tmp_path})" in capsys.readouterr().out
    (tmp_path / "checkpoint-2" / "model.safetensors").write_bytes(b"w" * 4)
    assert _cli_main.main(["check", "--files", "--root", str(tmp_path), status]) == _cli.EXIT_WARNINGS
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")] == [
        f"warning: Trainer/{key}: checkpoint-2/model.safetensors has 4 bytes, 10 recorded (under {tmp_path}); the "
        "checkpoint was changed since it was recorded (truncated, overwritten) and a resume from it fails: put the "
        f"file back, or {fix}"
        for key, fix in [("checkpoints", f"`trainstatus prune-missing --root {tmp_path} {status}` removes such entries"),
                         ("final_checkpoint", f"`trainstatus delete {status} Trainer final_checkpoint` removes it")]]
    assert _cli_main.main(["prune-missing", "--root", str(tmp_path), status]) == 0
    assert capsys.readouterr().out == (
        "removed from Trainer/checkpoints: step 2, checkpoint-2\n"
        "kept Trainer/final_checkpoint: checkpoint-2/model.safetensors has 4 bytes, 10 recorded; "
        f"`trainstatus delete {status} Trainer final_checkpoint` removes it\n"
        f"1 checkpoint entry removed from {status}\n")


# -- power loss ------------------------------------------------------------------------------------


def test_a_folder_checkpoint_is_listed_only_with_all_its_files_after_a_power_loss(tmp_path: Path) -> None:
    from trainstatus.testing import PowerLoss, power_losses

    run_dir = tmp_path / "run"
    (run_dir / "run_logs").mkdir(parents=True)
    with StatusStore(run_dir / "run_logs" / "training_status.json") as store:
        store.set("Trainer", "lesson", 1)
    contents = {"model.safetensors": b"m" * 5000, "trainer_state.json": b"{}", "optim/state.pt": b"o" * 3}

    def run() -> None:
        with StatusStore(run_dir / "run_logs" / "training_status.json") as store:
            checkpoints = CheckpointList(store, "Trainer", keep=3, root=run_dir)
            for steps in (100,):
                for name, data in contents.items():  # os calls only: the recorder sees each of them
                    path = run_dir / "out" / f"checkpoint-{steps}" / name
                    os.makedirs(path.parent, exist_ok=True)
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    os.write(fd, data)
                    os.close(fd)
                checkpoints.add(steps, f"out/checkpoint-{steps}")

    states = 0

    def check(loss: PowerLoss) -> None:
        nonlocal states
        states += 1
        with StatusStore(os.path.join(loss.folder, "run_logs", "training_status.json"), durable=False) as store:
            listed = store.get("Trainer", "checkpoints", [])
            for entry in listed:
                assert len(entry["files"]) == 3, str(loss)
                for name, size in entry["files"].items():
                    assert os.path.getsize(os.path.join(loss.folder, name)) == size, str(loss)
            assert missing_files(store.to_dict(), loss.folder) == [], str(loss)
            assert changed_files(store.to_dict(), loss.folder) == [], str(loss)
            steps = [e["steps"] for e in listed]
            assert steps in ([], [100]) and len(steps) >= loss.acknowledged, str(loss)

    power_losses(run, check, root=run_dir)
    assert states > 10
