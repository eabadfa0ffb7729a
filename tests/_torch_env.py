"""A virtual environment with torch 2.13.0 (CPU) and the training libraries of trainstatus.integrations.

The integrations' tests run the libraries' real training loops (tests/test_integration_*.py), which
need a few hundred MB of packages the suite's own environment does not have. They are installed
from the package registry as a user would, and this checkout is installed in editable mode, so the
children the tests start import the trainstatus under test.

The order matters: ``torch==2.13.0`` alone first (the CPU build, which lies on this kind of
machine's disk), then the libraries with torch repeated as a pin. A plain ``torch`` or a range it
does not satisfy makes pip download a CUDA build of several GB.

The environment lives in ``.venv-torch/`` at the top of the checkout (ignored by git) and is rebuilt
when what it is made of changes (the specification below, pyproject.toml, the versions of filelock
and orjson the suite runs with). A lock file makes concurrent test runs build it once.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import filelock

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-torch"
TORCH = "torch==2.13.0"
# One list per integration: a new one (transformers) adds its packages here.
LIBRARIES = {
    "sb3": ["stable-baselines3", "gymnasium"],
    "lightning": ["lightning"],
}


def python() -> Path:
    return VENV / "bin" / "python"


def _spec() -> str:
    ours = [f"{name}=={importlib.metadata.version(name)}" for name in ("filelock", "orjson")]
    return json.dumps({
        "python": sys.version,
        "torch": TORCH,
        "libraries": LIBRARIES,
        "ours": ours,
        "pyproject": hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest(),
    }, sort_keys=True)


def _pip(*args: str) -> None:
    command = [str(python()), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"building {VENV} failed: {' '.join(command)}\n{result.stdout}\n{result.stderr}")


def ensure() -> Path:
    """The environment's interpreter, the environment built first if it is missing or stale."""
    spec = _spec()
    stamp = VENV / "trainstatus-spec.json"
    with filelock.FileLock(str(VENV) + ".lock", timeout=3600):
        if stamp.exists() and stamp.read_text() == spec and python().exists():
            return python()
        if VENV.exists():
            shutil.rmtree(VENV)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
        _pip(TORCH)  # alone first: see the module's docstring
        packages = [name for names in LIBRARIES.values() for name in names]
        _pip(TORCH, *packages, *json.loads(spec)["ours"], "-e", str(ROOT))
        stamp.write_text(spec)
    return python()


if __name__ == "__main__":
    print(ensure())
