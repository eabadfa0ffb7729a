"""The demo runs on its own and shows what the README says it shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kill_and_resume.py"


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
