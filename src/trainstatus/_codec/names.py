"""Category and key names: their JSON bytes, kept between writes, and the names that are refused.

``check_name`` refuses a name that would not read back from the file as the same str. Names are
not values: ``document`` and the cached renderer encode them on every write, through a cache of
their bytes that values have no use for, and a store checks each one it is asked to set. A lone
surrogate is written as its escape, as in values; a high surrogate followed by a low one is
refused, and ``_pair_problem`` says why for names and for ``refusals`` (strings and dict keys
inside values) alike. Imports ``values`` only.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._errors import TrainingStatusValueError
from .._lazy import OnFirstUse
from .values import _check_orjson, _pattern, _utf8

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    import json

    import orjson
else:
    # Imported on first use, as in ``values`` (which says why); orjson is checked as there.
    json = OnFirstUse("json", globals())
    orjson = OnFirstUse("orjson", globals(), _check_orjson)

__all__ = ["_SURROGATE_PAIR_PATTERN", "_name_bytes", "_pair_problem", "check_name"]

# Python's json reads the escapes of a high surrogate followed by a low one as one character, so a
# string holding such a pair as two code points cannot come back from a file as it went in.
# Compiled on first use (``_pattern``): re and its compiler are a few ms of a start otherwise.
_SURROGATE_PAIR_PATTERN = "[\\ud800-\\udbff][\\udc00-\\udfff]"


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
