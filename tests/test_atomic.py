"""The write protocol (trainstatus._storage.atomic), driven directly and through ``StatusStore.set``.

Faults are injected by replacing one named step in ``trainstatus._storage.atomic`` (real ``tmp_path``), and
by a full disk under pyfakefs. The order of the steps, the temp file's privacy, the permission bits
of the result and the creation of missing directories are checked on the real filesystem.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import shlex
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _helpers import read_fresh
from pyfakefs.fake_filesystem_unittest import Patcher

from trainstatus import CheckpointList, StatusStore, TrainingStatusWriteError
from trainstatus._storage import atomic as _atomic, filenames as _names

STEPS = ("open_temp", "write_all", "set_mode", "sync_file", "replace", "sync_directory")
BEFORE_RENAME = STEPS[:-1]
# A file's first version is put in place by a link, which fails where another writer made the file
# meanwhile (see _lock.version), instead of a rename.
FIRST_STEPS = tuple("place_new" if step == "replace" else step for step in STEPS)
ERRNOS = (errno.EIO, errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT)

# Copied from _storage.messages.write_error: the messages are part of the spec.
HINTS = {
    errno.ENOSPC: "the disk is full; free some space",
    errno.EDQUOT: "free some space or raise the quota",
    errno.EROFS: "remount the filesystem writable or use another path",
    errno.EACCES: "fix the permissions of the directory",
    errno.EPERM: "fix the permissions of the directory",
}
WRITING = "writing it"
SYNCING_DIRECTORY = "syncing its directory"
CREATING_DIRECTORY = "creating its directory"

OLD = b'{\n  "Walker": {\n    "lesson": 1\n  }\n}\n'
NEW = b'{\n  "Walker": {\n    "lesson": 2\n  }\n}\n'


def write_status_file(path: Path, mode: int) -> None:
    """A valid status file (metadata block included) written by another store, then chmod'ed."""
    other = StatusStore(path)
    other.set("Walker", "lesson", 0)
    other.close()
    os.chmod(path, mode)


def errno_id(value: int) -> str:
    return errno.errorcode[value]


def write_error_message(path: str, step: str, strerror: str, err: int, history: str = "") -> str:
    if step == SYNCING_DIRECTORY:
        outcome = "The new content is in the file but may not survive a power loss"
    else:
        outcome = "The file was left as it was"
    hint = HINTS.get(err, "check the disk and the path")
    if history and err in (errno.ENOSPC, errno.EDQUOT):  # a full disk: what the history holds
        hint = hint.replace("free some space", f"free some space {history}")
    return f"Could not save {path} ({step}): {strerror}. {outcome}; {hint}, then set the value again."


def temp_names(directory: Path | str, name: str) -> list[str]:
    return fnmatch.filter(os.listdir(directory), f".{name}.trainstatus-*.tmp")


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))




def inject(mp: pytest.MonkeyPatch, step: str, error: BaseException) -> BaseException:
    """Make ``step`` of the protocol raise ``error``.

    ``write_all`` first writes half of the data (a disk filling up mid-write); the other steps fail
    before doing anything.
    """
    real = getattr(_atomic, step)

    def failing(*args: Any) -> Any:
        if step == "write_all":
            fd, data = args
            real(fd, data[: len(data) // 2])
        raise error

    mp.setattr(_atomic, step, failing)
    return error


def os_error(err: int) -> OSError:
    return OSError(err, os.strerror(err))


def assert_memory_matches_disk(store: StatusStore) -> None:
    assert store.to_dict() == read_fresh(store.path)


# -- direct: write_atomic ------------------------------------------------------------------------


@pytest.mark.parametrize("err", ERRNOS, ids=errno_id)
@pytest.mark.parametrize("step", BEFORE_RENAME)
def test_write_atomic_fault_before_rename_leaves_target_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, err: int
) -> None:
    target = tmp_path / "status.json"
    target.write_bytes(OLD)
    os.chmod(target, 0o640)
    inode = os.stat(target).st_ino
    fds = open_fds()
    with monkeypatch.context() as mp:
        injected = inject(mp, step, os_error(err))
        with pytest.raises(OSError) as info:
            _atomic.write_atomic(str(target), NEW, durable=True, mode=0o640)
    assert info.value is injected  # the first error, not one from the clean-up
    assert target.read_bytes() == OLD
    assert os.stat(target).st_ino == inode
    assert os.listdir(tmp_path) == ["status.json"]
    assert open_fds() == fds  # the temp file's descriptor was closed too

    fd, st = _atomic.write_atomic(str(target), NEW, durable=True, mode=0o640)
    try:
        assert target.read_bytes() == NEW
        assert os.fstat(fd).st_ino == st.st_ino == os.stat(target).st_ino
    finally:
        os.close(fd)


def test_write_atomic_directory_sync_fault_reports_replaced_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "status.json"
    target.write_bytes(OLD)
    with monkeypatch.context() as mp:
        injected = inject(mp, "sync_directory", os_error(errno.EIO))
        with pytest.raises(_atomic.ReplacedNotSynced) as info:
            _atomic.write_atomic(str(target), NEW, durable=True, mode=0o644)
    exc = info.value
    try:
        assert exc.cause is injected
        assert exc.__cause__ is injected
        assert target.read_bytes() == NEW
        assert os.fstat(exc.fd).st_ino == exc.st.st_ino == os.stat(target).st_ino
        assert temp_names(tmp_path, "status.json") == []
    finally:
        os.close(exc.fd)


@pytest.mark.parametrize("step", BEFORE_RENAME)
def test_write_atomic_interrupt_before_rename_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    target = tmp_path / "status.json"
    target.write_bytes(OLD)
    with monkeypatch.context() as mp:
        inject(mp, step, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            _atomic.write_atomic(str(target), NEW, durable=True, mode=0o644)
    assert target.read_bytes() == OLD
    assert os.listdir(tmp_path) == ["status.json"]


def test_failing_cleanup_never_hides_the_first_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "status.json"
    target.write_bytes(OLD)
    real_close = os.close

    def close_then_fail(fd: int) -> None:
        real_close(fd)
        raise os_error(errno.EIO)

    def unlink_fails(path: Any, *args: Any, **kwargs: Any) -> None:
        raise os_error(errno.EACCES)

    with monkeypatch.context() as mp:
        injected = inject(mp, "sync_file", os_error(errno.ENOSPC))
        mp.setattr(os, "close", close_then_fail)
        mp.setattr(os, "unlink", unlink_fails)
        with pytest.raises(OSError) as info:
            _atomic.write_atomic(str(target), NEW, durable=True, mode=0o644)
    assert info.value is injected
    assert target.read_bytes() == OLD


def test_write_atomic_returns_pinned_descriptor_and_stat(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    fd, st = _atomic.write_atomic(str(target), NEW, durable=False, mode=0o640)
    try:
        assert target.read_bytes() == NEW
        now = os.stat(target)
        assert (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns)
        assert os.fstat(fd).st_ino == now.st_ino
        assert stat.S_IMODE(now.st_mode) == 0o640
    finally:
        os.close(fd)


# -- through StatusStore.set ---------------------------------------------------------------------


def store_with_old_value(path: Path) -> tuple[StatusStore, bytes]:
    store = StatusStore(path)
    store.set("Walker", "lesson", 1)
    return store, path.read_bytes()


def assert_error(exc: TrainingStatusWriteError, injected: OSError, path: Path, step: str, history: str = "") -> None:
    assert isinstance(exc, OSError)
    assert exc.errno == injected.errno
    assert exc.__cause__ is injected
    assert exc.path == str(path)
    assert str(exc) == write_error_message(str(path), step, os.strerror(injected.errno), injected.errno, history)  # type: ignore[arg-type]


@pytest.mark.parametrize("err", ERRNOS, ids=errno_id)
@pytest.mark.parametrize("step", BEFORE_RENAME)
def test_store_set_fault_before_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, err: int, reliability: Any
) -> None:
    reliability.add("faults", 1, source="test_atomic.py")
    path = tmp_path / "status.json"
    store, before = store_with_old_value(path)
    with monkeypatch.context() as mp:
        injected = inject(mp, step, os_error(err))
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "lesson", 2)
    assert_error(info.value, injected, path, WRITING)  # type: ignore[arg-type]
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["status.json", "status.json.lock"]
    assert store.get("Walker", "lesson") == 1
    assert_memory_matches_disk(store)

    # The fault gone, the next write works and does not bring back the failed change.
    store.set("Walker", "steps", 10)
    on_disk = read_fresh(path)
    assert on_disk["Walker"] == {"lesson": 1, "steps": 10}
    assert store.to_dict() == on_disk
    assert temp_names(tmp_path, "status.json") == []


def test_a_permission_error_names_the_denial_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The strerror says what happened; the hint after it only says what to do.
    path = tmp_path / "status.json"
    store, _ = store_with_old_value(path)
    with monkeypatch.context() as mp:
        inject(mp, "open_temp", os_error(errno.EACCES))
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "lesson", 2)
    assert str(info.value).lower().count("permission denied") == 1
    assert str(info.value) == (
        f"Could not save {path} (writing it): Permission denied. The file was left as it was; fix the "
        "permissions of the directory, then set the value again."
    )


def _checkpoint(store: StatusStore) -> str:
    with open(os.path.join(os.path.dirname(store.path), "Walker-1.onnx"), "wb") as f:
        f.write(b"weights")
    return "Walker-1.onnx"


def _list_a_missing_checkpoint(store: StatusStore) -> None:
    entry = {"steps": 1, "file_path": "gone.onnx", "reward": None, "creation_time": 1.0, "auxillary_file_paths": []}
    store.set("Walker", "checkpoints", [entry])


@pytest.mark.parametrize(("call", "todo"), [
    (lambda store: store.delete("Walker", "lesson"), "delete it again"),
    (lambda store: store.clear(), "clear the store again"),
    (lambda store: store.save(), "save again"),
    (lambda store: CheckpointList(store, "Walker", root=os.path.dirname(store.path)).add(1, _checkpoint(store)),
     "add the checkpoint again"),
    (lambda store: CheckpointList(store, "Walker", root=os.path.dirname(store.path)).set_final(1, _checkpoint(store)),
     "set the final checkpoint again"),
    (lambda store: CheckpointList(store, "Walker", root=os.path.dirname(store.path)).prune_missing(),
     "prune the missing checkpoints again"),
])
def test_a_failed_delete_clear_save_or_checkpoint_call_says_to_do_that_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: Any, todo: str) -> None:
    path = tmp_path / "status.json"
    store, _ = store_with_old_value(path)
    _list_a_missing_checkpoint(store)  # for prune_missing; a listed entry the others leave alone
    before = path.read_bytes()
    with monkeypatch.context() as mp:
        injected = inject(mp, "write_all", os_error(errno.ENOSPC))
        with pytest.raises(TrainingStatusWriteError) as info:
            call(store)
    message = str(info.value)
    assert message.startswith(f"Could not save {path} (writing it): No space left on device. The file was "
                              "left as it was; the disk is full; free some space (the history beside the file")
    assert message.endswith(f", then {todo}.") and message.count(" again") == 1
    assert info.value.__cause__ is injected and info.value.errno == errno.ENOSPC and info.value.path == str(path)
    assert path.read_bytes() == before and store.get("Walker", "lesson") == 1


@pytest.mark.parametrize("err", ERRNOS, ids=errno_id)
def test_store_set_directory_sync_fault_keeps_new_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, reliability: Any
) -> None:
    reliability.add("faults", 1, source="test_atomic.py")
    path = tmp_path / "status.json"
    store, before = store_with_old_value(path)
    with monkeypatch.context() as mp:
        injected = inject(mp, "sync_directory", os_error(err))
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "lesson", 2)
    # The rename is done: the version it replaced is in the history, which a full disk names.
    size = len(before)
    history = (f"(the history beside the file holds 1 earlier version, .status.json.history-00000001, {size} bytes "
               f"together: `trainstatus history {path} --prune --keep 0` removes it, and a store opened with a "
               "smaller history= keeps fewer)")
    assert_error(info.value, injected, path, SYNCING_DIRECTORY, history)  # type: ignore[arg-type]
    assert "may not survive a power loss" in str(info.value)
    assert read_fresh(path)["Walker"] == {"lesson": 2}
    assert store.get("Walker", "lesson") == 2
    assert_memory_matches_disk(store)
    assert temp_names(tmp_path, "status.json") == []
    # The store pins the file it wrote, so it does not mistake it for another writer's.
    storage = store._storage
    assert os.fstat(storage._pin.fd).st_ino == os.stat(path).st_ino  # type: ignore[attr-defined]
    assert not storage.changed()

    store.set("Walker", "steps", 10)
    assert read_fresh(path)["Walker"] == {"lesson": 2, "steps": 10}


def test_a_full_disk_names_the_prune_command_with_the_path_quoted_for_a_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Copied into a shell as shown, the command must get the path as one argument.
    (tmp_path / "my runs").mkdir()
    path = tmp_path / "my runs" / "status.json"
    store, _ = store_with_old_value(path)
    store.set("Walker", "lesson", 2)  # the first value is now a version in the history
    with monkeypatch.context() as mp:
        inject(mp, "write_all", os_error(errno.ENOSPC))
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "lesson", 3)
    store.close()
    command = str(info.value).split("`")[1]
    assert command == f"trainstatus history {shlex.quote(str(path))} --prune --keep 0"
    assert shlex.split(command)[2] == str(path)


@pytest.mark.parametrize("step", FIRST_STEPS)
def test_store_first_write_fault_on_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    with monkeypatch.context() as mp:
        injected = inject(mp, step, os_error(errno.EIO))
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "lesson", 2)
    assert info.value.__cause__ is injected
    assert temp_names(tmp_path, "status.json") == []
    if step == "sync_directory":
        assert store.get("Walker", "lesson") == 2
        assert_memory_matches_disk(store)
    else:
        assert not path.exists()
        assert store.get("Walker", "lesson") is None
        assert list(store.to_dict()) == ["metadata"]
    store.set("Walker", "steps", 10)
    expected = {"lesson": 2, "steps": 10} if step == "sync_directory" else {"steps": 10}
    assert read_fresh(path)["Walker"] == expected


def test_store_set_interrupted_leaves_memory_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    store, before = store_with_old_value(path)
    with monkeypatch.context() as mp:
        inject(mp, "sync_file", KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            store.set("Walker", "lesson", 2)
    assert path.read_bytes() == before
    assert store.get("Walker", "lesson") == 1
    assert temp_names(tmp_path, "status.json") == []


def test_store_directory_creation_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run" / "status.json"
    store = StatusStore(path)
    injected = os_error(errno.EACCES)

    def refuse(directory: str, *, durable: bool) -> None:
        raise injected

    with monkeypatch.context() as mp:
        mp.setattr(_atomic, "ensure_directory", refuse)
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "lesson", 2)
    assert_error(info.value, injected, path, CREATING_DIRECTORY)
    assert not (tmp_path / "run").exists()
    assert store.get("Walker", "lesson") is None
    store.set("Walker", "lesson", 3)  # tried again on the next write
    assert read_fresh(path)["Walker"] == {"lesson": 3}


# -- pyfakefs: a full disk, a read-only directory ------------------------------------------------


def test_disk_full_through_store(fs: Any) -> None:
    fs.create_dir("/runs")
    fs.set_disk_usage(4096, "/runs")
    path = "/runs/status.json"
    # Closed on the way out: its pinned descriptor is a fake one, and a finalizer running after
    # pyfakefs is gone would close whatever real descriptor has that number.
    with StatusStore(path) as store:
        store.set("Walker", "lesson", 1)
        before = Path(path).read_bytes()

        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "checkpoints", "x" * 8192)
        exc = info.value
        assert exc.errno == errno.ENOSPC
        assert isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.ENOSPC
        assert str(exc) == write_error_message(path, WRITING, os.strerror(errno.ENOSPC), errno.ENOSPC)
        assert Path(path).read_bytes() == before
        assert temp_names("/runs", "status.json") == []
        assert store.get("Walker", "checkpoints") is None
        assert_memory_matches_disk(store)

        fs.set_disk_usage(1 << 20, "/runs")
        store.set("Walker", "checkpoints", "x" * 8192)
        assert read_fresh(path)["Walker"] == {"lesson": 1, "checkpoints": "x" * 8192}
        assert temp_names("/runs", "status.json") == []


def test_disk_full_through_write_atomic(fs: Any) -> None:
    fs.create_file("/runs/status.json", contents=OLD)
    fs.set_disk_usage(1024, "/runs")
    with pytest.raises(OSError) as info:
        _atomic.write_atomic("/runs/status.json", b"x" * 4096, durable=True, mode=0o644)
    assert info.value.errno == errno.ENOSPC
    assert Path("/runs/status.json").read_bytes() == OLD
    assert os.listdir("/runs") == ["status.json"]


def test_read_only_directory_as_unprivileged_user() -> None:
    with Patcher(allow_root_user=False) as patcher:
        fs = patcher.fs
        assert fs is not None
        fs.create_dir("/runs")
        path = "/runs/status.json"
        with StatusStore(path) as store:
            store.set("Walker", "lesson", 1)
            before = Path(path).read_bytes()
            os.chmod("/runs", 0o555)
            with pytest.raises(TrainingStatusWriteError) as info:
                store.set("Walker", "lesson", 2)
            exc = info.value
            assert exc.errno == errno.EACCES
            assert isinstance(exc.__cause__, PermissionError)
            assert str(exc) == write_error_message(path, WRITING, os.strerror(errno.EACCES), errno.EACCES)
            assert Path(path).read_bytes() == before
            assert sorted(os.listdir("/runs")) == ["status.json", "status.json.lock"]
            assert store.get("Walker", "lesson") == 1
            os.chmod("/runs", 0o755)
            store.set("Walker", "lesson", 2)
            assert read_fresh(path)["Walker"] == {"lesson": 2}


# -- order of the steps and what each one sees ----------------------------------------------------


@contextmanager
def recording(mp: pytest.MonkeyPatch, check: Callable[[str, tuple[Any, ...]], None] | None = None) -> Iterator[list[str]]:
    """Record every step of the protocol and every ``os.fsync`` (file or directory), in order."""
    calls: list[str] = []
    for step in (*STEPS, "place_new"):
        real = getattr(_atomic, step)

        def wrapper(*args: Any, _step: str = step, _real: Callable[..., Any] = real) -> Any:
            calls.append(_step)
            if check is not None:
                check(_step, args)
            return _real(*args)

        mp.setattr(_atomic, step, wrapper)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        calls.append("fsync(dir)" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync(file)")
        real_fsync(fd)

    mp.setattr(os, "fsync", fsync)
    yield calls


def test_durable_write_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    with monkeypatch.context() as mp, recording(mp) as calls:
        store.set("Walker", "lesson", 1)
        first = list(calls)
        calls.clear()
        store.set("Walker", "lesson", 2)
    expected = ["open_temp", "write_all", "set_mode", "sync_file", "fsync(file)", "replace", "sync_directory", "fsync(dir)"]
    assert first == [step if step != "replace" else "place_new" for step in expected]  # a new file: linked
    assert calls == expected


def test_write_atomic_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as mp, recording(mp) as calls:
        fd, _ = _atomic.write_atomic(str(tmp_path / "status.json"), NEW, durable=True, mode=0o644)
    os.close(fd)
    assert calls == ["open_temp", "write_all", "set_mode", "sync_file", "fsync(file)", "replace", "sync_directory", "fsync(dir)"]


def test_non_durable_write_never_syncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a" / "b" / "status.json"  # directory creation must not sync either
    store = StatusStore(path, durable=False)
    with monkeypatch.context() as mp, recording(mp) as calls:
        store.set("Walker", "lesson", 1)
        store.set("Walker", "lesson", 2)
        with store.transaction():
            store.set("Walker", "steps", 3)
    assert calls == ["open_temp", "write_all", "set_mode", "place_new", *["open_temp", "write_all", "set_mode", "replace"] * 2]
    assert read_fresh(path)["Walker"] == {"lesson": 2, "steps": 3}


def test_each_step_sees_the_right_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """0600 while written; complete, synced and with the target's mode before the rename."""
    path = tmp_path / "status.json"
    write_status_file(path, 0o644)
    old_bytes = path.read_bytes()
    store = StatusStore(path)
    seen: dict[str, Any] = {}
    temp: dict[str, str] = {}

    def check(step: str, args: tuple[Any, ...]) -> None:
        if step == "write_all":
            fd = args[0]
            seen["mode while written"] = stat.S_IMODE(os.fstat(fd).st_mode)
            seen["size before write"] = os.fstat(fd).st_size
        elif step == "replace":
            source, target = args
            temp["path"] = source
            seen["target"] = target
            seen["mode at rename"] = stat.S_IMODE(os.stat(source).st_mode)
            seen["bytes at rename"] = Path(source).read_bytes()
            seen["old file at rename"] = path.read_bytes()

    old_umask = os.umask(0)  # the 0600 must come from the library, not from the umask
    try:
        with monkeypatch.context() as mp, recording(mp, check):
            store.set("Walker", "lesson", 1)
    finally:
        os.umask(old_umask)
    assert seen["mode while written"] == 0o600
    assert seen["size before write"] == 0
    assert seen["mode at rename"] == 0o644
    assert seen["bytes at rename"] == path.read_bytes()
    assert seen["old file at rename"] == old_bytes
    assert seen["target"] == str(path)
    assert os.path.dirname(temp["path"]) == str(tmp_path)
    assert not os.path.exists(temp["path"])
    assert _names.temp_pattern("status.json").fullmatch(os.path.basename(temp["path"]))


# -- the temp file cannot be redirected -----------------------------------------------------------


def test_open_flags_are_exclusive_and_do_not_follow_links() -> None:
    for flag in (os.O_CREAT, os.O_EXCL, os.O_NOFOLLOW, os.O_WRONLY):
        assert _atomic._OPEN_FLAGS & flag == flag


def force_token_hex(mp: pytest.MonkeyPatch, names: list[str]) -> list[str]:
    """Make ``_atomic.token`` hand out ``names`` in turn (the last one forever)."""
    handed: list[str] = []

    def token_hex() -> str:
        name = names[min(len(handed), len(names) - 1)]
        handed.append(name)
        return name

    mp.setattr(_atomic, "token", token_hex)  # where _atomic draws its names from
    return handed


def plant_link(directory: Path, token: str, victim: Path) -> Path:
    link = directory / f".status.json.trainstatus-{token}.tmp"
    os.symlink(victim, link)
    return link


@pytest.mark.parametrize("victim_exists", [True, False], ids=["victim", "dangling"])
def test_symlink_at_temp_path_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim_exists: bool) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    victim = elsewhere / "victim"
    if victim_exists:
        victim.write_bytes(b"precious")
        os.chmod(victim, 0o644)
    target = run / "status.json"
    link = plant_link(run, "a" * 16, victim)
    with monkeypatch.context() as mp:
        handed = force_token_hex(mp, ["a" * 16, "b" * 16])
        fd, _ = _atomic.write_atomic(str(target), NEW, durable=True, mode=0o644)
    os.close(fd)
    assert handed == ["a" * 16, "b" * 16]  # the planted name was skipped
    assert target.read_bytes() == NEW
    assert not target.is_symlink()
    assert os.path.islink(link) and os.readlink(link) == str(victim)
    if victim_exists:
        assert victim.read_bytes() == b"precious"
        assert stat.S_IMODE(os.stat(victim).st_mode) == 0o644
    else:
        assert not victim.exists()
    assert os.listdir(elsewhere) == (["victim"] if victim_exists else [])


def test_symlink_at_temp_path_through_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    run = tmp_path / "run"
    path = run / "status.json"
    store = StatusStore(path)
    store.set("Walker", "lesson", 1)  # the first write cleans leftovers; plant after it
    plant_link(run, "a" * 16, victim)
    with monkeypatch.context() as mp:
        handed = force_token_hex(mp, ["a" * 16, "c" * 16])
        store.set("Walker", "lesson", 2)
    assert handed[:2] == ["a" * 16, "c" * 16]
    assert victim.read_bytes() == b"precious"
    assert read_fresh(path)["Walker"] == {"lesson": 2}


def test_no_free_temp_name_fails_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    run = tmp_path / "run"
    path = run / "status.json"
    store = StatusStore(path)
    store.set("Walker", "lesson", 1)
    before = path.read_bytes()
    plant_link(run, "a" * 16, victim)
    with monkeypatch.context() as mp:
        handed = force_token_hex(mp, ["a" * 16])
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "lesson", 2)
    exc = info.value
    assert len(handed) == 100
    assert exc.errno == errno.EEXIST
    assert isinstance(exc.__cause__, FileExistsError)
    assert str(exc) == write_error_message(str(path), WRITING, "could not find a free temp file name", errno.EEXIST)
    assert path.read_bytes() == before
    assert victim.read_bytes() == b"precious"
    assert store.get("Walker", "lesson") == 1
    assert temp_names(run, "status.json") == [f".status.json.trainstatus-{'a' * 16}.tmp"]  # only the planted link


# -- permission bits ------------------------------------------------------------------------------


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002, 0o027], ids=oct)
def test_new_file_mode_follows_umask(tmp_path: Path, mask: int) -> None:
    path = tmp_path / "status.json"
    with umask(mask):
        store = StatusStore(path)
        store.set("Walker", "lesson", 1)
        first = stat.S_IMODE(os.stat(path).st_mode)
        store.set("Walker", "lesson", 2)
        second = stat.S_IMODE(os.stat(path).st_mode)
    assert first == second == 0o666 & ~mask


def test_existing_file_mode_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_status_file(path, 0o640)
    with umask(0o077):  # the umask applies to new files only
        store = StatusStore(path)
        store.set("Walker", "lesson", 1)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert read_fresh(path)["Walker"] == {"lesson": 1}


def test_chmod_between_writes_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.set("Walker", "lesson", 1)
    for mode in (0o600, 0o604, 0o660):
        os.chmod(path, mode)
        store.set("Walker", "lesson", mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert read_fresh(path)["Walker"] == {"lesson": 0o660}


# -- missing directories --------------------------------------------------------------------------


def test_nested_directories_created_on_first_write_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a" / "b" / "c" / "status.json"
    store = StatusStore(path)
    assert store.get("Walker", "lesson") is None
    assert list(store.to_dict()) == ["metadata"]
    assert os.listdir(tmp_path) == []  # opening and reading created nothing

    synced: list[str] = []
    real = _atomic.sync_directory

    def sync_directory(directory: str) -> None:
        synced.append(directory)
        real(directory)

    with monkeypatch.context() as mp:
        mp.setattr(_atomic, "sync_directory", sync_directory)
        store.set("Walker", "lesson", 1)
    assert read_fresh(path)["Walker"] == {"lesson": 1}
    # Each new directory is synced into its parent, then the rename into its own directory.
    assert synced == [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b"), str(tmp_path / "a" / "b" / "c")]


def test_ensure_directory_directly(tmp_path: Path) -> None:
    deep = tmp_path / "x" / "y" / "z"
    _atomic.ensure_directory(str(deep), durable=True)
    assert deep.is_dir()
    _atomic.ensure_directory(str(deep), durable=True)  # already there: nothing to do
    assert deep.is_dir()


def test_directory_created_concurrently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process creating the directory first is not an error (and not ours to sync)."""
    deep = tmp_path / "x"
    real_mkdir = os.mkdir
    synced: list[str] = []

    def racing_mkdir(path: Any, mode: int = 0o777) -> None:
        real_mkdir(path, mode)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    monkeypatch.setattr(_atomic, "sync_directory", synced.append)
    _atomic.ensure_directory(str(deep), durable=True)
    assert deep.is_dir()
    assert synced == []


def test_directory_removed_during_a_write_is_recreated_next_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    path = run / "status.json"
    store = StatusStore(path)
    store.set("Walker", "lesson", 1)
    real_open_temp = _atomic.open_temp

    def removed_first(directory: str, name: str) -> tuple[int, str]:
        for entry in os.listdir(directory):
            os.unlink(os.path.join(directory, entry))
        os.rmdir(directory)  # someone deleted the run folder, lock file and all
        return real_open_temp(directory, name)

    with monkeypatch.context() as mp:
        mp.setattr(_atomic, "open_temp", removed_first)
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "lesson", 2)
    assert info.value.errno == errno.ENOENT
    assert str(info.value) == write_error_message(str(path), WRITING, os.strerror(errno.ENOENT), errno.ENOENT)
    assert not run.exists()
    assert store.get("Walker", "lesson") == 1
    store.set("Walker", "steps", 3)  # memory still had lesson 1: the file comes back whole
    assert read_fresh(path)["Walker"] == {"lesson": 1, "steps": 3}


@pytest.mark.parametrize("mode", [0o600, 0o644])
def test_a_write_makes_no_call_it_does_not_need(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    """Every write asked the system for random bytes (the temp file's name), for this process's
    user and group (is the file someone else's?) and set the temp file's mode even where it had it
    already (issue 23). Now: a random seed once per process, the owner known from the last write,
    and the mode set only when it is not the 0600 the temp file is made with."""
    path = tmp_path / "status.json"
    StatusStore(path).set("Walker", "lesson", 0)
    os.chmod(path, mode)
    store = StatusStore(path, durable=False)
    store.set("Walker", "lesson", 0)  # the first write of a store may look them up once
    calls: list[str] = []
    for name in ("urandom", "geteuid", "getegid", "fchmod", "fchown"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _name=name, _real=real: (calls.append(_name), _real(*a))[1])
    for i in range(5):
        store.set("Walker", "lesson", i)
    assert calls == ([] if mode == 0o600 else ["fchmod"] * 5)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    names = set()
    for _ in range(1000):
        names.add(_atomic.token())
    assert len(names) == 1000 and all(len(n) == 16 and int(n, 16) >= 0 for n in names)
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_draws_other_temp_names_than_its_parent() -> None:
    _atomic.token()  # the parent's source exists before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, " ".join(_atomic.token() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1000).decode().split()
    os.close(read)
    os.waitpid(pid, 0)
    ours = [_atomic.token() for _ in range(3)]
    assert len(child) == 3 and not set(child) & set(ours)
