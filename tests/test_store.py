"""StatusStore's public API on a real filesystem: write-through, copies, names, layout, transactions."""

from __future__ import annotations

import enum
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import orjson
import pytest

import trainstatus
import trainstatus._storage.atomic
from trainstatus import (
    STATUS_FORMAT_VERSION,
    StatusStore,
    StatusType,
    TrainingStatusError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    __version__,
)

# -- helpers ---------------------------------------------------------------------------------


def read(path: Path) -> dict[str, Any]:
    """The status file as another reader sees it."""
    return json.loads(path.read_bytes())


def meta(**extra: Any) -> dict[str, Any]:
    """The metadata block this version writes, with caller fields after its own."""
    return {"stats_format_version": STATUS_FORMAT_VERSION, "trainstatus_version": __version__, **extra}


def file_id(path: Path) -> tuple[int, int, int, bytes]:
    st = path.stat()
    return (st.st_ino, st.st_mtime_ns, st.st_size, path.read_bytes())


def write_foreign(path: Path, document: dict[str, Any]) -> None:
    """Write a status file the way another program would (json, 4-space indent)."""
    path.write_text(json.dumps(document, indent=4))


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of the atomic write protocol, by target path."""
    calls: list[str] = []
    real = trainstatus._storage.atomic.write_atomic

    def counting(target: str, data: bytes, **kwargs: Any) -> Any:
        calls.append(target)
        return real(target, data, **kwargs)

    monkeypatch.setattr(trainstatus._storage.atomic, "write_atomic", counting)
    return calls


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "training_status.json"


class Behavior(enum.Enum):
    WALKER = "Walker"


class Key(enum.Enum):
    LESSON = "lesson_num"


class StrKey(enum.StrEnum):
    ELO = "elo"


class IntEnum(enum.Enum):
    ONE = 1


# -- opening ---------------------------------------------------------------------------------


def test_open_missing_file_is_silent_and_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "run" / "logs" / "training_status.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = StatusStore(target)
    assert store.path == str(target)
    assert store.get("Walker", "lesson_num") is None
    assert store.to_dict() == {"metadata": meta()}
    assert list(tmp_path.iterdir()) == []  # no directory, file or lock file created


# -- set writes through ----------------------------------------------------------------------


def test_set_writes_the_file_before_returning(tmp_path: Path) -> None:
    target = tmp_path / "run" / "training_status.json"
    store = StatusStore(target)
    store.set("Walker", "lesson_num", 1)
    assert read(target) == {"Walker": {"lesson_num": 1}, "metadata": meta()}
    store.set("Walker", "elo", 1200.5)
    assert read(target)["Walker"] == {"lesson_num": 1, "elo": 1200.5}
    store.set("Walker", "lesson_num", 2)
    assert read(target)["Walker"] == {"lesson_num": 2, "elo": 1200.5}
    store.set("Crawler", "checkpoints", [{"steps": 10}])
    assert read(target) == {
        "Walker": {"lesson_num": 2, "elo": 1200.5},
        "Crawler": {"checkpoints": [{"steps": 10}]},
        "metadata": meta(),
    }


def test_set_is_visible_to_another_process_when_it_returns(path: Path) -> None:
    store = StatusStore(path)
    store.set("Walker", "checkpoints", [{"steps": 500, "file_path": "a.onnx"}])
    code = "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))['Walker']))"
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                            timeout=60, check=True)
    assert json.loads(result.stdout) == {"checkpoints": [{"steps": 500, "file_path": "a.onnx"}]}


# -- get -------------------------------------------------------------------------------------


def test_get_returns_copies(path: Path) -> None:
    store = StatusStore(path)
    store.set("Walker", "checkpoints", [{"steps": 1, "paths": ["a"]}])
    store.set("Walker", "final_checkpoint", {"steps": 2, "paths": ["b"]})
    on_disk = path.read_bytes()

    got = store.get("Walker", "checkpoints")
    got.append({"steps": 99})
    got[0]["paths"].append("mutated")
    final = store.get("Walker", "final_checkpoint")
    final["steps"] = -1
    final["paths"].clear()
    store.to_dict()["Walker"]["checkpoints"].clear()

    assert store.get("Walker", "checkpoints") == [{"steps": 1, "paths": ["a"]}]
    assert store.get("Walker", "final_checkpoint") == {"steps": 2, "paths": ["b"]}
    assert store.get("Walker", "checkpoints") is not store.get("Walker", "checkpoints")
    assert path.read_bytes() == on_disk


def test_set_keeps_the_value_as_it_was_when_set(path: Path) -> None:
    store = StatusStore(path)
    value = {"steps": [1, 2]}
    store.set("Walker", "elo", value)
    value["steps"].append(3)
    assert store.get("Walker", "elo") == {"steps": [1, 2]}
    assert read(path)["Walker"]["elo"] == {"steps": [1, 2]}


def test_get_never_creates_entries(path: Path, writes: list[str]) -> None:
    store = StatusStore(path)
    assert store.get("Walker", "lesson_num") is None
    assert store.get("Walker", "lesson_num", 7) == 7
    assert store.to_dict() == {"metadata": meta()}
    assert writes == [] and not path.exists()

    store.set("Crawler", "elo", 1.0)
    assert store.get("Walker", "elo") is None
    assert store.get("Crawler", "missing") is None
    assert store.to_dict() == {"Crawler": {"elo": 1.0}, "metadata": meta()}
    store.set("Crawler", "lesson_num", 3)
    assert read(path) == {"Crawler": {"elo": 1.0, "lesson_num": 3}, "metadata": meta()}


def test_get_default_values(path: Path) -> None:
    store = StatusStore(path)
    sentinel: list[int] = []
    assert store.get("a", "b") is None
    assert store.get("a", "b", sentinel) is sentinel
    store.set("a", "b", None)
    assert store.get("a", "b", "default") is None  # a stored None is a value, not a miss
    store.set("a", "c", 0)
    assert store.get("a", "c", 5) == 0


# -- names -----------------------------------------------------------------------------------


def test_enum_names_store_their_value(path: Path) -> None:
    store = StatusStore(path)
    store.set(Behavior.WALKER, Key.LESSON, 3)
    store.set(Behavior.WALKER, StrKey.ELO, 1500.0)
    store.set("Walker", StatusType.CHECKPOINTS, [])
    assert read(path)["Walker"] == {"lesson_num": 3, "elo": 1500.0, "checkpoints": []}
    assert store.get("Walker", "lesson_num") == 3
    assert store.get(Behavior.WALKER, "elo") == 1500.0
    assert store.get("Walker", StatusType.CHECKPOINTS) == []
    assert store.delete(Behavior.WALKER, StrKey.ELO) is True
    assert "elo" not in read(path)["Walker"]


@pytest.mark.parametrize("where", ["category", "key"])
def test_enum_with_non_str_value_is_refused(path: Path, where: str, writes: list[str]) -> None:
    store = StatusStore(path)
    args = (IntEnum.ONE, "k") if where == "category" else ("c", IntEnum.ONE)
    with pytest.raises(TrainingStatusTypeError) as info:
        store.set(*args, 1)
    assert isinstance(info.value, TypeError)
    assert str(info.value) == (
        f"A {where} must be a str or an Enum whose value is a str; the Enum member {IntEnum.ONE!r} "
        f"has the value 1 (int), in {path}. Use its .name, or an Enum with str values."
    )
    assert info.value.path == str(path)
    with pytest.raises(TrainingStatusTypeError):
        store.get(*args)
    with pytest.raises(TrainingStatusTypeError):
        store.delete(*args)
    with pytest.raises(TrainingStatusTypeError):
        store.set(3, "k", 1)  # type: ignore[arg-type]
    assert writes == [] and not path.exists()
    assert store.to_dict() == {"metadata": meta()}


@pytest.mark.parametrize("category", ["metadata", StatusType.STATS_METADATA])
def test_metadata_category_is_reserved_for_changes_but_readable(path: Path, category: Any, writes: list[str]) -> None:
    store = StatusStore(path, metadata={"torch_version": "2.1"})
    store.set("Walker", "elo", 1.0)
    before = file_id(path)
    expected = (
        f"Cannot change metadata/stats_format_version in {path}: the category 'metadata' is "
        "reserved for the metadata block. Pass metadata={...} when opening the store to add "
        "fields to it."
    )
    for action in (lambda: store.set(category, "stats_format_version", "9.9.9"),
                   lambda: store.delete(category, "stats_format_version")):
        with pytest.raises(TrainingStatusValueError) as info:
            action()
        assert str(info.value) == expected
        assert isinstance(info.value, ValueError)
        assert (info.value.path, info.value.category, info.value.key) == (str(path), "metadata", "stats_format_version")
    with pytest.raises(TrainingStatusValueError):
        with store.transaction():
            store.set(category, "torch_version", "x")
    assert len(writes) == 1 and file_id(path) == before
    assert store.get(category, "stats_format_version") == STATUS_FORMAT_VERSION
    assert store.get("metadata", "trainstatus_version") == __version__
    assert store.get("metadata", "torch_version") == "2.1"
    assert store.get("metadata", "missing", "d") == "d"


# -- delete and clear ------------------------------------------------------------------------


def test_delete_reports_whether_it_removed_something(path: Path, writes: list[str]) -> None:
    store = StatusStore(path)
    store.set("Walker", "elo", 1.0)
    store.set("Walker", "lesson_num", 2)
    assert store.delete("Walker", "elo") is True
    assert read(path) == {"Walker": {"lesson_num": 2}, "metadata": meta()}
    assert store.get("Walker", "elo") is None
    count, before = len(writes), file_id(path)
    assert store.delete("Walker", "elo") is False
    assert store.delete("Crawler", "elo") is False
    assert len(writes) == count
    assert file_id(path) == before


def test_delete_of_absent_key_on_missing_file_writes_nothing(path: Path, writes: list[str]) -> None:
    store = StatusStore(path)
    assert store.delete("Walker", "elo") is False
    assert writes == [] and not path.exists()


def test_deleting_the_last_key_removes_the_category(path: Path) -> None:
    store = StatusStore(path)
    store.set("Walker", "elo", 1.0)
    store.set("Crawler", "elo", 2.0)
    assert store.delete("Walker", "elo") is True
    assert read(path) == {"Crawler": {"elo": 2.0}, "metadata": meta()}
    assert "Walker" not in store.to_dict()
    store.set("Walker", "elo", 3.0)  # comes back at the end
    assert list(read(path)) == ["Crawler", "Walker", "metadata"]


def test_an_empty_category_from_the_file_is_kept_on_rewrite(path: Path) -> None:
    write_foreign(path, {"Empty": {}, "Walker": {"elo": 1.0, "lesson_num": 1}, "Later": {"x": 1},
                         "metadata": meta()})
    store = StatusStore(path)
    store.set("Walker", "lesson_num", 2)
    doc = read(path)
    assert doc == {"Empty": {}, "Walker": {"elo": 1.0, "lesson_num": 2}, "Later": {"x": 1}, "metadata": meta()}
    assert list(doc) == ["Empty", "Walker", "Later", "metadata"]
    assert store.delete("Walker", "elo") is True
    assert read(path)["Empty"] == {}
    assert store.get("Empty", "anything") is None
    assert store.to_dict()["Empty"] == {}


def test_clear_removes_every_category_in_one_write(path: Path, writes: list[str]) -> None:
    store = StatusStore(path, metadata={"mlagents_version": "1.0"})
    store.set("Walker", "elo", 1.0)
    store.set("Crawler", "lesson_num", 2)
    count = len(writes)
    store.clear()
    assert len(writes) == count + 1
    assert read(path) == {"metadata": meta(mlagents_version="1.0")}
    assert store.to_dict() == {"metadata": meta(mlagents_version="1.0")}
    assert store.get("Walker", "elo") is None


def test_clear_drops_categories_written_by_another_store(path: Path) -> None:
    mine, other = StatusStore(path), StatusStore(path)
    mine.set("Walker", "elo", 1.0)
    other.set("Crawler", "elo", 2.0)
    mine.clear()
    assert read(path) == {"metadata": meta()}


# -- to_dict and layout ----------------------------------------------------------------------


def test_to_dict_is_a_copy_with_metadata_last(path: Path) -> None:
    store = StatusStore(path, metadata={"torch_version": "2.1"})
    store.set("Walker", "checkpoints", [1, 2])
    store.set("Crawler", "elo", 3.0)
    result = store.to_dict()
    assert result == {"Walker": {"checkpoints": [1, 2]}, "Crawler": {"elo": 3.0},
                      "metadata": meta(torch_version="2.1")}
    assert list(result) == ["Walker", "Crawler", "metadata"]
    assert list(result["metadata"]) == ["stats_format_version", "trainstatus_version", "torch_version"]
    result["Walker"]["checkpoints"].append(3)
    result["Walker"]["new"] = 1
    result["metadata"]["torch_version"] = "mutated"
    del result["Crawler"]
    assert store.to_dict() == {"Walker": {"checkpoints": [1, 2]}, "Crawler": {"elo": 3.0},
                               "metadata": meta(torch_version="2.1")}
    assert store.get("metadata", "torch_version") == "2.1"


def _same_sets(store: StatusStore) -> None:
    store.set("Walker", "lesson_num", 1)
    store.set("Crawler", "checkpoints", [{"steps": 5, "reward": 1.5, "paths": ["a", "b"]}])
    store.set("Walker", "elo", 1200.0)
    store.set("Walker", "lesson_num", 2)
    store.set("Empty-ish", "nested", {"a": {"b": [1, {"c": None}]}, "t": True, "s": "é\n"})
    store.delete("Crawler", "nothing")


def test_two_stores_doing_the_same_sets_write_identical_files(tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "status.json", tmp_path / "b" / "status.json"
    _same_sets(StatusStore(first, metadata={"torch_version": "2.1"}))
    _same_sets(StatusStore(second, metadata={"torch_version": "2.1"}))
    data = first.read_bytes()
    assert data == second.read_bytes()
    # The documented layout: orjson's 2-space indent of the whole document, plus a newline.
    assert data == orjson.dumps(json.loads(data), option=orjson.OPT_INDENT_2) + b"\n"
    assert list(json.loads(data)) == ["Walker", "Crawler", "Empty-ish", "metadata"]


def test_category_order_is_kept_across_rewrites_and_reopens(path: Path) -> None:
    store = StatusStore(path)
    for category in ("b", "a", "c"):
        store.set(category, "k", 0)
    store.set("a", "k", 1)
    store.set("b", "k2", 2)
    assert list(read(path)) == ["b", "a", "c", "metadata"]
    assert list(read(path)["b"]) == ["k", "k2"]
    reopened = StatusStore(path)
    reopened.set("c", "k", 3)
    reopened.set("0", "k", 4)
    assert list(read(path)) == ["b", "a", "c", "0", "metadata"]
    assert list(reopened.to_dict()) == ["b", "a", "c", "0", "metadata"]


def test_a_loaded_file_keeps_foreign_metadata_fields(path: Path) -> None:
    write_foreign(path, {"Walker": {"elo": 1.0},
                         "metadata": {"stats_format_version": STATUS_FORMAT_VERSION, "mlagents_version": "0.30"}})
    store = StatusStore(path, metadata={"torch_version": "2.1"})
    store.set("Walker", "elo", 2.0)
    doc = read(path)
    assert doc["metadata"] == {"stats_format_version": STATUS_FORMAT_VERSION, "mlagents_version": "0.30",
                               "trainstatus_version": __version__, "torch_version": "2.1"}
    assert list(doc) == ["Walker", "metadata"]
    store.clear()  # starts the document over: only this store's own metadata stays
    assert read(path) == {"metadata": meta(torch_version="2.1")}


# -- transactions ----------------------------------------------------------------------------


def test_transaction_writes_once(path: Path, writes: list[str]) -> None:
    store = StatusStore(path)
    with store.transaction() as same:
        assert same is store
        for i in range(10):
            store.set("Walker", f"k{i}", i)
        store.delete("Walker", "k0")
        assert writes == [] and not path.exists()
    assert writes == [os.path.realpath(path)]
    assert read(path)["Walker"] == {f"k{i}": i for i in range(1, 10)}


def test_transaction_that_changes_nothing_writes_nothing(path: Path, writes: list[str]) -> None:
    store = StatusStore(path)
    with store.transaction():
        store.get("Walker", "elo")
    assert writes == [] and not path.exists()


def test_exception_in_transaction_writes_nothing_and_keeps_memory(path: Path, writes: list[str]) -> None:
    store = StatusStore(path)
    store.set("Walker", "elo", 1.0)
    store.set("Walker", "lesson_num", 1)
    count, before, memory = len(writes), file_id(path), store.to_dict()

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with store.transaction():
            store.set("Walker", "elo", 2.0)
            store.set("Crawler", "elo", 3.0)
            assert store.delete("Walker", "lesson_num") is True
            assert store.get("Walker", "elo") == 2.0
            raise Boom
    assert len(writes) == count and file_id(path) == before
    assert store.get("Walker", "elo") == 1.0
    assert store.get("Walker", "lesson_num") == 1
    assert store.get("Crawler", "elo") is None
    assert store.to_dict() == memory
    store.set("Other", "k", 1)  # the aborted changes do not ride along with the next write
    assert read(path) == {"Walker": {"elo": 1.0, "lesson_num": 1}, "Other": {"k": 1}, "metadata": meta()}


def test_nested_transaction_rolls_back_only_the_inner_changes(path: Path, writes: list[str]) -> None:
    store = StatusStore(path)
    store.set("c", "kept", "old")
    count = len(writes)
    with store.transaction():
        store.set("c", "outer", 1)
        store.set("c", "kept", "outer")
        with pytest.raises(KeyError):
            with store.transaction():
                store.set("c", "inner", 2)
                store.set("c", "kept", "inner")
                store.delete("c", "outer")
                assert store.get("c", "outer") is None
                raise KeyError("inner fails")
        assert store.get("c", "inner") is None
        assert store.get("c", "kept") == "outer"
        assert store.get("c", "outer") == 1
        with store.transaction():  # a successful inner one joins the outer write
            store.set("c", "inner_ok", 3)
        assert len(writes) == count
        store.set("c", "after", 4)
    assert len(writes) == count + 1
    assert read(path)["c"] == {"kept": "outer", "outer": 1, "inner_ok": 3, "after": 4}


def test_transaction_is_read_committed_and_blocks_other_threads(path: Path) -> None:
    store = StatusStore(path, durable=False)
    store.set("c", "k", "old")
    seen: dict[str, Any] = {}
    errors: list[BaseException] = []
    reading, done = threading.Event(), threading.Event()

    def other_thread() -> None:
        try:
            seen["get"] = store.get("c", "k")
            seen["new"] = store.get("c", "new")
            seen["to_dict"] = store.to_dict()["c"]
            reading.set()
            store.set("c", "k", "thread")
            done.set()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            reading.set()

    thread = threading.Thread(target=other_thread, daemon=True)
    with store.transaction():
        store.set("c", "k", "pending")
        store.set("c", "new", 1)
        assert store.get("c", "k") == "pending"
        assert store.to_dict()["c"] == {"k": "pending", "new": 1}
        thread.start()
        assert reading.wait(10)
        assert not errors
        assert seen == {"get": "old", "new": None, "to_dict": {"k": "old"}}
        assert not done.wait(0.3), "another thread's set got in during the transaction"
        assert read(path)["c"] == {"k": "old"}
    thread.join(20)
    assert not thread.is_alive()
    assert not errors and done.is_set()
    assert read(path)["c"] == {"k": "thread", "new": 1}
    assert store.get("c", "k") == "thread"


def test_unencodable_value_in_transaction_raises_at_set_and_does_not_poison_it(path: Path) -> None:
    store = StatusStore(path)
    with store.transaction():
        store.set("c", "a", 1)
        with pytest.raises(TrainingStatusTypeError) as info:
            store.set("c", "b", {1, 2})
        assert (info.value.category, info.value.key) == ("c", "b")
        with pytest.raises(TrainingStatusValueError):
            store.set("c", "big", 2**64)
        assert store.get("c", "b") is None
        store.set("c", "d", 3)
    assert read(path)["c"] == {"a": 1, "d": 3}
    assert store.get("c", "b") is None


def test_unencodable_value_outside_transaction_changes_nothing(path: Path, writes: list[str]) -> None:
    store = StatusStore(path)
    store.set("c", "a", 1)
    before = file_id(path)
    with pytest.raises(TrainingStatusTypeError):
        store.set("c", "a", object())
    with pytest.raises(TrainingStatusTypeError):
        store.set("c", "new", b"bytes")
    assert len(writes) == 1 and file_id(path) == before
    assert store.get("c", "a") == 1 and store.get("c", "new") is None


# -- save, reload, close ---------------------------------------------------------------------


def test_save_creates_a_missing_file_with_metadata_only(tmp_path: Path, writes: list[str]) -> None:
    target = tmp_path / "new" / "status.json"
    store = StatusStore(target, metadata={"torch_version": "2.1"})
    store.save()
    assert read(target) == {"metadata": meta(torch_version="2.1")}
    assert len(writes) == 1
    store.save()  # forces a write even when nothing changed
    assert len(writes) == 2
    with store.transaction():
        store.save()
        assert len(writes) == 2
    assert len(writes) == 3


def test_reload_picks_up_another_stores_writes(path: Path, writes: list[str]) -> None:
    mine, other = StatusStore(path), StatusStore(path)
    mine.set("Walker", "elo", 1.0)
    other.set("Crawler", "elo", 2.0)
    other.set("Walker", "elo", 1.5)
    count = len(writes)
    assert mine.get("Crawler", "elo") is None  # memory only until reload/write/transaction
    mine.reload()
    assert len(writes) == count  # reload never writes
    assert mine.get("Crawler", "elo") == 2.0
    assert mine.get("Walker", "elo") == 1.5
    mine.reload()  # unchanged file: nothing to do
    assert mine.to_dict() == other.to_dict()


def test_transaction_picks_up_another_stores_writes_first(path: Path) -> None:
    mine, other = StatusStore(path), StatusStore(path)
    mine.set("c", "count", 1)
    other.set("c", "count", 5)
    with mine.transaction():
        assert mine.get("c", "count") == 5
        mine.set("c", "count", mine.get("c", "count") + 1)
    assert read(path)["c"]["count"] == 6


def test_close_then_writes_raise_and_get_still_works(path: Path, writes: list[str]) -> None:
    store = StatusStore(path)
    store.set("Walker", "elo", 1.0)
    store.close()
    message = f"The store on {path} is closed; open a new StatusStore to change it."
    for action in (lambda: store.set("Walker", "elo", 2.0), lambda: store.delete("Walker", "elo"),
                   store.clear, store.save):
        with pytest.raises(TrainingStatusError) as info:
            action()
        assert str(info.value) == message
        assert info.value.path == str(path)
    with pytest.raises(TrainingStatusError, match="is closed"):
        with store.transaction():
            pass  # pragma: no cover
    assert len(writes) == 1
    assert store.get("Walker", "elo") == 1.0
    assert store.to_dict()["Walker"] == {"elo": 1.0}
    assert read(path)["Walker"] == {"elo": 1.0}


def test_context_manager_closes_the_store(path: Path) -> None:
    with StatusStore(path) as store:
        assert isinstance(store, StatusStore)
        store.set("Walker", "elo", 1.0)
    assert read(path)["Walker"] == {"elo": 1.0}
    with pytest.raises(TrainingStatusError, match="is closed"):
        store.set("Walker", "elo", 2.0)
    assert store.get("Walker", "elo") == 1.0


# -- metadata= -------------------------------------------------------------------------------


def test_metadata_option_is_written_and_own_fields_are_refused(path: Path) -> None:
    store = StatusStore(path, metadata={"torch_version": "x", "mlagents_version": "1.1"})
    store.set("Walker", "elo", 1.0)
    doc = read(path)
    assert doc["metadata"] == meta(torch_version="x", mlagents_version="1.1")
    assert list(doc["metadata"]) == ["stats_format_version", "trainstatus_version", "torch_version",
                                     "mlagents_version"]
    for field in ("stats_format_version", "trainstatus_version"):
        with pytest.raises(TrainingStatusValueError) as info:
            StatusStore(path, metadata={field: "1.0"})
        assert str(info.value) == (
            f"The metadata field {field!r} is written by trainstatus itself and cannot be given for "
            f"{path}; leave it out of metadata=."
        )
        assert (info.value.category, info.value.key) == ("metadata", field)
    assert read(path) == doc


# -- found in review -----------------------------------------------------------------------------


def test_clear_removes_empty_categories_too(tmp_path: Path) -> None:
    # ML-Agents' defaultdict leaves empty categories in its files; clear() starts over from {}.
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"Walker": {}, "wall": {"lesson_num": 3},
                                "metadata": {"stats_format_version": "0.3.0", "mlagents_version": "1.1.0"}}))
    store = StatusStore(path)
    with store.transaction():
        store.clear()
        assert store.to_dict()["metadata"] == {"stats_format_version": "0.3.0", "trainstatus_version": trainstatus.__version__}
        assert store.get("wall", "lesson_num") is None
        store.set("wall", "lesson_num", 0)
    assert read(path) == {"wall": {"lesson_num": 0},
                          "metadata": {"stats_format_version": "0.3.0", "trainstatus_version": trainstatus.__version__}}


def test_clear_rolled_back_with_its_transaction(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.set("wall", "lesson_num", 3)
    before = path.read_bytes()
    with pytest.raises(RuntimeError), store.transaction():
        store.clear()
        raise RuntimeError
    assert store.get("wall", "lesson_num") == 3
    assert path.read_bytes() == before


def test_an_interrupt_around_the_rename_never_brings_an_old_value_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.set("w", "lesson", 1)
    real = trainstatus._storage.atomic.write_atomic

    def replaced_then_interrupted(*args: Any, **kwargs: Any) -> Any:
        fd, _ = real(*args, **kwargs)
        os.close(fd)
        raise KeyboardInterrupt  # after the rename, before the store learns of it

    monkeypatch.setattr(trainstatus._storage.atomic, "write_atomic", replaced_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.set("w", "lesson", 2)
    monkeypatch.undo()
    assert read(path)["w"] == {"lesson": 2}
    store.set("w", "other", 9)  # must not write lesson 1 back
    assert read(path)["w"] == {"lesson": 2, "other": 9}
    assert store.get("w", "lesson") == 2


def test_close_inside_a_transaction_is_refused(tmp_path: Path) -> None:
    store = StatusStore(tmp_path / "status.json")
    with store.transaction():
        store.set("a", "k", 1)
        with pytest.raises(TrainingStatusError) as info:
            store.close()
    assert str(info.value) == (
        f"Cannot close the store on {tmp_path / 'status.json'} inside its transaction; close it "
        "after the with block."
    )
    assert read(tmp_path / "status.json")["a"] == {"k": 1}
    store.close()


def test_a_name_with_a_lone_surrogate_in_a_loaded_file_does_not_block_writes(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"beh\udc80": {"lesson_num": 1}, "metadata": {"stats_format_version": "0.3.0"}}))
    store = StatusStore(path)
    store.set("other", "k", 2)
    assert json.loads(path.read_text()) == {
        "beh\udc80": {"lesson_num": 1}, "other": {"k": 2},
        "metadata": {"stats_format_version": "0.3.0", "trainstatus_version": trainstatus.__version__},
    }
