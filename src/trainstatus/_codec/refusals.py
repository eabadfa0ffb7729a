"""Why a value cannot be stored, in words: where in it the problem is, and what to store instead.

``_explain`` turns orjson's refusal of a value into a ``TrainingStatusTypeError`` or
``TrainingStatusValueError`` naming the place inside the value (``Walker/checkpoints[3]``) and what
to do ("store a list instead"). ``_find_problem`` is a walk in Python, so it runs only once orjson
has refused a value: to word the error, or (``json_fallback``) to tell a lone surrogate, which
Python's json writes, from a value nothing can write. Imports ``values`` and ``names``.
"""

from __future__ import annotations

import enum
import sys

from .._errors import TrainingStatusTypeError, TrainingStatusValueError
from .names import _SURROGATE_PAIR_PATTERN, _pair_problem
from .values import _MAX_DEPTH, _dataclass_fields, _pattern

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["_explain", "_find_problem"]

_HINTS = {
    "set": "store a list instead (e.g. sorted(value))",
    "frozenset": "store a list instead (e.g. sorted(value))",
    "bytes": "store text instead (e.g. value.decode() or base64)",
    "bytearray": "store text instead (e.g. value.decode() or base64)",
    "complex": "store [value.real, value.imag] instead",
    "Decimal": "store float(value) or str(value) instead",
    "PosixPath": "store str(value) instead",
    "WindowsPath": "store str(value) instead",
    "Tensor": "store value.item() or value.tolist() instead",
    "mappingproxy": "store dict(value) instead",
}
_DEFAULT_HINT = "store a dict with str keys, a list, str, int, float, bool or None instead"


def _describe(category: str, key: str, inner: str) -> str:
    return f"{category}/{key}{inner}"


def _explain(
    value: Any, exc: BaseException, *, path: str, category: str, key: str
) -> Exception:
    context = {"path": path, "category": category, "key": key}
    found = _find_problem(value, "", 0, f"{category}/{key}")
    if found is None:  # nothing our walk recognises: pass on orjson's own words
        where = _describe(category, key, "")
        return TrainingStatusTypeError(
            f"Cannot store {where} in {path}: {exc}; {_DEFAULT_HINT}. Nothing was written.",
            **context,
        )
    inner, problem, is_type = found
    where = _describe(category, key, inner)
    message = f"Cannot store {where} in {path}: {problem}. Nothing was written."
    if is_type:
        return TrainingStatusTypeError(message, **context)
    return TrainingStatusValueError(message, **context)


def _find_problem(value: Any, where: str, depth: int, top: str = "",
                  holders: dict[int, str] | None = None) -> tuple[str, str, bool] | None:
    """(path inside the value, what is wrong and what to do, is it a type problem) or None.

    ``top`` names the value in messages (``category/key``); ``holders`` maps the id of each
    container on the way down to its path, so that a value holding itself is named as a cycle
    rather than as 254 levels of nesting. Only run once orjson has refused a value: it is a walk
    in Python.
    """
    if holders is None:
        holders = {}
    if id(value) in holders:  # ids of containers alive on the way down: no other object has one
        return (where, f"the value refers to itself at {top}{where}, which is {top}{holders[id(value)]} "
                       "again: JSON has no cycles; store a copy that does not contain itself", False)
    if depth > _MAX_DEPTH:
        return (where, f"it is nested more than {_MAX_DEPTH} levels deep; flatten it", False)
    if value is None or isinstance(value, (bool, float, enum.Enum)):
        if isinstance(value, enum.Enum):
            return _find_problem(value.value, where, depth + 1, top, holders)
        return None
    if isinstance(value, int):
        if -(2**63) <= value <= 2**64 - 1:
            return None
        return (
            where,
            f"the integer {value} is outside the 64-bit range that JSON readers keep exactly; "
            "store it as a string (str(value)) instead",
            False,
        )
    if isinstance(value, str):
        pair = None if value.isascii() else _pattern(_SURROGATE_PAIR_PATTERN).search(value)
        if pair is not None:
            return (where, f"the string {_pair_problem(pair.group(), 'value')}", False)
        return None
    if isinstance(value, dict):
        holders[id(value)] = where
        for k, v in value.items():
            if type(k) is not str:
                return (
                    where,
                    f"a dict key of type {type(k).__name__!r} ({k!r}) is not a plain str; JSON "
                    "object keys must be strings: convert the keys (str(key), or key.value for "
                    "an Enum)",
                    True,
                )
            pair = None if k.isascii() else _pattern(_SURROGATE_PAIR_PATTERN).search(k)
            if pair is not None:
                return (where, f"the dict key {k!r} {_pair_problem(pair.group(), 'key')}", False)
            found = _find_problem(v, f"{where}[{k!r}]", depth + 1, top, holders)
            if found:
                return found
        del holders[id(value)]
        return None
    if isinstance(value, (list, tuple)):
        holders[id(value)] = where
        for i, v in enumerate(value):
            found = _find_problem(v, f"{where}[{i}]", depth + 1, top, holders)
            if found:
                return found
        del holders[id(value)]
        return None
    fields = _dataclass_fields(value)
    if fields is not None:
        holders[id(value)] = where
        for f in fields:
            if not f.name.startswith("_"):
                found = _find_problem(getattr(value, f.name), f"{where}.{f.name}", depth + 1, top, holders)
                if found:
                    return found
        del holders[id(value)]
        return None
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        if value.dtype.kind in "biuf":
            return None
        # An object array can hold itself; tolist() gives a new list each time, so the array is
        # the one to recognise.
        holders[id(value)] = where
        found = _find_problem(value.tolist(), where, depth, top, holders)
        del holders[id(value)]
        return found
    if type(value).__module__ in ("datetime", "uuid"):
        return None
    name = type(value).__name__
    hint = _HINTS.get(name, _DEFAULT_HINT)
    return (where, f"an object of type {name!r} is not JSON serializable; {hint}", True)
