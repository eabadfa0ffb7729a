"""One stored value: its bytes as they stand in the file (an ``Entry``), made by orjson, and back.

Each stored value is encoded once, when it is set, into the exact bytes it occupies in the file
(an ``Entry``). Writing the document is then a join of those bytes: a ``set`` pays for
serializing the value it changes, not the whole document. The bytes are also what ``get`` decodes,
which hands every caller a fresh copy for the price of one ``orjson.loads``.

numpy floats are stored as the Python float (float64) they equal, digit for digit:
``np.float32(0.1)`` is ``0.10000000149011612``. orjson's numpy option writes float16 and float32 in
their own shortest form (``0.1``), which reads back as a different float64, so float16/float32
values are widened to float64 before orjson sees them.

The bottom of the codec: ``Entry``, orjson's set-up and options, a value's orjson bytes at its
depth in the file (numpy widened first), ``decode`` (the collector paused around big ones), and
the few helpers the other codec modules share. Which way a value is written (orjson, NaN/Infinity
literals, Python's json, or not at all) is decided in ``encoding``; names are ``names``' concern,
the whole file ``document``'s. Every other codec module imports this one, and it imports none of
them: only the standard library and ``_lazy``.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections import namedtuple

from .._lazy import OnFirstUse

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    import enum
    import json
    import re
    from typing import Any, NamedTuple

    import orjson
else:
    # orjson's setup imports dataclasses, inspect, uuid and platform (10 ms or more), json brings
    # re: ``from trainstatus import StatusStore`` pays for neither; the first store that opens
    # pays for orjson, and json is imported where a file or a value needs it. The command line
    # imports orjson itself before a command that needs it runs, under its first Ctrl-C handler
    # (``_cli.names.Command.load``).
    json = OnFirstUse("json", globals())
    orjson = OnFirstUse("orjson", globals(), lambda module: _check_orjson(module))
    # Only numpy values meet the Enum check here (numpy imports enum itself), and orjson imports it.
    enum = OnFirstUse("enum", globals())

__all__ = [
    "PAUSE_FROM",
    "_MAX_DEPTH",
    "_NUMPY_OPTIONS",
    "_OPTIONS",
    "_VALUE_INDENT",
    "Entry",
    "_check_orjson",
    "_dataclass_fields",
    "_default",
    "_dumps_plain",
    "_dumps_value",
    "_new_entry",
    "_pattern",
    "_utf8",
    "collector_paused",
    "decode",
]


def _check_orjson(module: Any) -> None:
    if module.OPT_INDENT_2 != _OPTIONS or module.OPT_INDENT_2 | module.OPT_SERIALIZE_NUMPY != _NUMPY_OPTIONS:
        raise ImportError(f"orjson {module.__version__}'s options are not the ones trainstatus uses")


_OPTIONS = 1  # orjson.OPT_INDENT_2, checked when orjson is imported
# With OPT_SERIALIZE_NUMPY orjson imports numpy on meeting a type it does not know (a set, a float
# subclass); without numpy already imported no numpy value can exist, so the option waits for it.
# It is given only to values known to hold numpy arrays (see _dumps_value).
_NUMPY_OPTIONS = 1 | 16  # orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, likewise
# A value sits two levels deep in the file (category -> key -> value). orjson writes it indented
# for that place when it is wrapped two levels deep ({"": {"": value}}) and the wrapper's bytes
# are sliced off: a memcpy, where re-indenting afterwards (a replace of every newline) cost about
# as much as the encoding itself (0.9 against 1.4 ms for a 1 MB list). Python's json output (the
# rare NaN path) is still re-indented: JSON text never holds a raw newline inside a string (both
# encoders escape it), so that is a plain byte replace.
_VALUE_INDENT = b"\n    "
_WRAP_HEAD = len(b'{\n  "": {\n    "": ')
_WRAP_TAIL = len(b"\n  }\n}")
_MAX_DEPTH = 254  # orjson's own limit when writing
# Regular expressions, compiled by ``_pattern`` on first use: re and its compiler are a few ms of a
# start otherwise.
_PATTERNS: dict[str | bytes, re.Pattern[Any]] = {}


def _pattern(text: str | bytes) -> re.Pattern[Any]:
    compiled = _PATTERNS.get(text)
    if compiled is None:
        import re

        compiled = _PATTERNS[text] = re.compile(text)
    return compiled


if TYPE_CHECKING:

    class Entry(NamedTuple):
        raw: bytes
        exotic: bool = False  # needs Python's json to read: NaN/Infinity or an integer beyond 64 bits

else:  # the same class, without importing typing for its NamedTuple
    Entry = namedtuple("Entry", ("raw", "exotic"), defaults=(False,), module=__name__)
Entry.__doc__ = """One stored value: its bytes as they stand in the file, indented for their place.

Immutable. A named tuple rather than a frozen dataclass: made on every ``set``, and it is three
times cheaper to create (0.3 against 0.9 µs), a tenth of a set inside a transaction. ``exotic``:
it needs Python's json to read (NaN/Infinity, or an integer beyond 64 bits).
"""


# Entry(raw) runs the NamedTuple's __new__, written in Python; on the hot paths this makes the
# same tuple for about a third of the cost.
_new_entry = tuple.__new__


def decode(entry: Entry) -> Any:
    """A fresh, independent copy of the stored value as plain JSON types."""
    raw = entry.raw
    if len(raw) >= PAUSE_FROM:
        with collector_paused():
            return json.loads(raw) if entry.exotic else orjson.loads(raw)
    if entry.exotic:
        return json.loads(raw)
    return orjson.loads(raw)


# Decoding a big value makes hundreds of thousands of containers at once, and CPython's collector
# runs every 700 of them, each run looking at all that is young, then a full collection: 190 of
# the 250 ms of decoding 10 MB. None of the new containers can be garbage while they are being
# made, so the collector waits until the decode is done (then runs once, as it would have).
PAUSE_FROM = 1 << 18
_pause_lock = threading.Lock()
_pausers = 0
_paused = False  # whether the collector was on when the first of the current pausers came


class collector_paused:  # noqa: N801 - used as a with statement, like contextlib's
    """Keep the garbage collector off inside the ``with`` block (threads nest; one that was
    turned off by the program is left off)."""

    def __enter__(self) -> None:
        global _pausers, _paused
        with _pause_lock:
            if _pausers == 0:
                _paused = gc.isenabled()
                gc.disable()
            _pausers += 1

    def __exit__(self, *exc: object) -> None:
        global _pausers
        with _pause_lock:
            _pausers -= 1
            if _pausers == 0 and _paused:
                gc.enable()


def _dataclass_fields(value: Any) -> tuple[Any, ...] | None:
    """The fields of a dataclass instance, or None for anything else.

    Without ``dataclasses`` imported no dataclass can exist: the module is not imported here
    (8 ms, with ``inspect``) for a check that would then always say no.
    """
    dataclasses = sys.modules.get("dataclasses")
    if dataclasses is None or isinstance(value, type) or not dataclasses.is_dataclass(value):
        return None
    return dataclasses.fields(value)  # type: ignore[no-any-return]


def _default(obj: Any) -> Any:
    # Called by orjson for types it does not serialize itself.
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        if not obj.flags.c_contiguous:  # orjson takes only C-contiguous arrays; same numbers
            return numpy.ascontiguousarray(obj)
        return obj.tolist()  # a dtype orjson does not know (str, object, complex...)
    if isinstance(obj, float):  # float subclasses, which orjson does not pass through
        return float(obj)
    raise TypeError


class _HoldsNumpy(Exception):
    """A numpy value met by ``_default_plain``: the value takes ``_widen`` and orjson's numpy option."""


def _default_plain(obj: Any) -> Any:
    # orjson's default while numpy is loaded but its numpy option not given. A numpy scalar becomes
    # the Python number it equals, which orjson writes as Python would; the numpy option would write
    # np.float32(0.1) as 0.1, a different float64 from float(np.float32(0.1)).
    numpy = sys.modules["numpy"]
    if isinstance(obj, numpy.generic):
        kind = obj.dtype.kind
        if kind == "f" and obj.dtype.itemsize <= 8:
            return float(obj)
        if kind in "iu":
            return int(obj)
        if kind == "b":
            return bool(obj)
    if isinstance(obj, (numpy.ndarray, numpy.generic)):
        raise _HoldsNumpy
    return _default(obj)


def _widen(numpy: Any, value: Any, depth: int) -> Any:
    """``value`` with its float16/float32 arrays as float64 and its numpy scalars as Python numbers.

    Containers are rebuilt as orjson writes them (tuples as lists, dataclasses and enums as their
    fields and values), so orjson's numpy option, fast on float64 arrays, writes every number as
    Python does.
    """
    if depth > _MAX_DEPTH:  # a cycle, or too deep anyway: orjson refuses it and _explain says where
        return value
    if isinstance(value, numpy.ndarray):
        kind = value.dtype.kind
        if value.ndim == 0 and kind in "biuf":
            return value.tolist()
        if kind == "f" and value.dtype.itemsize < 8:
            return numpy.ascontiguousarray(value, dtype=numpy.float64)
        if kind in "OV":  # objects and records may hold numpy scalars of their own
            return _widen(numpy, value.tolist(), depth)
        return value
    if isinstance(value, numpy.generic):
        try:
            return _default_plain(value)
        except _HoldsNumpy:
            return value  # datetime64 and the like: the numpy option writes them
    if isinstance(value, dict):
        return {k: _widen(numpy, v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_widen(numpy, v, depth + 1) for v in value]
    if isinstance(value, enum.Enum):
        return _widen(numpy, value.value, depth)
    fields = _dataclass_fields(value)
    if fields is not None:
        return {f.name: _widen(numpy, getattr(value, f.name), depth + 1) for f in fields if not f.name.startswith("_")}
    return value


def _dumps_value(value: Any) -> bytes:
    """orjson's bytes for a value a caller stores, numpy floats written as the float64 they equal."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return _dumps_at_depth(value, _default, _OPTIONS)
    if not isinstance(value, (numpy.ndarray, numpy.generic)):
        # Most values hold no numpy array: one pass, at the cost it had with the numpy option.
        try:
            return _dumps_at_depth(value, _default_plain, _OPTIONS)
        except TypeError as exc:
            if not isinstance(exc.__cause__, _HoldsNumpy):
                raise
    return _dumps_at_depth(_widen(numpy, value, 0), _default, _NUMPY_OPTIONS)


def _dumps_at_depth(value: Any, default: Any, option: int) -> bytes:
    """orjson's bytes for ``value`` as they stand two levels deep in the file."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return orjson.dumps(value, default=default, option=option)  # one line: nothing to indent
    try:
        return orjson.dumps({"": {"": value}}, default=default, option=option)[_WRAP_HEAD:-_WRAP_TAIL]
    except TypeError as exc:
        if isinstance(exc.__cause__, _HoldsNumpy):
            raise  # the caller widens the value and tries again
        # Not storable (this raises again, for the caller to explain), or nested so deep that the
        # two wrapping levels cross orjson's limit.
        return orjson.dumps(value, default=default, option=option).replace(b"\n", _VALUE_INDENT)


def _dumps_plain(value: Any) -> bytes:
    """orjson's bytes, two levels deep, of a value of builtin JSON types only."""
    return _dumps_at_depth(value, None, _OPTIONS)


def _utf8(text: str) -> bytes:
    """JSON text as UTF-8, a lone surrogate written as the ``\\uXXXX`` escape Python's json writes.

    UTF-8 has no bytes for a lone surrogate. JSON text holds one only inside a string, where its
    escape (backslashreplace writes it lowercase, as json does) reads back as the same str.
    """
    return text.encode("utf-8", "backslashreplace")
