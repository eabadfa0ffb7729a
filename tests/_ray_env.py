"""A virtual environment with Ray Train 2.60 and torch 2.13.0 (CPU), for tests/test_integration_ray.py.

Ray is a large install (its wheel alone is about 80 MB, with pyarrow and pandas beside it): it gets an
environment of its own, ``.venv-ray/`` at the top of the checkout (ignored by git), built once per
checkout as ``.venv-torch/`` is (tests/_torch_env.py) and rebuilt only when what it is made of changes.

The order matters, as for ``.venv-torch/``: ``torch==2.13.0`` alone first (the CPU build, which lies on
this kind of machine's disk), then Ray with torch repeated as a pin: a plain ``torch`` makes pip
download a CUDA build of several GB. boto3 is there for the status file on ``s3://``
(``trainstatus[s3]``); Ray reaches S3 through pyarrow's own filesystem. This checkout is installed in
editable mode, so the driver the tests start imports the trainstatus under test.
"""

from __future__ import annotations

from pathlib import Path

import _venvs

ROOT = _venvs.ROOT
VENV = ROOT / ".venv-ray"
TORCH = "torch==2.13.0"
PACKAGES = ["ray[train]==2.60.0", "boto3"]


def python() -> Path:
    return _venvs.python(VENV)


def ensure() -> Path:
    """The environment's interpreter, the environment built first if it is missing or stale."""

    def build() -> None:
        _venvs.pip(VENV, TORCH, timeout=1800)  # alone first: see the module's docstring
        _venvs.pip(VENV, TORCH, *PACKAGES, *_venvs.ours(), "-e", str(ROOT), timeout=1800)

    return _venvs.ensure(VENV, _venvs.spec(torch=TORCH, packages=PACKAGES), build, timeout=3600)


if __name__ == "__main__":
    print(ensure())
