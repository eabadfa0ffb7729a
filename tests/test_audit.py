"""Behaviours a mutation audit found no test for: each test here fails on the mutant named in it.

On a real ``tmp_path`` throughout: change detection, ownership and fsync order are properties of
a real filesystem.
"""

from __future__ import annotations

import errno
import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

import trainstatus
from trainstatus import StatusStore, TrainingStatusCorruptWarning, TrainingStatusWarning

METADATA = {"stats_format_version": "0.3.0"}


def write_json(path: Path, document: dict[str, Any]) -> None:
    """As ML-Agents writes its file: Python's json, which keeps every integer's digits."""
    with open(path, "w") as f:
        json.dump({**document, "metadata": METADATA}, f, indent=4)


# -- a same-size edit in place is seen (mutant: the change check ignores mtime) -------------------


def test_an_in_place_edit_of_the_same_size_survives_the_next_write(tmp_path: Path) -> None:
    # ML-Agents' save_state rewrites the file in place (open "w", json.dump): same inode, and a
    # lesson going from 1 to 7 keeps the size. Only the mtime tells.
    path = tmp_path / "status.json"
    with StatusStore(path) as store:
        store.set("wall_height", "lesson_num", 1)
        before = os.stat(path)
        data = path.read_bytes()
        assert data.count(b'"lesson_num": 1') == 1
        with open(path, "r+b") as f:  # in place: same inode, same size
            f.seek(data.index(b'"lesson_num": 1') + len(b'"lesson_num": '))
            f.write(b"7")
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
        edited = os.stat(path)
        assert (edited.st_ino, edited.st_size) == (before.st_ino, before.st_size)

        store.set("Walker", "elo", 1200.0)

        assert json.loads(path.read_bytes())["wall_height"] == {"lesson_num": 7}
        assert store.get("wall_height", "lesson_num") == 7
        assert store.get("Walker", "elo") == 1200.0


# -- integers just past 64 bits (mutant: the long-digit threshold raised from 19 to 21) ------------

# The shortest integers orjson reads as floats (19 and 20 digits), and those at the 64-bit bounds.
PAST_64_BITS = [2**64, -(2**63) - 1, -(2**64), 10**19 * 9 + 1, 99_999_999_999_999_999_999, -(10**19)]
AT_THE_BOUNDS = [2**63 - 1, -(2**63), 2**63, 2**64 - 1]


@pytest.mark.parametrize("value", PAST_64_BITS + AT_THE_BOUNDS)
def test_integers_near_64_bits_load_exactly_and_are_written_back_digit_for_digit(tmp_path: Path, value: int) -> None:
    assert len(str(abs(value))) in (19, 20)  # nothing longer: a 21-digit run is not what is tested
    path = tmp_path / "status.json"
    write_json(path, {"Walker": {"steps": value, "nested": [1, {"n": value}]}})
    with StatusStore(path) as store:
        got = store.get("Walker", "steps")
        assert type(got) is int and got == value
        assert store.get("Walker", "nested") == [1, {"n": value}]
        store.set("Walker", "elo", 1200.0)  # the file is rewritten from what was loaded
    data = path.read_bytes()
    assert data.count(str(value).encode()) == 2
    with StatusStore(path) as again:
        assert type(again.get("Walker", "steps")) is int
        assert again.get("Walker", "steps") == value
        assert again.get("Walker", "nested") == [1, {"n": value}]


# -- a root writer keeps another user's file theirs -----------------------------------------------


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can give a file another owner")
@pytest.mark.parametrize("when", ["before_open", "after_our_write"])
def test_rewriting_another_users_file_as_root_keeps_its_owner_and_group(tmp_path: Path, when: str) -> None:
    path = tmp_path / "status.json"
    write_json(path, {"Walker": {"elo": 1200.0}})
    if when == "before_open":
        os.chown(path, 1234, 5678)
    with StatusStore(path) as store:
        if when == "after_our_write":
            store.set("Walker", "elo", 1201.0)
            os.chown(path, 1234, 5678)
        inode = os.stat(path).st_ino
        store.set("Walker", "lesson_num", 2)
    st = os.stat(path)
    assert st.st_ino != inode  # a new file replaced the old one
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    assert json.loads(path.read_bytes())["Walker"]["lesson_num"] == 2


# -- the copy of a damaged file is synced before the original goes --------------------------------


def test_the_copy_of_a_damaged_file_is_fsynced_before_the_original_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b'{"Walker": {"elo": 12')  # truncated: damaged
    events: list[tuple[str, Any]] = []
    real_fsync, real_unlink = os.fsync, os.unlink

    def no_links(src: Any, dst: Any, *, follow_symlinks: bool = True) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), src)

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("fsync", (st.st_dev, st.st_ino)))
        real_fsync(fd)

    def unlink(target: Any, *args: Any, **kwargs: Any) -> None:
        events.append(("unlink", os.fspath(target)))
        real_unlink(target, *args, **kwargs)

    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.warns(TrainingStatusCorruptWarning) as record:
        store = StatusStore(path)
    store.close()
    aside = record[0].message.moved_to  # type: ignore[union-attr]
    assert aside is not None and Path(aside).read_bytes() == b'{"Walker": {"elo": 12'
    copy = os.stat(aside)
    fsync_of_copy, unlink_of_original = ("fsync", (copy.st_dev, copy.st_ino)), ("unlink", str(path))
    assert fsync_of_copy in events and unlink_of_original in events, events
    assert events.index(fsync_of_copy) < events.index(unlink_of_original), events


# -- one filter on the base warning class covers every warning ------------------------------------


def public_warning_classes() -> list[type[Warning]]:
    exported = [getattr(trainstatus, name) for name in trainstatus.__all__]
    return [obj for obj in exported if isinstance(obj, type) and issubclass(obj, Warning)]


def test_the_public_warning_classes_are_the_known_ones() -> None:
    names = sorted(cls.__name__ for cls in public_warning_classes())
    assert names == ["TrainingStatusCheckpointWarning", "TrainingStatusCorruptWarning", "TrainingStatusHistoryWarning", "TrainingStatusMissingWarning",
                     "TrainingStatusVersionWarning", "TrainingStatusWarning"]


@pytest.mark.parametrize("cls", public_warning_classes(), ids=lambda c: c.__name__)
def test_a_filter_on_the_base_warning_class_catches_every_public_warning(cls: type[Warning]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingStatusWarning)
        with pytest.raises(cls) as info:
            warnings.warn(cls("the message"))
        assert str(info.value) == "the message"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", TrainingStatusWarning)
        warnings.warn(cls("ignored"))
        warnings.warn(UserWarning("not ours"))  # the filter is not just ignoring everything
    assert [str(w.message) for w in caught] == ["not ours"]
