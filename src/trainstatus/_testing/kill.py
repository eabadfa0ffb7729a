"""Simulated kills: the n-th write of any store stops at a named point of the write protocol.

The write protocol (``_storage.atomic.write_atomic``) tells ``_storage.atomic.observer`` each point
it passes; ``kill_at`` installs an observer that counts writes and, at the chosen point of the
chosen one:

1. lets background work already queued (history pruning on the closer thread) finish, so the
   outcome does not depend on thread timing;
2. takes a snapshot of the folder (``root``, by default the status file's directory);
3. marks the stores of the "dead process" (every store opened inside the block, and every store
   of the file being written) so that they refuse further use;
4. raises ``SimulatedKill``, a ``BaseException``, so ``except Exception`` in a trainer lets it pass.

On its way out the exception runs the clean-up a real SIGKILL never runs (the temp file is
removed, locks are released, ``finally`` blocks write): when the block ends, ``kill_at`` puts the
folder back exactly as it was at the kill. While the exception is unwinding, anything that uses a
dead store, and any write of any store, raises the same ``SimulatedKill`` again: a dead process
does nothing more.

This module holds that session and its runners (``kill_at``, ``find_crash_points``,
``count_writes``, ``every_crash``, and the pytest plugin's ``WriteCount``); the crash points and
the names a kill is made of (``POINTS``, ``Kill``, ``SimulatedKill``, the errors) are in
``points``. It imports ``points``, ``fs``, the store, the local file's storage and its closer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from .._storage import atomic as _atomic
from .._storage.closer import _closer
from .._storage.local import LocalFile
from .. import _store
from .._errors import TrainingStatusError, TrainingStatusValueError
from .._store import StatusStore
from .fs import FsState, restore, snapshot
from .points import (
    _ONLY_DURABLE,
    POINTS,
    CrashPoint,
    Kill,
    SimulatedKill,
    TrainingStatusKilledError,
    TrainingStatusTestError,
    _check_points,
)

__all__ = ["WriteCount", "count_writes", "every_crash", "find_crash_points", "kill_at", "write_count"]


class _DeadStore(StatusStore):
    """The class a store of a killed process is given: every call but ``close`` refused."""

    def close(self) -> None:
        _close_dead(self)


_REFUSED = ("get", "set", "delete", "clear", "save", "transaction", "run_transaction", "reload", "to_dict")


def _refuser(name: str) -> Callable[..., Any]:
    def refused(self: StatusStore, *args: Any, **kwargs: Any) -> Any:
        session: _Session = self._testing_kill  # type: ignore[attr-defined]
        if session.dying:
            raise session.exception  # the process is dead: nothing it does gets done
        raise TrainingStatusKilledError(
            f"This StatusStore on {self.path} belongs to a trainer killed by trainstatus.testing.kill_at "
            f"(write {session.kill.write}, at {session.kill.point!r}), so {name}() is refused: a killed "
            "process runs no more code. Open a new StatusStore on the file (start the trainer again) "
            "to see what it resumes from.",
            path=self.path,
        )

    refused.__name__ = name
    return refused


for _name in _REFUSED:
    setattr(_DeadStore, _name, _refuser(_name))


def _close_dead(store: StatusStore) -> None:
    """A dead store's ``close``: what the kernel does for a dead process (its files are closed)."""
    try:
        StatusStore.close(store)
    except TrainingStatusError:  # killed inside a transaction of another thread: close the files only
        store._storage.close()



class _Session:
    """The state of one ``kill_at`` block (or of a dry run, with ``kill.write == 0``)."""

    def __init__(self, kill: Kill, root: str | None, sigkill: bool) -> None:
        self.kill = kill
        self.root = root
        self.sigkill = sigkill
        self.lock = threading.Lock()
        self.count = 0
        self.current: dict[int, int] = {}  # thread -> the write it is making
        self.reached: dict[int, list[str]] = {}  # write -> the points it passed (a dry run's answer)
        self.thread = threading.get_ident()
        self.kill_thread: int | None = None
        self.before: weakref.WeakSet[StatusStore] = weakref.WeakSet(_store._live_stores)
        self.dead: list[StatusStore] = []
        self.saved: FsState | None = None
        self.dying = False
        self.exception = SimulatedKill(kill.write, kill.point, "")

    def observe(self, point: str, target: str, temp: str, fd: int) -> None:
        if self.dying:
            raise self.exception  # any write while the killed process unwinds: it is dead
        thread = threading.get_ident()
        with self.lock:
            if point == "created":
                self.count += 1
                self.current[thread] = self.count
            write = self.current.get(thread, 0)
            passed = self.reached.setdefault(write, [])
            passed.append(point)
            if point == "written":
                passed.insert(-1, "half-written")
            chosen = self.kill.write
            if write != chosen or self.kill.killed:
                return
            wanted = self.kill.point
            if not (point == wanted or (wanted == "half-written" and point == "written")):
                return
            self.kill.killed = True
        if wanted == "half-written":
            os.ftruncate(fd, os.fstat(fd).st_size // 2)
        self.die(target, thread)

    def die(self, target: str, thread: int) -> None:
        # Work an earlier write queued on the background thread finishes first: a real kill may
        # land before or after it; waiting makes the outcome the same on every run.
        _closer.wait()
        if self.sigkill:
            os.kill(os.getpid(), signal.SIGKILL)
        kill = self.kill
        kill.path = target
        kill.root = self.root if self.root is not None else os.path.dirname(target)
        self.saved = snapshot(kill.root)
        self.kill_thread = thread
        self.exception = SimulatedKill(kill.write, kill.point, target)
        for store in list(_store._live_stores):
            storage = store._storage
            mine = store not in self.before
            same_file = isinstance(storage, LocalFile) and storage.target == target
            if (mine or same_file) and type(store) is StatusStore:
                store._testing_kill = self  # type: ignore[attr-defined]
                store.__class__ = _DeadStore
                self.dead.append(store)
        self.dying = True
        raise self.exception

    def finish(self) -> None:
        """After the block: the dead process's files are closed, the folder is as at the kill."""
        if not self.kill.killed:
            return
        self.dying = False
        _closer.wait()
        for store in self.dead:
            _close_dead(store)
        _closer.wait()
        assert self.saved is not None and self.kill.root is not None
        restore(self.saved, self.kill.root)
        # The dead stores keep this session (for their message), and it the exception: without
        # its traceback the killed frames (and what they held open) go now, not at some later GC.
        self.exception.__traceback__ = None
        self.exception.__context__ = None
        self.dead.clear()
        self.saved = None


_active: list[_Session] = []  # at most one: the observer slot is one


class WriteCount:
    """Set by the pytest plugin for a marked test's ``write-count`` case: its next ``kill_at``
    block runs without a kill, and ``finish`` gets the number of writes the block made (it raises:
    the test fails if that is not ``expected``, and ends there otherwise).

    Only a block in pytest's own process counts (``pid``), and not one with ``sigkill=True``: a
    child process forked by the test inherits this state, but its parent checks how it ended
    (killed, as in the other cases), and could not hear the count."""

    def __init__(self, expected: int, finish: Callable[[int], Any]) -> None:
        self.expected = expected
        self.finish = finish
        self.used = False
        self.pid = os.getpid()

    def counts(self, sigkill: bool) -> bool:
        return not self.used and not sigkill and self.pid == os.getpid()


write_count: WriteCount | None = None


@contextlib.contextmanager
def _observing(session: _Session) -> Iterator[_Session]:
    if _active or _atomic.observer is not None:
        raise TrainingStatusTestError(
            "kill_at (or every_crash) is already active: one simulated kill at a time. End the "
            "outer block first.")
    _active.append(session)
    _atomic.observer = session.observe
    try:
        yield session
    finally:
        _atomic.observer = None
        _active.clear()


def _path(root: str | os.PathLike[str] | None) -> str | None:
    return None if root is None else os.path.abspath(os.fspath(root))


@contextlib.contextmanager
def kill_at(write: int, point: str, *, root: str | os.PathLike[str] | None = None,
            sigkill: bool = False) -> Iterator[Kill]:
    """Kill the process, in simulation, at ``point`` of the ``write``-th write inside the block.

    Counts the writes of every ``StatusStore`` on a local file, in every thread (a transaction or
    ``CheckpointList.add`` is one write; the restore of a damaged file at open is one too). At the
    chosen point the folder ``root`` (default: the status file's directory; give the run folder to
    cover checkpoint files too) is left exactly as a SIGKILL there would leave it: the temp file
    stays, nothing of the clean-up the exception runs on its way out remains. ``SimulatedKill``
    is raised in the writing thread and caught at the end of the block, which then yields to the
    test: open a new store (restart the trainer) and check what it resumes.

    Every store opened inside the block, and every store of the file written, is dead afterwards:
    any call but ``close`` raises ``TrainingStatusKilledError``. The block raises
    ``TrainingStatusTestError`` if the kill never happened (fewer writes, or a point a
    ``durable=False`` store does not pass) or if the block went on after it (the trainer caught
    ``BaseException``).

    ``sigkill=True`` sends the process a real SIGKILL at the point instead: for a trainer run in a
    child process, whose parent then checks the folder. Works the same under pyfakefs (where locks
    are no-ops) and on a real folder; local files only, not ``s3://``.
    """
    if type(write) is not int or write < 1:
        raise TrainingStatusValueError(
            f"kill_at: write= must be the number of a write (an int >= 1; 1: the first), not {write!r}.")
    _check_points([point])
    if write_count is not None and write_count.counts(sigkill):
        write_count.used = True
        with _observing(_Session(Kill(0, "created"), None, False)) as counting:
            yield Kill(write, point)
        _closer.wait()
        write_count.finish(counting.count)
        return
    kill = Kill(write, point)
    session = _Session(kill, _path(root), sigkill)
    failure: BaseException | None = None
    arrived = False
    with _observing(session):
        try:
            yield kill
        except SimulatedKill as exc:
            if exc is not session.exception:
                raise
            arrived = True
        except BaseException as exc:  # noqa: BLE001 - examined below
            if not kill.killed:
                raise
            failure = exc
        finally:
            kill.writes = session.count
            session.finish()
    if failure is not None:
        raise TrainingStatusTestError(
            f"The simulated kill at write {write} ({point!r}) was replaced, on its way out of the block, "
            f"by {type(failure).__name__}: {failure}. That was raised by code that ran after the kill "
            "(a finally or except block of the trainer); a killed process runs none. Let the kill "
            "through, or move that code out of the path of the exception."
        ) from failure
    if not kill.killed:
        made = {1: "1 write"}.get(session.count, f"{session.count} writes")
        reason = ""
        if point in _ONLY_DURABLE and write <= session.count:
            reason = f"; write {write} never reached {point!r} (a store opened with durable=False syncs nothing)"
        raise TrainingStatusTestError(
            f"kill_at({write}, {point!r}) never killed: the block made {made}{reason}. Kill at a write "
            "and point the scenario reaches (crash_points(writes=...) with its number of writes)."
        )
    if session.kill_thread == session.thread and not arrived:
        raise TrainingStatusTestError(
            f"The simulated kill at write {write} ({point!r}) did not reach the end of the kill_at block: "
            "the code in it caught the SimulatedKill (an except BaseException: or a bare except:) and "
            "went on, which a killed process cannot do. Let BaseException through."
        )


def find_crash_points(run: Callable[[], object], points: tuple[str, ...] | list[str] = POINTS) -> list[CrashPoint]:
    """Run ``run()`` once, with no kill, and list every (write, point) it passes, in order."""
    _check_points(points)
    session = _Session(Kill(0, "created"), None, False)
    with _observing(session):
        run()
    _closer.wait()
    found = []
    for write in sorted(w for w in session.reached if w > 0):
        passed = session.reached[write]
        found += [CrashPoint(write, p) for p in POINTS if p in points and p in passed]
    return found


def count_writes(run: Callable[[], object]) -> int:
    """Run ``run()`` once, with no kill, and return the number of status writes it made.

    Counted as ``kill_at`` counts them (any ``StatusStore`` on a local file, in any thread; a
    transaction or a ``CheckpointList.add`` is one write): the ``writes`` that
    ``crash_points(writes)`` needs. Run it on a folder of its own, or put the folder back after.
    """
    session = _Session(Kill(0, "created"), None, False)
    with _observing(session):
        run()
    _closer.wait()
    return session.count


def every_crash(run: Callable[[], object], check: Callable[[Kill], object], *,
                root: str | os.PathLike[str], points: tuple[str, ...] | list[str] = POINTS) -> list[Kill]:
    """Kill ``run()`` at every point of every write it makes; ``check(kill)`` after each.

    ``root`` is the folder the scenario works in: its state before the first run is put back
    before each run (and at the end), and it is what each kill leaves as a SIGKILL would. A dry
    run first finds the writes and the points each passes. ``check`` gets the ``Kill`` (which
    write, which point, the status file's path) and should start the trainer again and check what
    it resumes; its stores should be closed when it returns. Returns the kills made, in order.
    """
    folder = _path(root)
    assert folder is not None
    initial = snapshot(folder)
    try:
        found = find_crash_points(run, points)
        if not found:
            raise TrainingStatusTestError(
                "every_crash found no write to kill: the scenario wrote no status file (or only on s3://).")
        kills = []
        for write, point in found:
            restore(initial, folder)
            with kill_at(write, point, root=folder) as kill:
                run()
            check(kill)
            kills.append(kill)
    finally:
        _closer.wait()
        restore(initial, folder)
    return kills
