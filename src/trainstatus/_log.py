"""The library's one logger, ``logging.getLogger("trainstatus")``, without importing ``logging``.

``logging`` and what it imports (traceback, string, re...) cost several ms of every start that
opens a store, to send debug records that nobody asked for. Until the program imports ``logging``
itself no handler, level or filter can exist, and a debug record would be dropped (the root
level is WARNING); so records are passed to the real logger once ``logging`` is imported (by
the program, at any time), and dropped before. Modules use it as they would ``logging``:
``from . import _log as logging``, ``logger = logging.getLogger("trainstatus")``.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any

__all__ = ["getLogger"]


class _Logger:
    """The methods of ``logging.Logger`` the library calls, passed on once ``logging`` is loaded."""

    __slots__ = ("_name", "_real")

    def __init__(self, name: str) -> None:
        self._name = name
        self._real: Any = None

    def _logger(self) -> Any:
        real = self._real
        if real is None:
            logging = sys.modules.get("logging")
            if logging is None or not hasattr(logging, "getLogger"):  # not imported (or half way)
                return None
            real = self._real = logging.getLogger(self._name)
        return real

    def debug(self, msg: str, *args: object) -> None:
        real = self._logger()
        if real is not None:
            real.debug(msg, *args, stacklevel=2)

    def warning(self, msg: str, *args: object) -> None:
        real = self._logger()
        if real is not None:
            real.warning(msg, *args, stacklevel=2)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging's name
        real = self._logger()
        return real is not None and bool(real.isEnabledFor(level))


_LOGGERS: dict[str, _Logger] = {}


def getLogger(name: str) -> _Logger:  # noqa: N802 - logging's name, so modules read as with logging
    logger = _LOGGERS.get(name)
    if logger is None:
        logger = _LOGGERS.setdefault(name, _Logger(name))
    return logger
