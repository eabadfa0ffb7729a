"""Opening a StatusStore on a corpus of files: good, damaged, foreign, old and new formats."""

from __future__ import annotations

import json
import math
import os
import pathlib
import random
import re
from typing import Any

import pytest
from _helpers import same

from trainstatus import (
    StatusStore,
    TrainingStatusCorruptError,
    TrainingStatusCorruptWarning,
    TrainingStatusMissingWarning,
    TrainingStatusVersionError,
    TrainingStatusVersionWarning,
)

DATA = pathlib.Path(__file__).parent / "data"
MLAGENTS = (DATA / "mlagents_training_status.json").read_bytes()
OWN_METADATA = {"stats_format_version": "0.3.0", "trainstatus_version": "0.1.0"}
META = b'"metadata": {"stats_format_version": "0.3.0"}'
NAN = float("nan")


# -- helpers ------------------------------------------------------------------------------------




def write(directory: pathlib.Path, data: bytes, name: str = "status.json") -> pathlib.Path:
    target = directory / name
    target.write_bytes(data)
    return target


def doc(body: bytes) -> bytes:
    """A file holding ``body`` (categories, without braces) and current metadata."""
    return b"{" + body + (b", " if body else b"") + META + b"}"


def corrupt_files(directory: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in directory.iterdir() if ".corrupt-" in p.name)


def categories(store: StatusStore) -> dict[str, Any]:
    whole = store.to_dict()
    whole.pop("metadata")
    return whole


def assert_corrupt_open(target: pathlib.Path, data: bytes, reason: str | None, **options: Any) -> None:
    """Opening ``target`` (holding ``data``) warns, keeps the bytes aside, starts empty."""
    with pytest.warns(TrainingStatusCorruptWarning) as record:
        store = StatusStore(target, durable=False, **options)
    try:
        assert len(record) == 1
        warning = record[0].message
        assert record[0].filename == __file__
        moved = warning.moved_to
        assert re.fullmatch(re.escape(str(target)) + r"\.corrupt-\d{8}T\d{6}\.\d{6}Z(-\d+)?", moved), moved
        assert warning.path == str(target)
        text = str(warning)
        head = f"{target} was damaged ("
        tail = (f"); it was kept, byte for byte, as {moved} and the store starts empty. "
                "Inspect that file to recover anything newer.")
        if reason is None:
            assert text.startswith(head) and text.endswith(tail), text
        else:
            assert text == head + reason + tail
        assert pathlib.Path(moved).read_bytes() == data
        assert not target.exists()
        assert store.to_dict() == {"metadata": OWN_METADATA}
        assert corrupt_files(target.parent) == [pathlib.Path(moved)]
    finally:
        store.close()
    for path in corrupt_files(target.parent):
        path.unlink()


def open_quietly(target: pathlib.Path, **options: Any) -> StatusStore:
    return StatusStore(target, **options)  # filterwarnings=error: any warning fails the test


# -- the ML-Agents file -------------------------------------------------------------------------


def test_mlagents_file_loads_with_nan_and_equal_values(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, MLAGENTS)
    expected = json.loads(MLAGENTS)
    with open_quietly(target) as store:
        whole = store.to_dict()
        reward = store.get("Walker", "checkpoints")[0]["reward"]
        assert isinstance(reward, float) and math.isnan(reward)
        assert store.get("SoccerTwos?team=0", "elo") == 1278.4
        assert store.get("wall_height", "lesson_num") == 3
        assert store.get("metadata", "mlagents_version") == "1.1.0"
    file_meta = expected.pop("metadata")
    meta = whole.pop("metadata")
    assert same(whole, expected)
    assert meta == {**file_meta, "trainstatus_version": "0.1.0"}
    assert target.read_bytes() == MLAGENTS  # opening does not write


def test_mlagents_file_rewrite_keeps_nan_and_foreign_metadata(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, MLAGENTS)
    with open_quietly(target) as store:
        store.set("wall_height", "lesson_num", 4)
    rewritten = json.loads(target.read_bytes())
    original = json.loads(MLAGENTS)
    original["wall_height"]["lesson_num"] = 4
    assert math.isnan(rewritten["Walker"]["checkpoints"][0]["reward"])
    assert b'"reward": NaN' in target.read_bytes()
    meta = rewritten.pop("metadata")
    file_meta = original.pop("metadata")
    assert same(rewritten, original)
    assert meta["mlagents_version"] == "1.1.0"
    assert meta["torch_version"] == "2.2.2"
    assert meta["stats_format_version"] == "0.3.0"
    assert meta["trainstatus_version"] == "0.1.0"
    assert set(meta) == set(file_meta) | {"trainstatus_version"}
    with open_quietly(target) as again:  # and the rewrite loads cleanly again
        assert same(categories(again), rewritten)


def test_every_truncation_of_the_mlagents_file(tmp_path: pathlib.Path, reliability: Any) -> None:
    reliability.add("damaged_files", len(MLAGENTS), source="test_load.py")
    target = tmp_path / "status.json"
    for length in range(len(MLAGENTS)):
        prefix = MLAGENTS[:length]
        target.write_bytes(prefix)
        reason = "it is empty" if length == 0 else None
        assert_corrupt_open(target, prefix, reason)
    target.write_bytes(MLAGENTS)
    with open_quietly(target, durable=False) as store:
        assert store.get("wall_height", "lesson_num") == 3
    assert corrupt_files(tmp_path) == []


# -- damaged files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"", "it is empty", id="empty"),
        pytest.param(b" \n\t\r\n  ", "it holds only whitespace", id="whitespace"),
        pytest.param(b"[]", "its top level is an array, not an object", id="top_list"),
        pytest.param(b'[{"a": {}}]', "its top level is an array, not an object", id="top_list_of_objects"),
        pytest.param(b'"status"', "its top level is a string, not an object", id="top_string"),
        pytest.param(b"42", "its top level is a number, not an object", id="top_int"),
        pytest.param(b"-1.5e3\n", "its top level is a number, not an object", id="top_float"),
        pytest.param(b"null", "its top level is null, not an object", id="top_null"),
        pytest.param(b"true", "its top level is a boolean, not an object", id="top_bool"),
        pytest.param(b"NaN", "its top level is a number, not an object", id="top_nan"),
        pytest.param(doc(b'"Walker": []'), "category 'Walker' is an array, not an object", id="category_list"),
        pytest.param(doc(b'"wall": {"lesson_num": 1}, "elo": 3'), "category 'elo' is a number, not an object",
                     id="category_number"),
        pytest.param(b'{"a": {}, "metadata": "0.3.0"}', "the metadata block is a string, not an object",
                     id="metadata_string"),
        pytest.param(b'{"metadata": null}', "the metadata block is null, not an object", id="metadata_null"),
        pytest.param(b"[" * 1100 + b"]" * 1100, "it is nested too deeply to be a status file", id="deep_list"),
        pytest.param(doc(b'"a": {"k": ' + b'{"x": ' * 1100 + b"1" + b"}" * 1100 + b"}"),
                     "it is nested too deeply to be a status file", id="deep_value"),
        pytest.param(b'{"a": {"k": 1}', None, id="unclosed"),
        pytest.param(b'{"a": {"k": 1}}}', None, id="trailing_brace"),
        pytest.param(b'{"a": {"k": 1}} {}', None, id="two_documents"),
        pytest.param(b'{"a": {"k": nan}}', None, id="lowercase_nan"),
        pytest.param(b"{'a': {}}", None, id="single_quotes"),
        pytest.param(b'{"a": {"k": "\xff\xfe"}, ' + META + b"}", None, id="invalid_utf8"),
        pytest.param(b"\xef\xbb\xbf", None, id="bom_only"),
        pytest.param(b"\x00" * 64, None, id="nul_bytes"),
    ],
)
def test_damaged_file_is_kept_aside(tmp_path: pathlib.Path, data: bytes, reason: str | None, reliability: Any) -> None:
    reliability.add("damaged_files", 1, source="test_load.py")
    assert_corrupt_open(write(tmp_path, data), data, reason)


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_are_kept_aside(tmp_path: pathlib.Path, seed: int, reliability: Any) -> None:
    reliability.add("damaged_files", 1, source="test_load.py")
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(1, 4096))
    assert_corrupt_open(write(tmp_path, data), data, None)


def test_damaged_reason_names_the_json_error(tmp_path: pathlib.Path) -> None:
    data = b'{"a": {"k": 1}'
    with pytest.warns(TrainingStatusCorruptWarning, match=r"\(it is not valid JSON \(.+\)\); it was kept"):
        StatusStore(write(tmp_path, data), durable=False).close()


def test_strict_raises_and_leaves_the_file_untouched(tmp_path: pathlib.Path) -> None:
    data = b'{"a": [1, 2'
    target = write(tmp_path, data)
    before = os.stat(target)
    with pytest.raises(TrainingStatusCorruptError) as info:
        StatusStore(target, strict=True)
    message = str(info.value)
    assert message.startswith(f"{target} is damaged: it is not valid JSON (")
    assert message.endswith(
        "). It was left untouched because the store was opened with strict=True; repair or remove it, "
        "or open without strict to keep it aside and start from the newest intact version in its "
        f"history (empty without one; `trainstatus history {target}` lists them)."
    )
    assert info.value.path == str(target)
    assert info.value.moved_to is None
    assert target.read_bytes() == data
    after = os.stat(target)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert corrupt_files(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "it is empty"),
        (b"[]", "its top level is an array, not an object"),
        (b'{"metadata": "x"}', "the metadata block is a string, not an object"),
    ],
)
def test_strict_message_word_for_word(tmp_path: pathlib.Path, data: bytes, reason: str) -> None:
    target = write(tmp_path, data)
    with pytest.raises(TrainingStatusCorruptError) as info:
        StatusStore(target, strict=True)
    assert str(info.value) == (
        f"{target} is damaged: {reason}. It was left untouched because the store was opened with "
        "strict=True; repair or remove it, or open without strict to keep it aside and start from the "
        f"newest intact version in its history (empty without one; `trainstatus history {target}` lists them)."
    )
    assert target.read_bytes() == data
    assert corrupt_files(tmp_path) == []


def test_strict_accepts_a_good_file(tmp_path: pathlib.Path) -> None:
    with open_quietly(write(tmp_path, MLAGENTS), strict=True) as store:
        assert store.get("big_wall_height", "lesson_num") == 1


def test_corrupt_file_store_is_writable_afterwards(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, b"{garbage")
    with pytest.warns(TrainingStatusCorruptWarning) as record:
        store = StatusStore(target)
    with store:
        store.set("wall_height", "lesson_num", 1)
    assert json.loads(target.read_bytes()) == {"wall_height": {"lesson_num": 1}, "metadata": OWN_METADATA}
    assert pathlib.Path(record[0].message.moved_to).read_bytes() == b"{garbage"


@pytest.mark.parametrize("how", ["set", "delete", "clear", "transaction", "reload"])
def test_corruption_found_later_warns_at_the_caller(tmp_path: pathlib.Path, how: str) -> None:
    # Another process garbles the file after the store read it; the warning must point at the
    # line of the caller that triggered the re-read, not inside trainstatus or the stdlib.
    target = tmp_path / "status.json"
    with StatusStore(target) as store:
        store.set("a", "k", 1)
        target.write_bytes(b"garbage written by someone else")
        with pytest.warns(TrainingStatusCorruptWarning) as record:
            if how == "set":
                store.set("a", "j", 2)
            elif how == "delete":
                store.delete("a", "k")
            elif how == "clear":
                store.clear()
            elif how == "transaction":
                with store.transaction():
                    store.set("a", "j", 2)
            else:
                store.reload()
        assert [w.filename for w in record] == [__file__]
        moved = record[0].message.moved_to
        assert pathlib.Path(moved).read_bytes() == b"garbage written by someone else"


# -- files it reads ----------------------------------------------------------------------------


def test_utf8_bom_is_accepted(tmp_path: pathlib.Path) -> None:
    body = doc(b'"wall_height": {"lesson_num": 2, "name": "h\xc3\xa9"}')
    target = write(tmp_path, b"\xef\xbb\xbf" + body)
    with open_quietly(target) as store:
        assert store.get("wall_height", "lesson_num") == 2
        assert store.get("wall_height", "name") == "h\u00e9"
        store.set("wall_height", "lesson_num", 3)
    assert json.loads(target.read_bytes())["wall_height"] == {"lesson_num": 3, "name": "h\u00e9"}


def test_utf8_bom_with_nan_is_accepted(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, b"\xef\xbb\xbf" + doc(b'"a": {"k": NaN}'))
    with open_quietly(target) as store:
        assert math.isnan(store.get("a", "k"))


@pytest.mark.parametrize("with_nan", [False, True], ids=["orjson_path", "json_path"])
def test_duplicate_keys_last_wins_like_json(tmp_path: pathlib.Path, with_nan: bool) -> None:
    extra = b', "n": NaN' if with_nan else b""
    data = doc(b'"a": {"k": 1, "k": 2, "j": [1]' + extra + b'}, "b": {"x": 1}, "a": {"j": 3, "j": {"z": 1}}')
    expected = json.loads(data)
    with pytest.warns(TrainingStatusCorruptWarning, match="more than once"), StatusStore(write(tmp_path, data)) as store:
        whole = store.to_dict()
    assert whole.pop("metadata") == OWN_METADATA
    expected.pop("metadata")
    assert same(whole, expected)
    assert whole["a"] == {"j": {"z": 1}}


def test_nan_and_infinity_literals(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, doc(b'"a": {"n": NaN, "p": Infinity, "m": -Infinity, "l": [NaN, 1.5, -Infinity]}'))
    with open_quietly(target) as store:
        assert math.isnan(store.get("a", "n"))
        assert store.get("a", "p") == math.inf
        assert store.get("a", "m") == -math.inf
        assert same(store.get("a", "l"), [NAN, 1.5, -math.inf])
        store.set("b", "other", 1)
    data = target.read_bytes()
    assert b'"n": NaN' in data and b'"p": Infinity' in data and b'"m": -Infinity' in data
    assert same(json.loads(data)["a"], {"n": NAN, "p": math.inf, "m": -math.inf, "l": [NAN, 1.5, -math.inf]})


@pytest.mark.parametrize("with_nan", [False, True], ids=["plain", "next_to_nan"])
def test_huge_integer_kept_exactly(tmp_path: pathlib.Path, with_nan: bool) -> None:
    big, small = 123456789012345678901234567890, -987654321098765432109876543210
    extra = b', "nan": NaN' if with_nan else b""
    target = write(tmp_path, doc(b'"a": {"big": %d, "nested": [%d, {"x": %d}]%s}' % (big, small, big, extra)))
    with open_quietly(target) as store:
        assert store.get("a", "big") == big and type(store.get("a", "big")) is int
        assert store.get("a", "nested") == [small, {"x": big}]
        store.set("b", "other", 1)  # rewrites the whole file
        assert store.get("a", "big") == big
    data = target.read_bytes()
    assert str(big).encode() in data and str(small).encode() in data
    assert json.loads(data)["a"]["nested"] == [small, {"x": big}]
    with open_quietly(target) as again:
        assert again.get("a", "big") == big
        assert again.get("a", "nested") == [small, {"x": big}]
        assert again.get("b", "other") == 1


def test_lone_surrogate_escape_in_a_loaded_file_is_kept(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, doc(b'"a": {"s": "x\\ud800y", "t": "ok"}'))
    with open_quietly(target) as store:
        assert store.get("a", "s") == "x\ud800y"
        store.set("b", "other", 1)
    assert b'"x\\ud800y"' in target.read_bytes()
    with open_quietly(target) as again:
        assert again.get("a", "s") == "x\ud800y"


def test_utf8_encoded_surrogate_is_read_like_json_does(tmp_path: pathlib.Path) -> None:
    # Not strictly UTF-8, but Python's json reads it (surrogatepass); the value is kept and
    # written back as an escape.
    target = write(tmp_path, doc(b'"a": {"s": "\xed\xa0\x80"}'))
    with open_quietly(target) as store:
        assert store.get("a", "s") == "\ud800"
        store.set("b", "other", 1)
    assert b'"s": "\\ud800"' in target.read_bytes()


def test_deep_but_legal_nesting_loads(tmp_path: pathlib.Path) -> None:
    depth = 600  # beyond what the store writes (254) but well inside what json reads
    target = write(tmp_path, doc(b'"a": {"k": ' + b"[" * depth + b"7" + b"]" * depth + b"}"))
    with open_quietly(target) as store:
        value = store.get("a", "k")
        for _ in range(depth):
            value = value[0]
        assert value == 7
        store.set("b", "other", 1)
    with open_quietly(target) as again:
        assert again.get("b", "other") == 1


def test_empty_category_loads_and_is_kept(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, doc(b'"empty": {}, "a": {"k": 1}'))
    with open_quietly(target) as store:
        assert store.to_dict() == {"empty": {}, "a": {"k": 1}, "metadata": OWN_METADATA}
        store.set("a", "k", 2)
    assert json.loads(target.read_bytes()) == {"empty": {}, "a": {"k": 2}, "metadata": OWN_METADATA}


# -- metadata and versions ----------------------------------------------------------------------


def version_message(target: pathlib.Path, shown: str, newer: bool) -> str:
    if newer:
        advice = ("it is read as far as this version understands it, but writing to it raises an "
                  "error unless the store is opened with allow_downgrade=True; upgrade trainstatus "
                  "to keep what it holds")
    else:
        advice = "it is read as this version and rewritten in it on the next write"
    return f"{target} has format version {shown}, this trainstatus writes '0.3.0'; {advice}."


def open_with_one_warning(target: pathlib.Path, cls: type, **options: Any) -> tuple[StatusStore, Warning]:
    with pytest.warns(cls) as record:
        store = StatusStore(target, **options)
    assert len(record) == 1, [str(w.message) for w in record]
    assert record[0].filename == __file__
    return store, record[0].message


def test_missing_metadata_warns_and_loads(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, b'{"wall_height": {"lesson_num": 2}}')
    store, warning = open_with_one_warning(target, TrainingStatusVersionWarning)
    with store:
        assert str(warning) == (
            f"{target} has no metadata block, so its format version is unknown (an old or foreign "
            "file?); it is read as format 0.3.0 and the metadata is added on the next write."
        )
        assert warning.path == str(target) and warning.found_version is None
        assert store.get("wall_height", "lesson_num") == 2
        assert target.read_bytes() == b'{"wall_height": {"lesson_num": 2}}'
        store.set("wall_height", "lesson_num", 3)
    assert json.loads(target.read_bytes()) == {"wall_height": {"lesson_num": 3}, "metadata": OWN_METADATA}


def test_missing_file_warns_only_when_resuming(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "run" / "status.json"
    store, warning = open_with_one_warning(target, TrainingStatusMissingWarning, resume=True)
    store.close()
    assert str(warning) == (
        f"Resuming, but there is no status file at {target}: curriculum lessons, kept checkpoints "
        "and ELO start from scratch. Check the run folder, or open without resume=True for a new run."
    )
    assert warning.path == str(target)
    with open_quietly(target) as fresh:  # a fresh run: silent
        assert fresh.to_dict() == {"metadata": OWN_METADATA}
    assert not target.exists()


def test_older_format_warns_and_is_writable(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, b'{"a": {"k": 1}, "metadata": {"stats_format_version": "0.2.0", "extra": true}}')
    store, warning = open_with_one_warning(target, TrainingStatusVersionWarning)
    with store:
        assert str(warning) == version_message(target, "'0.2.0'", newer=False)
        assert warning.found_version == "0.2.0"
        store.set("a", "j", 2)
    written = json.loads(target.read_bytes())
    assert written["a"] == {"k": 1, "j": 2}
    assert written["metadata"] == {"stats_format_version": "0.3.0", "extra": True, "trainstatus_version": "0.1.0"}


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0", "2.1"])
def test_newer_format_warns_and_refuses_to_write(tmp_path: pathlib.Path, version: str) -> None:
    data = b'{"a": {"k": 1}, "metadata": {"stats_format_version": "%s", "new_field": [1]}}' % version.encode()
    target = write(tmp_path, data)
    before = os.stat(target)
    store, warning = open_with_one_warning(target, TrainingStatusVersionWarning)
    with store:
        assert str(warning) == version_message(target, repr(version), newer=True)
        assert warning.found_version == version
        assert store.get("a", "k") == 1
        with pytest.raises(TrainingStatusVersionError) as info:
            store.set("a", "k", 2)
        assert str(info.value) == (
            f"Refusing to write {target}: it has format version {version!r}, newer than the '0.3.0' "
            "this trainstatus writes, and rewriting it would drop what this version does not "
            "understand. Upgrade trainstatus, or open the store with allow_downgrade=True to rewrite "
            "it in format 0.3.0."
        )
        assert info.value.found_version == version
        assert info.value.path == str(target)
        assert store.get("a", "k") == 1  # memory unchanged
        with pytest.raises(TrainingStatusVersionError):
            store.save()
    assert target.read_bytes() == data
    after = os.stat(target)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_newer_format_with_allow_downgrade_writes(tmp_path: pathlib.Path, version: str) -> None:
    data = b'{"a": {"k": 1}, "metadata": {"stats_format_version": "%s", "new_field": [1]}}' % version.encode()
    target = write(tmp_path, data)
    store, warning = open_with_one_warning(target, TrainingStatusVersionWarning, allow_downgrade=True)
    with store:
        assert warning.found_version == version
        store.set("a", "k", 2)
    written = json.loads(target.read_bytes())
    assert written["a"] == {"k": 2}
    assert written["metadata"]["stats_format_version"] == "0.3.0"
    assert written["metadata"]["new_field"] == [1]


@pytest.mark.parametrize(
    ("version", "shown"),
    [("banana", "'banana'"), ("0.3.1", "'0.3.1'"), ("", "''"), (3, "3"), (None, "None")],
)
def test_other_versions_warn_and_are_writable(tmp_path: pathlib.Path, version: Any, shown: str) -> None:
    target = write(tmp_path, json.dumps({"a": {"k": 1}, "metadata": {"stats_format_version": version}}).encode())
    store, warning = open_with_one_warning(target, TrainingStatusVersionWarning)
    with store:
        assert str(warning) == version_message(target, shown, newer=False)
        assert warning.found_version == (None if version is None else str(version))
        store.set("a", "k", 2)
    assert json.loads(target.read_bytes())["metadata"]["stats_format_version"] == "0.3.0"


def test_registered_metadata_mismatch_names_both_values(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, MLAGENTS)
    store, warning = open_with_one_warning(
        target, TrainingStatusVersionWarning, metadata={"torch_version": "2.3.0", "mlagents_version": "1.1.0"}
    )
    with store:
        assert str(warning) == (
            f"{target} was written with torch_version='2.2.2' but this run has torch_version='2.3.0'; "
            "some things may not resume properly."
        )
        assert warning.path == str(target)
        store.set("wall_height", "lesson_num", 4)
    assert json.loads(target.read_bytes())["metadata"]["torch_version"] == "2.3.0"


def test_every_mismatching_field_warns(tmp_path: pathlib.Path) -> None:
    target = write(tmp_path, MLAGENTS)
    with pytest.warns(TrainingStatusVersionWarning) as record:
        StatusStore(target, metadata={"torch_version": "9", "mlagents_version": "0.1", "absent": 1}).close()
    assert sorted(str(w.message) for w in record) == sorted([
        f"{target} was written with torch_version='2.2.2' but this run has torch_version='9'; "
        "some things may not resume properly.",
        f"{target} was written with mlagents_version='1.1.0' but this run has mlagents_version='0.1'; "
        "some things may not resume properly.",
    ])
    assert {w.filename for w in record} == {__file__}


def test_matching_registered_metadata_is_silent(tmp_path: pathlib.Path) -> None:
    with open_quietly(write(tmp_path, MLAGENTS), metadata={"torch_version": "2.2.2", "new_field": "x"}) as store:
        assert store.get("metadata", "torch_version") == "2.2.2"
        assert store.get("metadata", "new_field") == "x"


def test_a_newer_format_with_a_new_layout_is_not_called_damaged(tmp_path: pathlib.Path) -> None:
    # A newer format may hold top-level entries that are not objects: they are skipped, never
    # kept aside as damage, and writing stays refused, so nothing of them is lost.
    original = json.dumps({"Walker": {"lesson_num": 2}, "sessions": ["a", "b"],
                           "metadata": {"stats_format_version": "1.0.0"}}).encode()
    target = write(tmp_path, original)
    with pytest.warns(TrainingStatusVersionWarning):
        store = StatusStore(target)
    assert store.get("Walker", "lesson_num") == 2
    with pytest.raises(TrainingStatusVersionError):
        store.set("Walker", "lesson_num", 3)
    assert target.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name] == []


def test_a_loaded_value_too_deep_for_json_to_write_back_is_damage_not_a_crash(tmp_path: pathlib.Path) -> None:
    depth = 990  # orjson reads it (limit 1024); Python's json cannot write it back
    original = ('{"a": {"k": ' + "[" * depth + "]" * depth + '}, "metadata": {"stats_format_version": "0.3.0"}}').encode()
    target = write(tmp_path, original)
    with pytest.warns(TrainingStatusCorruptWarning, match="nested too deeply"):
        store = StatusStore(target)
    assert store.to_dict() == {"metadata": store.to_dict()["metadata"]}
    kept = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(kept) == 1 and kept[0].read_bytes() == original
