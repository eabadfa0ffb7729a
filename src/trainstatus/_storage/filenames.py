"""The names of the files a store keeps beside a status file: lock, lease, temp files, copies.

A file name is at most 255 bytes on ext4, xfs, btrfs, tmpfs and NFS, so a status file named with
222 to 255 bytes leaves no room for ``.lock`` or ``.{name}.trainstatus-<16 hex>.tmp``. One rule
makes every such name: each kind of name reserves the longest suffix it can get, and when the
status file's name does not fit beside it, the name is cut (at a character, never inside one) and
``~`` plus 12 hex digits of a SHA-256 of the whole name are put in its place.

The rule depends on the name alone, never on the filesystem (``pathconf``) or the time, because
every process writing one file must arrive at the same lock file: two names for one lock would be
no lock at all. The hash keeps two long names that share their first bytes apart. Names that fit
are the plain ``<file>.lock`` and so on, which ML-Agents and ``filelock.FileLock`` users share.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import re

__all__ = [
    "COPY_MARK",
    "NAME_MAX",
    "copy_pattern",
    "copy_stem",
    "history_name",
    "history_pattern",
    "lease_name",
    "lock_name",
    "run_name",
    "temp_name",
    "temp_pattern",
]

NAME_MAX = 255  # bytes; the limit of every filesystem a status file is expected on

_LOCK = ".lock"
_LEASE = ".softlock"
_RUN = ".run"
_TEMP_MARK = ".trainstatus-"
_TEMP_RANDOM = 16  # hex digits
_TEMP_SUFFIX = ".tmp"
COPY_MARK = ".corrupt-"
# .corrupt-20250101T120000.000000Z-<n>: n up to 9,999,999 copies kept aside in one microsecond.
_COPY_RESERVE = len(COPY_MARK) + len("20250101T120000.000000Z") + len("-9999999")
_DIGEST = 12  # hex digits after "~"
_HISTORY_MARK = ".history-"
_HISTORY_DIGITS = 8  # zero-padded, so that ls sorts them; more digits past 99,999,999 versions
_HISTORY_RESERVE = 1 + len(_HISTORY_MARK) + 12


def _stem(name: str, reserve: int) -> str:
    """``name``, or its cut form when ``reserve`` more bytes would not fit in a file name."""
    size = len(os.fsencode(name))
    if size + reserve <= NAME_MAX:
        return name
    room = NAME_MAX - reserve - 1 - _DIGEST
    kept: list[str] = []
    for char in name:
        room -= len(os.fsencode(char))
        if room < 0:
            break
        kept.append(char)
    import hashlib  # here: only names of 222 bytes and more need it, and every start would pay

    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:_DIGEST]
    return "".join(kept) + "~" + digest


def lock_name(name: str) -> str:
    """The lock file's name for status file ``name``: ``<name>.lock``."""
    return _stem(name, len(_LOCK)) + _LOCK


def lease_name(name: str) -> str:
    """The soft lease's name for status file ``name``: ``<name>.softlock``."""
    return _stem(name, len(_LEASE)) + _LEASE


def run_name(name: str) -> str:
    """The run lease's name for status file ``name`` (``integrations._shared.lease``): ``<name>.run``."""
    return _stem(name, len(_RUN)) + _RUN


def temp_name(name: str, random_hex: str) -> str:
    """A temp file's name: ``.<name>.trainstatus-<16 hex>.tmp``."""
    return "." + _temp_stem(name) + _TEMP_MARK + random_hex + _TEMP_SUFFIX


def _temp_stem(name: str) -> str:
    return _stem(name, 1 + len(_TEMP_MARK) + _TEMP_RANDOM + len(_TEMP_SUFFIX))


def temp_pattern(name: str) -> re.Pattern[str]:
    """The names this library gives temp files for status file ``name``, and no others."""
    pattern = _TEMP_PATTERNS.get(name)
    if pattern is None:  # re's own cache is keyed by the pattern text, which costs as much to build
        import re  # here, as in the two below: a start that opens no store pays nothing for re

        pattern = re.compile(
            re.escape("." + _temp_stem(name) + _TEMP_MARK) + f"[0-9a-f]{{{_TEMP_RANDOM}}}" + re.escape(_TEMP_SUFFIX)
        )
        if len(_TEMP_PATTERNS) >= 256:
            _TEMP_PATTERNS.clear()
        _TEMP_PATTERNS[name] = pattern
    return pattern


_TEMP_PATTERNS: dict[str, re.Pattern[str]] = {}  # by status file name; each store's open asks


def copy_stem(name: str) -> str:
    """What a kept-aside copy's name starts with, before ``.corrupt-<UTC time>[-N]``."""
    return _stem(name, _COPY_RESERVE)


def copy_pattern(name: str) -> re.Pattern[str]:
    """The names of copies of ``name`` kept aside; groups: the UTC time and the number N or None."""
    import re

    return re.compile(re.escape(copy_stem(name) + COPY_MARK) + r"(\d{8}T\d{6}\.\d{6}Z)(?:-(\d+))?")


def history_name(name: str, sequence: int) -> str:
    """The name of version ``sequence`` of ``name`` kept in its history: ``.<name>.history-<8 digits>``."""
    return f".{_stem(name, _HISTORY_RESERVE)}{_HISTORY_MARK}{sequence:0{_HISTORY_DIGITS}d}"


def history_pattern(name: str) -> re.Pattern[str]:
    """The names of versions of ``name`` kept in its history; group 1: the sequence number."""
    import re

    return re.compile(re.escape(f".{_stem(name, _HISTORY_RESERVE)}{_HISTORY_MARK}") + f"(\\d{{{_HISTORY_DIGITS},}})")
