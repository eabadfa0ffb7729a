"""The whole file: the entries' bytes joined into it, and a file taken apart into entries again.

``render`` joins the entries' bytes into the file; ``read_rendered`` and ``entries_from_rendered``
take a file ``render`` wrote apart again without encoding its values one by one, and
``parse_document`` reads any other file.

The file's layout (its separators, where a category or a key starts) is this module's concern,
not any one value's: ``renderer.Renderer``, which keeps a store's rendering between writes, builds
on the same separators and gives byte for byte what ``render`` gives. Imports ``values`` and
``names``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, islice, repeat

from .._lazy import OnFirstUse
from .names import _name_bytes
from .values import _OPTIONS, Entry, _check_orjson, _new_entry

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    import json
    from typing import Any

    import orjson
else:
    # Imported on first use, as in ``values`` (which says why); orjson is checked as there.
    json = OnFirstUse("json", globals())
    orjson = OnFirstUse("orjson", globals(), _check_orjson)

__all__ = [
    "RENDERED_START",
    "_CATEGORY_SEP",
    "_ENTRY_SEP",
    "_RAW",
    "entries_from_rendered",
    "parse_document",
    "read_rendered",
    "render",
]

# orjson reads integers in [-2**63, 2**64 - 1] exactly and anything longer as a float. A run of
# 19 digits is the shortest text that can fall outside; seeing one sends the file to ``json``.
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_DIGIT_RUN = b"0" * 19


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
