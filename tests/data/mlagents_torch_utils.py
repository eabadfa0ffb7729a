"""Stand-in for ``mlagents/torch_utils/__init__.py`` in the suite's ML-Agents environment.

The real package imports torch (hundreds of MB) to offer ``torch``, ``nn``, ``set_torch_config``
and ``default_device``. The status code under test (training_status.py, the checkpoint and
curriculum managers) needs only ``torch.__version__``, recorded in the status file's metadata.
This is the one ML-Agents file tests/_mlagents_env.py replaces; everything else runs unmodified.
"""

import types

torch = types.SimpleNamespace(__version__="0.0.0+no-torch")
nn = types.SimpleNamespace(Module=object)


def set_torch_config(torch_settings):  # noqa: ARG001 - same signature as the real one
    return None


def default_device():
    return "cpu"
