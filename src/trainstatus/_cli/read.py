"""``trainstatus show`` and ``get``: print what a status file holds, reading it with Python's json.

On an object store's URL they read the object through its adapter (its SDK imported then).

They read the file's bytes and change nothing (no store, no lock, a damaged file stays put), and
they load neither the codec nor orjson (``_load.load_values``): on a small file, importing those
was most of the command's run time.
"""

from __future__ import annotations

from .base import (
    EXIT_NOT_SET,
    EXIT_OK,
    MISSING,
    _cut,
    _duplicate_problem,
    _Fail,
    _json,
    _label,
    _plural,
    _read_status,
    _where,
    is_url,
    read_object,
)
from .names import PROG
from .._errors import TrainingStatusWarning, warn
from .._load import METADATA, Corrupt, Values, check_metadata, load_values

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (5 ms of every command)
if TYPE_CHECKING:
    import argparse
    from typing import Any

__all__ = ["_cmd_get", "_cmd_show"]


def _values(args: argparse.Namespace) -> Values:
    """The file's values, or a one-line error; warns about names given twice."""
    path = args.path
    try:
        values = load_values(read_object(args) if is_url(path) else _read_status(path))
    except Corrupt as exc:
        raise _Fail(f"{path} is damaged: {exc.reason}; it was left as it is (`{PROG} check` tells more)") from None
    for duplicate in values.duplicates:
        warn(TrainingStatusWarning(f"{path}: {_duplicate_problem(duplicate)}", path=path))
    return values


def _is_checkpoint_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, dict) and "steps" in item and "file_path" in item for item in value)
    )


def _is_number(value: Any) -> bool:
    # value != value: NaN, the one float unequal to itself (math.isnan without loading math's library)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _summary(value: Any) -> str:
    if _is_checkpoint_list(value):
        newest = value[-1]
        if all(_is_number(item["steps"]) for item in value):
            newest = max(value, key=lambda item: item["steps"])
        path = newest["file_path"]
        shown = path if isinstance(path, str) else _json(path)
        return f"{_plural(len(value), 'checkpoint')}, newest step {_json(newest['steps'])}: {shown}"
    return _json(value)


def _cmd_show(args: argparse.Namespace) -> int:
    values = _values(args)
    if args.json:
        # Everything the file holds, in its order (a newer format's entries included).
        print(_json(values.tree, indent=2))
        return EXIT_OK
    check_metadata(values.metadata, {}, location=args.path)  # warnings: one line each on stderr
    lines = []
    if values.metadata is None:
        lines.append("metadata: none (the file has no metadata block)")
    else:
        lines.append("metadata:")
        lines.extend(f"  {_label(field)}: {_cut(_json(value), args.path, METADATA, field)}"
                     for field, value in values.metadata.items())
    for category, keys in values.categories.items():
        if not keys:
            lines.append(f"{_label(category)}: (no keys)")
            continue
        lines.append(f"{_label(category)}:")
        lines.extend(f"  {_label(key)}: {_cut(_summary(value), args.path, category, key)}" for key, value in keys.items())
    for name in values.skipped:
        lines.append(f"{_label(name)}: (an entry of a newer format, not read by this trainstatus)")
    if not values.categories and not values.skipped:
        lines.append("(no categories)")
    print("\n".join(lines))
    return EXIT_OK


def _cmd_get(args: argparse.Namespace) -> int:
    values = _values(args)
    if args.category == METADATA:
        value = (values.metadata or {}).get(args.key, MISSING)
    else:
        value = values.categories.get(args.category, {}).get(args.key, MISSING)
    if value is MISSING:
        raise _Fail(f"{_where(args.category, args.key)} is not set in {args.path}", EXIT_NOT_SET)
    print(_json(value, indent=None if args.compact else 2))
    return EXIT_OK
