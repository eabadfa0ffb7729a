"""Every state a power loss during two training steps could leave, on a real folder.

``power_losses`` records the os operations of the run (checkpoint files, their fsyncs, the
status file's temp file, rename, directory fsync...) and lays out, one at a time, each state the
documented model allows after any prefix of them: unsynced data and unsynced directory entries
may be lost or torn. In each, the restarted trainer must resume soundly, from no earlier than
the status writes acknowledged before the power loss, and once the run had returned at its end.

Run: python -m pytest examples/test_trainer_power_loss.py
"""

from __future__ import annotations

import os
from pathlib import Path

from toy_trainer import Trainer, check_resume

from trainstatus.testing import PowerLoss, power_losses


def test_resumes_soundly_after_a_power_loss_at_any_moment(tmp_path: Path) -> None:
    run = tmp_path / "run1"

    def scenario() -> None:
        Trainer(str(run)).train(2)

    def check(loss: PowerLoss) -> None:
        trainer = check_resume(loss.folder)
        # Nothing acknowledged is lost: the first status write of each step records its checkpoint.
        assert trainer.steps >= 1000 * ((loss.acknowledged + 1) // 2), loss
        if loss.returned:  # everything the run did was synced before it returned
            assert (trainer.steps, trainer.lesson) == (2000, 1), loss
        trainer.close()

    recording = power_losses(scenario, check, root=run, scratch=tmp_path)
    assert recording.states > len(recording.ops)
    assert os.listdir(tmp_path) == ["run1"]  # the states' folders are gone
