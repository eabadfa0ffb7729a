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
    for marker in ("long", "mlagents", "integrations", "ray", "deepspeed"):
        command = next(c for c in _readme_commands() if f"-m {marker} " in c)
        assert f"if ! {command}; then" in ci, marker
    # ...and the default run leaves them out (pyproject's addopts), so that they are not run twice.
    assert "-m 'not long and not mlagents and not integrations and not ray and not deepspeed'" in (
        ROOT / "pyproject.toml").read_text()


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


def test_the_readme_gives_each_groups_time_limit_as_configured() -> None:
    # pyproject.toml's default and conftest's limit per group, as the README's paragraph says them.
    import tomllib

    import conftest

    default = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"]
    limits = {group: seconds // 60 for group, seconds in conftest.TIME_LIMITS.items()}
    text = " ".join((ROOT / "README.md").read_text().split())
    # as the README groups them
    assert limits["long"] == limits["mlagents"] and limits["integrations"] == limits["ray"] == limits["deepspeed"]
    assert (f"{default // 60} minutes in the default run, {limits['long']} in `long` and `mlagents`, "
            f"{limits['integrations']} in `integrations`, `ray` and `deepspeed`") in text
    assert f"`--soak` gives {conftest.SOAK_FACTOR} times as long" in text
