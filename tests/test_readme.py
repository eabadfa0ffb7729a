"""The README's commands are the ones CI and a newcomer run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## On a fresh machine", 1)[1]
    return re.findall(r"```\n(.+?)\n```", section)


def test_ci_runs_the_readme_test_command_word_for_word() -> None:
    commands = _readme_commands()
    test_command = next(c for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"if ! ({test_command}); then" in ci


def test_ci_runs_the_readme_commands_of_the_marked_groups_as_steps_of_their_own() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    for marker in ("long", "mlagents", "integrations", "ray"):
        command = next(c for c in _readme_commands() if f"-m {marker} " in c)
        assert f"if ! {command}; then" in ci, marker
    # ...and the default run leaves them out (pyproject's addopts), so that they are not run twice.
    assert "-m 'not long and not mlagents and not integrations and not ray'" in (ROOT / "pyproject.toml").read_text()


def test_readme_demo_command_runs_the_example_that_exists() -> None:
    demo = next(c for c in _readme_commands() if "examples/" in c)
    script = demo.rsplit(" ", 1)[1]
    assert (ROOT / script).is_file()
    assert "pip install -e ." in demo


def test_the_tests_that_build_an_environment_are_marked_by_needing_it() -> None:
    # The default run (pyproject's -m) must not collect a test that builds .venv-torch/ (about 1 GB)
    # or .venv-mlagents/: conftest marks each by the fixture it takes, whatever its file says.
    files = ["tests/test_integration_sb3.py", "tests/test_integration_lightning.py", "tests/test_checkpoints.py"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--no-cov", "-p", "no:cacheprovider", *files],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    collected = result.stdout.splitlines()
    assert not [test for test in collected if "test_integration_sb3.py::" in test]
    assert not [test for test in collected if "test_integration_lightning.py::" in test]
    assert not [test for test in collected if "read_each_others_lists" in test]  # its mla_python test
    assert any("test_checkpoints.py::" in test for test in collected)  # the file itself is collected
