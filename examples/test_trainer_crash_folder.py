"""A kill at every moment of three training steps, on a real folder (``tmp_path``).

``every_crash`` runs the scenario once to find its writes and the points each passes, then once
per (write, point), killed there, putting the folder back as it was before each run; ``check``
starts the trainer again each time. Real fsyncs, real locks, real rename.

Run: python -m pytest examples/test_trainer_crash_folder.py
"""

from __future__ import annotations

from pathlib import Path

from toy_trainer import BUG, Trainer, check_resume

from trainstatus.testing import POINTS, Kill, every_crash


def test_resumes_after_a_kill_at_any_point_of_three_steps(tmp_path: Path) -> None:
    run = str(tmp_path / "run1")
    durable = BUG != "not-durable"  # a store opened with durable=False passes no sync point

    def scenario() -> None:
        Trainer(run).train(3)

    def check(kill: Kill) -> None:
        trainer = check_resume(run)
        trainer.train(1)
        trainer.close()

    kills = every_crash(scenario, check, root=run)
    # 6 writes (the record and the lesson of each step), killed at every point each passes.
    assert [(k.write, k.point) for k in kills] == [(w, p) for w in range(1, 7) for p in POINTS
                                                   if durable or p not in ("synced", "dir-synced")]
