"""trainstatus.testing: simulated kills and power-loss states, on a real folder and under pyfakefs."""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import re
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import trainstatus.testing as testing
from trainstatus import (
    CheckpointList,
    StatusStore,
    TrainingStatusError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusWarning,
)
from trainstatus._testing.interpose import Call, Hook, Interposer
from trainstatus.testing import (
    POINTS,
    CrashPoint,
    IncompleteRecording,
    Kill,
    PowerLoss,
    SimulatedKill,
    TrainingStatusKilledError,
    TrainingStatusTestError,
    count_writes,
    crash_points,
    every_crash,
    kill_at,
    power_losses,
)

NAME = "status.json"
EXPECTED_ALL = [
    "POINTS", "CrashPoint", "DirectoryState", "IncompleteRecording", "Kill", "Operation", "PowerLoss",
    "Recording", "SimulatedKill", "TrainingStatusKilledError", "TrainingStatusTestError", "count_writes", "crash_points",
    "every_crash", "kill_at", "power_losses",
]


@pytest.fixture(params=["real", "pyfakefs"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A run folder on the real disk or on pyfakefs' fake one (requested only for the fake one)."""
    if request.param == "real":
        yield tmp_path / "run"
    else:
        request.getfixturevalue("fs")
        yield Path("/fake/run")


def temps(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".tmp"))


def test_the_public_surface() -> None:
    assert sorted(testing.__all__) == sorted(EXPECTED_ALL)
    assert {n for n in vars(testing) if not n.startswith("_")} >= set(EXPECTED_ALL)
    assert POINTS == ("created", "half-written", "written", "synced", "renamed", "dir-synced", "returned")
    assert issubclass(SimulatedKill, BaseException) and not issubclass(SimulatedKill, Exception)
    assert issubclass(TrainingStatusKilledError, TrainingStatusError)
    assert issubclass(TrainingStatusTestError, TrainingStatusError) and issubclass(TrainingStatusTestError, AssertionError)


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_leaves_what_a_sigkill_there_leaves(folder: Path, point: str) -> None:
    path = folder / NAME
    store = StatusStore(path)
    store.set("a", "n", 1)
    old = path.read_bytes()
    with kill_at(1, point) as kill:
        try:
            store.set("a", "n", 2)
        except Exception:  # noqa: BLE001 - a trainer's catch-all: the kill goes through it
            pytest.fail("except Exception caught the simulated kill")
    assert kill.killed and kill.path == str(path) and kill.root == str(folder) and kill.writes == 1
    assert kill.replaced == (point in ("renamed", "dir-synced", "returned"))
    left = temps(folder)
    if kill.replaced:
        assert left == []
        assert path.read_bytes() != old
        new = path.read_bytes()
    else:
        assert path.read_bytes() == old  # the old file, untouched
        assert len(left) == 1  # the temp file stays, as after a SIGKILL: no clean-up ran
        temp = (folder / left[0]).read_bytes()
        # What it holds: nothing yet, half of the new document, or all of it.
        reference = StatusStore(folder / "reference.json")
        reference.set("a", "n", 2)
        new = (folder / "reference.json").read_bytes()
        reference.close()
        expected = {"created": b"", "half-written": new[: len(new) // 2]}.get(point, new)
        assert temp == expected
    with pytest.raises(TrainingStatusKilledError, match=r"belongs to a trainer killed by trainstatus.testing.kill_at "
                                                        rf"\(write 1, at '{point}'\), so get\(\) is refused"):
        store.get("a", "n")
    store.close()  # a dead store may still be closed
    restarted = StatusStore(path)
    assert restarted.get("a", "n") == (2 if kill.replaced else 1)
    restarted.set("a", "n", 3)  # the next write removes the killed writer's temp file
    assert temps(folder) == []
    restarted.close()
    assert new  # the new document was seen


def test_a_kill_is_not_an_exception_and_the_dead_process_does_nothing_more(folder: Path) -> None:
    path = folder / NAME
    marker = folder / "cleanup-ran"

    def trainer() -> None:
        store = StatusStore(path)
        try:
            store.set("a", "n", 1)
            store.set("a", "n", 2)
        except Exception:  # noqa: BLE001
            pytest.fail("except Exception caught the simulated kill")
        finally:
            with open(marker, "w") as f:  # a trainer's clean-up: a killed process never runs it
                f.write("ran")
            store.set("a", "final", True)  # refused: the process is dead (raises the kill again)

    with kill_at(2, "written", root=folder) as kill:
        trainer()
    assert kill.killed
    assert not marker.exists()  # put back as it was at the kill
    assert StatusStore(path).to_dict()["a"] == {"n": 1}


def test_a_kill_that_never_happens_fails_the_test(folder: Path) -> None:
    store = StatusStore(folder / NAME)
    with pytest.raises(TrainingStatusTestError, match=r"kill_at\(3, 'renamed'\) never killed: the block made 2 writes\. "):
        with kill_at(3, "renamed"):
            store.set("a", "n", 1)
            store.set("a", "n", 2)
    fast = StatusStore(folder / "fast.json", durable=False)
    with pytest.raises(TrainingStatusTestError, match=r"write 1 never reached 'synced' \(a store opened with durable=False"):
        with kill_at(1, "synced"):
            fast.set("a", "n", 1)
    store.set("a", "n", 3)  # no kill happened: the stores live on
    assert StatusStore(folder / NAME).get("a", "n") == 3


def test_a_trainer_that_swallows_the_kill_fails_the_test(folder: Path) -> None:
    store = StatusStore(folder / NAME)
    with pytest.raises(TrainingStatusTestError, match="caught the SimulatedKill"):
        with kill_at(1, "written"):
            try:
                store.set("a", "n", 1)
            except BaseException:  # noqa: BLE001 - the mistake being tested
                pass


def test_code_that_replaces_the_kill_on_its_way_out_fails_the_test(folder: Path) -> None:
    store = StatusStore(folder / NAME)
    with pytest.raises(TrainingStatusTestError, match=r"was replaced, on its way out of the block, by KeyError"):
        with kill_at(1, "written"):
            try:
                store.set("a", "n", 1)
            finally:
                raise KeyError("cleanup")  # noqa: B012


def test_arguments_are_checked(tmp_path: Path) -> None:
    # TrainingStatusValueError is a ValueError too: ``except ValueError`` keeps working.
    with pytest.raises(TrainingStatusValueError, match=r"unknown crash point\(s\) \['fsynced'\]; choose from created, half-written"):
        with kill_at(1, "fsynced"):
            pass
    with pytest.raises(TrainingStatusValueError) as caught:
        with kill_at(0, "created"):
            pass
    assert str(caught.value) == "kill_at: write= must be the number of a write (an int >= 1; 1: the first), not 0."
    with pytest.raises(TrainingStatusValueError) as caught:
        crash_points(0)
    assert str(caught.value) == (
        "crash_points: writes= must be the number of writes the scenario makes (an int >= 1), not 0.")
    with pytest.raises(TrainingStatusValueError) as caught:
        crash_points(1, [])
    assert str(caught.value).startswith("points= names no crash point; choose one or more from created, ")
    with pytest.raises(TrainingStatusTypeError) as caught:
        crash_points(1, "renamed")
    assert str(caught.value) == "points= must be a list of crash points, e.g. ['renamed'], not the str 'renamed'."
    with pytest.raises(TrainingStatusValueError) as caught:
        power_losses(lambda: None, lambda loss: None, root=tmp_path, block=0)
    assert str(caught.value) == (
        "power_losses: block= must be the disk's block size in bytes (an int >= 1; default 512), not 0.")
    assert list(tmp_path.iterdir()) == []
    assert crash_points(2, ["renamed"]) == [CrashPoint(1, "renamed"), CrashPoint(2, "renamed")]
    assert [str(p) for p in crash_points(1)][:2] == ["write1-created", "write1-half-written"]


def test_one_kill_at_a_time(tmp_path: Path) -> None:
    with kill_at(1, "created", root=tmp_path) as kill:
        with pytest.raises(TrainingStatusTestError, match="already active"):
            with kill_at(1, "created"):
                pass
        StatusStore(tmp_path / NAME).set("a", "n", 1)
    assert kill.killed


def test_a_transaction_and_a_checkpoint_list_are_one_write_each(folder: Path) -> None:
    path = folder / NAME
    models = folder / "models"
    models.mkdir(parents=True)
    for steps in (1, 2):
        (models / f"{steps}.ckpt").write_bytes(b"weights")
    store = StatusStore(path)
    checkpoints = CheckpointList(store, "Walker", keep=1, root=folder)
    checkpoints.add(1, "models/1.ckpt")
    # Killed once add's write returned: the record is in, the dropped file not removed yet.
    with kill_at(1, "returned") as kill:
        checkpoints.add(2, "models/2.ckpt")
    assert kill.killed
    assert (models / "1.ckpt").exists()
    assert [e["steps"] for e in CheckpointList(StatusStore(path), "Walker").entries()] == [2]
    store2 = StatusStore(path)
    with kill_at(1, "written"):
        with store2.transaction():
            store2.set("a", "x", 1)
            store2.set("a", "y", 2)
    assert "a" not in StatusStore(path).to_dict()


def test_a_kill_on_another_thread(tmp_path: Path) -> None:
    path = tmp_path / NAME
    errors: list[BaseException] = []

    def worker() -> None:
        store = StatusStore(path)
        try:
            store.set("a", "n", 1)
        except BaseException as exc:  # noqa: BLE001 - what the thread died of
            errors.append(exc)

    with kill_at(1, "renamed") as kill:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert kill.killed and [type(e) for e in errors] == [SimulatedKill]
    assert StatusStore(path).get("a", "n") == 1


def test_history_pruning_on_the_background_thread(tmp_path: Path) -> None:
    """Killed at 'dir-synced' the write has queued no pruning yet; at 'returned' its pruning is done."""
    def versions() -> int:
        return len([n for n in os.listdir(tmp_path) if ".history-" in n])

    for point, expected in (("dir-synced", 3), ("returned", 2)):
        for name in os.listdir(tmp_path):
            os.unlink(tmp_path / name)
        store = StatusStore(tmp_path / NAME, history=2)
        for n in range(3):
            store.set("a", "n", n)
        with kill_at(1, point):
            store.set("a", "n", 3)
        assert versions() == expected, point
        assert StatusStore(tmp_path / NAME).get("a", "n") == 3


def test_count_writes_counts_as_kill_at_does(folder: Path) -> None:
    path = folder / NAME

    def run() -> None:
        store = StatusStore(path)
        store.set("a", "n", 1)
        with store.transaction():  # one write
            store.set("a", "n", 2)
            store.set("a", "m", 3)
        store.set("a", "n", 4)
        store.close()

    assert count_writes(run) == 3
    assert StatusStore(path).get("a", "n") == 4  # run for real, without a kill
    assert crash_points(count_writes(run))[-1] == CrashPoint(3, "returned")


PLUGIN_TESTS = """
import multiprocessing
import os
import signal

import pytest
from trainstatus import StatusStore
from trainstatus.testing import kill_at


def scenario(folder):
    store = StatusStore(folder / "status.json")
    for n in range(3):
        store.set("a", "n", n)


@pytest.mark.trainstatus_crash_points(writes=3, points=("renamed",))
def test_exact(tmp_path, crash_point):
    with kill_at(*crash_point) as kill:
        scenario(tmp_path)
    assert kill.killed


@pytest.mark.trainstatus_crash_points(writes=2, points=("renamed",))
def test_too_few(tmp_path, crash_point):
    with kill_at(*crash_point) as kill:
        scenario(tmp_path)
    assert kill.killed


@pytest.mark.trainstatus_crash_points(writes=4, points=("renamed",))
def test_too_many(tmp_path, crash_point):
    with kill_at(*crash_point) as kill:
        scenario(tmp_path)
    assert kill.killed


@pytest.mark.trainstatus_crash_points(writes=1, points=("renamed",))
def test_without_the_block(tmp_path, crash_point):
    assert crash_point


def child(folder, crash_point, sigkill):
    with kill_at(*crash_point, sigkill=sigkill) as kill:
        scenario(folder)
    os._exit(0 if kill.killed else 1)


@pytest.mark.parametrize("sigkill", [True, False])
@pytest.mark.trainstatus_crash_points(writes=3, points=("renamed",))
def test_in_a_child_process(tmp_path, crash_point, sigkill):
    process = multiprocessing.get_context("fork").Process(target=child, args=(tmp_path, crash_point, sigkill))
    process.start()
    process.join()
    assert process.exitcode == (-signal.SIGKILL if sigkill else 0)
"""


def test_the_plugin_checks_the_number_of_writes_its_marker_gives(tmp_path: Path) -> None:
    (tmp_path / "test_plugin_cases.py").write_text(PLUGIN_TESTS)
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", "test_plugin_cases.py"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = result.stdout
    failed = sorted(line.split(" ")[1].split("::", 1)[1] for line in out.splitlines() if line.startswith(("FAILED ", "ERROR ")))
    assert failed == ["test_too_few[write-count]", "test_too_many[write-count]", "test_too_many[write4-renamed]"], out
    # The write-count case of test_exact passes, ending with its block; the child process's cases pass (a real
    # kill each, the write-count one's at the last point), and the count, which a child cannot give, is skipped.
    assert "3 failed, 16 passed, 3 skipped in" in out, out
    assert ("TrainingStatusTestError: This test's scenario makes 3 status writes (its kill_at block, run once without a "
            "kill), but @pytest.mark.trainstatus_crash_points(writes=2) says 2, so no kill at write 3 is tested. Set "
            "writes=3.") in out
    assert ("TrainingStatusTestError: This test's scenario makes 3 status writes (its kill_at block, run once without a "
            "kill), but @pytest.mark.trainstatus_crash_points(writes=4) says 4, so the cases of write 4 fail with kills "
            "that never happen. Set writes=3.") in out
    not_counted = ("no kill_at block ran in pytest's process, so the number of writes of this test's scenario is not "
                   "checked (a block in a child process, or with sigkill=True, cannot be counted; without a block, pass "
                   "crash_point on as kill_at(*crash_point) around the scenario). Check writes= with "
                   "trainstatus.testing.count_writes(scenario) in a test of its own.")
    lines = PLUGIN_TESTS.splitlines()  # lines[n] is line n + 1 of the file; a skip names a test's first decorator
    assert [line for line in out.splitlines() if line.startswith("SKIPPED ")] == [
        f"SKIPPED [1] test_plugin_cases.py:{lines.index('def test_without_the_block(tmp_path, crash_point):')}: {not_counted}",
        f"SKIPPED [2] test_plugin_cases.py:{lines.index('def test_in_a_child_process(tmp_path, crash_point, sigkill):') - 1}: "
        f"{not_counted}"], out


def test_the_plugin_loads_with_the_pluggy_of_pytest_7() -> None:
    """pytest imports the plugin in every environment trainstatus is installed in: a new-style
    wrapper (wrapper=True, pluggy >= 1.2) would break pytest 7's (pluggy 1.0) at import."""
    import _trainstatus_pytest

    hooks = {name: getattr(_trainstatus_pytest, name) for name in dir(_trainstatus_pytest) if name.startswith("pytest_")}
    options = {name: getattr(hook, "pytest_impl", {}) for name, hook in hooks.items()}
    assert options["pytest_pyfunc_call"].get("hookwrapper"), options
    assert not any(opts.get("wrapper") for opts in options.values()), options
    assert "wrapper=True" not in Path(_trainstatus_pytest.__file__).read_text().replace("hookwrapper=True", "")


def test_every_crash_runs_each_point_of_each_write_from_the_same_start(folder: Path) -> None:
    path = folder / NAME
    folder.mkdir(parents=True)
    StatusStore(path).set("a", "n", 0)
    seen: list[tuple[int, str, Any]] = []

    def run() -> None:
        store = StatusStore(path)
        store.set("a", "n", store.get("a", "n") + 1)
        store.set("a", "n", store.get("a", "n") + 1)

    def check(kill: Kill) -> None:
        reopened = StatusStore(kill.path or "")
        seen.append((kill.write, kill.point, reopened.get("a", "n")))
        reopened.close()

    kills = every_crash(run, check, root=folder)
    assert len(kills) == 2 * len(POINTS)
    # Each run starts from n == 0: write 1 gives 0 or 1, write 2 gives 1 or 2.
    for write, point, value in seen:
        replaced = point in ("renamed", "dir-synced", "returned")
        assert value == write - 1 + replaced, (write, point, value)
    assert StatusStore(path).get("a", "n") == 0  # put back as it was


def test_power_losses_hand_every_state_to_the_check(folder: Path) -> None:
    losses: list[PowerLoss] = []
    values: set[Any] = set()

    def run() -> None:
        store = StatusStore(folder / NAME)
        store.set("a", "n", 1)
        store.set("a", "n", 2)

    def check(loss: PowerLoss) -> None:
        assert os.path.isdir(loss.folder)
        store = StatusStore(os.path.join(loss.folder, NAME), durable=False)
        value = store.get("a", "n")
        store.close()
        values.add(value)
        if loss.returned:
            assert value == 2
        losses.append(loss)

    recording = power_losses(run, check, root=folder)
    assert recording.states == len(losses) > len(recording.ops)
    assert values == {None, 1, 2}
    kinds = [op.kind for op in recording.ops]
    # The first version is linked in place (a link fails where another writer made the file meanwhile).
    # (then linked into the history by the second write, which renames its own over it)
    assert kinds.count("link") == 2 and kinds.count("rename") == 1 and "dirsync" in kinds
    assert recording.operations[0].startswith("create(")
    assert all(not os.path.exists(loss.folder) for loss in losses)  # removed after each check


def test_each_power_loss_says_which_status_writes_were_acknowledged(folder: Path) -> None:
    values: dict[int, set[Any]] = {}  # writes acknowledged -> values recovered
    told: dict[tuple[int, int], str] = {}  # (done, acknowledged) -> str(loss)

    def run() -> None:
        store = StatusStore(folder / NAME)
        store.set("a", "n", 1)
        store.set("a", "n", 2)

    def check(loss: PowerLoss) -> None:
        store = StatusStore(os.path.join(loss.folder, NAME), durable=False)
        values.setdefault(loss.acknowledged, set()).add(store.get("a", "n"))
        store.close()
        told[loss.done, loss.acknowledged] = str(loss)

    recording = power_losses(run, check, root=folder)
    first, second = (done for _, done in recording.status_writes)
    assert [name for name, _ in recording.status_writes] == [NAME, NAME]
    # Each write returned once its directory fsync was done, the last operation of the run.
    assert recording.operations[first - 1] == recording.operations[-1] == "dirsync(.)" and second == len(recording.ops)
    assert values == {0: {None, 1}, 1: {1, 2}, 2: {2}}  # never less than what was acknowledged
    total = len(recording.ops)
    folder_of = {key: text.rsplit("laid out in ", 1)[1] for key, text in told.items()}
    assert told[0, 0] == f"power loss after 0 of {total} operations; none of its 2 status writes acknowledged; " \
                         f"laid out in {folder_of[0, 0]}"
    assert told[first, 1] == (f"power loss after {first} of {total} operations; the last: dirsync(.); status write 1 "
                              f"of 2 acknowledged (the last of {NAME}); laid out in {folder_of[first, 1]}")
    assert told[total, 2] == (f"power loss after all {total} operations (the run had returned); status writes 1 to 2 "
                              f"of 2 acknowledged (the last of {NAME}); laid out in {folder_of[total, 2]}")


def test_a_state_is_checked_again_when_more_writes_were_acknowledged(tmp_path: Path) -> None:
    """durable=False: the disk may still hold write 1 once write 2 returned. That state looks like
    one checked before (write 1 acknowledged only), but asks more of the check now."""
    found: set[tuple[int, Any]] = set()

    def run() -> None:
        store = StatusStore(tmp_path / NAME, durable=False)
        store.set("a", "n", 1)
        store.set("a", "n", 2)

    def check(loss: PowerLoss) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrainingStatusWarning)  # a torn file, kept aside
            store = StatusStore(os.path.join(loss.folder, NAME), durable=False)
        found.add((loss.acknowledged, store.get("a", "n")))
        store.close()

    power_losses(run, check, root=tmp_path)
    assert (2, 1) in found and (2, None) in found  # the lost acknowledged writes a check must see


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+")
def test_a_failing_check_says_which_state_it_failed_on(tmp_path: Path) -> None:
    def run() -> None:
        StatusStore(tmp_path / NAME).set("a", "n", 1)

    def check(loss: PowerLoss) -> None:
        assert loss.done < 3, "too far"

    with pytest.raises(AssertionError, match="too far") as caught:
        power_losses(run, check, root=tmp_path)
    note, = caught.value.__notes__
    assert note.startswith("power loss after 3 of ") and "; the last: " in note


def test_power_losses_refuse_a_run_they_cannot_explain(folder: Path) -> None:
    def run() -> None:
        StatusStore(folder / NAME).set("a", "n", 1)
        os.symlink(NAME, folder / "unseen.lnk")  # an os call the model does not record

    with pytest.raises(IncompleteRecording, match=r"the recorded operations do not explain the directory after the "
                                                  r"call; differing names: \['unseen.lnk'\]"):
        power_losses(run, lambda loss: None, root=folder)


def test_power_losses_refuse_a_write_made_behind_the_builtin_open(tmp_path: Path) -> None:
    """C code writing to a file name itself (torch.save(obj, "name")): seen by its audit event."""
    def run() -> None:
        with io.FileIO(tmp_path / "model.pt", "w") as f:  # the C file object, not the builtin open
            f.write(b"weights")
        os.unlink(tmp_path / "model.pt")  # even gone again by the end, it was missed

    with pytest.raises(IncompleteRecording, match=re.escape(
            f"model.pt in {tmp_path} was opened for writing by code the recorder does not see (a C extension "
            "writing to a file name itself, as torch.save(obj, 'name') does, or a module that kept the builtin "
            "open from before the recording), so the power-loss states would miss those writes. Give such code a "
            "file object (torch.save(obj, f) with f = open(name, 'wb')), or write outside the folder.")):
        power_losses(run, lambda loss: None, root=tmp_path)


def synced_after(recording: Any, name: str) -> int:
    """The number of operations done once the file made as ``name`` was first fsynced."""
    inode = next(op.inode for op in recording.ops if op.kind == "create" and op.rel == name)
    return next(i + 1 for i, op in enumerate(recording.ops) if op.kind == "fsync" and op.inode == inode)


def test_power_losses_see_what_pickle_and_numpy_write_through_the_builtin_open(folder: Path) -> None:
    """How torch.save(obj, f), pickle.dump and np.save write: in the model, durable only once fsynced."""
    numpy = pytest.importorskip("numpy")
    folder.mkdir(parents=True)
    weights = {"layer": list(range(400))}  # about 1.2 KB: writes that can be torn
    array = numpy.arange(300, dtype=numpy.int64)

    def fsync(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def run() -> None:
        with open(folder / "model.pkl", "wb") as f:
            pickle.dump(weights, f)
            f.flush()
            os.fsync(f.fileno())
        numpy.save(folder / "model.npy", array)
        fsync(folder / "model.npy")
        fsync(folder)

    def loads(path: str, load: Any, expected: Any) -> bool:
        try:
            with open(path, "rb") as f:
                return bool(numpy.array_equal(load(f), expected)) if load is numpy.load else load(f) == expected
        except Exception:  # noqa: BLE001 - torn, empty or zeros: any way of not loading
            return False

    seen: list[tuple[int, str, bool, bool]] = []  # (operations done, name, present, loads)

    def check(loss: PowerLoss) -> None:
        for name, load, expected in (("model.pkl", pickle.load, weights), ("model.npy", numpy.load, array)):
            path = os.path.join(loss.folder, name)
            seen.append((loss.done, name, os.path.exists(path), os.path.exists(path) and loads(path, load, expected)))

    recording = power_losses(run, check, root=folder)
    for name in ("model.pkl", "model.npy"):
        synced = synced_after(recording, name)
        assert any(op.kind == "write" for op in recording.ops[:synced]), recording.operations
        # Before its fsync the file may be there but torn or empty; after it, whole wherever it is.
        assert any(done < synced and present and not whole for done, n, present, whole in seen if n == name)
        assert all(whole for done, n, present, whole in seen if n == name and done >= synced and present)
        assert all(whole for done, n, present, whole in seen if n == name and done == len(recording.ops))


def file_work(folder: Path) -> list[Any]:
    """What a trainer does with files: every mode, text and binary; what it sees, and the bytes left."""
    folder.mkdir(parents=True, exist_ok=True)
    seen: list[Any] = []
    with open(folder / "log.txt", "w", encoding="utf-8") as f:
        f.write("step 1\nstep 2\n")
        seen.append(f.tell())
    with open(folder / "log.txt", "a", encoding="utf-8") as f:
        f.write("step 3 \u00e9\n")
    with open(folder / "log.txt", encoding="utf-8") as f:
        seen += [f.readline(), list(f)]
    with open(folder / "model.bin", "xb") as f:
        f.write(b"0123456789" * 60)
    with open(folder / "model.bin", "r+b") as f:
        f.seek(5)
        f.write(b"XY")
        seen.append(f.read(3))
        f.truncate(550)
    with open(folder / "model.bin", "rb", buffering=0) as f:
        seen += [f.read(8), f.readall()[-4:], f.readable(), f.writable(), f.seekable()]
    with open(folder / "model.bin", "ab") as f:
        seen += [f.readable(), f.writable(), f.tell()]
    seen += [(folder / name).read_bytes() for name in ("log.txt", "model.bin")]
    return seen


def test_files_opened_while_recording_behave_as_the_real_open(tmp_path: Path) -> None:
    real = file_work(tmp_path / "real")
    recorded: list[Any] = []
    recording = power_losses(lambda: recorded.append(file_work(tmp_path / "run")), lambda loss: None, root=tmp_path / "run")
    assert recorded == [real]
    assert sum(op.startswith("write(") for op in recording.operations) == 4, recording.operations
    assert "truncate(#1001, 550)" in recording.operations


def test_power_losses_follow_reads_and_appends(tmp_path: Path) -> None:
    """A read moves the offset the next write goes to; an append goes to the end, whoever appended last."""
    folder = tmp_path  # not under pyfakefs, whose os.lseek returns None (a text file in "a" mode asks tell())
    (folder / "header.bin").write_bytes(b"0123456789")
    (folder / "log.txt").write_bytes(b"line0\n")

    def run() -> None:
        fd = os.open(folder / "header.bin", os.O_RDWR)
        os.read(fd, 4)
        os.write(fd, b"AB")
        os.close(fd)
        with open(folder / "header.bin", "r+b") as f:  # read it all, then add to it through the same handle
            f.read()
            f.write(b"XYZ")
        first, second = open(folder / "log.txt", "a"), open(folder / "log.txt", "a")
        for f, line in ((first, "A\n"), (second, "B\n"), (first, "C\n")):
            f.write(line)
            f.flush()
        first.close()
        second.close()

    ends: list[tuple[bytes, bytes]] = []
    recording = power_losses(run, lambda loss: ends.append(
        (loss.state.content("header.bin"), loss.state.content("log.txt"))) if loss.returned else None, root=folder)
    assert [(op.offset, op.data) for op in recording.ops if op.kind == "write"] == [
        (4, b"AB"), (10, b"XYZ"), (6, b"A\n"), (8, b"B\n"), (10, b"C\n")], recording.operations
    assert (b"0123AB6789XYZ", b"line0\nA\nB\nC\n") in ends  # nothing lost: the unsynced writes may be, too


class Calls(Hook):
    def __init__(self) -> None:
        self.names: list[str] = []

    def after(self, call: Call, result: object) -> None:
        self.names.append(call.name)


def test_an_open_refused_while_recording_leaves_the_file_and_no_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "old.txt").write_text("kept")
    calls = Calls()
    with Interposer(tmp_path, calls, builtin_open=True) as interposer:
        with pytest.raises(ValueError, match="illegal newline value: x"):
            open(tmp_path / "new.txt", "w", newline="x")
        with pytest.raises(LookupError, match="unknown encoding: nope"):
            open(tmp_path / "old.txt", "w", encoding="nope")
        with pytest.raises(TypeError, match="'newline' must be str or None, not int"):
            open(tmp_path / "old.txt", "w", newline=1)  # type: ignore[call-overload]
        assert calls.names == []  # refused before the file was opened: not created, not truncated

        real_wrapper = io.TextIOWrapper

        def failing(buffer: Any, *args: Any, **kwargs: Any) -> io.TextIOWrapper:
            if not isinstance(buffer, io.BytesIO):
                raise OSError("a failure after the open")
            return real_wrapper(buffer, *args, **kwargs)

        monkeypatch.setattr(io, "TextIOWrapper", failing)
        with pytest.raises(OSError, match="a failure after the open") as failure:
            open(tmp_path / "old.txt", "a")
        monkeypatch.undo()
        # Closed by then, not when the last reference to the file object goes (the traceback holds one).
        assert calls.names[0] == "open" and calls.names[-1] == "close" and interposer.fds == {}, calls.names
        del failure
    assert os.listdir(tmp_path) == ["old.txt"] and (tmp_path / "old.txt").read_text() == "kept"


class Accessor310:
    """A stand-in for Python 3.10's pathlib._NormalAccessor: os's functions and io.open, bound at import."""

    open = io.open
    mkdir = os.mkdir
    unlink = os.unlink
    rename = os.rename
    replace = os.replace
    stat = os.stat


def test_power_losses_see_pathlib_of_python_3_10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Path.open, write_bytes, mkdir, unlink and replace call the accessor's functions on 3.10."""
    monkeypatch.setattr(pathlib, "_NormalAccessor", Accessor310, raising=False)
    accessor = Accessor310()

    def run() -> None:
        accessor.mkdir(tmp_path / "models")
        with accessor.open(tmp_path / "models" / "a.bin", "wb") as f:
            f.write(b"weights")
        accessor.replace(tmp_path / "models" / "a.bin", tmp_path / "models" / "b.bin")
        accessor.rename(tmp_path / "models" / "b.bin", tmp_path / "models" / "c.bin")
        accessor.unlink(tmp_path / "models" / "c.bin")

    recording = power_losses(run, lambda loss: None, root=tmp_path)
    created = next(op.inode for op in recording.ops if op.kind == "create")
    assert recording.operations == (
        "mkdir(models)", f"create(models/a.bin as #{created}, {0o666 & ~current_umask():#o})", f"write(#{created}, 7 bytes at 0)",
        "rename(models/a.bin -> models/b.bin)", "rename(models/b.bin -> models/c.bin)", "unlink(models/c.bin)")
    assert all(Accessor310.__dict__[name] is getattr(os, name) for name in ("mkdir", "unlink", "rename", "replace"))
    assert Accessor310.__dict__["open"] is io.open  # put back


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_on_python_3_10_an_incomplete_recording_names_pathlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("trainstatus._testing.record._PATHLIB_ACCESSOR", True)

    def run() -> None:
        os.symlink("elsewhere", tmp_path / "made-unseen")
        os.unlink(tmp_path / "made-unseen")

    with pytest.raises(IncompleteRecording, match=re.escape(
            "outside the folder; trace: ['unlink(made-unseen)']. On Python 3.10, pathlib's Path methods (open, "
            "write_bytes, mkdir, unlink, replace) reach os through pathlib._NormalAccessor, which the recording "
            "patches; if pathlib made that change, make it with open() and os calls instead, or run the test on "
            "Python 3.11 or later.") + "$"):
        power_losses(run, lambda loss: None, root=tmp_path)


def test_power_losses_see_a_file_removed_before_the_run_ends(folder: Path) -> None:
    """A scratch file written with the builtin open and deleted again: in the states while it lived."""
    folder.mkdir(parents=True)

    def run() -> None:
        with open(folder / "scratch.bin", "wb") as f:
            f.write(b"partial weights")
            os.fsync(f.fileno())
        os.remove(folder / "scratch.bin")
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    held: dict[bool, set[bytes | None]] = {True: set(), False: set()}

    def check(loss: PowerLoss) -> None:
        path = os.path.join(loss.folder, "scratch.bin")
        held[loss.returned].add(Path(path).read_bytes() if os.path.exists(path) else None)

    recording = power_losses(run, check, root=folder)
    assert recording.operations[0].startswith("create(scratch.bin as #"), recording.operations
    assert "unlink(scratch.bin)" in recording.operations
    assert b"partial weights" in held[False]  # a power loss while it existed leaves it
    assert held[True] == {None}  # removed, and the removal synced


def test_power_losses_refuse_a_removed_file_they_never_saw_made(folder: Path) -> None:
    folder.mkdir(parents=True)

    def run() -> None:
        os.symlink("elsewhere", folder / "made-unseen")  # no file the model records
        os.unlink(folder / "made-unseen")  # gone by the end: the replay alone would not notice

    with pytest.raises(IncompleteRecording, match=re.escape(
            f"made-unseen in {folder} was removed, renamed or linked by the run but never seen made: something "
            "the recorder does not see made it (C code writing on its own, os.symlink, pathlib under pyfakefs), "
            "so the power-loss states would miss it while it existed. Make it with open() or os calls, or "
            "outside the folder; trace: ['unlink(made-unseen)']")):
        power_losses(run, lambda loss: None, root=folder)


def test_power_losses_record_the_background_pruning(tmp_path: Path) -> None:
    store = StatusStore(tmp_path / NAME, history=1)
    store.set("a", "n", 0)
    store.set("a", "n", 1)

    def run() -> None:
        store.set("a", "n", 2)
        store.set("a", "n", 3)

    recording = power_losses(run, lambda loss: None, root=tmp_path)
    assert any(op.kind == "unlink" and ".history-" in op.rel for op in recording.ops)


def test_sigkill_at_a_point_kills_the_process_for_real(tmp_path: Path) -> None:
    path = tmp_path / NAME
    code = (
        "import sys; from trainstatus import StatusStore; from trainstatus.testing import kill_at\n"
        "s = StatusStore(sys.argv[1]); s.set('a', 'n', 1)\n"
        "with kill_at(1, 'written', sigkill=True):\n"
        "    s.set('a', 'n', 2)\n"
        "print('survived')\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == -9 and "survived" not in result.stdout, result
    assert len(temps(tmp_path)) == 1
    assert StatusStore(path).get("a", "n") == 1


def test_importing_trainstatus_or_its_plugin_stays_cheap() -> None:
    code = (
        "import sys, _trainstatus_pytest\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('trainstatus', 'pyfakefs')))\n"
        "import trainstatus\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest', 'pyfakefs')"
        " or m.startswith('trainstatus.testing') or m.startswith('trainstatus._testing')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    plugin_imports, library_imports = result.stdout.splitlines()[:2]
    # The plugin loads pytest (loaded already in any pytest run), never trainstatus or pyfakefs...
    assert plugin_imports == "[]"
    # ... and trainstatus never imports its testing module, pytest or pyfakefs.
    assert "trainstatus" not in library_imports and "pyfakefs" not in library_imports
