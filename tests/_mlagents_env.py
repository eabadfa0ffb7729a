"""Virtual environments with the real ML-Agents 1.1.0 (release 22) and this checkout, built once.

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

A second environment, ``.venv-mlagents-torch/`` (:func:`ensure_torch`), has ML-Agents with
everything ``mlagents-learn`` needs to train: torch 2.13.0 (the CPU build, which lies on this kind
of machine's disk: installed alone first, then repeated as a pin, since a plain ``torch`` makes pip
download a CUDA build of several GB), tensorboard, onnx and onnxscript (torch 2.13's ONNX export
needs it), ``setuptools<81`` (``mlagents.torch_utils`` imports ``pkg_resources``), and nothing
replaced. tests/test_mlagents_learn.py runs ``mlagents.trainers.learn`` in it. It is separate
because every process of the first environment would otherwise import torch (about 2 s each, and
tests/test_mlagents_plugin.py starts some forty), for status code that only records its version.
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


TORCH_VENV = ROOT / ".venv-mlagents-torch"
TORCH = "torch==2.13.0"
# Measured on Python 3.11 with torch 2.13: ML-Agents' own pins, kept by hand since it is installed
# without its dependencies (its metadata wants Python <= 3.10.12).
TRAINING = [TORCH, "numpy==1.23.5", "protobuf==3.20.3", "setuptools<81", "onnx==1.17.0", "onnxscript==0.7.2",
            "cattrs<1.7", "attrs", "grpcio", "pillow", "pyyaml", "h5py", "tensorboard", "six", "cloudpickle"]
# protobuf 3.20.3's C++ implementation refuses the newer generated code of tensorboard and onnx.
RUN_ENV = {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}


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


def ensure_torch() -> Path:
    """The interpreter of ``.venv-mlagents-torch/``, built first if it is missing or stale."""

    def build() -> None:
        _venvs.pip(TORCH_VENV, TORCH, timeout=1800)  # alone first: see the module's docstring
        _venvs.pip(TORCH_VENV, "--no-deps", "--ignore-requires-python", *MLAGENTS, timeout=1200)
        _venvs.pip(TORCH_VENV, *TRAINING, *_venvs.ours(), "-e", str(ROOT), timeout=1800)

    made_of = _venvs.spec(mlagents=MLAGENTS, training=TRAINING)
    return _venvs.ensure(TORCH_VENV, made_of, build, timeout=3600)


if __name__ == "__main__":
    print(ensure())
    print(ensure_torch())
