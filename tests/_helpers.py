"""Helpers shared by several test files."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from trainstatus import StatusStore


def same(a: Any, b: Any) -> bool:
    """Exact equality of plain JSON values: NaN equals NaN, types and the sign of zero count,
    and so does the order of dict keys."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def read_fresh(path: Path | str | os.PathLike[str]) -> dict[str, Any]:
    """What a new store reads from disk."""
    fresh = StatusStore(path)
    try:
        return fresh.to_dict()
    finally:
        fresh.close()


def process_message(path: Path, timeout: float) -> str:
    """The exact TrainingStatusLockTimeout text when another process holds the lock."""
    return (
        f"Could not lock {path} within {timeout} s: another process holds {path}.lock (a write or an "
        "open transaction). Let it finish, or open the store with a longer lock_timeout=."
    )
