"""The codec: values to JSON bytes and back, and the policy on what may be stored.

Each stored value is encoded once, when it is set, into the exact bytes it occupies in the file
(an ``Entry``). Writing the document is then a join of those bytes: a ``set`` pays for
serializing the value it changes, not the whole document. The bytes are also what ``get`` decodes,
which hands every caller a fresh copy for the price of one ``orjson.loads``.

orjson is the fast path. It cannot write or read the ``NaN``/``Infinity`` literals that ML-Agents'
files contain (it silently writes ``null``), nor integers beyond 64 bits (it reads them as floats).
Values holding those go through Python's ``json`` module instead and are marked ``exotic`` so they
are decoded by ``json`` too: slower, but nothing is ever silently changed.

orjson also refuses a string holding a lone surrogate (a non-UTF-8 file name decoded with
``surrogateescape``), which Python's ``json`` writes and reads as a ``\\udcff`` escape (ML-Agents'
files can hold them). Such strings are stored as that escape, in values, dict keys and names alike,
so that whatever a file held can be set again; orjson is tried first and ``json`` takes over only
when it refuses.

numpy floats are stored as the Python float (float64) they equal, digit for digit:
``np.float32(0.1)`` is ``0.10000000149011612``. orjson's numpy option writes float16 and float32 in
their own shortest form (``0.1``), which reads back as a different float64, so float16/float32
values are widened to float64 before orjson sees them.
"""

from __future__ import annotations

import enum
import gc
import marshal
import math
import operator
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain, islice, repeat
from collections import namedtuple

from .._errors import TrainingStatusTypeError, TrainingStatusValueError
from .._lazy import OnFirstUse

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    import json
    import re
    from typing import Any, NamedTuple

    import orjson
else:
    # orjson's setup imports dataclasses, inspect, uuid and platform (10 ms or more), json brings
    # re: ``from trainstatus import StatusStore`` pays for neither; the first store that opens
    # pays for orjson, and json is imported where a file or a value needs it. The command line
    # imports orjson itself before a command that needs it runs, under its first Ctrl-C handler
    # (``_cli_names.Command.load``).
    json = OnFirstUse("json", globals())
    orjson = OnFirstUse("orjson", globals(), lambda module: _check_orjson(module))


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
# marshal (format 2) writes every float of a value made of builtin types only as b"g" and its 8
# bytes little-endian; those of NaN and +-Infinity, and only those, have all 11 exponent bits set:
# the last byte is 0x7f or 0xff, the one before at least 0xf0. Format 2 rather than the current 4:
# no back-references (whose numbers would add 0x7f/0xff bytes, and whose table made marshal 1.7
# times slower on a checkpoint list sharing its strings with an older one).
_MARSHAL_VERSION = 2
_NONFINITE_FLOAT_PATTERN = rb"g[\x00-\xff]{6}[\xf0-\xff][\x7f\xff]"
_FLOAT_CODES = (ord("g"),)
# How many 0x7f/0xff bytes to look at one by one (about 0.3 µs each) before the regex (about 9 ns
# a byte) is cheaper.
_LOOKS_PER_BYTE = 1 / 64
# orjson reads integers in [-2**63, 2**64 - 1] exactly and anything longer as a float. A run of
# 19 digits is the shortest text that can fall outside; seeing one sends the file to ``json``.
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_DIGIT_RUN = b"0" * 19
# Python's json reads the escapes of a high surrogate followed by a low one as one character, so a
# string holding such a pair as two code points cannot come back from a file as it went in.
# Compiled on first use (``_pattern``): re and its compiler are a few ms of a start otherwise.
_SURROGATE_PAIR_PATTERN = "[\\ud800-\\udbff][\\udc00-\\udfff]"
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


# What _probe_nonfinite answers.
_NONE_THERE, _MAYBE_PLAIN, _MAYBE = 0, 1, 2


def _marshalled(value: Any) -> bytes | None:
    """marshal's bytes (format 2) of a value of builtin types only; None for any other value."""
    if "numpy" in sys.modules:
        # marshal also takes numpy arrays and scalars (as raw bytes, where a NaN has no marker);
        # orjson without its numpy option refuses them.
        try:
            orjson.dumps(value)
        except TypeError:
            return None
    try:
        return marshal.dumps(value, _MARSHAL_VERSION)
    except ValueError:  # an object marshal does not take: the walk decides
        return None


def _probe_nonfinite(packed: bytes | None) -> int:
    """Whether a value may hold NaN or Infinity: ``_NONE_THERE``, ``_MAYBE_PLAIN`` or ``_MAYBE``.

    Asked only when orjson's output has a ``null``, which is what it writes for None and for
    NaN/Infinity alike. ``packed`` is the value's ``_marshalled`` bytes: a value of builtin types
    only (what marshal accepts: no subclass, no dataclass or enum) is answered from them, in C,
    several times faster than the walk of ``_Plain``; ``_MAYBE_PLAIN`` says it is such a value and
    may hold one (a match inside a string is possible), ``_MAYBE`` (``packed`` None) that some
    other type is in it.
    """
    if packed is None:
        return _MAYBE
    # The last byte of a non-finite float, 0x7f or 0xff, is rare in marshal's output of ordinary
    # values, and memchr finds it far faster than the regex scans (0.05 against 9 ms per MB);
    # many of them (negative integers, reference numbers) hand over to the regex.
    tried, enough = 0, 64 + int(len(packed) * _LOOKS_PER_BYTE)
    for last in (b"\x7f", b"\xff"):
        at = packed.find(last, 8)
        while at != -1:
            if packed[at - 1] >= 0xF0 and packed[at - 8] in _FLOAT_CODES:
                return _MAYBE_PLAIN
            tried += 1
            if tried > enough:
                return _MAYBE_PLAIN if _pattern(_NONFINITE_FLOAT_PATTERN).search(packed) is not None else _NONE_THERE
            at = packed.find(last, at + 1)
    return _NONE_THERE


# The commonest value holding a non-finite float is a checkpoint list whose unevaluated rewards
# are NaN, with no None: then every null orjson wrote is a NaN, and one byte replace writes them
# (_only_nans). marshal writes the NaN Python makes, and its negative, as exactly these bytes.
# They cannot occur anywhere else in marshal's output of a value orjson also took: 0xf8 is no
# byte of UTF-8 nor of a type code, and no length or integer orjson takes spells them.
_NAN_MARSHALLED = (b"g\x00\x00\x00\x00\x00\x00\xf8\x7f", b"g\x00\x00\x00\x00\x00\x00\xf8\xff")


def _only_nans(packed: bytes, raw: bytes) -> bytes | None:
    """``raw`` with each null as ``NaN``, when every null in it is a NaN of the value; else None.

    ``packed`` is the value's marshal bytes, ``raw`` orjson's. orjson writes a null for each None,
    each NaN or infinity, and "null" also stands in strings that hold it; so ``raw`` holds at
    least as many as the value has NaNs, and exactly as many only when it has no None, no other
    non-finite float and no "null" in a string: then each null is a NaN, in the value's order.
    On a 1 MB checkpoint list, 2.8 ms of CPU for the whole encoding against 7.6 ms with the
    fragments' walk and second orjson pass (the marshal pass that counts the NaNs is most of it).
    """
    # A split and a join: 0.6 ms on 840 KB, where count() and replace() took 1.5.
    pieces = raw.split(b"null")
    nulls = len(pieces) - 1
    if not nulls:
        return None
    nans = packed.count(_NAN_MARSHALLED[0])
    if nans != nulls:  # the negative NaN is rarer: counted only when needed
        nans += packed.count(_NAN_MARSHALLED[1])
        if nans != nulls:
            return None
    return b"NaN".join(pieces)


# The fast way to NaN literals (_with_literals): orjson writes an ``orjson.Fragment``'s bytes as
# they are, so a copy of the value with each non-finite float replaced by the fragment of its
# literal is written by orjson in one pass, every other byte as orjson writes it.
_LITERAL_FRAGMENTS: tuple[orjson.Fragment, ...] = ()  # made by the first _with_literals
# How many bytes longer than orjson's null each literal is.
_LITERAL_GROWTH = (len(b"NaN") - 4, len(b"Infinity") - 4, len(b"-Infinity") - 4)


def _literal(number: float, tally: list[int]) -> orjson.Fragment:
    which = 0 if number != number else (1 if number > 0 else 2)
    tally[which] += 1
    return _LITERAL_FRAGMENTS[which]


def _swap_in(value: Any, tally: list[int]) -> Any:
    """``value`` with each non-finite float as its literal's fragment; ``value`` itself when none.

    Copy on write: only the containers on the way to a non-finite float are copied (a tuple as a
    list: orjson writes both alike). Builtin types only (what ``_MAYBE_PLAIN`` says the value is).
    ``tally`` counts the NaNs, infinities and negative infinities put in, and the Nones seen.
    ``x - x`` is 0.0 for a finite float and NaN (true) for NaN and the infinities.
    """
    kind = type(value)
    if kind is float:
        return _literal(value, tally) if value - value else value
    if value is None:
        tally[3] += 1
        return value
    if kind is dict:
        out = None
        for key, item in value.items():
            kind = type(item)
            if kind is float:
                if not item - item:
                    continue
                new = _literal(item, tally)
            elif kind is dict or kind is list or kind is tuple:
                new = _swap_in(item, tally)
                if new is item:
                    continue
            else:
                if item is None:
                    tally[3] += 1
                continue
            if out is None:
                out = dict(value)
            out[key] = new
        return value if out is None else out
    if kind is list or kind is tuple:
        copy = None
        for i, item in enumerate(value):
            kind = type(item)
            if kind is float:
                if not item - item:
                    continue
                new = _literal(item, tally)
            elif kind is dict or kind is list or kind is tuple:
                new = _swap_in(item, tally)
                if new is item:
                    continue
            else:
                if item is None:
                    tally[3] += 1
                continue
            if copy is None:
                copy = list(value)
            copy[i] = new
        return value if copy is None else copy
    return value


def _with_literals(value: Any, raw: bytes, encode: Callable[[Any], bytes]) -> bytes | None:
    """``encode(value)`` with NaN/Infinity written as literals, at orjson's speed; None if unsure.

    ``value`` is of builtin types only (``_MAYBE_PLAIN``) and ``raw`` is ``encode(value)`` as
    orjson wrote it (non-finite floats as null). What it returns is checked, not trusted: it must
    be longer than ``raw`` by exactly the literals' extra bytes (each fragment written as it is,
    where orjson had written null), and hold no more nulls than the walk saw Nones and the value's
    strings hold (a non-finite float the walk missed would still be a null); if unsure, the caller
    takes the slow walk. None also when there is no non-finite float.
    """
    global _LITERAL_FRAGMENTS
    if not _LITERAL_FRAGMENTS:
        _LITERAL_FRAGMENTS = (orjson.Fragment(b"NaN"), orjson.Fragment(b"Infinity"), orjson.Fragment(b"-Infinity"))
    tally = [0, 0, 0, 0]  # NaN, Infinity, -Infinity put in; Nones seen
    try:
        copy = _swap_in(value, tally)
    except RecursionError:  # deeper than orjson writes anyway: the slow walk explains it
        return None
    if not (tally[0] or tally[1] or tally[2]):
        return None
    try:
        out = encode(copy)
    except TypeError:  # orjson refused the copy (it took the value): not ours to guess why
        return None
    grown = tally[0] * _LITERAL_GROWTH[0] + tally[1] * _LITERAL_GROWTH[1] + tally[2] * _LITERAL_GROWTH[2]
    if len(out) != len(raw) + grown:
        return None
    nulls = out.count(b"null")
    if nulls != tally[3] and nulls != tally[3] + _nulls_in_text(value):
        return None
    return out


def _nulls_in_text(value: Any) -> int:
    """How many times "null" appears in the strings (keys included) of a value of builtin types.

    Their JSON holds it at least as often (letters are never escaped; an escape such as ``\\n``
    before "ull" can make one more, which fails the check: the slow walk then writes the value).
    """
    kind = type(value)
    if kind is str:
        found: int = value.count("null")
        return found
    if kind is dict:
        return sum(key.count("null") + _nulls_in_text(item) for key, item in value.items())
    if kind is list or kind is tuple:
        return sum(map(_nulls_in_text, value))
    return 0


def _utf8(text: str) -> bytes:
    """JSON text as UTF-8, a lone surrogate written as the ``\\uXXXX`` escape Python's json writes.

    UTF-8 has no bytes for a lone surrogate. JSON text holds one only inside a string, where its
    escape (backslashreplace writes it lowercase, as json does) reads back as the same str.
    """
    return text.encode("utf-8", "backslashreplace")


def _json_dumps(plain: Any) -> bytes:
    text = json.dumps(plain, indent=2, ensure_ascii=False, allow_nan=True)
    return _utf8(text).replace(b"\n", _VALUE_INDENT)


def _with_surrogates(value: Any) -> Entry | None:
    """``value`` through Python's json when a lone surrogate is all orjson refused; else None."""
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


def _refused(value: Any, exc: TypeError, *, path: str, category: str, key: str) -> Entry:
    entry = _with_surrogates(value)
    if entry is None:
        raise _explain(value, exc, path=path, category=category, key=key) from exc
    return entry


def encode_value(value: Any, *, path: str, category: str, key: str) -> Entry:
    """Encode a value a caller wants to store, or raise a clear error naming where it failed.

    Nothing about the store changes here, so an error leaves memory and disk untouched.
    """
    kind = type(value)
    if kind is int or kind is str or kind is bool:
        # The common small value (a lesson number, a step count, a path): one line, no NaN, and
        # no numpy or default to consider. Inside a transaction a set costs little more than this.
        try:
            return _new_entry(Entry, (orjson.dumps(value), False))
        except TypeError as exc:  # an integer beyond 64 bits, a lone surrogate
            return _refused(value, exc, path=path, category=category, key=key)
    if kind is orjson.Fragment:  # orjson would paste its bytes into the file unchecked
        raise TrainingStatusTypeError(
            f"Cannot store {category}/{key} in {path}: an orjson.Fragment is written verbatim and "
            "cannot be checked; store the value itself (orjson.loads(fragment.contents)) instead. "
            "Nothing was written.",
            path=path, category=category, key=key,
        )
    try:
        raw = _dumps_value(value)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        return _refused(value, exc, path=path, category=category, key=key)
    if b"null" in raw:
        literal = _with_nonfinite(value, raw)
        if literal is not None:
            return literal
    return _new_entry(Entry, (raw, False))


def _with_nonfinite(value: Any, raw: bytes) -> Entry | None:
    """The entry of a value whose orjson output ``raw`` has a null, when it holds NaN/Infinity.

    orjson writes NaN and +-Infinity as null. Only a value whose output has a null can hold one;
    marshal clears most of them; a byte replace writes those whose nulls are all NaN (``_only_nans``),
    orjson most others with fragments (``_with_literals``), the walk the rest.
    """
    packed = _marshalled(value)
    probe = _probe_nonfinite(packed)
    if packed is not None and probe == _MAYBE_PLAIN:
        nans = _only_nans(packed, raw)
        if nans is not None:
            return Entry(nans, exotic=True)
        fast = _with_literals(value, raw, _dumps_plain)
        if fast is not None:
            return Entry(fast, exotic=True)
    if probe != _NONE_THERE:
        converter = _Plain()
        plain = converter(value)
        if converter.nonfinite:
            return Entry(_json_dumps(plain), exotic=True)
    return None


def _dumps_plain(value: Any) -> bytes:
    """orjson's bytes, two levels deep, of a value of builtin JSON types only."""
    return _dumps_at_depth(value, None, _OPTIONS)


def encode_loaded(value: Any) -> Entry:
    """Encode a value read from a file (plain JSON types), keeping every number exactly."""
    if type(value) is str and value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        # JSON writes such a string as it is, in quotes. The store's own metadata (versions) is
        # encoded when it is imported, which so needs no orjson (see _ImportedOnFirstUse).
        return Entry(b'"' + value.encode() + b'"')
    try:
        raw = _dumps_plain(value)
    except TypeError:  # an integer beyond 64 bits or a lone surrogate: only json writes it back
        return Entry(_json_dumps(value), exotic=True)
    if b"null" in raw:
        literal = _with_nonfinite(value, raw)
        if literal is not None:
            return literal
    return Entry(raw)


def parse_document(data: bytes) -> Any:
    """Parse a whole file. Raises ``ValueError`` (or ``RecursionError``) when it is not JSON.

    Accepts what Python's ``json`` writes and orjson refuses: ``NaN``/``Infinity`` literals,
    integers beyond 64 bits (kept exact), a UTF-8 byte order mark.
    """
    if _LONG_DIGIT_RUN not in data.translate(_DIGITS_TO_ZERO):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # maybe NaN literals or a BOM; json decides
    return json.loads(data)


def _encode_name(name: str) -> bytes:
    try:
        return orjson.dumps(name)
    except TypeError:  # a lone surrogate: its escape, as in values
        return _utf8(json.dumps(name, ensure_ascii=False))


# The encoded bytes of category and key names, kept between writes. Encoding a name is cheap, but
# a document of thousands of keys paid one orjson call and one small buffer per name on every
# write (3x the floor at 10 MB): the heap grew and shrank each time. Names repeat from write to
# write, so their bytes are kept; past the bound the cache starts over (a dict's get and set are
# atomic under the GIL, so threads need no lock here).
_NAMES: dict[str, bytes] = {}
_NAMES_MAX = 1 << 18


def _name_bytes(names: Iterable[str]) -> list[bytes]:
    """The JSON bytes of each name, in order, through the cache."""
    try:
        return list(map(_NAMES.__getitem__, names))  # in C: no Python call per name
    except KeyError:
        pass
    out = []
    for name in names:
        encoded = _NAMES.get(name)
        if encoded is None:
            encoded = _encode_name(name)
            if len(_NAMES) >= _NAMES_MAX:
                _NAMES.clear()
            _NAMES[name] = encoded
        out.append(encoded)
    return out


def check_name(name: str, what: str, location: str) -> None:
    """Refuse a category or key name that would not read back from the file as the same str.

    A lone surrogate is fine (written as its escape, as in values); a high surrogate followed by
    a low one is not: JSON reads their escapes back as one character.
    """
    if name.isascii():
        return
    pair = _pattern(_SURROGATE_PAIR_PATTERN).search(name)
    if pair is not None:
        raise TrainingStatusValueError(
            f"The {what} {name!r} for {location} {_pair_problem(pair.group(), 'name')}. Nothing "
            "was written.",
            path=location,
        )


def _pair_problem(pair: str, name: str) -> str:
    joined = pair.encode("utf-16", "surrogatepass").decode("utf-16")
    return (
        f"holds the surrogates {pair!r} side by side, which JSON reads back as the one character "
        f"{joined!r}, so it would not come back as stored; join them (e.g. "
        f"{name}.encode('utf-16', 'surrogatepass').decode('utf-16'))"
    )


def render(document: Mapping[str, Mapping[str, Entry]]) -> bytes:
    """The file's bytes: the same layout as ``orjson.dumps(document, option=OPT_INDENT_2)``.

    One join over a flat list of the bytes already made (names from the cache, each entry's raw
    bytes), the list built by C-level iterators: no Python step and no new object per key. A
    category of 40,000 keys costs about twice orjson's encoding of it; making a ``"key": raw``
    line per entry first cost five times (the heap grew and shrank by the file's size each write).
    """
    if not document:
        return b"{}\n"
    pieces = [b"{\n  "]
    for category_bytes, entries in zip(_name_bytes(document), document.values()):
        if not entries:
            pieces += (category_bytes, b": {}", _CATEGORY_SEP)
            continue
        pieces += (category_bytes, b": {\n    ")
        pieces += chain.from_iterable(
            zip(_name_bytes(entries), repeat(b": "), map(_RAW, entries.values()), repeat(_ENTRY_SEP))
        )
        pieces[-1] = b"\n  }"  # the last entry's separator
        pieces.append(_CATEGORY_SEP)
    pieces[-1] = b"\n}\n"  # the last category's separator
    return b"".join(pieces)


_RAW = operator.itemgetter(0)  # Entry.raw, in C
_ENTRY_SEP = b",\n    "
_CATEGORY_SEP = b",\n  "


# The separators of a rendered file. In it every newline is layout (JSON text escapes the newlines
# of strings) and each level is indented two spaces more, so a newline, four spaces and a quote
# starts a key of a category and nothing else; a newline, two spaces and a brace closes one.
_KEY_LINE = b'\n    "'
_CATEGORY_END = b"\n  }"
# How everything render writes but an empty document starts; any other start (ML-Agents' indent
# of 4) is not render's, without a parse.
RENDERED_START = b'{\n  "'


def read_rendered(data: bytes) -> tuple[dict[str, Any], dict[str, dict[str, Entry]]] | None:
    """A file ``render`` wrote: what it holds, parsed, and its entries (``entries_from_rendered``).

    None for any other file, which is then read the long way (``parse_document``), errors and all.
    orjson reads it without ``parse_document``'s look for long digit runs (a pass over the file):
    an integer orjson would read as a float is written back with a '.' or an 'e', so the file
    would not be render's output.
    """
    if not data.startswith(RENDERED_START):
        return None
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        if b"NaN" not in data and b"Infinity" not in data:
            return None
        try:
            parsed = json.loads(data)  # render's NaN literals; integers are exact in json
        except (ValueError, RecursionError):
            return None
    if type(parsed) is not dict or not all(type(value) is dict for value in parsed.values()):
        return None
    entries = entries_from_rendered(parsed, data)
    return None if entries is None else (parsed, entries)


def entries_from_rendered(parsed: Mapping[str, Any], data: bytes) -> dict[str, dict[str, Entry]] | None:
    """Each category's entries as the bytes they already have in ``data``, or None.

    Only for a file that is exactly ``render``'s output for what was parsed from it, which one
    orjson encoding of the whole parse shows (a C pass, a fraction of encoding value by value, as
    opening did before). Then each value's bytes are already what encoding it would give (or, for
    a NaN-holding value that encoding writes with Python's json, orjson's spelling of the same
    numbers), and they are sliced out. NaN and the infinities, which orjson writes as null, are
    allowed where the file spells them as literals and the parse holds them: values holding one
    are marked ``exotic``. A file that is not render's (ML-Agents' indent, an integer beyond 64
    bits, a key repeated, a hand edit) gets None: its values are encoded one by one.
    ``parsed``'s top-level values are dicts (the metadata block is one of them).
    """
    if not data.startswith(RENDERED_START):
        return None
    try:
        whole = orjson.dumps(parsed, option=_OPTIONS)
    except TypeError:  # what orjson cannot write cannot be what it wrote
        return None
    literals = not _is_rendering(data, whole)
    if literals and not _is_rendering(_nulled(data), whole):
        return None
    categories: dict[str, dict[str, Entry]] = {}
    find, at = data.find, 1  # at: the newline before the next category's line
    for name, name_bytes, value in zip(parsed, _name_bytes(parsed), parsed.values()):
        start = at + 3 + len(name_bytes) + 2  # past '\n  "name": ', at the value's brace
        end = start + 2 if not value else find(_CATEGORY_END, start) + 4
        if value:
            # '\n    "key": value,' for each key, the last one ending in the newline of its closing
            # brace's line instead of a comma: split before each key's quote, then each piece
            # loses the rest of its key, ': ' and its last byte. All in C-level iterators: a Python
            # step per key was most of the cost of opening a file of small values.
            pieces = data[start + 1:end - 3].split(_KEY_LINE)
            cuts = map(slice, map(operator.add, map(len, _name_bytes(value)), repeat(1)), repeat(-1))
            raws: Iterator[bytes] = map(operator.getitem, islice(pieces, 1, None), cuts)  # type: ignore[arg-type]
            made: Iterable[tuple[bytes, bool]]
            if literals:  # a value whose bytes hold no literal holds no non-finite float
                listed = list(raws)
                made = zip(listed, map(_has_literal, listed))
            else:
                made = zip(raws, repeat(False))
            categories[name] = dict(zip(value, map(_new_entry, repeat(Entry), made)))
        else:
            categories[name] = {}
        at = end + 1  # past the comma (or the newline of the last one's closing brace)
    return categories


def _is_rendering(data: bytes, whole: bytes) -> bool:
    """Whether ``data`` is ``whole`` and the newline render ends a file with."""
    return len(data) == len(whole) + 1 and data.startswith(whole) and data.endswith(b"\n")


def _nulled(data: bytes) -> bytes:
    """``data`` with each NaN/Infinity literal written as orjson writes them: null."""
    if b"Infinity" in data:  # a look costs a fifth of a replace, which copies the file
        data = data.replace(b"-Infinity", b"null").replace(b"Infinity", b"null")
    return data.replace(b"NaN", b"null")


def _has_literal(raw: bytes) -> bool:
    return b"NaN" in raw or b"Infinity" in raw


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


# --- errors: find where in a nested value encoding failed and say what to do --------------------

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
_MAX_DEPTH = 254  # orjson's own limit when writing


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
