"""Stores after ``fork``: the child keeps them, without the parent's other threads.

A forked child has only the thread that forked. Whatever the others were doing with a store
(holding its mutex, leading or waiting in a group commit) did not come along: each live store
drops that state in the child (``_after_fork_in_child`` of its layers). A store forked inside a
transaction refuses further use there (its pending changes are half a transaction).
"""

from __future__ import annotations

import os
from collections.abc import Collection
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:  # only in annotations, which are strings at run time
    from typing import Protocol

    class _Forkable(Protocol):
        def _after_fork_in_child(self) -> None: ...


_watched: list[Collection[_Forkable]] = []


def watch(stores: Collection[_Forkable]) -> None:
    """Reset every store in ``stores`` (a live set, kept by its owner) in a forked child."""
    _watched.append(stores)


def _after_fork_in_child() -> None:
    for stores in _watched:
        for store in list(stores):
            store._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
