"""Power loss, the public face: record a run, hand a check every state a power loss could leave.

The recording is ``_testing.record``'s (over ``_testing.interpose``), the states
``_testing.model``'s; both are described there and, for users, under "Power loss" in
docs/testing.md.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from .._storage import atomic as _atomic
from .._storage.closer import _closer
from .._errors import TrainingStatusValueError
from .fs import FsState, materialize, snapshot
from .interpose import Call, Hook, Interposer
from .model import BLOCK, crash_states, write_outcomes
from .record import IncompleteRecording, Op, Recorder, replay, verify_recording

__all__ = [
    # The recorder and the model, used from here by the test suite's checker (tests/_crashsim.py).
    "BLOCK",
    "Call",
    "Hook",
    "IncompleteRecording",
    "Interposer",
    "Op",
    "PowerLoss",
    "Recorder",
    "Recording",
    "crash_states",
    "power_losses",
    "record",
    "replay",
    "verify_recording",
    "write_outcomes",
]


@dataclasses.dataclass(frozen=True)
class Recording:
    """One recorded run: the folder before and after it, and the operations in between.

    ``operations`` describes each operation, in order, as one of (names relative to the folder,
    ``#n`` a file by its inode, as the file may be renamed; ``.`` the folder itself)::

        create(name as #n, 0o600)    a new file made (os.open with O_CREAT, open(name, "w"))
        mkdir(name)                  a new directory
        rename(old -> new)           os.replace / os.rename
        link(old -> new)             os.link: a second name for the file
        unlink(name)                 os.unlink / os.remove
        write(#n, 512 bytes at 0)    os.write / os.pwrite, or a write of a file open() made
        truncate(#n, 0)              os.ftruncate / os.truncate, or an existing file opened with "w"
        chmod(#n, 0o644)             os.fchmod / os.chmod: the permission bits
        fsync(#n)                    os.fsync of a file: its data and bits are durable
        fdatasync(#n)                os.fdatasync: its data only
        dirsync(name)                os.fsync of a directory: its entries are durable

    ``ops`` holds them as ``Op`` objects (``kind``, ``rel``, ``dest``, ...). ``status_writes``
    lists the status writes that returned during the run (a ``set``, a transaction's end, a
    ``CheckpointList.add``: each acknowledged to the trainer), in the order they returned, as
    (status file name, number of operations done when it returned). ``states`` is the number of
    distinct power-loss states ``power_losses`` checked.
    """

    before: FsState
    after: FsState
    ops: tuple[Op, ...]
    states: int = 0
    status_writes: tuple[tuple[str, int], ...] = ()

    @property
    def operations(self) -> tuple[str, ...]:
        return tuple(str(op) for op in self.ops)


@dataclasses.dataclass(frozen=True)
class PowerLoss:
    """One state a power loss could leave, laid out in ``folder`` for the check.

    ``done`` operations of the run had happened (``returned``: all of them, the run had returned);
    ``acknowledged`` status writes had returned by then, the first ones of
    ``recording.status_writes``: what the restarted trainer must find is at least what those
    wrote. ``state`` is the same tree as a value (``content(name)``, ``mode(name)``,
    ``entries``), names relative to the folder. ``folder`` is removed once the check returns.
    ``str(loss)`` says all this in a line, for an assertion's message.
    """

    folder: str
    done: int
    state: FsState
    recording: Recording

    @property
    def returned(self) -> bool:
        """Whether the run had returned: every operation done."""
        return self.done == len(self.recording.ops)

    @property
    def acknowledged(self) -> int:
        """How many status writes had returned (to the trainer) before the power loss."""
        return sum(1 for _, done in self.recording.status_writes if done <= self.done)

    def __str__(self) -> str:
        ops, writes, count = self.recording.ops, self.recording.status_writes, self.acknowledged
        if self.returned:
            when = f"after all {len(ops)} operations (the run had returned)"
        else:
            last = f"; the last: {ops[self.done - 1]}" if self.done else ""
            when = f"after {self.done} of {len(ops)} operations{last}"
        if not writes:
            acknowledged = "the run made no status write"
        elif count == 0:
            acknowledged = f"none of its {len(writes)} status writes acknowledged"
        else:
            acknowledged = (f"status writes 1 to {count} of {len(writes)} acknowledged" if count > 1
                            else f"status write 1 of {len(writes)} acknowledged") + f" (the last of {writes[count - 1][0]})"
        return f"power loss {when}; {acknowledged}; laid out in {self.folder}"


def record(run: Callable[[], object], root: str | os.PathLike[str],
           watch: re.Pattern[str] | None = None) -> tuple[Recording, Recorder]:
    """Run ``run()`` with every os operation in ``root`` recorded; check the recording explains it.

    Background work the run queued (history pruning) is waited for inside the recording, so its
    operations are part of it. The status writes that return are noted with the number of
    operations done by then (through the write protocol's observer, chained to any other).
    """
    folder = os.path.abspath(os.fspath(root))
    os.makedirs(folder, exist_ok=True)
    initial = snapshot(folder)
    recorder = Recorder(folder, initial, watch=watch)
    writes: list[tuple[str, int]] = []
    previous = _atomic.observer

    def observe(point: str, target: str, temp: str, fd: int) -> None:
        if point == "returned":
            real = os.path.realpath(target)
            if real.startswith(recorder.root + os.sep):
                writes.append((os.path.relpath(real, recorder.root), len(recorder.ops)))
        if previous is not None:
            previous(point, target, temp, fd)

    _atomic.observer = observe
    try:
        with recorder:
            try:
                run()
            finally:
                _closer.wait()
    finally:
        _atomic.observer = previous
    verify_recording(recorder, folder)
    return Recording(initial, snapshot(folder), tuple(recorder.ops), status_writes=tuple(writes)), recorder


def power_losses(run: Callable[[], object], check: Callable[[PowerLoss], object], *,
                 root: str | os.PathLike[str], scratch: str | os.PathLike[str] | None = None,
                 block: int = BLOCK) -> Recording:
    """Run ``run()`` in ``root`` once, recorded; then ``check`` every state a power loss could leave.

    Each distinct state (the crash model: "Power loss" in docs/testing.md) is laid out in a
    fresh folder under ``scratch`` (default: a new temporary directory, removed at the end) with
    the names it has under ``root``; ``check(loss)`` should open the store there
    (``os.path.join(loss.folder, "run_logs", "training_status.json")``), as the restarted trainer
    would, and assert what it recovers: at least what the ``loss.acknowledged`` status writes that
    had returned wrote, everything once ``loss.returned``. States equal on disk are checked once
    for each number of writes acknowledged (one more time for the state after the run returned).
    Returns the ``Recording``, with the number of states; its ``operations`` name what was done.
    An exception from ``check`` gets ``str(loss)`` as a note (Python 3.11+), saying which state failed.

    The builtin ``open`` is recorded too (files inside ``root`` get file objects made of ``os``
    calls while recording), so checkpoints written with ``pickle.dump``, ``np.save`` or
    ``torch.save(obj, f)`` are in the model. Raises ``IncompleteRecording`` if the run changed the
    folder in a way the recorder did not see (C code writing to a file name on its own, as
    ``torch.save(obj, "name")`` does): the states would be missing those changes. Give such code a
    file object, or make those files outside ``root``.
    """
    if type(block) is not int or block < 1:
        raise TrainingStatusValueError(
            f"power_losses: block= must be the disk's block size in bytes (an int >= 1; default {BLOCK}), "
            f"not {block!r}.")
    recording, _ = record(run, root)
    base = tempfile.mkdtemp(prefix="trainstatus-power-", dir=None if scratch is None else os.fspath(scratch))
    counter = itertools.count()
    seen: set[tuple[Any, ...]] = set()
    final = len(recording.ops)
    returns = [done for _, done in recording.status_writes]
    try:
        for k, state in crash_states(recording.before, list(recording.ops), block):
            # The same state with more writes acknowledged asks more of the check: checked again.
            key = (bisect.bisect_right(returns, k), k == final, state.key())
            if key in seen:
                continue
            seen.add(key)
            folder = os.path.join(base, str(next(counter)))
            materialize(state, folder)
            loss = PowerLoss(folder, k, state, recording)
            try:
                check(loss)
            except BaseException as exc:
                if hasattr(exc, "add_note"):  # Python 3.11+: pytest shows it under the failure
                    exc.add_note(str(loss))
                raise
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return dataclasses.replace(recording, states=len(seen))
