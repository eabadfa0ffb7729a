"""The scripts of .ci/: what each promises, on small pyprojects made for the purpose.

``.ci/lowest_constraints.py`` pins every direct dependency (and the ``s3`` extra's boto3) to the
lowest version pyproject.toml allows, for CI's lowest-dependencies leg. A pin it got wrong, or a
requirement it let drop out unseen, makes that leg test versions the bounds do not name.

``.ci/coverage_totals.py`` prints the lines and the branches covered apart, for each module of
``trainstatus.integrations`` and in total, from the data file .ci/run combined.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The scripts read pyproject.toml with tomllib (Python 3.11+), as CI's interpreter does.
tomllib = pytest.importorskip("tomllib", reason="the .ci scripts need Python 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parent.parent
LOWEST = ROOT / ".ci" / "lowest_constraints.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(LOWEST), *args], capture_output=True, text=True, timeout=60)


def _pyproject(tmp_path: Path, dependencies: list[str], s3: list[str] | None = None) -> Path:
    path = tmp_path / "pyproject.toml"
    lines = ["[project]", 'name = "x"', f"dependencies = {json.dumps(dependencies)}"]  # JSON strings are TOML's
    if s3 is not None:
        lines += ["[project.optional-dependencies]", f"s3 = {json.dumps(s3)}", 'test = ["pytest>=8"]']
    path.write_text("\n".join(lines) + "\n")
    return path


RUNTIME = ["filelock>=3.30", "orjson>=3.10"]
S3 = ["boto3>=1.35.50"]
ONE_BOUND = "a direct dependency needs exactly one '>=' (or '~=') lower bound"


def test_the_projects_own_pyproject_gives_one_pin_per_bound_it_declares() -> None:
    done = _run()
    assert done.returncode == 0, done.stderr
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["s3"]
    expected = [re.sub(r"\s*#.*|\s", "", r).replace(">=", "==") for r in declared]
    assert done.stdout.split() == expected
    assert [pin.split("==")[0] for pin in expected] == ["filelock", "orjson", "boto3"]


@pytest.mark.parametrize(
    ("requirement", "pin"),
    [
        pytest.param("orjson>=3.9", "orjson==3.9", id="plain"),
        pytest.param("orjson >= 3.10.1", "orjson==3.10.1", id="spaces"),
        pytest.param("orjson~=3.9", "orjson==3.9", id="compatible"),  # 3.9 <= v < 4
        pytest.param("orjson>=1,<2", "orjson==1", id="with_an_upper_bound"),
        pytest.param("orjson<2,>=1", "orjson==1", id="upper_bound_first"),
        pytest.param("orjson>=1.5,!=1.6", "orjson==1.5", id="with_an_exclusion"),
    ],
)
def test_the_lowest_version_allowed_is_pinned(tmp_path: Path, requirement: str, pin: str) -> None:
    done = _run(str(_pyproject(tmp_path, ["filelock>=3.0", requirement], ["boto3>=1.34"])))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["filelock==3.0", pin, "boto3==1.34"]


@pytest.mark.parametrize(
    ("requirement", "says"),
    [
        pytest.param("orjson", ONE_BOUND, id="no_bound"),
        pytest.param("orjson<4", ONE_BOUND, id="only_an_upper_bound"),
        pytest.param("orjson==3.10", ONE_BOUND, id="exact"),
        pytest.param("orjson>3.10", ONE_BOUND, id="strictly_greater"),
        pytest.param("orjson>=1,>=2", ONE_BOUND, id="two_lower_bounds"),
        pytest.param("orjson>=1,~=2.0", ONE_BOUND, id="two_kinds"),
        pytest.param("orjson>=2,<2", "its lower bound 2 is not a version it allows", id="empty_range"),
        pytest.param("orjson>=1.6,!=1.6", "its lower bound 1.6 is not a version it allows", id="bound_excluded"),
        pytest.param("orjson>=3.10; python_version<'3.12'", "a direct dependency needs a plain lower bound, without a marker or URL", id="marker"),
        pytest.param("orjson>=>3.10", "not a valid requirement", id="invalid"),
    ],
)
def test_a_requirement_without_one_lowest_version_is_refused(tmp_path: Path, requirement: str, says: str) -> None:
    done = _run(str(_pyproject(tmp_path, ["filelock>=3.30", requirement], S3)))
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith(f"{requirement!r}: {says}"), done.stderr


@pytest.mark.parametrize(
    ("dependencies", "s3", "missing", "where"),
    [
        pytest.param(RUNTIME, [], "boto3", "[s3] extra", id="s3_emptied"),
        pytest.param(RUNTIME, ["requests>=2"], "boto3", "[s3] extra", id="s3_without_boto3"),
        pytest.param(RUNTIME, None, "boto3", "[s3] extra", id="no_s3_extra"),
        pytest.param(["filelock>=3.30"], S3, "orjson", "dependencies", id="orjson_dropped"),
        pytest.param([], S3, "filelock", "dependencies", id="no_dependencies"),
    ],
)
def test_a_required_package_dropped_from_its_group_fails(
        tmp_path: Path, dependencies: list[str], s3: list[str] | None, missing: str, where: str) -> None:
    path = _pyproject(tmp_path, dependencies, s3)
    done = _run(str(path))
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith(f"{path}: its {where} no longer requires {missing}, which trainstatus imports: "
                                  "put it back with a '>=' lower bound"), done.stderr


def test_a_required_package_named_otherwise_or_with_extras_counts(tmp_path: Path) -> None:
    done = _run(str(_pyproject(tmp_path, ["FileLock>=3.30", "orjson>=3.10"], ["Boto3[crt]>=1.35.50"])))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["FileLock==3.30", "orjson==3.10", "Boto3==1.35.50"]


def test_more_than_one_argument_is_a_usage_error() -> None:
    done = _run("a", "b")
    assert done.returncode != 0 and done.stderr.strip() == "usage: lowest_constraints.py [pyproject.toml]"


TOTALS = ROOT / ".ci" / "coverage_totals.py"


def _measured(tmp_path: Path) -> Path:
    """A data file of one module under src/trainstatus/integrations/: 4 of its 5 lines run, 1 of its
    2 branches taken."""
    module = tmp_path / "src" / "trainstatus" / "integrations" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text("def f(a):\n    if a:\n        return 1\n    return 2\n\n\nf(True)\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith("COVERAGE_")}  # a traced CI step's
    subprocess.run([sys.executable, "-m", "coverage", "run", "--branch", "--data-file=data", str(module)],
                   cwd=tmp_path, env=env, check=True, capture_output=True, timeout=60)
    return tmp_path / "data"


def _totals(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOTALS), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)


def test_coverage_totals_gives_lines_and_branches_apart_for_each_integration_module(tmp_path: Path) -> None:
    done = _totals(tmp_path, str(_measured(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert [line.split() for line in done.stdout.splitlines()] == [
        ["src/trainstatus/integrations/x.py", "80.0%", "of", "5", "lines,", "50.0%", "of", "2", "branches"],
        ["TOTAL", "80.0%", "of", "5", "lines,", "50.0%", "of", "2", "branches"],
    ]


def test_coverage_totals_fails_under_the_floor_naming_what_is_below(tmp_path: Path) -> None:
    data = _measured(tmp_path)
    assert _totals(tmp_path, str(data), "--fail-under", "50").returncode == 0
    done = _totals(tmp_path, str(data), "--fail-under", "85")
    assert done.returncode == 1 and done.stderr == "coverage of lines and branches is below 85%\n"
    done = _totals(tmp_path, str(data), "--fail-under", "60")
    assert done.returncode == 1 and done.stderr == "coverage of branches is below 60%\n"


def test_coverage_totals_fails_when_no_integration_module_was_measured(tmp_path: Path) -> None:
    data = _measured(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    done = _totals(tmp_path / "elsewhere", str(data))  # the module's path no longer under src/trainstatus/integrations/
    assert done.returncode == 1
    assert done.stderr == f"{data}: no module of src/trainstatus/integrations/ was measured\n"
