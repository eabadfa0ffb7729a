"""The demo runs on its own and shows what the README and docs/getting-started.md say it shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kill_and_resume.py"
CHECKPOINT_EXAMPLE = EXAMPLE.with_name("checkpoint_resume.py")


def test_kill_and_resume_demo_resumes_exactly_where_ml_agents_style_loses_everything() -> None:
    result = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    ml_agents, trainstatus = out.split("trainstatus (write-through):")
    assert "resumed at lesson 0; knows 0 kept checkpoint(s), 0 of them on disk" in ml_agents
    killed = [line for line in trainstatus.splitlines() if "killed with SIGKILL" in line]
    assert killed and "exit status -9" in killed[0]
    reported = int(killed[0].rsplit(" ", 1)[1])
    resumed = next(line for line in trainstatus.splitlines() if "resumed at lesson" in line)
    lesson = int(resumed.split("resumed at lesson ")[1].split(";")[0])
    assert lesson in (reported, reported + 1)
    assert "knows 3 kept checkpoint(s), 3 of them on disk" in resumed
    assert "trainstatus resumed at the lesson the trainer reached: yes" in out


def test_checkpoint_demo_resumes_from_the_last_complete_checkpoint_after_a_kill_mid_save() -> None:
    result = subprocess.run([sys.executable, str(CHECKPOINT_EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    killed, damaged = result.stdout.split("Then the newest recorded checkpoint file is damaged:")
    assert "killed with SIGKILL (exit status -9) while writing checkpoint 5; the last save it finished: steps 4000" in killed
    assert "newest file on disk: Walker-5000.ckpt, which does not load: truncated: 262144 of 524288 bytes" in killed
    assert "the status lists 3 checkpoint(s), 3 of them on disk" in killed
    assert "CheckpointList.latest(): models/Walker-4000.ckpt, which loads (steps 4000)" in killed
    assert "[warning] " not in killed
    assert "steps 4000 (the check raised ValueError: checksum mismatch)" in damaged
    assert "CheckpointList.latest(): models/Walker-3000.ckpt, which loads (steps 3000)" in damaged
    assert "resumed from the last complete checkpoint (steps 4000): yes" in result.stdout
    assert "skipped the damaged one for steps 3000: yes" in result.stdout


# -- the crash-recovery example tests (docs/testing.md) --------------------------------------------

EXAMPLES = EXAMPLE.parent
CRASH_EXAMPLES = ["test_trainer_crash_fakefs.py", "test_trainer_crash_folder.py", "test_trainer_power_loss.py"]


def run_examples(files: list[str], bug: str = "") -> tuple[int, str, set[str]]:
    """pytest on the example test files, with the toy trainer's ``bug`` variant; (exit, out, failed ids)."""
    env = {k: v for k, v in os.environ.items() if k != "TOY_TRAINER_BUG"}
    if bug:
        env["TOY_TRAINER_BUG"] = bug
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-cov", "-q", "-rf",
         *(str(EXAMPLES / f) for f in files)],
        capture_output=True, text=True, timeout=300, env=env, cwd=EXAMPLES.parent)
    failed = {line.split(" ")[1].split("::", 1)[1] for line in result.stdout.splitlines() if line.startswith("FAILED ")}
    return result.returncode, result.stdout + result.stderr, failed


@pytest.mark.long
def test_the_crash_examples_pass_on_the_correct_trainer() -> None:
    code, out, failed = run_examples(CRASH_EXAMPLES)
    assert code == 0 and failed == set(), out
    assert "45 passed" in out  # 42 kills under pyfakefs (6 writes x 7 points) and its write count, the folder, the power loss


def _kills(writes: tuple[int, ...], points: tuple[str, ...]) -> set[str]:
    return {f"test_resumes_after_a_kill_at_any_point[write{w}-{p}]" for w in writes for p in points}


FOLDER = "test_resumes_after_a_kill_at_any_point_of_three_steps"
POWER = "test_resumes_soundly_after_a_power_loss_at_any_moment"


@pytest.mark.long
def test_every_crash_example_catches_a_checkpoint_recorded_before_its_file_is_complete() -> None:
    code, out, failed = run_examples(CRASH_EXAMPLES, "record-before-complete")
    assert code == 1, out
    # Every kill, and the folder and power-loss tests: CheckpointList records each file's size, so
    # an entry recorded while its file was half written no longer matches the file once it is
    # complete. latest() skips it, and the resumed run finds the lesson ahead of the checkpoint it
    # falls back to, crash or no crash. (Before sizes were recorded, only the kills after that
    # record was on disk, the first write of each step, caught it.)
    every_kill = _kills((1, 2, 3, 4, 5, 6), ("created", "half-written", "written", "synced", "renamed",
                                             "dir-synced", "returned"))
    assert failed == every_kill | {FOLDER, POWER}, out
    assert "lesson 1 is ahead of the model it resumes from (steps 0)" in out


@pytest.mark.long
def test_every_crash_example_catches_a_curriculum_ahead_of_its_checkpoint() -> None:
    code, out, failed = run_examples(CRASH_EXAMPLES, "lesson-first")
    assert code == 1, out
    # Step 2 sets lesson 1 (write 3) before recording checkpoint 2000 (write 4).
    expected = _kills((3,), ("renamed", "dir-synced", "returned")) | _kills((4,), ("created", "half-written", "written", "synced"))
    assert failed == expected | {FOLDER, POWER}, out
    assert "lesson 1 is ahead of the model it resumes from (steps 1000)" in out


def test_only_the_power_loss_example_catches_a_status_that_is_not_durable() -> None:
    """durable=False is atomic: every kill recovers; only a power loss can lose or damage it."""
    code, out, failed = run_examples(["test_trainer_crash_folder.py", "test_trainer_power_loss.py"], "not-durable")
    assert code == 1 and failed == {POWER}, out
