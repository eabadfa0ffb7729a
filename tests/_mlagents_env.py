"""A virtual environment with the real ML-Agents 1.1.0 (release 22) and this checkout, built once.

ML-Agents' status code runs in its own environment because ML-Agents pins what the suite's own
environment cannot have (numpy < 1.24, protobuf < 3.21, Python <= 3.10.12 in its metadata). It is
installed from the package registry as a user would, without its heavy dependencies (torch,
tensorboard, onnx: ``--no-deps``, then the light packages its status code imports), and this
checkout is installed into it in editable mode, so that ML-Agents finds trainstatus's entry points
through ``importlib.metadata`` exactly as in a user's environment. The one ML-Agents file replaced
is ``mlagents/torch_utils/__init__.py`` (tests/data/mlagents_torch_utils.py says why).

The environment lives in ``.venv-mlagents/`` at the top of the checkout (ignored by git) and is
rebuilt when what it is made of changes (the specification below, pyproject.toml, the versions of
filelock and orjson the suite runs with, so that a lowest-dependencies run tests ML-Agents on the
lowest versions too). A lock file makes concurrent test runs build it once.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import _venvs

ROOT = _venvs.ROOT
VENV = ROOT / ".venv-mlagents"
STANDIN = Path(__file__).resolve().parent / "data" / "mlagents_torch_utils.py"
MLAGENTS = ["mlagents==1.1.0", "mlagents-envs==1.1.0"]
# What ML-Agents' status code, settings and curriculum import (FACTS: resolved to cattrs 1.5.0,
# numpy 1.23.5, protobuf 3.20.3 on Python 3.11).
LIGHT = ["attrs", "cattrs<1.7", "numpy<1.24", "protobuf<3.21", "pillow", "grpcio", "pyyaml"]


def python() -> Path:
    return _venvs.python(VENV)


def site_packages() -> Path:
    out = subprocess.run(
        [str(python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )
    return Path(out.stdout.strip())


def ensure() -> Path:
    """The environment's interpreter, the environment built first if it is missing or stale."""

    def build() -> None:
        # ML-Agents 1.1.0 declares Python <= 3.10.12: on a newer interpreter pip needs to be told.
        _venvs.pip(VENV, "--no-deps", "--ignore-requires-python", *MLAGENTS, timeout=1200)
        _venvs.pip(VENV, *LIGHT, *_venvs.ours(), "-e", str(ROOT), timeout=1200)
        shutil.copyfile(STANDIN, site_packages() / "mlagents" / "torch_utils" / "__init__.py")

    made_of = _venvs.spec(mlagents=MLAGENTS, light=LIGHT,
                          standin=hashlib.sha256(STANDIN.read_bytes()).hexdigest())
    return _venvs.ensure(VENV, made_of, build, timeout=1800)


if __name__ == "__main__":
    print(ensure())
