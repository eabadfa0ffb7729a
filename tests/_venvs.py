"""Build a test group's virtual environment once per checkout (tests/_mlagents_env.py, _torch_env.py).

An environment lives at the top of the checkout (``.venv-<group>/``, ignored by git) with a stamp
of what it is made of (``trainstatus-spec.json``): it is rebuilt only when that changes. A lock
file beside it makes concurrent test runs build it once.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock

ROOT = Path(__file__).resolve().parent.parent


def python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ours() -> list[str]:
    """filelock and orjson pinned at the versions this suite runs with (a lowest-dependencies run
    tests the group on the lowest versions too), and coverage at the suite's own version: its
    ``.pth`` file starts measuring every Python process of the environment when a traced run
    (``--cov``, pyproject.toml's ``[tool.coverage.run] patch``) sets COVERAGE_PROCESS_CONFIG, and does
    nothing otherwise."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in ("filelock", "orjson", "coverage")]


def spec(**parts: Any) -> str:
    """What an environment is made of: ``parts``, this interpreter, ``ours()`` and pyproject.toml."""
    return json.dumps({
        **parts,
        "python": sys.version,
        "ours": ours(),
        "pyproject": hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest(),
    }, sort_keys=True)


EDITABLE_LOCK = ROOT / ".editable-install.lock"
"""Held around every editable install of this checkout (``-e``): setuptools writes
``src/trainstatus.egg-info`` in the checkout, and two at once may mix their files. .ci/run's own
editable install of .venv-lowest takes it too (``flock``: the same lock)."""


def pip(venv: Path, *args: str, timeout: float) -> None:
    command = [str(python(venv)), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    with filelock.FileLock(str(EDITABLE_LOCK), timeout=timeout) if "-e" in args else contextlib.nullcontext():
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"building {venv} failed: {' '.join(command)}\n{result.stdout}\n{result.stderr}")


def ensure(venv: Path, made_of: str, build: Callable[[], None], *, timeout: float) -> Path:
    """``venv``'s interpreter; ``build()`` into a fresh ``venv`` first if its stamp is not ``made_of``."""
    stamp = venv / "trainstatus-spec.json"
    with filelock.FileLock(str(venv) + ".lock", timeout=timeout):
        if stamp.exists() and stamp.read_text() == made_of and python(venv).exists():
            return python(venv)
        if venv.exists():
            shutil.rmtree(venv)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        build()
        stamp.write_text(made_of)
    return python(venv)
