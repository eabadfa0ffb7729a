"""Suite-wide options and the reliability figures.

``--soak`` makes the crash and concurrency suites long (5,000+ SIGKILLs, more writers).

The ``reliability`` fixture is a session-wide tally: a test that kills writers, checks crash
states, injects faults, tries damaged files or runs concurrent writers adds what it actually did
(``reliability.add("kills", n)``). At the end of the run the terminal summary prints the table,
so the figures in docs/reliability.md come from a command anyone can run (``-m ""``: every test,
the default run's and the ``long``, ``mlagents`` and ``integrations`` groups'), or for the
reliability suites alone:

    python -m pytest -m "" tests/test_crash_kill.py tests/test_crash_states.py tests/test_faults_merge.py \
        tests/test_security.py -q -p no:cacheprovider --no-cov
"""

from __future__ import annotations

import collections
import gc
import os
import random
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# Figure key -> the line printed for it, in the order printed.
FIGURES = {
    "kills": "writer processes SIGKILLed at random moments, file checked after each",
    "kills_mid_write": "  of which left a half-done temp file (killed inside the write protocol)",
    "kill_sets": "  acknowledged sets by the killed writers, none lost",
    "crash_states": "power-loss crash states of the real protocol, old-or-new in every one",
    "broken_checked": "crash states of broken protocols and durable=False checked",
    "broken_caught": "  of which the checker caught as violations",
    "faults": "I/O faults injected (OSError at a step or an os call), invariants checked",
    "damaged_files": "damaged or hostile files opened, bytes never lost",
    "concurrent_writers": "concurrent writers (threads, stores, processes)",
    "concurrent_sets": "  sets by those writers, every key and increment found",
    "interrupt_points": "Ctrl-C injection points enumerated (every line of set, transaction, ...)",
    "interrupts_caught": "SIGINTs at random moments caught by a setting process, 0 hangs",
}


class Reliability:
    """What the reliability suites did in this run, added up by the tests that did it."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.sources: dict[str, set[str]] = collections.defaultdict(set)

    def add(self, figure: str, n: int = 1, *, source: str | None = None) -> None:
        if figure not in FIGURES:
            raise KeyError(f"unknown reliability figure {figure!r}; add it to conftest.FIGURES")
        if n < 0:
            raise ValueError(f"a reliability figure only grows, not by {n}")
        self.counts[figure] += n
        if source:
            self.sources[figure].add(source)

    def lines(self) -> list[str]:
        rows = [(text, self.counts[key], ", ".join(sorted(self.sources[key])))
                for key, text in FIGURES.items() if key in self.counts]
        if not rows:
            return []
        width = max(len(text) for text, _, _ in rows)
        return [f"{text:<{width}}  {count:>8,}  {source}".rstrip() for text, count, source in rows]


_KEY = pytest.StashKey[Reliability]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak", action="store_true", default=False,
        help="long crash/concurrency runs: 5,000+ SIGKILLs and more concurrent writers",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_KEY] = Reliability()
    # Started with SIGINT ignored (``nohup pytest &`` from a non-interactive shell), Python leaves
    # it ignored, and so would every child it starts: the Ctrl-C tests would test nothing. What a
    # person at a terminal has, the suite has: the default handler, and children that take it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def mla_python() -> Path:
    """The interpreter of the ML-Agents environment: builds ``.venv-mlagents/`` once (tests/_mlagents_env.py)."""
    import _mlagents_env

    with off_the_clock():
        return _mlagents_env.ensure()


@pytest.fixture(scope="session")
def mla_torch_python() -> Path:
    """The interpreter of ML-Agents with torch: builds ``.venv-mlagents-torch/`` once (tests/_mlagents_env.py)."""
    import _mlagents_env

    with off_the_clock():
        return _mlagents_env.ensure_torch()


@pytest.fixture(scope="session", autouse=True)
def _sb3_logs_in_pytest_s_temp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """SB3's configure_logger makes ``<tempdir>/SB3-<date and time>`` at every ``learn()`` given no
    log folder: 210 of them were left in /tmp, which everything on the machine shares. Its
    ``SB3_LOGDIR`` (inherited by the children the tests start) points into pytest's own temp."""
    os.environ.setdefault("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))


@pytest.fixture(scope="session")
def torch_python() -> Path:
    """The interpreter of the torch environment: builds ``.venv-torch/`` once (tests/_torch_env.py)."""
    import _torch_env

    with off_the_clock():
        return _torch_env.ensure()


@pytest.fixture(scope="session")
def ray_python() -> Path:
    """The interpreter of the Ray Train environment: builds ``.venv-ray/`` once (tests/_ray_env.py)."""
    import _ray_env

    with off_the_clock():
        return _ray_env.ensure()


@pytest.fixture(scope="session")
def deepspeed_python() -> Path:
    """The interpreter of the DeepSpeed environment: builds ``.venv-deepspeed/`` once (tests/_deepspeed_env.py)."""
    import _deepspeed_env

    with off_the_clock():
        return _deepspeed_env.ensure()


# A fixture that builds an environment -> the marker of the tests that use it.
ENVIRONMENT_MARKERS = {"mla_python": pytest.mark.mlagents, "mla_torch_python": pytest.mark.mlagents,
                       "torch_python": pytest.mark.integrations, "ray_python": pytest.mark.ray,
                       "deepspeed_python": pytest.mark.deepspeed}


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: the marker must be there when it looks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that needs a built environment is marked by needing it: no test can build
    # .venv-mlagents/ (150 MB, ~30 s) or .venv-torch/ (about 1 GB, ~2 min) in the default run by
    # forgetting its marker.
    for item in items:
        for fixture, marker in ENVIRONMENT_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
    # ...and then its group's time limit (the markers above count).
    for item in items:
        limit = time_limit(config, item)
        if limit is not None:
            item.add_marker(pytest.mark.timeout(limit))


# -- a time limit on every test -------------------------------------------------------------------

# A hang fails in minutes, with the stack of every thread: pytest-timeout, its limit covering setup,
# call and teardown. pyproject.toml sets the default run's limit and ``timeout_method = "signal"``:
# the test fails where it hangs, in the main thread, so its ``finally`` blocks and fixtures still
# kill the processes it started, and the run goes on ("thread" would print the stacks and end the
# whole run with os._exit, leaving those processes running: checked, tests/test_time_limits.py).
# The other groups' tests take longer, so each marker carries its own limit, in seconds, several
# times the slowest honest test on 2 busy cores (load 3-5, measured with --durations):
# - default (pyproject.toml: 120): the slowest test takes 3.4 s; the slowest setup, Azurite's npm
#   install on a fresh checkout (33 s), is a build and taken off the clock (``off_the_clock``).
# - long (600): the slowest takes 67 s (test_codec's 20,000-example property), then 32 s (the
#   Azure server restarted mid-run); 9 times the slowest.
# - mlagents (600): 24 s the slowest but one; above the 300 s the tests give one mlagents-learn
#   run, so that their message comes first. The kill loop (20 runs killed and resumed, 175 s) sets
#   its own 1,200. Its environments' builds (66 s and 22 s on a fresh checkout) are off the clock.
# - integrations (900): 20 to 60 s a test, the kill loops (20 kills of 2 torchrun ranks) longer;
#   not measured here (the leg builds a 1 GB environment, 13.5 minutes a run): the tests' own bound
#   on one training child is 600 s, and the limit sits above it so that their message comes first.
# - deepspeed (900): a test runs DeepSpeed's engine on 2 ranks (a run in 8-15 s quietly); the kill
#   loop sets its own limit. The same reasoning as integrations.
# - ray (900): a test drives Ray Train's controller and 2 workers (7 tests in 2:38 quietly, 20 to
#   60 s each); the same reasoning as integrations.
# ``--soak`` runs up to 20 times the iterations of the kill and Ctrl-C loops (about 2 minutes for
# the longest quietly, 3 times that on busy cores): every limit is 4 times as long then.
# A test that honestly needs more says so itself, with ``@pytest.mark.timeout(seconds)``, which
# wins over its group's. Building an environment (.venv-torch/ takes 4.5 minutes) counts against no
# test: ``off_the_clock``. ``--timeout`` on the command line (0: none) replaces the groups' limits.
TIME_LIMITS = {"long": 600, "mlagents": 600, "integrations": 900, "ray": 900, "deepspeed": 900}
SOAK_FACTOR = 4


def time_limit(config: pytest.Config, item: pytest.Item) -> float | None:
    """The limit ``item`` is given by its group's marker, or None: its own ``timeout`` marker, the
    command line's ``--timeout`` (or ``PYTEST_TIMEOUT``), or pyproject.toml's default applies."""
    if item.get_closest_marker("timeout") is not None:
        return None
    if config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        return None
    soak = config.getoption("--soak")
    limits = [limit for marker, limit in TIME_LIMITS.items() if item.get_closest_marker(marker) is not None]
    if not limits and soak and config.getini("timeout"):
        limits = [float(config.getini("timeout"))]  # a default-run test that --soak makes longer
    if not limits:
        return None
    return max(limits) * (SOAK_FACTOR if soak else 1)


@contextmanager
def off_the_clock() -> Iterator[None]:
    """Hold the running test's time limit while a one-time build runs (a test group's virtual
    environment, Azurite's npm install): whichever test comes first would otherwise pay for it.
    The builds bound themselves (each pip or npm call has its own timeout, tests/_venvs.py); the
    test gets back what was left of its limit when the build ends."""
    left, _ = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's signal method: ITIMER_REAL
    try:
        yield
    finally:
        if left:
            signal.setitimer(signal.ITIMER_REAL, left)


@pytest.fixture
def workers(server: Any) -> Iterator[Any]:
    """The module's fork server (its ``server`` fixture: a ``_launch.Workers``), for one test: no
    worker of a run the test started outlives the test."""
    with server.owned():
        yield server


SEED_VARIABLE = "TRAINSTATUS_SEED"


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The seed of a test whose timing is random: ``TRAINSTATUS_SEED`` if set, else a fresh one.

    The seed is printed (pytest shows it with a failure) and added to a failed test's report, so
    ``TRAINSTATUS_SEED=<seed> python -m pytest <test id>`` repeats the run's choices.
    """
    given = os.environ.get(SEED_VARIABLE, "").strip()
    value = int(given) if given else random.SystemRandom().randrange(2**63)
    print(f"{SEED_VARIABLE}={value} repeats this test's random choices")
    request.node.stash[_SEED] = value
    return value


_SEED = pytest.StashKey[int]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and _SEED in item.stash:
        report.sections.append(("seed", f"rerun with {SEED_VARIABLE}={item.stash[_SEED]} python -m pytest '{item.nodeid}'"))
    return report


@pytest.fixture(autouse=True)
def _collector_left_on() -> Any:
    """Fail a test that leaves the garbage collector off (the library's pause after an error, or a
    test that turned it off itself), and turn it back on so the next tests run as programs do."""
    yield
    if not gc.isenabled():
        gc.enable()
        pytest.fail("the garbage collector was left disabled after this test", pytrace=False)


@pytest.fixture(autouse=True)
def _run_leases_released() -> Any:
    """Release the run leases this process took in a test (``integrations._shared.lease``): in
    pytest's process one test's "job" ends with the test, as a program's ends at its exit, and a
    later test (or a child it starts) on a folder of the same name must not find it held."""
    yield
    lease = sys.modules.get("trainstatus.integrations._shared.lease")
    if lease is not None:
        lease.release_all()


@pytest.fixture(scope="session")
def reliability(request: pytest.FixtureRequest) -> Reliability:
    return request.config.stash[_KEY]


@pytest.fixture(scope="session")
def soak(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--soak"))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash[_KEY].lines() if _KEY in config.stash else []
    if not lines:
        return
    soak = " (--soak)" if config.getoption("--soak") else ""
    terminalreporter.write_sep("=", f"reliability figures{soak}")
    for line in lines:
        terminalreporter.write_line(line)


# -- a real S3-compatible server for tests/test_s3*.py ---------------------------------------------


@pytest.fixture(scope="session")
def s3_server() -> Any:
    """moto's S3 server on loopback in a subprocess, one for the session (see tests/_s3server.py).

    boto3 and moto[server] are in the ``test`` extra: if either is missing this fails loudly
    instead of skipping, so an S3 suite that silently ran nothing cannot pass.
    """
    from _s3server import S3Server

    server = S3Server()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def s3(s3_server: Any) -> Any:
    """A fresh bucket on the session's S3 server: ``.url()``, ``.storage_options``, ``.objects()``..."""
    from _s3server import Bucket

    return Bucket(s3_server, s3_server.new_bucket())


# -- real GCS and Azure Blob servers for tests/test_object_store*.py ------------------------------


@pytest.fixture(scope="session")
def gcs_server() -> Any:
    """fake-gcs-server on loopback, one for the session (see tests/_objectservers.py)."""
    from _objectservers import GCSServer

    server = GCSServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def azure_server() -> Any:
    """Azurite's blob server on loopback, one for the session (npm installs it once per checkout)."""
    from _objectservers import AzuriteServer, azurite_binary

    with off_the_clock():  # npm's install: 33 s on a fresh checkout, in the first Azure test's setup
        azurite_binary()
    server = AzuriteServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(params=["s3", "gcs", "azure"])
def bucket(request: pytest.FixtureRequest) -> Any:
    """A fresh bucket (or container) on the session's server of each object store in turn."""
    server = request.getfixturevalue(f"{request.param}_server")
    if request.param == "s3":
        from _s3server import Bucket

        return Bucket(server, server.new_bucket())
    return server.container(server.new_bucket())
