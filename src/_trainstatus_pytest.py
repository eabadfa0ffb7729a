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

    points = crash_points(*marker.args, **marker.kwargs)
    metafunc.parametrize("crash_point", points, ids=[str(p) for p in points])


@pytest.fixture
def crash_point(request: pytest.FixtureRequest) -> Any:
    """A ``trainstatus.testing.CrashPoint`` (write, point): pass it on as ``kill_at(*crash_point)``.

    Parametrized by ``@pytest.mark.trainstatus_crash_points(writes=N)``.
    """
    return request.param
