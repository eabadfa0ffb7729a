"""Where a checkpoint list's relative paths are rooted (_checkpoints/roots.py): ``checkpoint_root``
recorded by ``CheckpointList(root=...)`` and read the same way by every reader, from any current
directory: ``CheckpointList`` without a root, ``trainstatus check --files`` and ``prune-missing``
(run as a person would, in a subprocess from another folder), the history fallback's warning; and
files without it (ML-Agents' layout, older files) read relative to the current directory, as
before, with every message naming the folder it looked in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from _helpers import read_fresh, write

from trainstatus import (
    CheckpointList,
    GlobalTrainingStatus,
    StatusStore,
    TrainingStatusCheckpointWarning,
    TrainingStatusMissingWarning,
    TrainingStatusValueError,
)
from trainstatus._checkpoints.files import missing_files
from trainstatus._checkpoints.roots import BadRoot, base, recorded, to_record
from trainstatus._mlagents.status import StatusType

CURRENT = ("the current directory: {category} records no checkpoint_root, so its paths are read as ML-Agents "
           "writes them, relative to the folder mlagents-learn ran in")


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``trainstatus ARGS`` run in ``cwd``, as a person runs it from a shell there."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run([sys.executable, "-m", "trainstatus", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def trainer_run(project: Path, steps: tuple[int, ...] = (1, 2, 3), *, keep: int | None = None) -> Path:
    """A Transformers-style run folder ``project/out``: ``checkpoint-N/`` folders recorded by a
    ``CheckpointList`` rooted at ``out`` (as the integrations record them), relative paths."""
    out = project / "out"
    status = out / "training_status.json"
    with StatusStore(status) as store:
        checkpoints = CheckpointList(store, "transformers", keep=keep, root=out)
        for n in steps:
            write(out, f"checkpoint-{n}/model.safetensors", b"w" * n)
            write(out, f"checkpoint-{n}/trainer_state.json", b"{}")
            checkpoints.add(n, f"checkpoint-{n}")
    return status


def lines(output: str, level: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"{level}: ")]


# -- the issue: a run folder checked and pruned from the project folder ---------------------------


def test_a_run_folder_is_checked_pruned_and_resumed_from_any_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    status = trainer_run(project)
    assert read_fresh(status)["transformers"]["checkpoint_root"] == "."
    out = project / "out"
    for cwd, path in [(project, "out/training_status.json"), (elsewhere, str(status)), (out, "training_status.json")]:
        checked = cli("check", "--files", path, cwd=cwd)
        assert checked.returncode == 0, checked.stdout
        assert lines(checked.stdout, "info")[0] == (
            f"info: transformers: relative checkpoint paths are looked up under {out}, recorded in "
            "transformers/checkpoint_root")
        assert (f"ok: every checkpoint file listed exists with its recorded size (9 files, under {out})"
                in checked.stdout.splitlines())
    before = status.read_bytes()
    pruned = cli("prune-missing", "out/training_status.json", cwd=project)
    assert (pruned.returncode, pruned.stderr) == (0, "")
    assert pruned.stdout == ("nothing removed: every file a checkpoints list of out/training_status.json names "
                             "exists with its recorded size\n")
    assert status.read_bytes() == before
    # A reader without a root takes the recorded one, whatever its current directory.
    monkeypatch.chdir(elsewhere)
    with StatusStore(status) as store:
        checkpoints = CheckpointList(store, "transformers", keep=None)
        assert checkpoints.latest()["file_path"] == "checkpoint-3"  # type: ignore[index]
        assert checkpoints.resolve("checkpoint-3") == str(out / "checkpoint-3")
        assert checkpoints.prune_missing() == []


def test_a_run_folder_moved_with_its_status_file_still_resolves(tmp_path: Path) -> None:
    status = trainer_run(tmp_path / "project")
    moved = tmp_path / "archive" / "run-7"
    moved.parent.mkdir()
    os.rename(status.parent, moved)
    checked = cli("check", "--files", moved / "training_status.json", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    assert f"(9 files, under {moved})" in checked.stdout


def test_the_history_fallback_names_the_recorded_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # keep=1: the kept version before the last write lists checkpoint-1, removed since.
    status = trainer_run(tmp_path / "project", (1, 2), keep=1)
    out = status.parent
    status.unlink()
    monkeypatch.chdir(tmp_path)  # the project's parent: nothing there
    # What the integrations' last_complete_checkpoint does (integrations/_common.py): open with
    # resume=True, which puts the newest kept version back, then take the newest whole entry.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with StatusStore(status, resume=True) as store:
            assert CheckpointList(store, "transformers", keep=None, root=out).latest() is None
    (restored,) = [w.message for w in caught if isinstance(w.message, TrainingStatusMissingWarning)]
    assert ("That version lists 3 checkpoint file(s) that are missing now: transformers/checkpoints checkpoint-1; "
            "transformers/checkpoints checkpoint-1/model.safetensors; transformers/checkpoints "
            f"checkpoint-1/trainer_state.json (relative paths looked up under {out}, recorded in "
            "transformers/checkpoint_root). ") in str(restored)
    (skipped,) = [w.message for w in caught if isinstance(w.message, TrainingStatusCheckpointWarning)]
    assert "steps 1 (checkpoint-1 is missing)" in str(skipped)


# -- prune-missing never empties a list on a guess ---------------------------------------------------


def old_run(project: Path) -> Path:
    """The run folder of ``trainer_run`` as written before checkpoint_root existed (none recorded)."""
    status = trainer_run(project)
    with StatusStore(status) as store:
        store.delete("transformers", "checkpoint_root")
    return status


def test_prune_missing_refuses_to_empty_a_list_no_file_of_which_is_found_then_force_does(tmp_path: Path) -> None:
    project = tmp_path / "project"
    status = old_run(project)  # relative to out/, read from the project folder: not one file found
    before = status.read_bytes()
    refused = cli("prune-missing", "out/training_status.json", cwd=project)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "trainstatus: error: refused to prune out/training_status.json; nothing was changed: not one of the 9 files "
        f"transformers/checkpoints lists exists under {project} ({CURRENT.format(category='transformers')}), and "
        "pruning would empty the list: if its paths are relative to another folder (where mlagents-learn ran), "
        "run from there or pass --root DIR; if the checkpoints are really gone, `trainstatus prune-missing --force "
        "out/training_status.json` removes their entries\n")
    assert status.read_bytes() == before
    rooted = cli("prune-missing", "--root", "out", "out/training_status.json", cwd=project)
    assert (rooted.returncode, rooted.stdout.startswith("nothing removed: ")) == (0, True), rooted.stderr
    assert status.read_bytes() == before
    forced = cli("prune-missing", "--force", "out/training_status.json", cwd=project)
    assert (forced.returncode, forced.stderr) == (0, "")
    assert forced.stdout == "".join(f"removed from transformers/checkpoints: step {n}, checkpoint-{n}\n" for n in (1, 2, 3)) + (
        "3 checkpoint entries removed from out/training_status.json\n")
    assert read_fresh(status)["transformers"]["checkpoints"] == []
    assert (project / "out" / "checkpoint-3" / "model.safetensors").exists()  # files are not touched


def test_prune_missing_refuses_when_the_recorded_folder_holds_none_of_the_files(tmp_path: Path) -> None:
    status = trainer_run(tmp_path / "project")
    out = status.parent
    for n in (1, 2, 3):  # the checkpoints moved away, the status file left behind
        shutil.move(out / f"checkpoint-{n}", tmp_path / f"checkpoint-{n}")
    before = status.read_bytes()
    refused = cli("prune-missing", status, cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr == (
        f"trainstatus: error: refused to prune {status}; nothing was changed: not one of the 9 files "
        f"transformers/checkpoints lists exists under {out} (recorded in transformers/checkpoint_root), and pruning "
        "would empty the list: check that the checkpoints are in that folder and that transformers/checkpoint_root "
        "names it (a run folder moved without its status file?); if the checkpoints are really gone, `trainstatus "
        f"prune-missing --force {status}` removes their entries\n")
    assert status.read_bytes() == before
    # --root is for lists that record no folder: it does not move a recorded one.
    rooted = cli("prune-missing", "--root", tmp_path, status, cwd=tmp_path)
    assert rooted.returncode == 2 and f"exists under {out} (recorded in" in rooted.stderr
    assert status.read_bytes() == before


def test_prune_missing_still_prunes_a_list_with_one_file_found(tmp_path: Path) -> None:
    status = trainer_run(tmp_path / "project")
    shutil.rmtree(status.parent / "checkpoint-1")
    pruned = cli("prune-missing", status, cwd=tmp_path)
    assert (pruned.returncode, pruned.stderr) == (0, "")
    assert pruned.stdout == ("removed from transformers/checkpoints: step 1, checkpoint-1\n"
                             f"1 checkpoint entry removed from {status}\n")
    assert [e["steps"] for e in read_fresh(status)["transformers"]["checkpoints"]] == [2, 3]


# -- check --files names the folder ---------------------------------------------------------------


def test_check_files_of_an_old_file_names_the_folder_it_assumed_and_what_to_check(tmp_path: Path) -> None:
    project = tmp_path / "project"
    old_run(project)
    checked = cli("check", "--files", "out/training_status.json", cwd=project)
    assert checked.returncode == 1
    assert lines(checked.stdout, "info")[0] == (
        f"info: transformers: relative checkpoint paths are looked up under {project}, "
        f"{CURRENT.format(category='transformers')}")
    assert lines(checked.stdout, "warning") == [
        f"warning: transformers/checkpoints lists 9 files and not one of them exists under {project}: checkpoint-1, "
        "checkpoint-1/model.safetensors, checkpoint-1/trainer_state.json (and 6 more); if its paths are relative to "
        "another folder (where mlagents-learn ran), run from there or pass --root DIR; if the checkpoints are really "
        "gone, `trainstatus prune-missing --force out/training_status.json` removes every entry"]
    rooted = cli("check", "--files", "--root", "out", "out/training_status.json", cwd=project)
    assert rooted.returncode == 0, rooted.stdout
    assert lines(rooted.stdout, "info")[0] == (
        f"info: transformers: relative checkpoint paths are looked up under {project / 'out'}, given by --root")


def test_check_files_names_the_recorded_folder_of_each_missing_file(tmp_path: Path) -> None:
    status = trainer_run(tmp_path / "project")
    out = status.parent
    (out / "checkpoint-2" / "model.safetensors").unlink()
    checked = cli("check", "--files", status, cwd=tmp_path)
    assert checked.returncode == 1
    assert lines(checked.stdout, "warning") == [
        f"warning: transformers/checkpoints lists checkpoint-2/model.safetensors, which does not exist (under {out}); "
        f"a resume from it fails: put the file back, or `trainstatus prune-missing {status}` removes such entries"]


# -- ML-Agents' layout: no folder recorded, paths relative to where mlagents-learn ran --------------


def mlagents_run(project: Path) -> Path:
    """ML-Agents' own file (tests/data), its checkpoint files made under ``project`` as mlagents-learn does."""
    status = project / "results" / "walker_run" / "run_logs" / "training_status.json"
    status.parent.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "data" / "mlagents_training_status.json", status)
    document = json.loads(status.read_text())
    for keys in document.values():
        for entry in [*keys.get("checkpoints", []), *[keys[k] for k in ("final_checkpoint",) if k in keys]]:
            for path in [entry["file_path"], *entry["auxillary_file_paths"]]:
                write(project, path)
    return status


def test_mlagents_layout_is_read_relative_to_the_current_directory_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "ml-agents"
    status = mlagents_run(project)
    relative = status.relative_to(project)
    checked = cli("check", "--files", relative, cwd=project)
    assert checked.returncode == 0, checked.stdout
    assert lines(checked.stdout, "info")[0] == (  # one line for each behavior that lists files
        f"info: Walker: relative checkpoint paths are looked up under {project}, {CURRENT.format(category='Walker')}")
    assert "SoccerTwos" not in checked.stdout
    # From elsewhere --root names the folder mlagents-learn ran in; without it nothing is found.
    assert cli("check", "--files", "--root", project, status, cwd=tmp_path).returncode == 0
    assert cli("check", "--files", status, cwd=tmp_path).returncode == 1
    assert cli("prune-missing", status, cwd=tmp_path).returncode == 2
    monkeypatch.chdir(project)
    with StatusStore(status) as store:
        checkpoints = CheckpointList(store, "Walker", keep=None)
        assert checkpoints.latest()["steps"] == 2500000  # type: ignore[index]
        assert missing_files(store.to_dict(), status_path=store.path) == []
        assert "checkpoint_root" not in store.get("Walker", "checkpoints")[0]
    monkeypatch.chdir(tmp_path)
    with StatusStore(status) as store, pytest.warns(TrainingStatusCheckpointWarning, match=r"No checkpoint of Walker"):
        assert CheckpointList(store, "Walker", keep=None).latest() is None


def test_the_mlagents_drop_in_reads_a_file_with_a_recorded_folder(tmp_path: Path) -> None:
    status = trainer_run(tmp_path / "project")
    try:
        GlobalTrainingStatus.load_state(str(status))
        listed = GlobalTrainingStatus.get_parameter_state("transformers", StatusType.CHECKPOINTS)
        assert [entry["file_path"] for entry in listed] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
        GlobalTrainingStatus.set_parameter_state("transformers", StatusType.CHECKPOINTS, listed[1:])
        GlobalTrainingStatus.save_state(str(status))
    finally:
        GlobalTrainingStatus.reset()
    assert read_fresh(status)["transformers"]["checkpoint_root"] == "."  # carried through, as any key


# -- what is recorded ------------------------------------------------------------------------------


def test_the_folder_is_recorded_relative_to_the_status_file_inside_it_and_absolute_outside(tmp_path: Path) -> None:
    run = tmp_path / "run"
    status = str(run / "training_status.json")
    assert to_record(str(run), status) == "."
    assert to_record(str(run / "models" / "Walker"), status) == os.path.join("models", "Walker")
    assert to_record(str(tmp_path), status) == str(tmp_path)  # above it: a moved run folder would lose it
    assert to_record(str(tmp_path / "runner"), status) == str(tmp_path / "runner")  # a sibling sharing a prefix
    assert to_record(str(run), "s3://bucket/run/training_status.json") == str(run)
    # Symlinks resolved on both sides: the folder is the real file's, whichever link a reader opens.
    (run / "models").mkdir(parents=True)
    os.symlink(run, tmp_path / "link")
    assert to_record(str(tmp_path / "link" / "models"), status) == "models"
    assert to_record(str(run / "models"), str(tmp_path / "link" / "training_status.json")) == "models"


def test_a_list_given_a_root_records_it_with_its_entries_and_the_final_checkpoint(tmp_path: Path) -> None:
    status = tmp_path / "run" / "training_status.json"
    models = tmp_path / "run" / "models"
    with StatusStore(status) as store:
        CheckpointList(store, "Walker", root=models).set_final(1, write(models, "Walker-1.onnx"))
        assert store.get("Walker", "checkpoint_root") == "models"
        # Another root given wins, and is recorded with the next entry.
        elsewhere = tmp_path / "elsewhere"
        CheckpointList(store, "Walker", root=elsewhere).add(2, write(elsewhere, "Walker-2.onnx"))
        assert store.get("Walker", "checkpoint_root") == str(elsewhere)
        # Without a root nothing is recorded: ML-Agents' layout.
        CheckpointList(store, "Crawler").add(1, str(models / "Walker-1.onnx"))
        assert store.get("Crawler", "checkpoint_root") is None


def test_a_recorded_folder_no_reader_can_use_is_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    status = trainer_run(tmp_path / "project")
    with StatusStore(status) as store:
        store.set("transformers", "checkpoint_root", 5)
        with pytest.raises(TrainingStatusValueError) as info:
            CheckpointList(store, "transformers", keep=None).latest()
    assert str(info.value) == (
        f"transformers/checkpoint_root holds 5, which is not a folder path: the relative checkpoint paths of "
        f"transformers in {status} cannot be found. Set it to the directory they are relative to, or delete it "
        f"(trainstatus delete {status} transformers checkpoint_root) to read them from the current directory, or "
        "pass CheckpointList(root=...).")
    assert (info.value.category, info.value.key) == ("transformers", "checkpoint_root")
    fix = (f"transformers/checkpoint_root holds 5, which is not a folder path: set it to the folder the checkpoint "
           f"paths of transformers are relative to, or `trainstatus delete {status} transformers checkpoint_root` to "
           "read them as ML-Agents writes them (relative to the current directory, or --root)")
    checked = cli("check", "--files", status, cwd=tmp_path)
    assert lines(checked.stdout, "warning") == [
        f"warning: the 9 checkpoint files transformers lists were not checked: {fix}"]
    assert checked.returncode == 1
    before = status.read_bytes()
    refused = cli("prune-missing", "--force", status, cwd=tmp_path)
    assert (refused.returncode, refused.stderr) == (
        2, f"trainstatus: error: refused to prune {status}; nothing was changed: {fix}\n")
    assert status.read_bytes() == before


def test_files_another_list_names_under_its_own_folder_are_not_removed(tmp_path: Path) -> None:
    status = tmp_path / "training_status.json"
    shared = write(tmp_path, "a/shared.yaml")
    with StatusStore(status) as store:
        # "B" lists a/shared.yaml relative to the status file's folder; "A" lists the same file as
        # shared.yaml, relative to a/.
        CheckpointList(store, "B", root=tmp_path).add(1, write(tmp_path, "b/model.onnx"), auxillary_file_paths=[shared])
        first = CheckpointList(store, "A", keep=1, root=tmp_path / "a")
        first.add(1, write(tmp_path / "a", "model-1.onnx"), auxillary_file_paths=["shared.yaml"])
        first.add(2, write(tmp_path / "a", "model-2.onnx"))  # drops step 1: its shared.yaml is still B's
    assert not (tmp_path / "a" / "model-1.onnx").exists()
    assert (tmp_path / "a" / "shared.yaml").exists()
    assert missing_files(read_fresh(status), status_path=str(status)) == []


def test_a_relative_folder_without_a_local_status_file_and_a_removed_current_directory_are_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(BadRoot) as info:
        recorded("Walker", {"checkpoint_root": "."}, "s3://bucket/run/training_status.json")
    assert str(info.value) == ("Walker/checkpoint_root holds the relative path '.', relative to the folder of a "
                               "status file, and s3://bucket/run/training_status.json is not a local file")
    assert recorded("Walker", {"checkpoint_root": str(tmp_path)}, None) == str(tmp_path)  # absolute: needs none
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert base("Walker", {}, None).shown() == "the current directory (removed)"


# -- another folder recorded: the entries recorded before are moved onto it ------------------------


def test_entries_recorded_under_one_folder_still_resolve_after_another_is_recorded(tmp_path: Path) -> None:
    # The review's case: c1.pt, c2.pt recorded under A/, then c3.pt under B/ (a resume with another
    # output folder, or two save paths sharing one status file).
    status = tmp_path / "run" / "training_status.json"
    a, b = tmp_path / "A", tmp_path / "B"
    with StatusStore(status) as store:
        first = CheckpointList(store, "Walker", keep=None, root=a)
        first.add(1, write(a, "c1.pt", b"1"))
        first.add(2, write(a, "c2.pt", b"22"), auxillary_file_paths=[write(a, "c2.yaml", b"y")])
        CheckpointList(store, "Walker", keep=None, root=b).add(3, write(b, "c3.pt", b"333"))
    written = read_fresh(status)["Walker"]
    assert written["checkpoint_root"] == str(b)
    # Not under B/: absolute, naming the same files (the sizes' keys too).
    assert [(e["file_path"], e["auxillary_file_paths"], e["files"]) for e in written["checkpoints"]] == [
        (str(a / "c1.pt"), [], {str(a / "c1.pt"): 1}),
        (str(a / "c2.pt"), [str(a / "c2.yaml")], {str(a / "c2.pt"): 2, str(a / "c2.yaml"): 1}),
        ("c3.pt", [], {"c3.pt": 3})]
    checked = cli("check", "--files", status, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    assert f"ok: every checkpoint file listed exists with its recorded size (4 files, under {b})" in checked.stdout
    before = status.read_bytes()
    pruned = cli("prune-missing", status, cwd=tmp_path)
    assert (pruned.returncode, pruned.stdout.startswith("nothing removed: ")) == (0, True), pruned.stdout
    assert status.read_bytes() == before
    with StatusStore(status) as store:
        rootless = CheckpointList(store, "Walker", keep=None)
        assert rootless.prune_missing() == []
        assert rootless.resolve(written["checkpoints"][0]["file_path"]) == str(a / "c1.pt")


def test_a_dropped_entry_recorded_under_the_old_folder_has_its_files_removed_there(tmp_path: Path) -> None:
    status = tmp_path / "run" / "training_status.json"
    a, b = tmp_path / "A", tmp_path / "B"
    with StatusStore(status) as store:
        first = CheckpointList(store, "Walker", keep=2, root=a)
        first.add(1, write(a, "c1.pt"))
        first.add(2, write(a, "c2.pt"))
        write(b, "c1.pt", b"another run's")  # the same name in the new folder: not ours to remove
        CheckpointList(store, "Walker", keep=2, root=b).add(3, write(b, "c3.pt"))
    assert [e["file_path"] for e in read_fresh(status)["Walker"]["checkpoints"]] == [str(a / "c2.pt"), "c3.pt"]
    assert not (a / "c1.pt").exists()  # the dropped checkpoint's file, where it was recorded
    assert (b / "c1.pt").read_bytes() == b"another run's"


def test_entries_inside_the_new_folder_stay_relative_and_folders_move_with_their_files(tmp_path: Path) -> None:
    # A Transformers run recorded under out/, then a list rooted at the project folder above it.
    project = tmp_path / "project"
    status = trainer_run(project, (1, 2))
    with StatusStore(status) as store:
        write(project, "more/checkpoint-3/model.safetensors", b"www")
        CheckpointList(store, "transformers", keep=None, root=project).add(3, "more/checkpoint-3")
    written = read_fresh(status)["transformers"]
    assert written["checkpoint_root"] == str(project)  # above the status file's folder: absolute
    assert [(e["file_path"], sorted(e["files"])) for e in written["checkpoints"]] == [
        *((f"out/checkpoint-{n}", [f"out/checkpoint-{n}/model.safetensors", f"out/checkpoint-{n}/trainer_state.json"])
          for n in (1, 2)),
        ("more/checkpoint-3", ["more/checkpoint-3/model.safetensors"])]
    checked = cli("check", "--files", status, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    assert f"(8 files, under {project})" in checked.stdout


def test_set_final_under_another_folder_moves_the_list_too(tmp_path: Path) -> None:
    status = tmp_path / "run" / "training_status.json"
    models, final = tmp_path / "run" / "models", tmp_path / "run"
    with StatusStore(status) as store:
        CheckpointList(store, "Walker", root=models).add(1, write(models, "Walker-1.pt"))
        CheckpointList(store, "Walker", root=final).set_final(2, write(final, "Walker.onnx"))
    written = read_fresh(status)["Walker"]
    assert written["checkpoint_root"] == "."
    assert written["checkpoints"][0]["file_path"] == os.path.join("models", "Walker-1.pt")
    assert written["final_checkpoint"]["file_path"] == "Walker.onnx"
    assert missing_files(written, status_path=str(status)) == []


def test_mlagents_entries_are_moved_from_the_current_directory_when_a_folder_is_first_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ML-Agents' layout: relative to the folder mlagents-learn ran in, where every reader (the
    # current directory) found them until now.
    project = tmp_path / "ml-agents"
    run = project / "results" / "run1"
    status = run / "run_logs" / "training_status.json"
    listed = {"steps": 1, "file_path": write(project, "results/run1/Walker/Walker-1.onnx"), "reward": 1.0,
              "creation_time": 1.0, "auxillary_file_paths": [write(project, "results/run1/Walker/Walker-1.pt")]}
    with StatusStore(status) as store:
        store.set("Walker", "checkpoints", [listed])
    monkeypatch.chdir(project)
    with StatusStore(status) as store:
        CheckpointList(store, "Walker", keep=None, root=run).add(2, write(run, "Walker/Walker-2.onnx"))
    written = read_fresh(status)["Walker"]
    assert written["checkpoint_root"] == str(run)
    assert [(e["file_path"], e["auxillary_file_paths"]) for e in written["checkpoints"]] == [
        ("Walker/Walker-1.onnx", ["Walker/Walker-1.pt"]), ("Walker/Walker-2.onnx", [])]
    checked = cli("check", "--files", status, cwd=tmp_path)  # from anywhere now
    assert checked.returncode == 0, checked.stdout


def test_a_list_an_older_trainstatus_recorded_under_its_root_is_left_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Recorded with root=out by a trainstatus that did not record the folder: the files are under
    # out/, not under the current directory, so the entries already name them under the new root.
    project = tmp_path / "project"
    status = old_run(project)
    monkeypatch.chdir(project)
    out = project / "out"
    with StatusStore(status) as store:
        write(out, "checkpoint-4/model.safetensors")
        CheckpointList(store, "transformers", keep=None, root=out).add(4, "checkpoint-4")
    written = read_fresh(status)["transformers"]
    assert written["checkpoint_root"] == "."
    assert [e["file_path"] for e in written["checkpoints"]] == [f"checkpoint-{n}" for n in (1, 2, 3, 4)]
    assert cli("check", "--files", status, cwd=tmp_path).returncode == 0


def test_entries_relative_to_a_removed_current_directory_are_not_moved_on_a_guess(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    status = tmp_path / "run" / "training_status.json"
    with StatusStore(status) as store:
        store.set("Walker", "checkpoints", [{"steps": 1, "file_path": "models/Walker-1.onnx", "reward": 1.0,
                                             "creation_time": 1.0, "auxillary_file_paths": []}])
    before = status.read_bytes()
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    models = tmp_path / "models"
    with StatusStore(status) as store, pytest.raises(TrainingStatusValueError) as info:
        CheckpointList(store, "Walker", keep=None, root=models).add(2, write(models, "Walker-2.onnx"))
    assert str(info.value) == (
        f"Cannot record Walker/checkpoint_root in {status}: the checkpoints Walker lists are relative to the "
        f"current directory (it records no checkpoint_root), which was removed, and are not under {models}, so "
        "they cannot be moved onto it. Run from the folder they are relative to. Nothing was recorded or removed.")
    assert (info.value.category, info.value.key) == ("Walker", "checkpoint_root")
    assert status.read_bytes() == before


# -- prune-missing refuses whenever it would empty a list -------------------------------------------


def test_prune_missing_refuses_when_files_of_those_names_are_another_runs(tmp_path: Path) -> None:
    project = tmp_path / "project"
    status = old_run(project)  # relative to out/, read from the project folder...
    for n in (1, 2, 3):  # ...where another run left checkpoint-N folders of its own
        write(project, f"checkpoint-{n}/model.safetensors", b"x" * (10 + n))
        write(project, f"checkpoint-{n}/trainer_state.json", b"{}")
    before = status.read_bytes()
    refused = cli("prune-missing", "out/training_status.json", cwd=project)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "trainstatus: error: refused to prune out/training_status.json; nothing was changed: not one of the 3 entries "
        f"transformers/checkpoints lists is whole under {project} ({CURRENT.format(category='transformers')}; step 1: "
        "checkpoint-1/model.safetensors has 11 bytes, 1 recorded; step 2: checkpoint-2/model.safetensors has 12 "
        "bytes, 2 recorded; step 3: checkpoint-3/model.safetensors has 13 bytes, 3 recorded), and pruning would "
        "empty the list: if its paths are relative to another folder (where mlagents-learn ran), run from there or "
        "pass --root DIR; if the checkpoints are really gone, `trainstatus prune-missing --force "
        "out/training_status.json` removes their entries\n")
    assert status.read_bytes() == before
    checked = cli("check", "--files", "out/training_status.json", cwd=project)
    assert checked.returncode == 1
    assert lines(checked.stdout, "warning") == [
        f"warning: transformers/checkpoints lists 3 entries and not one of them is whole under {project}: step 1: "
        "checkpoint-1/model.safetensors has 11 bytes, 1 recorded; step 2: checkpoint-2/model.safetensors has 12 "
        "bytes, 2 recorded; step 3: checkpoint-3/model.safetensors has 13 bytes, 3 recorded; if its paths are "
        "relative to another folder (where mlagents-learn ran), run from there or pass --root DIR; if the "
        "checkpoints are really gone, `trainstatus prune-missing --force out/training_status.json` removes every entry"]
    forced = cli("prune-missing", "--force", "out/training_status.json", cwd=project)
    assert (forced.returncode, forced.stderr) == (0, "")
    assert read_fresh(status)["transformers"]["checkpoints"] == []


def test_prune_missing_refuses_to_drop_a_lists_only_checkpoint_whose_file_changed(tmp_path: Path) -> None:
    status = trainer_run(tmp_path / "project", (1,))
    out = status.parent
    (out / "checkpoint-1" / "model.safetensors").write_bytes(b"www")  # rewritten
    before = status.read_bytes()
    refused = cli("prune-missing", status, cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr == (
        f"trainstatus: error: refused to prune {status}; nothing was changed: not one of the 1 entry "
        f"transformers/checkpoints lists is whole under {out} (recorded in transformers/checkpoint_root; step 1: "
        "checkpoint-1/model.safetensors has 3 bytes, 1 recorded), and pruning would empty the list: check that the "
        "checkpoints are in that folder and that transformers/checkpoint_root names it (a run folder moved without "
        f"its status file?); if the checkpoints are really gone, `trainstatus prune-missing --force {status}` "
        "removes their entries\n")
    assert status.read_bytes() == before
