"""The command line's ``history``, ``diff`` and ``restore``: the versions a store keeps beside a file.

Kept apart from ``_cli`` (the other commands) because it is one concern: reading the versions that
``_storage.history`` keeps, comparing two of them key by key, and putting one back. ``_cli`` registers
these commands when it builds its parser.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import warnings
from typing import Any

from .._storage import history as _history
from .target import _target, replace_read
from .base import EXIT_OK, _Fail, _json, _label, _missing, _plural, _read_bytes, _unreadable
from .entries import entry_lines, is_entry_list, whole_list_lines
from .names import CURRENT as _CURRENT
from .names import PROG
from .._codec.values import Entry, decode
from .._load import Corrupt, Document, load_document
from .._storage.local import LocalFile
from .._storage.messages import byte_size
from .._store import DEFAULT_HISTORY

__all__ = ["_cmd_diff", "_cmd_history", "_cmd_restore"]

EXIT_DIFFERENT = 1  # diff: the versions differ (as diff(1))


def _versions(path: str) -> list[_history.Version]:
    directory, name = _target(path)
    return _history.versions(directory, name)


def _written(mtime_ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(mtime_ns / 1e9, datetime.timezone.utc)
    return f"{moment:%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"


def _pick(path: str, which: str, versions: list[_history.Version], *, current: bool = True) -> tuple[str, bytes]:
    """(label, bytes) of version ``which``: a number from ``history``, or ``current`` (if ``current``)."""
    if which == _CURRENT:
        try:
            return _CURRENT, _read_bytes(path)
        except OSError as exc:
            raise _Fail(_unreadable(path, exc)) from None
    try:
        sequence = int(which)
    except ValueError:
        also = f", or {_CURRENT!r} for the file itself" if current else ""
        raise _Fail(f"{which!r} is not a version: give a number from `{PROG} history {path}`{also}") from None
    for version in versions:
        if version.sequence == sequence:
            try:
                return f"version {sequence}", _history.read(version)
            except OSError as exc:
                raise _Fail(f"cannot read version {sequence} ({version.path}): {exc.strerror or exc}") from None
    kept = f"versions {versions[0].sequence} to {versions[-1].sequence} are kept" if versions else "no versions are kept"
    raise _Fail(f"{path} has no version {sequence} in its history ({kept}); `{PROG} history {path}` lists them")


def _document(label: str, data: bytes) -> Document:
    try:
        return load_document(data)
    except Corrupt as exc:
        raise _Fail(f"{label} does not parse as a status document ({exc.reason})") from None


def _changes(old: Document, new: Document) -> list[tuple[str, str, str, Entry | None, Entry | None]]:
    """(kind, category, key, old entry, new entry) for each key added, removed or changed."""
    found: list[tuple[str, str, str, Entry | None, Entry | None]] = []
    for category in list(old.categories) + [c for c in new.categories if c not in old.categories]:
        before = old.categories.get(category, {})
        after = new.categories.get(category, {})
        for key in list(before) + [k for k in after if k not in before]:
            a, b = before.get(key), after.get(key)
            if a is None:
                found.append(("added", category, key, None, b))
            elif b is None:
                found.append(("removed", category, key, a, None))
            elif a.raw != b.raw and _json(decode(a)) != _json(decode(b)):
                # Same bytes, or the same value spelled another way (another writer's layout).
                found.append(("changed", category, key, a, b))
    return found


def _changed_keys(old: Document, new: Document) -> str:
    changes = _changes(old, new)
    if not changes:
        return "(no key changed)"
    shown = ", ".join(f"{_label(c)}/{_label(k)}" for _, c, k, _, _ in changes[:6])
    return shown + (f" and {len(changes) - 6} more" if len(changes) > 6 else "")


# -- history ----------------------------------------------------------------------------------


def _prune(args: argparse.Namespace) -> int:
    """``history --prune --keep N``: remove all but the newest N versions (no lock needed: writers
    prune the same way, and a version another writer adds meanwhile is simply one more kept)."""
    if args.keep is None:
        raise _Fail("--prune needs --keep N: how many of the newest versions to keep (0: none)")
    versions = _versions(args.path)
    removed = versions[: max(0, len(versions) - args.keep)]
    if not removed:
        print(f"nothing to remove: {_plural(len(versions), 'earlier version')} of {args.path} kept, "
              f"--keep {args.keep}")
        return EXIT_OK
    freed = 0
    for version in removed:
        try:
            os.unlink(version.path)
        except FileNotFoundError:
            continue  # pruned by a writer meanwhile
        except OSError as exc:
            raise _Fail(f"cannot remove version {version.sequence} ({version.path}): {exc.strerror or exc}; "
                        f"{_plural(removed.index(version), 'version')} removed before it") from None
        freed += version.size
    numbers = str(removed[0].sequence) if len(removed) == 1 else f"{removed[0].sequence} to {removed[-1].sequence}"
    left = len(versions) - len(removed)
    print(f"removed {_plural(len(removed), 'earlier version')} of {args.path} ({numbers}, {byte_size(freed)}); "
          f"{_plural(left, 'version')} kept")
    return EXIT_OK


def _cmd_history(args: argparse.Namespace) -> int:
    if args.prune or args.keep is not None:
        if not args.prune:
            raise _Fail("--keep is how many versions --prune keeps: pass --prune too")
        return _prune(args)
    versions = _versions(args.path)
    rows: list[tuple[str, str, str, bytes | None]] = []
    for version in versions:
        try:
            data: bytes | None = _history.read(version)
        except OSError:
            data = None  # pruned since the listing
        rows.append((str(version.sequence), _written(version.mtime_ns), "", data))
    missing = False
    try:
        current = _read_bytes(args.path)
        rows.append((_CURRENT, _written(os.stat(args.path).st_mtime_ns), "", current))
    except (FileNotFoundError, NotADirectoryError):
        missing = True
    except OSError as exc:
        raise _Fail(_unreadable(args.path, exc)) from None
    if not versions:
        if missing:
            raise _Fail(_missing(args.path))
        print(f"no earlier versions of {args.path} are kept (a store keeps them from its next write "
              "unless opened with history=0)")
        return EXIT_OK
    table = []
    previous: Document | None = None
    before = "(the oldest kept)"  # what the first row is compared with
    for label, written, _, data in rows:
        if data is None:
            table.append((label, written, "-", "(removed while listing)"))
            previous, before = None, "(the version before was removed while listing)"
            continue
        try:
            document: Document | None = load_document(data)
        except Corrupt as exc:
            table.append((label, written, _plural(len(data), "byte"), f"damaged: {exc.reason}"))
            previous, before = None, "(the version before is damaged: nothing to compare with)"
            continue
        assert document is not None
        table.append((label, written, _plural(len(data), "byte"),
                      before if previous is None else _changed_keys(previous, document)))
        previous = document
    headers = ("VERSION", "WRITTEN", "SIZE", "KEYS CHANGED FROM THE VERSION BEFORE")
    widths = [max(len(row[i]) for row in [headers, *table]) for i in range(3)]
    for row in [headers, *reversed(table)]:  # newest first
        print(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}")
    if missing:  # what is left of it: a resume, or `restore`, puts the newest back
        print(f"({_missing(args.path)} now; `{PROG} restore {args.path} {versions[-1].sequence}` puts the newest "
              "version back, as a store opened with resume=True does)")
    return EXIT_OK


# -- diff -------------------------------------------------------------------------------------


def _cmd_diff(args: argparse.Namespace) -> int:
    versions = _versions(args.path)
    if args.old is None:
        if not versions:
            if not os.path.lexists(args.path):
                raise _Fail(_missing(args.path))
            raise _Fail(f"{args.path} has no earlier version kept to compare with; give two versions")
        args.old = str(versions[-1].sequence)
    new_label, new_data = _pick(args.path, args.new or _CURRENT, versions)
    old_label, old_data = _pick(args.path, args.old, versions)
    changes = _changes(_document(old_label, old_data), _document(new_label, new_data))
    if args.json:
        print(json.dumps([
            {"change": kind, "category": category, "key": key,
             **({"old": decode(a)} if a is not None else {}), **({"new": decode(b)} if b is not None else {})}
            for kind, category, key, a, b in changes
        ], ensure_ascii=False, allow_nan=True, indent=2))
    else:
        print(f"from {old_label} to {new_label}: {_plural(len(changes), 'key differs', 'keys differ')}")
        for kind, category, key, a, b in changes:
            for line in _change_lines(kind, f"{_label(category)}/{_label(key)}",
                                      None if a is None else decode(a), None if b is None else decode(b)):
                print(line)
    return EXIT_DIFFERENT if changes else EXIT_OK


def _change_lines(kind: str, where: str, old: Any, new: Any) -> list[str]:
    """diff's lines for one key: the value whole, or a list of entries one entry a line (``entries``)."""
    if kind == "added":
        if is_entry_list(new):
            return [f"+ {where} = {_plural(len(new), 'entry', 'entries')}:", *whole_list_lines(new, "+")]
        return [f"+ {where} = {_json(new)}"]
    if kind == "removed":
        if is_entry_list(old):
            return [f"- {where} (was {_plural(len(old), 'entry', 'entries')}):", *whole_list_lines(old, "-")]
        return [f"- {where} (was {_json(old)})"]
    if (is_entry_list(old) or old == []) and (is_entry_list(new) or new == []):  # not both []: they differ
        summary, lines = entry_lines(old, new)
        return [f"~ {where}: {summary}", *lines]
    return [f"~ {where}: {_json(old)} -> {_json(new)}"]


# -- restore ----------------------------------------------------------------------------------


def _cmd_restore(args: argparse.Namespace) -> int:
    versions = _versions(args.path)
    if args.version == _CURRENT:
        raise _Fail(f"{_CURRENT!r} is the file itself: give a version number from `{PROG} history {args.path}`")
    label, data = _pick(args.path, args.version, versions, current=False)
    document = _document(label, data)
    directory, name = _target(args.path)
    # As for set and delete (target._open_store): as many versions as there are, at least the
    # default, whatever history= the trainers use.
    storage = LocalFile(os.path.join(directory, name), durable=True, lock=args.lock,
                        history=max(DEFAULT_HISTORY, len(versions)))
    kept: _history.Version | None = None
    try:
        with storage.lock(args.lock_timeout, configured=args.lock_timeout):
            replaced = replace_read(storage, data)  # what it replaces is kept in the history by the write
            unkept = storage.take_warning()
            if replaced is not None and unkept is None:
                # Under the lock no other writer adds a version: the newest is the one this write
                # kept. Listed after the lock is released, another writer's could be newer.
                listed = _history.versions(directory, name)
                kept = listed[-1] if listed else None
            if unkept is not None:
                warnings.warn(unkept, stacklevel=1)
    finally:
        storage.close()
    keys = sum(len(entries) for entries in document.categories.values())
    print(f"restored {args.path} to {label} ({_plural(keys, 'key')}, {_plural(len(data), 'byte')}); "
          "running trainers see it at their next write, like any other writer's change")
    if kept is not None:
        print(f"the version it replaced is kept as version {kept.sequence}; to undo: "
              f"{PROG} restore {args.path} {kept.sequence}")
    return EXIT_OK


# -- the parser -------------------------------------------------------------------------------
