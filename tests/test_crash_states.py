"""Power loss: every crash state one write can leave, under the model in ``_crashsim``.

Each scenario records the os-level operations of one real call (``set``, a transaction, a write
that first keeps a damaged file aside...) on the real file system, builds every state a power loss
after any prefix of them could leave, materializes each one and opens a ``StatusStore`` there.
The real protocol must recover the old or the new document everywhere, and the new one once the
call returned. The same checker must catch deliberately broken protocols (no fsync before the
rename, no directory fsync, writing in place, permission bits set after the rename) and
``durable=False`` must be exactly as weak as docs/guarantees.md says.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
import struct
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _crashsim
import pytest
from _crashsim import (
    BYTES_LOST,
    DAMAGED,
    HISTORY_DAMAGED,
    HISTORY_LOST,
    LEFTOVER,
    LOST,
    MODE,
    NEITHER,
    RAISED,
    FsState,
    Op,
    Report,
    Scenario,
)

from trainstatus import StatusStore, TrainingStatusCorruptWarning
from trainstatus._storage import atomic as _atomic

SOURCE = os.path.basename(__file__)
NAME = "status.json"

CHECKPOINTS = [{"steps": s, "file_path": f"results/run/Walker/Walker-{s}.onnx", "reward": s / 7,
                "creation_time": 1700000000.5 + s, "auxillary_file_paths": []} for s in (100_000, 200_000, 300_000)]


def base_document(store: StatusStore) -> None:
    """About 1.5 KB (three 512-byte blocks): enough for torn writes to matter."""
    with store.transaction():
        store.set("Walker", "checkpoints", CHECKPOINTS)
        store.set("Walker", "final_checkpoint", CHECKPOINTS[-1])
        store.set("wall_height", "lesson_num", 1)
        store.set("SoccerTwos?team=0", "elo", 1212.5)


def existing_file(root: Path, *, mode: int | None = None, target: str = NAME) -> Path:
    path = root / target
    writer = StatusStore(path)
    base_document(writer)
    writer.close()
    if mode is not None:
        os.chmod(path, mode)
    return path


# -- scenarios (the real protocol) ---------------------------------------------------------------


def first_write(root: Path) -> Callable[[], None]:
    store = StatusStore(root / NAME)
    return lambda: base_document(store)


def overwrite(root: Path) -> Callable[[], None]:
    store = StatusStore(existing_file(root))
    return lambda: store.set("wall_height", "lesson_num", 2)


def overwrite_keeps_mode(root: Path) -> Callable[[], None]:
    store = StatusStore(existing_file(root, mode=0o640))
    return lambda: store.set("Walker", "final_checkpoint", {"steps": 400_000})


def overwrite_large(root: Path) -> Callable[[], None]:
    """About 5 KB: more than six blocks, so torn writes take prefixes and one-block holes."""
    store = StatusStore(existing_file(root))
    many = [{**c, "steps": c["steps"] + i} for i in range(8) for c in CHECKPOINTS]
    return lambda: store.set("Walker", "checkpoints", many)


def stale_temp_files(root: Path) -> Callable[[], None]:
    """Two temp files of killed writers, planted after the open: the first write removes them
    (unlinks no fsync follows)."""
    path = existing_file(root)
    store = StatusStore(path)
    for token in ("0123456789abcdef", "fedcba9876543210"):
        (root / f".{NAME}.trainstatus-{token}.tmp").write_bytes(path.read_bytes()[:700])
    return lambda: store.set("wall_height", "lesson_num", 2)


def merge_with_another_writer(root: Path) -> Callable[[], None]:
    path = existing_file(root)
    mine = StatusStore(path)
    other = StatusStore(path)
    other.set("SoccerTwos?team=1", "elo", 1190.0)
    other.close()
    return lambda: mine.set("wall_height", "lesson_num", 2)  # re-reads, lays its change over


def transaction_with_delete(root: Path) -> Callable[[], None]:
    store = StatusStore(existing_file(root))

    def call() -> None:
        with store.transaction():
            store.set("wall_height", "lesson_num", 2)
            store.set("big_wall", "lesson_num", 0)
            store.delete("SoccerTwos?team=0", "elo")

    return call


def new_directories(root: Path) -> Callable[[], None]:
    store = StatusStore(root / "results" / "run1" / NAME)
    return lambda: store.set("wall_height", "lesson_num", 1)


GARBAGE = b'{"Walker": {"checkpoints": [{"steps": 1000, "file_path": "x"}], "wall_he'


def damaged_then_written(root: Path) -> Callable[[], None]:
    """Another party garbled the file in place; the write keeps it aside, then writes."""
    path = existing_file(root)
    store = StatusStore(path)
    with open(path, "r+b") as f:  # in place, same inode
        f.write(GARBAGE)
        f.truncate()

    def call() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrainingStatusCorruptWarning)
            store.set("wall_height", "lesson_num", 2)

    return call


SCENARIOS = [
    Scenario("first write", NAME, first_write),
    Scenario("overwrite", NAME, overwrite),
    Scenario("overwrite keeps mode 0640", NAME, overwrite_keeps_mode),
    Scenario("overwrite, 10 blocks", NAME, overwrite_large),
    Scenario("stale temp files cleaned", NAME, stale_temp_files),
    Scenario("merge with another writer", NAME, merge_with_another_writer),
    Scenario("transaction with a delete", NAME, transaction_with_delete),
    Scenario("new directories", f"results/run1/{NAME}", new_directories),
    Scenario("damaged file kept aside, then written", NAME, damaged_then_written, must_survive=(GARBAGE,)),
]


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name.replace(" ", "-"))
def test_real_protocol_recovers_old_or_new_in_every_crash_state(tmp_path: Path, scenario: Scenario, reliability: Any) -> None:
    report = _crashsim.check(scenario, tmp_path)
    assert report.violations == [], report.summary()
    # The model gave something to check: states before the rename, after it, after the return.
    assert report.states >= len(report.ops) + 1
    assert any(op.kind in ("rename", "link") for op in report.ops)  # a first version is linked
    reliability.add("crash_states", report.states, source=SOURCE)
    reliability.add("damaged_files", report.damaged, source=SOURCE)


def test_durable_false_is_as_weak_as_documented(tmp_path: Path, reliability: Any) -> None:
    """docs/guarantees.md: without fsyncs a power loss may lose the last write or leave a damaged file
    (kept aside by the next open); nothing else, and never an error at open."""

    def overwrite_not_durable(root: Path) -> Callable[[], None]:
        store = StatusStore(existing_file(root), durable=False)
        return lambda: store.set("wall_height", "lesson_num", 2)

    report = _crashsim.check(Scenario("overwrite, durable=False", NAME, overwrite_not_durable), tmp_path)
    assert not any(op.kind in ("fsync", "fdatasync", "dirsync") for op in report.ops)
    assert {LOST, DAMAGED} <= report.kinds(), report.summary()
    # The temp file's 0600 may also outlive its chmod (nothing synced the inode).
    # So may the history's newest version: its link is made durable by the same directory fsync.
    assert report.kinds() <= {LOST, DAMAGED, MODE, HISTORY_LOST}, report.summary()
    reliability.add("broken_checked", report.states, source=SOURCE)
    reliability.add("broken_caught", len(report.violations), source=SOURCE)
    reliability.add("damaged_files", report.damaged, source=SOURCE)


# -- broken protocols: the checker must catch each ------------------------------------------------


def _temp_for(target: str) -> tuple[int, str]:
    directory, name = os.path.split(target)
    temp = os.path.join(directory, f".{name}.trainstatus-{secrets.token_hex(8)}.tmp")
    return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), temp


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _sync_directory(target: str) -> None:
    fd = os.open(os.path.dirname(target), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pin(path: str) -> tuple[int, os.stat_result]:
    pin = os.open(path, os.O_RDONLY)
    return pin, os.fstat(pin)


def no_fsync_before_rename(target: str, data: bytes, *, mode: int, **_: Any) -> tuple[int, os.stat_result]:
    fd, temp = _temp_for(target)
    _write(fd, data)
    os.fchmod(fd, stat.S_IMODE(mode))
    pin = _pin(temp)
    os.replace(temp, target)
    os.close(fd)
    _sync_directory(target)
    return pin


def no_directory_fsync(target: str, data: bytes, *, mode: int, **_: Any) -> tuple[int, os.stat_result]:
    fd, temp = _temp_for(target)
    _write(fd, data)
    os.fchmod(fd, stat.S_IMODE(mode))
    os.fsync(fd)
    pin = _pin(temp)
    os.replace(temp, target)
    os.close(fd)
    return pin


def in_place(target: str, data: bytes, *, mode: int, **_: Any) -> tuple[int, os.stat_result]:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IMODE(mode))
    _write(fd, data)
    os.fsync(fd)
    os.close(fd)
    _sync_directory(target)
    return _pin(target)


def mode_after_rename(target: str, data: bytes, *, mode: int, **_: Any) -> tuple[int, os.stat_result]:
    fd, temp = _temp_for(target)
    _write(fd, data)
    os.fsync(fd)
    os.replace(temp, target)
    os.fchmod(fd, stat.S_IMODE(mode))
    os.close(fd)
    _sync_directory(target)
    return _pin(target)


BROKEN: dict[str, tuple[Callable[..., tuple[int, os.stat_result]], set[str]]] = {
    # protocol: (write function, the violations it must be caught with)
    "no fsync before rename": (no_fsync_before_rename, {DAMAGED}),
    "no directory fsync": (no_directory_fsync, {LOST}),
    "in place, truncate then write": (in_place, {DAMAGED}),
    "permission bits set after rename": (mode_after_rename, {MODE}),
}


def broken(base: Callable[[Path], Callable[[], None]], protocol: Callable[..., Any], used: list[str]) -> Callable[[Path], Callable[[], None]]:
    """``base``'s call made with ``protocol`` in place of ``_atomic.write_atomic``."""

    def prepare(root: Path) -> Callable[[], None]:
        call = base(root)

        def with_protocol() -> None:
            real = _atomic.write_atomic

            def replacement(*args: Any, **kwargs: Any) -> Any:
                used.append(protocol.__name__)
                return protocol(*args, **kwargs)

            _atomic.write_atomic = replacement  # type: ignore[assignment]
            try:
                call()
            finally:
                _atomic.write_atomic = real  # type: ignore[assignment]

        return with_protocol

    return prepare


@pytest.mark.parametrize("base", [first_write, overwrite], ids=["first-write", "overwrite"])
@pytest.mark.parametrize("name", list(BROKEN))
def test_checker_catches_broken_protocol(tmp_path: Path, name: str, base: Callable[[Path], Callable[[], None]], reliability: Any) -> None:
    protocol, expected = BROKEN[name]
    used: list[str] = []
    report = _crashsim.check(Scenario(f"{name} ({base.__name__})", NAME, broken(base, protocol, used)), tmp_path)
    assert used, "LocalFile.replace no longer calls _atomic.write_atomic: the broken protocol was never used"
    assert expected <= report.kinds(), report.summary()
    # Whatever breaks, opening never raises and never leaves temp files: recovery itself is sound.
    assert not report.kinds() & {RAISED, LEFTOVER, BYTES_LOST}, report.summary()
    reliability.add("broken_checked", report.states, source=SOURCE)
    reliability.add("broken_caught", len(report.violations), source=SOURCE)
    reliability.add("damaged_files", report.damaged, source=SOURCE)


def test_no_fsync_before_rename_is_caught_after_set_returned(tmp_path: Path) -> None:
    """The classic: rename durable, data not: an empty or torn file even after set() returned."""
    used: list[str] = []
    report = _crashsim.check(Scenario("no fsync", NAME, broken(overwrite, no_fsync_before_rename, used)), tmp_path)
    final = len(report.ops)
    at_end = [v for v in report.violations if v.k == final]
    assert any(v.problem.startswith(DAMAGED) for v in at_end), report.summary()
    assert any(v.state.content(NAME) == b"" for v in at_end)  # the empty file of ext4 lore


# -- the history: kept versions are whole and, once set() returned, durable ----------------------


def without_hard_links(base: Callable[[Path], Callable[[], None]], *, sync_copy: bool) -> Callable[[Path], Callable[[], None]]:
    """``base``'s call on a filesystem that refuses hard links (the history copies the bytes);
    ``sync_copy=False``: a broken copy that skips its fsync."""

    def prepare(root: Path) -> Callable[[], None]:
        call = base(root)

        def no_links() -> None:
            real_link, real_keep = os.link, _atomic.keep_previous

            def refuse(*args: Any, **kwargs: Any) -> None:
                raise OSError(errno.EPERM, os.strerror(errno.EPERM))

            def keep(target: str, kept: str, *, durable: bool) -> None:
                real_keep(target, kept, durable=durable and sync_copy)

            os.link = refuse  # type: ignore[assignment]
            _atomic.keep_previous = keep  # type: ignore[assignment]
            try:
                call()
            finally:
                os.link = real_link
                _atomic.keep_previous = real_keep  # type: ignore[assignment]

        return no_links

    return prepare


@pytest.mark.parametrize("base", [overwrite, overwrite_large, merge_with_another_writer],
                         ids=["overwrite", "overwrite-10-blocks", "merge"])
def test_the_history_is_whole_and_durable_in_every_crash_state(tmp_path: Path, base: Callable[[Path], Callable[[], None]],
                                                               reliability: Any) -> None:
    report = _crashsim.check(Scenario(f"history ({base.__name__})", NAME, base), tmp_path)
    kinds = [op.kind for op in report.ops]
    assert kinds[kinds.index("rename") - 1] == "link", report.summary()  # kept just before the rename
    assert report.violations == [], report.summary()
    reliability.add("crash_states", report.states, source=SOURCE)


def test_the_history_copied_where_hard_links_are_refused_is_whole_and_durable(tmp_path: Path, reliability: Any) -> None:
    report = _crashsim.check(Scenario("history copied", NAME, without_hard_links(overwrite, sync_copy=True)), tmp_path)
    kinds = [op.kind for op in report.ops]
    # The new file first, then the copy of the old one (synced), renamed in, then the new renamed.
    assert "link" not in kinds and kinds[4:9] == ["create", "write", "chmod", "fsync", "rename"], report.summary()
    assert report.violations == [], report.summary()
    reliability.add("crash_states", report.states, source=SOURCE)


def test_checker_catches_a_history_copy_without_fsync(tmp_path: Path, reliability: Any) -> None:
    report = _crashsim.check(Scenario("history copy not synced", NAME, without_hard_links(overwrite, sync_copy=False)), tmp_path)
    assert HISTORY_DAMAGED in report.kinds(), report.summary()
    reliability.add("broken_checked", report.states, source=SOURCE)
    reliability.add("broken_caught", len(report.violations), source=SOURCE)


# -- the recorder and the model themselves --------------------------------------------------------


def test_recording_that_misses_a_change_fails_loudly(tmp_path: Path) -> None:
    """A change made behind the recorder's back (C code's own open) fails the recording."""

    def sneaky(root: Path) -> Callable[[], None]:
        store = StatusStore(root / NAME)

        def call() -> None:
            store.set("a", "k", 1)
            with io.FileIO(root / "unseen.json", "w") as f:  # C code's own open: not one the recorder sees
                f.write(b"{}")

        return call

    with pytest.raises(_crashsim.IncompleteRecording, match="unseen.json"):
        _crashsim.record(Scenario("sneaky", NAME, sneaky), tmp_path)


def test_recorder_trace_of_a_durable_overwrite(tmp_path: Path) -> None:
    """What the model sees of one set: the data of the new inode is fsynced after its last write
    and before the rename, and the directory after it."""
    _, recorder, _ = _crashsim.record(Scenario("overwrite", NAME, overwrite), tmp_path)
    ops = recorder.ops
    kinds = [op.kind for op in ops]
    rename = kinds.index("rename")
    created = next(op for op in ops if op.kind == "create")
    assert ops[rename].rel == created.rel and ops[rename].dest == NAME
    last_write = max(i for i, op in enumerate(ops) if op.kind == "write" and op.inode == created.inode)
    fsyncs = [i for i, op in enumerate(ops) if op.kind == "fsync" and op.inode == created.inode]
    assert any(last_write < i < rename for i in fsyncs)
    assert any(op.kind == "dirsync" and op.rel == "" for op in ops[rename + 1:])
    assert created.mode == 0o600


def test_crash_states_of_a_small_trace_are_exactly_the_model() -> None:
    """create a; write 600 bytes (two blocks); rename a -> b: every state, counted by hand."""
    data = bytes(range(256)) * 2 + b"z" * 88
    ops = [
        Op("create", rel="a", directory="", inode=7, mode=0o600),
        Op("write", inode=7, offset=0, data=data),
        Op("rename", rel="a", dest="b", directory=""),
    ]
    states: dict[int, set[tuple[Any, ...]]] = {}
    for k, state in _crashsim.crash_states(FsState({}, {}), ops):
        states.setdefault(k, set()).add(tuple((rel, state.content(rel)) for rel in sorted(state.entries)))
    assert states[0] == {()}
    assert states[1] == {(), (("a", b""),)}
    # A two-block write: nothing, all, zeros to the new size, block 0 only (size 600 or 512),
    # block 1 only (after 512 zeros).
    contents = {b"", data, bytes(600), data[:512] + bytes(88), data[:512], bytes(512) + data[512:]}
    assert states[2] == {()} | {(("a", c),) for c in contents}
    assert states[3] == states[2] | {(("b", c),) for c in contents}


def test_directory_fsync_makes_earlier_directory_operations_durable() -> None:
    ops = [
        Op("create", rel="a", directory="", inode=7, mode=0o600),
        Op("fsync", inode=7),
        Op("rename", rel="a", dest="b", directory=""),
        Op("dirsync", rel=""),
    ]
    final = [state for k, state in _crashsim.crash_states(FsState({}, {}), ops) if k == 4]
    assert [sorted(s.entries) for s in final] == [["b"]]


def final_names(initial: FsState, ops: list[Op]) -> set[tuple[str, ...]]:
    """The names in each state a power loss after the whole trace may leave."""
    return {tuple(sorted(s.entries)) for k, s in _crashsim.crash_states(initial, ops) if k == len(ops)}


TWO_DIRECTORIES = FsState({"a": ("dir", 0), "b": ("dir", 0)}, {})


def test_a_directory_fsync_makes_only_that_directory_durable() -> None:
    """A trainer that syncs status/ but never models/ must not pass: b's fsync says nothing of a."""
    ops = [
        Op("create", rel="b/x", directory="b", inode=7, mode=0o600),
        Op("create", rel="a/y", directory="a", inode=8, mode=0o600),
        Op("dirsync", rel="b"),
    ]
    assert final_names(TWO_DIRECTORIES, ops) == {("a", "b", "b/x"), ("a", "a/y", "b", "b/x")}
    # Either directory's fsync covers only its own entries, whatever the order of the operations.
    ops[2] = Op("dirsync", rel="a")
    assert final_names(TWO_DIRECTORIES, ops) == {("a", "a/y", "b"), ("a", "a/y", "b", "b/x")}


def test_a_rename_between_directories_is_in_both_or_in_neither() -> None:
    ops = [
        Op("create", rel="a/y", directory="a", inode=8, mode=0o600),
        Op("rename", rel="a/y", dest="b/y", directory="b"),
        Op("dirsync", rel="b"),
    ]
    # b's fsync makes the rename durable, and with it the create it moved: never two names, never none.
    assert final_names(TWO_DIRECTORIES, ops) == {("a", "b", "b/y")}


def test_a_directory_is_followed_through_its_rename() -> None:
    """Made as tmp/, filled, renamed to final/ and synced there: the fsync covers what tmp/ got."""
    ops = [
        Op("mkdir", rel="tmp", directory=""),
        Op("create", rel="tmp/x", directory="tmp", inode=7, mode=0o600),
        Op("rename", rel="tmp", dest="final", directory=""),
        Op("dirsync", rel="final"),
        Op("dirsync", rel=""),
    ]
    assert final_names(FsState({}, {}), ops) == {("final", "final/x")}


def test_what_a_directory_holds_is_lost_with_its_entry() -> None:
    """A new folder synced, its parent not: its files may be durable and unreachable, never orphaned."""
    ops = [
        Op("mkdir", rel="d", directory=""),
        Op("create", rel="d/x", directory="d", inode=7, mode=0o600),
        Op("dirsync", rel="d"),
    ]
    assert final_names(FsState({}, {}), ops) == {(), ("d", "d/x")}


def test_a_synced_write_is_never_torn_and_a_chmod_needs_fsync() -> None:
    ops = [
        Op("create", rel="a", directory="", inode=7, mode=0o600),
        Op("write", inode=7, offset=0, data=b"x" * 1500),
        Op("fsync", inode=7),
        Op("chmod", inode=7, mode=0o644),
    ]
    last = [s for k, s in _crashsim.crash_states(FsState({}, {}), ops) if k == 4 and "a" in s.entries]
    assert {(s.content("a"), s.mode("a")) for s in last} == {(b"x" * 1500, 0o600), (b"x" * 1500, 0o644)}


def test_report_lists_the_trace_and_violations() -> None:
    report = Report("demo", [Op("mkdir", rel="d", directory="")], 3,
                    [_crashsim.Violation(1, f"{NEITHER}: recovery gives {{}}", FsState({}, {}))])
    text = report.summary()
    assert "demo: 3 states, 1 violation(s)" in text
    assert "0: mkdir(d)" in text
    assert "crash after 1 operation(s): neither old nor new" in text
    assert report.kinds() == {NEITHER}


_HANDING_WAITER = r"""
import sys
from trainstatus import StatusStore
store = StatusStore(sys.argv[1])
print("ready", flush=True)
store.set("wall_height", "handed", 3)
print("set", store.get("wall_height", "handed"), flush=True)
"""


def test_a_write_carrying_another_process_set_recovers_old_or_new_in_every_crash_state(tmp_path: Path, reliability: Any) -> None:
    """The holder's write that carries a set another process handed over (``_mailbox``): every
    crash state recovers the old document or the new one, which has both sets, and the new one
    once the write returned (it acknowledges the handed set just before)."""
    import subprocess
    import sys
    import time
    from contextlib import ExitStack

    from trainstatus._lock import fair as _fair, mailbox as _mailbox

    if not _fair._HANDOFF:
        pytest.skip("handing over needs Linux's open file description locks")
    held = ExitStack()
    waiters: list[subprocess.Popen[str]] = []
    written: list[str] = []

    def handed_over(root: Path) -> Callable[[], None]:
        path = existing_file(root)
        store = StatusStore(path)
        held.enter_context(store._storage.lock(None))
        waiter = subprocess.Popen([sys.executable, "-c", _HANDING_WAITER, str(path)], stdout=subprocess.PIPE, text=True)
        waiters.append(waiter)
        assert waiter.stdout is not None and waiter.stdout.readline() == "ready\n"
        lock_file = str(path) + ".lock"
        deadline = time.monotonic() + 30
        while _mailbox.PENDING not in _box_states(lock_file):
            assert time.monotonic() < deadline and waiter.poll() is None, "the waiter never posted"
            time.sleep(0.002)
        store._storage._path_lock._file_lock.contended = True  # as after an acquire that found waiters

        def call() -> None:
            store.set("wall_height", "lesson_num", 2)
            written.append(path.read_text())  # the lock still held: only this write can hold both

        return call

    try:
        report = _crashsim.check(Scenario("a write carrying another process's set", NAME, handed_over), tmp_path)
    finally:
        held.close()
        outputs = [w.communicate(timeout=60)[0].strip() for w in waiters]
    assert outputs == ["set 3"]
    assert report.violations == [], report.summary()
    assert report.states >= len(report.ops) + 1
    assert any(op.kind in ("rename", "link") for op in report.ops)  # a first version is linked
    assert '"handed": 3' in written[0] and '"lesson_num": 2' in written[0]
    reliability.add("crash_states", report.states, source=SOURCE)


def _box_states(lock_file: str) -> set[int]:
    from trainstatus._lock import fair as _fair, mailbox as _mailbox

    with open(lock_file, "rb") as f:
        data = f.read()
    states = set()
    for slot in range(_fair._SLOTS):
        head = data[_mailbox.box_of(slot):_mailbox.box_of(slot) + _mailbox._HEAD.size]
        if len(head) == _mailbox._HEAD.size and struct.unpack_from("<I", head)[0] == _mailbox._MAGIC:
            states.add(struct.unpack_from("<I", head, 4)[0])
    return states
