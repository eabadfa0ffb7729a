"""The storage seam (trainstatus._storage): LocalFile on a real filesystem, and Memory.

Reading, change detection and the inode pin, keeping a damaged file aside, leftovers of killed
writers (with the lock held by another process), symlinked status files, unreadable paths.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import gc
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _helpers
import pytest
from _helpers import lock_held_by_another_process, read_fresh

from trainstatus import StatusStore, TrainingStatusLockTimeout, TrainingStatusReadError
from trainstatus._storage import aside as _aside, atomic as _atomic, history as _history, filenames as _names
from trainstatus._storage import keeper as _keeper, local as _storage
from trainstatus._storage.base import Storage
from trainstatus._storage.closer import _closer
from trainstatus._storage.local import LocalFile
from trainstatus._storage.memory import Memory

STAMP = r"\d{8}T\d{6}\.\d{6}Z"
HEX16 = "0123456789abcdef"


def local(path: Path, *, durable: bool = True) -> LocalFile:
    return LocalFile(str(path), durable=durable)


def replace_by_hand(path: Path, data: bytes) -> None:
    """What another writer does: a new file renamed over the old one."""
    other = path.with_name(path.name + ".other")
    other.write_bytes(data)
    os.replace(other, path)




def assert_closed(fd: int) -> None:
    with pytest.raises(OSError) as info:
        os.fstat(fd)
    assert info.value.errno == errno.EBADF


def temp_name(name: str, token: str = HEX16) -> str:
    return f".{name}.trainstatus-{token}.tmp"


# -- reading and change detection -----------------------------------------------------------------


def test_read_missing_file(tmp_path: Path) -> None:
    storage = local(tmp_path / "status.json")
    assert storage.read() is None
    assert storage.changed() is False
    assert storage._pin.fd is None
    assert os.listdir(tmp_path) == []


def test_read_returns_bytes_and_pins_that_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b'{"a": {}}\n')
    storage = local(path)
    assert storage.read() == b'{"a": {}}\n'
    assert os.fstat(storage._pin.fd).st_ino == os.stat(path).st_ino  # type: ignore[arg-type]
    assert storage.changed() is False
    storage.close()


def test_read_large_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    data = b"x" * 300_000
    path.write_bytes(data)
    storage = local(path)
    assert storage.read() == data
    storage.close()


def test_changed_detects_creation(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    storage = local(path)
    assert storage.read() is None
    path.write_bytes(b"{}\n")
    assert storage.changed() is True


def test_changed_detects_deletion(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b"{}\n")
    storage = local(path)
    storage.read()
    path.unlink()
    assert storage.changed() is True
    storage.close()


def test_changed_detects_in_place_modification(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b"{}\n")
    storage = local(path)
    storage.read()
    with open(path, "ab") as f:
        f.write(b"  \n")
    assert storage.changed() is True
    storage.close()


def test_changed_detects_another_writers_replace(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b'{"a": {}}\n')
    storage = local(path)
    storage.read()
    replace_by_hand(path, b'{"b": {}}\n')
    assert storage.changed() is True
    storage.close()


def test_changed_detects_replace_with_same_size_and_mtime(tmp_path: Path) -> None:
    """Only the inode tells them apart, and the pin keeps the old inode number from being reused."""
    path = tmp_path / "status.json"
    path.write_bytes(b'{"a": {}}\n')
    storage = local(path)
    storage.read()
    old = os.stat(path)
    other = tmp_path / "other"
    other.write_bytes(b'{"b": {}}\n')
    os.utime(other, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(other, path)
    new = os.stat(path)
    assert (new.st_size, new.st_mtime_ns) == (old.st_size, old.st_mtime_ns)
    assert new.st_ino != old.st_ino
    assert storage.changed() is True
    storage.close()


def test_changed_when_stat_fails(tmp_path: Path) -> None:
    path = tmp_path / "run" / "status.json"
    path.parent.mkdir()
    path.write_bytes(b"{}\n")
    storage = local(path)
    storage.read()
    storage.close()
    shutil.rmtree(path.parent)
    path.parent.write_bytes(b"")  # the directory is now a file: stat raises ENOTDIR
    assert storage.changed() is True


def test_not_changed_after_own_replace(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    storage = local(path)
    assert storage.read() is None
    with storage.lock(5):
        storage.replace(b'{"a": {}}\n')
    assert storage.changed() is False
    assert path.read_bytes() == b'{"a": {}}\n'
    with storage.lock(5):
        storage.replace(b'{"b": {}}\n')
    assert storage.changed() is False
    storage.close()


def test_chmod_is_not_a_change_but_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    storage = local(path)
    with storage.lock(5):
        storage.replace(b"{}\n")
    os.chmod(path, 0o600)
    assert storage.changed() is False
    with storage.lock(5):
        storage.replace(b"{}\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    storage.close()


def test_read_io_error_is_a_read_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b"{}\n")
    storage = local(path)
    fds = set(os.listdir("/proc/self/fd"))

    def failing_read(fd: int, n: int) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with monkeypatch.context() as mp:
        mp.setattr(os, "read", failing_read)
        with pytest.raises(TrainingStatusReadError) as info:
            storage.read()
    assert str(info.value) == (
        f"Cannot read {path}: Input/output error. The file was left as it is; fix its permissions "
        "or path and open the store again."
    )
    assert info.value.path == str(path)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.EIO
    # The descriptor was closed. (Only new ones count: a store an earlier test left to the
    # garbage collector, or its closer thread, may close one of its own meanwhile.)
    assert set(os.listdir("/proc/self/fd")) - fds == set()
    assert path.read_bytes() == b"{}\n"


def test_read_symlink_loop_is_a_read_error(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    os.symlink(path, path)  # a link to itself: opening it fails with ELOOP
    with pytest.raises(TrainingStatusReadError) as info:
        StatusStore(path)
    assert str(info.value) == (
        f"Cannot read {path}: {os.strerror(errno.ELOOP)}. The file was left as it is; fix its "
        "permissions or path and open the store again."
    )
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ELOOP
    assert os.readlink(path) == str(path)
    assert os.listdir(tmp_path) == ["status.json"]


def test_read_interrupted_closes_the_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b"{}\n")
    storage = local(path)
    fds = set(os.listdir("/proc/self/fd"))

    def interrupted(fd: int, n: int) -> bytes:
        raise KeyboardInterrupt

    with monkeypatch.context() as mp:
        mp.setattr(os, "read", interrupted)
        with pytest.raises(KeyboardInterrupt):
            storage.read()
    assert set(os.listdir("/proc/self/fd")) == fds
    assert storage._pin.fd is None


# -- the inode pin --------------------------------------------------------------------------------


def test_pin_follows_each_replace_and_closes(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    storage = local(path)
    with storage.lock(5):
        storage.replace(b'{"a": {}}\n')
    first = storage._pin.fd
    assert first is not None
    assert os.fstat(first).st_ino == os.stat(path).st_ino

    with storage.lock(5):
        storage.replace(b'{"b": {}}\n')
    second = storage._pin.fd
    assert second is not None and second != first
    assert os.fstat(second).st_ino == os.stat(path).st_ino
    _closer.wait()  # closed off the writer's path, by the background closer
    assert_closed(first)  # the previous version's descriptor is released

    storage.close()
    assert storage._pin.fd is None
    assert_closed(second)
    storage.close()  # closing twice is harmless


def test_pin_closed_behind_its_back(tmp_path: Path) -> None:
    storage = local(tmp_path / "status.json")
    with storage.lock(5):
        storage.replace(b"{}\n")
    fd = storage._pin.fd
    assert fd is not None
    os.close(fd)
    storage.close()  # EBADF is not an error worth raising here
    assert storage._pin.fd is None


def test_pin_holds_the_replaced_inode(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    storage = local(path)
    with storage.lock(5):
        storage.replace(b"{}\n")
    ours = os.stat(path).st_ino
    replace_by_hand(path, b'{"x": {}}\n')
    pinned = os.fstat(storage._pin.fd)  # type: ignore[arg-type]
    assert pinned.st_ino == ours != os.stat(path).st_ino
    assert pinned.st_nlink == 0  # unlinked, but alive while pinned
    storage.close()


def test_pin_closed_when_storage_is_collected(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    storage = local(path)
    with storage.lock(5):
        storage.replace(b"{}\n")
    fd = storage._pin.fd
    assert fd is not None
    del storage
    gc.collect()
    assert_closed(fd)


def deleted_files_held_open(directory: Path) -> list[str]:
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(directory)) and target.endswith(" (deleted)"):
                held.append(target)
    return held


def test_replaced_versions_are_freed_by_the_background_closer(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    fds = set(os.listdir("/proc/self/fd"))
    for i in range(200):
        store.set("Walker", "lesson", i)
    _closer.wait()
    # Only the current version stays open (its pin); the 199 replaced ones are closed, so their
    # inodes are freed rather than piling up as deleted-but-open files.
    assert deleted_files_held_open(tmp_path) == []
    assert len(set(os.listdir("/proc/self/fd")) - fds) <= 2  # the pin, the lock file's descriptor
    assert os.fstat(store._storage._pin.fd).st_ino == os.stat(path).st_ino  # type: ignore[attr-defined]
    store.close()


def test_the_closer_restarts_in_a_forked_child(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    store.set("Walker", "lesson", 0)
    store.set("Walker", "lesson", 1)  # the closer thread runs in the parent now
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            fresh = _closer._thread is None and not _closer._queued
            child = StatusStore(path, durable=False)
            for i in range(20):
                child.set("Child", "n", i)
            _closer.wait()  # would hang forever if the child had no closer thread
            # The parent's store pins the version it wrote; the child inherited that descriptor
            # (it is the parent's to close), and no other replaced version may stay open.
            ok = fresh and len(deleted_files_held_open(tmp_path)) <= 1
            os.write(write_end, b"ok" if ok else b"bad")
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        answer = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert answer == b"ok"
    assert read_fresh(path)["Child"] == {"n": 19}
    store.close()


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_store_made_under_pyfakefs_never_closes_a_real_descriptor(tmp_path: Path) -> None:
    from pyfakefs.fake_filesystem_unittest import Patcher

    with Patcher():
        store = StatusStore("/fake/status.json")
        store.set("Walker", "lesson", 1)
        store.set("Walker", "lesson", 2)  # one pin retired, one current: both fake descriptors
        fake_fd = store._storage._pin.fd  # type: ignore[attr-defined]
    assert fake_fd is not None
    _closer.wait()
    real: list[int] = []  # the number is often a real open file already (pytest's); if not, make one
    try:
        while len(real) < 64 and not is_open(fake_fd):
            real.append(os.open(tmp_path, os.O_RDONLY))
        before = os.fstat(fake_fd)
        del store
        gc.collect()
        after = os.fstat(fake_fd)  # still open: the store closed its fake descriptor, not this one
        assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    finally:
        for fd in real:
            os.close(fd)


def test_store_pins_the_file_it_wrote(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.set("Walker", "lesson", 1)
    fd = store._storage._pin.fd  # type: ignore[attr-defined]
    assert os.fstat(fd).st_ino == os.stat(path).st_ino
    store.close()
    assert_closed(fd)


# -- keeping a damaged file aside -----------------------------------------------------------------


def aside_pattern(target: Path) -> re.Pattern[str]:
    return re.compile(re.escape(f"{target}.corrupt-") + STAMP)


def test_move_aside_keeps_bytes(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    damaged = b'{"Walker": [garbage\x00\xff'
    path.write_bytes(damaged)
    storage = local(path)
    storage.read()
    before = datetime.datetime.now(datetime.timezone.utc)
    aside = storage.move_aside()
    after = datetime.datetime.now(datetime.timezone.utc)
    assert aside_pattern(path).fullmatch(aside)
    stamp = datetime.datetime.strptime(aside.rsplit(".corrupt-", 1)[1], "%Y%m%dT%H%M%S.%fZ")
    assert before <= stamp.replace(tzinfo=datetime.timezone.utc) <= after  # in UTC
    assert Path(aside).read_bytes() == damaged
    assert not path.exists()
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(aside)]
    assert storage._pin.fd is None
    assert storage.read() is None  # nothing there any more
    assert storage.changed() is False


def freeze_clock(mp: pytest.MonkeyPatch) -> str:
    """Make move_aside's clock stand still; return the stamp it will use."""
    frozen = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> Any:
            return frozen

    mp.setattr(_aside, "datetime", types.SimpleNamespace(datetime=Frozen, timezone=datetime.timezone))
    return "20240506T070809.123456Z"


def test_move_aside_never_overwrites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    stamp = freeze_clock(monkeypatch)
    base = f"{path}.corrupt-{stamp}"
    Path(base).write_bytes(b"first aside")
    Path(base + "-1").write_bytes(b"second aside")
    path.write_bytes(b"third damaged")
    storage = local(path)

    aside = storage.move_aside()
    assert aside == base + "-2"
    assert Path(aside).read_bytes() == b"third damaged"
    assert Path(base).read_bytes() == b"first aside"
    assert Path(base + "-1").read_bytes() == b"second aside"
    assert not path.exists()

    path.write_bytes(b"fourth damaged")  # same clock again: the next free number
    assert storage.move_aside() == base + "-3"
    assert Path(base + "-3").read_bytes() == b"fourth damaged"


def test_move_aside_without_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem without hard links: the bytes are copied (exclusively, and synced) to the aside name, never over an existing name, and the original is then removed."""
    path = tmp_path / "status.json"
    stamp = freeze_clock(monkeypatch)
    base = f"{path}.corrupt-{stamp}"
    Path(base).write_bytes(b"earlier")
    path.write_bytes(b"damaged")

    def no_links(src: str, dst: str, *, follow_symlinks: bool = True) -> None:
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), src)

    monkeypatch.setattr(os, "link", no_links)
    aside = local(path).move_aside()
    assert aside == base + "-1"
    assert Path(aside).read_bytes() == b"damaged"
    assert Path(base).read_bytes() == b"earlier"
    assert not path.exists()


def test_move_aside_failure_leaves_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b"damaged")

    def read_only(src: str, dst: str, *, follow_symlinks: bool = True) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), dst)

    monkeypatch.setattr(os, "link", read_only)
    with pytest.raises(OSError) as info:
        local(path).move_aside()
    assert info.value.errno == errno.EROFS
    assert path.read_bytes() == b"damaged"
    assert os.listdir(tmp_path) == ["status.json"]


def test_move_aside_syncs_the_directory_when_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    monkeypatch.setattr(_atomic, "sync_directory", synced.append)
    for durable, expected in ((True, [str(tmp_path)]), (False, [])):
        synced.clear()
        path = tmp_path / "status.json"
        path.write_bytes(b"damaged")
        local(path, durable=durable).move_aside()
        assert synced == expected


# -- leftovers of killed writers ------------------------------------------------------------------

NOT_OURS = [
    temp_name("other.json"),  # another target's temp file
    "x.tmp",
    temp_name("status.json", HEX16[:15]),  # wrong length
    temp_name("status.json", HEX16 + "0"),
    temp_name("status.json", HEX16.upper()),  # token_hex is lower case
    temp_name("statusXjson"),  # the dot in the name is literal
    f"status.json.trainstatus-{HEX16}.tmp",  # no leading dot
    temp_name("status.json") + ".bak",
    "status.json.lock",
]


def plant(directory: Path, names: list[str]) -> None:
    for name in names:
        (directory / name).write_bytes(b"partial")


def test_leftovers_and_cleanup_only_touch_our_temp_files(tmp_path: Path) -> None:
    ours = [temp_name("status.json"), temp_name("status.json", "f" * 16)]
    plant(tmp_path, ours + NOT_OURS)
    storage = local(tmp_path / "status.json")
    assert sorted(storage.leftovers()) == sorted(str(tmp_path / n) for n in ours)
    storage.cleanup()
    assert sorted(os.listdir(tmp_path)) == sorted(NOT_OURS)
    assert storage.leftovers() == []


def test_leftovers_of_missing_directory(tmp_path: Path) -> None:
    storage = local(tmp_path / "missing" / "status.json")
    assert storage.leftovers() == []
    storage.cleanup()
    assert os.listdir(tmp_path) == []


def test_temp_pattern_matches_the_names_open_temp_makes(tmp_path: Path) -> None:
    fd, temp = _atomic.open_temp(str(tmp_path), "status.json")
    os.close(fd)
    assert _names.temp_pattern("status.json").fullmatch(os.path.basename(temp))
    assert local(tmp_path / "status.json").leftovers() == [temp]


def test_store_open_removes_stale_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    StatusStore(path).set("Walker", "lesson", 1)
    plant(tmp_path, [temp_name("status.json")] + NOT_OURS)
    store = StatusStore(path)
    assert sorted(os.listdir(tmp_path)) == sorted(["status.json", *NOT_OURS])
    assert store.get("Walker", "lesson") == 1


def test_store_removes_stale_temp_files_after_a_merge(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.set("Walker", "lesson", 1)  # the first write cleaned; later ones do not scan
    other = StatusStore(path)
    plant(tmp_path, [temp_name("status.json")])
    other_bytes = path.read_bytes().replace(b'"lesson": 1', b'"lesson": 5')
    replace_by_hand(path, other_bytes)  # a writer that may have died since
    store.set("Walker", "steps", 10)
    assert temp_name("status.json") not in os.listdir(tmp_path)
    assert read_fresh(path)["Walker"] == {"lesson": 5, "steps": 10}
    other.close()


@pytest.mark.parametrize("then", ["write", "open"])
def test_stale_temp_kept_while_another_process_holds_the_lock(tmp_path: Path, then: str) -> None:
    path = tmp_path / "status.json"
    StatusStore(path).set("Walker", "lesson", 1)
    temp = tmp_path / temp_name("status.json")
    with lock_held_by_another_process(tmp_path / "status.json.lock"):
        plant(tmp_path, [temp.name])
        store = StatusStore(path, lock_timeout=0)
        assert temp.exists()  # it may be a live writer's
        with pytest.raises(TrainingStatusLockTimeout):  # the child really holds the lock
            store.set("Walker", "lesson", 2)
        assert temp.exists()
    if then == "write":
        store.set("Walker", "lesson", 3)
    else:
        store = StatusStore(path)
    assert not temp.exists()
    assert read_fresh(path)["Walker"] == {"lesson": 3 if then == "write" else 1}


# -- symlinked status files -----------------------------------------------------------------------


def test_symlinked_status_file_is_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, shared = tmp_path / "run", tmp_path / "shared"
    run.mkdir()
    shared.mkdir()
    target = shared / "status.json"
    StatusStore(target).set("Walker", "lesson", 1)
    link = run / "status.json"
    os.symlink(target, link)

    temp_dirs: list[str] = []
    real_open_temp = _atomic.open_temp

    def open_temp(directory: str, name: str) -> tuple[int, str]:
        temp_dirs.append(directory)
        return real_open_temp(directory, name)

    monkeypatch.setattr(_atomic, "open_temp", open_temp)
    assert local(link).target == str(target)
    assert local(link).lock_file == str(target) + ".lock"
    store = StatusStore(link)
    assert store.path == str(link)
    assert store.get("Walker", "lesson") == 1
    store.set("Walker", "lesson", 2)
    store.set("Walker", "steps", 3)

    assert link.is_symlink() and os.readlink(link) == str(target)
    assert temp_dirs == [str(shared), str(shared)]
    assert os.listdir(run) == ["status.json"]  # no temp, lock, history or other file beside the link
    assert sorted(os.listdir(shared)) == [".status.json.history-00000001", ".status.json.history-00000002",
                                          "status.json", "status.json.lock"]
    assert read_fresh(target)["Walker"] == {"lesson": 2, "steps": 3}


def test_dangling_symlink_creates_the_target(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "shared" / "deeper" / "status.json"
    link = run / "status.json"
    os.symlink(target, link)
    store = StatusStore(link)  # no warning: a fresh run
    assert list(store.to_dict()) == ["metadata"]
    assert not (tmp_path / "shared").exists()
    store.set("Walker", "lesson", 1)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.is_file() and not target.is_symlink()
    assert read_fresh(link)["Walker"] == {"lesson": 1}
    assert os.listdir(run) == ["status.json"]


# -- paths that cannot be read --------------------------------------------------------------------


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_directory_in_place_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.mkdir()
    (path / "inside").write_bytes(b"keep")
    before = listing(tmp_path)
    with pytest.raises(TrainingStatusReadError) as info:
        StatusStore(path)
    assert info.value.path == str(path)
    assert str(path) in str(info.value)
    assert "it is a directory, not a status file" in str(info.value)
    assert listing(tmp_path) == before
    assert (path / "inside").read_bytes() == b"keep"


def test_directory_in_place_of_the_file_message(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.mkdir()
    with pytest.raises(TrainingStatusReadError) as info:
        StatusStore(path)
    assert str(info.value) == (
        f"Cannot read {path}: it is a directory, not a status file. Move the directory away or "
        "open the store on another path."
    )


UNPRIVILEGED_OPEN = textwrap.dedent(
    """
    import json, os, pwd, sys
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
    sys.path.insert(0, sys.argv[2])  # a copy nobody can read: the checkout may lie in a 0700 folder
    import filelock, orjson, trainstatus
    from trainstatus import StatusStore, TrainingStatusReadError
    imported = {module.__name__: module.__file__ for module in (trainstatus, filelock, orjson)}
    try:
        StatusStore(sys.argv[1])
    except TrainingStatusReadError as exc:
        cause = exc.__cause__
        print(json.dumps({"message": str(exc), "path": exc.path, "is_oserror": isinstance(exc, OSError),
                          "cause_errno": getattr(cause, "errno", None), "imported": imported}))
    else:
        print(json.dumps(None))
    """
)


@pytest.fixture
def copy_for_nobody() -> Iterator[Path]:
    """trainstatus and its dependencies copied where ``nobody`` can read them (``_helpers``)."""
    folder = Path(tempfile.mkdtemp(prefix="trainstatus-nobody-"))
    try:
        yield _helpers.copy_for_nobody(folder)
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A directory ``nobody`` can enter (pytest's tmp_path lives under a 0700 directory)."""
    directory = Path(tempfile.mkdtemp(prefix="trainstatus-"))
    os.chmod(directory, 0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to drop privileges")
def test_unreadable_file(world_readable_dir: Path, copy_for_nobody: Path) -> None:
    python = _helpers.interpreter_for_nobody()
    path = world_readable_dir / "status.json"
    StatusStore(path).set("Walker", "lesson", 1)
    os.chmod(path, 0o600)
    before = (path.read_bytes(), os.stat(path))
    files = sorted(os.listdir(world_readable_dir))
    result = subprocess.run(
        [python, "-I", "-S", "-B", "-c", UNPRIVILEGED_OPEN, str(path), str(copy_for_nobody)],
        capture_output=True, text=True, timeout=60, cwd=copy_for_nobody,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {
        "message": (
            f"Cannot read {path}: Permission denied. The file was left as it is; fix its "
            "permissions or path and open the store again."
        ),
        "path": str(path),
        "is_oserror": True,
        "cause_errno": errno.EACCES,
        "imported": {  # the copy, not the checkout nobody may not be able to read
            "trainstatus": str(copy_for_nobody / "trainstatus" / "__init__.py"),
            "filelock": str(copy_for_nobody / "filelock" / "__init__.py"),
            "orjson": str(copy_for_nobody / "orjson" / "__init__.py"),
        },
    }
    after = (path.read_bytes(), os.stat(path))
    assert after[0] == before[0]
    assert (after[1].st_ino, after[1].st_mode, after[1].st_mtime_ns) == (before[1].st_ino, before[1].st_mode, before[1].st_mtime_ns)
    assert sorted(os.listdir(world_readable_dir)) == files


# -- file mode of new files -----------------------------------------------------------------------


def no_proc(*args: Any, **kwargs: Any) -> Any:
    raise FileNotFoundError(errno.ENOENT, "no /proc")


def proc_without_umask(*args: Any, **kwargs: Any) -> Any:
    return io.BytesIO(b"Name:\tpython\nState:\tR (running)\n")  # kernels before 4.7


@pytest.mark.parametrize("proc", [None, no_proc, proc_without_umask], ids=["proc", "no-proc", "no-umask-line"])
@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077], ids=oct)
def test_default_file_mode(mask: int, proc: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    old = os.umask(mask)
    try:
        with monkeypatch.context() as mp:
            if proc is not None:  # the umask is then read by setting it, and must be put back
                mp.setattr(_storage, "open", proc, raising=False)
            assert _storage.default_file_mode() == 0o666 & ~mask
        assert os.umask(mask) == mask
    finally:
        os.umask(old)


# -- Memory ---------------------------------------------------------------------------------------


def test_memory_storage() -> None:
    memory = Memory()
    assert isinstance(memory, Storage)
    assert memory.location == "<memory>"
    assert memory.read() is None
    assert memory.changed() is False
    with memory.lock(0), memory.lock(None):  # nothing to exclude: reentrant, never times out
        memory.replace(b"{}\n")
    assert memory.read() == b"{}\n"
    assert memory.changed() is False
    memory.replace(b'{"a": {}}\n')
    assert memory.read() == b'{"a": {}}\n'
    assert memory.leftovers() == []
    memory.cleanup()
    memory.close()
    assert memory.read() == b'{"a": {}}\n'  # close releases nothing it needs


def test_storage_seam_defaults() -> None:
    base = Storage()
    for call in (base.read, base.changed, base.move_aside):
        with pytest.raises(NotImplementedError):
            call()
    with pytest.raises(NotImplementedError):
        base.replace(b"{}")
    with pytest.raises(NotImplementedError):
        base.lock(None)
    assert base.leftovers() == []
    base.cleanup()
    base.close()


def test_store_on_memory() -> None:
    memory = Memory()
    store = StatusStore._on_storage(memory)
    assert store.path == "<memory>"
    store.set("Walker", "lesson", 1)
    data = memory.read()
    assert data is not None and data.endswith(b"}\n")
    assert json.loads(data)["Walker"] == {"lesson": 1}
    assert store.get("Walker", "lesson") == 1
    # A second store on the same Memory reads what the first wrote.
    assert StatusStore._on_storage(memory).get("Walker", "lesson") == 1




def test_a_descriptor_pyfakefs_opened_is_closed_at_once_in_the_callers_thread() -> None:
    # pyfakefs answers every call with the real os while it has the original os in use
    # (FakeOsModule.use_original: its pytest plugin sets it while pytest reports), a global flag:
    # a fake descriptor closed meanwhile by the background closer's thread closed a real file with
    # that number (the crash examples lost pytest's capture file, "lost sys.stderr", in 3 runs of
    # 6). Such descriptors are closed at once, by the thread that retires them.
    from trainstatus._storage.closer import _closer

    calls: list[tuple[int, str]] = []

    def fake_close(fd: int) -> None:
        calls.append((fd, threading.current_thread().name))

    fake_close.__module__ = "pyfakefs.fake_os"  # what pyfakefs's os.close carries
    real_style: list[int] = []
    _closer.close([(1001, fake_close), (-1, real_style.append)])
    assert calls == [(1001, threading.current_thread().name)]  # done before close() returned
    _closer.wait(5)
    assert real_style == [-1]  # the others still go to the closer's thread


def test_a_single_writer_hands_the_closer_thread_one_prune_per_batch_and_unlinks_no_absent_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waking the closer thread at every write cost a quarter of a small durable=False set (issue
    23): a version the history keeps is closed by the writer, and versions pushed out of the
    history go PRUNE_BATCH at a time, by number, none probed that cannot be there."""
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False, history=4)
    for i in range(10):  # past the first prune, which lists the directory
        store.set("Walker", "lesson", i)
    _closer.wait(10)
    wakes: list[str] = []
    absent: list[str] = []
    real_start, real_unlink = _closer._start, os.unlink
    monkeypatch.setattr(_closer, "_start", lambda: (wakes.append("wake"), real_start())[1])

    def unlink(name: Any, *args: Any, **kwargs: Any) -> None:
        try:
            real_unlink(name, *args, **kwargs)
        except FileNotFoundError:
            absent.append(str(name))
            raise

    monkeypatch.setattr(os, "unlink", unlink)
    writes = 4 * _keeper.PRUNE_BATCH
    for i in range(writes):
        store.set("Walker", "lesson", 100 + i)
    assert len(wakes) <= writes // _keeper.PRUNE_BATCH
    assert deleted_files_held_open(tmp_path) == []  # the replaced versions' pins were closed
    _closer.wait(10)
    assert absent == []
    assert [v.sequence for v in _history.versions(str(tmp_path), path.name)] == list(range(writes + 6, writes + 10))
    store.close()
