"""trainstatus.integrations.lightning on Lightning's real training loop (a tiny module on random tensors).

Every test runs the real library in children started with .venv-torch's interpreter
(tests/_lightning_trainer.py), so they are all in the ``integrations`` group (the ``torch_python``
fixture marks them). The random-kill test measures, on the same kills, how often Lightning's own
resume (``ckpt_path="last"``: the newest ``last*.ckpt``) fails to load and prints both figures:
docs/lightning.md quotes them.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from _lease_holder import another_job
from _trainer_child import ChildTrainer, OwnResume, users_line

from trainstatus import StatusStore

TRAINER = Path(__file__).resolve().parent / "_lightning_trainer.py"
CALLED = users_line(TRAINER, "last_complete_checkpoint(")  # where its warnings point


class Trainer(ChildTrainer):
    """One run of tests/_lightning_trainer.py (Lightning prints lines of its own too: skipped)."""

    script = TRAINER


def recorded(directory: Path, status: Path | None = None) -> list[tuple[int, str]]:
    status = status or directory / "training_status.json"
    if not status.exists():
        return []  # killed before the first checkpoint
    with StatusStore(status) as store:
        return [(e["steps"], e["file_path"]) for e in store.get("lightning", "checkpoints") or []]


def ckpts(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".ckpt"))


def cut_in_half(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


@pytest.fixture(scope="module")
def trained(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of a run of 16 steps, saving every 4 with save_top_k=2 and save_last=True."""
    directory = tmp_path_factory.mktemp("lightning") / "ckpts"
    trainer = Trainer(torch_python, dir=str(directory), max_steps=16, probe=True)
    trainer.finish()
    # ModelCheckpoint removed the step-4 and step-8 files through the plugin, each only once the
    # status file on disk no longer listed it.
    assert trainer.removed == [{"event": "removed", "name": "epoch=0-step=4.ckpt", "listed": False},
                               {"event": "removed", "name": "epoch=0-step=8.ckpt", "listed": False}]
    return directory


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained folder for one test to damage."""
    directory = tmp_path / "ckpts"
    shutil.copytree(trained, directory)
    return directory


def test_save_top_k_and_save_last_leave_exactly_what_the_list_records(trained: Path) -> None:
    assert ckpts(trained) == ["epoch=1-step=12.ckpt", "epoch=1-step=16.ckpt", "last.ckpt"]
    # last.ckpt saved four times over the same name: one entry, the newest.
    assert recorded(trained) == [(12, "epoch=1-step=12.ckpt"), (16, "epoch=1-step=16.ckpt"), (16, "last.ckpt")]
    assert not [n for n in os.listdir(trained) if n.endswith(".tmp")]


def test_a_ckpt_cut_in_half_is_skipped_with_a_warning(torch_python: Path, run: Path) -> None:
    whole, top_k = (run / "last.ckpt").stat().st_size, (run / "epoch=1-step=16.ckpt").stat().st_size
    cut_in_half(run / "last.ckpt")
    cut_in_half(run / "epoch=1-step=16.ckpt")
    events = Trainer(torch_python, dir=str(run), max_steps=16).finish()
    assert events["resumed"]["path"] == str(run / "epoch=1-step=12.ckpt")
    assert events["ready"]["step"] == 12  # Lightning restored it
    # The size recorded with each entry catches a file cut short first. Newest first: last.ckpt
    # was saved after the top-k file of the same step.
    assert events["resumed"]["warnings"] == [
        f"TrainingStatusCheckpointWarning: {run / 'epoch=1-step=12.ckpt'} is the newest whole checkpoint recorded "
        f"in {run / 'training_status.json'}; the newer ones cannot be resumed from: last.ckpt has {whole // 2:,} "
        f"bytes, {whole:,} recorded; epoch=1-step=16.ckpt has {top_k // 2:,} bytes, {top_k:,} recorded. "
        "They are left on disk: the checkpoints this run saves take their place. If you have whole copies of them, "
        f"stop, put them back in {run} and start again to resume from the newest."]
    assert events["resumed"]["where"] == [CALLED]


def local_header(path: Path, index: int) -> int:
    """The offset of the local header of ``path``'s member ``index`` (as its central directory says)."""
    with zipfile.ZipFile(path) as archive:
        return archive.infolist()[index].header_offset


def test_a_ckpt_whose_zip_structure_is_damaged_in_place_is_skipped(torch_python: Path, run: Path) -> None:
    # Their recorded sizes kept: the archive's structure is checked (its end record and central
    # directory, each member's local header), from metadata alone.
    with open(run / "last.ckpt", "r+b") as f:
        f.seek(-22, os.SEEK_END)
        f.write(bytes(22))  # the end-of-central-directory record
    damaged = local_header(run / "epoch=1-step=16.ckpt", 3)
    with open(run / "epoch=1-step=16.ckpt", "r+b") as f:
        f.seek(damaged)
        f.write(bytes(4))  # a member's local header signature
    with zipfile.ZipFile(run / "epoch=1-step=16.ckpt") as archive:
        member = archive.infolist()[3].filename
    events = Trainer(torch_python, dir=str(run), max_steps=16).finish()
    assert (events["resumed"]["path"], events["ready"]["step"]) == (str(run / "epoch=1-step=12.ckpt"), 12)
    assert events["resumed"]["warnings"] == [
        f"TrainingStatusCheckpointWarning: {run / 'epoch=1-step=12.ckpt'} is the newest whole checkpoint recorded in "
        f"{run / 'training_status.json'}; the newer ones cannot be resumed from: last.ckpt is not a whole torch "
        "checkpoint: its zip central directory cannot be read (File is not a zip file); epoch=1-step=16.ckpt is not a "
        f"whole torch checkpoint: member {member} has no local header at byte {damaged:,}, where the central "
        "directory puts it. They are left on disk: the checkpoints this run saves take their place. If you have "
        f"whole copies of them, stop, put them back in {run} and start again to resume from the newest."]


def test_a_listed_file_deleted_by_hand_is_skipped(torch_python: Path, run: Path) -> None:
    (run / "last.ckpt").unlink()
    (run / "epoch=1-step=16.ckpt").unlink()
    events = Trainer(torch_python, dir=str(run), max_steps=16).finish()
    assert (events["resumed"]["path"], events["ready"]["step"]) == (str(run / "epoch=1-step=12.ckpt"), 12)
    [warning] = events["resumed"]["warnings"]
    assert "last.ckpt is missing" in warning and "epoch=1-step=16.ckpt is missing" in warning


def test_resume_continues_from_the_recorded_global_step(torch_python: Path, tmp_path: Path) -> None:
    directory = tmp_path / "ckpts"
    Trainer(torch_python, dir=str(directory), max_steps=16).finish()
    trainer = Trainer(torch_python, dir=str(directory), max_steps=24, probe=True)
    events = trainer.finish()
    assert events["resumed"] == {"event": "resumed", "path": str(directory / "last.ckpt"), "warnings": [], "where": []}
    assert (events["ready"]["step"], events["done"]["step"]) == (16, 24)
    # save_top_k=2 goes on across the resume (Lightning restored its top-k state), each old file
    # removed only once the list on disk no longer named it.
    assert recorded(directory) == [(20, "epoch=2-step=20.ckpt"), (24, "epoch=2-step=24.ckpt"), (24, "last.ckpt")]
    assert ckpts(directory) == ["epoch=2-step=20.ckpt", "epoch=2-step=24.ckpt", "last.ckpt"]
    assert [(r["name"], r["listed"]) for r in trainer.removed] == [("epoch=1-step=12.ckpt", False),
                                                                   ("epoch=1-step=16.ckpt", False)]


def test_a_moved_folder_resumes_and_last_ckpt_gets_a_version_suffix(torch_python: Path, run: Path) -> None:
    # The folder was copied: ModelCheckpoint's saved state names another dirpath, so Lightning
    # starts its top-k afresh and, finding a last.ckpt it did not save, saves last-v1.ckpt. The
    # list records what was saved; the resume after that is the newest, last-v1.ckpt.
    events = Trainer(torch_python, dir=str(run), max_steps=24).finish()
    assert (events["resumed"]["path"], events["ready"]["step"]) == (str(run / "last.ckpt"), 16)
    assert recorded(run) == [(12, "epoch=1-step=12.ckpt"), (16, "epoch=1-step=16.ckpt"), (16, "last.ckpt"),
                             (20, "epoch=2-step=20.ckpt"), (24, "epoch=2-step=24.ckpt"), (24, "last-v1.ckpt")]
    events = Trainer(torch_python, dir=str(run), max_steps=28).finish()
    assert (events["resumed"]["path"], events["ready"]["step"]) == (str(run / "last-v1.ckpt"), 24)


def test_save_last_link_is_recorded_as_the_files_it_links(torch_python: Path, tmp_path: Path) -> None:
    # save_last="link": Lightning makes last.ckpt a symlink to the newest top-k file itself, past
    # the plugin. The list names the files saved; the resume is the newest of them.
    directory = tmp_path / "ckpts"
    Trainer(torch_python, dir=str(directory), max_steps=8, save_last="link").finish()
    assert os.readlink(directory / "last.ckpt") == "epoch=0-step=8.ckpt"
    assert recorded(directory) == [(4, "epoch=0-step=4.ckpt"), (8, "epoch=0-step=8.ckpt")]
    # A run that ends before its first top-k save saves last.ckpt as a file, through the plugin
    # (ModelCheckpoint.on_train_end): recorded like any other.
    events = Trainer(torch_python, dir=str(directory), max_steps=10, save_last="link").finish()
    assert (events["resumed"]["path"], events["ready"]["step"]) == (str(directory / "epoch=0-step=8.ckpt"), 8)
    assert not os.path.islink(directory / "last.ckpt")
    assert recorded(directory)[-1] == (10, "last.ckpt")
    # The next run links last.ckpt again (os.remove, os.symlink): the entry of the file it
    # replaced is dropped at the next save, never returned.
    events = Trainer(torch_python, dir=str(directory), max_steps=16, save_last="link").finish()
    assert (events["resumed"]["path"], events["ready"]["step"]) == (str(directory / "last.ckpt"), 10)
    entries = recorded(directory)  # (the epoch in the names: Lightning counts the resumed one again)
    assert [steps for steps, _ in entries] == [12, 16] and "last.ckpt" not in [name for _, name in entries]
    assert os.readlink(directory / "last.ckpt") == entries[-1][1]


def test_status_path_puts_the_record_where_it_says(torch_python: Path, tmp_path: Path) -> None:
    directory, status = tmp_path / "ckpts", tmp_path / "elsewhere" / "status.json"
    Trainer(torch_python, dir=str(directory), status_path=str(status), max_steps=8).finish()
    assert not (directory / "training_status.json").exists()
    assert recorded(directory, status) == [(4, "epoch=0-step=4.ckpt"), (8, "epoch=0-step=8.ckpt"), (8, "last.ckpt")]
    with StatusStore(status) as store:  # outside the status file's folder: recorded absolute
        assert store.get("lightning", "checkpoint_root") == str(directory)
    events = Trainer(torch_python, dir=str(directory), status_path=str(status), max_steps=12).finish()
    assert (events["resumed"]["path"], events["ready"]["step"]) == (str(directory / "last.ckpt"), 8)


PLUGIN = """
import os, sys, warnings
from lightning.pytorch.plugins.io import TorchCheckpointIO
from trainstatus import StatusStore
from trainstatus.integrations.lightning import TrainStatusCheckpointIO, last_complete_checkpoint

class Half(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path, storage_options=None):
        with open(path, "wb") as f:
            f.write(b"half of the new")
        raise RuntimeError("killed in the middle")

folder = sys.argv[1]
def ls():  # the status file's own history copies left out: a temp file of a save would show
    return [n for n in sorted(os.listdir(folder)) if not n.startswith(".training_status.json.history-")]
target = os.path.join(folder, "last.ckpt")
plugin = TrainStatusCheckpointIO()
plugin.save_checkpoint({"global_step": 4}, target)
old = open(target, "rb").read()
try:
    TrainStatusCheckpointIO(Half()).save_checkpoint({"global_step": 8}, target)
except RuntimeError:
    pass
print(open(target, "rb").read() == old, ls())
plugin.save_checkpoint({"global_step": 8}, target)
print(open(target, "rb").read() != old, last_complete_checkpoint(folder) == target)
with StatusStore(os.path.join(folder, "training_status.json")) as store:
    print([(e["steps"], e["file_path"]) for e in store.get("lightning", "checkpoints")])
plugin.remove_checkpoint(target)
print(ls(), last_complete_checkpoint(folder))
plugin.save_checkpoint({"global_step": 12}, target)
with open(target, "r+b") as f:
    f.seek(-22, 2)
    f.write(bytes(22))  # its recorded size kept: the zip's end record gone, the archive check refuses it
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print((last_complete_checkpoint(folder), [(os.path.basename(w.filename), str(w.message)) for w in caught]))
from lightning.pytorch.plugins.io import AsyncCheckpointIO
for attempt in (lambda: plugin.save_checkpoint({"global_step": 9}, "memory://bucket/last.ckpt"),
                lambda: TrainStatusCheckpointIO(AsyncCheckpointIO())):
    try:
        attempt()
    except Exception as exc:
        print(type(exc).__name__, str(exc).split(":")[0])
"""


def test_a_failed_save_of_last_ckpt_leaves_the_old_file_and_no_temp(torch_python: Path, tmp_path: Path) -> None:
    result = subprocess.run([str(torch_python), "-c", PLUGIN, str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        # The run lease of the status file (.run), held from the plugin's first save to the exit.
        "True ['last.ckpt', 'training_status.json', 'training_status.json.lock', 'training_status.json.run']",
        "True True",
        "[(8, 'last.ckpt')]",
        "['training_status.json', 'training_status.json.lock', 'training_status.json.run'] None",
        # Nothing whole: None, said in a Lightning user's words, pointing at the call.
        str((None, [("<string>", f"No checkpoint recorded in {tmp_path / 'training_status.json'} can be resumed "
                                 "from: last.ckpt is not a whole torch checkpoint: its zip central directory cannot "
                                 "be read (File is not a zip file). "
                                 "last_complete_checkpoint() returns None: trainer.fit(ckpt_path=None) starts at "
                                 "step 0 and saves its checkpoints beside these. To keep these files, stop and move "
                                 f"them out of {tmp_path}, "
                                 "or give ModelCheckpoint another dirpath; if you have whole copies of them, put them "
                                 f"back in {tmp_path} and start again.")])),
        # A remote folder is recorded (test_a_run_on_s3_...), on a store trainstatus keeps a status file on:
        # fsspec's memory:// is none, and nothing is uploaded before that is said.
        "TrainingStatusValueError Cannot tell where to keep the status file of ModelCheckpoint's dirpath in memory",
        ("TrainingStatusTypeError TrainStatusCheckpointIO checkpoint_io= must be a Lightning CheckpointIO that has "
         "written the file when save_checkpoint returns (TorchCheckpointIO, the default), not 'AsyncCheckpointIO'"),
    ]


def test_import_trainstatus_imports_neither_torch_nor_lightning_where_they_are_installed(torch_python: Path) -> None:
    code = ("import sys, trainstatus, trainstatus.integrations\n"
            "trainstatus.StatusStore, trainstatus.CheckpointList\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'lightning_fabric')))\n")
    result = subprocess.run([str(torch_python), "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def _other_filesystem(tmp_path: Path) -> str | None:
    """A folder on another filesystem than ``tmp_path`` (/dev/shm, a tmpfs), or None."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev:
        return tempfile.mkdtemp(dir=shm, prefix="trainstatus-lightning-")
    return None


def test_random_kills_resume_from_the_last_recorded_checkpoint(torch_python: Path, tmp_path: Path, seed: int) -> None:
    """SIGKILL a Lightning run at random moments (20 kills), saves slowed by wide layers, with a
    second ModelCheckpoint saving through Lightning's own TorchCheckpointIO in the same run. After
    each kill the next run resumes with ``last_complete_checkpoint``: it loads, it is the newest
    recorded checkpoint (never older), and training goes on; the same child tries Lightning's own
    ``ckpt_path="last"`` on the other folder. TMPDIR is on another filesystem than the
    checkpoints when the machine has one (/dev/shm), as on machines whose /tmp is a tmpfs: the
    temp file Lightning writes first is then copied into place, not renamed."""
    rng = random.Random(seed)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    scratch = _other_filesystem(tmp_path)
    env = {"TMPDIR": scratch} if scratch else {}
    kills = 20
    own = OwnResume()
    mid_save = resumes = leaked = 0
    last_recorded, newest = 0, None
    try:
        for kill in range(kills + 1):
            trainer = Trainer(torch_python, env=env, dir=str(ours), theirs=str(theirs), every=3, top_k=2, width=1024,
                              seed=kill, max_steps=10**6 if kill < kills else last_recorded + 6)
            try:
                resumed = trainer.until("resumed")
                assert resumed["warnings"] == [], (kill, resumed)
                # The newest entry recorded before the kill (Lightning names a re-save -v1, -v2...).
                assert resumed["path"] == (str(ours / newest) if newest else None), (kill, resumed)
                resumes += resumed["path"] is not None
                own.add(trainer.until("theirs"))
                # Lightning loaded it in the child: never behind what was recorded before the kill.
                assert trainer.until("ready")["step"] == last_recorded, (kill, resumed)
                if kill == kills:
                    done = trainer.finish()["done"]  # training goes on after the last kill, to its end
                    assert done["step"] == last_recorded + 6
                    break
                time.sleep(rng.uniform(0.0, 1.5))  # a random moment: in a step or a save
            finally:
                trainer.kill()
            mid_save += any(n.endswith(".tmp") for n in os.listdir(ours)) if ours.exists() else 0
            if scratch:
                for name in os.listdir(scratch):  # fsspec's temp files (mkstemp) of saves the kill cut short
                    if name.startswith("tmp") and os.path.isfile(os.path.join(scratch, name)):
                        leaked += 1
                        os.remove(os.path.join(scratch, name))
            entries = recorded(ours)
            steps = [s for s, _ in entries]
            # The list never names a file that is gone. (More than save_top_k=2 files plus last.ckpt
            # can be listed: Lightning never removes the file a run resumed from, and that run
            # drops it from its top-k, so it stays on disk, listed, for good.)
            assert steps == sorted(steps) and all((ours / f).exists() for _, f in entries)
            assert not steps or steps[-1] >= last_recorded
            last_recorded = steps[-1] if steps else 0
            newest = max(enumerate(entries), key=lambda item: (item[1][0], item[0]))[1][1] if entries else None
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    # The temp files of the saves the kills cut short were removed by the next run's plugin.
    assert not [n for n in os.listdir(ours) if n.endswith(".tmp")]
    where = "on another filesystem (/dev/shm)" if scratch else "on the same filesystem"
    print(f"\nLightning integration, {kills} SIGKILLs at random moments ({mid_save} inside a trainstatus save), "
          f"TMPDIR {where}:\n"
          f"  last_complete_checkpoint: {resumes} resumes from a checkpoint, 0 failed to load, "
          "0 went back past the last recorded one\n"
          f"  ckpt_path=\"last\" (Lightning's own): {own.failed} of {own.tried} failed to load; "
          f"{leaked} temp files left in TMPDIR")
    sys.stdout.flush()


NEW_FOLDER = r"""
import json, os, sys
import trainstatus._checkpoints.folders as checkpoints
from trainstatus.integrations.lightning import TrainStatusCheckpointIO

run = sys.argv[1]
synced = []
real = checkpoints._fsync
checkpoints._fsync = lambda path, directory=False: (synced.append(os.path.realpath(path)), real(path, directory=directory))[1]
plugin = TrainStatusCheckpointIO(status_path=os.path.join(run, "run_logs", "training_status.json"))
plugin.save_checkpoint({"global_step": 1, "state_dict": {}}, os.path.join(run, "checkpoints", "new", "epoch=0.ckpt"))
plugin.teardown()
print(json.dumps([p for p in synced if p in (os.path.join(run, "checkpoints"), run)]))
"""


def test_a_new_checkpoint_folder_is_durable_before_its_first_checkpoint_is_recorded(
        torch_python: Path, tmp_path: Path) -> None:
    # Lightning's dirpath made by the first save, the status file elsewhere in the run folder: the
    # folders above dirpath are synced up to the run folder, or a power loss could lose dirpath
    # while the list names its file.
    run = tmp_path / "run"
    (run / "run_logs").mkdir(parents=True)
    done = subprocess.run([str(torch_python), "-c", NEW_FOLDER, str(run)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [str(run / "checkpoints"), str(run)]


POWER_LOSS = Path(__file__).resolve().parent / "_lightning_power_loss.py"


def test_a_power_loss_never_leaves_a_listed_checkpoint_gone_or_torn(torch_python: Path, tmp_path: Path) -> None:
    # One real save (Trainer.fit, one step, ModelCheckpoint through the plugin) recorded by
    # trainstatus.testing.power_losses, every state a power loss could leave checked in the child
    # (tests/_lightning_power_loss.py): whatever the status file lists there is whole. The status
    # file is in run_logs/, apart from the checkpoints: its own folder sync covers nothing of
    # ckpts/. A SIGKILL cannot tell a missing fsync; this can: without the fsync of the file
    # before its rename, a state lists the checkpoint with its data lost (0 bytes, or torn); without
    # the sync of ckpts/ after it, one lists a checkpoint whose name never reached the disk.
    done = subprocess.run([str(torch_python), str(POWER_LOSS), str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] == []
    operations = result["operations"]
    # The save the states were made of: Lightning's temp file (fsspec, in TMPDIR) renamed to ours
    # in ckpts/, fsynced, renamed into place, the folder synced; then the record.
    saved = next(i for i, op in enumerate(operations) if op.startswith("rename(ckpts/.epoch=0-step=1.ckpt.trainstatus-")
                 and op.endswith(" -> ckpts/epoch=0-step=1.ckpt)"))
    assert operations[saved + 1] == "dirsync(ckpts)" and operations[saved - 1].startswith("fsync(#")
    # The record's write last, then the run lease emptied at teardown (not synced: it names a job only).
    assert operations[-2] == "dirsync(run_logs)" and re.fullmatch(r"truncate\(#\d+, 0\)", operations[-1]), operations[-3:]
    assert result["states"] > 50


def test_the_run_folder_is_checked_from_any_current_directory(trained: Path) -> None:
    # The status file records where its relative paths are rooted (the run folder itself: "."),
    # so `trainstatus check --files` finds every file from the project folder too.
    directory = trained
    status = directory / "training_status.json"
    with StatusStore(status) as store:
        assert store.get("lightning", "checkpoint_root") == "."
    done = subprocess.run([sys.executable, "-m", "trainstatus", "check", "--files", f"{directory.name}/training_status.json"],
                          cwd=directory.parent, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"info: lightning: relative checkpoint paths are looked up under {directory}, recorded in "
            "lightning/checkpoint_root\n") in done.stdout


READS = r"""
import json, os, sys, warnings, zipfile
import torch
from trainstatus.integrations.lightning import TrainStatusCheckpointIO, last_complete_checkpoint

def read_so_far():  # bytes this process has read with read() and its kin, from any file
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))

figures = {}
plugin = TrainStatusCheckpointIO()
for name, side in (("small", 16), ("big", 256)):  # the same 400 tensors, of 1 KB or of 256 KB each
    folder = os.path.join(sys.argv[1], name)
    plugin.save_checkpoint({"global_step": 1, "state_dict": {f"w{i}": torch.ones(side, side) for i in range(400)}},
                           os.path.join(folder, "last.ckpt"))
    last_complete_checkpoint(folder)  # the first call imports what it needs
    before = read_so_far()
    path = last_complete_checkpoint(folder)
    read = read_so_far() - before
    figures[name] = {"size": os.path.getsize(path), "members": len(zipfile.ZipFile(path).infolist()), "read": read}
# Bytes inside a member's data changed in place, the size kept: not seen (nothing reads the data).
with zipfile.ZipFile(path) as archive:
    info = max(archive.infolist(), key=lambda i: i.compress_size)
with open(path, "r+b") as f:
    f.seek(info.header_offset + info.compress_size // 2)
    f.write(bytes(100))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    figures["changed"] = [last_complete_checkpoint(os.path.dirname(path)) == path, [str(w.message) for w in caught]]
print(json.dumps(figures))
"""


def test_the_check_reads_metadata_not_data(torch_python: Path, tmp_path: Path) -> None:
    # Two checkpoints of the same 400 tensors, one of 400 KB and one of 100 MB: what
    # last_complete_checkpoint reads (every read of the process, /proc/self/io) is the same few KB
    # for both: the status file, the zip's end record and central directory, each member's local
    # header. Bytes changed inside a tensor's data are not seen (the documented limit): a check that
    # read the data (ZipFile.testzip, the CRC of every member) would refuse that checkpoint.
    done = subprocess.run([str(torch_python), "-c", READS, str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    small, big = figures["small"], figures["big"]
    assert small["members"] == big["members"] > 400 and big["size"] > 100 * 2**20
    assert big["read"] <= small["read"] + 1024  # the same reads, whatever the tensors weigh
    assert big["read"] < 200 * big["members"] + 64 * 1024  # O(members): about 100 bytes a member
    assert figures["changed"] == [True, []]
    print(f"\nlast_complete_checkpoint read {small['read']:,} bytes for a {small['size']:,}-byte checkpoint and "
          f"{big['read']:,} bytes for a {big['size']:,}-byte one ({big['members']} members each)")


WRONG_PATHS = r"""
import json, os, sys
from trainstatus.integrations.lightning import last_complete_checkpoint
folder = sys.argv[1]
seen = []
named = os.path.join(sys.argv[2], "model.ckpt")  # a dirpath that only looks like a checkpoint: it holds the list
os.makedirs(named)
open(os.path.join(named, "training_status.json"), "w").write("{}")
import fsspec
fsspec.filesystem("memory").pipe("bucket/ckpts/last.ckpt", b"a checkpoint")  # Lightning's own upload, in a word
for given in (os.path.join(folder, "last.ckpt"), "memory://bucket/ckpts/last.ckpt", named):
    try:
        seen.append(["returned", last_complete_checkpoint(given)])
    except Exception as exc:
        seen.append([type(exc).__name__, str(exc)])
print(json.dumps(seen))
"""


def test_a_checkpoint_given_for_its_folder_is_refused_locally_and_remotely(torch_python: Path, trained: Path,
                                                                      tmp_path: Path) -> None:
    # last_complete_checkpoint("ckpts/last.ckpt") used to return None, and the run trained from
    # step 0 with no word; so did a remote checkpoint given for its folder.
    done = subprocess.run([str(torch_python), "-c", WRONG_PATHS, str(trained), str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (kind, message), (remote_kind, remote), named = json.loads(done.stdout)
    assert named == ["returned", None]
    assert kind == "TrainingStatusValueError", message
    assert message.startswith(f"last_complete_checkpoint('{trained / 'last.ckpt'}'): {trained / 'last.ckpt'} is a "
                              f"checkpoint itself. Pass the folder that holds the checkpoints (ModelCheckpoint's "
                              f"dirpath), {trained}:"), message
    assert remote_kind == "TrainingStatusValueError", remote
    assert remote.startswith("last_complete_checkpoint('memory://bucket/ckpts/last.ckpt'): memory://bucket/ckpts/"
                             "last.ckpt is a checkpoint itself. Pass the folder that holds the checkpoints "
                             "(ModelCheckpoint's dirpath), memory://bucket/ckpts:"), remote


# A one-layer module that counts its steps, for the scripts below.
TINY = r"""
import json, os, sys
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset
from trainstatus.integrations.lightning import TrainStatusCallback, TrainStatusCheckpointIO

class Tiny(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.steps = 0
    def training_step(self, batch, index):
        self.steps += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
"""

REMOTE_AT_SETUP = TINY + r"""
from lightning.pytorch.loggers import CSVLogger
model = Tiny()
data = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
case, local = sys.argv[2], sys.argv[1]
dirpath = {"dirpath": "memory://bucket/ckpts", "logger": None, "root": local + "/ckpts"}[case]
logger = CSVLogger("memory://bucket/logs") if case == "logger" else False
root = "memory://bucket/root" if case == "root" else local
trainer = Trainer(max_steps=4, logger=logger, enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir=root, plugins=[TrainStatusCheckpointIO()],
                  callbacks=[ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2), TrainStatusCallback()])
try:
    trainer.fit(model, data)
    print(json.dumps(["trained", model.steps]))
except Exception as exc:
    print(json.dumps([type(exc).__name__, str(exc), model.steps]))
"""


@pytest.mark.parametrize("case", ["dirpath", "logger", "root"])
def test_a_remote_checkpoint_folder_is_refused_before_anything_trains(torch_python: Path, tmp_path: Path,
                                                                      case: str) -> None:
    # fsspec's memory:// is a remote folder on a store trainstatus keeps no status file on (s3://,
    # gs://, az:// it does: test_a_run_on_s3_...): refused at the start of fit, not at the first
    # save after the first steps' work. "dirpath": given remote; "logger": dirpath None, resolved
    # from a remote logger's save_dir; "root": a remote default_root_dir with a local dirpath trains.
    done = subprocess.run([str(torch_python), "-c", REMOTE_AT_SETUP, str(tmp_path), case], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.splitlines()[-1])
    if case == "root":
        assert said == ["trained", 4]
        return
    kind, message, steps = said
    assert (kind, steps) == ("TrainingStatusValueError", 0), message
    assert message.startswith("Cannot tell where to keep the status file of ModelCheckpoint's dirpath in "
                              "memory://bucket/"), message
    assert message.endswith("Pass status_path= (a local path, or an s3://, gs:// or az:// URL)."), message


UNRECORDED_SHAPES = r"""
import json, os, sys, warnings
from trainstatus.integrations.lightning import last_complete_checkpoint
folder = sys.argv[1]
os.makedirs(os.path.join(folder, "last.ckpt", "checkpoint"))  # DeepSpeedStrategy's .ckpt folder
open(os.path.join(folder, "last.ckpt", "checkpoint", "mp_rank_00_model_states.pt"), "wb").write(b"m")
open(os.path.join(folder, "last.ckpt", "latest"), "w").write("checkpoint")
open(os.path.join(folder, "epoch=0-step=4.ckpt"), "wb").write(b"c")  # saved without the plugin
os.makedirs(os.path.join(folder, "exports"))  # not a checkpoint, though it holds a file named latest
open(os.path.join(folder, "exports", "latest"), "w").write("v2")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(json.dumps([last_complete_checkpoint(folder), [str(w.message) for w in caught]]))
try:
    print(json.dumps(["returned", last_complete_checkpoint(os.path.join(folder, "last.ckpt"))]))
except Exception as exc:
    print(json.dumps([type(exc).__name__, str(exc)]))
"""


def test_checkpoints_of_every_shape_nothing_recorded_are_named(torch_python: Path, tmp_path: Path) -> None:
    # The plugin alone under a strategy that saves past it (DeepSpeed), or a Trainer without the
    # plugin: last_complete_checkpoint returned None with no word (only DCP folders were named).
    folder = tmp_path / "ckpts"
    done = subprocess.run([str(torch_python), "-c", UNRECORDED_SHAPES, str(folder)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    path, [warning] = json.loads(done.stdout.splitlines()[-2])
    kind, refusal = json.loads(done.stdout.splitlines()[-1])  # the DeepSpeed .ckpt folder given for its folder
    assert kind == "TrainingStatusValueError" and refusal.startswith(
        f"last_complete_checkpoint('{folder / 'last.ckpt'}'): {folder / 'last.ckpt'} is a checkpoint itself."), refusal
    status = folder / "training_status.json"
    assert path is None
    assert warning == (
        f"last.ckpt in {folder} is a DeepSpeed checkpoint (saved by DeepSpeedStrategy, past TrainStatusCheckpointIO) "
        f"that {status} has never recorded, so last_complete_checkpoint() does not return it. Add TrainStatusCallback() "
        "to the Trainer's callbacks beside the plugin: it records DeepSpeedStrategy's saves. "
        f"epoch=0-step=4.ckpt in {folder} is a checkpoint that {status} has never recorded (saved without "
        "TrainStatusCheckpointIO as the strategy's checkpoint_io, or under another status_path, or a first save cut "
        "short before its record), so last_complete_checkpoint() does not return it. Give the Trainer "
        "plugins=[TrainStatusCheckpointIO()], and pass last_complete_checkpoint the same status_path.")


REUSED_CALLBACK = r"""
import json
from lightning.pytorch.strategies import ModelParallelStrategy
from trainstatus.integrations.lightning import TrainStatusCallback, TrainStatusCheckpointIO

callback, seen = TrainStatusCallback(), []
for fit, ends in enumerate(["exception", "nothing", "teardown"]):
    strategy = ModelParallelStrategy()  # a new Trainer's strategy; its sharded saves are the callback's to wrap
    strategy.checkpoint_io = TrainStatusCheckpointIO()
    trainer = type("Trainer", (), {"strategy": strategy})()
    callback.setup(trainer, None, "validate")
    wrapped = "save_checkpoint" in vars(strategy)
    if ends == "exception":  # a fit that raised: Lightning calls on_exception, never teardown
        callback.on_exception(trainer, None, RuntimeError("the fit failed"))
    elif ends == "teardown":
        callback.teardown(trainer, None, "validate")
    seen.append([wrapped, "save_checkpoint" in vars(strategy)])
print(json.dumps(seen))
"""


def test_a_callback_reused_after_a_fit_that_raised_wraps_the_next_strategy(torch_python: Path) -> None:
    # A fit whose set-up raised (a refusal) never reached teardown: the callback, reused with the
    # next Trainer's strategy, wrapped nothing, and that fit's sharded saves went unrecorded.
    done = subprocess.run([str(torch_python), "-c", REUSED_CALLBACK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # [wrapped at set-up, still wrapped at the end]: unwrapped by on_exception; the next strategy
    # wrapped even when the one before it was never unwrapped; unwrapped by teardown.
    assert json.loads(done.stdout.splitlines()[-1]) == [[True, False], [True, True], [True, False]]


STATUS_INSIDE = r"""
import json, os, sys
from trainstatus.integrations.lightning import TrainStatusCheckpointIO, last_complete_checkpoint
base = sys.argv[1]
folder = os.path.join(base, "ckpts")
inside = os.path.join(folder, "last.ckpt", "training_status.json")
seen = []
for call in (lambda: last_complete_checkpoint(folder, status_path=inside),
             lambda: TrainStatusCheckpointIO(status_path=inside).checkpoints(folder),
             # a folder of the user's named like a checkpoint, above ModelCheckpoint's dirpath: not one
             lambda: last_complete_checkpoint(os.path.join(base, "runs.ckpt", "ck"),
                                              status_path=os.path.join(base, "runs.ckpt", "ck", "status.json"))):
    try:
        seen.append(["returned", str(call())])
    except Exception as exc:
        seen.append([type(exc).__name__, str(exc)])
print(json.dumps(seen))
"""


def test_a_status_file_inside_a_ckpt_folder_is_refused(torch_python: Path, tmp_path: Path) -> None:
    # A sharded or DeepSpeed last.ckpt is saved over in place, and ModelCheckpoint removes old ones.
    done = subprocess.run([str(torch_python), "-c", STATUS_INSIDE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    read, plugin, theirs = json.loads(done.stdout.splitlines()[-1])
    inside, folder = tmp_path / "ckpts" / "last.ckpt" / "training_status.json", tmp_path / "ckpts" / "last.ckpt"
    said = (f"the status file {inside} would lie inside the checkpoint {folder}, which the strategy saves over and "
            "ModelCheckpoint removes, the status file with it.")
    assert read[0] == plugin[0] == "TrainingStatusValueError", (read, plugin)
    assert read[1].startswith(f"last_complete_checkpoint('{tmp_path / 'ckpts'}'): {said}"), read
    assert plugin[1].startswith(f"TrainStatusCheckpointIO: {said}"), plugin
    assert theirs == ["returned", "None"]


SECOND_JOB = TINY + r"""
folder, case = sys.argv[1], sys.argv[2]
model = Tiny()
data = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
callbacks = [ModelCheckpoint(dirpath=folder, every_n_train_steps=2)]
trainer = Trainer(max_steps=4, logger=False, enable_progress_bar=False, enable_model_summary=False,
                  plugins=[TrainStatusCheckpointIO()],
                  callbacks=callbacks + ([TrainStatusCallback()] if case == "callback" else []))
try:
    trainer.fit(model, data)
    print(json.dumps(["trained", model.steps, sorted(os.listdir(folder))]))
except Exception as exc:
    print(json.dumps([type(exc).__name__, str(exc), model.steps, sorted(os.listdir(folder))]))
"""


@pytest.mark.parametrize("case", ["callback", "plugin"])
def test_a_second_job_on_the_folder_is_refused_before_it_writes(torch_python: Path, tmp_path: Path, case: str) -> None:
    # Another job holds the run lease of ckpts/training_status.json. With TrainStatusCallback this job
    # stops at the start of fit, before any step; with the plugin alone, at its first save, before
    # the file is written. Once that job is gone, the same run trains and records.
    folder = tmp_path / "ckpts"
    command = [str(torch_python), "-c", SECOND_JOB, str(folder), case]
    with another_job(str(folder / "training_status.json"), run="first-job") as job:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    kind, message, trained, files = json.loads(done.stdout.splitlines()[-1])
    who = "TrainStatusCallback" if case == "callback" else "TrainStatusCheckpointIO"
    assert kind == "TrainingStatusInUseError", message
    assert message.startswith(f"{who}: another job is training on {folder / 'training_status.json'}: process "
                              f"{job.pid} on "), message
    assert "run 'first-job'" in message
    assert trained == (0 if case == "callback" else 2)
    assert not [name for name in files if name.endswith(".ckpt")] and "training_status.json" not in files
    # That job was killed: its lease is taken over (a note on the log), and given back at teardown.
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    kind, trained, files = json.loads(again.stdout.splitlines()[-1])
    assert (kind, trained) == ("trained", 4), again.stderr[-3000:]
    assert [name for name in files if not name.startswith(".training_status.json.history-")] == [
        "epoch=1-step=4.ckpt", "training_status.json", "training_status.json.lock", "training_status.json.run"]
    assert (folder / "training_status.json.run").read_bytes() == b""  # given back at teardown
    assert f"trainstatus took over the run lease {folder / 'training_status.json.run'} from process {job.pid}" in (
        again.stderr)



ON_S3 = TINY + r"""
import warnings
from lightning.pytorch import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from trainstatus.integrations.lightning import last_complete_checkpoint

def say(record):  # one write per line: the two ranks share stdout
    os.write(1, (json.dumps(record) + "\n").encode())

class Logged(Tiny):
    def training_step(self, batch, index):
        self.log("progress", float(self.global_step))  # ModelCheckpoint keeps the 2 newest, and removes the rest
        return super().training_step(batch, index)

class Dies(TorchCheckpointIO):  # a kill once last.ckpt of the last step is uploaded, before its record
    def save_checkpoint(self, checkpoint, path, storage_options=None):
        super().save_checkpoint(checkpoint, path, storage_options)
        if path.endswith("/last.ckpt") and checkpoint["global_step"] == int(sys.argv[2]):
            os._exit(9)

class Start(Callback):
    def on_train_start(self, trainer, module):
        say({"start": trainer.global_step})

url, steps, die, ddp = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "die", sys.argv[3] == "ddp"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    resume = last_complete_checkpoint(url)
say({"resume": resume, "warnings": [str(w.message) for w in caught]})
ranks = {"strategy": "ddp", "devices": 2, "accelerator": "cpu"} if ddp else {}  # rank 0 saves and records
trainer = Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                  plugins=[TrainStatusCheckpointIO(Dies() if die else None)], **ranks,
                  callbacks=[ModelCheckpoint(dirpath=url, every_n_train_steps=2, save_top_k=2, monitor="progress",
                                             mode="max", save_last=True), TrainStatusCallback(), Start()])
trainer.fit(Logged(), DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4), ckpt_path=resume)
say({"end": trainer.global_step, "last": last_complete_checkpoint(url)})
"""


def test_a_run_on_s3_is_recorded_after_each_upload_and_resumes_from_the_newest_whole(
        torch_python: Path, s3_server: Any, tmp_path: Path) -> None:
    # ModelCheckpoint(dirpath="s3://...") as Lightning users write it (s3fs; moto's S3 server): the
    # plugin used to refuse it. Each .ckpt is recorded once its upload returned, in a status file
    # beside it on S3; a kill after last.ckpt's upload and before its record, and an object
    # replaced by another of another size, resume from the newest checkpoint still whole. The first
    # run has 2 ranks (DDP: Lightning starts the second from the script's file).
    script = tmp_path / "on_s3.py"
    script.write_text(ON_S3)
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ckpts"
    client = s3_server.client()
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_server.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def run(steps: int, how: str = "train") -> tuple[int, list[dict[str, Any]]]:
        done = subprocess.run([str(torch_python), str(script), url, str(steps), how], capture_output=True, text=True,
                              timeout=300, env=env, cwd=tmp_path)
        said = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert done.returncode == (9 if how == "die" else 0), done.stderr[-3000:]
        return done.returncode, said

    def objects() -> dict[str, int]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix="ckpts/").get("Contents", [])
        return {o["Key"][len("ckpts/"):]: o["Size"] for o in listed}

    def listed() -> list[dict[str, Any]]:
        body = client.get_object(Bucket=bucket, Key="ckpts/training_status.json")["Body"].read()
        return list(json.loads(body)["lightning"]["checkpoints"])

    _, said = run(4, "ddp")
    assert said[0] == {"resume": None, "warnings": []}  # nothing there: a fresh run, nothing to say
    # Every rank ends with the same answer (taken together under the process group).
    assert [line for line in said if "end" in line] == [{"end": 4, "last": f"{url}/last.ckpt"}] * 2
    on_s3 = objects()
    entries = listed()
    # Every entry names an object there with its size.
    assert {e["file_path"]: e["files"] for e in entries} == {n: {n: s} for n, s in on_s3.items() if n.endswith(".ckpt")}
    assert sorted(e["steps"] for e in entries) == [2, 4, 4]  # step 2's, step 4's and last.ckpt
    assert max((e["steps"], i) for i, e in enumerate(entries))[1] == [e["file_path"] for e in entries].index("last.ckpt")

    _, said = run(8, "die")  # resumes at step 4, dies once last.ckpt of step 8 is uploaded
    assert said[0]["resume"] == f"{url}/last.ckpt" and said[1] == {"start": 4}
    # last.ckpt unlisted before its upload, never recorded again; the top-k files ModelCheckpoint
    # removed (steps 2 and 4) left the list before they went.
    on_s3 = objects()
    assert sorted((e["steps"], e["file_path"]) for e in listed()) == sorted(
        (int(n[:-len(".ckpt")].rsplit("=", 1)[1]), n) for n in on_s3 if n.endswith(".ckpt") and n != "last.ckpt")
    assert sorted(e["steps"] for e in listed()) == [6, 8] and "last.ckpt" in on_s3
    newest = max(listed(), key=lambda e: e["steps"])
    asked = subprocess.run([str(torch_python), "-c", "import sys\nfrom trainstatus.integrations.lightning import "
                            "last_complete_checkpoint\nprint(last_complete_checkpoint(sys.argv[1]))", url],
                           capture_output=True, text=True, timeout=120, env=env)
    assert asked.stdout.split() == [f"{url}/{newest['file_path']}"], asked.stderr[-2000:]  # step 8's top-k file

    # That top-k file replaced by another object of another size: passed over, and said; 2 ranks resume.
    client.put_object(Bucket=bucket, Key=f"ckpts/{newest['file_path']}", Body=b"not that checkpoint")
    whole = max((e for e in listed() if e["file_path"] != newest["file_path"]), key=lambda e: e["steps"])
    _, said = run(8, "ddp")
    [warning] = said[0]["warnings"]
    assert warning.startswith(f"{url}/{whole['file_path']} is the newest whole checkpoint recorded in {url}/"
                              f"training_status.json; the newer ones cannot be resumed from: {newest['file_path']} has "
                              f"19 bytes, {newest['files'][newest['file_path']]:,} recorded."), warning
    resumed = [line for line in said if "resume" in line]
    assert [line["resume"] for line in resumed] == [f"{url}/{whole['file_path']}"] * 2  # each rank read alone...
    assert [line for line in said if "start" in line] == [{"start": whole["steps"]}] * 2  # ...agreed, and loaded it
    assert [line["end"] for line in said if "end" in line] == [8, 8]


REMOTE_REFUSALS = r"""
import json
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from trainstatus.integrations._lightning.strategies import how_it_saves, remote_refusal
seen = {}
for name, strategy in (("single", SingleDeviceStrategy("cpu")), ("ddp", DDPStrategy()),
                       ("fsdp-full", FSDPStrategy(state_dict_type="full")),
                       ("fsdp-sharded", FSDPStrategy(state_dict_type="sharded")),
                       ("model-parallel-file", ModelParallelStrategy(save_distributed_checkpoint=False)),
                       ("model-parallel", ModelParallelStrategy())):
    seen[name] = remote_refusal(strategy, how_it_saves(strategy, None))
print(json.dumps(seen))
"""


def test_which_strategies_save_to_a_remote_dirpath_as_given(torch_python: Path) -> None:
    # FSDP's full state dict and ModelParallel's single file go through CheckpointIO as a
    # pathlib.Path, which makes s3://b/x.ckpt the local s3:/b/x.ckpt: their checkpoints were written
    # on the local disk and recorded there, and a resume from s3:// found nothing (a silent fresh run).
    done = subprocess.run([str(torch_python), "-c", REMOTE_REFUSALS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert [name for name, why in seen.items() if why is None] == ["single", "ddp"], seen
    assert seen["fsdp-full"].startswith("FSDPStrategy hands CheckpointIO the path as a pathlib.Path"), seen
    assert seen["model-parallel-file"].startswith("ModelParallelStrategy hands CheckpointIO the path"), seen
    assert seen["fsdp-sharded"].startswith("FSDPStrategy saves each checkpoint as a folder"), seen
    assert seen["model-parallel"].startswith("ModelParallelStrategy saves each checkpoint as a folder"), seen
