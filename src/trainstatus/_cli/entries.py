"""How two lists of entries differ, for ``diff``: a checkpoint list one entry a line, not whole.

A checkpoint list (``[{"steps": ..., "file_path": ..., ...}, ...]``) is a key's value like any
other; printed whole, two of them made one line of kilobytes in which the one entry that changed
could not be found. A list whose items are all objects is compared entry by entry instead: an entry
found unchanged in the other list is left out; the others are paired by their ``file_path`` (or,
without one, their ``steps``) and shown as changed field by field; what is left was added or
removed. Any other value is shown whole, as before. Imports ``base`` of the command line alone.
"""

from __future__ import annotations

from typing import Any

from .base import _json, _label, _plural

__all__ = ["entry_lines", "is_entry_list", "whole_list_lines"]

_INDENT = "    "


def is_entry_list(value: Any) -> bool:
    """A non-empty list whose every item is an object (a checkpoint list, for one)."""
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _identity(entry: dict[str, Any]) -> tuple[str, str] | None:
    """What pairs an entry with its changed self in the other list: its file, else its steps."""
    for field in ("file_path", "steps"):
        if field in entry:
            return field, _json(entry[field])
    return None


def _compare(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> tuple[
        list[dict[str, Any]], list[tuple[dict[str, Any], dict[str, Any]]], list[dict[str, Any]]]:
    """(removed, changed pairs (old, new), added), each in its list's order."""
    unchanged: dict[str, list[int]] = {}
    for i, entry in enumerate(old):
        unchanged.setdefault(_json(entry), []).append(i)
    kept: set[int] = set()
    rest: list[int] = []  # new entries found nowhere in the old list as they are
    for j, entry in enumerate(new):
        same = unchanged.get(_json(entry))
        if same:
            kept.add(same.pop(0))
        else:
            rest.append(j)
    by_identity: dict[tuple[str, str], list[int]] = {}
    for i, entry in enumerate(old):
        identity = _identity(entry)
        if i not in kept and identity is not None:
            by_identity.setdefault(identity, []).append(i)
    paired: set[int] = set()
    changed: list[tuple[dict[str, Any], dict[str, Any]]] = []
    added: list[dict[str, Any]] = []
    for j in rest:
        identity = _identity(new[j])
        candidates = by_identity.get(identity) if identity is not None else None
        if candidates:
            i = candidates.pop(0)
            paired.add(i)
            changed.append((old[i], new[j]))
        else:
            added.append(new[j])
    removed = [entry for i, entry in enumerate(old) if i not in kept and i not in paired]
    return removed, changed, added


def _name(old: dict[str, Any], new: dict[str, Any]) -> str:
    """A changed entry as a reader finds it: its steps and its file, where they did not change."""
    parts = []
    if "steps" in old and "steps" in new and _json(old["steps"]) == _json(new["steps"]):
        parts.append(f"step {_json(new['steps'])}")
    if "file_path" in old and "file_path" in new and _json(old["file_path"]) == _json(new["file_path"]):
        path = new["file_path"]
        parts.append(path if isinstance(path, str) and path.isprintable() and path else _json(path))
    return ", ".join(parts) or "an entry"


def _fields(old: dict[str, Any], new: dict[str, Any]) -> str:
    changes = []
    for field in list(old) + [f for f in new if f not in old]:
        before = _json(old[field]) if field in old else "(not set)"
        after = _json(new[field]) if field in new else "(not set)"
        if before != after:
            changes.append(f"{_label(field)} {before} -> {after}")
    return "; ".join(changes)


def entry_lines(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """What follows ``~ category/key`` for two entry lists, and the indented line of each entry."""
    removed, changed, added = _compare(old, new)
    counts = [f"{len(found)} {what}" for found, what in ((added, "added"), (removed, "removed"), (changed, "changed"))
              if found]
    if not counts:
        return f"the same {_plural(len(new), 'entry', 'entries')}, in another order", []
    lines = [f"{_INDENT}- {_json(entry)}" for entry in removed]
    lines += [f"{_INDENT}~ {_name(a, b)}: {_fields(a, b)}" for a, b in changed]
    lines += [f"{_INDENT}+ {_json(entry)}" for entry in added]
    return f"{len(old)} -> {_plural(len(new), 'entry', 'entries')}: {', '.join(counts)}", lines


def whole_list_lines(value: list[dict[str, Any]], sign: str) -> list[str]:
    """An entry list added (``+``) or removed (``-``) whole, one entry a line."""
    return [f"{_INDENT}{sign} {_json(entry)}" for entry in value]
