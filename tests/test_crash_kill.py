"""Process crashes: writers SIGKILLed at random moments, mid-write included, on the real disk.

A long-lived *kill server* (a spawned interpreter with trainstatus imported) forks one writer
process per kill, so a kill costs a fork, not an interpreter start. Each writer opens a
``StatusStore`` on a ~200 KB document and sets a fresh ~200 KB value over and over; after each
``set`` returns it reports the value's sequence number through a pipe (an *acknowledgement*). The
test SIGKILLs the writer, the server reaps it, and the test checks the file: it parses, holds a
whole value at least as new as the last acknowledged one (and at most one newer), the rest of the
document is intact, and at most one temp file is there (each writer's open removes its
predecessors'). Writers are killed

- after a random delay (from during the open to many writes in), and
- at each point of the write protocol (``trainstatus.testing.POINTS``: temp created, half
  written, written, synced, renamed, directory synced, ``set`` returned): the writer SIGKILLs
  itself there through the public ``kill_at(..., sigkill=True)``, so every intermediate state is
  certainly hit and the exact outcome is known.

A second suite kills one of several concurrent writers at a time and restarts it: acknowledged
values of every writer survive and a restarted writer resumes from at least its last one.
Last, the issue's concurrency numbers: 8 threads x 200 sets, on one store and on 8 stores.

``--soak`` runs 5,000+ kills and more concurrent writers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import select
import signal
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _workers
import pytest
from _helpers import alarm, run_threads
from _helpers import same

from trainstatus import StatusStore
from trainstatus._lock import fair as _fair, mailbox as _mailbox
from trainstatus.testing import POINTS, kill_at

SOURCE = os.path.basename(__file__)
TESTS = os.path.dirname(os.path.abspath(__file__))
DATA = Path(TESTS) / "data" / "mlagents_training_status.json"
NAME = "training_status.json"
BLOB = 200_000  # bytes of the value rewritten by each set; the whole file is a bit larger
TIMEOUT = 60.0

RECORD = struct.Struct("<iiq")  # pid, kind, value: 16 bytes, one atomic pipe write
OPENED, ACK = 1, 2

# The points of the write protocol (trainstatus.testing.POINTS) a writer SIGKILLs itself at,
# whether the writer is durable there (the sync points exist only then), and what the file then
# holds: True when the set in progress already replaced it (its value is one past the last ack).
FREEZE_POINTS = {
    "created": (False, False),
    "half-written": (False, False),
    "written": (True, False),
    "synced": (True, False),
    "renamed": (False, True),
    "dir-synced": (True, True),
    "returned": (False, True),
}
assert tuple(FREEZE_POINTS) == POINTS


def temp_pattern(name: str) -> re.Pattern[str]:
    """The temp file names of docs/guarantees.md: ``.<name>.trainstatus-<16 hex>.tmp``."""
    return re.compile(re.escape(f".{name}.trainstatus-") + r"[0-9a-f]{16}\.tmp")


def value_for(slot: int, seq: int, size: int) -> dict[str, Any]:
    """The value writer ``slot`` sets as its ``seq``-th: every byte of it depends on ``seq``."""
    unit = f"{slot}:{seq:09d};"
    return {"seq": seq, "slot": slot, "blob": (unit * (size // len(unit) + 1))[:size]}


def static_document() -> dict[str, Any]:
    """What no writer touches: the ML-Agents sample (NaN included), which must stay intact."""
    doc = json.loads(DATA.read_bytes())
    doc.pop("metadata")
    return doc


# -- the writer (runs in a child of the kill server) ----------------------------------------------


def writer(ack_fd: int, path: str, slot: int, durable: bool, size: int,
           freeze: str | None = None, freeze_set: int = 0) -> None:
    """Set ``value_for(slot, seq)`` for seq = last found + 1, + 2, ... until killed; with
    ``freeze``, SIGKILL itself at that point of set number ``freeze_set`` (0: the first), through
    the public ``trainstatus.testing.kill_at(..., sigkill=True)``."""

    def report(kind: int, value: int) -> None:
        os.write(ack_fd, RECORD.pack(os.getpid(), kind, value))

    with contextlib.ExitStack() as stack:
        if freeze:
            stack.enter_context(kill_at(freeze_set + 1, freeze, sigkill=True))
        store = StatusStore(path, durable=durable, lock_timeout=TIMEOUT)
        category = f"writer{slot}"
        found = store.get(category, "value")
        seq = -1 if found is None else found["seq"]
        report(OPENED, seq)
        while True:
            seq += 1
            store.set(category, "value", value_for(slot, seq, size))
            report(ACK, seq)


def serve(ack_fd: int) -> None:
    """The kill server: fork a writer per "spawn <json>" line, reap one per "reap <pid>" line."""
    # What the first write imports on first use (filelock): loaded here, once, so that each forked
    # writer writes at once, as the random kill delays assume.
    from trainstatus._lock import path_lock as _locking

    assert _locking.filelock.Timeout
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        line = sys.stdin.readline()
        if not line or line.strip() == "quit":
            return
        command, _, rest = line.strip().partition(" ")
        if command == "spawn":
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the writer; it only ends by SIGKILL or an error
                code = 1
                try:
                    writer(ack_fd, **json.loads(rest))
                except BaseException:  # noqa: BLE001
                    traceback.print_exc()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
            print(f"pid {pid}", flush=True)
        elif command == "reap":
            pid, status = os.waitpid(int(rest), 0)
            print(f"status {pid} {status}", flush=True)


# -- the test side --------------------------------------------------------------------------------


class KillServer:
    """The spawned server and the pipe every writer reports through."""

    def __init__(self) -> None:
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        code = f"import sys; sys.path.insert(0, {TESTS!r}); import test_crash_kill as t; t.serve(int(sys.argv[1]))"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(write_end)], pass_fds=(write_end,),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=TESTS,
        )
        os.close(write_end)
        self.acks = read_end
        self._buffer = b""
        self.live: set[int] = set()

    def _ask(self, line: str, expect: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer.startswith(expect + " "), f"kill server answered {answer!r} to {line!r} (exit {self.process.poll()})"
        return answer.split(" ", 1)[1]

    def spawn(self, **writer_args: Any) -> int:
        pid = int(self._ask("spawn " + json.dumps(writer_args), "pid"))
        self.live.add(pid)
        return pid

    def kill(self, pid: int) -> None:
        """SIGKILL ``pid`` and reap it; fail if it had died on its own (a writer error)."""
        os.kill(pid, signal.SIGKILL)
        _, status = self._ask(f"reap {pid}", "status").split()
        self.live.discard(pid)
        code = int(status)
        assert os.WIFSIGNALED(code) and os.WTERMSIG(code) == signal.SIGKILL, (
            f"writer {pid} ended by itself (wait status {code}) instead of being killed: see its traceback above")

    def reap(self, pid: int) -> None:
        """Wait for ``pid`` to die, and fail unless it died of SIGKILL (it kills itself)."""
        _, status = self._ask(f"reap {pid}", "status").split()
        self.live.discard(pid)
        code = int(status)
        assert os.WIFSIGNALED(code) and os.WTERMSIG(code) == signal.SIGKILL, (
            f"writer {pid} ended (wait status {code}) without killing itself: see its traceback above")

    def records(self, timeout: float = 0.0) -> list[tuple[int, int, int]]:
        """What writers reported, waiting up to ``timeout`` s for the first record."""
        if timeout > 0:
            select.select([self.acks], [], [], timeout)
        while True:
            try:
                chunk = os.read(self.acks, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._buffer += chunk
        whole = len(self._buffer) - len(self._buffer) % RECORD.size
        found = [RECORD.unpack_from(self._buffer, i) for i in range(0, whole, RECORD.size)]
        self._buffer = self._buffer[whole:]
        return found

    def close(self) -> None:
        for pid in list(self.live):
            try:
                self.kill(pid)
            except (AssertionError, ProcessLookupError):
                pass
        try:
            assert self.process.stdin is not None
            self.process.stdin.write("quit\n")
            self.process.stdin.flush()
            self.process.wait(TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            os.close(self.acks)
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def server() -> Iterator[KillServer]:
    running = KillServer()
    try:
        yield running
    finally:
        running.close()


def prepare(path: Path, slots: int, size: int) -> None:
    """The document before the first writer: the ML-Agents sample plus each writer's seq 0."""
    path.parent.mkdir(parents=True, exist_ok=True)
    store = StatusStore(path, durable=False)
    with store.transaction():
        for category, entries in static_document().items():
            for key, value in entries.items():
                store.set(category, key, value)
        for slot in range(slots):
            store.set(f"writer{slot}", "value", value_for(slot, 0, size))
    store.close()


def handed_over(path: Path) -> set[tuple[int, int]]:
    """(pid, arrival) of the requests in the lock file's boxes that a holder wrote (``_mailbox``)."""
    try:
        data = Path(str(path) + ".lock").read_bytes()
    except FileNotFoundError:
        return set()
    done = set()
    for slot in range(_fair._SLOTS):
        head = data[_mailbox.box_of(slot):_mailbox.box_of(slot) + _mailbox._HEAD.size]
        if len(head) == _mailbox._HEAD.size:
            magic, state, pid, _, arrival = _mailbox._HEAD.unpack(head)[:5]
            if magic == _mailbox._MAGIC and state == _mailbox.DONE:
                done.add((pid, arrival))
    return done


def temps_in(directory: Path) -> list[str]:
    pattern = temp_pattern(NAME)
    return sorted(name for name in os.listdir(directory) if pattern.fullmatch(name))


def check_file(path: Path, size: int, slots: int, floors: dict[int, int]) -> dict[int, int]:
    """The file parses, is whole, keeps the static part and holds, for each writer, a whole value
    at least as new as ``floors`` (its last acknowledged seq); returns each writer's seq."""
    data = path.read_bytes()
    try:
        doc = json.loads(data)
    except ValueError as exc:  # pragma: no cover - the failure being tested for
        raise AssertionError(f"{path} does not parse after a kill ({exc}): {data[:200]!r}...{data[-200:]!r}") from None
    static = static_document()
    assert same({k: doc[k] for k in static}, static), "a category no writer touched changed"
    assert list(doc)[-1] == "metadata"
    seqs = {}
    for slot in range(slots):
        value = doc[f"writer{slot}"]["value"]
        seq = value["seq"]
        assert value == value_for(slot, seq, size), f"writer{slot}'s value is not whole"
        assert seq >= floors.get(slot, 0), f"writer{slot}: file holds seq {seq}, but seq {floors[slot]} was acknowledged"
        seqs[slot] = seq
    return seqs


def watchdog(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Fail instead of hanging if the kill loop blocks (a writer that never reports)."""
    return alarm(seconds, f"the kill loop made no progress for {seconds} s")


class Tally:
    def __init__(self) -> None:
        self.kills = 0
        self.mid_write = 0
        self.acks = 0


def one_kill(server: KillServer, path: Path, rng: random.Random, tally: Tally, previous: int,
             *, freeze: str | None = None) -> int:
    """Start a writer, kill it (after a random delay, or once frozen at ``freeze``), check the
    file; return the seq it holds."""
    durable = FREEZE_POINTS[freeze][0] if freeze else rng.random() < 0.5
    freeze_set = rng.randrange(3)
    args: dict[str, Any] = {"path": str(path), "slot": 0, "durable": durable, "size": BLOB}
    if freeze:
        args.update(freeze=freeze, freeze_set=freeze_set)
    pid = server.spawn(**args)
    mine: list[tuple[int, int]] = []
    if freeze:
        server.reap(pid)  # it kills itself at the point
    else:
        deadline = time.monotonic() + rng.uniform(0.0, 0.03)
        while (left := deadline - time.monotonic()) > 0:
            mine += [(k, v) for p, k, v in server.records(left) if p == pid]
        server.kill(pid)
    mine += [(k, v) for p, k, v in server.records() if p == pid]

    opened = [v for k, v in mine if k == OPENED]
    acked = [v for k, v in mine if k == ACK]
    assert acked == sorted(acked) and len(set(acked)) == len(acked)
    if opened:
        assert opened == [previous], f"the writer resumed from {opened[0]}, the file held {previous}"
        assert acked == list(range(previous + 1, previous + 1 + len(acked)))
    last_ack = acked[-1] if acked else previous
    newest_possible = last_ack + 1 if opened else previous
    seq = check_file(path, BLOB, 1, {0: max(previous, last_ack)})[0]
    assert seq <= newest_possible, f"the file holds seq {seq}, never set (last attempt {newest_possible})"
    temps = temps_in(path.parent)
    assert len(temps) <= 1, f"temp files pile up: {temps}"
    if freeze:
        assert len(acked) == freeze_set, "the writer was killed in the wrong set"
        replaced = FREEZE_POINTS[freeze][1]
        assert seq == (last_ack + 1 if replaced else last_ack), f"frozen {freeze}: file holds {seq}, last ack {last_ack}"
        assert len(temps) == (0 if replaced else 1), f"frozen {freeze}: temp files {temps}"
        if temps:  # what the kill left of the new document in the temp file
            size, whole = (path.parent / temps[0]).stat().st_size, path.stat().st_size
            expected = {"created": size == 0, "half-written": 0 < size < whole}.get(freeze, size > BLOB)
            assert expected, f"killed at {freeze}: the temp file has {size} bytes, the status file {whole}"
    tally.kills += 1
    tally.mid_write += len(temps)
    tally.acks += len(acked)
    return seq


@pytest.mark.long
def test_sigkill_at_random_moments(tmp_path: Path, server: KillServer, soak: bool, reliability: Any,
                                   seed: int) -> None:
    path = tmp_path / "run_logs" / NAME
    prepare(path, 1, BLOB)
    rng = random.Random(seed)
    tally = Tally()
    seq = 0
    # 250, not 160: without the old os-level hooks a writer is faster, and fewer random kills land
    # inside the write protocol; 250 keep "kills_mid_write" at least where it was (111 of 269).
    for _ in range(5000 if soak else 250):
        with watchdog(TIMEOUT):
            seq = one_kill(server, path, rng, tally, seq)
    reliability.add("kills", tally.kills, source=SOURCE)
    reliability.add("kills_mid_write", tally.mid_write, source=SOURCE)
    reliability.add("kill_sets", tally.acks, source=SOURCE)
    assert tally.acks > 0  # the writers did get work done between kills

    # The next open (recovery) cleans up and reads the newest value.
    store = StatusStore(path)
    assert store.get("writer0", "value")["seq"] == seq
    assert temps_in(path.parent) == []
    store.close()


@pytest.mark.parametrize("point", list(FREEZE_POINTS))
def test_sigkill_at_each_point_of_the_write_protocol(tmp_path: Path, server: KillServer, point: str, soak: bool,
                                                     reliability: Any, seed: int) -> None:
    path = tmp_path / "run_logs" / NAME
    prepare(path, 1, BLOB)
    rng = random.Random(f"{seed}-{point}")
    tally = Tally()
    seq = 0
    for _ in range(100 if soak else 7):
        with watchdog(TIMEOUT):
            seq = one_kill(server, path, rng, tally, seq, freeze=point)
    if not FREEZE_POINTS[point][1]:
        assert tally.mid_write == tally.kills  # each one left its temp file, each cleaned next time
    reliability.add("kills", tally.kills, source=SOURCE)
    reliability.add("kills_mid_write", tally.mid_write, source=SOURCE)
    reliability.add("kill_sets", tally.acks, source=SOURCE)


@pytest.mark.long
# 64 KB values are written by each writer itself; 2 KB ones fit the box a waiting process hands
# to the holder (_mailbox), so there the holder killed may be carrying another writer's set.
@pytest.mark.parametrize("size", [64_000, 2_000], ids=["own-writes", "handed-over"])
def test_sigkill_one_of_several_concurrent_writers(tmp_path: Path, server: KillServer, soak: bool, reliability: Any,
                                                   seed: int, size: int) -> None:
    """Three writers at once; one at a time is killed (possibly holding the lock, mid-write or
    mid-merge, or carrying another's handed-over set) and restarted. Every acknowledged value
    survives the others' merges, and a restarted writer resumes from at least its last
    acknowledged value."""
    slots = 3
    path = tmp_path / "run_logs" / NAME
    prepare(path, slots, size)
    rng = random.Random(seed)
    floors = dict.fromkeys(range(slots), 0)
    pids: dict[int, int] = {}
    slot_of: dict[int, int] = {}
    opened_at: dict[int, int] = {}
    kills = acks = started = 0
    handed: set[tuple[int, int]] = set()  # (pid, arrival) of each request seen written by a holder

    def start(slot: int) -> None:
        nonlocal started
        pid = server.spawn(path=str(path), slot=slot, durable=rng.random() < 0.3, size=size)
        pids[slot], slot_of[pid] = pid, slot
        started += 1

    def absorb(records: list[tuple[int, int, int]]) -> None:
        nonlocal acks
        for pid, kind, value in records:
            slot = slot_of[pid]
            if kind == OPENED:
                assert value >= floors[slot], f"writer{slot} restarted at {value}, {floors[slot]} was acknowledged"
                opened_at[pid] = value
            elif kind == ACK:
                assert value > floors[slot]
                floors[slot] = value
                acks += 1

    for slot in range(slots):
        start(slot)
    for _ in range(1000 if soak else 60):
        with watchdog(TIMEOUT):
            deadline = time.monotonic() + rng.uniform(0.005, 0.04)
            while (left := deadline - time.monotonic()) > 0:
                absorb(server.records(left))
            victim = rng.randrange(slots)
            server.kill(pids[victim])
            kills += 1
            absorb(server.records())  # everything acknowledged so far, before reading the file
            check_file(path, size, slots, floors)
            assert len(temps_in(path.parent)) <= slots + 1
            handed |= handed_over(path)
            start(victim)
    for slot in range(slots):
        server.kill(pids[slot])
    absorb(server.records())
    check_file(path, size, slots, floors)
    store = StatusStore(path)
    assert all(store.get(f"writer{s}", "value")["seq"] >= floors[s] for s in range(slots))
    assert temps_in(path.parent) == []
    store.close()
    assert acks > 0
    if size < _mailbox.BOX and _fair._HANDOFF:
        assert handed, "no writer handed a set to another: this run did not test what it is for"
    reliability.add("kills", kills, source=SOURCE)
    reliability.add("kill_sets", acks, source=SOURCE)
    reliability.add("concurrent_writers", started, source=SOURCE)
    reliability.add("concurrent_sets", acks, source=SOURCE)


# -- the issue's concurrency numbers --------------------------------------------------------------


def assert_every_key_and_count(path: Path, workers: int, sets: int) -> None:
    doc = json.loads(path.read_bytes())
    assert doc[_workers.COUNTER[0]] == {_workers.COUNTER[1]: workers * sets}
    for worker in range(workers):
        assert doc[_workers.own_category(worker)] == _workers.expected_own(worker, sets)


@pytest.mark.long
@pytest.mark.parametrize("layout", ["one-store", "store-per-thread"])
def test_threads_at_the_issues_numbers(tmp_path: Path, layout: str, soak: bool, reliability: Any) -> None:
    """8 threads x 200 sets of their own keys plus 200 increments each in a transaction
    (test_concurrency runs 60; this is the issue's figure, with durable=False)."""
    threads, sets = (16, 500) if soak else (8, 200)
    path = tmp_path / NAME
    if layout == "one-store":
        store = StatusStore(path, durable=False)
        stores = [store] * threads
    else:
        stores = [StatusStore(path, durable=False) for _ in range(threads)]
    run_threads([lambda w=w: _workers.work(stores[w], w, sets) for w in range(threads)], timeout=4 * TIMEOUT)
    assert_every_key_and_count(path, threads, sets)
    stores[0].reload()
    assert stores[0].to_dict() == json.loads(path.read_bytes())
    reliability.add("concurrent_writers", threads, source=SOURCE)
    reliability.add("concurrent_sets", threads * sets * 2, source=SOURCE)


def test_kill_server_reports_a_writer_that_dies_by_itself(tmp_path: Path, server: KillServer) -> None:
    """The harness has teeth: a writer failing on its own is not counted as a kill."""
    path = tmp_path / "missing-dir-is-a-file"
    path.write_bytes(b"")
    pid = server.spawn(path=str(path / NAME), slot=0, durable=False, size=10)
    deadline = time.monotonic() + TIMEOUT  # it fails at once: the parent of its status file is a file
    while Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(AssertionError, match="ended by itself"):
        server.kill(pid)


def test_every_unit_of_a_value_depends_on_its_seq() -> None:
    """So a value stitched from two writes (a torn file) can never pass for a whole one."""
    a, b = value_for(0, 41, 1000), value_for(0, 42, 1000)
    assert len(a["blob"]) == len(b["blob"]) == 1000
    unit = len("0:000000041;")
    assert all(a["blob"][i:i + unit] != b["blob"][i:i + unit] for i in range(0, 1000 - unit, unit))
