"""Modules imported on first use, so that ``import trainstatus`` pays only for what every use needs.

filelock (15-25 ms to import) is needed by the first write, not by a program that only reads a
status file (``trainstatus show``, a resume check); importlib's ``LazyLoader`` gives a module
object at once and runs the module the first time one of its attributes is read.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

__all__ = ["lazy_module"]


def lazy_module(name: str) -> ModuleType:
    """``name`` as a module object that imports itself on first attribute access."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
