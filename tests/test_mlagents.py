"""The ML-Agents drop-in: StatusType, StatusMetaData and GlobalTrainingStatus (_mlagents/status.py).

Everything runs on a real ``tmp_path``: binding takes file locks, and the write-through promise is
checked from separate processes (a ``python -c`` reader, a trainer killed with SIGKILL).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainstatus import (
    STATUS_FORMAT_VERSION,
    GlobalTrainingStatus,
    StatusMetaData,
    StatusType,
    TrainingStatusCorruptError,
    TrainingStatusError,
    TrainingStatusMissingWarning,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusVersionWarning,
    __version__,
)
from trainstatus._storage.local import LocalFile

DATA = Path(__file__).resolve().parent / "data" / "mlagents_training_status.json"
FRESH_METADATA = {"stats_format_version": "0.3.0", "trainstatus_version": __version__}
MEMORY = "<memory>"  # the location of the store behind an unbound GlobalTrainingStatus
NO_VERSIONS: dict[str, Any] = {"mlagents_version": None, "torch_version": None}  # whatever is installed


# -- helpers --------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_global() -> Iterator[None]:
    GlobalTrainingStatus.reset()
    yield
    GlobalTrainingStatus.reset()


@pytest.fixture
def mlagents_file(tmp_path: Path) -> Path:
    """The ML-Agents-written status file, where ML-Agents keeps it in a run folder."""
    path = tmp_path / "run_logs" / "training_status.json"
    path.parent.mkdir()
    shutil.copyfile(DATA, path)
    return path


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The location of every file write (LocalFile.replace), in order."""
    calls: list[str] = []
    original = LocalFile.replace

    def counting(self: LocalFile, data: bytes) -> None:
        calls.append(self.location)
        original(self, data)

    monkeypatch.setattr(LocalFile, "replace", counting)
    return calls


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_in_subprocess(path: Path) -> Any:
    """What another process reads from the file right now (the way ML-Agents would read it)."""
    script = "import json, sys\nwith open(sys.argv[1]) as f:\n    print(json.dumps(json.load(f)))"
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def same(a: Any, b: Any) -> bool:
    """Equality that counts NaN as equal to NaN and 3 as different from 3.0 (and keeps key order)."""
    return json.dumps(a) == json.dumps(b)


def file_state(path: Path) -> tuple[bytes, int, int]:
    st = os.stat(path)
    return path.read_bytes(), st.st_ino, st.st_mtime_ns


def bound_path() -> str:
    return GlobalTrainingStatus.store().path


def original_data() -> Any:
    return read_json(DATA)


def write_status(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=4), encoding="utf-8")


def version_message(location: str, field: str, found: str, ours: str) -> str:
    return (
        f"{location} was written with {field}={found!r} but this run has {field}={ours!r}; "
        "some things may not resume properly."
    )


def missing_message(path: Path) -> str:
    return (
        f"Resuming, but there is no status file at {path}: curriculum lessons, kept checkpoints and "
        "ELO start from scratch. Check the run folder, or open without resume=True for a new run."
    )


def holds_message(path: Path, listed: str) -> str:
    return (
        f"{path} already holds a training status ({listed}). Resume it with "
        "GlobalTrainingStatus.load_state(path), or pass overwrite=True to start_fresh to replace it."
    )


def checkpoint(directory: Path, steps: int, reward: float | None) -> dict[str, Any]:
    """A checkpoint as ML-Agents records it (attr.asdict of ModelCheckpoint), its files created."""
    onnx = directory / f"Walker-{steps}.onnx"
    pt = directory / f"Walker-{steps}.pt"
    onnx.touch()
    pt.touch()
    return {
        "steps": steps,
        "file_path": str(onnx),
        "reward": reward,
        "creation_time": 1764665000.0 + steps,
        "auxillary_file_paths": [str(pt)],
    }


# -- StatusType -----------------------------------------------------------------------------------


def test_status_type_has_exactly_the_mlagents_members_and_values() -> None:
    assert {m.name: m.value for m in StatusType} == {
        "LESSON_NUM": "lesson_num",
        "STATS_METADATA": "metadata",
        "CHECKPOINTS": "checkpoints",
        "FINAL_CHECKPOINT": "final_checkpoint",
        "ELO": "elo",
    }
    assert StatusType("elo") is StatusType.ELO


# -- StatusMetaData -------------------------------------------------------------------------------


@pytest.fixture
def no_distributions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sys.path holds only an empty site folder: no mlagents or torch is installed, whatever the
    environment has. Returns the folder, for fake distributions."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(site)])
    for module in ("mlagents.trainers", "torch"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return site


def fake_distribution(site: Path, name: str, version: str) -> None:
    """What pip leaves in site-packages for ``name``: a dist-info folder with METADATA."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_metadata_defaults(no_distributions: Path) -> None:
    meta = StatusMetaData()
    assert meta.stats_format_version == "0.3.0" == STATUS_FORMAT_VERSION
    assert meta.trainstatus_version == __version__
    assert meta.mlagents_version is None
    assert meta.torch_version is None
    assert meta.extra == {}
    other = StatusMetaData()
    other.extra["x"] = 1
    assert meta.extra == {}  # no shared mutable default


def test_metadata_to_dict_leaves_none_out_and_inlines_extra(no_distributions: Path) -> None:
    assert StatusMetaData().to_dict() == FRESH_METADATA
    full = StatusMetaData(mlagents_version="1.1.0", torch_version="2.2.2", extra={"python": "3.11", "seed": 7})
    assert full.to_dict() == {
        "stats_format_version": "0.3.0",
        "trainstatus_version": __version__,
        "mlagents_version": "1.1.0",
        "torch_version": "2.2.2",
        "python": "3.11",
        "seed": 7,
    }
    assert "torch_version" not in StatusMetaData(mlagents_version="1.1.0").to_dict()


def test_metadata_from_dict_reads_mlagents_block_and_sends_unknown_fields_to_extra() -> None:
    block = original_data()["metadata"]
    meta = StatusMetaData.from_dict(block)
    assert meta.stats_format_version == "0.3.0"
    assert meta.mlagents_version == "1.1.0"
    assert meta.torch_version == "2.2.2"
    assert meta.trainstatus_version == __version__  # absent from an ML-Agents file: the default
    assert meta.extra == {}
    odd = StatusMetaData.from_dict({"torch_version": "2.2.2", "python": "3.11", "extra": "a field named extra"})
    assert odd.torch_version == "2.2.2"
    assert odd.extra == {"python": "3.11", "extra": "a field named extra"}


@pytest.mark.parametrize(
    "meta",
    [
        StatusMetaData(),
        StatusMetaData(mlagents_version="1.1.0", torch_version="2.2.2"),
        StatusMetaData(stats_format_version="0.2.0", trainstatus_version="0.0.9", extra={"python": "3.11"}),
    ],
)
def test_metadata_round_trips_through_dict(meta: StatusMetaData) -> None:
    assert StatusMetaData.from_dict(meta.to_dict()) == meta
    assert StatusMetaData.from_dict(meta.to_dict()).to_dict() == meta.to_dict()


@pytest.mark.parametrize(
    ("field", "found", "ours"),
    [
        ("torch_version", "2.2.2", "2.3.0"),
        ("mlagents_version", "1.1.0", "1.2.0"),
        ("stats_format_version", "0.2.0", "0.3.0"),
    ],
)
def test_check_compatibility_warns_naming_both_values(field: str, found: str, ours: str) -> None:
    in_file = StatusMetaData(**{field: found})
    running = StatusMetaData(**{field: ours})
    with pytest.warns(TrainingStatusVersionWarning) as record:
        in_file.check_compatibility(running)
    assert [str(w.message) for w in record] == [version_message("The status file", field, found, ours)]
    assert record[0].filename == __file__  # points at the caller, not into the library


def test_check_compatibility_warns_once_per_differing_field() -> None:
    in_file = StatusMetaData(mlagents_version="1.1.0", torch_version="2.2.2", extra={"python": "3.11"})
    running = StatusMetaData(mlagents_version="1.2.0", torch_version="2.3.0", extra={"python": "3.12"})
    with pytest.warns(TrainingStatusVersionWarning) as record:
        in_file.check_compatibility(running)
    assert [str(w.message) for w in record] == [
        version_message("The status file", "mlagents_version", "1.1.0", "1.2.0"),
        version_message("The status file", "torch_version", "2.2.2", "2.3.0"),
        version_message("The status file", "python", "3.11", "3.12"),
    ]


@pytest.mark.parametrize(
    ("in_file", "running"),
    [
        (StatusMetaData(trainstatus_version="0.0.1"), StatusMetaData(trainstatus_version="9.9.9")),
        (StatusMetaData(torch_version=None), StatusMetaData(torch_version="2.3.0")),
        (StatusMetaData(torch_version="2.2.2"), StatusMetaData(torch_version=None)),
        (StatusMetaData(mlagents_version="1.1.0"), StatusMetaData(mlagents_version=None)),
        (StatusMetaData(extra={"python": "3.11"}), StatusMetaData(**NO_VERSIONS)),
        (StatusMetaData(**NO_VERSIONS), StatusMetaData(**NO_VERSIONS, extra={"python": "3.12"})),
        (StatusMetaData(mlagents_version="1.1.0", torch_version="2.2.2"),
         StatusMetaData(mlagents_version="1.1.0", torch_version="2.2.2")),
    ],
    ids=["trainstatus-version", "torch-missing-in-file", "torch-missing-in-run", "mlagents-missing-in-run",
         "extra-missing-in-run", "extra-missing-in-file", "identical"],
)
def test_check_compatibility_is_silent(in_file: StatusMetaData, running: StatusMetaData) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        in_file.check_compatibility(running)
    assert caught == []


def test_metadata_defaults_are_the_installed_mlagents_and_torch_versions(no_distributions: Path) -> None:
    fake_distribution(no_distributions, "mlagents", "1.1.0")
    fake_distribution(no_distributions, "torch", "2.2.2+cu121")
    meta = StatusMetaData()
    assert (meta.mlagents_version, meta.torch_version) == ("1.1.0", "2.2.2+cu121")
    assert StatusMetaData().to_dict() == {**FRESH_METADATA, "mlagents_version": "1.1.0", "torch_version": "2.2.2+cu121"}


def test_metadata_defaults_with_only_one_of_them_installed(no_distributions: Path) -> None:
    fake_distribution(no_distributions, "mlagents", "1.0.0")
    meta = StatusMetaData()
    assert (meta.mlagents_version, meta.torch_version) == ("1.0.0", None)
    assert "torch_version" not in meta.to_dict()


def test_resuming_with_other_installed_versions_warns_as_mlagents_does(no_distributions: Path) -> None:
    # ML-Agents' own check: StatusMetaData.from_dict(loaded).check_compatibility(StatusMetaData()).
    fake_distribution(no_distributions, "mlagents", "1.1.0")
    fake_distribution(no_distributions, "torch", "2.3.0")
    in_file = StatusMetaData.from_dict(original_data()["metadata"])  # mlagents 1.1.0, torch 2.2.2
    with pytest.warns(TrainingStatusVersionWarning) as record:
        in_file.check_compatibility(StatusMetaData())
    assert [str(w.message) for w in record] == [version_message("The status file", "torch_version", "2.2.2", "2.3.0")]


def test_metadata_versions_do_not_import_torch(no_distributions: Path) -> None:
    fake_distribution(no_distributions, "torch", "2.2.2")
    package = no_distributions / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    assert StatusMetaData().torch_version == "2.2.2"
    assert "torch" not in sys.modules


def test_an_imported_module_gives_its_own_version(no_distributions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What ML-Agents records is torch.__version__ (a str subclass) and mlagents.trainers.__version__.
    class TorchVersion(str):
        pass

    fake_distribution(no_distributions, "torch", "2.2.2")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__=TorchVersion("2.2.2+cpu")))
    monkeypatch.setitem(sys.modules, "mlagents.trainers", types.SimpleNamespace(__version__="1.1.0"))
    meta = StatusMetaData()
    assert (meta.mlagents_version, meta.torch_version) == ("1.1.0", "2.2.2+cpu")
    assert type(meta.torch_version) is str


# -- before binding -------------------------------------------------------------------------------


def test_unbound_status_lives_in_memory_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           writes: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 2)
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.ELO, 1200.0)
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 3)
    assert GlobalTrainingStatus.get_parameter_state("wall_height", StatusType.LESSON_NUM) == 3
    assert GlobalTrainingStatus.get_parameter_state("Walker", StatusType.ELO) == 1200.0
    assert GlobalTrainingStatus.saved_state == {
        "wall_height": {"lesson_num": 3},
        "Walker": {"elo": 1200.0},
        "metadata": FRESH_METADATA,
    }
    assert bound_path() == MEMORY
    assert list(tmp_path.iterdir()) == []
    assert writes == []


# -- load_state -----------------------------------------------------------------------------------


def test_load_state_missing_file_warns_then_binds_write_through(tmp_path: Path) -> None:
    path = tmp_path / "run_logs" / "training_status.json"
    with pytest.warns(TrainingStatusMissingWarning) as record:
        GlobalTrainingStatus.load_state(path)
    assert [str(w.message) for w in record] == [missing_message(path)]
    assert record[0].message.path == str(path)  # type: ignore[union-attr]
    assert record[0].filename == __file__
    assert not path.exists()  # nothing to write yet
    assert bound_path() == str(path)

    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 1)
    expected = {"wall_height": {"lesson_num": 1}, "metadata": FRESH_METADATA}
    assert read_json(path) == expected
    assert read_in_subprocess(path) == expected


def test_load_state_reads_the_mlagents_file(mlagents_file: Path, writes: list[str]) -> None:
    before = file_state(mlagents_file)
    GlobalTrainingStatus.load_state(mlagents_file)  # matching format, no metadata registered: silent
    get = GlobalTrainingStatus.get_parameter_state
    lesson = get("wall_height", StatusType.LESSON_NUM)
    assert lesson == 3 and type(lesson) is int
    assert get("big_wall_height", StatusType.LESSON_NUM) == 1
    assert get("SoccerTwos?team=0", StatusType.ELO) == 1278.4
    assert get("SoccerTwos?team=0", StatusType.CHECKPOINTS) == []
    checkpoints = get("Walker", StatusType.CHECKPOINTS)
    assert [c["steps"] for c in checkpoints] == [500000, 1000000, 1500000, 2000000, 2500000]
    assert math.isnan(checkpoints[0]["reward"])
    assert checkpoints[1]["reward"] == 112.5
    assert same(checkpoints, original_data()["Walker"]["checkpoints"])
    assert get("Walker", StatusType.FINAL_CHECKPOINT) == original_data()["Walker"]["final_checkpoint"]
    assert GlobalTrainingStatus.saved_state["metadata"] == {
        "stats_format_version": "0.3.0", "mlagents_version": "1.1.0", "torch_version": "2.2.2",
        "trainstatus_version": __version__,
    }
    assert bound_path() == str(mlagents_file)
    assert writes == []  # loading alone rewrites nothing
    assert file_state(mlagents_file) == before


def test_load_state_keeps_earlier_values_the_file_lacks_and_the_file_wins(mlagents_file: Path,
                                                                         writes: list[str]) -> None:
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 0)  # file has 3
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.ELO, 1200.0)  # Walker has no elo
    GlobalTrainingStatus.set_parameter_state("new_env_param", StatusType.LESSON_NUM, 5)
    GlobalTrainingStatus.load_state(mlagents_file)

    get = GlobalTrainingStatus.get_parameter_state
    assert get("wall_height", StatusType.LESSON_NUM) == 3
    assert get("Walker", StatusType.ELO) == 1200.0
    assert get("new_env_param", StatusType.LESSON_NUM) == 5
    assert writes == [str(mlagents_file)]  # the carried values, in one write
    on_disk = read_json(mlagents_file)
    expected = original_data()
    expected["Walker"]["elo"] = 1200.0
    expected["new_env_param"] = {"lesson_num": 5}
    for category in ("Walker", "SoccerTwos?team=0", "wall_height", "big_wall_height", "new_env_param"):
        assert same(on_disk[category], expected[category]), category
    assert same(on_disk, {k: v for k, v in GlobalTrainingStatus.saved_state.items()})


def test_load_state_warns_for_a_differing_registered_version(mlagents_file: Path) -> None:
    with pytest.warns(TrainingStatusVersionWarning) as record:
        GlobalTrainingStatus.load_state(mlagents_file, metadata={"torch_version": "2.3.0"})
    assert [str(w.message) for w in record] == [
        version_message(str(mlagents_file), "torch_version", "2.2.2", "2.3.0")
    ]
    assert record[0].message.path == str(mlagents_file)  # type: ignore[union-attr]
    assert GlobalTrainingStatus.get_parameter_state("wall_height", StatusType.LESSON_NUM) == 3
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 4)
    assert read_json(mlagents_file)["metadata"]["torch_version"] == "2.3.0"  # this run's, from now on


def test_load_state_passes_metadata_through_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "training_status.json"
    with pytest.warns(TrainingStatusMissingWarning):
        GlobalTrainingStatus.load_state(path, metadata={"torch_version": "2.2.2"})
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.ELO, 1200.0)
    assert read_json(path)["metadata"] == {**FRESH_METADATA, "torch_version": "2.2.2"}
    assert GlobalTrainingStatus.saved_state["metadata"] == {**FRESH_METADATA, "torch_version": "2.2.2"}


@pytest.mark.parametrize("binder", ["load_state", "start_fresh", "save_state"])
def test_bad_options_raise_and_leave_the_binding_alone(tmp_path: Path, binder: str) -> None:
    path = tmp_path / "training_status.json"
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.ELO, 1200.0)
    bind = getattr(GlobalTrainingStatus, binder)
    with pytest.raises(TrainingStatusValueError, match=r"^StatusStore option lock_timeout= must be a number of seconds >= 0 "):
        bind(path, lock_timeout=-1)
    with pytest.raises(TypeError):
        bind(path, no_such_option=True)
    assert bound_path() == MEMORY
    assert GlobalTrainingStatus.get_parameter_state("Walker", StatusType.ELO) == 1200.0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("binder", ["load_state", "start_fresh", "save_state"])
def test_strict_is_passed_through_and_a_damaged_file_is_left_alone(tmp_path: Path, binder: str) -> None:
    path = tmp_path / "training_status.json"
    path.write_bytes(b'{"Walker": {"elo": 12')
    with pytest.raises(TrainingStatusCorruptError) as info:
        getattr(GlobalTrainingStatus, binder)(path, strict=True)
    assert info.value.path == str(path)
    assert path.read_bytes() == b'{"Walker": {"elo": 12'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["training_status.json"]
    assert bound_path() == MEMORY


# -- start_fresh ----------------------------------------------------------------------------------


def test_start_fresh_binds_and_writes_nothing_until_a_set(tmp_path: Path) -> None:
    path = tmp_path / "run_logs" / "training_status.json"
    GlobalTrainingStatus.start_fresh(path)
    assert bound_path() == str(path)
    assert list(tmp_path.iterdir()) == []
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 1)
    expected = {"wall_height": {"lesson_num": 1}, "metadata": FRESH_METADATA}
    assert read_json(path) == expected
    assert read_in_subprocess(path) == expected


def test_start_fresh_on_an_existing_status_raises_and_touches_nothing(mlagents_file: Path,
                                                                      writes: list[str]) -> None:
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.ELO, 1000.0)
    before = file_state(mlagents_file)
    with pytest.raises(TrainingStatusError) as info:
        GlobalTrainingStatus.start_fresh(mlagents_file)
    assert str(info.value) == holds_message(mlagents_file, "Walker, SoccerTwos?team=0, wall_height, big_wall_height")
    assert info.value.path == str(mlagents_file)
    assert file_state(mlagents_file) == before
    assert writes == []
    # Still unbound, with what was set before: a later set does not reach the file either.
    assert bound_path() == MEMORY
    assert GlobalTrainingStatus.get_parameter_state("Walker", StatusType.ELO) == 1000.0
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.ELO, 1001.0)
    assert file_state(mlagents_file) == before


def test_start_fresh_message_lists_five_categories_then_an_ellipsis(tmp_path: Path) -> None:
    path = tmp_path / "training_status.json"
    write_status(path, {f"param{i}": {"lesson_num": i} for i in range(7)} | {"metadata": FRESH_METADATA})
    with pytest.raises(TrainingStatusError) as info:
        GlobalTrainingStatus.start_fresh(path)
    assert str(info.value) == holds_message(path, "param0, param1, param2, param3, param4, ...")


def test_start_fresh_accepts_a_file_holding_only_metadata(tmp_path: Path, writes: list[str]) -> None:
    path = tmp_path / "training_status.json"
    write_status(path, {"metadata": FRESH_METADATA})
    before = file_state(path)
    GlobalTrainingStatus.start_fresh(path)
    assert bound_path() == str(path)
    assert writes == []
    assert file_state(path) == before
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.ELO, 1200.0)
    assert read_json(path) == {"Walker": {"elo": 1200.0}, "metadata": FRESH_METADATA}


def test_start_fresh_overwrite_replaces_the_file_in_one_write(mlagents_file: Path, writes: list[str]) -> None:
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.ELO, 1000.0)
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 0)
    GlobalTrainingStatus.start_fresh(mlagents_file, overwrite=True)
    assert writes == [str(mlagents_file)]
    expected = {"Walker": {"elo": 1000.0}, "wall_height": {"lesson_num": 0}, "metadata": FRESH_METADATA}
    # A new run: nothing of the old one stays, not even the old run's library versions.
    assert read_json(mlagents_file) == expected
    assert GlobalTrainingStatus.saved_state == expected
    assert GlobalTrainingStatus.get_parameter_state("Walker", StatusType.CHECKPOINTS) is None
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 1)
    assert read_json(mlagents_file)["wall_height"] == {"lesson_num": 1}


def test_start_fresh_overwrite_with_nothing_set_empties_the_file(mlagents_file: Path, writes: list[str]) -> None:
    GlobalTrainingStatus.start_fresh(mlagents_file, overwrite=True)
    assert writes == [str(mlagents_file)]
    assert list(read_json(mlagents_file)) == ["metadata"]
    assert GlobalTrainingStatus.get_parameter_state("wall_height", StatusType.LESSON_NUM) is None


# -- save_state -----------------------------------------------------------------------------------


def test_save_state_unbound_writes_everything_then_binds(tmp_path: Path, writes: list[str]) -> None:
    path = tmp_path / "run_logs" / "training_status.json"
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 2)
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.ELO, 1200.0)
    assert writes == []
    GlobalTrainingStatus.save_state(path)
    assert writes == [str(path)]
    expected = {"wall_height": {"lesson_num": 2}, "Walker": {"elo": 1200.0}, "metadata": FRESH_METADATA}
    assert read_json(path) == expected
    assert bound_path() == str(path)
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 3)
    assert read_in_subprocess(path)["wall_height"] == {"lesson_num": 3}


def test_save_state_with_nothing_set_creates_a_metadata_only_file(tmp_path: Path) -> None:
    path = tmp_path / "training_status.json"
    GlobalTrainingStatus.save_state(path)  # what ML-Agents does at exit
    assert read_json(path) == {"metadata": FRESH_METADATA}


def test_save_state_to_the_bound_path_rewrites_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  writes: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "training_status.json"
    GlobalTrainingStatus.start_fresh(path)
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 2)
    content = path.read_bytes()
    path.unlink()  # someone removed it: the next save puts it back
    GlobalTrainingStatus.save_state("training_status.json")  # the same file, spelled relatively
    assert path.read_bytes() == content
    assert bound_path() == str(path)  # still the same binding
    assert writes == [str(path), str(path)]


def test_save_state_to_another_path_replaces_it_and_rebinds(tmp_path: Path, mlagents_file: Path,
                                                            writes: list[str]) -> None:
    first = tmp_path / "first.json"
    GlobalTrainingStatus.start_fresh(first)
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 7)
    first_state = file_state(first)
    writes.clear()

    GlobalTrainingStatus.save_state(mlagents_file)
    assert writes == [str(mlagents_file)]
    expected = {"wall_height": {"lesson_num": 7}, "metadata": FRESH_METADATA}
    assert read_json(mlagents_file) == expected  # the old content is gone, categories and versions
    assert bound_path() == str(mlagents_file)
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 8)
    assert read_in_subprocess(mlagents_file)["wall_height"] == {"lesson_num": 8}
    assert file_state(first) == first_state


# -- the checkpoint manager's pattern -------------------------------------------------------------


def test_checkpoint_manager_pattern_is_on_disk_after_each_set(tmp_path: Path) -> None:
    models = tmp_path / "results" / "Walker"
    models.mkdir(parents=True)
    path = tmp_path / "results" / "run_logs" / "training_status.json"
    GlobalTrainingStatus.start_fresh(path)
    keep = 3
    expected: list[dict[str, Any]] = []
    for i in range(1, 11):
        new = checkpoint(models, i * 1000, None if i % 3 == 0 else float(i))
        # ModelCheckpointManager.add_checkpoint, as ML-Agents writes it.
        checkpoints = GlobalTrainingStatus.get_parameter_state("Walker", StatusType.CHECKPOINTS) or []
        checkpoints.append(new)
        while len(checkpoints) > keep:
            old = checkpoints.pop(0)
            for file in [old["file_path"], *old["auxillary_file_paths"]]:
                os.remove(file)
        GlobalTrainingStatus.set_parameter_state("Walker", StatusType.CHECKPOINTS, checkpoints)
        expected = (expected + [new])[-keep:]

        assert read_in_subprocess(path) == {"Walker": {"checkpoints": expected}, "metadata": FRESH_METADATA}, i
        assert GlobalTrainingStatus.get_parameter_state("Walker", StatusType.CHECKPOINTS) == expected
    assert sorted(p.name for p in models.iterdir()) == sorted(
        name for s in (8000, 9000, 10000) for name in (f"Walker-{s}.onnx", f"Walker-{s}.pt")
    )
    final = {**expected[-1], "file_path": str(tmp_path / "results" / "Walker.onnx")}
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.FINAL_CHECKPOINT, final)
    assert read_in_subprocess(path)["Walker"] == {"checkpoints": expected, "final_checkpoint": final}


def test_get_parameter_state_returns_a_copy(tmp_path: Path) -> None:
    path = tmp_path / "training_status.json"
    GlobalTrainingStatus.start_fresh(path)
    stored = [checkpoint(tmp_path, 1000, 1.5)]
    GlobalTrainingStatus.set_parameter_state("Walker", StatusType.CHECKPOINTS, stored)
    stored.append("changed after set")
    got = GlobalTrainingStatus.get_parameter_state("Walker", StatusType.CHECKPOINTS)
    assert len(got) == 1
    got[0]["reward"] = 99.0
    got[0]["auxillary_file_paths"].append("x")
    got.append("changed after get")
    again = GlobalTrainingStatus.get_parameter_state("Walker", StatusType.CHECKPOINTS)
    assert again == [checkpoint(tmp_path, 1000, 1.5)]
    assert again is not got
    assert read_json(path)["Walker"]["checkpoints"] == again


# -- kill and resume ------------------------------------------------------------------------------

TRAINER = """
import sys
from trainstatus import GlobalTrainingStatus, StatusType
GlobalTrainingStatus.start_fresh(sys.argv[1])
while True:
    lesson = (GlobalTrainingStatus.get_parameter_state("wall_height", StatusType.LESSON_NUM) or 0) + 1
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, lesson)
    print(lesson, flush=True)
"""


def test_a_killed_trainer_resumes_at_the_last_acknowledged_lesson(tmp_path: Path) -> None:
    path = tmp_path / "run_logs" / "training_status.json"
    child = subprocess.Popen([sys.executable, "-c", TRAINER, str(path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stderr is not None
    acknowledged: list[int] = []
    try:
        for line in child.stdout:
            acknowledged.append(int(line))
            if len(acknowledged) >= 5:
                child.send_signal(signal.SIGKILL)
                break
        acknowledged.extend(int(line) for line in child.stdout.read().splitlines())
    finally:
        child.kill()
        child.wait(timeout=60)
        errors = child.stderr.read()
        child.stdout.close()
        child.stderr.close()
    assert len(acknowledged) >= 5, errors
    assert child.returncode == -signal.SIGKILL, errors
    assert acknowledged == list(range(1, len(acknowledged) + 1))
    last = acknowledged[-1]

    on_disk = read_json(path)  # the file parses
    GlobalTrainingStatus.load_state(path)
    lesson = GlobalTrainingStatus.get_parameter_state("wall_height", StatusType.LESSON_NUM)
    assert lesson in (last, last + 1)
    assert on_disk == {"wall_height": {"lesson_num": lesson}, "metadata": FRESH_METADATA}


# -- saved_state, unknown categories, reset ---------------------------------------------------------


def test_saved_state_is_a_class_level_copy(tmp_path: Path) -> None:
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 2)
    snapshot = GlobalTrainingStatus.saved_state
    snapshot["wall_height"]["lesson_num"] = 99
    snapshot["intruder"] = {"elo": 1.0}
    snapshot["metadata"]["torch_version"] = "0.0.0"
    assert GlobalTrainingStatus.saved_state == {"wall_height": {"lesson_num": 2}, "metadata": FRESH_METADATA}
    assert GlobalTrainingStatus.get_parameter_state("intruder", StatusType.ELO) is None

    path = tmp_path / "training_status.json"
    GlobalTrainingStatus.start_fresh(path)
    state = GlobalTrainingStatus.saved_state
    assert state == {"wall_height": {"lesson_num": 2}, "metadata": FRESH_METADATA}
    assert list(state)[-1] == "metadata"
    assert read_json(path) == state


@pytest.mark.parametrize("bound", [False, True], ids=["unbound", "bound"])
def test_get_of_an_unknown_category_returns_none_and_creates_nothing(tmp_path: Path, bound: bool,
                                                                     writes: list[str]) -> None:
    path = tmp_path / "training_status.json"
    if bound:
        GlobalTrainingStatus.start_fresh(path)
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 1)
    before = GlobalTrainingStatus.saved_state
    written = list(writes)
    assert GlobalTrainingStatus.get_parameter_state("NoSuchBehavior", StatusType.CHECKPOINTS) is None
    assert GlobalTrainingStatus.get_parameter_state("wall_height", StatusType.ELO) is None
    assert GlobalTrainingStatus.saved_state == before
    assert "NoSuchBehavior" not in GlobalTrainingStatus.saved_state
    assert writes == written
    if bound:
        assert read_json(path) == before


def test_reset_unbinds_and_forgets(tmp_path: Path, writes: list[str]) -> None:
    path = tmp_path / "training_status.json"
    GlobalTrainingStatus.start_fresh(path)
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 4)
    before = file_state(path)
    written = list(writes)
    GlobalTrainingStatus.reset()
    assert bound_path() == MEMORY
    assert GlobalTrainingStatus.get_parameter_state("wall_height", StatusType.LESSON_NUM) is None
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 5)
    assert GlobalTrainingStatus.get_parameter_state("wall_height", StatusType.LESSON_NUM) == 5
    assert writes == written
    assert file_state(path) == before
    assert GlobalTrainingStatus.saved_state == {"wall_height": {"lesson_num": 5}, "metadata": FRESH_METADATA}


# -- the values ML-Agents stores --------------------------------------------------------------------


def test_values_mlagents_stores_round_trip_with_their_types(tmp_path: Path) -> None:
    path = tmp_path / "training_status.json"
    GlobalTrainingStatus.start_fresh(path)
    set_ = GlobalTrainingStatus.set_parameter_state
    get = GlobalTrainingStatus.get_parameter_state
    checkpoints = [
        checkpoint(tmp_path, 1000, None),
        checkpoint(tmp_path, 2000, float("nan")),  # ML-Agents' reward when no episode finished
        checkpoint(tmp_path, 3000, np.float64(301.25)),  # np.mean of the rewards
        checkpoint(tmp_path, 4000, np.float32(0.5)),
    ]
    set_("wall_height", StatusType.LESSON_NUM, 3)
    set_("SoccerTwos?team=0", StatusType.ELO, 1278.4)
    set_("Walker", StatusType.CHECKPOINTS, checkpoints)
    set_("Walker", StatusType.FINAL_CHECKPOINT, checkpoints[0])

    lesson = get("wall_height", StatusType.LESSON_NUM)
    assert lesson == 3 and type(lesson) is int
    elo = get("SoccerTwos?team=0", "elo")  # a plain str key reaches the same entry
    assert elo == 1278.4 and type(elo) is float
    got = get("Walker", StatusType.CHECKPOINTS)
    assert [c["reward"] for c in got][0] is None
    assert math.isnan(got[1]["reward"])
    assert got[2]["reward"] == 301.25 and type(got[2]["reward"]) is float
    assert got[3]["reward"] == 0.5 and type(got[3]["reward"]) is float
    assert [c["auxillary_file_paths"] for c in got] == [[str(tmp_path / f"Walker-{s}.pt")] for s in (1000, 2000, 3000, 4000)]
    assert get("Walker", StatusType.FINAL_CHECKPOINT) == checkpoints[0]

    text = path.read_text(encoding="utf-8")
    assert '"lesson_num": 3\n' in text  # an int stays an int in the file
    assert '"reward": NaN' in text  # ML-Agents' literal, readable by json.load
    on_disk = read_in_subprocess(path)
    assert same(on_disk["Walker"]["checkpoints"], got)
    assert on_disk["SoccerTwos?team=0"] == {"elo": 1278.4}
    assert type(on_disk["wall_height"]["lesson_num"]) is int


@pytest.mark.parametrize("call", ["load_state", "start_fresh", "save_state"])
def test_resume_is_the_calls_to_say_not_an_option(tmp_path: Path, call: str) -> None:
    with pytest.raises(TrainingStatusTypeError) as caught:
        getattr(GlobalTrainingStatus, call)(tmp_path / "s.json", resume=True)
    assert isinstance(caught.value, TypeError)
    assert str(caught.value) == (
        "GlobalTrainingStatus takes no resume= option (resume=True was given): resume is implied by the call: "
        "load_state resumes, start_fresh and save_state do not. Leave resume= out."
    )
    GlobalTrainingStatus.start_fresh(tmp_path / "s.json", metadata={"torch_version": "2.2.2"})
    GlobalTrainingStatus.set_parameter_state("w", StatusType.LESSON_NUM, 1)
    GlobalTrainingStatus.load_state(tmp_path / "s.json")  # reused options carry no resume
    GlobalTrainingStatus.set_parameter_state("w", StatusType.LESSON_NUM, 2)
    assert read_json(tmp_path / "s.json")["metadata"]["torch_version"] == "2.2.2"
    assert read_json(tmp_path / "s.json")["w"] == {"lesson_num": 2}


def test_sets_from_a_thread_never_hit_a_store_closed_by_a_concurrent_rebinding(tmp_path: Path) -> None:
    import threading

    GlobalTrainingStatus.start_fresh(tmp_path / "a.json", durable=False)
    errors: list[BaseException] = []
    stop = threading.Event()

    def setter() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                GlobalTrainingStatus.set_parameter_state("w", StatusType.LESSON_NUM, n)
            except BaseException as exc:  # pragma: no cover - the failure being tested
                errors.append(exc)

    thread = threading.Thread(target=setter)
    thread.start()
    try:
        for i in range(40):
            GlobalTrainingStatus.save_state(tmp_path / ("a.json" if i % 2 else "b.json"))
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert errors == []


def test_saved_state_reads_an_unknown_category_as_empty_without_creating_it(tmp_path: Path) -> None:
    GlobalTrainingStatus.start_fresh(tmp_path / "training_status.json")
    GlobalTrainingStatus.set_parameter_state("wall_height", StatusType.LESSON_NUM, 1)
    state = GlobalTrainingStatus.saved_state
    assert state["NoSuchBehavior"] == {}  # as ML-Agents' defaultdict
    assert "NoSuchBehavior" not in state and "NoSuchBehavior" not in GlobalTrainingStatus.saved_state
    assert json.loads(json.dumps(state)) == {"wall_height": {"lesson_num": 1}, "metadata": FRESH_METADATA}


@pytest.mark.parametrize(("error", "torn"), [
    (FileNotFoundError(2, "No such file or directory"), True),
    (EOFError("Ran out of input"), True),
    (RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory"), True),
    (RuntimeError("Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False"), False),
    (PermissionError(13, "Permission denied"), False),
    (OSError(5, "Input/output error"), False),
    (MemoryError(), False),
])
def test_only_a_missing_or_torn_checkpoint_pt_is_replaced_on_resume(error: BaseException, torn: bool) -> None:
    # The plugin's --resume falls back to a listed checkpoint, or a fresh model, only when
    # checkpoint.pt itself is missing or cut short; an error about this machine (CUDA, permissions,
    # I/O) stands, or the fresh model's next save would replace a good file (tests/test_mlagents_learn.py
    # runs the fallback itself on the real path).
    from trainstatus._mlagents.plugin import _torn_or_missing

    assert _torn_or_missing(error) is torn
