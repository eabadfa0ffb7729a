"""trainstatus' pytest plugin (entry point ``pytest11``): the ``crash_point`` fixture.

A module of its own, outside the ``trainstatus`` package, because pytest imports every installed
plugin at startup: importing ``trainstatus`` (its store, filelock, orjson) would cost every test
suite of the environment, those that never use it included. This module imports only pytest,
which is loaded already; ``trainstatus.testing`` is imported when a test asks for the fixture.

Use::

    @pytest.mark.trainstatus_crash_points(writes=4)            # or points=("renamed", ...)
    def test_resume(fs, crash_point):                          # one test per (write, point)
        with trainstatus.testing.kill_at(*crash_point):
            train()
        check_resume()

One more case, ``write-count``, runs the ``kill_at`` block without a kill and fails unless the
scenario makes exactly ``writes`` writes (a number too low would leave the later writes untested,
silently); the test ends with the block there. A block that does not run in pytest's process (a
child process's, with ``sigkill=True``) cannot be counted: that case is then reported as skipped,
with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest

MARKER = "trainstatus_crash_points"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(writes, points=POINTS): run the test once per (write, point) of "
        "trainstatus.testing.crash_points(writes, points), given as the crash_point fixture",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "crash_point" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid} uses the crash_point fixture without "
            f"@pytest.mark.{MARKER}(writes=N): add the marker with the number of writes the test's "
            "scenario makes.")
    from trainstatus.testing import crash_points

    points: list[Any] = crash_points(*marker.args, **marker.kwargs)
    # The last point again, for the write-count case (the point only makes kill_at's arguments valid).
    count = _WriteCount(points[-1].write, points[-1])
    metafunc.parametrize("crash_point", [*points, count], ids=[*(str(p) for p in points), WRITE_COUNT], indirect=True)


WRITE_COUNT = "write-count"


class _WriteCount:
    def __init__(self, writes: int, point: Any) -> None:
        self.writes = writes
        self.point = point


class _Counted(BaseException):
    """The write-count case's block made the writes its marker says: the case passed."""


def _finish(expected: int, made: int) -> None:
    from trainstatus.testing import TrainingStatusTestError

    if made == expected:
        raise _Counted()
    if made > expected:
        untested = f"write {made}" if made == expected + 1 else f"writes {expected + 1} to {made}"
        consequence = f"so no kill at {untested} is tested"
    else:
        missing = f"write {expected}" if expected == made + 1 else f"writes {made + 1} to {expected}"
        consequence = f"so the cases of {missing} fail with kills that never happen"
    raise TrainingStatusTestError(
        f"This test's scenario makes {made} status write{'s' if made != 1 else ''} (its kill_at block, run once "
        f"without a kill), but @pytest.mark.{MARKER}(writes={expected}) says {expected}, {consequence}. "
        f"Set writes={made}.")


# An old-style hookwrapper (``outcome = yield``), not a new-style ``wrapper``: pytest loads this plugin in
# every environment trainstatus is installed in, and pluggy before 1.2 (pytest 7) refuses the new kind
# at import, which would break that environment's pytest whether it uses trainstatus or not.
@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    outcome = yield
    if outcome.excinfo is not None and isinstance(outcome.excinfo[1], _Counted):
        outcome.force_result(True)  # the write-count case ends with its kill_at block, passed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    count = _counting.get(item.nodeid)
    report = outcome.get_result()
    if call.when != "call" or count is None or count.used or not report.passed:
        return
    # Skipped rather than failed: the scenario may run, rightly, in a child process (kill_at with
    # sigkill=True), whose writes this process cannot count; the case ran as the last kill case.
    filename, line = item.reportinfo()[:2]
    report.outcome = "skipped"
    report.longrepr = (str(filename), (line or 0) + 1, f"Skipped: {_NOT_COUNTED}")


_NOT_COUNTED = (
    "no kill_at block ran in pytest's process, so the number of writes of this test's scenario is not checked "
    "(a block in a child process, or with sigkill=True, cannot be counted; without a block, pass crash_point on "
    "as kill_at(*crash_point) around the scenario). Check writes= with "
    "trainstatus.testing.count_writes(scenario) in a test of its own.")

_counting: dict[str, Any] = {}  # nodeid -> the WriteCount of a write-count case being run


@pytest.fixture
def crash_point(request: pytest.FixtureRequest) -> Any:
    """A ``trainstatus.testing.CrashPoint`` (write, point): pass it on as ``kill_at(*crash_point)``.

    Parametrized by ``@pytest.mark.trainstatus_crash_points(writes=N)``: one case per (write,
    point), and the ``write-count`` case, whose ``kill_at`` block runs without a kill and checks
    that the scenario makes exactly N writes.
    """
    if not isinstance(request.param, _WriteCount):
        yield request.param
        return
    from trainstatus._testing import kill as _testing_kill

    expected = request.param.writes
    count = _testing_kill.WriteCount(expected, lambda made: _finish(expected, made))
    _testing_kill.write_count = count
    _counting[request.node.nodeid] = count
    try:
        yield request.param.point
    finally:
        _testing_kill.write_count = None
        del _counting[request.node.nodeid]
