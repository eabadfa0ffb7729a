"""Edges a user hits in the first hour: keywords, closing twice, options from a config, run folder gone."""

from __future__ import annotations

import contextlib
import enum
import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import _helpers
import pytest

from trainstatus import (
    GlobalTrainingStatus,
    StatusStore,
    TrainingStatusError,
    TrainingStatusTypeError,
    TrainingStatusWriteError,
)
from trainstatus._storage.closer import _closer


def test_get_takes_default_as_a_keyword_and_the_store_takes_path_as_one(tmp_path: Path) -> None:
    store = StatusStore(path=tmp_path / "status.json")
    assert store.get("wall", "lesson_num", default=0) == 0
    store.set("wall", "lesson_num", 2)
    assert store.get("wall", "lesson_num", default=0) == 2


def _descriptors_under(folder: Path) -> list[str]:
    """What this process's open descriptors name inside ``folder`` (once the background closer
    has closed what earlier writes retired: close() itself lets go of the rest at once)."""
    _closer.wait(10)
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if target.startswith(str(folder) + os.sep):
            names.append(target)
    return names


def _closed_message(path: Path) -> str:
    return f"The store on {path} is closed; open a new StatusStore to change it."


def test_close_twice_is_harmless(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    with StatusStore(path) as store:
        store.set("b", "n", 1)
        store.close()
        after_first = path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(tmp_path))
        store.close()  # inside the with block: its __exit__ closes a third time
    store.close()
    assert (path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(tmp_path))) == after_first
    assert _descriptors_under(tmp_path) == []  # the file handle was let go, once
    # Closed is closed: reads still answer from memory, every write says what to do.
    assert store.get("b", "n") == 1 and store.to_dict()["b"] == {"n": 1}
    writes = {
        "set": lambda: store.set("b", "n", 2),
        "delete": lambda: store.delete("b", "n"),
        "clear": store.clear,
        "save": store.save,
        "reload": store.reload,
        "transaction": lambda: store.transaction().__enter__(),
        "run_transaction": lambda: store.run_transaction(lambda s: s.set("b", "n", 3)),
    }
    for name, write in writes.items():
        with pytest.raises(TrainingStatusError) as raised:
            write()
        assert str(raised.value) == _closed_message(path), name
        assert raised.value.path == str(path)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == after_first[:2]
    with StatusStore(path, lock_timeout=1) as again:  # nothing of the closed store is in the way
        assert again.get("b", "n") == 1
        again.set("b", "n", 4)
    assert json.loads(path.read_bytes())["b"] == {"n": 4}


def test_closing_the_global_status_store_twice_is_harmless(tmp_path: Path) -> None:
    path = tmp_path / "run_logs" / "training_status.json"
    try:
        GlobalTrainingStatus.store().close()  # unbound: the in-memory store
        GlobalTrainingStatus.store().close()
        GlobalTrainingStatus.start_fresh(path)  # binding replaces it: the closed one is not used
        GlobalTrainingStatus.set_parameter_state("wall", "lesson_num", 1)
        before = path.read_bytes()
        GlobalTrainingStatus.store().close()
        GlobalTrainingStatus.store().close()
        with pytest.raises(TrainingStatusError) as raised:
            GlobalTrainingStatus.set_parameter_state("wall", "lesson_num", 2)
        assert str(raised.value) == _closed_message(path)
        assert GlobalTrainingStatus.get_parameter_state("wall", "lesson_num") == 1
    finally:
        GlobalTrainingStatus.reset()  # closes the bound store a third time
    assert path.read_bytes() == before
    assert _descriptors_under(tmp_path) == []


@pytest.mark.parametrize(("option", "value"), [
    ("durable", "no"), ("resume", "false"), ("strict", 1), ("allow_downgrade", "True"),
    ("lock_timeout", "5"), ("lock_timeout", True), ("metadata", ["torch", "2.1"]), ("lock", 3),
    ("storage_options", "endpoint"),
])
def test_an_option_of_the_wrong_type_is_refused_naming_it(tmp_path: Path, option: str, value: object) -> None:
    path = tmp_path / "status.json"
    with pytest.raises(TrainingStatusTypeError) as info:
        StatusStore(path, **{option: value})  # type: ignore[arg-type]
    message = str(info.value)
    assert f"{option}=" in message and repr(value) in message and str(path) in message
    assert not path.exists() and not Path(str(path) + ".lock").exists()


def test_a_string_option_says_config_values_arrive_as_strings(tmp_path: Path) -> None:
    with pytest.raises(TrainingStatusTypeError, match="config file arrive as strings"):
        StatusStore(tmp_path / "status.json", durable="no")  # type: ignore[arg-type]


def test_bytes_and_pathlike_paths_work_as_open_takes_them(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    StatusStore(os.fsencode(path)).set("b", "n", 1)
    assert StatusStore(path).get("b", "n") == 1
    with pytest.raises(TrainingStatusTypeError, match="path must be a str, bytes or os.PathLike"):
        StatusStore(42)  # type: ignore[arg-type]


def test_an_enum_with_a_non_str_value_is_named_in_the_error(tmp_path: Path) -> None:
    class Team(enum.Enum):
        BLUE = 1

    store = StatusStore(tmp_path / "status.json")
    with pytest.raises(TrainingStatusTypeError, match=r"Team\.BLUE.*the value 1 \(int\)"):
        store.set(Team.BLUE, "elo", 1200.0)


def test_a_running_store_recreates_its_deleted_run_folder(tmp_path: Path) -> None:
    run_logs = tmp_path / "results" / "run1" / "run_logs"
    store = StatusStore(run_logs / "training_status.json")
    store.set("b", "n", 1)
    shutil.rmtree(tmp_path / "results")
    store.set("b", "n", 2)
    document = json.loads((run_logs / "training_status.json").read_bytes())
    assert document["b"]["n"] == 2


def test_a_file_naming_a_key_twice_warns_and_keeps_its_bytes_before_a_write_drops_one(tmp_path: Path) -> None:
    from trainstatus import TrainingStatusCorruptWarning

    path = tmp_path / "status.json"
    original = b'{"wall": {"lesson_num": 1, "lesson_num": 3}, "metadata": {"stats_format_version": "0.3.0"}}'
    path.write_bytes(original)
    with pytest.warns(TrainingStatusCorruptWarning, match=r"wall/lesson_num appears 2 times") as record:
        store = StatusStore(path)
    kept = record[0].message.moved_to  # type: ignore[union-attr]
    assert kept is not None and Path(kept).read_bytes() == original
    assert store.get("wall", "lesson_num") == 3
    store.set("wall", "other", 1)
    assert Path(kept).read_bytes() == original


NOBODY = 65534
OWNER_CANNOT_WRITE = r"""
import os, sys
from trainstatus import StatusStore, TrainingStatusWriteError
path, mode = sys.argv[1], int(sys.argv[2], 8)
store = StatusStore(path)
store.set("b", "n", 1)
os.chmod(path, mode)
try:
    store.set("b", "n", 2)
except TrainingStatusWriteError as exc:
    print(exc)
os.chmod(path, 0o644)
store.set("b", "n", 3)
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="switches to another user (root and setpriv)")
@pytest.mark.parametrize("mode", ["000", "044"])
def test_a_status_file_its_owner_cannot_write_is_named_as_the_cause(mode: str) -> None:
    import tempfile

    # Under /tmp itself: pytest's own tmp_path is not reachable by another user.
    folder = tempfile.mkdtemp(prefix="trainstatus-mode-")
    try:
        os.chmod(folder, 0o755)
        os.chown(folder, NOBODY, NOBODY)
        path = os.path.join(folder, "status.json")

        # The checkout, its virtual environment and the interpreter it was made from may sit in a
        # folder only root can enter (a clean clone under mktemp -d, pyenv under /root): the child
        # imports copies of the package and its two dependencies from a folder everyone can read,
        # on an interpreter whose standard library everyone can read.
        site = _helpers.copy_for_nobody(Path(folder) / "site")
        python = _helpers.interpreter_for_nobody()
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(site)}
        command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                   python, "-c", OWNER_CANNOT_WRITE, path, mode]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        message = done.stdout
        assert "the file's mode is" in message and f"({int(mode, 8):#o})" in message
        assert f"chmod u+rw {path}" in message and "directory" not in message
        assert json.loads(Path(path).read_bytes())["b"]["n"] == 3
    finally:
        shutil.rmtree(folder)


# -- chattr's marks: what refuses root's writes whatever the mode says --------------------------------


@contextlib.contextmanager
def _chattr(path: Path, flag: str) -> Iterator[None]:
    """``path`` marked with ``chattr +flag`` for the block; the mark is always lifted after."""
    done = subprocess.run(["chattr", f"+{flag}", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this filesystem refuses chattr +{flag} on {path}: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", f"-{flag}", str(path)], check=True)


_needs_chattr = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("chattr") is None,
    reason="marks files immutable or append-only: needs root and chattr (e2fsprogs)")


def _refused(where: Path, flag: str, refused: str) -> str:
    what = "immutable" if flag == "i" else "append-only"
    return (f"{where} is marked {what} (chattr +{flag}), so no one, not even root, can {refused} whatever the "
            f"permissions say: lift the mark with `chattr -{flag} {where}` unless it was put there on purpose")


@_needs_chattr
@pytest.mark.parametrize(("marked", "flag", "mode"), [
    ("file", "i", 0o644), ("file", "i", 0o444), ("file", "a", 0o644), ("folder", "i", 0o644), ("folder", "a", 0o644),
], ids=["file-immutable", "file-immutable-read-only", "file-append-only", "folder-immutable", "folder-append-only"])
def test_a_write_refused_by_chattr_names_the_mark_not_the_mode(tmp_path: Path, marked: str, flag: str, mode: int) -> None:
    """As root a file's mode refuses nothing; an immutable or append-only mark on the file or its
    folder does (EPERM). The message names the mark and the command that lifts it (it used to blame
    the mode of a 0444 file, or the folder's permissions)."""
    folder = tmp_path / "run_logs"
    folder.mkdir()
    path = folder / "status.json"
    store = StatusStore(path)
    store.set("c", "k", 1)
    before = path.read_bytes()
    path.chmod(mode)
    target = path if marked == "file" else folder
    refused = "replace it" if marked == "file" else (
        "create or replace a file in it" if flag == "i" else "replace a file in it")
    where = "" if marked == "file" else "the folder "
    with _chattr(target, flag):
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("c", "k", 2)
        assert path.read_bytes() == before
    assert str(info.value) == (
        f"Could not save {path} (writing it): Operation not permitted. The file was left as it was; {where}"
        f"{_refused(target, flag, refused)}, then set the value again.")
    assert info.value.errno == errno.EPERM
    store.set("c", "k", 3)  # the mark lifted: writes again
    assert json.loads(path.read_bytes())["c"] == {"k": 3}


@_needs_chattr
def test_a_lock_file_marked_immutable_is_named(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    StatusStore(path).set("c", "k", 1)  # closed at once: the next store opens the lock file again
    lock_file = tmp_path / "status.json.lock"
    with _chattr(lock_file, "i"):
        store = StatusStore(path)
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("c", "k", 2)
    assert str(info.value) == (
        f"Could not lock {path}: cannot open the lock file {lock_file}: Operation not permitted. Nothing was "
        f"written; {_refused(lock_file, 'i', 'open it for writing')}.")
    store.set("c", "k", 3)
    assert json.loads(path.read_bytes())["c"] == {"k": 3}


@_needs_chattr
def test_where_the_marks_cannot_be_read_a_refused_write_names_both_causes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel or filesystem that does not report the flags (the ioctl fails): the message names
    a mark as the other possible cause, with the commands that show and lift it."""
    import fcntl

    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.set("c", "k", 1)

    def no_flags(fd: int, request: int, *args: object) -> object:
        raise OSError(errno.ENOTTY, os.strerror(errno.ENOTTY))

    with _chattr(path, "i"):
        monkeypatch.setattr(fcntl, "ioctl", no_flags)
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("c", "k", 2)
        monkeypatch.undo()
    assert str(info.value) == (
        f"Could not save {path} (writing it): Operation not permitted. The file was left as it was; fix the "
        f"permissions of the directory, or lift an immutable or append-only mark from {path} or {tmp_path} if "
        "one has it (`lsattr -d` shows it, `chattr -i` or `chattr -a` lifts it), then set the value again.")
