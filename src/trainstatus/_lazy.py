"""Modules imported on first use, so that ``import trainstatus`` pays only for what every use needs.

filelock (15-25 ms to import) is needed by the first write, not by a program that only reads a
status file (``trainstatus show``, a resume check); importlib's ``LazyLoader`` gives a module
object at once and runs the module the first time one of its attributes is read.

``OnFirstUse`` does the same for one module's global name, without touching ``sys.modules``: an
extension module (orjson) cannot be loaded lazily by ``LazyLoader`` (its setup runs when the
module object is made), and a standard module (json, datetime) needed by a rare path is better
imported the ordinary way when that path runs than put in ``sys.modules`` half loaded.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, MutableMapping
from types import ModuleType
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["OnFirstUse", "lazy_module"]


class OnFirstUse:
    """Stands for module ``name`` under that name in ``namespace`` (a module's ``globals()``):
    the first attribute looked up on it imports the module (``check`` may refuse it with an
    ImportError) and puts it there in its place, so every later use is a plain global lookup."""

    def __init__(self, name: str, namespace: MutableMapping[str, Any],
                 check: Callable[[ModuleType], None] | None = None) -> None:
        self._name = name
        self._namespace = namespace
        self._check = check

    def __getattr__(self, attribute: str) -> Any:
        module = importlib.import_module(self._name)
        if self._check is not None:
            self._check(module)
        if self._namespace.get(self._name) is self:  # not replaced meanwhile (a test's stand-in)
            self._namespace[self._name] = module
        return getattr(module, attribute)


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
