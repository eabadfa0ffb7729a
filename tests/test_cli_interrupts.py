"""Ctrl-C at any moment of a command: one line, exit status 130, never a traceback or a crash.

The console script's entry point (read from pyproject.toml, so a change to it is what is tested)
runs in a real process on a real file, and SIGINT is sent at delays spread over the command's run:
while the package, argparse and orjson are imported (a SIGINT during ``import orjson`` can crash
the interpreter) and while the command works.

The delays count from the moment the entry module's handler is in place (it is imported and its
``install`` run, as ``main`` does first): what comes before is Python's own start and pip's wrapper
script (``import re``), which no code of trainstatus can reach; a Ctrl-C there is Python's own
business.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
METADATA = {"metadata": {"stats_format_version": "0.3.0"}}
# Dense in the first 10 ms: `show` of a small file is over in about that once its handler is in
# place (most of it importing re and json), and a third of the delays must land inside a command.
DELAYS = [0.0, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.02, 0.03, 0.045, 0.06, 0.08, 0.1, 0.13]


def _entry_point() -> tuple[str, str]:
    """(module, function) of the ``trainstatus`` console script, as pyproject.toml declares it."""
    text = (ROOT / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    found = re.search(r'^trainstatus = "([\w.]+):(\w+)"$', scripts, re.MULTILINE)
    assert found is not None, scripts
    return found.group(1), found.group(2)


MODULE, FUNCTION = _entry_point()
# "up" once the entry module's handler is in place (main() installs it again, a no-op): a SIGINT
# before that lands in this harness's own lines, which a user's console script does not have
# (pip's wrapper calls main() at once); measured, 7 runs in 30 of the random test hit them.
CHILD = f"""\
import sys
import {MODULE} as entry
entry.install()
print("up", flush=True)
sys.exit(entry.{FUNCTION}())
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    # The source tree first, as for this test process (an installed copy may be older).
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def interrupted(args: list[str], delay: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command, sent SIGINT ``delay`` seconds after its entry point starts (it may finish first)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd,
                             # Python keeps SIGINT ignored when it starts ignored (pytest under nohup).
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(args, child.returncode, out, err)


def check(done: subprocess.CompletedProcess[str], delay: float) -> bool:
    """Whether the interrupt ended it (True) or it finished first (False); fails on anything else."""
    where = f"SIGINT {delay * 1000:.0f} ms after the start: status {done.returncode}, stderr {done.stderr!r}"
    assert "Traceback" not in done.stderr, where
    assert done.returncode >= 0, where  # not ended by a signal (a crash is SIGSEGV)
    if done.returncode == 130:
        assert done.stderr.endswith("\ntrainstatus: interrupted\n") or done.stderr == "trainstatus: interrupted\n", where
        return True
    assert done.returncode == 0, where
    return False


@pytest.mark.parametrize("command", [["set", "ts.json", "wall_height", "lesson_num", "3"], ["show", "ts.json"]],
                         ids=["set", "show"])
def test_ctrl_c_early_in_a_command_is_one_line_and_exit_130(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "ts.json").write_text(json.dumps({"wall_height": {"lesson_num": 2}, **METADATA}))
    ended = 0
    for delay in DELAYS:
        done = interrupted(command, delay, tmp_path)
        ended += check(done, delay)
        lesson = json.loads((tmp_path / "ts.json").read_text())["wall_height"]["lesson_num"]
        assert lesson in (2, 3)  # the value before or after, never a broken file
        if lesson == 3:
            assert done.returncode == 0 or "set" in command  # only set writes
    assert ended >= len(DELAYS) // 3  # the early delays land inside the command, not after it


# The command's first lines run once Python's handler is back, with a Ctrl-C arriving inside a
# weakref callback (as importlib's module-lock callback gets it during a lazy import): Python cannot
# raise from there, prints "Exception ignored" and goes on. CI saw the command then finish (status 0).
CHILD_IN_A_CALLBACK = f"""\
import gc, os, signal, sys, time, weakref
import {MODULE} as entry
from trainstatus._cli import base
entry.install()
base._python_sigint()

class Lock:
    pass

def callback(ref):
    os.kill(os.getpid(), signal.SIGINT)  # delivered while the callback runs
    for _ in range(1000):
        pass

lock = Lock()
ref = weakref.ref(lock, callback)
try:
    del lock
    gc.collect()
    time.sleep(2)  # the rest of the command
    print("went on", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_inside_a_callback_python_cannot_raise_from_still_ends_the_command() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD_IN_A_CALLBACK], capture_output=True, text=True, env=_env(),
                          timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.stdout == "interrupted\n", (done.stdout, done.stderr)
    assert "Exception ignored" not in done.stderr, done.stderr


CHILD_DONE_FIRST = f"""\
import sys, time, types
import {MODULE} as entry
from trainstatus._cli import base
entry.install()
base._python_sigint()
base._interrupt_again(types.SimpleNamespace(exc_value=KeyboardInterrupt()))  # lost in a callback just now
print(base._disarm(), base._disarm(), flush=True)  # the command returned first: run says "interrupted"
time.sleep(0.2)
print("no late interrupt", flush=True)
"""


def test_a_ctrl_c_still_pending_when_the_command_returns_is_said_once_and_never_raised_later() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD_DONE_FIRST], capture_output=True, text=True, env=_env(),
                          timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.stdout == "True False\nno late interrupt\n", (done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr


def test_importing_the_entry_module_imports_nothing_before_its_handler() -> None:
    code = (f"import sys; before = set(sys.modules); import {MODULE}; "
            "print(sorted(set(sys.modules) - before))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True)
    assert json.loads(done.stdout.replace("'", '"')) == [MODULE]


@pytest.mark.long
def test_ctrl_c_at_random_early_moments_never_crashes(tmp_path: Path, seed: int) -> None:
    # A SIGINT during `import orjson` crashed the interpreter about 5 times in 100 early ones.
    rng = random.Random(seed)
    (tmp_path / "ts.json").write_text(json.dumps({"wall_height": {"lesson_num": 2}, **METADATA}))
    for _ in range(200):
        delay = rng.uniform(0, 0.1)
        check(interrupted(["set", "ts.json", "wall_height", "lesson_num", "3"], delay, tmp_path), delay)


# The command run with SIGINT sent to itself once the new file's bytes are written, before the
# rename: an interrupt in the middle of a write, at a point no timing could hit reliably.
CHILD_MID_WRITE = f"""\
import os
import signal
import sys
import {MODULE} as entry
from trainstatus._storage import atomic as _atomic

def observer(point, target, temp, fd):
    if point == "written" and os.path.basename(target) == "ts.json":
        _atomic.observer = None
        os.kill(os.getpid(), signal.SIGINT)

_atomic.observer = observer
sys.exit(entry.{FUNCTION}())
"""
OLD = {"wall_height": {"lesson_num": 2}, **METADATA}
NEW = {"wall_height": {"lesson_num": 3}, **METADATA}


@pytest.mark.parametrize(("command", "finished"), [
    (["set", "ts.json", "wall_height", "lesson_num", "3"], True),
    (["restore", "ts.json", "1"], False),
    (["corrupt", "restore", "ts.json", "ts.json.corrupt-20240102T030405.000000Z"], False),
], ids=["set", "restore", "corrupt-restore"])
def test_ctrl_c_during_a_write_leaves_a_whole_file_and_no_temp_file(
    tmp_path: Path, command: list[str], finished: bool
) -> None:
    # Once the command's modules are imported, Ctrl-C is Python's KeyboardInterrupt again: a
    # store holds it back until its write is done (set), and elsewhere it unwinds the write, whose
    # clean-up removes the temp file. The console script's first handler, still in place, would
    # end the process at once, in the middle of the write.
    path = tmp_path / "ts.json"
    path.write_text(json.dumps(NEW if command[0] == "restore" else OLD))
    (tmp_path / ".ts.json.history-00000001").write_text(json.dumps(OLD))
    (tmp_path / "ts.json.corrupt-20240102T030405.000000Z").write_text(json.dumps(NEW))
    before = path.read_bytes()
    done = subprocess.run([sys.executable, "-c", CHILD_MID_WRITE, *command], capture_output=True, text=True,
                          env=_env(), cwd=tmp_path, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (done.returncode, done.stderr) == (130, "trainstatus: interrupted\n")
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    if finished:  # the write under way was finished first
        assert json.loads(path.read_text())["wall_height"] == NEW["wall_height"]
    else:  # the write was abandoned whole
        assert path.read_bytes() == before


class _WarningsLeftByCtrlC:
    """The warnings module, as ``_cli_base`` sees it, with Ctrl-C as a command leaves catch_warnings()."""

    def __getattr__(self, name: str) -> Any:
        return getattr(warnings, name)

    @staticmethod
    @contextlib.contextmanager
    def catch_warnings() -> Iterator[None]:
        with warnings.catch_warnings():
            yield
        raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["printing-an-error", "leaving-catch-warnings"])
def test_ctrl_c_while_a_command_ends_is_one_line_and_exit_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    # Moments no store holds a signal back in and run's own `except KeyboardInterrupt` does not
    # cover: the console script's entry point turns them into the same one line and status.
    import _trainstatus_cli

    from trainstatus._cli import base as _cli_base

    if where == "printing-an-error":
        def interrupted(message: str) -> None:
            raise KeyboardInterrupt
        monkeypatch.setattr(_cli_base, "_error", interrupted)
    else:
        monkeypatch.setattr(_cli_base, "warnings", _WarningsLeftByCtrlC())
    monkeypatch.setattr(sys, "argv", ["trainstatus", "show", str(tmp_path / "missing.json")])
    handler = signal.getsignal(signal.SIGINT)
    try:
        status = _trainstatus_cli.main()
    except KeyboardInterrupt:  # what the interpreter would print as a traceback
        pytest.fail("KeyboardInterrupt escaped the console script's entry point")
    finally:
        signal.signal(signal.SIGINT, handler)  # main put its own in place of pytest's
    # The error line, when printed whole before the interrupt, then the one line of the interrupt.
    error = f"trainstatus: error: no status file at {tmp_path / 'missing.json'}\n" if where != "printing-an-error" else ""
    assert (status, *capsys.readouterr()) == (130, "", f"{error}trainstatus: interrupted\n")
