"""The child's half of the process tests' harness: its events, and the fork server that starts ranks.

Imported by the children the tests start (tests/_dcp_trainer.py, _accelerate_trainer.py,
_lightning_ranks.py, _transformers_ranks.py, _checkpoint_writer.py), in whatever environment runs
them (.venv-torch's, a DeepSpeed one, the suite's own): the standard library only, never pytest.
The test's half is tests/_launch.py.

- ``say(event=..., **fields)``: one event, a JSON line written whole in one ``write`` (ranks share
  one pipe, and ``print`` writes a line and its newline apart), with ``rank`` (``RANK``), ``run``
  (the fork server's run number, else None) and ``t``.
- ``leave_once(options, rank, step)``: a rank's death in a ``torchrun`` run's first attempt, for its
  elastic restart.
- ``announce()``: the first event of a rank, ``pid``, after faulthandler is set to print every
  thread's stack on SIGUSR1 (``Launch`` asks for them when a wait runs out): the test kills by pid.
- ``serve(work)``: a process that has imported what its workers need once (torch and a training
  library take ten seconds or more on two busy cores), then, for each command line read on stdin
  (``{"run": n, "world": 2, "port": ..., "logs": [...], "options": {...}}``, written by
  ``_launch.Workers.start``), forks ``world`` workers, each running ``work(options)`` with its own
  stdout and stderr going to its log file and, when ``world`` > 1, the environment torchrun gives
  its workers (``environment``): what ``init_process_group`` reads. It says ``started`` (pids),
  then ``exited`` (worker, code: negative for a signal) as each ends, and reads the next command
  only once every worker of the run has ended. A worker that raises prints its traceback into its
  log, says ``crashed`` (type, message) and exits 1; one whose ``work`` returns exits 0.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

EVENTS = 1  # where events go: stdout, but a forked worker's own stdout is its log file
RUN: int | None = None  # the fork server's number of the run this process belongs to


def say(**fields: Any) -> None:
    """Write one event line (``event`` among ``fields``)."""
    sys.stdout.flush()  # a library's partial line first, or the event lands on the end of it
    line = json.dumps({**fields, "rank": int(os.environ.get("RANK", "0")), "run": RUN, "t": time.time()}) + "\n"
    os.write(EVENTS, line.encode())


def announce() -> None:
    """Set faulthandler on SIGUSR1, then say ``pid``."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    say(event="pid", pid=os.getpid())


def alone() -> None:
    """Events alone on stdout, the libraries' own lines to stderr (when nothing else reads them)."""
    global EVENTS
    EVENTS = os.dup(1)
    os.dup2(2, 1)


def leave_once(options: dict[str, Any], rank: int, step: int) -> None:
    """``exit_once`` ([rank, step]) in ``options``: that rank leaves with exit status 1, saying
    ``leaving``, once ``step``'s checkpoint is recorded, in the first attempt of a ``torchrun`` run
    only (``TORCHELASTIC_RESTART_COUNT`` 0): ``--max-restarts`` then restarts every worker, which
    resume (tests/_launch.py ``elastic``)."""
    if options.get("exit_once") == [rank, step] and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        say(event="leaving", step=step)
        os._exit(1)


def environment(rank: int, world: int, port: int) -> dict[str, str]:
    """What torchrun gives worker ``rank`` of ``world`` on one node."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "ROLE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": "trainstatus-test"}


def _fork(work: Callable[[dict[str, Any]], object], options: dict[str, Any], log: str, env: dict[str, str]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1  # pragma: no cover - the worker; it ends in os._exit
    try:
        os.environ.update(env)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        quiet = os.open(os.devnull, os.O_RDONLY)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.dup2(quiet, 0)  # the server's commands are not the worker's to read
        os.close(out)
        os.close(quiet)
        work(options)
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported through the log, an event and the exit status
        traceback.print_exc()
        say(event="crashed", type=type(exc).__name__, message=str(exc)[:2000])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # the interpreter's teardown is the server's, not the worker's


def serve(work: Callable[[dict[str, Any]], object]) -> None:
    """Fork the workers of each command read on stdin (module docstring) until stdin ends."""
    global EVENTS, RUN
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # inherited: into each worker's log
    EVENTS = os.dup(1)
    for line in sys.stdin:
        command = json.loads(line)
        world, options = command["world"], command["options"]
        RUN = command["run"]
        pids = [_fork(work, options, command["logs"][rank],
                      environment(rank, world, command["port"]) if world > 1 else {}) for rank in range(world)]
        say(event="started", pids=pids)
        for _ in pids:
            pid, status = os.wait()
            say(event="exited", worker=pids.index(pid), code=os.waitstatus_to_exitcode(status))
