"""The README's commands are the ones CI and a newcomer run."""

from __future__ import annotations

import re
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
    for marker in ("long", "mlagents", "integrations"):
        command = next(c for c in _readme_commands() if f"-m {marker} " in c)
        assert f"if ! {command}; then" in ci, marker
    # ...and the default run leaves them out (pyproject's addopts), so that they are not run twice.
    assert "-m 'not long and not mlagents and not integrations'" in (ROOT / "pyproject.toml").read_text()


def test_readme_demo_command_runs_the_example_that_exists() -> None:
    demo = next(c for c in _readme_commands() if "examples/" in c)
    script = demo.rsplit(" ", 1)[1]
    assert (ROOT / script).is_file()
    assert "pip install -e ." in demo
