"""Loading and validation: what a file must look like, and what to say when it does not.

A file is *corrupt* when it is not JSON, its top level is not an object, or a category (the
metadata block included) is not an object; the store keeps such a file aside and puts back the
newest intact version from its history (starting empty only when there is none).
Anything else it can read, it reads, and warns about what it cannot vouch for: a different format
version, missing metadata, registered metadata fields that differ from this run's.

A name given twice in one object (two ``"lesson_num"`` in a category, a category twice) parses,
the last value winning, as JSON parsers do; the next write would keep only that one. The loader
lists every such name in ``Document.duplicates`` so the caller can say so. Finding them costs a
second parse with Python's json, which is paid only when the file is not byte for byte what
``render`` makes of the parsed document: a file trainstatus wrote has no duplicates, which the
same orjson encoding and compare that lets its values' bytes be taken as they stand shows
(``_codec.document.read_rendered``); other files (ML-Agents' ``json.dump(indent=4)``) pay the second parse
(about 200 µs at 32 KB, a fifth to a third of their load), until trainstatus first rewrites them
in its own layout.

Two readers: ``load_document`` for a store (entries, the codec and orjson), and ``load_values``
for the command line's ``show`` and ``get`` (plain values, Python's json alone), which accept and
refuse the same files.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Mapping

from ._errors import TrainingStatusVersionWarning, warn
from ._version import STATUS_FORMAT_VERSION

TYPE_CHECKING = False  # typing.TYPE_CHECKING, for the names only type checkers import
if TYPE_CHECKING:
    from typing import Any

    from ._codec.values import Entry
# The codec (and orjson, 30 ms to import) is imported by the first load_document, not here:
# ``trainstatus show`` and ``get`` read with load_values, which needs only Python's json.

__all__ = [
    "DOWNGRADE_ADVICE",
    "METADATA",
    "STATUS_FORMAT_VERSION",
    "Corrupt",
    "Document",
    "Duplicate",
    "check_metadata",
    "compare_metadata",
    "is_newer_format",
    "find_duplicates",
    "load_document",
    "load_values",
    "Values",
]


METADATA = "metadata"
# How the version warning says to rewrite a newer format anyway; the command line puts its flag here.
DOWNGRADE_ADVICE = "unless the store is opened with allow_downgrade=True"


class Corrupt(Exception):
    """The bytes are not a status document; ``reason`` says why, for the warning."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Duplicate(namedtuple("Duplicate", ("where", "values"))):  # not typing's: 5 ms of `trainstatus show`
    """A name given more than once in one object of a file; its last value is the one read.

    ``where``: the names (and list indexes) from the top of the document down to it:
    ``("Walker", "lesson_num")`` for a key, ``("Walker",)`` for a category,
    ``("Walker", "checkpoints", 0, "steps")`` inside a value. ``values``: every value it has,
    in file order, exactly as Python's json reads them (NaN, integers beyond 64 bits).
    """

    __slots__ = ()
    where: tuple[str | int, ...]
    values: tuple[Any, ...]

    @property
    def name(self) -> str:
        """``where`` as one readable string: ``Walker/checkpoints[0]/steps``."""
        text = ""
        for part in self.where:
            if isinstance(part, int):
                text += f"[{part}]"
            else:
                text += ("/" if text else "") + _readable(part)
        return text

    @property
    def listed(self) -> str:
        """The values as JSON, shortened, in file order: ``1, 2, then 3``."""
        shown = [_shown(value) for value in self.values]
        return ", ".join(shown[:-1]) + ", then " + shown[-1]

    def __str__(self) -> str:
        what = f"the category {self.name}" if len(self.where) == 1 else self.name
        return (f"{what} appears {len(self.values)} times ({self.listed}); the last, "
                f"{_shown(self.values[-1])}, is the one read")


def _readable(name: str) -> str:
    if name and name.isprintable() and name.strip() == name and not any(c in name for c in '/[]"'):
        return name
    import json  # here and below: a store opening a file it wrote reads it with orjson alone

    return json.dumps(name, ensure_ascii=False)


_SHOWN_MAX = 60


def _shown(value: Any) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 3] + "..."


class Document:
    """A status file read: its categories, its metadata block, and what reading it noticed.

    A plain class rather than a dataclass: making a dataclass runs ``exec`` at import (a few ms
    of every ``import trainstatus``).
    """

    __slots__ = ("categories", "duplicates", "metadata", "metadata_entries", "skipped")

    def __init__(
        self,
        categories: dict[str, dict[str, Entry]],
        metadata: dict[str, Any] | None,  # None: the file has no metadata block
        skipped: list[str] | None = None,  # newer-format entries not read
        duplicates: list[Duplicate] | None = None,  # names given more than once, in file order
        metadata_entries: dict[str, Entry] | None = None,  # the metadata encoded, when reading did
    ) -> None:
        self.categories = categories
        self.metadata_entries = metadata_entries
        self.metadata = metadata
        self.skipped = [] if skipped is None else skipped
        self.duplicates = [] if duplicates is None else duplicates

    def __repr__(self) -> str:
        return (f"Document({len(self.categories)} categories, metadata={self.metadata is not None}, "
                f"skipped={self.skipped!r}, duplicates={len(self.duplicates)})")


class _Repeated(dict):  # type: ignore[type-arg]
    """An object of the file in which some name appears more than once: the values of each."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        values: dict[str, list[Any]] = {}
        for key, value in pairs:
            values.setdefault(key, []).append(value)
        self.repeats = {key: tuple(found) for key, found in values.items() if len(found) > 1}


def find_duplicates(data: bytes) -> list[Duplicate]:
    """Every name given more than once in one object of ``data`` (JSON), at any depth, in file order.

    Python's json, which reads what ``parse_document`` reads (NaN/Infinity, big integers, a BOM),
    hands each object's pairs over before they become a dict; only an object with a repeated
    name is kept aside, and only when one was seen is the tree walked to say where it is.
    """
    return _parse_noting_duplicates(data)[1]


def _parse_noting_duplicates(data: bytes) -> tuple[Any, list[Duplicate]]:
    """``data`` parsed by Python's json (each object a dict, its last value for a repeated name)
    and the duplicates (see ``find_duplicates``). ``Corrupt`` when it is not JSON."""
    repeated = False

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated
        obj = dict(pairs)
        if len(obj) == len(pairs):
            return obj
        repeated = True
        return _Repeated(pairs)

    import json

    try:
        tree = json.loads(data, object_pairs_hook=pairs_hook)
    except RecursionError:
        raise Corrupt("it is nested too deeply to be a status file") from None
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        raise Corrupt(f"it is not valid JSON ({exc})") from None
    if not repeated:
        return tree, []
    found: list[Duplicate] = []
    _collect(tree, (), found)
    return tree, found


def _collect(value: Any, where: tuple[str | int, ...], found: list[Duplicate]) -> None:
    if isinstance(value, dict):
        repeats = value.repeats if isinstance(value, _Repeated) else {}
        for key, item in value.items():
            if key in repeats:
                # Repeats inside the values it overrides are not listed: this line covers them.
                found.append(Duplicate((*where, key), repeats[key]))
            _collect(item, (*where, key), found)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _collect(item, (*where, index), found)


def _renders_back(parsed: dict[str, Any], categories: dict[str, dict[str, Entry]], data: bytes, codec: Any,
                  encoding: Any) -> bool:
    """Whether ``render`` gives back exactly ``data``: then no object in it repeats a name."""
    document: dict[str, Mapping[str, Entry]] = {}
    for name, value in parsed.items():
        if name == METADATA:
            document[name] = {key: encoding.encode_loaded(item) for key, item in value.items()}
        else:
            document[name] = categories[name]
    return bool(codec.render(document) == data)


def _check_text(data: bytes) -> None:
    if not data.strip():
        raise Corrupt("it is empty" if not data else "it holds only whitespace")


def _top_level(parsed: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """The metadata block and the names skipped as a newer format's; ``Corrupt`` if it is none."""
    if not isinstance(parsed, dict):
        raise Corrupt(f"its top level is {_kind(parsed)}, not an object")
    found_metadata = parsed.get(METADATA)
    # A newer format may lay itself out differently: what this version cannot read is skipped,
    # not called damage, and writing stays refused (see is_newer_format), so nothing is lost.
    newer = isinstance(found_metadata, dict) and is_newer_format(found_metadata.get("stats_format_version"))
    skipped: list[str] = []
    for name, value in parsed.items():
        if not isinstance(value, dict):
            if newer:
                skipped.append(name)
                continue
            what = "the metadata block" if name == METADATA else f"category {name!r}"
            raise Corrupt(f"{what} is {_kind(value)}, not an object")
    return (None if METADATA in skipped else found_metadata), skipped


class Values:
    """A status file read as plain values (``load_values``)."""

    __slots__ = ("categories", "duplicates", "metadata", "skipped", "tree")

    def __init__(self, categories: dict[str, dict[str, Any]], metadata: dict[str, Any] | None, skipped: list[str],
                 duplicates: list[Duplicate], tree: dict[str, Any]) -> None:
        self.categories = categories
        self.metadata = metadata  # None: the file has no metadata block
        self.skipped = skipped  # newer-format entries not read
        self.duplicates = duplicates  # names given more than once, in file order
        self.tree = tree  # the whole file, in its order, newer-format entries included


def load_values(data: bytes) -> Values:
    """What ``load_document`` reads, as plain values, with Python's json alone; ``Corrupt`` likewise.

    For the command line's reading commands, which print what they read once: importing orjson
    and the codec (30-40 ms) is most of their run time on a small file. Python's json is what
    ``parse_document`` falls back on, so both read the same values from any file.
    """
    _check_text(data)
    tree, duplicates = _parse_noting_duplicates(data)
    metadata, skipped = _top_level(tree)
    categories = {name: value for name, value in tree.items() if name != METADATA and name not in skipped}
    return Values(categories, metadata, skipped, duplicates, tree)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def load_document(data: bytes) -> Document:
    """Parse and validate a whole file; raise ``Corrupt`` when it is not a status document."""
    from ._codec import document as _codec, encoding as _encoding
    from ._codec.values import PAUSE_FROM, collector_paused

    if len(data) >= PAUSE_FROM:
        with collector_paused():  # a big file: see _codec.values.collector_paused
            return _load_document(data, _codec, _encoding)
    return _load_document(data, _codec, _encoding)


def _load_document(data: bytes, codec: Any, encoding: Any) -> Document:
    rendered = codec.read_rendered(data)
    if rendered is not None:  # a file trainstatus wrote: its values' bytes are taken as they stand
        parsed, entries = rendered
        return Document(entries, parsed.get(METADATA), [], [], entries.pop(METADATA, None))
    _check_text(data)
    try:
        parsed = codec.parse_document(data)
    except RecursionError:
        raise Corrupt("it is nested too deeply to be a status file") from None
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError, orjson's errors
        raise Corrupt(f"it is not valid JSON ({exc})") from None
    metadata, skipped = _top_level(parsed)
    categories: dict[str, dict[str, Entry]] = {}
    for name, value in parsed.items():
        if name == METADATA or name in skipped:
            continue
        try:
            categories[name] = {key: encoding.encode_loaded(item) for key, item in value.items()}
        except RecursionError:  # deeper than Python's json can write back (orjson read it)
            raise Corrupt(f"category {name!r} is nested too deeply to be a status file") from None
    duplicates: list[Duplicate] = []
    if skipped or not (data.startswith(codec.RENDERED_START) and _renders_back(parsed, categories, data, codec, encoding)):
        duplicates = find_duplicates(data)  # Corrupt where orjson read deeper than Python's json can
    return Document(categories, metadata, skipped, duplicates)


def _version_tuple(version: Any) -> tuple[int, ...] | None:
    if not isinstance(version, str):
        return None
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return None


def _breaking_part(version: tuple[int, ...]) -> tuple[int, ...]:
    # Semantic versioning: the major number breaks compatibility; below 1.0 the minor one does.
    major = version[0]
    minor = version[1] if len(version) > 1 else 0
    return (major,) if major else (0, minor)


def is_newer_format(found: Any) -> bool:
    """Whether ``found`` is a format version with breaking changes this library does not know."""
    if found == STATUS_FORMAT_VERSION:  # what this version writes, asked twice at each open: no parsing
        return False
    theirs = _version_tuple(found)
    if theirs is None:
        return False
    ours = _version_tuple(STATUS_FORMAT_VERSION)
    assert ours is not None
    return _breaking_part(theirs) > _breaking_part(ours)


def compare_metadata(found: Mapping[str, Any], expected: Mapping[str, Any], *, location: str) -> list[str]:
    """One message for each field present on both sides with different values."""
    messages = []
    for field, ours in expected.items():
        if field in found and found[field] != ours:
            messages.append(
                f"{location} was written with {field}={found[field]!r} but this run has "
                f"{field}={ours!r}; some things may not resume properly."
            )
    return messages


def check_metadata(found: Mapping[str, Any] | None, registered: Mapping[str, Any], *, location: str) -> None:
    """Warn about everything in a file's metadata this run cannot vouch for."""
    if found is None:
        warn(TrainingStatusVersionWarning(
            f"{location} has no metadata block, so its format version is unknown (an old or "
            f"foreign file?); it is read as format {STATUS_FORMAT_VERSION} and the metadata is "
            "added on the next write.",
            path=location,
        ))
        return
    version = found.get("stats_format_version")
    if version != STATUS_FORMAT_VERSION:
        if is_newer_format(version):
            advice = ("it is read as far as this version understands it, but writing to it raises "
                      f"an error {DOWNGRADE_ADVICE}; upgrade trainstatus to keep what it holds")
        else:
            advice = "it is read as this version and rewritten in it on the next write"
        warn(TrainingStatusVersionWarning(
            f"{location} has format version {version!r}, this trainstatus writes "
            f"{STATUS_FORMAT_VERSION!r}; {advice}.",
            path=location,
            found_version=None if version is None else str(version),
        ))
    for message in compare_metadata(found, registered, location=location):
        warn(TrainingStatusVersionWarning(message, path=location))
