"""Crash-recovery tests of your own trainer: simulated kills at named points, and power loss.

Three tools, for a test suite (they need nothing but trainstatus; pytest and pyfakefs are
optional, and this module imports neither):

- ``kill_at(write, point)``: a ``with`` block in which the ``write``-th write of any
  ``StatusStore`` stops at ``point`` (one of ``POINTS``) and leaves the folder exactly as a
  SIGKILL there would (the temp file stays, no clean-up runs), raising ``SimulatedKill`` (a
  ``BaseException``) out of your trainer; the block catches it. Then start the trainer again and
  check its resume. ``crash_points(writes)`` lists every (write, point) for
  ``pytest.mark.parametrize`` (``count_writes(run)`` counts the writes); ``every_crash(run,
  check, root=...)`` runs them all.
- ``power_losses(run, check, root=...)``: records every os operation ``run()`` makes in ``root`` (its
  builtin ``open`` included: ``pickle.dump``, ``np.save``, ``torch.save(obj, f)``)
  and hands ``check`` each state a power loss after any of them could leave, laid out in a
  folder (the model is described under "Power loss" in docs/testing.md, the manual's page on
  testing your trainer's crash recovery).
- A pytest plugin (installed with trainstatus, loaded lazily): the ``crash_point`` fixture,
  parametrized by ``@pytest.mark.trainstatus_crash_points(writes=N)``, with a ``write-count``
  case that fails unless the scenario makes exactly N writes.

Everything works on a real folder (``tmp_path``) and under pyfakefs' ``fs`` fixture, where
``fcntl.flock`` is a no-op: locks then exclude nothing, which a single-process test does not
need. Local status files only (not ``s3://``).
"""

from ._testing.fs import FsState as DirectoryState
from ._testing.kill import count_writes, every_crash, kill_at
from ._testing.points import (
    POINTS,
    CrashPoint,
    Kill,
    SimulatedKill,
    TrainingStatusKilledError,
    TrainingStatusTestError,
    crash_points,
)
from ._testing.power import IncompleteRecording, Op as Operation, PowerLoss, Recording, power_losses

__all__ = [
    "POINTS",
    "CrashPoint",
    "DirectoryState",
    "IncompleteRecording",
    "Kill",
    "Operation",
    "PowerLoss",
    "Recording",
    "SimulatedKill",
    "TrainingStatusKilledError",
    "TrainingStatusTestError",
    "count_writes",
    "crash_points",
    "every_crash",
    "kill_at",
    "power_losses",
]
