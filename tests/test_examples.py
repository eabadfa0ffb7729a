"""The demo runs on its own and shows what the README says it shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
