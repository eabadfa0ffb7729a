"""Status files whose names leave no room for ``.lock``, temp or kept-aside suffixes (222-255 bytes).

Every kind of name beside the status file is made by one rule (``trainstatus._storage.filenames``); these tests
run the real store, the real lock across processes and the command line on such names, on a real
directory of this machine's filesystem, whose limit is 255 bytes per name.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from _helpers import lock_held_by_another_process, read_fresh, soft_holder

from trainstatus import StatusStore, TrainingStatusCorruptWarning, TrainingStatusLockTimeout, TrainingStatusReadError
from trainstatus._storage import atomic as _atomic, filenames as _names
from trainstatus._cli import base as _cli, main as _cli_main

# Byte lengths around the edge: the plain names fit up to 221 (temp: +34), 230 (copy), 246 (lease),
# 250 (lock); 255 is the longest name a status file can have.
SIZES = [200, 221, 222, 230, 231, 246, 247, 250, 251, 254, 255]


def named(directory: Path, size: int, char: str = "a") -> Path:
    """A path in ``directory`` whose name has ``size`` bytes and ends in .json."""
    unit = len(char.encode())
    body = char * ((size - 5) // unit)
    body += "b" * (size - 5 - len(body.encode()))
    path = directory / (body + ".json")
    assert len(os.fsencode(path.name)) == size
    return path


def sizes_of(directory: Path) -> dict[str, int]:
    return {entry: len(os.fsencode(entry)) for entry in os.listdir(directory)}


def test_names_that_fit_are_the_plain_ones() -> None:
    name = "training_status.json"
    assert _names.lock_name(name) == "training_status.json.lock"
    assert _names.lease_name(name) == "training_status.json.softlock"
    assert _names.temp_name(name, "0123456789abcdef") == ".training_status.json.trainstatus-0123456789abcdef.tmp"
    assert _names.copy_stem(name) == name
    match = _names.copy_pattern(name).fullmatch("training_status.json.corrupt-20250101T120000.000000Z-3")
    assert match is not None and match.groups() == ("20250101T120000.000000Z", "3")
    assert _names.temp_pattern(name).fullmatch(".training_status.json.trainstatus-0123456789abcdef.tmp")


@pytest.mark.parametrize("char", ["a", "é", "状", "\U0001f600"], ids=["ascii", "2-byte", "3-byte", "4-byte"])
@pytest.mark.parametrize("size", SIZES)
def test_every_name_fits_is_never_cut_inside_a_character_and_is_the_same_each_time(size: int, char: str) -> None:
    unit = len(char.encode())
    body = char * ((size - 5) // unit)
    name = body + "b" * (size - 5 - len(body.encode())) + ".json"
    tail = ".corrupt-20250101T120000.000000Z-9999999"  # the longest copy suffix kept room for
    made = {  # kind: (made name, the plain name, what follows the stem)
        "lock": (_names.lock_name(name), name + ".lock", ".lock"),
        "lease": (_names.lease_name(name), name + ".softlock", ".softlock"),
        "temp": (_names.temp_name(name, "f" * 16), "." + name + ".trainstatus-" + "f" * 16 + ".tmp",
                 ".trainstatus-" + "f" * 16 + ".tmp"),
        "copy": (_names.copy_stem(name) + tail, name + tail, tail),
        "history": (_names.history_name(name, 10**12 - 1), "." + name + ".history-" + "9" * 12, ".history-" + "9" * 12),
    }
    for kind, (made_name, plain, suffix) in made.items():
        encoded = made_name.encode("utf-8")  # strict: a character cut in two would not encode
        assert len(encoded) <= _names.NAME_MAX, (kind, len(encoded))
        if len(plain.encode()) <= _names.NAME_MAX:
            assert made_name == plain, kind
            continue
        # Cut: the longest whole-character prefix that fits, then ~ and 12 hex digits.
        stem = made_name.removesuffix(suffix).lstrip(".")
        kept, digest = stem[:-13], stem[-13:]
        assert re.fullmatch("~[0-9a-f]{12}", digest) and name.startswith(kept), (kind, made_name)
        assert len((made_name + name[len(kept)]).encode()) > _names.NAME_MAX, (kind, "cut more than needed")
    assert _names.lock_name(name) == made["lock"][0] and _names.temp_pattern(name).fullmatch(made["temp"][0])
    assert _names.copy_pattern(name).fullmatch(made["copy"][0])
    assert _names.history_pattern(name).fullmatch(made["history"][0])


def test_two_long_names_that_differ_only_at_the_end_get_different_names() -> None:
    first, second = "a" * 249 + "1.json", "a" * 249 + "2.json"
    assert _names.lock_name(first) != _names.lock_name(second)
    assert _names.lease_name(first) != _names.lease_name(second)
    assert _names.copy_stem(first) != _names.copy_stem(second)
    assert not _names.temp_pattern(first).fullmatch(_names.temp_name(second, "0" * 16))
    assert not _names.copy_pattern(first).fullmatch(_names.copy_stem(second) + ".corrupt-20250101T120000.000000Z")


def test_a_cut_name_is_the_same_in_another_process() -> None:
    # The lock works across processes only if every process makes the same name: no hash seed,
    # no filesystem query, no time in it.
    name = "状" * 82 + ".json"
    code = "import sys; from trainstatus._storage import filenames as _names; n = sys.argv[1]; print(_names.lock_name(n), _names.lease_name(n), _names.copy_stem(n))"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == [_names.lock_name(name), _names.lease_name(name), _names.copy_stem(name)]


# Written out once from the rule (SHA-256 of the name's bytes, 12 hex digits, after "~"), never
# computed here: a release that changed the digest, its length or where the name is cut would give
# a long name another lock than the release before, and two trainers, one upgraded, would both
# write. These literals are what every version must keep producing.
LONG_ASCII = "a" * 250 + ".json"  # 255 bytes
LONG_ACCENTED = "run-\u00e9" * 41 + ".json"  # 251 bytes; é is two, so a cut can fall inside it
GOLDEN = {
    LONG_ASCII: {
        "lock": "a" * 237 + "~adf1a17dde5c.lock",
        "lease": "a" * 233 + "~adf1a17dde5c.softlock",
        "copy": "a" * 202 + "~adf1a17dde5c",
        "temp": "." + "a" * 208 + "~adf1a17dde5c.trainstatus-0123456789abcdef.tmp",
        "history": "." + "a" * 220 + "~adf1a17dde5c.history-00000007",
    },
    LONG_ACCENTED: {
        "lock": "run-\u00e9" * 39 + "run~35149f29f74a.lock",
        "lease": "run-\u00e9" * 38 + "run-~35149f29f74a.softlock",  # é would pass the 255 bytes
        "copy": "run-\u00e9" * 33 + "run-~35149f29f74a",
        "temp": "." + "run-\u00e9" * 34 + "run-~35149f29f74a.trainstatus-0123456789abcdef.tmp",
        "history": "." + "run-\u00e9" * 36 + "run-~35149f29f74a.history-00000007",
    },
}


@pytest.mark.parametrize("name", list(GOLDEN), ids=["ascii", "accented"])
def test_the_names_of_a_long_name_are_pinned(name: str) -> None:
    golden = GOLDEN[name]
    assert _names.lock_name(name) == golden["lock"]
    assert _names.lease_name(name) == golden["lease"]
    assert _names.copy_stem(name) == golden["copy"]
    assert _names.temp_name(name, "0123456789abcdef") == golden["temp"]
    assert _names.history_name(name, 7) == golden["history"]
    for made in golden.values():
        assert len(os.fsencode(made)) <= _names.NAME_MAX


def test_a_store_on_a_long_name_locks_the_pinned_lock_file(tmp_path: Path) -> None:
    with StatusStore(tmp_path / LONG_ACCENTED, durable=False) as store:
        store.set("b", "n", 1)
    assert (tmp_path / GOLDEN[LONG_ACCENTED]["lock"]).exists()
    assert sorted(os.listdir(tmp_path)) == sorted([LONG_ACCENTED, GOLDEN[LONG_ACCENTED]["lock"]])


@pytest.mark.parametrize("size", SIZES)
def test_a_store_writes_merges_and_locks_a_file_with_a_long_name(tmp_path: Path, size: int) -> None:
    path = named(tmp_path, size)
    with StatusStore(path) as store, StatusStore(path) as other:
        store.set("Walker", "lesson", 1)
        other.set("Walker", "elo", 1200.5)  # merges the first store's change from the file
        with store.transaction():
            store.set("Walker", "lesson", 2)
    assert read_fresh(path)["Walker"] == {"lesson": 2, "elo": 1200.5}
    assert json.loads(path.read_bytes())["Walker"]["lesson"] == 2
    lock = tmp_path / _names.lock_name(path.name)
    assert lock.exists() and all(n <= _names.NAME_MAX for n in sizes_of(tmp_path).values())
    history = _names.history_pattern(path.name)
    kept = sorted(n for n in os.listdir(tmp_path) if history.fullmatch(n))
    assert kept == [_names.history_name(path.name, n) for n in (1, 2)]  # the versions replaced
    assert sorted(set(os.listdir(tmp_path)) - set(kept)) == sorted([path.name, lock.name])  # no temp file left


@pytest.mark.parametrize("size", [222, 250, 255])
def test_the_lock_of_a_long_name_excludes_another_process(tmp_path: Path, size: int) -> None:
    path = named(tmp_path, size)
    StatusStore(path).close()
    with lock_held_by_another_process(tmp_path / _names.lock_name(path.name)):
        with StatusStore(path, lock_timeout=0.2) as store, pytest.raises(TrainingStatusLockTimeout) as caught:
            store.set("Walker", "lesson", 1)
    assert caught.value.lock_file == str(tmp_path / _names.lock_name(path.name))
    with StatusStore(path) as store:
        store.set("Walker", "lesson", 1)
    assert read_fresh(path)["Walker"] == {"lesson": 1}


@pytest.mark.parametrize("size", [247, 255])
def test_the_soft_lease_of_a_long_name_excludes_another_process(tmp_path: Path, size: int) -> None:
    path = named(tmp_path, size)
    StatusStore(path).close()
    with soft_holder(path, remote=True):  # a writer on another machine: it holds the lease alone
        lease = tmp_path / _names.lease_name(path.name)
        assert lease.exists() and len(os.fsencode(lease.name)) <= _names.NAME_MAX
        with StatusStore(path, lock="soft", lock_timeout=0.2) as store, pytest.raises(TrainingStatusLockTimeout) as caught:
            store.set("Walker", "lesson", 1)
        assert caught.value.lock_file == str(lease)
    with StatusStore(path, lock="soft") as store:
        store.set("Walker", "lesson", 1)
    assert json.loads(path.read_bytes())["Walker"] == {"lesson": 1}


@pytest.mark.parametrize("size", [230, 231, 255])
def test_a_damaged_file_with_a_long_name_is_kept_aside_and_listed_and_restored(
    tmp_path: Path, size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = named(tmp_path, size)
    good = b'{"Walker": {"lesson": 3}, "metadata": {"stats_format_version": "0.3.0"}}'
    path.write_bytes(good)
    copies = []
    for _ in range(2):  # the second copy in the same microsecond or not: both kept, both fit
        path.write_bytes(b'{"Walker": ')
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            StatusStore(path).close()
        moved = [w.message for w in caught if isinstance(w.message, TrainingStatusCorruptWarning)]
        assert len(moved) == 1 and moved[0].moved_to is not None
        copies.append(Path(moved[0].moved_to))
    for copy in copies:
        assert copy.parent == tmp_path and copy.read_bytes() == b'{"Walker": '
        assert len(os.fsencode(copy.name)) <= _names.NAME_MAX
        assert _names.copy_pattern(path.name).fullmatch(copy.name)

    assert _cli_main.main(["corrupt", "list", str(path)]) == 0
    listed = capsys.readouterr().out
    assert all(copy.name in listed for copy in copies)

    copies[0].write_bytes(good)  # an operator fixed the copy; put it back
    assert _cli_main.main(["corrupt", "restore", str(path), copies[0].name]) == 0
    assert read_fresh(path)["Walker"] == {"lesson": 3}


@pytest.mark.parametrize("size", [222, 255])
def test_a_temp_file_left_by_a_killed_writer_of_a_long_name_is_reported_and_removed(
    tmp_path: Path, size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = named(tmp_path, size)
    with StatusStore(path) as store:
        store.set("Walker", "lesson", 1)
    fd, temp = _atomic.open_temp(str(tmp_path), path.name)  # what a writer killed mid-write leaves
    os.write(fd, b'{"half')
    os.close(fd)
    assert len(os.fsencode(os.path.basename(temp))) <= _names.NAME_MAX

    assert _cli_main.main(["check", str(path)]) == _cli.EXIT_WARNINGS
    out = capsys.readouterr().out
    assert f"temp file {temp} (6 bytes) left by a killed writer" in out
    assert "the lock is free" in out

    StatusStore(path).close()  # opening cleans up
    assert not os.path.exists(temp)


def test_check_sees_the_lock_of_a_long_name_held(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = named(tmp_path, 253)
    StatusStore(path).close()
    with lock_held_by_another_process(tmp_path / _names.lock_name(path.name)):
        _cli_main.main(["check", str(path)])
    assert "a write or a transaction is in progress: the lock is held by" in capsys.readouterr().out


def test_a_status_file_name_over_255_bytes_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / ("a" * 251 + ".json")
    with pytest.raises(TrainingStatusReadError) as caught:
        StatusStore(path)
    assert "its name has 256 bytes and a file name can have at most 255" in str(caught.value)
    assert "give the status file a shorter name" in str(caught.value)
    assert os.listdir(tmp_path) == []


def test_mixing_lock_modes_on_a_long_name_names_the_status_file_not_the_lock(tmp_path: Path) -> None:
    path = named(tmp_path, 255)
    with StatusStore(path, lock="soft"):
        with pytest.raises(ValueError) as caught:
            StatusStore(path)
    assert str(caught.value).startswith(f"{path} is already open in this process with lock='soft'")
