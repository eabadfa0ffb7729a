"""What ``integrations._ranks.views`` does on one host's side, without a process group: no torch is
needed, so these run in the default suite. The collectives themselves run in the integrations'
tests (tests/test_integration_dcp.py, tests/test_integration_accelerate.py, ...)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from trainstatus.integrations._ranks import views


def test_files_another_rank_renames_during_the_sync_are_passed_by(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A temp file renamed to model.safetensors, and folders removed, while the host's walk syncs the
    # folder. (Measured when every rank walked before the barrier, Accelerate, 2 processes, a save
    # every step on two busy cores: "syncing .../checkpoint_8/.tmp0zVOOz failed (No such file or
    # directory)", and the record failed. The walk now follows the barrier; a library's own
    # clean-up can still remove a file under it.)
    folder = tmp_path / "checkpoints" / "checkpoint_8"
    for name in ("scratch", "shards"):  # removed before the walk reaches it, and once it listed it
        (folder / name).mkdir(parents=True)
        (folder / name / "part").write_bytes(b"p")
    (folder / "random_states_1.pkl").write_bytes(b"1" * 10)
    temp = folder / ".tmp0zVOOz"
    temp.write_bytes(b"weights")
    real = os.open
    synced: list[str] = []

    def opening(path: Any, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == str(temp) and temp.exists():
            os.replace(temp, folder / "model.safetensors")
            shutil.rmtree(folder / "scratch")
        if os.fspath(path) == str(folder / "shards" / "part"):
            shutil.rmtree(folder / "shards")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(views._atomic, "sync_file", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    seen = views.survey(str(folder), str(tmp_path / "training_status.json"))
    assert synced == [str(folder / "random_states_1.pkl")]
    assert seen == {"random_states_1.pkl": 10}


def test_the_checkpoint_folder_itself_gone_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "checkpoint_8"
    with pytest.raises(FileNotFoundError):
        views.survey(str(folder), str(tmp_path / "training_status.json"))
    # Gone while it was synced (removed by hand, or by a rank that had no business doing so).
    folder.mkdir()
    (folder / "random_states_0.pkl").write_bytes(b"0")
    monkeypatch.setattr(views._atomic, "sync_file", lambda fd: shutil.rmtree(folder))
    with pytest.raises(FileNotFoundError):
        views.survey(str(folder), str(tmp_path / "training_status.json"))


def test_a_machine_whose_proc_cannot_tell_is_a_host_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without /proc's boot id and mount namespace, a rank is a host of its own (it walks and checks
    # for itself): its key names this process by a random token, never by a pid, which processes of
    # two machines may share.
    from trainstatus.integrations._ranks import hosts

    place = hosts.Distributed()
    key = place.machine()
    assert key.startswith(f"{place.host()}/") and str(os.getpid()) not in key.split("/")[1:]
    real = os.stat

    def no_proc(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(path).startswith("/proc/"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", no_proc)
    alone = place.machine()
    assert alone == f"{place.host()}/process {hosts._PROCESS_TOKEN}" and alone != key
    assert str(os.getpid()) not in alone
