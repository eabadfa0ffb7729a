"""The scripts of .ci/: what each promises, on small pyprojects made for the purpose.

``.ci/lowest_constraints.py`` pins every direct dependency (and the ``s3`` extra's boto3) to the
lowest version pyproject.toml allows, for CI's lowest-dependencies leg. A pin it got wrong, or a
requirement it let drop out unseen, makes that leg test versions the bounds do not name.
"""

from __future__ import annotations

import json
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
