"""Every test runs under a time limit (pytest-timeout, tests/conftest.py's TIME_LIMITS): a hang
fails that test with the stack of every thread, its fixtures still kill what it started, and the
run goes on. Checked on a pytest run of its own, with this suite's configuration and conftest, over
tests written here that hang on purpose (limits of half a second, not the real ones)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest

import conftest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = float(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"])

HANGING = textwrap.dedent(
    '''
    import json, os, subprocess, sys, threading, time
    from pathlib import Path
    import pytest
    import conftest
    from _helpers import alarm

    HERE = Path(__file__).parent


    @pytest.fixture
    def child():
        """A process started for the test, and killed by its fixture, as the suite's harnesses do."""
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (HERE / "child.pid").write_text(str(process.pid))
        try:
            yield process
        finally:
            process.kill()
            process.wait()


    def blocked_in_a_worker(never):
        never.wait()


    @pytest.mark.timeout(0.5)
    def test_hangs_waiting_for_its_child(child):
        threading.Thread(target=blocked_in_a_worker, args=(threading.Event(),), name="blocked-worker",
                         daemon=True).start()
        child.wait()


    @pytest.fixture
    def hangs_in_setup():
        threading.Event().wait()
        yield


    @pytest.mark.timeout(0.5)
    def test_hangs_in_a_fixture(hangs_in_setup):
        pass


    @pytest.fixture
    def slow_build():
        with conftest.off_the_clock():
            time.sleep(0.8)  # a one-time build, longer than the test's limit: not counted


    @pytest.mark.timeout(0.5)
    def test_a_build_is_off_the_clock(slow_build):
        time.sleep(0.2)


    @pytest.mark.timeout(0.5)
    def test_after_a_build_the_rest_of_the_limit_holds(slow_build):
        threading.Event().wait()


    @pytest.mark.timeout(0.5)
    def test_the_limit_holds_after_a_watchdog_of_the_tests_own():
        with alarm(30, "the watchdog's own"):
            time.sleep(0.2)
        threading.Event().wait()


    @pytest.mark.timeout(0.5)
    def test_the_limit_comes_first_inside_a_longer_watchdog():
        with alarm(30, "the watchdog's own"):
            threading.Event().wait()


    @pytest.mark.timeout(30)  # what is left of it runs on while the failure is reported
    def test_a_shorter_watchdog_still_fires_first():
        with alarm(0.3, "the watchdog's own"):
            threading.Event().wait()


    def limit(request):
        """The limit pytest-timeout applies: the test's timeout marker, else --timeout, else the ini's."""
        marker = request.node.get_closest_marker("timeout")
        if marker is not None:
            return marker.args[0]
        return request.config.getoption("timeout") or float(request.config.getini("timeout"))


    @pytest.fixture
    def record(request):
        yield
        found = json.loads((HERE / "limits.json").read_text()) if (HERE / "limits.json").exists() else {}
        found[request.node.name] = limit(request)
        (HERE / "limits.json").write_text(json.dumps(found))


    def test_limit_default(record):
        pass


    @pytest.mark.long
    def test_limit_long(record):
        pass


    @pytest.mark.mlagents
    def test_limit_mlagents(record):
        pass


    @pytest.mark.integrations
    def test_limit_integrations(record):
        pass


    @pytest.mark.ray
    def test_limit_ray(record):
        pass


    @pytest.mark.long
    @pytest.mark.integrations
    def test_limit_two_groups(record):
        pass


    @pytest.mark.integrations
    @pytest.mark.timeout(5)
    def test_limit_its_own(record):
        pass
    '''
)


def inner_run(folder: Path, *options: str, select: str = "") -> tuple[subprocess.CompletedProcess[str], float]:
    """pytest on ``HANGING`` with this suite's pyproject.toml and conftest (as a plugin: the file is
    not under tests/), every group selected; the run and its seconds."""
    folder.mkdir()
    (folder / "test_hanging.py").write_text(HANGING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_TIMEOUT", None)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(folder), "-p", "conftest",
         "-p", "no:cacheprovider", "--no-cov", "-m", "", "--junitxml", str(folder / "report.xml"),
         *(["-k", select] if select else []), *options, str(folder / "test_hanging.py")],
        capture_output=True, text=True, timeout=120, cwd=folder, env=env,
    )
    return done, time.monotonic() - started


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended: only its parent's wait is missing
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def outcomes(report: Path) -> dict[str, str]:
    """Test name -> "passed", or the message of its failure or error."""
    found = {}
    for case in ElementTree.parse(report).iter("testcase"):
        failed = [child for child in case if child.tag in ("failure", "error")]
        found[case.attrib["name"]] = failed[0].attrib.get("message", "") if failed else "passed"
    return found


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("hang") / "run"
    done, seconds = inner_run(folder)
    pid = int((folder / "child.pid").read_text())
    child_alive = alive(pid)
    if child_alive:  # never leave it behind, even when the test below fails on it
        os.kill(pid, signal.SIGKILL)
    return done, seconds, outcomes(folder / "report.xml"), child_alive, json.loads((folder / "limits.json").read_text())


TIMED_OUT = "Failed: Timeout (>0.5s) from pytest-timeout."


def test_a_hang_fails_at_its_limit_with_the_stack_of_every_thread(hung: Any) -> None:
    done, seconds, found, _, _ = hung
    assert found["test_hangs_waiting_for_its_child"] == TIMED_OUT, done.stdout
    assert found["test_hangs_in_a_fixture"] == f'failed on setup with "{TIMED_OUT}"', done.stdout  # setup counts
    # The other threads' stacks, each with the line it is blocked on, printed at every limit from
    # the first on (the worker lives on): in the report's captured output or straight to the
    # terminal, as pytest's capture has it...
    timeouts = [name for name, outcome in found.items() if TIMED_OUT in outcome]
    assert len(timeouts) == 5, found
    assert done.stdout.count("~ Stack of blocked-worker (") == len(timeouts), done.stdout
    assert done.stdout.count("in blocked_in_a_worker\n    never.wait()\n") == len(timeouts), done.stdout
    # ...and the main thread's in the failure itself, at the line where the test hung.
    failure = done.stdout.split("_ test_hangs_waiting_for_its_child _", 1)[1]
    assert ">       child.wait()\n" in failure, done.stdout
    assert done.returncode == 1  # the run went on to the tests after the hangs, and failed
    assert found["test_limit_default"] == "passed"
    assert seconds < 60  # six hangs of half a second, a build of 0.8 s, pytest's start-up


def test_the_fixtures_of_a_test_that_hung_kill_the_process_it_started(hung: Any) -> None:
    _, _, _, child_alive, _ = hung
    assert not child_alive


def test_a_build_is_not_counted_but_the_rest_of_the_limit_holds(hung: Any) -> None:
    done, _, found, _, _ = hung
    assert found["test_a_build_is_off_the_clock"] == "passed", done.stdout
    assert found["test_after_a_build_the_rest_of_the_limit_holds"] == TIMED_OUT, done.stdout


def test_a_watchdog_of_the_tests_own_does_not_lift_its_limit(hung: Any) -> None:
    done, _, found, _, _ = hung
    assert found["test_the_limit_holds_after_a_watchdog_of_the_tests_own"] == TIMED_OUT, done.stdout
    assert found["test_the_limit_comes_first_inside_a_longer_watchdog"] == TIMED_OUT, done.stdout
    assert found["test_a_shorter_watchdog_still_fires_first"] == "AssertionError: the watchdog's own", done.stdout


def test_each_group_has_its_limit_and_a_tests_own_marker_wins(hung: Any) -> None:
    _, _, _, _, limits = hung
    assert limits == {
        "test_limit_default": DEFAULT,
        "test_limit_long": conftest.TIME_LIMITS["long"],
        "test_limit_mlagents": conftest.TIME_LIMITS["mlagents"],
        "test_limit_integrations": conftest.TIME_LIMITS["integrations"],
        "test_limit_ray": conftest.TIME_LIMITS["ray"],
        "test_limit_two_groups": max(conftest.TIME_LIMITS["long"], conftest.TIME_LIMITS["integrations"]),
        "test_limit_its_own": 5,
    }


@pytest.mark.parametrize(("options", "expected"), [
    (["--soak"], {"default": DEFAULT * conftest.SOAK_FACTOR, "long": conftest.TIME_LIMITS["long"] * conftest.SOAK_FACTOR}),
    (["--timeout", "7"], {"default": 7.0, "long": 7.0}),
], ids=["soak", "command-line"])
def test_soak_scales_the_limits_and_the_command_line_replaces_them(
    tmp_path: Path, options: list[str], expected: dict[str, float]
) -> None:
    done, _ = inner_run(tmp_path / "run", *options, select="test_limit_default or test_limit_long")
    assert done.returncode == 0, done.stdout + done.stderr
    limits = json.loads((tmp_path / "run" / "limits.json").read_text())
    assert limits == {f"test_limit_{group}": limit for group, limit in expected.items()}
