"""The codec: what values round-trip (in memory and through a real file), what is refused and how,
and the file layout ``render`` produces."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import math
import os
import pathlib
import pickle
import re
import struct
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from _helpers import same
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trainstatus import StatusStore, TrainingStatusError, TrainingStatusTypeError, TrainingStatusValueError
from trainstatus._codec import document as _document, encoding as _encoding, json_fallback as _fallback
from trainstatus._codec import nonfinite as _nonfinite, values as _codec
from trainstatus._codec.document import entries_from_rendered, parse_document, render
from trainstatus._codec.encoding import encode_loaded, encode_value
from trainstatus._codec.values import Entry, decode

NAN = float("nan")
INF = float("inf")
FAKE_PATH = "/runs/r1/training_status.json"
DEFAULT_HINT = "store a dict with str keys, a list, str, int, float, bool or None instead"


# -- helpers ------------------------------------------------------------------------------------




def enc(value: Any, category: str = "x", key: str = "y", path: str = FAKE_PATH) -> Entry:
    return encode_value(value, path=path, category=category, key=key)


def codec_round_trip(value: Any) -> Any:
    return decode(enc(value))


def store_round_trip(directory: str | os.PathLike[str], value: Any, **options: Any) -> Any:
    """set -> a fresh StatusStore on the same file -> get; checks the writing store agrees."""
    target = os.path.join(os.fspath(directory), "status.json")
    with StatusStore(target, **options) as writer:
        writer.set("cat", "key", value)
        in_memory = writer.get("cat", "key")
    with StatusStore(target, **options) as reader:
        from_disk = reader.get("cat", "key")
    assert same(in_memory, from_disk), (in_memory, from_disk)
    with open(target, "rb") as f:
        parsed = json.loads(f.read())  # Python's json reads every file we write
    assert same(parsed["cat"]["key"], from_disk)
    return from_disk


def listing(directory: pathlib.Path) -> list[str]:
    return sorted(os.listdir(directory))


def nested_lists(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_dicts(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


# -- supported values ---------------------------------------------------------------------------


@dataclasses.dataclass
class Checkpoint:
    steps: int
    reward: float
    tags: tuple[str, ...] = ("best",)
    _private: str = "left out"


@dataclasses.dataclass
class Run:
    name: str
    checkpoints: list[Checkpoint]
    _cache: dict[str, int] = dataclasses.field(default_factory=lambda: {"hidden": 1})


class Colour(enum.Enum):
    RED = "red"
    COUNT = 7
    WEIRD = NAN


class Level(enum.IntEnum):
    HARD = 3


class StrName(str, enum.Enum):
    WALKER = "Walker"


class MyFloat(float):
    pass


class MyInt(int):
    pass


class MyStr(str):
    pass


class BadEnum(enum.Enum):
    BYTES = b"raw"


TRICKY_TEXT = 'h\u00e9llo\n"quoted" \\ back\tslash \u65e5\u672c \U0001F600 \u2028 \x00 \x7f null NaN'

ROUND_TRIPS: list[tuple[str, Any, Any]] = [
    ("none", None, None),
    ("true", True, True),
    ("false", False, False),
    ("zero", 0, 0),
    ("int_min", -(2**63), -(2**63)),
    ("uint_max", 2**64 - 1, 2**64 - 1),
    ("ints_nested", {"a": [-(2**63), 2**64 - 1]}, {"a": [-(2**63), 2**64 - 1]}),
    ("ints_next_to_nan", [2**64 - 1, NAN, -(2**63)], [2**64 - 1, NAN, -(2**63)]),
    ("float", 0.1, 0.1),
    ("negative_zero", -0.0, -0.0),
    ("negative_zero_next_to_nan", [-0.0, NAN], [-0.0, NAN]),
    ("huge", 1e300, 1e300),
    ("huge_next_to_nan", [1e300, -1e300, NAN], [1e300, -1e300, NAN]),
    ("smallest_subnormal", 5e-324, 5e-324),
    ("smallest_subnormal_next_to_nan", [5e-324, INF], [5e-324, INF]),
    ("float_that_looks_int", 3.0, 3.0),
    ("nan", NAN, NAN),
    ("inf", INF, INF),
    ("minus_inf", -INF, -INF),
    ("nonfinite_nested_deep", nested_dicts(40, [1, {"b": [NAN, INF, -INF]}, None]),
     nested_dicts(40, [1, {"b": [NAN, INF, -INF]}, None])),
    ("nan_at_max_depth", nested_lists(253, NAN), nested_lists(253, NAN)),
    ("max_depth", nested_lists(254), nested_lists(254)),
    ("max_depth_dicts", nested_dicts(254), nested_dicts(254)),
    ("text", TRICKY_TEXT, TRICKY_TEXT),
    ("text_next_to_nan", [TRICKY_TEXT, NAN], [TRICKY_TEXT, NAN]),
    ("empty_text", "", ""),
    ("empty_containers", {"a": [], "b": {}, "c": ()}, {"a": [], "b": {}, "c": []}),
    ("tuple", (1, ("a", 2.5), []), [1, ["a", 2.5], []]),
    ("dict_order", {"z": 1, "a": 2, "m": {"y": 0, "b": 1}}, {"z": 1, "a": 2, "m": {"y": 0, "b": 1}}),
    ("nested_lists", [[1, [2, [3, [None, True]]]], {"k": [[]]}], [[1, [2, [3, [None, True]]]], {"k": [[]]}]),
    ("dataclass", Checkpoint(5, 1.5), {"steps": 5, "reward": 1.5, "tags": ["best"]}),
    ("dataclass_with_nan", Checkpoint(5, NAN, ("a", "b")), {"steps": 5, "reward": NAN, "tags": ["a", "b"]}),
    ("nested_dataclasses", Run("r", [Checkpoint(1, 2.0), Checkpoint(2, 3.0)]),
     {"name": "r", "checkpoints": [{"steps": 1, "reward": 2.0, "tags": ["best"]},
                                   {"steps": 2, "reward": 3.0, "tags": ["best"]}]}),
    ("nested_dataclasses_with_nan", Run("r", [Checkpoint(1, -INF)]),
     {"name": "r", "checkpoints": [{"steps": 1, "reward": -INF, "tags": ["best"]}]}),
    ("enum", [Colour.RED, Colour.COUNT, Level.HARD, StrName.WALKER], ["red", 7, 3, "Walker"]),
    ("enum_with_nan_value", {"c": Colour.WEIRD, "l": Level.HARD}, {"c": NAN, "l": 3}),
    ("datetime", datetime.datetime(2024, 1, 2, 3, 4, 5, 678901), "2024-01-02T03:04:05.678901"),
    ("aware_datetime", datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
     "2024-01-02T03:04:05+00:00"),
    ("date_and_time", [datetime.date(2024, 2, 29), datetime.time(23, 59, 1)], ["2024-02-29", "23:59:01"]),
    ("datetime_next_to_nan", {"t": datetime.datetime(2024, 1, 2), "r": NAN}, {"t": "2024-01-02T00:00:00", "r": NAN}),
    ("uuid", uuid.UUID("12345678-1234-5678-1234-567812345678"), "12345678-1234-5678-1234-567812345678"),
    ("uuid_next_to_nan", [uuid.UUID(int=1), NAN], ["00000000-0000-0000-0000-000000000001", NAN]),
    ("float_subclass", MyFloat(2.5), 2.5),
    ("float_subclass_negative_zero", MyFloat(-0.0), -0.0),
    ("float_subclass_nonfinite", [MyFloat("nan"), {"i": MyFloat("-inf")}], [NAN, {"i": -INF}]),
    ("int_and_str_subclasses", [MyInt(5), MyStr("s"), {"k": MyInt(2**64 - 1)}], [5, "s", {"k": 2**64 - 1}]),
    ("int_and_str_subclasses_next_to_nan", [MyInt(5), MyStr("s"), NAN], [5, "s", NAN]),
    ("numpy_scalars", [np.float64(1.5), np.int64(-5), np.uint64(2**64 - 1), np.int64(-(2**63)), np.bool_(True),
                       np.float32(0.5), np.int8(-3)],
     [1.5, -5, 2**64 - 1, -(2**63), True, 0.5, -3]),
    ("numpy_nan_scalars", [np.float64("nan"), np.float32("inf"), np.float16("-inf")], [NAN, INF, -INF]),
    ("numpy_array_2d", np.arange(6, dtype=np.int64).reshape(2, 3), [[0, 1, 2], [3, 4, 5]]),
    ("numpy_transposed", np.arange(6, dtype=np.int64).reshape(2, 3).T, [[0, 3], [1, 4], [2, 5]]),
    ("numpy_strided", np.arange(10, dtype=np.float64)[::3], [0.0, 3.0, 6.0, 9.0]),
    ("numpy_strided_2d", np.arange(12, dtype=np.float64).reshape(3, 4)[:, 1::2], [[1.0, 3.0], [5.0, 7.0], [9.0, 11.0]]),
    ("numpy_nan_array", np.array([1.0, np.nan, np.inf, -np.inf, -0.0]), [1.0, NAN, INF, -INF, -0.0]),
    ("numpy_nan_strided", np.array([[np.nan, 1.0], [2.0, np.inf]]).T, [[NAN, 2.0], [1.0, INF]]),
    ("numpy_bool_array", np.array([True, False]), [True, False]),
    ("numpy_empty", np.zeros((2, 0)), [[], []]),
    ("numpy_zero_dim", np.array(3.25), 3.25),
    ("numpy_in_dict", {"w": np.array([1, 2], dtype=np.uint8), "n": [np.float64(0.25)]}, {"w": [1, 2], "n": [0.25]}),
]


@pytest.mark.parametrize(("value", "expected"), [pytest.param(v, e, id=i) for i, v, e in ROUND_TRIPS])
def test_codec_round_trip(value: Any, expected: Any) -> None:
    got = codec_round_trip(value)
    assert same(got, expected), (got, expected)
    # each decode is a fresh copy
    if isinstance(got, (list, dict)):
        assert codec_round_trip(value) is not got


@pytest.mark.parametrize(("value", "expected"), [pytest.param(v, e, id=i) for i, v, e in ROUND_TRIPS])
def test_store_round_trip(tmp_path: pathlib.Path, value: Any, expected: Any) -> None:
    got = store_round_trip(tmp_path, value)
    assert same(got, expected), (got, expected)


def test_dataclass_leaves_out_underscore_fields_like_orjson() -> None:
    for value in (Checkpoint(1, 2.0), Checkpoint(1, NAN)):
        got = codec_round_trip(value)
        assert list(got) == ["steps", "reward", "tags"]
    # orjson itself leaves them out: both paths agree with it
    assert orjson.loads(orjson.dumps(Checkpoint(1, 2.0))) == codec_round_trip(Checkpoint(1, 2.0))


def test_nonfinite_floats_are_written_as_json_literals(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "status.json"
    with StatusStore(target) as store:
        store.set("c", "k", [NAN, INF, -INF, None])
    text = target.read_text()
    assert '"k": [\n      NaN,\n      Infinity,\n      -Infinity,\n      null\n    ]' in text


def test_numpy_float32_stores_the_same_numbers_whatever_the_layout() -> None:
    # The same float32 data must not store different numbers because of its memory layout or
    # because a NaN sits next to it.
    base = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    contiguous = codec_round_trip(base[::2].copy())
    strided = codec_round_trip(base[::2])
    with_nan = codec_round_trip(np.array([0.1, 0.3, np.nan], dtype=np.float32))[:2]
    scalars = [codec_round_trip(base[0]), codec_round_trip(base[2])]
    assert contiguous == strided == with_nan == scalars


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(np.float32(0.1), id="float32"),
        pytest.param(np.datetime64("2020-01-01"), id="datetime64_day"),
        pytest.param(np.datetime64("2020-01-01T00:00:00.123456789"), id="datetime64_ns"),
        pytest.param(datetime.datetime(2020, 1, 1, 12), id="datetime"),
        pytest.param(Checkpoint(1, 0.5), id="dataclass"),
        pytest.param(MyFloat(0.1), id="float_subclass"),
    ],
)
def test_a_nan_elsewhere_does_not_change_how_a_value_is_stored(value: Any) -> None:
    # Values holding NaN take the json path; the values next to the NaN must come out as they
    # do on their own (the orjson path).
    alone = codec_round_trip(value)
    assert same(codec_round_trip([value, NAN])[0], alone)
    assert same(codec_round_trip({"v": value, "n": NAN})["v"], alone)


def test_get_returns_an_independent_copy(tmp_path: pathlib.Path) -> None:
    with StatusStore(tmp_path / "status.json") as store:
        store.set("c", "k", {"list": [1, 2]})
        got = store.get("c", "k")
        got["list"].append(3)
        assert store.get("c", "k") == {"list": [1, 2]}


# -- refusals -----------------------------------------------------------------------------------

A_SET_HINT = "store a list instead (e.g. sorted(value))"
BIG_INT = "is outside the 64-bit range that JSON readers keep exactly; store it as a string (str(value)) instead"
PAIR = "\ud83d\ude00"  # a high and a low surrogate as two code points: JSON reads them back as one


def pair_problem(what: str, name: str) -> str:
    return (f"{what} holds the surrogates {PAIR!r} side by side, which JSON reads back as the one "
            f"character '\U0001F600', so it would not come back as stored; join them (e.g. "
            f"{name}.encode('utf-16', 'surrogatepass').decode('utf-16'))")
NOT_STR_KEY = ("is not a plain str; JSON object keys must be strings: convert the keys (str(key), "
               "or key.value for an Enum)")
TOO_DEEP = "it is nested more than 254 levels deep; flatten it"


def cyclic() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def cyclic_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"ok": 1}
    value["self"] = value
    return value


def cyclic_dataclass() -> Checkpoint:
    value = Checkpoint(1, 2.0, [])  # type: ignore[arg-type]
    value.tags.append(value)  # type: ignore[attr-defined]
    return value


def cyclic_object_array() -> Any:
    value = np.empty(2, dtype=object)
    value[0], value[1] = 1, value  # tolist() makes a new list each time: the array is the cycle
    return value


SHARED = [1, {"a": 2}]  # one list held twice: no cycle


def cycle_problem(inner: str, again: str) -> str:
    return (f"the value refers to itself at x/y{inner}, which is x/y{again} again: JSON has no cycles; "
            "store a copy that does not contain itself")


# (id, value, error class, built-in base, inner path, problem text)
REFUSALS: list[tuple[str, Any, type, type, str, str]] = [
    ("set", {1, 2}, TrainingStatusTypeError, TypeError, "",
     f"an object of type 'set' is not JSON serializable; {A_SET_HINT}"),
    ("frozenset", frozenset({"a"}), TrainingStatusTypeError, TypeError, "",
     f"an object of type 'frozenset' is not JSON serializable; {A_SET_HINT}"),
    ("bytes", b"raw", TrainingStatusTypeError, TypeError, "",
     "an object of type 'bytes' is not JSON serializable; store text instead (e.g. value.decode() or base64)"),
    ("bytearray", bytearray(b"raw"), TrainingStatusTypeError, TypeError, "",
     "an object of type 'bytearray' is not JSON serializable; store text instead (e.g. value.decode() or base64)"),
    ("complex", 1 + 2j, TrainingStatusTypeError, TypeError, "",
     "an object of type 'complex' is not JSON serializable; store [value.real, value.imag] instead"),
    ("decimal", decimal.Decimal("1.5"), TrainingStatusTypeError, TypeError, "",
     "an object of type 'Decimal' is not JSON serializable; store float(value) or str(value) instead"),
    ("path", pathlib.PurePosixPath("/a/b"), TrainingStatusTypeError, TypeError, "",
     "an object of type 'PurePosixPath' is not JSON serializable; " + DEFAULT_HINT),
    ("posix_path", pathlib.Path("/a/b"), TrainingStatusTypeError, TypeError, "",
     "an object of type 'PosixPath' is not JSON serializable; store str(value) instead"),
    ("object", object(), TrainingStatusTypeError, TypeError, "",
     "an object of type 'object' is not JSON serializable; " + DEFAULT_HINT),
    ("set_nested", {"x": [0, {"s": {1}}]}, TrainingStatusTypeError, TypeError, "['x'][1]['s']",
     f"an object of type 'set' is not JSON serializable; {A_SET_HINT}"),
    ("bytes_in_dataclass", Checkpoint(1, 2.0, (b"x",)), TrainingStatusTypeError, TypeError, ".tags[0]",
     "an object of type 'bytes' is not JSON serializable; store text instead (e.g. value.decode() or base64)"),
    ("complex_in_numpy", np.array([1 + 2j]), TrainingStatusTypeError, TypeError, "[0]",
     "an object of type 'complex' is not JSON serializable; store [value.real, value.imag] instead"),
    ("enum_with_bytes_value", {"e": BadEnum.BYTES}, TrainingStatusTypeError, TypeError, "['e']",
     "an object of type 'bytes' is not JSON serializable; store text instead (e.g. value.decode() or base64)"),
    ("problem_after_fine_values",
     [np.array([1.0, 2.0]), Checkpoint(1, 2.0), [1, (2, None)], datetime.datetime(2020, 1, 1), uuid.UUID(int=1),
      Colour.RED, np.array(["a"]), "text", {"ok": 1.5, "k": {5}}],
     TrainingStatusTypeError, TypeError, "[8]['k']", f"an object of type 'set' is not JSON serializable; {A_SET_HINT}"),
    ("big_int", 2**64, TrainingStatusValueError, ValueError, "", f"the integer {2**64} {BIG_INT}"),
    ("small_int", -(2**63) - 1, TrainingStatusValueError, ValueError, "", f"the integer {-(2**63) - 1} {BIG_INT}"),
    ("big_int_nested", {"a": [0, 2**64]}, TrainingStatusValueError, ValueError, "['a'][1]",
     f"the integer {2**64} {BIG_INT}"),
    ("small_int_nested", [{"a": {"b": -(2**63) - 1}}], TrainingStatusValueError, ValueError, "[0]['a']['b']",
     f"the integer {-(2**63) - 1} {BIG_INT}"),
    ("big_int_next_to_nan", [NAN, 10**30], TrainingStatusValueError, ValueError, "[1]",
     f"the integer {10**30} {BIG_INT}"),
    ("int_key", {1: "a"}, TrainingStatusTypeError, TypeError, "", f"a dict key of type 'int' (1) {NOT_STR_KEY}"),
    ("tuple_key_nested", {"a": {(1, 2): 3}}, TrainingStatusTypeError, TypeError, "['a']",
     f"a dict key of type 'tuple' ((1, 2)) {NOT_STR_KEY}"),
    ("none_key", [{None: 1}], TrainingStatusTypeError, TypeError, "[0]", f"a dict key of type 'NoneType' (None) {NOT_STR_KEY}"),
    ("surrogate_pair", f"a{PAIR}", TrainingStatusValueError, ValueError, "", pair_problem("the string", "value")),
    ("surrogate_pair_nested", ["ok", {"q": f"\udcff{PAIR}b"}], TrainingStatusValueError, ValueError, "[1]['q']",
     pair_problem("the string", "value")),
    ("surrogate_pair_in_a_key", {"ok": {f"k{PAIR}": 1}}, TrainingStatusValueError, ValueError, "['ok']",
     pair_problem(f"the dict key {'k' + PAIR!r}", "key")),
    ("surrogate_pair_next_to_numpy", [np.float32(1), np.array([1.5], dtype=np.float16), PAIR],
     TrainingStatusValueError, ValueError, "[2]", pair_problem("the string", "value")),
    ("too_deep_lists", nested_lists(255), TrainingStatusValueError, ValueError, "[0]" * 255, TOO_DEEP),
    ("too_deep_dicts", nested_dicts(255), TrainingStatusValueError, ValueError, "['a']" * 255, TOO_DEEP),
    ("cycle", cyclic(), TrainingStatusValueError, ValueError, "[0]", cycle_problem("[0]", "")),
    ("cycle_of_a_dict", cyclic_dict(), TrainingStatusValueError, ValueError, "['self']",
     cycle_problem("['self']", "")),
    ("cycle_inside", {"run": [1, cyclic_dict()]}, TrainingStatusValueError, ValueError, "['run'][1]['self']",
     cycle_problem("['run'][1]['self']", "['run'][1]")),
    ("shared_is_not_a_cycle", [SHARED, {"again": SHARED}, {1}], TrainingStatusTypeError, TypeError, "[2]",
     f"an object of type 'set' is not JSON serializable; {A_SET_HINT}"),
    ("cycle_through_a_dataclass", cyclic_dataclass(), TrainingStatusValueError, ValueError, ".tags[0]",
     cycle_problem(".tags[0]", "")),
    ("cycle_through_a_numpy_object_array", {"a": cyclic_object_array()}, TrainingStatusValueError, ValueError,
     "['a'][1]", cycle_problem("['a'][1]", "['a']")),
]
REFUSAL_PARAMS = [pytest.param(*rest, id=rid) for rid, *rest in REFUSALS]


def refusal_message(path: str, inner: str, problem: str) -> str:
    return f"Cannot store x/y{inner} in {path}: {problem}. Nothing was written."


def assert_refusal(exc: BaseException, cls: type, builtin: type, path: str, inner: str, problem: str) -> None:
    assert type(exc) is cls
    assert isinstance(exc, builtin)
    assert isinstance(exc, TrainingStatusError)
    assert str(exc) == refusal_message(path, inner, problem)
    assert (exc.path, exc.category, exc.key) == (path, "x", "y")
    assert isinstance(exc.__cause__, TypeError)  # orjson's own error is chained


@pytest.mark.parametrize(("value", "cls", "builtin", "inner", "problem"), REFUSAL_PARAMS)
def test_encode_value_refuses(value: Any, cls: type, builtin: type, inner: str, problem: str) -> None:
    with pytest.raises(cls) as info:
        enc(value)
    assert_refusal(info.value, cls, builtin, FAKE_PATH, inner, problem)


@pytest.mark.parametrize(("value", "cls", "builtin", "inner", "problem"), REFUSAL_PARAMS)
def test_store_refuses_and_writes_nothing(
    tmp_path: pathlib.Path, value: Any, cls: type, builtin: type, inner: str, problem: str
) -> None:
    target = tmp_path / "status.json"
    with StatusStore(target) as store:
        store.set("x", "y", "before")
        store.set("x", "other", [1, NAN])
        before_bytes = target.read_bytes()
        before_stat = os.stat(target)
        before_dict = store.to_dict()
        before_listing = listing(tmp_path)

        with pytest.raises(cls) as info:
            store.set("x", "y", value)
        assert_refusal(info.value, cls, builtin, str(target), inner, problem)

        # a refused value in a new category creates nothing either
        with pytest.raises(cls):
            store.set("new", "y", value)

        assert target.read_bytes() == before_bytes
        after_stat = os.stat(target)
        assert (after_stat.st_ino, after_stat.st_mtime_ns) == (before_stat.st_ino, before_stat.st_mtime_ns)
        assert same(store.to_dict(), before_dict)
        assert store.get("x", "y") == "before"
        assert store.get("new", "y", "absent") == "absent"
        assert listing(tmp_path) == before_listing  # no temp file left behind


@pytest.mark.parametrize(("value", "cls"), [pytest.param(r[1], r[2], id=r[0]) for r in REFUSALS[::4]])
def test_refusal_on_a_new_store_creates_no_file(tmp_path: pathlib.Path, value: Any, cls: type) -> None:
    target = tmp_path / "sub" / "status.json"
    with StatusStore(target) as store:
        with pytest.raises(cls):
            store.set("x", "y", value)
        assert store.to_dict() == {"metadata": {"stats_format_version": "0.3.0", "trainstatus_version": "0.1.0"}}
    assert not target.exists()


def test_refusal_inside_a_transaction_leaves_the_rest_of_it(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "status.json"
    with StatusStore(target) as store:
        with store.transaction():
            store.set("c", "ok", 1)
            with pytest.raises(TrainingStatusTypeError):
                store.set("c", "bad", {1})
            store.set("c", "ok2", 2)
        assert store.to_dict()["c"] == {"ok": 1, "ok2": 2}
    assert json.loads(target.read_bytes())["c"] == {"ok": 1, "ok2": 2}


def test_a_mapping_that_is_not_a_dict_is_refused_with_a_hint(tmp_path: pathlib.Path) -> None:
    import types

    with pytest.raises(TrainingStatusTypeError) as info:
        enc(types.MappingProxyType({"a": 1}))
    assert str(info.value) == (
        f"Cannot store x/y in {FAKE_PATH}: an object of type 'mappingproxy' is not JSON "
        "serializable; store dict(value) instead. Nothing was written."
    )


def test_a_str_enum_dict_key_inside_a_value_is_pointed_at() -> None:
    class Color(str, enum.Enum):
        RED = "red"

    with pytest.raises(TrainingStatusTypeError) as info:
        enc({"palette": {Color.RED: 1}})
    assert str(info.value) == (
        f"Cannot store x/y['palette'] in {FAKE_PATH}: a dict key of type 'Color' "
        f"({Color.RED!r}) {NOT_STR_KEY}. Nothing was written."
    )


@pytest.mark.parametrize(
    ("category", "key", "what", "shown"),
    [
        (1, "k", "category", "'int' (1)"),
        ("c", None, "key", "'NoneType' (None)"),
        ("c", b"k", "key", "'bytes' (b'k')"),
    ],
)
def test_category_and_key_must_be_str_or_str_enum(
    tmp_path: pathlib.Path, category: Any, key: Any, what: str, shown: str
) -> None:
    target = tmp_path / "status.json"
    with StatusStore(target) as store:
        with pytest.raises(TrainingStatusTypeError) as info:
            store.set(category, key, 1)
        assert not target.exists()
        assert isinstance(info.value, TypeError)
        assert str(info.value) == (
            f"A {what} must be a str or an Enum whose value is a str, not {shown}, in {target}."
        )
        assert info.value.path == str(target)
        store.set(StrName.WALKER, StrName.WALKER, 1)  # str-valued enums are fine
        assert store.get("Walker", "Walker") == 1
    assert listing(tmp_path) == ["status.json", "status.json.lock"]


# -- render and the file layout -----------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
finite_json = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=16,
)
any_json = st.recursive(
    json_scalars | st.floats(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=16,
)
names = st.text(max_size=8).filter(lambda s: s != "metadata")


def entries_of(document: dict[str, dict[str, Any]]) -> dict[str, dict[str, Entry]]:
    return {c: {k: enc(v, c, k) for k, v in keys.items()} for c, keys in document.items()}


@settings(max_examples=150, deadline=None, database=None)
@given(st.dictionaries(names, st.dictionaries(names, finite_json, max_size=4), max_size=4))
def test_render_is_orjson_indent_2_plus_newline(document: dict[str, dict[str, Any]]) -> None:
    assert render(entries_of(document)) == orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


@settings(max_examples=200, deadline=None, database=None)
@given(st.dictionaries(st.text(max_size=8), st.dictionaries(st.text(max_size=8), any_json, max_size=4), max_size=4))
@example(document={"": {"": [INF, [1e16, 2.345678901234568e-299]]}})  # encoded by json: not sliced
def test_property_opening_a_rendered_file_slices_the_bytes_encoding_would_give(document: dict[str, dict[str, Any]]) -> None:
    """Opening a file trainstatus wrote takes each value's bytes out of the file; they must be
    exactly what encoding the value read gives, else None (and every value is encoded)."""
    data = render(entries_of(document))
    parsed = parse_document(data)
    sliced = entries_from_rendered(parsed, data)
    encoded = {c: {k: encode_loaded(v) for k, v in keys.items()} for c, keys in parsed.items()}
    if sliced is None:
        # Only an empty document, a lone surrogate, a literal's word in a string next to a literal,
        # or a NaN-holding value that encoding wrote with Python's json (a stand-in collided), so
        # that the file is not orjson's spelling of it.
        spelled = any("NaN" in text or "Infinity" in text for text in strings_of(parsed))
        by_json = any(
            entry.exotic and _document._nulled(entry.raw) != _codec._dumps_plain(parsed[c][k])
            for c, keys in encoded.items() for k, entry in keys.items()
        )
        literal = b"NaN" in data or b"Infinity" in data
        assert data == b"{}\n" or b"\\ud" in data or (literal and (spelled or by_json))
        return
    assert render(sliced) == data
    assert [list(keys) for keys in sliced.values()] == [list(keys) for keys in encoded.values()]
    for category, keys in encoded.items():
        for key, entry in keys.items():
            taken = sliced[category][key]
            # The same bytes, but for a value holding NaN that encoding writes with Python's json
            # (a stand-in collided): then the file's bytes are orjson's spelling of the same value.
            assert taken.raw == entry.raw or entry.exotic
            # Exotic (read back with json) where encoding says so; also where a string merely
            # spells a literal, which only costs speed.
            assert taken.exotic == entry.exotic or (taken.exotic and (b"NaN" in taken.raw or b"Infinity" in taken.raw))
            assert same(decode(taken), decode(entry))


def test_a_rendered_file_with_nan_is_sliced_and_its_nan_values_read_with_json() -> None:
    document = {"Walker": {"checkpoints": [{"steps": 5, "reward": NAN}, {"steps": 9, "reward": -INF}], "elo": 1.5}}
    data = render(entries_of(document))
    sliced = entries_from_rendered(parse_document(data), data)
    assert sliced is not None
    checkpoints, elo = sliced["Walker"]["checkpoints"], sliced["Walker"]["elo"]
    assert (checkpoints.exotic, elo.exotic) == (True, False)
    assert same(decode(checkpoints), document["Walker"]["checkpoints"]) and decode(elo) == 1.5


def test_a_sliced_nan_value_reads_as_its_encoding() -> None:
    """A value holding NaN next to what was once the fast path's finite stand-in: sliced out of the
    file and encoded again, it is the same bytes (orjson's spelling, ``1e-7``), and reads the same.
    (Before the fragment walk, the encoding fell back to Python's json here and wrote ``1e-07``.)"""
    data = orjson.dumps({"a": {"k": [1.2345678901234567e-299, None, 1e-7]}}, option=orjson.OPT_INDENT_2)
    data = data.replace(b"null", b"NaN") + b"\n"
    sliced = entries_from_rendered(parse_document(data), data)
    assert sliced is not None
    taken, encoded = sliced["a"]["k"], encode_loaded(parse_document(data)["a"]["k"])
    assert taken.exotic and encoded.exotic
    assert taken == encoded and b"1e-7\n" in encoded.raw
    assert same(decode(taken), decode(encoded))


def strings_of(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings_of(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_of(item)


@pytest.mark.parametrize("data", [
    b'{\n    "a": {\n        "k": 1\n    }\n}\n',  # ML-Agents' indent of 4
    b'{\n  "a": {\n    "k": 1,\n    "k": 2\n  }\n}\n',  # a key repeated
    b'{\n  "a": {\n    "k": {\n      "x": 1,\n      "x": 2\n    }\n  }\n}\n',  # repeated deeper
    b'{\n  "a": {\n    "k": 1.50\n  }\n}\n',  # a number orjson spells otherwise
    b'{\n  "a": {\n    "k": 1\n  }\n}',  # no final newline
    b'{\n  "a": {\n    "k": 1\n  }\n}\n\n',  # one too many
    b'{\n  "a": {\n    "k": 99999999999999999999999\n  }\n}\n',  # beyond 64 bits
    b'{\n  "a": {\n    "k": "x NaN",\n    "n": NaN\n  }\n}\n',  # a literal, and its word in a string
    b'{\n  "a": {\n    "k": [\n      NaN,\n      NaN\n    ],\n    "k": 1\n  }\n}\n',  # NaN and a repeat
])
def test_a_file_render_would_not_write_is_not_sliced(data: bytes) -> None:
    assert entries_from_rendered(parse_document(data), data) is None


def test_render_small_shapes() -> None:
    assert render({}) == b"{}\n"
    assert render({"a": {}}) == b'{\n  "a": {}\n}\n'
    document = {"a": {"k": [1, {"b": None}], "e": {}}, "\u00e9\"q": {"x": "l\u00efne\n"}}
    assert render(entries_of(document)) == orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


@settings(max_examples=150, deadline=None, database=None)
@given(st.dictionaries(names, st.dictionaries(names, any_json, max_size=4), max_size=4))
def test_render_with_nonfinite_floats_parses_with_python_json(document: dict[str, dict[str, Any]]) -> None:
    rendered = render(entries_of(document))
    assert same(json.loads(rendered), document)
    assert rendered.endswith(b"\n")


def test_nan_document_layout_matches_orjson_apart_from_the_literals() -> None:
    document = {"Walker": {"checkpoints": [{"steps": 5, "reward": NAN}], "elo": 1200.5}}
    expected = orjson.dumps(document, option=orjson.OPT_INDENT_2).replace(b"null", b"NaN") + b"\n"
    assert render(entries_of(document)) == expected


def test_store_file_is_orjson_indent_2_of_the_whole_document(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "status.json"
    with StatusStore(target, metadata={"torch_version": "2.2.2"}) as store:
        store.set("wall_height", "lesson_num", 3)
        store.set("Walker", "checkpoints", [{"steps": 1, "file_path": "a.onnx", "reward": 1.5}])
        store.set("SoccerTwos?team=0", "elo", 1278.4)
        store.set("wall_height", "lesson_num", 4)  # an update keeps the category's place
        whole = store.to_dict()
    data = target.read_bytes()
    assert data == orjson.dumps(whole, option=orjson.OPT_INDENT_2) + b"\n"
    assert list(whole) == ["wall_height", "Walker", "SoccerTwos?team=0", "metadata"]
    assert list(whole["metadata"].items()) == [
        ("stats_format_version", "0.3.0"), ("trainstatus_version", "0.1.0"), ("torch_version", "2.2.2"),
    ]


# -- hypothesis: arbitrary values through a real file -------------------------------------------


@settings(max_examples=300, deadline=None, database=None)
@given(any_json)
def test_property_codec_round_trip(value: Any) -> None:
    assert same(codec_round_trip(value), value)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_json)
def test_property_store_round_trip(value: Any) -> None:
    with tempfile.TemporaryDirectory() as directory:
        assert same(store_round_trip(directory, value, durable=False), value)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(names, st.dictionaries(names, any_json, min_size=1, max_size=3), max_size=3))
def test_property_store_round_trip_of_a_whole_document(document: dict[str, dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        target = os.path.join(directory, "status.json")
        with StatusStore(target, durable=False) as writer, writer.transaction():
            for category, keys in document.items():
                for key, value in keys.items():
                    writer.set(category, key, value)
        with StatusStore(target, durable=False) as reader:
            got = reader.to_dict()
        assert got.pop("metadata") == {"stats_format_version": "0.3.0", "trainstatus_version": "0.1.0"}
        assert same(got, document)


# -- values that hide a non-finite float or bypass the encoder ----------------------------------


@dataclasses.dataclass
class Holder:
    t: tuple[float, float]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.array([Holder((1.0, float("nan")))], dtype=object), [{"t": [1.0, NAN]}]),
        (np.array([float("nan"), "x"], dtype=object), [NAN, "x"]),
        (np.array([(float("inf"), 2)], dtype=[("a", "f8"), ("b", "i4")]), [[INF, 2]]),
    ],
    ids=["dataclass_in_object_array", "mixed_object_array", "structured_array"],
)
def test_non_finite_floats_inside_object_and_record_arrays_survive(tmp_path: pathlib.Path, value: Any, expected: Any) -> None:
    target = tmp_path / "status.json"
    with StatusStore(target) as store:
        store.set("c", "k", value)
        assert same(store.get("c", "k"), expected)
    with StatusStore(target) as fresh:
        assert same(fresh.get("c", "k"), expected)


def test_an_orjson_fragment_is_refused_before_anything_is_written(tmp_path: pathlib.Path) -> None:
    import orjson

    target = tmp_path / "status.json"
    with StatusStore(target) as store:
        store.set("wall", "lesson_num", 4)
        before = target.read_bytes()
        with pytest.raises(TrainingStatusTypeError) as info:
            store.set("Walker", "note", orjson.Fragment(b'{"unterminated'))
        assert str(info.value) == (
            f"Cannot store Walker/note in {target}: an orjson.Fragment is written verbatim and cannot "
            "be checked; store the value itself (orjson.loads(fragment.contents)) instead. Nothing "
            "was written."
        )
        assert target.read_bytes() == before
        assert store.get("Walker", "note") is None


def test_a_set_next_to_a_lone_surrogate_is_still_refused_for_the_set() -> None:
    # orjson stops at the surrogate first; the json path must not take a value orjson would refuse
    for value in (["\udcff", {1}], {"\udcff": 1, "s": {2}}, ["\udcff", {1: "int key"}], ["\udcff", 2**64]):
        with pytest.raises(TrainingStatusError):
            enc(value)


# -- issue 4: values encoded at their depth directly; the NaN check off the walk -----------------


def reference_entry(value: Any) -> Entry:
    """How values were encoded before issue 4's speedups, kept as the oracle: orjson, re-indented
    by a byte replace, and the walk of every value whose output holds a null."""
    option = _codec._NUMPY_OPTIONS if "numpy" in sys.modules else _codec._OPTIONS
    raw = orjson.dumps(value, default=_codec._default, option=option)
    if b"null" in raw:
        converter = _fallback._Plain()
        plain = converter(value)
        if converter.nonfinite:
            return Entry(_fallback._json_dumps(plain), exotic=True)
    return Entry(raw.replace(b"\n", b"\n    "))


def nan_with_payload() -> float:
    return struct.unpack("<d", b"\x01\x02\x03\x04\x05\x06\xf8\x7f")[0]  # a NaN that is not float("nan")


NONFINITE = [NAN, -NAN, INF, -INF, INF * 0, nan_with_payload()]
tuples_too = st.recursive(
    json_scalars | st.floats() | st.sampled_from(NONFINITE),
    lambda children: (st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
                      | st.lists(children, max_size=3).map(tuple)),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None, database=None)
@given(tuples_too)
def test_property_encoding_is_byte_for_byte_what_it_was(value: Any) -> None:
    # Byte for byte for every value without NaN/Infinity. One holding them is now written by orjson
    # with the literals put in (issue 13), so a float may be spelled the shortest way orjson
    # spells it (0.00006103515625 where Python writes 6.103515625e-05): the same float read back.
    got, expected = enc(value), reference_entry(value)
    assert got.exotic == expected.exotic
    if not expected.exotic:
        assert got == expected
    else:
        assert json.dumps(json.loads(got.raw)) == json.dumps(json.loads(expected.raw))
        # Indented for its place two levels deep, as every entry: each line break the reference has.
        assert got.raw.count(b"\n") == expected.raw.count(b"\n")


@settings(max_examples=300, deadline=None, database=None)
@given(tuples_too)
def test_property_literals_fast_path_is_checked_not_trusted(value: Any) -> None:
    """``_with_literals`` gives the json-read-back of the value or None, never something else."""
    raw = _codec._dumps_plain(value)
    fast = _nonfinite._with_literals(value, raw, _codec._dumps_plain)
    if fast is None:
        return
    assert json.dumps(json.loads(fast)) == json.dumps(json.loads(_fallback._json_dumps(_fallback._Plain()(value))))


def test_literals_fast_path_writes_a_checkpoint_list_and_falls_back_when_unsure(monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints = [{"steps": i, "reward": NAN if i % 3 == 0 else None, "auxillary_file_paths": ["a.pt"]}
                   for i in range(300)]
    raw = _codec._dumps_plain(checkpoints)
    fast = _nonfinite._with_literals(checkpoints, raw, _codec._dumps_plain)
    assert fast is not None and fast.count(b"NaN") == 100 and fast.count(b"null") == 200
    assert enc(checkpoints) == Entry(fast, exotic=True)
    # A walk that misses a non-finite float (here: every one inside a tuple) leaves orjson's null
    # for it: the counts do not match, and the value takes the slow walk.
    real = _nonfinite._swap_in
    monkeypatch.setattr(_nonfinite, "_swap_in", lambda value, tally: value if type(value) is tuple else real(value, tally))
    for value in ([NAN, (INF,)], {"a": -INF, "b": [(NAN, 1e-7)]}):
        raw = _codec._dumps_plain(value)
        assert _nonfinite._with_literals(value, raw, _codec._dumps_plain) is None
        assert enc(value).raw == _fallback._json_dumps(value)  # Python's json: 1e-07
    # Nothing non-finite after all (a null is a None): no fast answer, and the value is no exotic.
    assert _nonfinite._with_literals([None, 1.5], b"[\n      null,\n      1.5\n    ]", _codec._dumps_plain) is None
    assert enc([None, 1.5]).exotic is False


def only_nans(value: Any) -> bytes | None:
    packed = _nonfinite._marshalled(value)
    assert packed is not None
    return _nonfinite._only_nans(packed, _codec._dumps_plain(value))


def test_a_value_whose_nulls_are_all_nan_is_written_by_one_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    """ML-Agents' checkpoint list: unevaluated rewards NaN (of either sign), no None."""
    checkpoints = [{"steps": i, "reward": (NAN, -NAN, 1.5)[i % 3], "paths": ["a.pt"]} for i in range(300)]
    fast = only_nans(checkpoints)
    assert fast is not None and fast.count(b"NaN") == 200 and b"null" not in fast
    # Byte for byte what the fragments write, and what a set stores.
    assert fast == _nonfinite._with_literals(checkpoints, _codec._dumps_plain(checkpoints), _codec._dumps_plain)
    assert enc(checkpoints) == Entry(fast, exotic=True)
    # A set takes this way, not the fragments' walk.
    monkeypatch.setattr(_nonfinite, "_swap_in", lambda value, tally: pytest.fail("walked a value whose nulls are all NaN"))
    assert enc(checkpoints) == Entry(fast, exotic=True)
    assert only_nans({"a": [NAN], "b": {"c": NAN}}) == b'{\n      "a": [\n        NaN\n      ],\n      "b": {\n        "c": NaN\n      }\n    }'


@pytest.mark.parametrize("value", [
    [NAN, None],  # a None's null must stay null
    [NAN, "null"],  # so must the word in a string
    {"null": NAN},
    [NAN, INF],  # an infinity is no NaN
    [NAN, -INF],
    [NAN, nan_with_payload()],  # not counted, so the nulls outnumber the NaNs
    [1.5, None],
], ids=["none", "word", "key", "inf", "-inf", "other-nan", "no-nan"])
def test_a_null_that_is_no_plain_nan_keeps_the_replace_away(value: Any) -> None:
    assert only_nans(value) is None
    # The value is still written right, by the fragments or the walk.
    assert json.dumps(json.loads(enc(value).raw)) == json.dumps(json.loads(reference_entry(value).raw))


@settings(max_examples=300, deadline=None, database=None)
@given(tuples_too)
def test_property_the_nan_replace_writes_what_the_fragments_write(value: Any) -> None:
    """``_only_nans`` declines, or gives the very bytes of ``_with_literals``: never other bytes."""
    try:
        raw = _codec._dumps_plain(value)
    except TypeError:  # a lone surrogate: orjson writes no such value
        return
    packed = _nonfinite._marshalled(value)
    fast = None if packed is None else _nonfinite._only_nans(packed, raw)
    if fast is not None:
        assert fast == _nonfinite._with_literals(value, raw, _codec._dumps_plain)


# -- issue 23: NaN literals by orjson fragments, byte for byte what the pickle stand-ins wrote ------

_PICKLE_RECORD = re.compile(rb"G[\x7f\xff][\xf0-\xff][\x00-\xff]{6}")
_STAND_INS = {b"NaN": 1.2345678901234567e-299, b"Infinity": 2.3456789012345678e-299,
              b"-Infinity": 3.4567890123456789e-299}


def pickle_literals(value: Any) -> bytes | None:
    """The NaN path before issue 23, kept as the oracle: pickle the value, swap each non-finite
    float's record for a finite stand-in, read it back, encode it with orjson, swap the stand-ins'
    text for the literals; None where that was unsure (the slow walk wrote the value then)."""
    raw = _codec._dumps_plain(value)
    packed = pickle.dumps(value, protocol=5)
    pieces: list[bytes] = []
    counts = dict.fromkeys(_STAND_INS, 0)
    last = 0
    for match in _PICKLE_RECORD.finditer(packed):
        (number,) = struct.unpack(">d", match.group()[1:])
        if math.isfinite(number):
            continue
        literal = b"NaN" if number != number else (b"Infinity" if number > 0 else b"-Infinity")
        counts[literal] += 1
        pieces += (packed[last:match.start()], b"G" + struct.pack(">d", _STAND_INS[literal]))
        last = match.end()
    if not pieces:
        return None
    pieces.append(packed[last:])
    try:
        out = _codec._dumps_plain(pickle.loads(b"".join(pieces)))
    except Exception:  # noqa: BLE001
        return None
    as_null = out
    for literal, number in _STAND_INS.items():
        text = orjson.dumps(number)
        if out.count(text) != counts[literal]:
            return None
        as_null = as_null.replace(text, b"null")
    if as_null != raw:
        return None
    for literal, number in _STAND_INS.items():
        out = out.replace(orjson.dumps(number), literal)
    return out


def assert_as_the_pickle_path_wrote(value: Any) -> None:
    expected = pickle_literals(value)
    if expected is None:  # no non-finite float, or the old path was unsure: nothing to compare
        return
    assert enc(value) == Entry(expected, exotic=True)


# Values as trainers store them: checkpoint records with NaN rewards beside Nones and strings that
# hold "null", "NaN" or "Infinity" as text.
_nonfinite_json = st.recursive(
    json_scalars | st.sampled_from(NONFINITE) | st.sampled_from(["null", "NaN", "-Infinity", "x null y"]),
    lambda children: (st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=5)
                      | st.lists(children, max_size=3).map(tuple)),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(_nonfinite_json)
def test_property_nan_values_are_written_as_the_pickle_path_wrote(value: Any) -> None:
    assert_as_the_pickle_path_wrote(value)


@pytest.mark.long
@settings(max_examples=20_000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_nonfinite_json)
def test_property_nan_values_are_written_as_the_pickle_path_wrote_20000(value: Any) -> None:
    assert_as_the_pickle_path_wrote(value)


def test_nan_values_with_null_in_their_text_stay_on_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strings holding "null" (which the check counts) and the old stand-ins are no reason for the
    slow walk; a checkpoint list of every kind of literal is what the pickle path wrote."""
    walked: list[Any] = []
    real = _fallback._Plain.__call__
    monkeypatch.setattr(_fallback._Plain, "__call__", lambda self, v: walked.append(v) or real(self, v))
    checkpoints = [{"steps": i, "reward": NONFINITE[i % 6] if i % 2 else None, "path": f"null/{i}.onnx",
                    "aux": (1e-7, [1e16])} for i in range(60)]
    for value in (["null", NAN], {"null": None, "n": -INF}, checkpoints, ("x null", (None, INF))):
        assert_as_the_pickle_path_wrote(value)
        assert pickle_literals(value) is not None
    # A stand-in in the data made the pickle path unsure (Python's json wrote it: 1e-07); now it
    # is a float like any other.
    assert enc([NAN, _STAND_INS[b"NaN"], 1e-7]).raw == b"[\n      NaN,\n      1.2345678901234568e-299,\n      1e-7\n    ]"
    assert walked == []


@pytest.mark.parametrize("bad", NONFINITE, ids=["nan", "-nan", "inf", "-inf", "inf*0", "nan-payload"])
@pytest.mark.parametrize("shape", ["alone", "list", "dict", "tuple", "deep"])
def test_nonfinite_next_to_none_is_written_as_a_literal(tmp_path: pathlib.Path, bad: float, shape: str) -> None:
    """ML-Agents checkpoints hold reward None; a NaN beside a None must still be a NaN literal."""
    value = {
        "alone": bad,
        "list": [None, 1.5, bad],
        "dict": {"reward": None, "loss": bad},
        "tuple": (None, (bad,)),
        "deep": [{"checkpoints": [{"reward": None}, {"reward": [1, {"x": bad}]}]}],
    }[shape]
    entry = enc(value)
    assert entry.exotic
    assert entry == reference_entry(value)
    literal = b"NaN" if math.isnan(bad) else (b"-Infinity" if bad < 0 else b"Infinity")
    assert literal in entry.raw
    assert same(store_round_trip(tmp_path, value), json.loads(json.dumps(value)))


@pytest.mark.parametrize(
    "value",
    [
        [None, 1.5, "nan", "inf", "-Infinity"],
        [None, "gxxx", 0x7FF00000],  # marshal's bytes for these look like a NaN's: the walk clears it
        [{"reward": None, "creation_time": 1.7e9 + i / 7} for i in range(50)],
        [None, 1e308, -1e308, 5e-324, -0.0, 2.0**1023],
        (None, ("x",)),
    ],
    ids=["nan-as-text", "marshal-lookalike", "checkpoints", "extreme-finite", "tuples"],
)
def test_finite_values_with_none_stay_on_orjson(value: Any) -> None:
    entry = enc(value)
    assert not entry.exotic
    assert entry == reference_entry(value)
    assert same(decode(entry), orjson.loads(orjson.dumps(value)))


def test_a_builtin_value_with_none_is_cleared_without_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the marshal check: the Python walk runs only where marshal cannot answer."""
    walked: list[Any] = []
    real = _fallback._Plain.__call__

    def counting(self: Any, value: Any) -> Any:
        walked.append(value)
        return real(self, value)

    monkeypatch.setattr(_fallback._Plain, "__call__", counting)
    checkpoints = [{"steps": i, "reward": None if i % 3 == 0 else i / 3, "paths": [f"c{i}.onnx"]} for i in range(20)]
    assert not enc(checkpoints).exotic
    assert walked == []
    assert enc([None, NAN]).exotic and walked == []  # a NaN: orjson writes it, with a fragment (issue 23)
    assert enc([None, NAN, 1.2345678901234567e-299]).exotic and walked == []  # pickle's stand-in once: no walk
    assert not enc([None, Checkpoint(1, 2.0)]).exotic  # a dataclass: marshal cannot tell, the walk does
    assert walked


@pytest.mark.parametrize("numpy_loaded", [True, False])
def test_numpy_values_with_none_are_not_cleared_by_marshal(monkeypatch: pytest.MonkeyPatch, numpy_loaded: bool) -> None:
    """marshal takes numpy arrays as raw bytes, where a NaN has no marker."""
    if not numpy_loaded:  # a builtin value is cleared the same way whether numpy is loaded or not
        monkeypatch.delitem(sys.modules, "numpy")
        assert not enc([None, 1.0]).exotic
        assert enc([None, NAN]).exotic
        return
    for value in ([None, np.array([1.0, NAN])], [None, np.float64(INF)], {"a": None, "b": np.float32(NAN)}):
        entry = enc(value)
        assert entry.exotic
        assert entry == reference_entry(value)
    assert not enc([None, np.array([1.0, 2.0])]).exotic


@pytest.mark.parametrize("depth", [250, 252, 253, 254])
def test_deep_values_near_orjsons_limit_encode_as_before(depth: int) -> None:
    """Wrapping a value two levels deep must not make a value near orjson's depth limit fail."""
    for value in (nested_lists(depth), nested_dicts(depth, None)):
        try:
            expected = reference_entry(value)
        except TypeError:
            with pytest.raises(TrainingStatusValueError):
                enc(value)
        else:
            assert enc(value) == expected


def test_scalars_and_empty_containers_encode_as_before() -> None:
    for value in [0, -1, 2**64 - 1, 1.5, -0.0, True, None, "", "a\nb", "é\u2028", [], {}, (), [[]], {"a": {}},
                  Colour.RED]:
        entry = enc(value)
        assert entry == reference_entry(value) and type(entry) is Entry, value
        assert entry.raw == reference_entry(value).raw and entry.exotic is False


@pytest.mark.parametrize("count", [3, 400])
def test_many_lookalike_bytes_still_find_the_nan(count: int) -> None:
    """Negative integers fill marshal's bytes with 0xff, the last byte of a negative NaN; past a
    few, the regex takes over from looking at each: both must find the NaN and clear the rest."""
    # Distinct, and none with a byte that marshal uses for a float's code.
    ints = [-(1 + 256 * k) for k in range(count) if ~k & 0xFF not in _nonfinite._FLOAT_CODES]
    assert _nonfinite._probe_nonfinite(_nonfinite._marshalled([None, *ints])) == _nonfinite._NONE_THERE
    assert not enc([None, *ints]).exotic
    for bad in (-NAN, NAN, -INF):
        entry = enc([None, *ints, bad])
        assert entry.exotic and entry == reference_entry([None, *ints, bad])


# -- lone surrogates: what a file held can be set again ------------------------------------------

LONE = "run-\udcff.onnx"  # os.fsdecode(b"run-\xff.onnx"): a non-UTF-8 file name, surrogateescape'd


def mlagents_file(tmp_path: pathlib.Path, document: dict[str, Any]) -> pathlib.Path:
    """A status file written as ML-Agents writes it: json.dump(indent=4), ASCII with escapes."""
    target = tmp_path / "status.json"
    document = {**document, "metadata": {"stats_format_version": "0.3.0"}}
    with open(target, "w") as f:
        json.dump(document, f, indent=4)
    return target


@pytest.mark.parametrize(
    "value",
    [LONE, {"checkpoints": [{"file_path": LONE, "steps": 5}]}, {LONE: ["é", "\udc80\u00e9"]}],
    ids=["value", "nested", "dict_key"],
)
def test_a_lone_surrogate_loaded_from_a_file_can_be_set_again(tmp_path: pathlib.Path, value: Any) -> None:
    target = mlagents_file(tmp_path, {"Walker": {"k": value}})
    assert b"\\udcff" in target.read_bytes()
    with StatusStore(target) as store:
        loaded = store.get("Walker", "k")
        assert loaded == value
        store.set("Walker", "again", loaded)  # raised TrainingStatusValueError before
        store.set("Walker", "k", loaded)
        assert store.get("Walker", "again") == value
    data = target.read_bytes()
    data.decode("utf-8")  # still valid UTF-8: the surrogate is written as its escape
    escaped = json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8", "backslashreplace")
    assert escaped.replace(b"\n", b"\n    ") in data
    assert data.count(b"\\udcff") == 2
    with StatusStore(target) as again:
        assert again.get("Walker", "k") == value
        assert again.get("Walker", "again") == value
    assert json.loads(data)["Walker"]["again"] == value  # Python's json reads it as the same str


def test_a_lone_surrogate_is_written_as_pythons_json_escape_and_other_text_as_utf8() -> None:
    entry = enc(LONE)
    assert entry.raw == json.dumps(LONE).encode("ascii") == b'"run-\\udcff.onnx"'
    assert decode(entry) == LONE
    entry = enc({"é\udcff": ["日本", "\ud800"]})
    assert entry.raw == '{\n      "é\\udcff": [\n        "日本",\n        "\\ud800"\n      ]\n    }'.encode()
    assert decode(entry) == {"é\udcff": ["日本", "\ud800"]}


@pytest.mark.parametrize(
    "value",
    [LONE, [LONE, NAN], Checkpoint(1, 2.0, (LONE,)), {"a": (MyStr(LONE), Colour.RED)}, np.array([LONE]),
     [np.float32(0.1), LONE], [datetime.date(2024, 1, 1), LONE]],
    ids=["str", "next_to_nan", "in_dataclass", "str_subclass", "numpy_text", "next_to_numpy", "next_to_date"],
)
def test_values_with_a_lone_surrogate_store_what_they_would_without_it(tmp_path: pathlib.Path, value: Any) -> None:
    # The surrogate path must write everything else as the orjson path does.
    expected = json.loads(json.dumps(codec_round_trip(_replace(value, LONE, "run-X.onnx"))).replace("run-X.onnx", LONE))
    assert same(codec_round_trip(value), expected)
    assert same(store_round_trip(tmp_path, value), expected)


def _replace(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return new if value == old else value
    if isinstance(value, (list, tuple)):
        return [_replace(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, old, new) for k, v in value.items()}
    if isinstance(value, Checkpoint):
        return Checkpoint(value.steps, value.reward, tuple(_replace(list(value.tags), old, new)))
    if isinstance(value, np.ndarray) and value.dtype.kind == "U":
        return np.array(_replace(value.tolist(), old, new))
    return value


def test_values_without_a_surrogate_never_take_the_json_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(value: Any) -> Any:
        raise AssertionError(f"json path taken for {value!r}")

    monkeypatch.setattr(_encoding, "_with_surrogates", refuse)
    for value in ("é", {"日本": ["\u2028", "\U0001F600"]}, [1, "x"], np.array([1.5], dtype=np.float32)):
        assert not enc(value).exotic
    with pytest.raises(AssertionError, match="json path taken"):
        enc(LONE)


@pytest.mark.parametrize("where", ["category", "key"])
def test_a_name_with_a_lone_surrogate_can_be_set(tmp_path: pathlib.Path, where: str) -> None:
    target = tmp_path / "status.json"
    category, key = ("beh\udcff", "k") if where == "category" else ("beh", "k\udcff")
    with StatusStore(target) as store:
        store.set(category, key, 1)
    data = target.read_bytes()
    assert b'"beh\\udcff"' in data or b'"k\\udcff"' in data
    data.decode("utf-8")
    with StatusStore(target) as again:
        assert again.get(category, key) == 1
        assert list(again.to_dict()) == [category, "metadata"]


@pytest.mark.parametrize("where", ["category", "key"])
def test_a_name_with_a_surrogate_pair_is_a_value_error(tmp_path: pathlib.Path, where: str) -> None:
    target = tmp_path / "status.json"
    names = (f"beh{PAIR}", "k") if where == "category" else ("beh", f"k{PAIR}")
    with StatusStore(target) as store, pytest.raises(TrainingStatusValueError) as info:
        store.set(*names, 1)
    bad = names[0] if where == "category" else names[1]
    assert str(info.value) == f"The {where} {bad!r} for {target} {pair_problem('', 'name')[1:]}. Nothing was written."
    assert not target.exists()


# -- numpy: every number stored as the Python float or int it equals ------------------------------


def test_numpy_float16_and_float32_are_stored_as_the_float64_they_equal() -> None:
    assert enc(np.float32(0.1)).raw == b"0.10000000149011612" == repr(float(np.float32(0.1))).encode()
    assert enc(np.float16(0.1)).raw == b"0.0999755859375" == repr(float(np.float16(0.1))).encode()
    assert decode(enc(np.float16(0.1))) == float(np.float16(0.1))


def _exact(value: Any) -> Any:
    """The value as Python numbers: what numpy's tolist / float() make of it."""
    if isinstance(value, np.ndarray) and value.dtype.kind == "O":
        return _exact(value.tolist())
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _exact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_exact(v) for v in value]
    return value


F32 = np.array([0.1, 1 / 3, 2.5, -1e-8, 3.4e38], dtype=np.float32)
F16 = np.array([0.1, 1 / 3, 65504, -6e-8], dtype=np.float16)
NUMPY_EXACT = [
    ("float16_scalar", np.float16(0.1)),
    ("float32_scalar", np.float32(1 / 3)),
    ("float64_scalar", np.float64(0.1)),
    ("float32_array", F32),
    ("float16_array", F16),
    ("float32_2d_transposed", F32[:4].reshape(2, 2).T),
    ("float32_strided", F32[::2]),
    ("float16_zero_dim", np.array(0.1, dtype=np.float16)),
    ("float32_zero_dim", np.array(0.1, dtype=np.float32)),
    ("int_zero_dim", np.array(-7, dtype=np.int16)),
    ("bool_zero_dim", np.array(True)),
    ("ints", [np.int8(-128), np.int16(-3), np.int32(2**31 - 1), np.int64(-(2**63)), np.uint8(255),
              np.uint16(7), np.uint32(2**32 - 1), np.uint64(2**64 - 1)]),
    ("int_arrays", [np.array([-1, 2], dtype=np.int8), np.array([2**64 - 1], dtype=np.uint64)]),
    ("bools", [np.bool_(True), np.bool_(False), np.array([True, False])]),
    ("nested_in_dict_and_list", {"loss": [np.float32(0.1), {"w": F16, "b": (F32[:2],)}], "n": np.int64(3)}),
    ("in_dataclass", Checkpoint(np.int32(5), np.float32(0.1))),  # type: ignore[arg-type]
    ("in_object_array", np.array([np.float32(0.1), np.float16(0.2)], dtype=object)),
    ("float32_next_to_nan", [np.float32(0.1), NAN]),
    ("float32_next_to_none", [np.float32(0.1), None]),
]


@pytest.mark.parametrize("value", [pytest.param(v, id=i) for i, v in NUMPY_EXACT])
def test_numpy_values_are_stored_exactly(tmp_path: pathlib.Path, value: Any) -> None:
    if isinstance(value, Checkpoint):
        expected: Any = {"steps": 5, "reward": float(np.float32(0.1)), "tags": ["best"]}
    else:
        expected = _exact(value)
    assert same(codec_round_trip(value), expected), codec_round_trip(value)
    assert same(store_round_trip(tmp_path, value), expected)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("shape", ["array", "nested", "zero_dim", "scalar", "transposed"])
def test_numpy_nonfinite_float16_and_float32_round_trip(tmp_path: pathlib.Path, dtype: Any, shape: str) -> None:
    data = np.array([0.1, np.nan, np.inf, -np.inf, -0.0, 1 / 3], dtype=dtype)
    value = {
        "array": data,
        "nested": {"r": [data[:3], {"x": dtype(np.nan)}], "ok": dtype(0.1)},
        "zero_dim": np.array(np.inf, dtype=dtype),
        "scalar": [dtype(-np.inf), dtype(0.1)],
        "transposed": data.reshape(2, 3).T,
    }[shape]
    expected = _exact(value)
    entry = enc(value)
    assert entry.exotic and (b"NaN" in entry.raw or b"Infinity" in entry.raw)
    assert same(decode(entry), expected), decode(entry)
    assert same(store_round_trip(tmp_path, value), expected)


# -- issue 13: no garbage collection inside the decode of a big value ----------------------------


def test_a_big_get_runs_no_collection_inside_and_leaves_the_collector_as_it_found_it(tmp_path: pathlib.Path) -> None:
    import gc

    value = [{"steps": i, "reward": float(i), "paths": [f"c{i}.pt"]} for i in range(20_000)]  # ~1 MB
    runs: list[str] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            runs.append("collection")

    with StatusStore(tmp_path / "status.json") as store:
        store.set("Walker", "checkpoints", value)
        assert len(store._lookup("Walker", "checkpoints").raw) >= _codec.PAUSE_FROM
        gc.callbacks.append(note)
        try:
            assert gc.isenabled()
            got = store.get("Walker", "checkpoints")
            inside = len(runs)  # an int: no container made, so no collection started here
            assert gc.isenabled()  # turned back on
            gc.disable()
            try:
                store.get("Walker", "checkpoints")
                assert not gc.isenabled()  # a program's own choice is left alone
            finally:
                gc.enable()
        finally:
            gc.callbacks.remove(note)
    assert got == value
    assert inside == 0  # 20,000 dicts and lists decoded: without the pause, dozens of collections


def test_the_collector_pause_nests_across_threads() -> None:
    import gc
    import threading as threads

    inside, release = threads.Event(), threads.Event()

    def other() -> None:
        with _codec.collector_paused():
            inside.set()
            release.wait(10)

    worker = threads.Thread(target=other)
    worker.start()
    assert inside.wait(10)
    with _codec.collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread is still decoding
    release.set()
    worker.join(10)
    assert gc.isenabled()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda good: good[: len(good) // 2], id="truncated"),
        pytest.param(lambda good: b"[" + good + b"]", id="not_an_object"),
        pytest.param(lambda good: good.replace(b'"c1.pt"', b'"\xff\xfe"', 1), id="invalid_utf8"),
        pytest.param(lambda good: good[:-1] + b',"Walker": {}}', id="duplicate_category"),
    ],
)
def test_a_big_damaged_file_leaves_the_collector_on(tmp_path: pathlib.Path, damage: Any) -> None:
    # The load of a file of PAUSE_FROM bytes or more pauses the collector; a damaged one ends in
    # an exception inside the pause, and a program whose collector stayed off would grow forever.
    import gc

    from trainstatus import TrainingStatusCorruptWarning

    path = tmp_path / "status.json"
    with StatusStore(path, history=0) as store:
        store.set("Walker", "checkpoints", [{"steps": i, "paths": [f"c{i}.pt"]} for i in range(10_000)])
    data = damage(path.read_bytes())
    assert len(data) >= _codec.PAUSE_FROM
    path.write_bytes(data)
    assert gc.isenabled()
    with pytest.warns(TrainingStatusCorruptWarning), StatusStore(path, history=0) as store:
        assert gc.isenabled()
        assert store.get("Walker", "checkpoints") is None
    assert gc.isenabled()
    assert _codec._pausers == 0
