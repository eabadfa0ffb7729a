"""Loading and validation: what a file must look like, and what to say when it does not.

A file is *corrupt* when it is not JSON, its top level is not an object, or a category (the
metadata block included) is not an object; the store keeps such a file aside and starts empty.
Anything else it can read, it reads, and warns about what it cannot vouch for: a different format
version, missing metadata, registered metadata fields that differ from this run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._codec import Entry, encode_loaded, parse_document
from ._errors import TrainingStatusVersionWarning, warn

__all__ = [
    "METADATA",
    "STATUS_FORMAT_VERSION",
    "Corrupt",
    "Document",
    "check_metadata",
    "compare_metadata",
    "is_newer_format",
    "load_document",
]

STATUS_FORMAT_VERSION = "0.3.0"
"""The layout version written in ``metadata.stats_format_version``; ML-Agents' current one."""

METADATA = "metadata"


class Corrupt(Exception):
    """The bytes are not a status document; ``reason`` says why, for the warning."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass
class Document:
    categories: dict[str, dict[str, Entry]]
    metadata: dict[str, Any] | None  # None: the file has no metadata block
    skipped: list[str] = dataclasses.field(default_factory=list)  # newer-format entries not read


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def load_document(data: bytes) -> Document:
    """Parse and validate a whole file; raise ``Corrupt`` when it is not a status document."""
    if not data.strip():
        raise Corrupt("it is empty" if not data else "it holds only whitespace")
    try:
        parsed = parse_document(data)
    except RecursionError:
        raise Corrupt("it is nested too deeply to be a status file") from None
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError, orjson's errors
        raise Corrupt(f"it is not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise Corrupt(f"its top level is {_kind(parsed)}, not an object")
    found_metadata = parsed.get(METADATA)
    # A newer format may lay itself out differently: what this version cannot read is skipped,
    # not called damage, and writing stays refused (see is_newer_format), so nothing is lost.
    newer = isinstance(found_metadata, dict) and is_newer_format(found_metadata.get("stats_format_version"))
    categories: dict[str, dict[str, Entry]] = {}
    metadata: dict[str, Any] | None = None
    skipped: list[str] = []
    for name, value in parsed.items():
        if not isinstance(value, dict):
            if newer:
                skipped.append(name)
                continue
            what = "the metadata block" if name == METADATA else f"category {name!r}"
            raise Corrupt(f"{what} is {_kind(value)}, not an object")
        if name == METADATA:
            metadata = value
            continue
        try:
            categories[name] = {key: encode_loaded(item) for key, item in value.items()}
        except RecursionError:  # deeper than Python's json can write back (orjson read it)
            raise Corrupt(f"category {name!r} is nested too deeply to be a status file") from None
    return Document(categories, metadata, skipped)


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
                      "an error unless the store is opened with allow_downgrade=True; upgrade "
                      "trainstatus to keep what it holds")
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
