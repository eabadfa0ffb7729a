"""Python's json for what orjson cannot write: NaN/Infinity, lone surrogates, integers past 64 bits.

orjson refuses a string holding a lone surrogate (a non-UTF-8 file name decoded with
``surrogateescape``), which Python's ``json`` writes and reads as a ``\\udcff`` escape (ML-Agents'
files can hold them). Such strings are stored as that escape, in values, dict keys and names alike,
so that whatever a file held can be set again; orjson is tried first and ``json`` takes over only
when it refuses (``_with_surrogates``).

``_Plain`` turns a storable value (dataclasses, enums, numpy, subclasses of the builtin types) into
the types Python's json writes, noting non-finite floats on the way, and ``_json_dumps`` writes
those indented for their place in the file. What is written here is marked ``exotic``, so that
json decodes it too: slower than orjson, taken only where orjson cannot write a value as it is.
Imports ``values`` and ``refusals``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping

from .._lazy import OnFirstUse
from .values import (
    _NUMPY_OPTIONS,
    _VALUE_INDENT,
    Entry,
    _check_orjson,
    _dataclass_fields,
    _default,
    _utf8,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    import enum
    import json
    from typing import Any

    import orjson
else:
    # Imported on first use, as in ``values`` (which says why); orjson is checked as there.
    json = OnFirstUse("json", globals())
    orjson = OnFirstUse("orjson", globals(), _check_orjson)
    enum = OnFirstUse("enum", globals())  # as in ``values``

__all__ = ["_Plain", "_json_dumps", "_with_surrogates"]


class _Plain:
    """Convert a storable value to types Python's json writes, noting non-finite floats."""

    def __init__(self) -> None:
        self.nonfinite = False

    def __call__(self, value: Any) -> Any:
        kind = type(value)
        if kind is float:
            if not math.isfinite(value):
                self.nonfinite = True
            return value
        if kind is str or kind is int or kind is bool or value is None:
            return value
        if isinstance(value, enum.Enum):
            return self(value.value)
        if isinstance(value, Mapping):
            return {k: self(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self(v) for v in value]
        fields = _dataclass_fields(value)
        if fields is not None:
            # orjson leaves out fields whose name starts with an underscore; so do we.
            return {f.name: self(getattr(value, f.name)) for f in fields if not f.name.startswith("_")}
        if isinstance(value, float):
            return self(float(value))
        if isinstance(value, int):  # int subclasses (bool itself was handled above)
            return int(value)
        if isinstance(value, str):
            return str(value)
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
            return self._numpy(numpy, value)
        # datetime, date, time, UUID: whatever text orjson gives them
        return orjson.loads(orjson.dumps(value))

    def _numpy(self, numpy: Any, value: Any) -> Any:
        # The numbers _widen stores (numpy's tolist gives the Python numbers a float16/32 equals)
        # and the text orjson writes for the rest (datetime64 as orjson formats it).
        kind = value.dtype.kind
        if kind in "OVU":  # objects and records may hold anything, text a lone surrogate: walk them
            return self(value.tolist())
        if kind in "biu" or (kind == "f" and value.dtype.itemsize <= 8):
            if kind == "f" and not numpy.isfinite(value).all():
                self.nonfinite = True
            return value.tolist()
        return orjson.loads(orjson.dumps(value, default=_default, option=_NUMPY_OPTIONS))


def _json_dumps(plain: Any) -> bytes:
    text = json.dumps(plain, indent=2, ensure_ascii=False, allow_nan=True)
    return _utf8(text).replace(b"\n", _VALUE_INDENT)


def _with_surrogates(value: Any) -> Entry | None:
    """``value`` through Python's json when a lone surrogate is all orjson refused; else None."""
    from .refusals import _find_problem  # only when orjson refused the value

    if _find_problem(value, "", 0) is not None:
        return None
    converter = _Plain()
    try:
        text = json.dumps(converter(value), indent=2, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # orjson reads no lone surrogate escape either: json decodes the entry.
        return Entry(_utf8(text).replace(b"\n", _VALUE_INDENT), exotic=True)
    return None  # orjson refused it for a reason of its own: _explain passes its words on
