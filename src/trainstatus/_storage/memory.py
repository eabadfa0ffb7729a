"""``Memory``: the storage seam with the document kept in this process only.

The ML-Agents drop-in (``_mlagents.status.status``) keeps its status here before it is bound to a path.
Its own module so that the store, which never uses it, does not load it. It imports the seam
(``base``) alone.
"""

from __future__ import annotations

import contextlib

from .base import Storage

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import ContextManager

__all__ = ["Memory"]


class Memory(Storage):
    """A document kept in this process only: nothing survives the process."""

    location = "<memory>"

    def __init__(self) -> None:
        self._data: bytes | None = None

    def read(self) -> bytes | None:
        return self._data

    def changed(self) -> bool:
        return False

    def replace(self, data: bytes) -> None:
        self._data = data

    def lock(self, timeout: float | None, *, configured: float | None = None) -> ContextManager[object]:
        return contextlib.nullcontext()

    def move_aside(self) -> str:  # pragma: no cover - a document this store wrote is never damaged
        raise NotImplementedError
