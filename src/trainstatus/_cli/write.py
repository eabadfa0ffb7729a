"""``trainstatus set`` and ``delete``: change one value of a status file, as a trainer would.

Both go through a ``StatusStore`` (``target._open_store``), so they are locked, atomic and durable
like any trainer's write and safe while a trainer runs. What they print shows the value replaced
or removed (a long one cut, pointing at ``diff``: the history keeps it whole), and the store's
refusals (a newer format, the ``metadata`` category) are said in command-line words. Kept apart
from ``check`` and ``corrupt``, which only read or put a copy back byte for byte.

Imports ``base``, ``names``, ``target`` and ``values`` of the command line; the store is loaded by
``target`` when a command opens one.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import TYPE_CHECKING

from .base import (
    EXIT_NOT_SET,
    EXIT_OK,
    LONG_VALUE,
    MISSING,
    _cut,
    _Fail,
    _file_in_the_way,
    _json,
    _missing,
    _where,
    is_url,
)
from .._errors import TrainingStatusValueError, TrainingStatusVersionError
from .._load import METADATA, STATUS_FORMAT_VERSION
from .names import PROG
from .target import _open_store, _target
from .values import _parse_value, _read_stdin

if TYPE_CHECKING:
    from .. import _store

__all__ = ["_cmd_delete", "_cmd_set"]


def _newer_format(exc: TrainingStatusVersionError, args: argparse.Namespace) -> _Fail:
    """The store's refusal to rewrite a newer format, naming the flag rather than the keyword."""
    return _Fail(
        f"refusing to write {args.path}: it has format version {exc.found_version!r}, newer than the "
        f"{STATUS_FORMAT_VERSION!r} this trainstatus writes, and rewriting it would drop what this "
        "version does not understand; nothing was changed. Upgrade trainstatus, or pass "
        f"--allow-downgrade to rewrite it in format {STATUS_FORMAT_VERSION}"
    )


def _reserved(exc: TrainingStatusValueError, args: argparse.Namespace) -> _Fail | None:
    """The store's refusal of the ``metadata`` category, in command-line words."""
    if exc.category != METADATA or exc.key != args.key or args.category != METADATA:
        return None
    return _Fail(
        f"cannot change {_where(METADATA, args.key)} in {args.path}: the category {METADATA!r} is "
        "the metadata block, which trainstatus and the trainer write; nothing was changed"
    )


def _cmd_set(args: argparse.Namespace) -> int:
    # --string stores VALUE as it is, "-" included: to store the text "-", pass --string -.
    text = _read_stdin() if args.value == "-" and not args.string else args.value
    value = text if args.string else _parse_value(text)
    directory = None if is_url(args.path) else _target(args.path)[0]
    if directory is not None and not os.path.isdir(directory):
        blocking = _file_in_the_way(args.path)
        if blocking is not None:
            raise _Fail(f"cannot create {args.path}: {blocking} is a file, not a directory; nothing was changed")
        raise _Fail(
            f"cannot create {args.path}: the directory {directory} does not exist; "
            "create it first (mkdir -p)"
        )
    store = _open_store(args)
    try:
        with store.transaction():
            created = not _exists(store)
            old = store.get(args.category, args.key, MISSING)
            store.set(args.category, args.key, value)
    except TrainingStatusValueError as exc:
        raise _reserved(exc, args) or exc
    except TrainingStatusVersionError as exc:
        raise _newer_format(exc, args) from None
    finally:
        store.close()
    if created:
        print(f"created {args.path}")
    before = "(not set)" if old is MISSING else _cut_old(_json(old), args.path)
    print(f"{_where(args.category, args.key)}: {before} -> {_cut(_json(value), args.path, args.category, args.key)}")
    return EXIT_OK


def _cut_old(text: str, path: str, *, within: bool = False) -> str:
    """A replaced value as shown: cut like ``_cut``, pointing at the history that keeps it.

    ``within``: the text is shown inside parentheses already (no second pair for the note).
    """
    if len(text) <= LONG_VALUE:
        return text
    note = f"cut: {len(text):,} characters; `{PROG} diff {shlex.quote(path)}` shows it whole"
    return f"{text[:LONG_VALUE]}... {note}" if within else f"{text[:LONG_VALUE]}... ({note})"


def _exists(store: _store.StatusStore) -> bool:
    """Whether the store's document existed when it was last read (in a transaction: at its start)."""
    found = getattr(store._storage, "found", None)
    return bool(found()) if found is not None else os.path.exists(store.path)


def _cmd_delete(args: argparse.Namespace) -> int:
    if not is_url(args.path) and not os.path.exists(args.path):
        raise _Fail(_missing(args.path))
    store = _open_store(args)
    try:
        with store.transaction():
            if not _exists(store):
                raise _Fail(_missing(args.path))
            old = store.get(args.category, args.key, MISSING)
            removed = store.delete(args.category, args.key)
    except TrainingStatusValueError as exc:
        raise _reserved(exc, args) or exc
    except TrainingStatusVersionError as exc:
        raise _newer_format(exc, args) from None
    finally:
        store.close()
    if not removed:
        raise _Fail(
            f"{_where(args.category, args.key)} is not set in {args.path}; nothing was changed",
            EXIT_NOT_SET,
        )
    # The whole old value stays in the history: `trainstatus diff` shows it.
    print(f"deleted {_where(args.category, args.key)} (was {_cut_old(_json(old), args.path, within=True)})")
    return EXIT_OK
