"""A lock file deleted or replaced by hand while writers run never loses a change (``_lock.version``).

Each window of issue 42 with a real second process: the lock file deleted before a writer locks it,
while a writer holds it before its rename, and between a holder's rename and its acknowledgement of
the changes it carried for waiting processes; the first version of a file made by two writers at
once; and a torture of many writers with the lock file deleted and recreated at random moments.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import end_processes, skip_unless_local_locks

from trainstatus import StatusStore, TrainingStatusConflictError, TrainingStatusLockTimeout
from trainstatus._lock import mailbox as _mailbox
from trainstatus._storage import atomic as _atomic

TIMEOUT = 60.0

# Another writer: opens the store and writes once (so its first write's clean-up of leftovers is
# behind it), says "ready", then on each line of its stdin does what the line says and says "done".
_OTHER = r"""
import sys
from trainstatus import StatusStore
store = StatusStore(sys.argv[1], durable=False)
store.set("other", "warm", 1)
print("ready", flush=True)
for line in sys.stdin:
    what = line.split()
    if what[0] == "set":
        store.set("other", what[1], int(what[2]))
    elif what[0] == "increment":
        store.run_transaction(lambda s: s.set("c", "n", s.get("c", "n", 0) + 1))
    elif what[0] == "hold":  # an increment whose transaction waits for a line between read and write
        with store.transaction():
            n = store.get("c", "n", 0)
            print("holding", flush=True)
            sys.stdin.readline()
            store.set("c", "n", n + 1)
    print("done", flush=True)
"""

_spawned: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    yield
    try:
        end_processes(_spawned)
    finally:
        _spawned.clear()


def _other(path: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", _OTHER, str(path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _spawned.append(process)
    assert _line(process, TIMEOUT) == "ready"
    return process


def _tell(process: subprocess.Popen[str], line: str) -> None:
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()


_said: dict[int, queue.Queue[str | None]] = {}  # pid -> the lines its reader thread has read


def _line(process: subprocess.Popen[str], seconds: float) -> str | None:
    """The next line ``process`` says within ``seconds`` (None if it says none by then). A thread
    reads its output: a ``select`` on the pipe does not see lines a buffered read took already."""
    lines = _said.get(process.pid)
    if lines is None:
        lines = _said[process.pid] = queue.Queue()
        assert process.stdout is not None
        stdout = process.stdout

        def read() -> None:
            for line in stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
    try:
        line = lines.get(timeout=seconds)
    except queue.Empty:
        return None
    assert line is not None, f"process {process.pid} exited"
    return line


def _on_disk(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@contextlib.contextmanager
def _at_write(monkeypatch: pytest.MonkeyPatch, step: str, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` once, right after the write protocol's ``step`` of this process's next write."""
    real = getattr(_atomic, step)
    done = [False]

    def wrapped(*args: Any) -> None:
        real(*args)
        if not done[0]:
            done[0] = True
            action()

    monkeypatch.setattr(_atomic, step, wrapped)
    yield
    monkeypatch.undo()
    assert done[0], f"no write reached {step}"


def test_deleted_while_a_writer_holds_it_before_its_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleted between our read and our rename, and another writer sets meanwhile: it waits for
    the version we build on, and then builds on ours; neither change is lost."""
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    store.set("c", "k", 1)
    other = _other(path)
    said: list[str | None] = []

    def meanwhile() -> None:
        os.unlink(f"{path}.lock")
        _tell(other, "set k 1")
        said.append(_line(other, 1.0))  # its set lands now, or (locked out) after ours

    with _at_write(monkeypatch, "write_all", meanwhile):
        store.set("c", "k", 2)
    assert said == [None], "the other writer wrote while this one held the version it built on"
    assert _line(other, TIMEOUT) == "done"
    assert _on_disk(path)["c"] == {"k": 2} and _on_disk(path)["other"] == {"warm": 1, "k": 1}
    store.set("c", "k", 3)  # and both go on, on the new lock file
    assert _on_disk(path)["other"] == {"warm": 1, "k": 1} and _on_disk(path)["c"] == {"k": 3}


_FRESH = r"""
import sys
from trainstatus import StatusStore
store = StatusStore(sys.argv[1], durable=False)  # finds a temp file, takes the (new) lock at once: a leftover
print("opened", flush=True)
store.set("other", "k", 1)
print("done", flush=True)
"""


def test_a_write_whose_temp_file_another_writer_removed_as_a_leftover_writes_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleted while we write, and a writer opening the store then takes the new lock file and
    removes our temp file as a killed writer's leftover: our rename fails, and we write again (it
    used to fail the set, saying never to delete the lock file). The other waits for our version."""
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    store.set("c", "k", 1)
    fresh: list[subprocess.Popen[str]] = []

    def meanwhile() -> None:
        os.unlink(f"{path}.lock")
        process = subprocess.Popen([sys.executable, "-c", _FRESH, str(path)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        _spawned.append(process)
        fresh.append(process)
        assert _line(process, TIMEOUT) == "opened"
        assert not [name for name in os.listdir(tmp_path) if ".tmp" in name], "our temp file was not removed"

    with _at_write(monkeypatch, "write_all", meanwhile):
        store.set("c", "k", 2)
    assert _line(fresh[0], TIMEOUT) == "done"
    assert _on_disk(path)["c"] == {"k": 2} and _on_disk(path)["other"] == {"k": 1}


def test_deleted_before_a_writer_locks_it(tmp_path: Path) -> None:
    """Another process holds the lock in a transaction (an increment, between its read and its
    write) when the lock file is deleted; our increment takes the new lock file at once, but
    waits for the version the other builds on: both increments count."""
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    store.set("c", "n", 0)
    other = _other(path)
    _tell(other, "hold")
    assert _line(other, TIMEOUT) == "holding"
    os.unlink(f"{path}.lock")
    finished = threading.Event()

    def increment() -> None:
        store.run_transaction(lambda s: s.set("c", "n", s.get("c", "n", 0) + 1))
        finished.set()

    thread = threading.Thread(target=increment)
    thread.start()
    try:
        assert not finished.wait(0.5), "our increment did not wait for the transaction holding the old lock"
        _tell(other, "")  # its transaction writes now
        assert _line(other, TIMEOUT) == "done"
    finally:
        thread.join(TIMEOUT)
    assert finished.is_set()
    assert _on_disk(path)["c"] == {"n": 2}
    assert store.get("c", "n") == 2


def test_deleted_between_a_holder_rename_and_its_acknowledgement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder carries a waiting process's set (group commit); the lock file is deleted after
    its rename, before it acknowledges the carried change, and a third writer sets meanwhile. The
    acknowledged change stays in the file, and so does the third writer's."""
    from test_mailbox import _boxes, _waiter

    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.set("holder", "start", 0)
    lock_file = Path(f"{path}.lock")
    skip_unless_local_locks(lock_file)
    other = _other(path)
    said: list[str | None] = []

    def meanwhile() -> None:
        lock_file.unlink()
        _tell(other, "set k 1")
        said.append(_line(other, 1.0))

    with store._storage.lock(None):
        file_lock = store._storage._path_lock._file_lock
        waiter = _waiter(path, "w1")
        _spawned.append(waiter)
        file_lock.contended = True
        with _at_write(monkeypatch, "replace", meanwhile):
            store.set("holder", "k", 1)
        assert said == [None], "the third writer wrote while the holder still held the version"
        assert _boxes(_orphan(file_lock))[waiter.pid] == _mailbox.DONE
    out, _ = waiter.communicate(timeout=TIMEOUT)
    assert out.strip() == "set [1.5, nan] 1"
    assert _line(other, TIMEOUT) == "done"
    on_disk = path.read_text()
    assert "\"w1\": [\n      1.5,\n      NaN\n    ]" in on_disk
    assert _on_disk(path)["holder"] == {"start": 0, "k": 1} and _on_disk(path)["other"] == {"warm": 1, "k": 1}


def _orphan(file_lock: Any) -> Path:
    """The lock file the holder still has open (deleted from its path): its boxes, read by fd."""
    return Path(f"/proc/self/fd/{file_lock._current_fd()}")


def test_the_first_version_made_by_two_writers_at_once_keeps_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No file yet, so no version to lock: another writer makes the file while we write ours (it
    got in through a new lock file). Our first version is put in place by a link, which fails on
    its file; we read that and write again, keeping its change. (A real second process would also
    remove our temp file as a dead writer's leftover, which makes us write again all the same: the
    other's file is put in place here without that, as its rename would.)"""
    path = tmp_path / "status.json"
    made = tmp_path / "made" / "status.json"
    StatusStore(made, durable=False, history=0).set("other", "k", 1)
    store = StatusStore(path, durable=False)  # no file

    def meanwhile() -> None:
        os.unlink(f"{path}.lock")
        os.replace(made, path)

    with _at_write(monkeypatch, "write_all", meanwhile):
        store.set("c", "k", 1)
    assert _on_disk(path)["c"] == {"k": 1} and _on_disk(path)["other"] == {"k": 1}
    assert not [name for name in os.listdir(tmp_path) if ".tmp" in name]


def test_a_transaction_whose_first_version_lost_the_race_is_not_written_on_a_stale_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same race inside transactions that read what the other writer set: ``transaction()``
    raises (nothing written), ``run_transaction`` runs the body again on the other's version."""
    path = tmp_path / "status.json"
    other = _other(path)

    def meanwhile() -> None:
        os.unlink(f"{path}.lock")
        _tell(other, "increment")
        assert _line(other, TIMEOUT) == "done"

    path.unlink()
    store = StatusStore(path, durable=False)
    with _at_write(monkeypatch, "write_all", meanwhile), pytest.raises(TrainingStatusConflictError) as info:
        with store.transaction():
            store.set("c", "n", store.get("c", "n", 0) + 1)
    assert str(info.value) == (
        f"Another writer changed c/n in {path} after this transaction read it, so the transaction was not "
        "written: its changes may rest on the old value. Run it again on the new state (store.run_transaction(func) "
        "does that).")
    assert _on_disk(path)["c"] == {"n": 1}
    path.unlink()
    store = StatusStore(path, durable=False)
    with _at_write(monkeypatch, "write_all", meanwhile):
        store.run_transaction(lambda s: s.set("c", "n", s.get("c", "n", 0) + 1))
    # The other writer, finding its file deleted, wrote back the n=1 it held, plus one: 2; our
    # body ran again on that (once on nothing, which was not written).
    assert _on_disk(path)["c"] == {"n": 3}


_STUCK = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)  # as a writer stopped inside its write holds the version it builds on
print("locked", flush=True)
sys.stdin.readline()
"""


def test_a_writer_that_waits_too_long_for_the_version_says_why(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False, lock_timeout=0.2)
    store.set("c", "k", 1)
    stuck = subprocess.Popen([sys.executable, "-c", _STUCK, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    _spawned.append(stuck)
    assert _line(stuck, TIMEOUT) == "locked"
    with pytest.raises(TrainingStatusLockTimeout) as info:
        store.set("c", "k", 2)
    assert str(info.value) == (
        f"Could not lock {path} within 0.2 s: another writer holds its current version {path} and is still "
        f"writing it, having locked a lock file that is no longer {path}.lock (it was deleted or replaced by hand "
        "while that writer held it). Let it finish, or open the store with a longer lock_timeout=.")
    assert info.value.lock_file == f"{path}.lock"
    assert _on_disk(path)["c"] == {"k": 1} and store.get("c", "k") == 1
    _tell(stuck, "")
    stuck.wait(TIMEOUT)
    store.set("c", "k", 2)
    assert _on_disk(path)["c"] == {"k": 2}


def test_two_stores_of_one_process_on_one_file_share_the_versions_they_hold(tmp_path: Path) -> None:
    """A flock excludes the process's other open files too: a store writing inside another's
    transaction on the same file must not wait for the version the outer one holds."""
    path = tmp_path / "status.json"
    outer, inner = StatusStore(path, lock_timeout=2), StatusStore(path, lock_timeout=2)
    outer.set("c", "k", 0)
    inner.set("c", "j", 0)
    with outer.transaction():
        outer.set("c", "k", outer.get("c", "k") + 1)
        inner.set("c", "j", 1)  # its version is the one the outer transaction holds
        inner.set("c", "j", 2)  # and then the one it wrote itself
    assert _on_disk(path)["c"] == {"k": 1, "j": 2}


# -- the torture: writers setting, incrementing and transacting while the lock file comes and goes --

_WRITER = r"""
import json, random, sys, time
from trainstatus import StatusStore
path, me, seed, seconds, durable, lock = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "durable", sys.argv[6]
rng = random.Random(seed)
store = StatusStore(path, durable=durable, lock_timeout=120, lock=lock)
print("ready", flush=True)
sys.stdin.readline()
last = {}       # key -> the last value a set of it returned (acknowledged)
shared = 0      # acknowledged increments of the counter every writer increments
own = 0         # acknowledged transactions on this writer's own pair of keys
end = time.monotonic() + seconds
j = 0
while time.monotonic() < end:
    j += 1
    roll = rng.random()
    if roll < 0.5:
        key = f"k{rng.randrange(8)}"
        store.set(f"w{me}", key, j)
        last[key] = j
    elif roll < 0.75:
        store.run_transaction(lambda s: s.set("shared", "n", s.get("shared", "n", 0) + 1))
        shared += 1
    else:
        with store.transaction():  # two keys that must move together
            n = store.get(f"t{me}", "n", 0)
            store.set(f"t{me}", "n", n + 1)
            store.set(f"t{me}", "twice", 2 * (n + 1))
        own += 1
print(json.dumps({"last": last, "shared": shared, "own": own, "calls": j}), flush=True)
"""


def _torture(tmp_path: Path, seed: int, *, writers: int, seconds: float, durable: bool,
             lock: str = "flock") -> dict[str, int]:
    """``writers`` processes for ``seconds`` while this thread deletes the lock file (with
    ``lock="soft"`` the lease file too), or puts another file in its place, at random moments;
    every acknowledged change must be in the file."""
    rng = random.Random(seed)
    path = tmp_path / "status.json"
    StatusStore(path, lock=lock).set("shared", "n", 0)
    lock_files = [Path(f"{path}.lock")] + ([Path(f"{path}.softlock")] if lock == "soft" else [])
    processes = []
    for me in range(writers):
        process = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(me), str(seed + me), str(seconds),
                                    "durable" if durable else "fast", lock],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _spawned.append(process)
        processes.append(process)
    for process in processes:
        assert _line(process, TIMEOUT) == "ready"
    for process in processes:
        _tell(process, "go")
    removed = replaced = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(rng.uniform(0, 0.004))
        if rng.random() < 0.7:
            for lock_file in lock_files:
                with contextlib.suppress(FileNotFoundError):
                    lock_file.unlink()
                    removed += 1
        else:  # as a cp over it, or an editor's save, would
            other = tmp_path / "replacement"
            other.write_bytes(b"")
            os.replace(other, lock_files[0])
            replaced += 1
    results = []
    for process in processes:
        out = []
        with contextlib.suppress(AssertionError):  # (raised once it exited: its output is all read)
            while (line := _line(process, TIMEOUT + seconds)) is not None:
                out.append(line)
        assert process.wait(TIMEOUT) == 0, out
        results.append(json.loads(out[-1]))
    on_disk = _on_disk(path)
    lost = []
    for me, result in enumerate(results):
        for key, value in result["last"].items():
            if on_disk.get(f"w{me}", {}).get(key) != value:
                lost.append(f"acked (w{me}, {key})={value} but the file has {on_disk.get(f'w{me}', {}).get(key)}")
        mine = on_disk.get(f"t{me}", {"n": 0, "twice": 0})
        if mine.get("n", 0) != result["own"] or mine.get("twice", 0) != 2 * result["own"]:
            lost.append(f"acked {result['own']} transactions of t{me} but the file has {mine}")
    shared = sum(result["shared"] for result in results)
    if on_disk["shared"]["n"] != shared:
        lost.append(f"acked {shared} increments but the file has {on_disk['shared']['n']}")
    assert not lost, f"{len(lost)} acknowledged changes lost: {lost[:10]}"
    calls = sum(result["calls"] for result in results)
    print(f"{writers} writers, {calls} acknowledged calls ({shared} shared increments), lock file deleted "
          f"{removed} times and replaced {replaced} times: nothing lost")
    return {"calls": calls, "removed": removed, "replaced": replaced}


@pytest.mark.parametrize("lock", ["flock", "soft"])
def test_writers_lose_nothing_while_the_lock_file_comes_and_goes(tmp_path: Path, seed: int, lock: str) -> None:
    figures = _torture(tmp_path, seed, writers=3, seconds=2.0, durable=False, lock=lock)
    assert figures["removed"] > 50 and figures["calls"] > 100  # the torture did happen


@pytest.mark.long
@pytest.mark.parametrize("durable", [False, True], ids=["fast", "durable"])
def test_many_writers_lose_nothing_in_a_long_torture_of_the_lock_file(tmp_path: Path, seed: int, durable: bool) -> None:
    figures = _torture(tmp_path, seed, writers=8, seconds=30.0, durable=durable)
    assert figures["removed"] > 1000 and figures["calls"] > 5000


_FORKS_THEN_DIES = r"""
import os, sys, time
from trainstatus import StatusStore
from trainstatus._storage import atomic
store = StatusStore(sys.argv[1], durable=False)
store.set("c", "k", 1)
child = os.fork()  # as a DataLoader worker is: it shares every open file of this moment
if child == 0:
    time.sleep(600)
    os._exit(0)
print("child", child, flush=True)

def stuck(fd, data):
    print("inside", flush=True)
    time.sleep(600)

atomic.write_all = stuck
store.set("c", "k", 2)  # killed in here, holding the version it builds on
"""


def test_a_child_forked_before_the_write_does_not_keep_a_killed_writer_version_locked(tmp_path: Path) -> None:
    """A flock belongs to an open file, which a fork shares: a forked child that outlives a writer
    killed inside its write must not keep the version locked (it would hold every writer off)."""
    import signal

    path = tmp_path / "status.json"
    writer = subprocess.Popen([sys.executable, "-c", _FORKS_THEN_DIES, str(path)], stdout=subprocess.PIPE, text=True)
    _spawned.append(writer)
    said = _line(writer, TIMEOUT)
    assert said is not None and said.startswith("child ")
    child = int(said.split()[1])
    try:
        assert _line(writer, TIMEOUT) == "inside"
        writer.kill()
        writer.wait(TIMEOUT)
        store = StatusStore(path, durable=False, lock_timeout=2)
        store.set("c", "k", 3)
        assert _on_disk(path)["c"] == {"k": 3}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


# -- what the review of the first version found ------------------------------------------------------


def test_the_status_file_and_its_lock_file_deleted_together_lose_no_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``rm run_logs/training_status.json*`` while we write: another writer makes the file anew (no
    version to wait for) and returns; our rename must not replace its file: we read it and write
    again. (The other writer's memory, and so its file, holds what it last saw of ours: k=1.)"""
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False)
    store.set("c", "k", 0)
    other = _other(path)
    store.set("c", "k", 1)
    # It reads k=1, another writer's change, and so removes leftovers now: not again for a second
    # (which would remove our temp file below and make us write again for that reason alone).
    _tell(other, "set y 1")
    assert _line(other, TIMEOUT) == "done"
    said: list[str | None] = []

    def meanwhile() -> None:
        os.unlink(path)
        os.unlink(f"{path}.lock")
        _tell(other, "set x 5")
        said.append(_line(other, TIMEOUT))

    with _at_write(monkeypatch, "write_all", meanwhile):
        store.set("c", "k", 2)
    assert said == ["done"]
    assert _on_disk(path)["other"] == {"warm": 1, "y": 1, "x": 5} and _on_disk(path)["c"] == {"k": 2}


def test_lock_timeout_bounds_the_wait_for_the_lock_and_the_version_together(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False, lock_timeout=1.0)
    store.set("c", "n", 0)
    other = _other(path)
    _tell(other, "hold")  # holds the lock file and the version
    assert _line(other, TIMEOUT) == "holding"
    os.unlink(f"{path}.lock")
    import fcntl

    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # somebody holds the new lock file for 0.8 s
    threading.Timer(0.8, lambda: os.close(fd)).start()
    start = time.monotonic()
    with pytest.raises(TrainingStatusLockTimeout) as info:
        store.set("c", "mine", 1)
    took = time.monotonic() - start
    assert str(info.value).startswith(f"Could not lock {path} within 1.0 s: another writer holds its current version")
    assert took < 1.0 + 0.25, f"lock_timeout=1.0, but the call took {took:.2f} s"  # was 1.8 s: a new wait for the version
    _tell(other, "")
    assert _line(other, TIMEOUT) == "done"


def test_a_local_write_that_lost_to_another_writer_is_not_told_it_lost_a_conditional_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our temp file removed by a writer in through a new lock file, past our lock_timeout: we
    write again at once (the object stores' pause and "conditional write" error are not ours)."""
    path = tmp_path / "status.json"
    store = StatusStore(path, durable=False, lock_timeout=0.5)
    store.set("c", "k", 1)

    def meanwhile() -> None:
        os.unlink(f"{path}.lock")
        process = subprocess.Popen([sys.executable, "-c", _FRESH, str(path)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        _spawned.append(process)
        assert _line(process, TIMEOUT) == "opened"  # our temp file is gone
        time.sleep(0.6)

    with _at_write(monkeypatch, "write_all", meanwhile):
        store.set("c", "k", 2)
    assert _on_disk(path)["c"] == {"k": 2}


def _gone_with_history(path: Path) -> Callable[[], None]:
    """A status file with 3 versions in its history, then deleted by hand; what a writer in through
    a new lock file does meanwhile: it makes the file anew (other/k = 1)."""
    store = StatusStore(path, durable=False, history=3)
    for i in range(3):
        store.set("c", "k", i)
    store.close()
    os.unlink(path)

    def meanwhile() -> None:
        os.unlink(f"{path}.lock")
        made = subprocess.run([sys.executable, "-c", "import sys; from trainstatus import StatusStore; "
                               "StatusStore(sys.argv[1], durable=False).set('other', 'k', 1)", str(path)],
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert made.returncode == 0, made.stderr

    return meanwhile


def test_a_history_version_put_back_at_open_gives_way_to_a_file_another_writer_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resuming with the status file gone: the newest version of its history is put back, but
    another writer (in through a new lock file) makes the file meanwhile. Its file is read, as is,
    with no error (a raw internal Conflict escaped before)."""
    path = tmp_path / "status.json"
    with _at_write(monkeypatch, "write_all", _gone_with_history(path)):
        resumed = StatusStore(path, durable=False, history=3, resume=True)
    assert resumed.get("other", "k") == 1 and resumed.get("c", "k") is None
    assert _on_disk(path)["other"] == {"k": 1}


def test_trainstatus_restore_writes_again_over_a_file_another_writer_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from trainstatus._cli.main import main

    path = tmp_path / "status.json"
    with _at_write(monkeypatch, "write_all", _gone_with_history(path)):
        assert main(["restore", str(path), "1"]) == 0
    assert capsys.readouterr().out.startswith(f"restored {path} to version 1 ")
    assert _on_disk(path)["c"] == {"k": 0} and "other" not in _on_disk(path)  # what restore promises


def test_two_names_of_one_file_in_one_thread_do_not_wait_for_each_other(tmp_path: Path) -> None:
    """Hard-linked names have lock files of their own (and always had): a store on each, one
    writing inside the other's transaction, must not wait for the version the other holds."""
    a_path, b_path = tmp_path / "a.json", tmp_path / "b.json"
    a = StatusStore(a_path, lock_timeout=2)
    a.set("c", "k", 1)
    os.link(a_path, b_path)
    b = StatusStore(b_path, lock_timeout=2)
    with a.transaction():
        a.get("c", "k")
        b.set("c", "j", 2)  # waited for a's version until lock_timeout before
    assert _on_disk(b_path)["c"]["j"] == 2


def test_versions_are_locked_only_on_local_filesystems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NFS makes flock a byte-range lock on the server, which refuses an exclusive lock on a file
    open read-only (EBADF): on a filesystem not known to be local, versions are not locked, and
    every write works as before the version locks (the lock file, or the lease, is all there is)."""
    import fcntl

    from trainstatus._lock import fair as _fair, version as _version

    real = fcntl.flock

    def nfs_flock(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_EX and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        real(fd, operation)

    monkeypatch.setattr(_version.fcntl, "flock", nfs_flock)
    monkeypatch.setattr(_fair, "_local_devices", {os.stat(tmp_path).st_dev: False})
    for lock in ("flock", "soft"):
        store = StatusStore(tmp_path / lock / "status.json", durable=False, lock=lock)
        for i in range(3):
            store.set("c", "k", i)
        with store.transaction():
            store.set("c", "j", store.get("c", "k"))
        assert _on_disk(tmp_path / lock / "status.json")["c"] == {"k": 2, "j": 2}
    # And where flock itself says so (EBADF), on a filesystem taken for local, the same.
    monkeypatch.setattr(_fair, "_local_devices", {})
    store = StatusStore(tmp_path / "refused" / "status.json", durable=False)
    store.set("c", "k", 1)
    store.set("c", "k", 2)
    assert _on_disk(tmp_path / "refused" / "status.json")["c"] == {"k": 2}
