"""NaN and Infinity: finding them behind orjson's nulls, and writing them as literals, fast.

orjson cannot write the ``NaN``/``Infinity`` literals that ML-Agents' files contain: it silently
writes ``null``, as it does for None. So only a value whose orjson bytes hold a null can hold a
non-finite float, and ``_with_nonfinite`` finds out which: marshal's bytes clear most such values
in C (``_probe_nonfinite``); a value whose nulls are all NaN is written by one byte replace
(``_only_nans``); orjson writes most others, the floats swapped for fragments of their literals
(``_with_literals``); the rest take Python's json (``json_fallback``). Entries holding a literal are
marked ``exotic``: json decodes them.

Its own module because each of these paths exists for the speed of one common case, a checkpoint
list whose unevaluated rewards are NaN, and is checked against the slow walk it stands in for.
Imports ``values`` and ``json_fallback``.
"""

from __future__ import annotations

import marshal
import sys
from collections.abc import Callable

from .._lazy import OnFirstUse
from .json_fallback import _json_dumps, _Plain
from .values import Entry, _check_orjson, _dumps_plain, _pattern

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

    import orjson
else:
    # Imported on first use, as in ``values`` (which says why); orjson is checked as there.
    orjson = OnFirstUse("orjson", globals(), _check_orjson)

__all__ = ["_with_nonfinite"]

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
