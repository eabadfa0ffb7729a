"""A name given twice in one object of a status file: found when the document is loaded.

JSON parsers keep the last value of a repeated name and say nothing, so the next write would
keep only that one. ``load_document`` lists each in ``Document.duplicates``, with every value.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from _helpers import same

from trainstatus import StatusStore, _load
from trainstatus._codec.values import decode
from trainstatus._load import Duplicate, find_duplicates, load_document

DATA = Path(__file__).parent / "data" / "mlagents_training_status.json"
META = '"metadata": {"stats_format_version": "0.3.0"}'


def found(text: str | bytes) -> list[tuple[tuple[str | int, ...], tuple[Any, ...]]]:
    data = text.encode() if isinstance(text, str) else text
    return [(d.where, d.values) for d in load_document(data).duplicates]


def test_a_key_given_twice_in_a_category_is_listed_with_both_values() -> None:
    data = b'{"wall_height": {"lesson_num": 1, "lesson_num": 3}, ' + META.encode() + b"}"
    document = load_document(data)
    assert document.duplicates == [Duplicate(("wall_height", "lesson_num"), (1, 3))]
    assert decode(document.categories["wall_height"]["lesson_num"]) == 3  # the last is read
    (duplicate,) = document.duplicates
    assert duplicate.name == "wall_height/lesson_num"
    assert str(duplicate) == "wall_height/lesson_num appears 2 times (1, then 3); the last, 3, is the one read"


def test_a_category_given_twice_is_listed_whole() -> None:
    text = '{"Walker": {"elo": 1200.0}, "wall_height": {"lesson_num": 2}, "Walker": {"steps": 5}, ' + META + "}"
    document = load_document(text.encode())
    assert found(text) == [(("Walker",), ({"elo": 1200.0}, {"steps": 5}))]
    assert list(document.categories["Walker"]) == ["steps"]
    assert str(document.duplicates[0]) == (
        'the category Walker appears 2 times ({"elo": 1200.0}, then {"steps": 5}); the last, '
        '{"steps": 5}, is the one read'
    )


def test_three_times_and_several_names_in_file_order() -> None:
    text = '{"a": {"k": 1, "j": 0, "k": 2, "k": 3, "j": 9}, "b": {"x": 1, "x": 1}}'
    assert found(text) == [(("a", "k"), (1, 2, 3)), (("a", "j"), (0, 9)), (("b", "x"), (1, 1))]
    assert str(load_document(text.encode()).duplicates[0]).startswith("a/k appears 3 times (1, 2, then 3); ")


def test_repeats_inside_values_and_metadata_are_found_too() -> None:
    text = ('{"Walker": {"checkpoints": [{"steps": 10, "file_path": "a", "steps": 20}]}, '
            '"metadata": {"stats_format_version": "0.3.0", "stats_format_version": "0.2.0"}}')
    document = load_document(text.encode())
    assert found(text) == [
        (("Walker", "checkpoints", 0, "steps"), (10, 20)),
        (("metadata", "stats_format_version"), ("0.3.0", "0.2.0")),
    ]
    assert document.duplicates[0].name == "Walker/checkpoints[0]/steps"


def test_values_are_exact_nan_infinity_and_integers_beyond_64_bits() -> None:
    text = '{"c": {"k": NaN, "k": -Infinity, "k": 123456789012345678901234567890}}'
    ((where, values),) = found(text)
    assert where == ("c", "k")
    assert math.isnan(values[0]) and values[1] == -math.inf and values[2] == 123456789012345678901234567890
    assert str(load_document(text.encode()).duplicates[0]) == (
        "c/k appears 3 times (NaN, -Infinity, then 123456789012345678901234567890); the last, "
        "123456789012345678901234567890, is the one read"
    )


def test_the_same_name_spelt_with_an_escape_is_a_repeat() -> None:
    assert found('{"c": {"k": 1, "\\u006b": 2}}') == [(("c", "k"), (1, 2))]


def test_names_that_would_not_read_as_one_word_are_quoted_and_long_values_shortened() -> None:
    text = '{"a/b": {" k": [' + ", ".join(["1000"] * 30) + '], " k": 0}}'
    (duplicate,) = load_document(text.encode()).duplicates
    assert duplicate.name == '"a/b"/" k"'
    assert str(duplicate) == (
        '"a/b"/" k" appears 2 times ([1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 10..., '
        'then 0); the last, 0, is the one read'
    )


def test_a_byte_order_mark_and_a_newer_format_are_still_checked() -> None:
    assert found(b'\xef\xbb\xbf{"c": {"k": 1, "k": 2}}') == [(("c", "k"), (1, 2))]
    newer = '{"c": {"k": 1, "k": 2}, "new": [1], "metadata": {"stats_format_version": "1.0.0"}}'
    assert found(newer) == [(("c", "k"), (1, 2))]


@pytest.mark.parametrize("text", [
    "{}",
    '{"c": {}}',
    '{"c": {"k": 1}, "d": {"k": 1}}',  # the same key in two categories is fine
    '{"c": {"k": {"k": {"k": 1}}}}',
    '{"c": {"k": [{"a": 1}, {"a": 1}]}}',
])
def test_a_name_in_different_objects_is_not_a_repeat(text: str) -> None:
    assert found(text) == []


def test_an_ml_agents_file_has_none() -> None:
    data = DATA.read_bytes()
    assert found(data) == []
    assert find_duplicates(data) == []


def test_a_repeat_in_trainstatus_own_layout_is_found(tmp_path: Path) -> None:
    # Byte for byte what render writes, but for the second line: the fast path must not pass it.
    store = StatusStore(tmp_path / "ts.json", durable=False)
    store.set("wall_height", "lesson_num", 1)
    store.close()
    written = (tmp_path / "ts.json").read_bytes()
    assert load_document(written).duplicates == []
    doubled = written.replace(b'    "lesson_num": 1\n', b'    "lesson_num": 1,\n    "lesson_num": 2\n')
    assert doubled != written
    assert found(doubled) == [(("wall_height", "lesson_num"), (1, 2))]


def test_a_file_trainstatus_wrote_is_not_parsed_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StatusStore(tmp_path / "ts.json", durable=False)
    document = json.loads(DATA.read_bytes())
    for category, entries in document.items():
        if category != "metadata":
            for key, value in entries.items():
                store.set(category, key, value)
    store.set("odd \udcff name", "k\n", [math.inf, -0.0, "\udcfe"])  # the exotic encodings too
    store.close()
    written = (tmp_path / "ts.json").read_bytes()

    def not_expected(data: bytes) -> list[Duplicate]:
        raise AssertionError("the second parse ran on a file trainstatus wrote")

    monkeypatch.setattr(_load, "find_duplicates", not_expected)
    loaded = load_document(written)
    assert loaded.duplicates == []
    assert same(decode(loaded.categories["Walker"]["checkpoints"]), document["Walker"]["checkpoints"])
    with pytest.raises(AssertionError, match="second parse"):
        load_document(DATA.read_bytes())  # ML-Agents' layout does take it
