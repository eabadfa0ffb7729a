"""Encoding a value for the file: which way it is written, for a caller's value and a file's.

orjson is the fast path. It cannot write or read the ``NaN``/``Infinity`` literals that ML-Agents'
files contain (it silently writes ``null``), nor integers beyond 64 bits (it reads them as floats).
Values holding those go through Python's ``json`` module instead and are marked ``exotic`` so they
are decoded by ``json`` too: slower, but nothing is ever silently changed.

``encode_value`` takes what a caller stores: orjson's bytes (``values``), with NaN/Infinity written
as literals where orjson wrote null (``nonfinite``), Python's json where orjson refused only a lone
surrogate (``json_fallback``), or else an error saying where the value went wrong and what to store
instead (``refusals``). ``encode_loaded`` takes a value read from a file, plain JSON types, keeping
every number exactly. The top of the codec's value side: it imports those four modules, and none
of them imports it.
"""

from __future__ import annotations

from .._errors import TrainingStatusTypeError
from .._lazy import OnFirstUse
from .json_fallback import _json_dumps, _with_surrogates
from .nonfinite import _with_nonfinite
from .values import Entry, _check_orjson, _dumps_plain, _dumps_value, _new_entry

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

    import orjson
else:
    # Imported on first use, as in ``values`` (which says why); orjson is checked as there.
    orjson = OnFirstUse("orjson", globals(), _check_orjson)

__all__ = ["encode_loaded", "encode_value"]


def _refused(value: Any, exc: TypeError, *, path: str, category: str, key: str) -> Entry:
    entry = _with_surrogates(value)
    if entry is None:
        from .refusals import _explain  # only for a value that is refused

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
