"""Faults test_atomic.py does not inject: the read of a merge, the lock, every os call of a set.

test_atomic.py fails each named step of the write protocol with EIO/ENOSPC/EACCES/EROFS/EDQUOT
and fills a pyfakefs disk. This file adds:

- a failing read while a ``set`` (or a transaction, a reload) picks up another writer's change:
  each read step (open, fstat, read) x a wide set of errnos, plus a real permission denial as an
  unprivileged user under pyfakefs;
- the same read-side errnos when a store is opened;
- a lock that cannot be taken: another process holds it (for each kind of write) or the lock file
  cannot be opened;
- SQLite-style sweeps: fail the 1st, 2nd, ... Nth os call a ``set`` makes on the status file's
  directory, for every N and several errnos, on a write that merges and cleans up and on a first
  write that creates directories.

Every time: the call raises a ``TrainingStatusError`` subclass (an ``OSError``/``TimeoutError``)
carrying the fault as its cause and the path; the file is byte-identical; no temp file remains;
the store's memory is as before the call (or, if only the directory fsync failed, the new content
is in the file and in memory); and the next ``set`` without the fault succeeds and merges.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _helpers import lock_held_by_another_process
from _crashsim import Call, Hook, Interposer, temp_name_pattern
from _helpers import process_message, read_fresh
from pyfakefs.fake_filesystem_unittest import Patcher

from trainstatus import (
    StatusStore,
    TrainingStatusError,
    TrainingStatusHistoryWarning,
    TrainingStatusLockTimeout,
    TrainingStatusReadError,
    TrainingStatusWriteError,
)

SOURCE = os.path.basename(__file__)
NAME = "status.json"
WRITE_ERRNOS = (errno.EIO, errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT)
READ_ERRNOS = (errno.EIO, errno.EACCES, errno.EPERM, errno.EMFILE, errno.ENFILE, errno.ENOMEM,
               errno.ESTALE, errno.EOVERFLOW, errno.ETIMEDOUT)
READ_STEPS = ("open", "fstat", "read")


def errno_id(value: int) -> str:
    return errno.errorcode[value]


def os_error(err: int) -> OSError:
    return OSError(err, os.strerror(err))


def read_message(path: Path, err: int) -> str:
    # Copied from _storage.messages.read_error: the message is part of the spec.
    return (f"Cannot read {path}: {os.strerror(err)}. The file was left as it is; fix its "
            "permissions or path and open the store again.")


def temps(directory: Path) -> list[str]:
    pattern = temp_name_pattern(NAME)
    return sorted(n for n in os.listdir(directory) if pattern.fullmatch(n))


class Fault(Hook):
    """Fail the os calls chosen by ``when`` (once, or every time) with ``error``.

    A failing ``close`` still closes, as on Linux, where the descriptor is gone either way.
    """

    def __init__(self, when: Callable[[Call, int], bool], error: OSError, *, once: bool = True) -> None:
        self.when = when
        self.error = error
        self.once = once
        self.calls = 0  # calls seen (that touch the root)
        self.fired = 0
        self.close: Callable[[int], None] = os.close

    def before(self, call: Call) -> None:
        self.calls += 1
        if (self.fired and self.once) or not self.when(call, self.calls):
            return
        self.fired += 1
        if call.name == "close":
            self.close(call.args[0])
        raise self.error


@contextmanager
def fault(root: Path, when: Callable[[Call, int], bool], error: OSError, *, once: bool = True) -> Iterator[Fault]:
    hook = Fault(when, error, once=once)
    interposer = Interposer(root, hook)
    hook.close = interposer.real["close"]
    with interposer:
        yield hook


def on_target(path: Path, step: str) -> Callable[[Call, int], bool]:
    """The read step ``step`` of ``path`` (an fstat/read of a descriptor opened on it)."""
    return lambda call, n: call.name == step and call.paths[0] == str(path)


# -- a failing read while merging another writer's change ---------------------------------------


def stale_store(tmp_path: Path) -> tuple[Path, StatusStore, bytes]:
    """A store whose view is older than the file: another store wrote since."""
    path = tmp_path / NAME
    mine = StatusStore(path)
    mine.set("Walker", "lesson", 1)
    other = StatusStore(path)
    other.set("Walker", "steps", 500)
    other.close()
    return path, mine, path.read_bytes()


def assert_untouched(path: Path, before: bytes, store: StatusStore, memory: dict[str, Any]) -> None:
    assert path.read_bytes() == before
    assert temps(path.parent) == []
    assert store.to_dict() == memory


def assert_recovers(path: Path, store: StatusStore) -> None:
    """Once the fault is gone the next set succeeds, merges the other writer's key and does not
    bring back the change that failed."""
    store.set("Walker", "reward", 2.5)
    on_disk = read_fresh(path)
    assert on_disk["Walker"] == {"lesson": 1, "steps": 500, "reward": 2.5}
    assert store.to_dict() == on_disk
    assert temps(path.parent) == []


@pytest.mark.parametrize("err", READ_ERRNOS, ids=errno_id)
@pytest.mark.parametrize("step", READ_STEPS)
def test_failing_read_during_the_merge_of_a_set(tmp_path: Path, step: str, err: int, reliability: Any) -> None:
    path, store, before = stale_store(tmp_path)
    memory = store.to_dict()
    with fault(tmp_path, on_target(path, step), os_error(err)) as hook:
        with pytest.raises(TrainingStatusReadError) as info:
            store.set("Walker", "lesson", 99)
    assert hook.fired == 1
    exc = info.value
    assert isinstance(exc, TrainingStatusError) and isinstance(exc, OSError)
    assert exc.__cause__ is hook.error
    assert exc.path == str(path)
    assert str(exc) == read_message(path, err)
    assert_untouched(path, before, store, memory)
    assert_recovers(path, store)
    reliability.add("faults", hook.fired, source=SOURCE)


@pytest.mark.parametrize("how", ["transaction", "delete", "clear", "save", "reload"])
@pytest.mark.parametrize("step", READ_STEPS)
def test_failing_read_during_the_merge_of_every_kind_of_write(tmp_path: Path, step: str, how: str, reliability: Any) -> None:
    path, store, before = stale_store(tmp_path)
    memory = store.to_dict()
    actions: dict[str, Callable[[], Any]] = {
        "transaction": lambda: store.transaction().__enter__(),
        "delete": lambda: store.delete("Walker", "lesson"),
        "clear": store.clear,
        "save": store.save,
        "reload": store.reload,
    }
    with fault(tmp_path, on_target(path, step), os_error(errno.EIO)) as hook:
        with pytest.raises(TrainingStatusReadError) as info:
            actions[how]()
    assert info.value.__cause__ is hook.error
    assert_untouched(path, before, store, memory)
    assert_recovers(path, store)
    reliability.add("faults", hook.fired, source=SOURCE)


def test_failing_stat_of_change_detection_reads_and_merges_anyway(tmp_path: Path, reliability: Any) -> None:
    """changed() cannot stat the file: it says "changed" and lets the read decide (here: fine)."""
    path, store, _ = stale_store(tmp_path)
    with fault(tmp_path, on_target(path, "stat"), os_error(errno.EIO)) as hook:
        store.set("Walker", "reward", 2.5)
    assert hook.fired == 1
    assert read_fresh(path)["Walker"] == {"lesson": 1, "steps": 500, "reward": 2.5}
    reliability.add("faults", hook.fired, source=SOURCE)


def test_unreadable_file_during_a_merge_as_unprivileged_user(reliability: Any) -> None:
    """A real permission denial (not injected): another user made the file unreadable after this
    store read it. pyfakefs, because the suite runs as root."""
    with Patcher(allow_root_user=False) as patcher:
        assert patcher.fs is not None
        patcher.fs.create_dir("/runs")
        path = Path("/runs") / NAME
        with StatusStore(path) as store, StatusStore(path) as other:
            store.set("Walker", "lesson", 1)
            other.set("Walker", "steps", 500)
            os.chmod(path, 0o200)  # write-only: stat works, open for reading does not
            before = (path.stat().st_ino, path.stat().st_size)
            memory = store.to_dict()
            with pytest.raises(TrainingStatusReadError) as info:
                store.set("Walker", "lesson", 99)
            assert isinstance(info.value.__cause__, PermissionError)
            assert str(info.value) == read_message(path, errno.EACCES)
            assert (path.stat().st_ino, path.stat().st_size) == before
            assert store.to_dict() == memory
            assert temps(Path("/runs")) == []
            os.chmod(path, 0o644)
            store.set("Walker", "reward", 2.5)
            assert json.loads(path.read_bytes())["Walker"] == {"lesson": 1, "steps": 500, "reward": 2.5}
    reliability.add("faults", 1, source=SOURCE)


# -- the read side when a store is opened ---------------------------------------------------------


@pytest.mark.parametrize("err", READ_ERRNOS, ids=errno_id)
@pytest.mark.parametrize("step", READ_STEPS)
def test_failing_read_at_open(tmp_path: Path, step: str, err: int, reliability: Any) -> None:
    path = tmp_path / NAME
    StatusStore(path).set("Walker", "lesson", 1)
    before, names = path.read_bytes(), sorted(os.listdir(tmp_path))
    fds = set(os.listdir("/proc/self/fd"))
    with fault(tmp_path, on_target(path, step), os_error(err)) as hook:
        with pytest.raises(TrainingStatusReadError) as info:
            StatusStore(path)
    assert info.value.__cause__ is hook.error
    assert info.value.path == str(path)
    assert str(info.value) == read_message(path, err)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == names  # nothing kept aside, nothing created
    assert set(os.listdir("/proc/self/fd")) <= fds  # the descriptor of the failed read is closed
    assert read_fresh(path)["Walker"] == {"lesson": 1}
    reliability.add("faults", hook.fired, source=SOURCE)


# -- a lock that cannot be taken ------------------------------------------------------------------

WRITES: dict[str, Callable[[StatusStore], Any]] = {
    "set": lambda s: s.set("Walker", "lesson", 99),
    "delete": lambda s: s.delete("Walker", "lesson"),
    "clear": lambda s: s.clear(),
    "save": lambda s: s.save(),
    "transaction": lambda s: s.transaction().__enter__(),
}


@pytest.mark.parametrize("how", list(WRITES))
def test_lock_held_elsewhere_times_out_naming_the_lock_file(tmp_path: Path, how: str, reliability: Any) -> None:
    path, store, before = stale_store(tmp_path)
    store._lock_timeout = 0.2  # type: ignore[attr-defined]  # opened with the default 30 s
    memory = store.to_dict()
    with lock_held_by_another_process(Path(f"{path}.lock")) as holder:
        with pytest.raises(TrainingStatusLockTimeout) as info:
            WRITES[how](store)
        exc = info.value
        assert isinstance(exc, TimeoutError) and isinstance(exc, TrainingStatusError)
        assert exc.lock_file == f"{path}.lock"
        assert exc.path == str(path)
        assert str(exc) == process_message(path, 0.2, holder)
        assert_untouched(path, before, store, memory)  # not even merged: that needs the lock
    assert_recovers(path, store)
    reliability.add("faults", 1, source=SOURCE)


def lock_message(path: Path, err: int) -> str:
    # Copied from _locking.PathLock.hold.
    return (f"Could not lock {path}: cannot open the lock file {path}.lock: {os.strerror(err)}. "
            "Nothing was written; make its directory writable (and the lock file a regular file, not "
            "a symlink).")


@pytest.mark.parametrize("err", WRITE_ERRNOS, ids=errno_id)
def test_lock_file_that_cannot_be_opened(tmp_path: Path, err: int, reliability: Any) -> None:
    path, store, before = stale_store(tmp_path)
    memory = store.to_dict()
    lock = f"{path}.lock"
    # The store keeps the lock file open between writes: it opens it again only when the file at
    # the lock path is no longer the one it holds (here: removed, and cannot be made again).
    os.unlink(lock)
    with fault(tmp_path, lambda call, n: call.name == "open" and call.paths[0] == lock, os_error(err), once=False) as hook:
        with pytest.raises(TrainingStatusWriteError) as info:
            store.set("Walker", "lesson", 99)
    exc = info.value
    assert exc.errno == err
    assert exc.lock_file == lock and exc.path == str(path)
    assert isinstance(exc.__cause__, OSError) and exc.__cause__.errno == err
    assert str(exc) == lock_message(path, err)
    assert_untouched(path, before, store, memory)
    assert_recovers(path, store)
    reliability.add("faults", hook.fired, source=SOURCE)


# -- every os call of a set, failed in turn -------------------------------------------------------


def merging_set(root: Path) -> tuple[Path, StatusStore, Callable[[], None]]:
    """A set that merges another writer's change and cleans a killed writer's temp file."""
    path, store, _ = stale_store(root)
    (root / f".{NAME}.trainstatus-0123456789abcdef.tmp").write_bytes(b'{"half": ')
    return path, store, lambda: store.set("Walker", "lesson", 99)


def first_set_in_new_directories(root: Path) -> tuple[Path, StatusStore, Callable[[], None]]:
    path = root / "results" / "run1" / NAME
    store = StatusStore(path)
    return path, store, lambda: store.set("Walker", "lesson", 99)


def check_after_fault(path: Path, store: StatusStore, before: bytes | None, memory: dict[str, Any],
                      outcome: BaseException | None, injected: OSError, temps_before: list[str]) -> list[str]:
    """What is wrong after one injected fault (empty when all is well)."""
    problems = []
    disk = path.read_bytes() if path.exists() else None
    if outcome is not None and not isinstance(outcome, TrainingStatusError):
        return [f"raised {type(outcome).__name__}: {outcome} (not a TrainingStatusError)"]
    if outcome is not None:
        chain, cause = [], outcome.__cause__
        while cause is not None:
            chain.append(cause)
            cause = cause.__cause__ or cause.__context__
        if injected not in chain and not any(isinstance(c, OSError) and c.errno == injected.errno for c in chain):
            problems.append(f"{type(outcome).__name__} does not carry the injected error as its cause")
        if getattr(outcome, "path", None) != str(path):
            problems.append(f"{type(outcome).__name__}.path is {getattr(outcome, 'path', None)!r}")
    synced_only = outcome is not None and "may not survive a power loss" in str(outcome)
    if outcome is None or synced_only:
        if disk is None or store.to_dict() != read_fresh(path):
            problems.append("memory does not match the file after a write that reports it is in the file")
        elif store.get("Walker", "lesson") != 99:
            problems.append("the change is not in the file although the set did not fail")
    else:
        if disk != before:
            problems.append(f"{type(outcome).__name__} ({outcome}) but the file changed")
        # Memory is as before the call, or, when the merge that preceded the failed write read
        # the other writer's change, what the (unchanged) file holds. Never the failed change.
        merged = not isinstance(outcome, TrainingStatusReadError) and disk is not None and store.to_dict() == read_fresh(path)
        if store.to_dict() != memory and not merged:
            problems.append(f"{type(outcome).__name__} ({outcome}) but memory changed")
    leftover = sorted(set(temps(path.parent) if path.parent.is_dir() else []) - set(temps_before))
    if leftover:
        problems.append(f"temp file(s) left: {leftover}")
    return problems


SWEEPS = {"merging set": merging_set, "first set in new directories": first_set_in_new_directories}


@pytest.mark.parametrize("sweep", list(SWEEPS))
def test_fail_every_os_call_of_a_set_in_turn(tmp_path: Path, sweep: str, reliability: Any) -> None:
    setup = SWEEPS[sweep]
    # A dry run counts the calls to fail.
    dry = tmp_path / "dry"
    dry.mkdir()
    path, _, call = setup(dry)
    with fault(dry, lambda c, n: False, os_error(errno.EIO)) as counter:
        call()
    total = counter.calls
    assert total >= 10, f"only {total} os calls seen: is the interposer still seeing the store?"

    problems: list[str] = []
    injected_count = 0
    for n in range(1, total + 1):
        for err in WRITE_ERRNOS:
            root = tmp_path / f"{n}-{err}"
            root.mkdir()
            path, store, call = setup(root)
            before = path.read_bytes() if path.exists() else None
            memory = store.to_dict()
            temps_before = temps(path.parent) if path.parent.is_dir() else []
            outcome: BaseException | None = None
            with warnings.catch_warnings(record=True) as caught, \
                    fault(root, lambda c, i, n=n: i == n, os_error(err)) as hook:
                warnings.simplefilter("always")
                try:
                    call()
                except BaseException as exc:  # noqa: BLE001 - judged below
                    outcome = exc
            if not hook.fired:
                continue  # fewer calls this time (nothing left to clean, say)
            injected_count += 1
            what = f"call {n} ({hook_name(root, n, setup)}) failing with {errno.errorcode[err]}"
            problems += [f"{what}: {p}" for p in check_after_fault(path, store, before, memory, outcome, hook.error, temps_before)]
            # The one warning a fault may cause: the replaced version could not be kept in the
            # history, and the write went on.
            for warning in caught:
                if not isinstance(warning.message, TrainingStatusHistoryWarning) or outcome is not None \
                        or warning.message.path != str(path) or os.strerror(err) not in str(warning.message):
                    problems.append(f"{what}: warned {warning.category.__name__}: {warning.message} (outcome {outcome!r})")
            try:
                store.set("Walker", "after", n)
                if read_fresh(path)["Walker"].get("after") != n or store.to_dict() != read_fresh(path):
                    problems.append(f"{what}: the next set did not write what memory holds")
            except BaseException as exc:  # noqa: BLE001
                problems.append(f"{what}: the next set, without a fault, raised {type(exc).__name__}: {exc}")
            store.close()
    reliability.add("faults", injected_count, source=SOURCE)
    assert injected_count >= total
    assert not problems, "\n".join(problems[:20]) + f"\n({len(problems)} problems)"


_NAMES: dict[tuple[str, int], str] = {}


def hook_name(root: Path, n: int, setup: Callable[..., Any]) -> str:
    """The name of the nth os call of the setup's call (from a recording run), for messages."""
    key = (setup.__name__, n)
    if key not in _NAMES:
        scratch = root.parent / f"names-{setup.__name__}"
        if not scratch.exists():
            scratch.mkdir()
            seen: list[str] = []

            class Names(Hook):
                def before(self, call: Call) -> None:
                    seen.append(f"{call.name} {os.path.basename(call.paths[0])}")

            _, _, call = setup(scratch)
            with Interposer(scratch, Names()):
                call()
            for i, name in enumerate(seen, 1):
                _NAMES[(setup.__name__, i)] = name
    return _NAMES.get(key, "?")


def test_close_error_of_the_temp_file_after_the_rename(tmp_path: Path, reliability: Any) -> None:
    """close() may report a deferred write error (NFS does). Here it comes after the rename, so
    the new content is already the file: the store must not say "The file was left as it was"
    while memory keeps the old value, nor leak the descriptor it opened on the new file.
    (Found by the sweep above; closing the temp file before the rename would avoid it.)"""
    path = tmp_path / NAME
    store = StatusStore(path)
    store.set("Walker", "lesson", 1)
    fds = set(os.listdir("/proc/self/fd"))
    pattern = temp_name_pattern(NAME)
    temp_close = lambda call, n: call.name == "close" and pattern.fullmatch(os.path.basename(call.paths[0])) is not None
    outcome: BaseException | None = None
    with fault(tmp_path, temp_close, os_error(errno.EIO)) as hook:
        try:
            store.set("Walker", "lesson", 2)
        except TrainingStatusError as exc:
            outcome = exc
    assert hook.fired == 1
    on_disk = read_fresh(path)
    assert store.to_dict() == on_disk, f"memory {store.get('Walker', 'lesson')}, file {on_disk['Walker']['lesson']}: {outcome}"
    if outcome is not None and on_disk["Walker"]["lesson"] == 2:
        assert "The file was left as it was" not in str(outcome)
    store.close()
    assert set(os.listdir("/proc/self/fd")) <= fds, "a descriptor on the new file leaked"
    reliability.add("faults", hook.fired, source=SOURCE)


def test_fault_hook_counts_and_fires_once(tmp_path: Path) -> None:
    """The harness itself: a fault fires once at the chosen call and is seen by the caller."""
    target = tmp_path / "x"
    with fault(tmp_path, lambda c, n: c.name == "open", os_error(errno.EIO)) as hook:
        with pytest.raises(OSError) as info:
            os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)  # once: the second one works
        os.close(fd)
    assert info.value is hook.error and hook.fired == 1 and hook.calls == 3
    assert stat.S_ISREG(os.stat(target).st_mode)
