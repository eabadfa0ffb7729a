"""A kill at every moment of three training steps, under pyfakefs' ``fs`` fixture.

``@pytest.mark.trainstatus_crash_points(writes=6)`` (trainstatus' pytest plugin) makes one test
per (write, point): three steps write twice each (the checkpoint record, the lesson). In each,
``kill_at`` stops that write at that point, leaving the fake disk as a SIGKILL would; the test
then starts the trainer again, checks what it resumed, and that it trains on from there. One
more case, ``write-count``, runs the scenario without a kill and checks that it makes 6 writes.

Run: python -m pytest examples/test_trainer_crash_fakefs.py   (43 tests)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from toy_trainer import Trainer, check_resume

from trainstatus.testing import CrashPoint, kill_at

RUN = "/results/run1"


@pytest.fixture
def trainers() -> Iterator[list[Trainer]]:
    """Trainers to close at the end of the test, passed or failed: a store left open past its
    pyfakefs filesystem would close its descriptors in whatever test runs next."""
    opened: list[Trainer] = []
    yield opened
    for trainer in opened:
        trainer.close()


@pytest.mark.trainstatus_crash_points(writes=6)
def test_resumes_after_a_kill_at_any_point(fs: object, crash_point: CrashPoint, trainers: list[Trainer]) -> None:
    first = Trainer(RUN)
    trainers.append(first)  # once killed, its stores refuse everything but close()
    with kill_at(*crash_point, root=RUN) as kill:
        first.train(3)
    assert kill.killed
    trainer = check_resume(RUN)
    trainers.append(trainer)
    # Nothing acknowledged is lost: the write killed after its rename counts, one before does not.
    done_writes = kill.write - 1 + kill.replaced
    assert trainer.steps >= 1000 * (done_writes // 2)
    trainer.train(2)  # and it trains on from there
    trainers.append(check_resume(RUN))
    assert trainers[-1].steps == trainer.steps
