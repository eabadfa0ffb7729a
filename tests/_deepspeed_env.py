"""A virtual environment with DeepSpeed and torch 2.13.0 (CPU), for tests/test_integration_deepspeed.py.

DeepSpeed builds from source when pip installs it (an sdist): ``DS_BUILD_OPS=0`` makes that a plain
Python build of about 20 seconds, its ops left to be compiled when first used, which the tests
never let happen (tests/_deepspeed_trainer.py: the shared-memory op turned off, torch's AdamW, and
``TORCH_EXTENSIONS_DIR`` in the test's own folder). It gets an environment of its own,
``.venv-deepspeed/`` at the top of the checkout (ignored by git), built once per checkout as
``.venv-torch/`` is (tests/_torch_env.py) and rebuilt only when what it is made of changes, with
the Trainer of Transformers, Accelerate and Lightning beside it (their DeepSpeed paths). DeepSpeed is pinned
at the version whose behaviour on CPU was measured (FACTS.md: which ops compile, and when).

The order matters, as for ``.venv-torch/``: ``torch==2.13.0`` alone first (the CPU build, which lies
on this kind of machine's disk), then the libraries with torch repeated as a pin.
"""

from __future__ import annotations

import os
from pathlib import Path

import _venvs

ROOT = _venvs.ROOT
VENV = ROOT / ".venv-deepspeed"
TORCH = "torch==2.13.0"
PACKAGES = ["deepspeed==0.19.8", "transformers", "accelerate", "safetensors", "lightning"]


def python() -> Path:
    return _venvs.python(VENV)


def ensure() -> Path:
    """The environment's interpreter, the environment built first if it is missing or stale."""

    def build() -> None:
        os.environ["DS_BUILD_OPS"] = "0"  # inherited by pip's build of DeepSpeed: no op compiled
        _venvs.pip(VENV, TORCH, timeout=1800)  # alone first: see the module's docstring
        _venvs.pip(VENV, TORCH, *PACKAGES, *_venvs.ours(), "-e", str(ROOT), timeout=1800)

    return _venvs.ensure(VENV, _venvs.spec(torch=TORCH, packages=PACKAGES), build, timeout=3600)


if __name__ == "__main__":
    print(ensure())
