"""The crash points of a write, and what a simulated kill is: the names ``trainstatus.testing`` shows.

``POINTS`` names the moments of the write protocol where ``kill_at`` can stop a write;
``CrashPoint`` is one (write, point) and ``crash_points`` lists them for ``pytest.mark.parametrize``;
``Kill`` is what a ``kill_at`` block yields; ``SimulatedKill`` is the exception a kill raises, and
the two errors are a dead store's refusal and a crash test that tests nothing. Kept apart from
``kill`` (the session that stops a write and puts the folder back): these say what a kill is, that
says how one is made, and ``record`` (power-loss recordings) takes its error from here without the
store.

Imports nothing of the package but its errors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from .._errors import TrainingStatusError, TrainingStatusTypeError, TrainingStatusValueError

__all__ = [
    "POINTS",
    "_ONLY_DURABLE",
    "CrashPoint",
    "Kill",
    "SimulatedKill",
    "TrainingStatusKilledError",
    "TrainingStatusTestError",
    "_check_points",
    "crash_points",
]

POINTS = ("created", "half-written", "written", "synced", "renamed", "dir-synced", "returned")
"""The points of a write where ``kill_at`` can stop it, in the order a write passes them:

- ``created``: the temp file exists, empty;
- ``half-written``: the temp file holds the first half of the new document (a kill inside ``write``);
- ``written``: the temp file holds all of it, not yet synced;
- ``synced``: the temp file is fsynced (only ``durable=True`` stores sync);
- ``renamed``: the temp file has replaced the status file, the directory is not synced yet;
- ``dir-synced``: the directory is synced (``durable=True`` only);
- ``returned``: the call that wrote (``set``, a transaction's end, ``CheckpointList.add``'s write)
  is done, its background work included; the caller's next line never runs.

The first three leave the old status file and a temp file; the last three the new file.
"""

_REPLACED = frozenset({"renamed", "dir-synced", "returned"})
_ONLY_DURABLE = frozenset({"synced", "dir-synced"})


class SimulatedKill(BaseException):
    """The process was killed here (simulated by ``trainstatus.testing.kill_at``).

    A ``BaseException``, like ``KeyboardInterrupt``: a trainer's ``except Exception`` does not
    catch it, as nothing catches a SIGKILL. ``kill_at`` catches it at the end of its block.
    Attributes: ``write`` (1 for the first write in the block), ``point`` (one of ``POINTS``),
    ``path`` (the status file being written).
    """

    def __init__(self, write: int, point: str, path: str) -> None:
        super().__init__(f"simulated kill at write {write} ({point}) of {path}; trainstatus.testing.kill_at "
                         "catches this at the end of its block: let it through (do not catch BaseException)")
        self.write = write
        self.point = point
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.write, self.point, self.path))


class TrainingStatusKilledError(TrainingStatusError):
    """A store of a process that ``kill_at`` killed was used after the kill.

    A killed trainer runs no more code, so its stores refuse every call but ``close``. Open a new
    ``StatusStore`` on the file (start the trainer again) to see what it resumes from.
    """


class TrainingStatusTestError(TrainingStatusError, AssertionError):
    """A crash test did not test what it says: the kill never happened, the trainer swallowed it,
    or a recording does not explain the folder. An ``AssertionError`` too, so pytest reports it as
    a failed test."""


@dataclasses.dataclass
class Kill:
    """What ``kill_at`` yields, filled in by the kill: which write stopped where.

    ``killed`` tells whether the kill happened (``kill_at`` raises at the end of its block if not);
    ``path`` is the status file that was being written, ``root`` the folder put back as it was at
    the kill, ``writes`` the number of writes the block started.
    """

    write: int
    point: str
    killed: bool = False
    path: str | None = None
    root: str | None = None
    writes: int = 0

    @property
    def replaced(self) -> bool:
        """Whether the killed write's new file had replaced the old one (``renamed`` or later)."""
        return self.point in _REPLACED


class CrashPoint(NamedTuple):
    """One moment to kill at: the ``write``-th write of the block, at ``point``."""

    write: int
    point: str

    def __str__(self) -> str:
        return f"write{self.write}-{self.point}"


def crash_points(writes: int, points: tuple[str, ...] | list[str] = POINTS) -> list[CrashPoint]:
    """Every (write, point) for ``writes`` writes: for ``pytest.mark.parametrize`` (``ids=str``).

    Give the number of writes the scenario makes; a kill at a write it never makes fails the test
    (``kill_at`` says how many it made). Leave ``synced`` and ``dir-synced`` out for a store opened
    with ``durable=False``.
    """
    if type(writes) is not int or writes < 1:
        raise TrainingStatusValueError(
            f"crash_points: writes= must be the number of writes the scenario makes (an int >= 1), not {writes!r}.")
    _check_points(points)
    return [CrashPoint(w, p) for w in range(1, writes + 1) for p in points]


def _check_points(points: tuple[str, ...] | list[str]) -> None:
    if isinstance(points, str):  # iterated, points="renamed" would be a list of letters
        raise TrainingStatusTypeError(f"points= must be a list of crash points, e.g. [{points!r}], not the str {points!r}.")
    unknown = [p for p in points if p not in POINTS]
    if unknown:
        raise TrainingStatusValueError(f"unknown crash point(s) {unknown!r}; choose from {', '.join(POINTS)}")
    if not points:
        raise TrainingStatusValueError(f"points= names no crash point; choose one or more from {', '.join(POINTS)}")
