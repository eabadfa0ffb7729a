"""The ML-Agents plugin (_mlagents/plugin.py), against ML-Agents 1.1.0's real modules.

ML-Agents' real training path (``mlagents-learn`` with torch, killed and resumed) is
tests/test_mlagents_learn.py. These tests cover what it cannot reach, or reaches only by chance, in
the lighter environment of tests/_mlagents_env.py (no torch; built once per checkout, ~30 s): the
trainer processes run tests/_mlagents_trainer.py, which drives ML-Agents' own curriculum and
checkpoint managers and transcribes the status calls of the modules that need torch (the first test
checks that transcription against the installed ML-Agents sources). What they reach that the real
run does not: the ghost trainer's ELO and threaded trainers (the real run has one single-threaded
PPO behavior), Ctrl-C, a kill at the exact moment of binding, ``--force`` over an earlier run,
``--inference`` and ``--initialize-from``, a damaged or ML-Agents-written status file on resume,
the refusals, and ML-Agents' checkpoint manager killed between its removals.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainstatus import TrainingStatusError
from trainstatus._mlagents import plugin as plugin

import _mlagents_env

HERE = Path(__file__).resolve().parent
TRAINER = HERE / "_mlagents_trainer.py"
DATA = HERE / "data" / "mlagents_training_status.json"
KEEP = 3


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE", "PYTHON"))}
    env.pop(plugin.ENV_VAR, None)
    env.update(extra)
    return env


class Run:
    """A trainer process and the acknowledgements it printed."""

    def __init__(self, python: Path, results: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(python), str(TRAINER), "--results-dir", str(results), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or env_with(), cwd=results,
        )
        self.acks: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.err = ""

    def read_until(self, done: Any, timeout: float = 60.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                self.finish()
                raise AssertionError(f"trainer ended early: {''.join(self.lines)}\n{self.err}")
            self.lines.append(line)
            if line.startswith("{"):
                record = json.loads(line)
                self.acks.append(record)
                if done(record):
                    return record
        self.kill()
        raise AssertionError(f"trainer did not get there in time: {''.join(self.lines)}\n{self.err}")

    def kill(self) -> None:
        """SIGKILL; the acknowledgements still in the pipe count too (they were printed before)."""
        self.proc.kill()
        self.finish()

    def stderr(self) -> str:
        return self.err

    def finish(self, timeout: float = 60.0) -> tuple[str, str]:
        out, self.err = self.proc.communicate(timeout=timeout)  # also closes the pipes
        self.lines.append(out)
        self.acks += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return "".join(self.lines), self.err


def run_to_end(python: Path, results: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, str, list[dict[str, Any]]]:
    run = Run(python, results, *args, env=env)
    out, err = run.finish()
    assert run.proc.returncode == 0, f"{out}\n{err}"
    return out, err, run.acks


def report(python: Path, results: Path) -> dict[str, Any]:
    out, err, acks = run_to_end(python, results, "--report")
    assert "written through to" in out, out
    return next(a["report"] for a in acks if "report" in a)


def status_file(results: Path) -> Path:
    return results / "run" / "run_logs" / "training_status.json"


def last(acks: list[dict[str, Any]], kind: str, behavior: str | None = None) -> dict[str, Any] | None:
    found = [a for a in acks if a.get("ack") == kind and (behavior is None or a.get("behavior") == behavior)]
    return found[-1] if found else None


def one_newer(before: list[int], after: list[int]) -> bool:
    """``after`` is ``before`` with one more checkpoint appended (and the oldest trimmed)."""
    return bool(after) and (not before or after[-1] > before[-1]) and after == (before + after[-1:])[-KEEP:]


def check_resume(rep: dict[str, Any], acks: list[dict[str, Any]]) -> None:
    """What ML-Agents' own managers see on resume holds everything acknowledged before the kill."""
    lessons = last(acks, "lessons") or last(acks, "started")
    assert lessons is not None
    for param, acked in lessons["lessons"].items():
        assert rep["lessons"][param] in (acked, acked + 1), (param, acked, rep["lessons"])
    for behavior, kept in rep["checkpoints"].items():
        steps = [c["steps"] for c in kept]
        acked = last(acks, "checkpoints", behavior)
        before = acked["steps"] if acked else [s for s in steps if s <= min(steps, default=0)][:0]
        if acked is None:
            assert len(steps) <= 1 or steps == sorted(steps)
        else:
            assert steps == before or one_newer(before, steps), (behavior, before, steps)
    elo = last(acks, "elo")
    if elo is not None:
        assert rep["elo"] in (elo["elo"], elo["elo"] + 1.5), (elo, rep["elo"])


# -- the transcription in _mlagents_trainer.py is ML-Agents' code ------------------------------------


def test_transcribed_calls_are_in_the_installed_mlagents_sources(mla_python: Path) -> None:
    out = subprocess.run([str(mla_python), "-c", "import mlagents, os; print(os.path.dirname(mlagents.__file__))"],
                         capture_output=True, text=True, check=True, env=env_with())
    root = Path(out.stdout.strip())

    def in_order(relative: str, *snippets: str) -> None:
        text = (root / relative).read_text()
        at = 0
        for snippet in snippets:  # each one after the one before
            found = text.find(snippet, at)
            assert found != -1, (relative, snippet, "not found after", snippets[: snippets.index(snippet)])
            at = found + len(snippet)

    in_order("trainers/learn.py", "_, _ = register_trainer_plugins()", "args = parser.parse_args(argv)")
    in_order("trainers/learn.py", "os.makedirs(run_logs_dir, exist_ok=True)",
             "if checkpoint_settings.resume:\n            GlobalTrainingStatus.load_state(\n"
             '                os.path.join(run_logs_dir, "training_status.json")',
             "stats_writers = register_stats_writer_plugins(options)",
             "env_parameter_manager = EnvironmentParameterManager(\n"
             "            options.environment_parameters, run_seed, restore=checkpoint_settings.resume",
             "tc.start_learning(env_manager)", "write_training_status(run_logs_dir)")
    in_order("trainers/learn.py", "GlobalTrainingStatus.save_state(os.path.join(output_dir, TRAINING_STATUS_FILE_NAME))")
    in_order("plugins/stats_writer.py", "plugin_func = entry_point.load()", "plugin_func(run_options)",
             "except BaseException:")
    in_order("plugins/trainer_type.py", "plugin_func = entry_point.load()", "plugin_func()", "except BaseException:")
    in_order("trainers/ghost/trainer.py",
             "self.initial_elo = GlobalTrainingStatus.get_parameter_state(\n            self.brain_name, StatusType.ELO",
             "if self.initial_elo is None:",
             "GlobalTrainingStatus.set_parameter_state(\n            self.brain_name, StatusType.ELO, self.current_elo",
             "self.trainer.save_model()")
    in_order("trainers/trainer/rl_trainer.py", "ModelCheckpointManager.add_checkpoint(",
             "model_checkpoint = self._checkpoint()", "ModelCheckpointManager.track_final_checkpoint(")
    in_order("trainers/trainer_controller.py", "KeyboardInterrupt,", "self.join_threads()",
             "if self.train_model:\n                self._save_models()")


# -- the entry points, harmless to everyone else ------------------------------------------------------


def test_entry_points_are_registered_and_load_without_mlagents() -> None:
    import importlib.metadata

    found = {(e.group, e.name): e.value for g in ("mlagents.stats_writer", "mlagents.trainer_type")
             for e in importlib.metadata.entry_points(group=g)}
    assert found == {
        ("mlagents.stats_writer", "trainstatus"): "trainstatus._mlagents.plugin:stats_writers",
        ("mlagents.trainer_type", "trainstatus"): "trainstatus._mlagents.plugin:trainer_types",
    }
    code = ("import sys, importlib.metadata as m\n"
            "fs = [e.load() for g in ('mlagents.stats_writer', 'mlagents.trainer_type') for e in m.entry_points(group=g)]\n"
            "print(sorted(f.__name__ for f in fs), [n for n in sys.modules if n.split('.')[0] in ('mlagents', 'mlagents_envs')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['stats_writers', 'trainer_types'] []"


def test_a_checkpoint_in_a_folder_mlagents_made_this_run_is_synced_up_to_the_run_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ML-Agents makes results/<run>/<Behavior>/ in a fresh run: the plugin syncs the file, its
    # folder and the folders above up to the run folder, where the status file's run_logs/ is.
    import trainstatus._checkpoints.folders as checkpoints

    from trainstatus import GlobalTrainingStatus, StatusStore

    run = tmp_path / "results" / "run1"
    (run / "Walker").mkdir(parents=True)
    (run / "Walker" / "Walker-100.onnx").write_bytes(b"w")
    store = StatusStore(run / "run_logs" / "training_status.json")
    monkeypatch.setattr(GlobalTrainingStatus, "store", classmethod(lambda cls: store))
    synced: list[str] = []
    real = checkpoints._fsync

    def fsync(path: str, *, directory: bool = False) -> None:
        synced.append(os.path.realpath(path))
        real(path, directory=directory)

    monkeypatch.setattr(plugin, "_fsync", fsync)
    monkeypatch.setattr(checkpoints, "_fsync", fsync)
    plugin._sync_files([str(run / "Walker" / "Walker-100.onnx")])
    store.close()
    assert synced == [str(run / "Walker" / "Walker-100.onnx"), str(run / "Walker"), str(run)]


def test_old_checkpoints_are_removed_but_a_file_a_kept_one_names_under_the_current_directory_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the routed add_checkpoint does once the list without the dropped entries is written,
    # for a behavior that records a checkpoint_root (a list trainstatus recorded elsewhere):
    # ML-Agents' relative paths, kept and dropped, are all under the folder it runs in.
    from trainstatus import GlobalTrainingStatus

    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("Walker-1.onnx", "Walker-2.onnx", "Walker.yaml"):
        (tmp_path / name).write_bytes(b"model")
    dropped, kept = ({"steps": n, "file_path": f"Walker-{n}.onnx", "reward": 1.0, "creation_time": 1.0,
                      "auxillary_file_paths": ["Walker.yaml"]} for n in (1, 2))
    try:
        GlobalTrainingStatus.start_fresh(tmp_path / "run_logs" / "training_status.json")
        GlobalTrainingStatus.set_parameter_state("Walker", "checkpoint_root", str(elsewhere))
        GlobalTrainingStatus.set_parameter_state("Walker", "checkpoints", [kept])
        plugin._remove_dropped("Walker", [dropped])
    finally:
        GlobalTrainingStatus.reset()
    assert not (tmp_path / "Walker-1.onnx").exists()
    assert (tmp_path / "Walker.yaml").exists()  # still listed by step 2


@pytest.mark.parametrize("value, expected", [(None, True), ("", True), ("1", True), ("on", True), ("TRUE", True),
                                             ("yes", True), ("0", False), ("off", False), (" Off ", False),
                                             ("false", False), ("no", False)])
def test_the_environment_variable(value: str | None, expected: bool) -> None:
    assert plugin.enabled_from(value) is expected


def test_an_unknown_environment_value_is_an_error_that_says_what_to_do() -> None:
    with pytest.raises(TrainingStatusError) as caught:
        plugin.enabled_from("maybe")
    assert str(caught.value) == (
        "TRAINSTATUS_MLAGENTS='maybe' is neither on nor off, so the trainstatus plugin is not used for this "
        "run and ML-Agents saves the training status only at exit. Set TRAINSTATUS_MLAGENTS=off to turn the "
        "plugin off, or unset it (or 1, on) to write the status through."
    )


@pytest.mark.parametrize("version, expected", [("1.1.0", True), ("1.0.0", True), ("1.1.1.dev0", True),
                                               ("0.28.0", False), ("0.30.0", False), ("1.2.0", False),
                                               ("2.0", False), ("1", False), ("x.y", False)])
def test_supported_releases(version: str, expected: bool) -> None:
    assert plugin.supported(version) is expected


# -- runs of ML-Agents' own managers through the plugin ---------------------------------------------


def test_sigkill_with_threaded_trainers_and_a_ghost_then_resume_loses_nothing_acknowledged(
        mla_python: Path, tmp_path: Path, reliability: Any, seed: int) -> None:
    # Single-threaded, one behavior: test_mlagents_learn.py, on mlagents-learn itself. Here the
    # trainers run in threads of their own and one is a ghost trainer (its ELO).
    rng = random.Random(f"{seed}-True")
    extra = ["--threaded", "--tick", "0.002"]
    rounds = 4
    for i in range(rounds):
        run = Run(mla_python, tmp_path, *extra, *(["--resume"] if i else []))
        wanted = rng.randint(1, 40)
        run.read_until(lambda a, n=[0]: (n.__setitem__(0, n[0] + 1) or n[0]) >= wanted)
        time.sleep(rng.uniform(0, 0.01))
        run.kill()
        rep = report(mla_python, tmp_path)
        check_resume(rep, run.acks)
        assert rep["unknown_category"] == {} and rep["unknown_key"] is None
    reliability.add("kills", rounds, source="test_mlagents_plugin.py")


def test_ctrl_c_with_threaded_trainers_saves_the_final_checkpoints(mla_python: Path, tmp_path: Path) -> None:
    run = Run(mla_python, tmp_path, "--threaded", "--tick", "0.002")
    run.read_until(lambda a: a.get("ack") == "curriculum_done")
    run.read_until(lambda a: a.get("ack") == "checkpoints")
    run.proc.send_signal(signal.SIGINT)
    out, err = run.finish()
    assert run.proc.returncode == 0, f"{out}\n{err}"
    assert last(run.acks, "saved") is not None
    rep = report(mla_python, tmp_path)
    for behavior in ("Behavior0", "SoccerTwos"):
        final = last(run.acks, "final", behavior)
        assert final is not None and rep["final"][behavior]["steps"] == final["steps"]
        assert [c["steps"] for c in rep["checkpoints"][behavior]] == last(run.acks, "checkpoints", behavior)["steps"]
    assert rep["elo"] == last(run.acks, "elo")["elo"]
    assert rep["lessons"] == {"wall_height": 7, "goal_size": 7}


@pytest.mark.mlagents
@pytest.mark.parametrize("how", ["fresh", "force"])
def test_a_fresh_run_is_on_disk_at_binding_before_anything_is_set(mla_python: Path, tmp_path: Path, how: str) -> None:
    """The file exists from the moment the plugin binds, not from the curriculum's first set: a
    kill right then still resumes (a --resume of a run whose file is missing would start over)."""
    path = status_file(tmp_path)
    if how == "force":
        path.parent.mkdir(parents=True)
        path.write_text(DATA.read_text())
    run = Run(mla_python, tmp_path, "--hold-at-binding", *(["--force"] if how == "force" else []))
    try:
        run.read_until(lambda a: a.get("ack") == "bound")
        on_disk = json.loads(path.read_text())  # read while the trainer waits: nothing set yet
    finally:
        run.kill()
    assert [a["ack"] for a in run.acks] == ["bound"]
    assert list(on_disk) == ["metadata"], on_disk  # the earlier run's status gone too (--force)
    assert on_disk["metadata"]["mlagents_version"] == "1.1.0"
    rep = report(mla_python, tmp_path)  # resumed from what the kill left
    assert rep["lessons"] == {"wall_height": 0, "goal_size": 0}
    assert rep["checkpoints"] == {"Behavior0": [], "SoccerTwos": []}


def test_force_replaces_an_existing_status_at_once(mla_python: Path, tmp_path: Path) -> None:
    path = status_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(DATA.read_text())
    run = Run(mla_python, tmp_path, "--force", "--tick", "0.05")
    run.read_until(lambda a: a.get("ack") == "started")
    run.kill()
    on_disk = json.loads(path.read_text())
    old_only = set(json.loads(DATA.read_text(), parse_constant=float)) - {"metadata", "wall_height"}
    assert old_only == {"Walker", "SoccerTwos?team=0", "big_wall_height"}
    assert not old_only & set(on_disk), on_disk  # the earlier run's status is gone, not resumed
    assert on_disk["wall_height"] == {"lesson_num": 0}


def test_resume_reads_an_mlagents_written_file_with_nan_and_warns_on_versions(mla_python: Path, tmp_path: Path) -> None:
    path = status_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(DATA.read_text())
    out, err, acks = run_to_end(mla_python, tmp_path, "--report")
    assert "TrainingStatusVersionWarning" in err and "torch_version='2.2.2'" in err, err
    assert "written through to" in out
    rep = next(a["report"] for a in acks if "report" in a)
    original = json.loads(DATA.read_text())
    for behavior, kept in rep["checkpoints"].items():
        assert json.dumps(kept) == json.dumps(original.get(behavior, {}).get("checkpoints", [])), behavior
    on_disk = json.loads(path.read_text())  # rewritten when the curriculum set goal_size's lesson 0
    for category, entries in original.items():
        if category != "metadata":
            assert json.dumps(on_disk[category]) == json.dumps(entries), category  # NaN kept as NaN
    assert on_disk["goal_size"] == {"lesson_num": 0}


def test_a_damaged_file_on_resume_is_kept_aside_and_the_run_goes_on(mla_python: Path, tmp_path: Path) -> None:
    path = status_file(tmp_path)
    path.parent.mkdir(parents=True)
    damaged = DATA.read_bytes()[:200]
    path.write_bytes(damaged)
    out, err, acks = run_to_end(mla_python, tmp_path, "--resume", "--max-steps", "6")
    assert "TrainingStatusCorruptWarning" in err and str(path) in err, err
    kept = [p for p in path.parent.iterdir() if p.name.startswith("training_status.json.corrupt-")]
    assert len(kept) == 1 and kept[0].read_bytes() == damaged
    assert last(acks, "started")["lessons"] == {"wall_height": 0, "goal_size": 0}
    json.loads(path.read_text(), parse_constant=float)  # whole again


def test_inference_and_initialize_from_start_a_fresh_status(mla_python: Path, tmp_path: Path) -> None:
    run_to_end(mla_python, tmp_path, "--run-id", "base", "--max-steps", "30")
    base = tmp_path / "base" / "run_logs" / "training_status.json"
    assert json.loads(base.read_text(), parse_constant=float)["wall_height"]["lesson_num"] > 0
    run = Run(mla_python, tmp_path, "--initialize-from", "base", "--tick", "0.05")
    run.read_until(lambda a: a.get("ack") == "started")
    run.kill()
    assert json.loads(status_file(tmp_path).read_text())["wall_height"] == {"lesson_num": 0}
    out, err, acks = run_to_end(mla_python, tmp_path, "--run-id", "base", "--resume", "--inference", "--max-steps", "3")
    assert "written through to" in out
    assert "checkpoints" not in {a["ack"] for a in acks if "ack" in a}  # inference saves no model
    assert json.loads(base.read_text(), parse_constant=float)["wall_height"]["lesson_num"] > 0


def test_turned_off_mlagents_saves_at_exit_as_before(mla_python: Path, tmp_path: Path) -> None:
    env = env_with(TRAINSTATUS_MLAGENTS="off")
    run = Run(mla_python, tmp_path, "--tick", "0.002", env=env)
    run.read_until(lambda a: a.get("ack") == "checkpoints")
    run.kill()
    assert not status_file(tmp_path).exists()  # ML-Agents' own design: a kill loses it all
    out, err, acks = run_to_end(mla_python, tmp_path, "--force", "--max-steps", "4", env=env)
    assert "TRAINSTATUS_MLAGENTS=off, ML-Agents saves the training status itself, at exit." in out
    assert "written through" not in out
    assert status_file(tmp_path).read_text().startswith('{\n    "')  # ML-Agents' json.dump(indent=4)


@pytest.mark.parametrize("how", ["bad-variable", "old-release"])
def test_a_refusal_is_loud_and_leaves_mlagents_as_it_was(mla_python: Path, tmp_path: Path, how: str) -> None:
    if how == "bad-variable":
        run = Run(mla_python, tmp_path, "--tick", "0.002", env=env_with(TRAINSTATUS_MLAGENTS="maybe"))
        expected = "TRAINSTATUS_MLAGENTS='maybe' is neither on nor off"
    else:
        run = Run(mla_python, tmp_path, "--tick", "0.002", "--pretend-mlagents-version", "0.28.0")
        expected = ("trainstatus does not route the training status of mlagents 0.28.0: it supports mlagents "
                    "1.0 (release 21) and 1.1 (release 22)")
    run.read_until(lambda a: a.get("ack") == "checkpoints")
    run.kill()
    text = "".join(run.lines)
    assert expected in text, text
    assert "[ERROR] Error initializing plugins for trainstatus" in text
    assert not status_file(tmp_path).exists()


SAVED_STATE = '''
import json, sys
from trainstatus import TrainingStatusTypeError; from trainstatus._mlagents import plugin as _mlagents_plugin
from mlagents.trainers.training_status import GlobalTrainingStatus as G, StatusType
_mlagents_plugin.trainer_types()
G.set_parameter_state("Walker", StatusType.ELO, 1250.0)
view = G.saved_state
refused = []
for attempt in (lambda: view["Walker"].__setitem__("elo", 1.0), lambda: view["Walker"].update(elo=1.0),
                lambda: view.__setitem__("Walker", {}), lambda: view["New"].__setitem__("elo", 1.0)):
    try:
        attempt()
    except TrainingStatusTypeError as e:
        refused.append(str(e))
print(json.dumps({"walker": view["Walker"], "unknown": view["Nope"], "len": len(view), "keys": list(view),
                  "refused": refused, "after": G.get_parameter_state("Walker", StatusType.ELO),
                  "created": "Nope" in view or "New" in view}))
'''


def test_saved_state_of_mlagents_class_is_a_live_read_only_view(mla_python: Path, tmp_path: Path) -> None:
    out = subprocess.run([str(mla_python), "-c", SAVED_STATE], capture_output=True, text=True, env=env_with(),
                         cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["walker"] == {"elo": 1250.0} and got["unknown"] == {} and got["after"] == 1250.0
    assert got["keys"] == ["Walker", "metadata"] and got["len"] == 2 and got["created"] is False
    assert got["refused"] == [
        "GlobalTrainingStatus.saved_state is a read-only view of the status written through by trainstatus; "
        "nothing was stored. Call GlobalTrainingStatus.set_parameter_state(category, key, value) to change a value."
    ] * 4


def test_the_mlagents_demo_resumes_where_mlagents_alone_loses_everything(mla_python: Path, tmp_path: Path) -> None:
    example = HERE.parent / "examples" / "mlagents_kill_and_resume.py"
    result = subprocess.run([str(mla_python), str(example)], capture_output=True, text=True, env=env_with(),
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "ML-Agents alone (save at exit), killed at lesson 4: resumed at lesson 0, checkpoints []"
    assert lines[1].startswith("with trainstatus installed,      killed at lesson 4: resumed at lesson ")
    assert lines[2] == "trainstatus resumed exactly"


# -- ML-Agents' checkpoint manager: the list is written before old files are removed ---------------

KILLED_WHILE_REMOVING = r"""
import os, sys
from mlagents.trainers.policy.checkpoint_manager import ModelCheckpoint, ModelCheckpointManager
original = ModelCheckpointManager.__dict__["add_checkpoint"]
from trainstatus import GlobalTrainingStatus
from trainstatus._mlagents import plugin as _mlagents_plugin
_mlagents_plugin.trainer_types()  # routes the status (and the checkpoint manager)
if sys.argv[3] == "original":
    ModelCheckpointManager.add_checkpoint = original  # ML-Agents' order: remove, then record
status, folder = sys.argv[1], sys.argv[2]
GlobalTrainingStatus.start_fresh(status, overwrite=True)
for step in (1, 2, 3):
    files = [os.path.join(folder, f"Walker-{step}.{ext}") for ext in ("onnx", "pt")]
    for path in files:
        with open(path, "wb") as f:
            f.write(b"model")
    if step == 3:
        real_remove = os.remove
        os.remove = lambda path: (real_remove(path), os._exit(9))  # killed once one old file is gone
    ModelCheckpointManager.add_checkpoint("Walker", ModelCheckpoint(step, files[0], 1.0, float(step), files[1:]), 2)
"""


@pytest.mark.parametrize("order", ["routed", "original"])
def test_a_kill_while_mlagents_removes_old_checkpoints_never_lists_a_missing_file(
        mla_python: Path, tmp_path: Path, order: str) -> None:
    status = tmp_path / "run_logs" / "training_status.json"
    status.parent.mkdir()
    child = subprocess.run([str(mla_python), "-c", KILLED_WHILE_REMOVING, str(status), str(tmp_path), order],
                           capture_output=True, text=True, env=env_with(), timeout=120)
    assert child.returncode == 9, child.stderr
    listed = json.loads(status.read_text())["Walker"]["checkpoints"]
    missing = [p for c in listed for p in [c["file_path"], *c["auxillary_file_paths"]] if not os.path.exists(p)]
    if order == "original":
        # ML-Agents' own order: the first file of the oldest checkpoint is gone, and still listed.
        assert [c["steps"] for c in listed] == [1, 2] and missing == [str(tmp_path / "Walker-1.onnx")]
    else:
        assert [c["steps"] for c in listed] == [2, 3] and missing == []
        assert (tmp_path / "Walker-1.pt").exists()  # an extra file on disk, named by no list


def test_the_reordered_add_checkpoint_matches_the_installed_mlagents_source(mla_python: Path) -> None:
    # The plugin re-states ML-Agents' add_checkpoint and _cleanup_extra_checkpoints with the
    # removal moved after the write: the steps it re-states must still be ML-Agents'.
    source = (_mlagents_env.site_packages() / "mlagents/trainers/policy/checkpoint_manager.py").read_text()
    for line in ("new_checkpoint_dict = attr.asdict(new_checkpoint)",
                 "checkpoints = cls.get_checkpoints(behavior_name)",
                 "checkpoints.append(new_checkpoint_dict)",
                 "cls._cleanup_extra_checkpoints(checkpoints, keep_checkpoints)",
                 "while len(checkpoints) > keep_checkpoints:",
                 "if keep_checkpoints <= 0 or len(checkpoints) == 0:",
                 "ModelCheckpointManager.remove_checkpoint(checkpoints.pop(0))",
                 'file_paths: List[str] = [checkpoint["file_path"]]',
                 'file_paths.extend(checkpoint["auxillary_file_paths"])',
                 "if os.path.exists(file_path):",
                 "os.remove(file_path)",
                 "behavior_name, StatusType.CHECKPOINTS, checkpoints"):
        assert line in source, line


SAME_STEP_TWICE = r"""
import json, os, sys
from trainstatus import GlobalTrainingStatus
from trainstatus._mlagents import plugin as _mlagents_plugin
_mlagents_plugin.trainer_types()
from mlagents.trainers.policy.checkpoint_manager import ModelCheckpoint, ModelCheckpointManager
status, folder = sys.argv[1], sys.argv[2]
GlobalTrainingStatus.start_fresh(status, overwrite=True)
for step in (100, 500, 500, 600, 700):  # 500 twice: the periodic save, then save_model at Ctrl-C
    files = [os.path.join(folder, f"Walker-{step}.{ext}") for ext in ("onnx", "pt")]
    for path in files:
        with open(path, "wb") as f:
            f.write(b"model")
    ModelCheckpointManager.add_checkpoint("Walker", ModelCheckpoint(step, files[0], 1.0, float(step), files[1:]), 3)
"""


def test_a_checkpoint_recorded_twice_at_one_step_keeps_its_files_while_listed(mla_python: Path, tmp_path: Path) -> None:
    status = tmp_path / "run_logs" / "training_status.json"
    status.parent.mkdir()
    child = subprocess.run([str(mla_python), "-c", SAME_STEP_TWICE, str(status), str(tmp_path)],
                           capture_output=True, text=True, env=env_with(), timeout=120)
    assert child.returncode == 0, child.stderr
    listed = json.loads(status.read_text())["Walker"]["checkpoints"]
    assert [c["steps"] for c in listed] == [500, 600, 700]
    assert all(os.path.exists(p) for c in listed for p in [c["file_path"], *c["auxillary_file_paths"]])
    assert not (tmp_path / "Walker-100.onnx").exists() and not (tmp_path / "Walker-100.pt").exists()


SHARED_FILE_UNDER_A_RECORDED_FOLDER = r"""
import os, sys
from trainstatus import GlobalTrainingStatus
from trainstatus._mlagents import plugin as _mlagents_plugin
_mlagents_plugin.trainer_types()
from mlagents.trainers.policy.checkpoint_manager import ModelCheckpoint, ModelCheckpointManager
GlobalTrainingStatus.load_state(sys.argv[1])
for step in (1, 2):  # relative to the folder it runs in, as ML-Agents records them
    with open(f"Walker-{step}.onnx", "wb") as f:
        f.write(b"model")
    ModelCheckpointManager.add_checkpoint("Walker", ModelCheckpoint(step, f"Walker-{step}.onnx", 1.0, float(step),
                                                                    ["Walker.yaml"]), 1)
"""


def test_the_routed_checkpoint_manager_keeps_a_shared_file_of_a_behavior_that_records_a_folder(
        mla_python: Path, tmp_path: Path) -> None:
    from trainstatus import StatusStore

    status = tmp_path / "run_logs" / "training_status.json"
    with StatusStore(status) as store:
        store.set("Walker", "checkpoint_root", str(tmp_path / "elsewhere"))
    (tmp_path / "Walker.yaml").write_bytes(b"behavior: Walker")
    child = subprocess.run([str(mla_python), "-c", SHARED_FILE_UNDER_A_RECORDED_FOLDER, str(status)],
                           capture_output=True, text=True, env=env_with(), timeout=120, cwd=tmp_path)
    assert child.returncode == 0, child.stderr
    assert [c["steps"] for c in json.loads(status.read_text())["Walker"]["checkpoints"]] == [2]
    assert not (tmp_path / "Walker-1.onnx").exists()
    assert (tmp_path / "Walker.yaml").exists()  # step 2 lists it too


# -- a folder recorded by trainstatus (checkpoint_root), read by ML-Agents alone --------------------

NATIVE_OVER_A_RECORDED_FOLDER = r"""
import json, sys
from mlagents.trainers.training_status import GlobalTrainingStatus
from mlagents.trainers.policy.checkpoint_manager import ModelCheckpoint, ModelCheckpointManager
status, new = sys.argv[1], sys.argv[2]
GlobalTrainingStatus.load_state(status)  # ML-Agents' own: json.load, its own keys looked up
print(json.dumps([c["file_path"] for c in ModelCheckpointManager.get_checkpoints("Walker")]))
with open(new, "wb") as f:
    f.write(b"model")
ModelCheckpointManager.add_checkpoint("Walker", ModelCheckpoint(3, new, 1.0, 3.0, []), 5)
GlobalTrainingStatus.save_state(status)
"""


def test_mlagents_alone_reads_and_keeps_a_recorded_checkpoint_root(mla_python: Path, tmp_path: Path) -> None:
    from trainstatus import CheckpointList, StatusStore

    # A list recorded by trainstatus with the folder mlagents-learn runs in as its root (recorded
    # absolute: it is above the status file's folder), then run on by ML-Agents without the plugin.
    status = tmp_path / "results" / "run1" / "run_logs" / "training_status.json"
    models = tmp_path / "results" / "run1" / "Walker"
    models.mkdir(parents=True)
    with StatusStore(status) as store:
        checkpoints = CheckpointList(store, "Walker", root=tmp_path)
        for step in (1, 2):
            (models / f"Walker-{step}.onnx").write_bytes(b"model")
            checkpoints.add(step, f"results/run1/Walker/Walker-{step}.onnx")
    child = subprocess.run([str(mla_python), "-c", NATIVE_OVER_A_RECORDED_FOLDER, str(status),
                            "results/run1/Walker/Walker-3.onnx"],
                           capture_output=True, text=True, env=env_with(), timeout=120, cwd=tmp_path)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == ["results/run1/Walker/Walker-1.onnx", "results/run1/Walker/Walker-2.onnx"]
    written = json.loads(status.read_text())["Walker"]
    assert written["checkpoint_root"] == str(tmp_path)  # ML-Agents kept the key through its rewrite
    assert [c["steps"] for c in written["checkpoints"]] == [1, 2, 3]
    # ML-Agents' own entry, relative to where it ran, resolves through the recorded folder from anywhere.
    with StatusStore(status) as store:
        assert CheckpointList(store, "Walker").latest()["file_path"] == "results/run1/Walker/Walker-3.onnx"  # type: ignore[index]
    checked = subprocess.run([sys.executable, "-m", "trainstatus", "check", "--files", str(status)],
                             capture_output=True, text=True, timeout=60, cwd=status.parent)
    assert checked.returncode == 0, checked.stdout
