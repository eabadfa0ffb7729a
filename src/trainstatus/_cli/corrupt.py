"""``trainstatus corrupt list`` and ``corrupt restore``: the copies a store kept aside beside a file.

A store that finds its file damaged moves it aside (``<name>.corrupt-<time>``) and starts anew;
a restore keeps the file it replaces aside the same way. ``corrupt list`` reads each copy and says
whether it parses, changing nothing. ``corrupt restore`` writes a kept-aside copy back byte for
byte, under the same lock and with the same write protocol as a trainer's write, keeping the file
it replaces aside first (``restore``, in ``history``, does the same with a version from the history).

Imports ``base``, ``names`` and ``target`` of the command line, the loader (to check that a copy
parses) and the local file's storage (its lock and its write); not the store.
"""

from __future__ import annotations

import argparse
import os
import warnings

from .._storage import filenames as _names
from .base import EXIT_OK, _Fail, _missing, _plural, _read_bytes, _unreadable
from .._load import Corrupt, load_document
from .._storage.local import LocalFile
from .names import PROG
from .target import _copies, _shown_directory, _target, replace_read

__all__ = ["_cmd_corrupt_list", "_cmd_corrupt_restore", "_no_subcommand"]


def _cmd_corrupt_list(args: argparse.Namespace) -> int:
    directory, name = _target(args.path)
    copies = _copies(directory, name)
    exists = os.path.lexists(args.path)
    if not copies:
        if not exists:
            raise _Fail(_missing(args.path))
        print(f"no copies of {args.path} are kept aside")
        return EXIT_OK
    shown = _shown_directory(args.path, directory)
    rows = []
    for copy in copies:
        full = os.path.join(directory, copy)
        try:
            data = _read_bytes(full)
        except OSError as exc:
            rows.append((os.path.join(shown, copy), "?", f"unreadable: {exc.strerror or exc}"))
            continue
        try:
            document = load_document(data)
        except Corrupt as exc:
            state = f"damaged: {exc.reason}"
        else:
            keys = sum(len(entries) for entries in document.categories.values())
            state = f"parses: {_plural(len(document.categories), 'category', 'categories')}, {_plural(keys, 'key')}"
        rows.append((os.path.join(shown, copy), f"{len(data)} bytes", state))
    name_width = max(len(row[0]) for row in rows)
    size_width = max(len(row[1]) for row in rows)
    for copy_path, size, state in rows:
        print(f"{copy_path:<{name_width}}  {size:>{size_width}}  {state}")
    if not exists:  # a store moved the damaged file aside and has not written since: not an error
        print(f"({_missing(args.path)} now; `{PROG} corrupt restore {args.path} COPY` puts a copy back)")
    return EXIT_OK


def _resolve_copy(path: str, copy: str) -> tuple[str, str]:
    """(full path, name) of the kept-aside copy ``copy`` of ``path``, or a one-line error."""
    directory, name = _target(path)
    candidate = copy if os.sep in copy else os.path.join(directory, copy)
    copy_name = os.path.basename(candidate)
    copy_directory = os.path.realpath(os.path.dirname(os.path.abspath(candidate)))
    if copy_directory != directory or not _names.copy_pattern(name).fullmatch(copy_name):
        raise _Fail(
            f"{copy} is not a copy of {path} kept aside (expected {_names.copy_stem(name)}.corrupt-<time> in "
            f"{directory}); `{PROG} corrupt list {path}` lists them"
        )
    return os.path.join(directory, copy_name), copy_name


def _cmd_corrupt_restore(args: argparse.Namespace) -> int:
    copy_path, copy_name = _resolve_copy(args.path, args.copy)
    try:
        data = _read_bytes(copy_path)
    except FileNotFoundError:
        raise _Fail(f"no kept-aside copy at {args.copy}") from None
    except OSError as exc:
        raise _Fail(_unreadable(args.copy, exc)) from None
    try:
        load_document(data)
    except Corrupt as exc:
        raise _Fail(
            f"cannot restore {args.copy}: it does not parse as a status document either "
            f"({exc.reason}); nothing was changed"
        ) from None
    directory, name = _target(args.path)
    shown = _shown_directory(args.path, directory)
    storage = LocalFile(os.path.abspath(args.path), durable=True, lock=args.lock)
    kept = None
    try:
        with storage.lock(args.lock_timeout, configured=args.lock_timeout):
            def keep(current: bytes | None) -> None:  # (read also remembers its mode and owner)
                nonlocal kept
                if current is not None:
                    kept = storage.keep_copy(current)

            replace_read(storage, data, keep)
            unkept = storage.take_warning()
            if unkept is not None:
                warnings.warn(unkept, stacklevel=1)
    finally:
        storage.close()
    if kept is not None:
        kept_shown = os.path.join(shown, os.path.basename(kept))
        print(f"kept the current {args.path} aside as {kept_shown}")
    print(f"restored {args.path} from {os.path.join(shown, copy_name)} ({_plural(len(data), 'byte')})")
    if kept is not None:
        print(f"to undo: {PROG} corrupt restore {args.path} {kept_shown}")
    return EXIT_OK


def _no_subcommand(args: argparse.Namespace) -> int:  # pragma: no cover - argparse requires one
    raise _Fail("a subcommand is required")
