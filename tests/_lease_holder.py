"""Another job holding the run lease of a status file (``integrations._shared.lease``): a process
of its own, as a second training job on the same folder would be, so the lease's ``flock`` really
spans processes. Used by tests/test_run_lease.py and each integration's tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator

# Takes the lease of argv[1] (run name argv[2]), says "held", and waits for a line on stdin (then
# exits normally: atexit releases) or its end. With argv[3] == "fork" it first forks a child that
# outlives it, and prints the child's pid before "held" (and the child, "child", in any order);
# with "race", it takes the lease once a first line comes on stdin, and says "refused <holder's
# pid>" if another holds it.
JOB = textwrap.dedent("""
    import os, sys, time
    from trainstatus import TrainingStatusInUseError
    from trainstatus.integrations._shared import lease
    status, run, how = sys.argv[1], sys.argv[2], sys.argv[3]
    say = lambda text: os.write(1, f"{text}\\n".encode())  # one write a line: the child's never splits the parent's
    if how == "race":  # started beside another: says which it was, and holds on until told
        sys.stdin.readline()
        try:
            lease.take(status, "job", run=run)
        except TrainingStatusInUseError as exc:
            say(f"refused {exc.holder.get('pid')}")
            sys.exit(0)
    else:
        lease.take(status, "job", run=run)
    if how == "fork":
        child = os.fork()
        if child == 0:  # its fork handlers have run by now: it says so
            say("child")
            time.sleep(60)
            os._exit(0)
        say(child)
    say("held")
    sys.stdin.readline()
""")


def start(status: str, run: str = "other-run", how: str = "plain") -> subprocess.Popen[str]:
    """The job, once it holds the lease (its stdout's next line is the forked child's pid, if any)."""
    job = subprocess.Popen([sys.executable, "-c", JOB, status, run, how], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    assert job.stdout is not None
    return job


@contextlib.contextmanager
def another_job(status: str, run: str = "other-run") -> Iterator[subprocess.Popen[str]]:
    """Another job holding the lease of ``status`` for the block; killed after it."""
    job = start(status, run)
    try:
        assert job.stdout is not None
        line = job.stdout.readline().strip()
        assert line == "held", line
        yield job
    finally:
        job.kill()
        job.communicate()
