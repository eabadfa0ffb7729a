"""Security: private temp files, planted symlinks and hard links, followed status links, JSON only.

- A temp file is never readable by other users while it is written: its permission bits are
  sampled after every os-level operation of a write (the ``_crashsim`` recorder), under umask 0.
- A symlink (or hard link) planted at the lock path, at a temp file name or at the name a damaged
  file is kept aside under cannot redirect a write or change the file it points at.
- A status file that is a symlink is followed, as docs/guarantees.md documents: the target is
  replaced in its own directory and the link is kept, also when the target is damaged and kept
  aside.
- Loading runs no code: keys and values that other formats treat as instructions (``__reduce__``,
  ``py/object``, ``!!python/object``...) load as plain strings and dicts, with no import, exec or
  process start seen by an audit hook.

test_atomic.py already covers a symlink at the temp path of a write (``O_EXCL | O_NOFOLLOW``,
the next name is drawn) and the mode of the temp file at the write and rename steps.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _crashsim
import pytest
from _helpers import read_fresh

from trainstatus import StatusStore, TrainingStatusCorruptWarning, TrainingStatusWriteError
from trainstatus._storage import aside as _aside

SOURCE = os.path.basename(__file__)
NAME = "status.json"
PRECIOUS = b"precious bytes of someone else's file\n"


@pytest.fixture
def umask_0() -> Iterator[None]:
    """With umask 0, a private file can only come from the library asking for 0600 itself."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def victim(directory: Path, mode: int = 0o644) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "victim"
    path.write_bytes(PRECIOUS)
    os.chmod(path, mode)
    return path


def assert_intact(path: Path, mode: int = 0o644) -> None:
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode)
    assert path.read_bytes() == PRECIOUS
    assert stat.S_IMODE(st.st_mode) == mode


# -- temp files are private while written ---------------------------------------------------------


def private_while_written(recorder: _crashsim.Recorder) -> list[str]:
    """Every (operation, temp file) where a temp file still to be written to was readable or
    writable by others; and every write made to a temp file that was not private."""
    problems = []
    ops = recorder.ops
    names_of: dict[int, str] = {op.inode: op.rel for op in ops if op.kind == "create"}
    last_write = {op.inode: i for i, op in enumerate(ops) if op.kind == "write"}
    for i, (op, modes) in enumerate(zip(ops, recorder.modes)):
        if op.kind == "write" and op.seen_mode is not None and op.seen_mode & 0o077:
            problems.append(f"{op} made to a file with mode {op.seen_mode:#o}")
        for inode, last in last_write.items():
            name = names_of.get(inode)
            if name in modes and i <= last and modes[name] & 0o077:
                problems.append(f"after {op}: {name} has mode {modes[name]:#o} and is still being written")
    return problems


@pytest.mark.parametrize(("existing_mode", "durable"), [(None, True), (0o644, True), (0o666, False), (0o640, True)],
                         ids=["new-file", "existing-0644", "existing-0666-not-durable", "existing-0640"])
def test_temp_file_is_private_after_every_operation(tmp_path: Path, umask_0: None, existing_mode: int | None, durable: bool) -> None:
    def prepare(root: Path) -> Any:
        path = root / NAME
        if existing_mode is not None:
            StatusStore(path).set("Walker", "lesson", 0)
            os.chmod(path, existing_mode)
        store = StatusStore(path, durable=durable)
        return lambda: store.set("Walker", "checkpoints", [{"steps": i} for i in range(200)])

    _, recorder, final = _crashsim.record(_crashsim.Scenario("private", NAME, prepare), tmp_path,
                                          watch=_crashsim.temp_name_pattern(NAME))
    creates = [op for op in recorder.ops if op.kind == "create"]
    assert [op.mode for op in creates] == [0o600]
    assert any(op.kind == "write" for op in recorder.ops)
    assert private_while_written(recorder) == []
    # The permission bits of the result: kept from the old file, or 0666 & ~umask for a new one.
    assert final.mode(NAME) == (0o666 if existing_mode is None else existing_mode)
    chmods = [i for i, op in enumerate(recorder.ops) if op.kind == "chmod"]
    writes = [i for i, op in enumerate(recorder.ops) if op.kind == "write"]
    assert chmods and min(chmods) > max(writes)  # opened up only once the bytes are all there


def test_privacy_check_catches_a_readable_temp_file(tmp_path: Path, umask_0: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: a protocol creating its temp file 0644 is reported."""
    real_open = os.open
    pattern = _crashsim.temp_name_pattern(NAME)

    def careless_open(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        if pattern.fullmatch(os.path.basename(os.fsdecode(path))):
            mode = 0o644
        return real_open(path, flags, mode, **kwargs)

    def prepare(root: Path) -> Any:
        store = StatusStore(root / NAME)
        return lambda: store.set("Walker", "lesson", 1)

    monkeypatch.setattr(os, "open", careless_open)  # under the recorder's own os.open
    _, recorder, _ = _crashsim.record(_crashsim.Scenario("careless", NAME, prepare), tmp_path,
                                      watch=_crashsim.temp_name_pattern(NAME))
    problems = private_while_written(recorder)
    assert any("made to a file with mode 0o644" in p for p in problems), problems


# -- planted links: the lock file -----------------------------------------------------------------


def lock_outcome(store: StatusStore, path: Path) -> str:
    """Set once; "ok", or "refused" with a TrainingStatusWriteError naming the lock file."""
    try:
        store.set("Walker", "lesson", 2)
    except TrainingStatusWriteError as exc:
        assert exc.lock_file == f"{path}.lock"
        assert f"cannot open the lock file {path}.lock" in str(exc)
        return "refused"
    return "ok"


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_symlink_at_the_lock_path_cannot_redirect_or_damage(tmp_path: Path, dangling: bool, reliability: Any) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    target = elsewhere / "victim"
    if dangling:
        elsewhere.mkdir()
    else:
        victim(elsewhere)
    path = run / NAME
    StatusStore(path, durable=False).set("Walker", "lesson", 1)
    before = path.read_bytes()
    os.unlink(f"{path}.lock")
    os.symlink(target, f"{path}.lock")

    store = StatusStore(path)  # opening takes no lock unless there is something to clean
    outcome = lock_outcome(store, path)
    if dangling:
        assert os.listdir(elsewhere) == []  # not created through the link
    else:
        assert_intact(target)
        assert os.listdir(elsewhere) == ["victim"]
    assert os.path.islink(f"{path}.lock") and os.readlink(f"{path}.lock") == str(target)
    if outcome == "refused":  # today: filelock opens the lock O_NOFOLLOW and fails (ELOOP)
        assert path.read_bytes() == before
        assert store.get("Walker", "lesson") == 1
    else:
        assert read_fresh(path)["Walker"] == {"lesson": 2}
    reliability.add("damaged_files", 1, source=SOURCE)


def test_symlink_at_the_lock_path_with_temp_files_to_clean(tmp_path: Path) -> None:
    """Opening with leftovers takes the lock to clean them: a planted link there must not make
    the open fail or reach the victim."""
    path = tmp_path / "run" / NAME
    StatusStore(path, durable=False).set("Walker", "lesson", 1)
    target = victim(tmp_path / "elsewhere")
    os.unlink(f"{path}.lock")
    os.symlink(target, f"{path}.lock")
    (path.parent / f".{NAME}.trainstatus-0123456789abcdef.tmp").write_bytes(b"{")
    store = StatusStore(path)
    assert store.get("Walker", "lesson") == 1
    assert_intact(target)


def test_hard_link_at_the_lock_path_leaves_the_other_file_alone(tmp_path: Path) -> None:
    """A hard link cannot be refused by O_NOFOLLOW; the lock file is only flock'ed, never written,
    truncated or chmod'ed, so the linked file keeps its bytes and mode."""
    run = tmp_path / "run"
    run.mkdir()
    target = victim(tmp_path / "elsewhere", mode=0o600)
    path = run / NAME
    os.link(target, f"{path}.lock")
    store = StatusStore(path)
    store.set("Walker", "lesson", 1)
    with store.transaction():
        store.set("Walker", "lesson", 2)
    assert_intact(target, mode=0o600)
    assert read_fresh(path)["Walker"] == {"lesson": 2}


# -- planted links: temp names and kept-aside names -----------------------------------------------


def test_symlink_named_like_a_temp_file_is_removed_not_followed(tmp_path: Path) -> None:
    """Cleaning up leftovers unlinks the link itself; the file it points at stays."""
    run = tmp_path / "run"
    path = run / NAME
    StatusStore(path).set("Walker", "lesson", 1)
    target = victim(tmp_path / "elsewhere")
    link = run / f".{NAME}.trainstatus-0123456789abcdef.tmp"
    os.symlink(target, link)
    directory = run / f".{NAME}.trainstatus-fedcba9876543210.tmp"  # a directory of that name
    directory.mkdir()
    (directory / "inside").write_bytes(PRECIOUS)
    store = StatusStore(path)
    assert not os.path.lexists(link)
    assert_intact(target)
    assert (directory / "inside").read_bytes() == PRECIOUS  # unlink refuses a directory: left alone
    store.set("Walker", "lesson", 2)
    assert read_fresh(path)["Walker"] == {"lesson": 2}


def freeze_clock(mp: pytest.MonkeyPatch) -> str:
    """Make the kept-aside name predictable (as test_storage does); return its stamp."""
    frozen = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> Any:
            return frozen

    mp.setattr(_aside, "datetime", types.SimpleNamespace(datetime=Frozen, timezone=datetime.timezone))
    return "20240506T070809.123456Z"


def test_symlink_at_the_kept_aside_name_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reliability: Any) -> None:
    run = tmp_path / "run"
    run.mkdir()
    path = run / NAME
    damaged = b'{"Walker": {"lesson": '
    path.write_bytes(damaged)
    target = victim(tmp_path / "elsewhere")
    stamp = freeze_clock(monkeypatch)
    planted = Path(f"{path}.corrupt-{stamp}")
    os.symlink(target, planted)
    with pytest.warns(TrainingStatusCorruptWarning) as record:
        store = StatusStore(path)
    moved = record[0].message.moved_to
    assert moved == f"{planted}-1"
    assert Path(moved).read_bytes() == damaged and not os.path.islink(moved)
    assert os.readlink(planted) == str(target)
    assert_intact(target)
    store.set("Walker", "lesson", 1)
    assert_intact(target)
    reliability.add("damaged_files", 1, source=SOURCE)


# -- a status file that is a symlink (docs/guarantees.md: followed, link kept) --------------------


def test_symlinked_status_file_with_damaged_target(tmp_path: Path, reliability: Any) -> None:
    """The damaged target is kept aside in the target's own directory; the next write recreates
    the target, so the link works again; nothing appears beside the link."""
    run, shared = tmp_path / "run", tmp_path / "shared"
    run.mkdir()
    shared.mkdir()
    target = shared / NAME
    damaged = b"\x00\x00garbage"
    target.write_bytes(damaged)
    link = run / NAME
    os.symlink(target, link)
    with pytest.warns(TrainingStatusCorruptWarning) as record:
        store = StatusStore(link)
    moved = Path(record[0].message.moved_to)
    assert moved.parent == shared and moved.read_bytes() == damaged
    assert os.readlink(link) == str(target)
    store.set("Walker", "lesson", 1)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.is_file() and not target.is_symlink()
    assert read_fresh(link)["Walker"] == {"lesson": 1}
    assert os.listdir(run) == [NAME]
    reliability.add("damaged_files", 1, source=SOURCE)


def test_relative_symlink_chain_is_followed_to_the_end(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "run").mkdir()
    final = tmp_path / "store" / "real.json"
    StatusStore(final).set("Walker", "lesson", 1)
    mode = stat.S_IMODE(os.stat(final).st_mode)
    os.symlink("../store/real.json", tmp_path / "run" / "middle.json")
    os.symlink("middle.json", tmp_path / "run" / NAME)
    store = StatusStore(tmp_path / "run" / NAME)
    store.set("Walker", "lesson", 2)
    assert os.readlink(tmp_path / "run" / NAME) == "middle.json"
    assert os.readlink(tmp_path / "run" / "middle.json") == "../store/real.json"
    assert read_fresh(final)["Walker"] == {"lesson": 2}
    assert stat.S_IMODE(os.stat(final).st_mode) == mode
    assert sorted(os.listdir(tmp_path / "run")) == ["middle.json", NAME]


# -- loading runs no code -------------------------------------------------------------------------

HOSTILE = {
    "__class__": {"__reduce__": ["os.system", ["touch {sentinel}"]], "__init__": "exec"},
    "py/object": {"py/object": "subprocess.Popen", "py/reduce": [{"py/function": "os.system"}, ["touch {sentinel}"]]},
    "!!python/object/apply:os.system": {"args": ["touch {sentinel}"]},
    "__import__('os').system('touch {sentinel}')": {"eval": "__import__('os').system('touch {sentinel}')"},
    "$type": {"$type": "System.Diagnostics.Process, System", "__proto__": {"polluted": True}},
    "Walker": {"checkpoints": [{"__reduce_ex__": 2, "__getstate__": "x", "file_path": "{{7*7}}"}]},
    "metadata": {"stats_format_version": "0.3.0", "__class__": "builtins.eval"},
}

AUDIT = textwrap.dedent(
    """
    import json, os, sys
    from trainstatus import GlobalTrainingStatus, StatusStore
    benign, hostile, out = sys.argv[1:4]
    warm = StatusStore(benign)  # lazy imports happen here, before watching: the store's modules,
    warm.to_dict()
    warm.set("Walker", "lesson", 1)  # filelock (the first lock taken)
    warm.set("Walker", "reward", float("nan"))  # pickle (values holding NaN; never find_class)
    warm.close()
    events = []
    WATCHED = ("exec", "compile", "import", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
               "os.fork", "subprocess.Popen", "pickle.find_class", "marshal.loads", "ctypes.dlopen",
               "builtins.input", "code.__new__")
    def hook(event, args):
        if event.startswith(WATCHED):
            events.append(event)
    sys.addaudithook(hook)
    store = StatusStore(hostile)
    loaded = store.to_dict()
    values = [store.get(c, k) for c in list(loaded) for k in loaded[c]]
    store.set("Walker", "lesson", 1)  # a rewrite keeps the hostile strings as strings
    GlobalTrainingStatus.load_state(hostile)
    dropin = GlobalTrainingStatus.saved_state
    seen = list(events)
    with open(out, "w") as f:
        json.dump({"events": seen, "loaded": loaded, "dropin": dropin}, f)
    """
)


def plain(value: Any) -> bool:
    if isinstance(value, dict):
        return type(value) is dict and all(type(k) is str and plain(v) for k, v in value.items())
    if isinstance(value, list):
        return type(value) is list and all(plain(v) for v in value)
    return type(value) in (str, int, float, bool, type(None))


def test_loading_hostile_keys_and_values_runs_nothing(tmp_path: Path, reliability: Any) -> None:
    sentinel = tmp_path / "pwned"
    hostile = json.loads(json.dumps(HOSTILE).replace("{sentinel}", str(sentinel)))
    path = tmp_path / NAME
    path.write_text(json.dumps(hostile, indent=4))
    benign = tmp_path / "benign.json"
    StatusStore(benign).set("Walker", "lesson", 1)
    out = tmp_path / "report.json"
    subprocess.run([sys.executable, "-c", AUDIT, str(benign), str(path), str(out)],
                   check=True, timeout=120, capture_output=True)
    report = json.loads(out.read_text())
    assert report["events"] == []  # no import, exec, compile, unpickling or process start
    assert not sentinel.exists()
    loaded = report["loaded"]
    assert plain(loaded)
    meta = loaded.pop("metadata")
    assert meta["__class__"] == "builtins.eval"
    assert loaded == {k: v for k, v in hostile.items() if k != "metadata"}
    assert report["dropin"]["__class__"] == hostile["__class__"]
    after = json.loads(path.read_bytes())  # rewritten by the set: still the same plain data
    assert after["py/object"] == hostile["py/object"]
    assert after["Walker"]["lesson"] == 1
    assert not sentinel.exists()
    reliability.add("damaged_files", 1, source=SOURCE)


def test_audit_hook_would_see_code_being_run(tmp_path: Path) -> None:
    """The audit check has teeth: the same hook sees what an unsafe loader would do."""
    script = textwrap.dedent(
        """
        import pickle, sys
        events = []
        sys.addaudithook(lambda e, a: events.append(e) if e in ("pickle.find_class", "exec", "compile") else None)
        pickle.loads(pickle.dumps(print))
        eval("1 + 1")
        print(sorted(set(events)))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], check=True, timeout=60, capture_output=True, text=True)
    assert result.stdout.strip() == str(sorted({"pickle.find_class", "exec", "compile"}))


def test_keys_shaped_like_python_names_round_trip_as_data(tmp_path: Path) -> None:
    path = tmp_path / NAME
    store = StatusStore(path)
    odd = {"__reduce__": "os.system", "__class__": {"__module__": "os"}, "__dict__": [1, 2]}
    store.set("__class__", "__reduce__", odd)
    store.set("Walker", "__getattr__", "__import__('os')")
    fresh = StatusStore(path)
    assert fresh.get("__class__", "__reduce__") == odd
    assert fresh.get("Walker", "__getattr__") == "__import__('os')"
    assert plain(fresh.to_dict())
    assert re.search(rb'"__reduce__": "os.system"', path.read_bytes())
