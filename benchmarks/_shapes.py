"""The state shapes ``write_overhead.py --shape`` measures: what trainers put in a status file.

Each shape builds a document of about a target size from a count ``n`` (checkpoints, categories or
keys), names the small key a trainer sets often (a curriculum lesson, an int) and the big value it
sets after a checkpoint (the biggest value of the shape), and gives two versions of that value to
alternate between, so every set changes the file.

  list        one behavior whose checkpoint list grows (ML-Agents' layout; the default)
  categories  many behaviors (``Walker3?team=0``...), each with a 10-entry checkpoint list
  keys        one category holding many keys, each a checkpoint record
  behaviors   many categories, each with a 4-entry checkpoint list (about 750 at 1 MB)
  small-keys  one category holding many small keys, a reward and a step each (about 15,500 at 1 MB)
  nan         the list, every third reward NaN (what ML-Agents writes for an unevaluated one)
  deep        the list spread over a chain of 16 nested objects (values 18 levels deep)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

Base = dict[str, dict[str, Any]]
METADATA = {"metadata": {"stats_format_version": "0.3.0", "trainstatus_version": "0.0.0"}}
SMALL = ("wall_height", "lesson_num")
DEPTH = 16  # nested objects under the key: with category and key, values sit 18 levels deep


def checkpoint(i: int, reward: float | None = None) -> dict[str, Any]:
    """One entry of ML-Agents' checkpoint list, as its checkpoint manager writes it."""
    steps = 500_000 * i
    return {
        "steps": steps,
        "file_path": f"results/run1/Walker/Walker-{steps}.onnx",
        "reward": round(100.0 + 0.37 * i, 2) if reward is None else reward,
        "creation_time": 1764665000.0 + 600.0 * i,
        "auxillary_file_paths": [f"results/run1/Walker/Walker-{steps}.pt"],
    }


def _common(base: Base) -> Base:
    base["wall_height"] = {"lesson_num": 3}
    base["SoccerTwos?team=0"] = {"elo": 1234.5}
    return base


def _newer(value: Any) -> Any:
    """``value`` with its last checkpoint record changed: what a trainer sets after a save."""
    copy = orjson.loads(orjson.dumps(value)) if not _has_nan(value) else json.loads(json.dumps(value))
    record = _last_record(copy)
    if "creation_time" in record:
        record["creation_time"] += 60.0
    record["steps"] += 1
    return copy


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    return False


def _last_record(value: Any) -> dict[str, Any]:
    if isinstance(value, list):
        return _last_record(value[-1])
    if "steps" in value:
        return value  # type: ignore[no-any-return]
    return _last_record(value["child"] if "child" in value else value["items"])


@dataclass(frozen=True)
class Shape:
    name: str
    what: str
    build: Callable[[int], Base]
    big: tuple[str, str]
    unit: str  # what n counts

    def document(self, n: int) -> Base:
        return self.build(n)

    def versions(self, base: Base) -> list[Any]:
        """Two versions of the big value: the built one and a newer one."""
        value = base[self.big[0]][self.big[1]]
        return [value, _newer(value)]


def _list(n: int) -> Base:
    checkpoints = [checkpoint(i) for i in range(1, n + 1)]
    return _common({"Walker": {"checkpoints": checkpoints, "final_checkpoint": checkpoints[-1]}})


def _categories(n: int) -> Base:
    base: Base = {}
    for c in range(n):
        checkpoints = [checkpoint(10 * c + i) for i in range(1, 11)]
        base[f"Walker{c}?team=0"] = {"checkpoints": checkpoints, "final_checkpoint": checkpoints[-1]}
    return _common(base)


def _keys(n: int) -> Base:
    return _common({"Walker": {f"checkpoint-{i}": checkpoint(i) for i in range(1, n + 1)}})


def _behaviors(n: int) -> Base:
    base: Base = {}
    for c in range(n):
        checkpoints = [checkpoint(4 * c + i) for i in range(1, 5)]
        base[f"Walker{c}?team=0"] = {"checkpoints": checkpoints, "final_checkpoint": checkpoints[-1]}
    return _common(base)


def _small_keys(n: int) -> Base:
    return _common({"Walker": {f"step-{i}": {"steps": 500 * i, "reward": round(0.37 * i, 2)} for i in range(1, n + 1)}})


def _nan(n: int) -> Base:
    checkpoints = [checkpoint(i, math.nan if i % 3 == 1 else None) for i in range(1, n + 1)]
    return _common({"Walker": {"checkpoints": checkpoints, "final_checkpoint": checkpoints[-1]}})


def _deep(n: int) -> Base:
    per_level = max(1, n // DEPTH)
    tree: dict[str, Any] = {"items": [checkpoint(i) for i in range(1, per_level + 1)]}
    for level in range(1, DEPTH):
        start = level * per_level + 1
        tree = {"items": [checkpoint(i) for i in range(start, start + per_level)], "child": tree}
    return _common({"Walker": {"tree": tree}})


SHAPES = {
    shape.name: shape
    for shape in (
        Shape("list", "one long checkpoint list (ML-Agents' layout)", _list, ("Walker", "checkpoints"), "checkpoints"),
        Shape("categories", "many categories, a 10-entry checkpoint list each", _categories,
              ("Walker0?team=0", "checkpoints"), "categories"),
        Shape("keys", "many keys in one category, a checkpoint record each", _keys, ("Walker", "checkpoint-1"), "keys"),
        Shape("nan", "checkpoint list, every third reward NaN", _nan, ("Walker", "checkpoints"), "checkpoints"),
        Shape("deep", "checkpoint list spread over 16 nested objects", _deep, ("Walker", "tree"), "checkpoints"),
        Shape("behaviors", "many categories, a 4-entry checkpoint list each", _behaviors,
              ("Walker0?team=0", "checkpoints"), "categories"),
        Shape("small-keys", "many small keys in one category, a reward and a step each", _small_keys,
              ("Walker", "step-1"), "keys"),
    )
}


def file_bytes(document: Base) -> bytes:
    """The bytes the store writes for ``document`` (2-space indent; NaN as Python's json writes it)."""
    if _has_nan(document):
        return json.dumps(document, indent=2, ensure_ascii=False).encode() + b"\n"
    return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


def count_for(shape: Shape, target: int) -> int:
    """The ``n`` that makes the shape's file about ``target`` bytes."""
    small, large = (16, 116) if shape.name == "deep" else (1, 101)
    base = len(file_bytes({**shape.document(small), **METADATA}))
    per_item = (len(file_bytes({**shape.document(large), **METADATA})) - base) / (large - small)
    return max(small, round(small + (target - base) / per_item))


def without_nan(value: Any) -> Any:
    """``value`` with NaN and infinities as None: what orjson can serialize in the same shape."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nan(v) for v in value]
    return value
