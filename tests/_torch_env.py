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

from pathlib import Path

import _venvs

ROOT = _venvs.ROOT
VENV = ROOT / ".venv-torch"
TORCH = "torch==2.13.0"
# One list per integration: a new one adds its packages here.
LIBRARIES = {
    "sb3": ["stable-baselines3", "gymnasium"],
    # s3fs: ModelCheckpoint(dirpath="s3://...") (Lightning writes through fsspec); boto3: the status
    # file beside it (trainstatus[s3]), at the botocore s3fs's aiobotocore pins: an open boto3 makes
    # pip try hundreds of releases before it finds one (minutes).
    "lightning": ["lightning", "s3fs", "boto3>=1.43.115,<1.43.118"],
    "transformers": ["transformers", "accelerate", "safetensors"],
    "accelerate": ["accelerate"],
}


def python() -> Path:
    return _venvs.python(VENV)


def ensure() -> Path:
    """The environment's interpreter, the environment built first if it is missing or stale."""

    def build() -> None:
        _venvs.pip(VENV, TORCH, timeout=1800)  # alone first: see the module's docstring
        packages = [name for names in LIBRARIES.values() for name in names]
        _venvs.pip(VENV, TORCH, *packages, *_venvs.ours(), "-e", str(ROOT), timeout=1800)

    return _venvs.ensure(VENV, _venvs.spec(torch=TORCH, libraries=LIBRARIES), build, timeout=3600)


if __name__ == "__main__":
    print(ensure())
