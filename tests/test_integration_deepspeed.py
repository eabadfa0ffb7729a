"""trainstatus.integrations.deepspeed against DeepSpeed's real engine, and the Transformers Trainer
with ``deepspeed=``, on 2 CPU ranks (gloo) in .venv-deepspeed (the deepspeed group: ``pytest -m
deepspeed``). The ranks are forked by tests/_deepspeed_trainer.py's fork server (torch, DeepSpeed
and Transformers imported once); no DeepSpeed op is compiled (the shared-memory op off, torch's
AdamW, ``TORCH_EXTENSIONS_DIR`` in the test's folder: one compile would take minutes).

The rules (what is unlisted when, what is refused, the world-size comparison) are tested in
milliseconds by tests/test_deepspeed_protocol.py; these show what only the real engine shows:
its files, its kills and its own resume's failures."""

from __future__ import annotations

import collections
import random
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _launch
import pytest
from _launch import Run, Workers, elastic, free_port, restarted

from trainstatus import StatusStore

TRAINER = Path(__file__).resolve().parent / "_deepspeed_trainer.py"
BOUND = 120.0  # seconds: every wait, and the children's collectives' timeout


@pytest.fixture(scope="module")
def server(deepspeed_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    where = tmp_path_factory.mktemp("deepspeed_workers")
    env = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(where / "torch_extensions")}
    with Workers(deepspeed_python, TRAINER, where, env=env, bound=BOUND, defaults={"timeout": BOUND}) as started:
        yield started
    # Nothing was compiled: DeepSpeed's ops stayed unbuilt (a build would have left its folder here).
    assert not any((where / "torch_extensions").glob("*/*.so")), list((where / "torch_extensions").rglob("*"))


def recorded(directory: Path, category: str = "deepspeed") -> list[dict[str, Any]]:
    return _launch.recorded(directory / "training_status.json", category)


def tags(directory: Path) -> list[str]:
    return sorted((p.name for p in directory.iterdir() if p.is_dir() and p.name.startswith("global_step")),
                  key=lambda name: int(name[len("global_step"):]))


def ended(run: Run) -> None:
    """Kill what is left of ``run`` (a rank a kill left waiting on the other) and wait for its end."""
    run.kill([0, 1])
    run.exits()


# -- kills --------------------------------------------------------------------------------------


def only_unrecorded_named(warnings: list[str]) -> bool:
    """A resume after a kill says nothing but, at most, which folders a save the kill cut short left
    unrecorded (a recorded checkpoint passed over, or anything else, would be a failure here)."""
    return all(w.startswith("TrainingStatusCheckpointWarning: Passed over ") and " not recorded in " in w
               for w in warnings)


def kill_at_a_seeded_moment(run: Run, rng: random.Random, before_save: str, step: int, pause: float) -> str:
    """SIGKILL rank 0, rank 1 or both, once ``rng`` chose when: in the start-up (DeepSpeed's
    initialize, the resume, the first steps), at any time after the resume, or ``pause`` seconds at
    most after rank 1's ``before_save`` event of ``step`` (inside that save, mostly). Wait for the
    run's end; "one rank" or "group"."""
    moment = rng.choice(["start", "any", "in save", "in save"])
    if moment == "start":
        time.sleep(rng.uniform(0.0, 3.0))
    else:
        run.event("resumed", 0)
        if moment == "any":
            time.sleep(rng.uniform(0.0, 0.5))
        else:
            run.event(before_save, 1, step=step)
            time.sleep(rng.uniform(0.0, pause))
    victims = rng.choice([[0], [1], [0, 1]])
    run.kill(victims)
    ended(run)
    return "group" if len(victims) == 2 else "one rank"


def campaign(workers: Workers, tmp_path: Path, seed: int, *, stage: int, kills: int) -> dict[str, Any]:
    """``kills`` SIGKILLs of one rank or both at seeded moments (a share inside saves), and two
    deaths inside rank 1's shard write (``os._exit`` with its ZeRO shard half written): one in
    trainstatus's save, one in DeepSpeed's own (``theirs``: every step is saved by both, each into
    its folder). After each, the status file is never behind the last record, and the next run
    resumes both ranks from its newest tag. Then a last run of 3 more steps, whose parameters
    must equal an uninterrupted run's, bit for bit. Returns the tally."""
    rng = random.Random(seed)
    directory, theirs = tmp_path / "ckpt", tmp_path / "theirs"
    newest, resumes = 0, 0
    tally: collections.Counter[str] = collections.Counter()
    ours_at, theirs_at = rng.sample(range(kills), 2)
    dying = {ours_at: "ours", theirs_at: "theirs"}
    for number in range(kills + 1):
        final = number == kills
        options: dict[str, Any] = {"dir": str(directory), "theirs": str(theirs), "stage": stage, "keep": 2,
                                   "steps": newest + 3 if final else 10**6}
        how = dying.get(number) if not final else None
        if how is not None:
            options["die_in_write"] = [1, newest + rng.randint(1, 3), how]
        run = workers.start(**options)
        try:
            run.each("pid")
            if final:
                done = run.finished()
            elif how is not None:
                # Rank 0 goes on until DeepSpeed's or trainstatus's next collective finds rank 1 gone
                # (DeepSpeed's own save writes latest before its barrier), and fails there.
                run.event("dying", 1)
                assert run.exits()[0] != 0
                tally[f"died in {how} save"] += 1
            else:
                tally[kill_at_a_seeded_moment(run, rng, "save-begin", newest + rng.randint(1, 3), 0.05)] += 1
        finally:
            run.kill([0, 1])
        events = run.events
        for resumed in (e for e in events if e["event"] == "resumed"):
            assert (resumed["tag"], resumed["step"]) == (f"global_step{newest}" if newest else None, newest), \
                (number, resumed)
            assert only_unrecorded_named(resumed["warnings"]), (number, resumed)
            resumes += resumed["rank"] == 0 and newest > 0
        for their in (e for e in events if e["event"] == "theirs" and e["tag"] is not None):
            tally["theirs tried"] += their["rank"] == 0
            tally["theirs failed"] += their["rank"] == 0 and not all(
                e["ok"] for e in events if e["event"] == "theirs")
            if not their["ok"]:
                tally[f"theirs: {their['error'].split(':')[0]}"] += their["rank"] == 1
        begun = {e["step"] for e in events if e["event"] == "save-begin"}
        tally["inside a save"] += not final and bool(begun) and not {e["step"] for e in events
                                                                     if e["event"] == "save-end"} >= begun
        if final:
            break
        entries = recorded(directory)
        steps = [e["steps"] for e in entries]
        assert steps == sorted(steps) and len(steps) <= 2, (number, steps)
        assert not steps or steps[-1] >= newest, (number, steps, newest)
        assert all(e["world_size"] == 2 for e in entries), entries
        newest = steps[-1] if steps else 0
    # keep=2: two tag folders left, the two recorded. A torn one a kill left was saved over and
    # rotated out; one a kill left unremoved between a record and its removal was swept.
    assert [e["file_path"] for e in recorded(directory)] == [f"global_step{newest + 2}", f"global_step{newest + 3}"]
    assert tags(directory) == [f"global_step{newest + 2}", f"global_step{newest + 3}"]
    assert (directory / "latest").read_text() == f"global_step{newest + 3}"
    reference = workers.start(dir=str(tmp_path / "reference"), stage=stage, steps=newest + 3)
    assert reference.finished()[0]["digest"] == done[0]["digest"] is not None
    return {**tally, "resumes": resumes, "kills": kills}


def summary(stage: int, tally: dict[str, Any]) -> None:
    causes = ", ".join(f"{key[len('theirs: '):]} {value}" for key, value in tally.items() if key.startswith("theirs: "))
    print(f"\nDeepSpeed ZeRO-{stage} (2 ranks, gloo), {tally['kills']} kills ({tally.get('one rank', 0)} of one rank, "
          f"{tally.get('group', 0)} of both, {tally.get('died in ours save', 0)} + {tally.get('died in theirs save', 0)} "
          f"with rank 1's shard half written in trainstatus's and DeepSpeed's own save; {tally.get('inside a save', 0)} "
          f"inside a save):\n  trainstatus: {tally['resumes']} resumes from a tag, 0 failed, 0 behind the last record; "
          f"final parameters equal to an uninterrupted run's, bit for bit; two tag folders left (keep=2)\n"
          f"  DeepSpeed's own resume (latest, then its "
          f"files): {tally.get('theirs failed', 0)} of {tally.get('theirs tried', 0)} would have failed"
          + (f" ({causes})" if causes else ""))
    sys.stdout.flush()


def test_zero_2_kills_at_seeded_moments_resume_from_the_newest_recorded_tag(workers: Workers, tmp_path: Path,
                                                                           seed: int) -> None:
    tally = campaign(workers, tmp_path, seed, stage=2, kills=10)
    assert tally.get("died in ours save") == tally.get("died in theirs save") == 1, tally
    assert tally["theirs failed"] >= 1, tally  # DeepSpeed's latest named the tag rank 1 had left half written
    summary(2, tally)


def test_zero_3_kills_resume_from_the_newest_recorded_tag(workers: Workers, tmp_path: Path, seed: int) -> None:
    summary(3, campaign(workers, tmp_path, seed, stage=3, kills=4))


# -- latest, a cut shard, the world size ---------------------------------------------------------


@pytest.fixture(scope="module")
def base(server: Workers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 ZeRO-2 steps of 2 ranks, each saved (global_step1-3)."""
    directory = tmp_path_factory.mktemp("deepspeed_base") / "ckpt"
    with server.owned():
        server.start(dir=str(directory), steps=3).finished()
    assert tags(directory) == ["global_step1", "global_step2", "global_step3"]
    return directory


@pytest.mark.parametrize("damage", ["empty latest", "cut latest", "cut rank 1 shard"])
def test_latest_damaged_or_a_cut_rank_1_shard_resume_from_the_newest_whole_tag(
        workers: Workers, tmp_path: Path, base: Path, damage: str) -> None:
    directory = tmp_path / "ckpt"
    shutil.copytree(base, directory)
    shard = directory / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    if damage == "empty latest":
        (directory / "latest").write_text("")
    elif damage == "cut latest":
        (directory / "latest").write_text("global_st")
    else:
        with open(shard, "r+b") as f:
            f.truncate(shard.stat().st_size // 2)
    run = workers.start(dir=str(directory), theirs=str(directory), steps=3)
    run.finished()
    resumed = run.each("resumed")
    expected = "global_step2" if damage == "cut rank 1 shard" else "global_step3"
    assert [(e["tag"], e["step"]) for e in resumed] == [(expected, int(expected[-1]))] * 2
    theirs = run.each("theirs")
    assert not any(e["ok"] for e in theirs), theirs  # DeepSpeed's own resume fails on each
    if damage == "cut rank 1 shard":
        [warning] = resumed[0]["warnings"]
        assert "global_step2 is the newest whole tag" in warning
        assert "global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt" in warning
    else:
        assert resumed[0]["warnings"] == []


def test_a_zero_tag_of_two_ranks_resumed_by_one_is_refused_before_deepspeed_loads(
        workers: Workers, tmp_path: Path, base: Path) -> None:
    directory = tmp_path / "ckpt"
    shutil.copytree(base, directory)
    run = workers.start(1, dir=str(directory), steps=5, port=free_port())
    run.finished(failed=1)
    error = run.event("error", 0)
    assert error["type"] == "TrainingStatusCheckpointError"
    assert "saved by 2 ranks and this run has 1" in error["message"] and "ds_to_universal" in error["message"]
    assert [e["steps"] for e in recorded(directory)] == [1, 2, 3]  # nothing unlisted


# -- the Transformers Trainer with deepspeed= ---------------------------------------------------


@pytest.mark.parametrize("stage", [2, 3])
def test_the_trainer_records_every_rank_s_zero_shards_and_refuses_another_world_size(
        workers: Workers, tmp_path: Path, stage: int) -> None:
    directory = tmp_path / "out"
    workers.start(role="trainer", dir=str(directory), stage=stage, max_steps=4).finished()
    entries = recorded(directory, "transformers")
    assert [(e["steps"], e["world_size"]) for e in entries] == [(2, 2), (4, 2)]
    shards = {name.rsplit("/", 1)[1] for name in entries[-1]["files"] if "/global_step4/" in name}
    expected = {f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)}
    expected |= ({f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" for rank in (0, 1)} if stage == 3
                 else {"mp_rank_00_model_states.pt"})
    assert shards == expected
    # Rank 0's optimizer shard left out of checkpoint-4's record (a status file edited, or written by
    # another tool; rank 1's is there): the two ranks resume from checkpoint-2, told why, and save
    # checkpoint-4 again.
    with StatusStore(directory / "training_status.json") as store:
        entries = store.get("transformers", "checkpoints")
        entries[-1]["files"] = {name: size for name, size in entries[-1]["files"].items()
                                if not name.endswith("zero_pp_rank_0_mp_rank_00_optim_states.pt")}
        store.set("transformers", "checkpoints", entries)
    passed_over = workers.start(role="trainer", dir=str(directory), stage=stage, max_steps=4)
    passed_over.finished()
    resumed = passed_over.each("resumed")
    assert [e["path"] for e in resumed] == [str(directory / "checkpoint-2")] * 2
    assert "checkpoint-4/global_step4 has no ZeRO optimizer shard of rank 0 recorded" in resumed[0]["warnings"][0]
    # One process: refused before the Trainer hands the folder to DeepSpeed, both numbers named.
    alone = workers.start(1, role="trainer", dir=str(directory), stage=stage, max_steps=6, port=free_port())
    alone.finished(failed=1)
    message = alone.event("error", 0)["message"]
    assert f"Cannot resume from {directory / 'checkpoint-4'}: it was saved by 2 ranks with DeepSpeed and this run " \
           "has 1" in message and "ds_to_universal" in message
    # The same two ranks resume from it.
    again = workers.start(role="trainer", dir=str(directory), stage=stage, max_steps=6)
    assert [e["step"] for e in again.finished()] == [6, 6]
    assert [e["path"] for e in again.each("resumed")] == [str(directory / "checkpoint-4")] * 2


# -- Accelerate with a DeepSpeedPlugin ----------------------------------------------------------


def test_accelerate_with_a_deepspeed_plugin_records_every_rank_s_shards_and_refuses_another_world_size(
        workers: Workers, tmp_path: Path) -> None:
    project = tmp_path / "project"
    workers.start(role="accelerate", dir=str(project), steps=3).finished()
    entries = recorded(project, "accelerate")
    assert [(e["file_path"], e["world_size"]) for e in entries] == [("checkpoints/checkpoint_1", 2),
                                                                    ("checkpoints/checkpoint_2", 2)]
    shard = project / "checkpoints" / "checkpoint_2" / "pytorch_model" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    assert f"checkpoints/checkpoint_2/pytorch_model/{shard.name}" in entries[-1]["files"]
    # Rank 1's shard of the newest cut short: both processes resume from the one before, told why.
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    run = workers.start(role="accelerate", dir=str(project), steps=3)
    run.finished()
    resumed = run.each("resumed")
    assert [(e["path"], e["step"]) for e in resumed] == [(str(project / "checkpoints" / "checkpoint_1"), 2)] * 2
    assert f"checkpoints/checkpoint_2/pytorch_model/{shard.name}" in resumed[0]["warnings"][0]
    # One process: refused before Accelerate hands the folder to DeepSpeed, both numbers named.
    alone = workers.start(1, role="accelerate", dir=str(project), steps=4, port=free_port())
    alone.finished(failed=1)
    message = alone.event("error", 0)["message"]
    assert "saved by 2 ranks with DeepSpeed and this run has 1" in message and "ds_to_universal" in message


def test_the_trainer_with_deepspeed_killed_at_seeded_moments_resumes_from_the_newest_recorded_checkpoint(
        workers: Workers, tmp_path: Path, seed: int) -> None:
    """The Trainer with ``deepspeed=`` (ZeRO-2) and ``TrainStatusCallback``, a save every 2 steps:
    SIGKILLs of one rank or both at seeded moments, and one death inside rank 1's shard write. Each
    run resumes both ranks from the newest recorded checkpoint; each measures what the Trainer's own
    ``resume_from_checkpoint=True`` would load (the highest ``checkpoint-<N>``, then DeepSpeed's
    ``latest`` in it)."""
    rng = random.Random(seed)
    directory, kills, newest, resumes = tmp_path / "out", 6, 0, 0
    tally: collections.Counter[str] = collections.Counter()
    dying = rng.randrange(kills)
    for number in range(kills + 1):
        final = number == kills
        options: dict[str, Any] = {"role": "trainer", "dir": str(directory), "theirs": True,
                                   "max_steps": newest + 4 if final else 10**6}
        if number == dying:
            options["die_in_write"] = [1, newest + 2, "ours"]
        run = workers.start(**options)
        try:
            run.each("pid")
            if final:
                run.finished()
            elif number == dying:
                run.event("dying", 1)
                assert run.exits()[0] != 0
                tally["died in a save"] += 1
            else:
                tally[kill_at_a_seeded_moment(run, rng, "step", newest + rng.choice([2, 4]), 0.1)] += 1
        finally:
            run.kill([0, 1])
        events = run.events
        for resumed in (e for e in events if e["event"] == "resumed"):
            assert resumed["path"] == (str(directory / f"checkpoint-{newest}") if newest else None), (number, resumed)
            assert only_unrecorded_named(resumed["warnings"]), (number, resumed)
            resumes += resumed["rank"] == 0 and newest > 0
        theirs = [e for e in events if e["event"] == "theirs" and e["path"] is not None]
        if len(theirs) == 2:
            tally["theirs tried"] += 1
            tally["theirs failed"] += not all(e["ok"] for e in theirs)
        if final:
            break
        steps = [e["steps"] for e in recorded(directory, "transformers")]
        assert steps == sorted(steps) and (not steps or steps[-1] >= newest), (number, steps, newest)
        newest = steps[-1] if steps else 0
    assert [e["steps"] for e in recorded(directory, "transformers")][-1] == newest + 4
    print(f"\nTransformers Trainer with deepspeed= (ZeRO-2, 2 ranks), {kills} kills ({tally['one rank']} of one rank, "
          f"{tally['group']} of both, {tally['died in a save']} with rank 1's shard half written):\n"
          f"  trainstatus: {resumes} resumes from a checkpoint, 0 failed, 0 behind the last record\n"
          f"  the Trainer's own resume_from_checkpoint=True (get_last_checkpoint, then DeepSpeed's latest in it): "
          f"{tally['theirs failed']} of {tally['theirs tried']} would have failed")
    sys.stdout.flush()


def test_a_trainer_whose_ranks_each_count_themselves_alone_is_refused_before_it_trains(
        workers: Workers, tmp_path: Path) -> None:
    # deepspeed= on CPU under a launcher without use_cpu=True: TrainingArguments counts 1 process on
    # each of the 2 ranks, every rank saves as the main process into the same folders (seen: both
    # removing the same model.safetensors, FileNotFoundError on one). Refused on every rank.
    directory = tmp_path / "out"
    run = workers.start(role="trainer", dir=str(directory), max_steps=2, use_cpu=False)
    run.finished(failed=2)
    messages = [e["message"] for e in run.events if e["event"] == "error"]
    assert all("the Trainer counts 1 process(es) (TrainingArguments.world_size), but torch.distributed has 2 "
               "ranks" in m and "use_cpu=True" in m for m in messages), messages
    assert not (directory / "checkpoint-2").exists()


# -- Lightning's DeepSpeedStrategy (a CPU subclass, in the tests only: tests/_deepspeed_lightning.py) --


def lightning_folders(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".ckpt"))


@pytest.mark.parametrize("stage", [2, 3])
def test_lightning_deepspeed_saves_are_recorded_and_resumed_on_every_rank(workers: Workers, tmp_path: Path,
                                                                          stage: int) -> None:
    # Lightning's DeepSpeedStrategy saves past CheckpointIO (DeepSpeed's engine, every rank): each
    # folder recorded with every rank's shard, the top-k folder ModelCheckpoint drops unlisted and
    # removed, last.ckpt saved over in place and recorded again; the next run resumes every rank
    # from last.ckpt.
    directory = tmp_path / "ckpts"
    workers.start(role="lightning", dir=str(directory), stage=stage, max_steps=6).finished()
    entries = recorded(directory, "lightning")
    assert [(e["steps"], e["file_path"]) for e in entries] == [
        (4, "epoch=0-step=4.ckpt"), (6, "epoch=0-step=6.ckpt"), (6, "last.ckpt")], entries
    assert lightning_folders(directory) == ["epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt", "last.ckpt"]
    shards = {2: {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                  "mp_rank_00_model_states.pt"},
              3: {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                  "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"}}[stage]
    for entry in entries:
        inside = {name[len(entry["file_path"]) + 1:] for name in entry["files"]}
        assert {f"checkpoint/{name}" for name in shards} | {"latest"} <= inside, (entry["file_path"], inside)
        assert entry["world_size"] == 2
    resumed = workers.start(role="lightning", dir=str(directory), stage=stage, max_steps=8)
    assert [e["step"] for e in resumed.finished()] == [8, 8]
    assert [(e["path"], e["warnings"]) for e in resumed.each("resumed")] == [(str(directory / "last.ckpt"), [])] * 2
    assert [e["step"] for e in resumed.each("ready")] == [6, 6]
    assert recorded(directory, "lightning")[-1]["steps"] == 8


def test_lightning_deepspeed_last_ckpt_torn_by_a_death_inside_its_save_is_never_loaded(
        workers: Workers, tmp_path: Path) -> None:
    # Rank 1 leaves just before writing its shard into last.ckpt at step 4, once rank 0 has written
    # its own new files and latest: last.ckpt now holds rank 0's state of step 4 beside rank 1's of
    # step 2, both whole, latest naming them. Lightning's own ckpt_path="last" loads that without a
    # word, each rank from a different step; trainstatus unlisted last.ckpt before the save began and
    # resumes both ranks from the step-4 folder recorded just before it.
    directory = tmp_path / "ckpts"
    run = workers.start(role="lightning", dir=str(directory), max_steps=10, leave_before_shard=4)
    try:
        assert run.event("dying", 1)["latest_written"] is True
    finally:
        ended(run)
    assert [(e["steps"], e["file_path"]) for e in recorded(directory, "lightning")] == [
        (2, "epoch=0-step=2.ckpt"), (4, "epoch=0-step=4.ckpt")]
    theirs = workers.start(role="lightning", dir=str(directory), plain=True, max_steps=5,
                           ckpt_path=str(directory / "last.ckpt"))
    theirs.finished()
    ready = theirs.each("ready")
    assert [(e["step"], e["adam"]) for e in ready] == [(4, 4.0), (4, 2.0)], ready  # torn: two saves' shards
    ours = workers.start(role="lightning", dir=str(directory), max_steps=6)
    ours.finished()
    assert [e["path"] for e in ours.each("resumed")] == [str(directory / "epoch=0-step=4.ckpt")] * 2
    assert [(e["step"], e["adam"]) for e in ours.each("ready")] == [(4, 4.0), (4, 4.0)]
    print("\nLightning DeepSpeedStrategy (ZeRO-2, 2 ranks), last.ckpt torn by rank 1's death inside its save: "
          "Lightning's own ckpt_path='last' loaded it without a word (rank 0's optimizer at step 4, rank 1's at "
          "step 2); trainstatus resumed both ranks from epoch=0-step=4.ckpt")
    sys.stdout.flush()


@pytest.mark.parametrize(("saved", "resumed"), [(2, 1), (1, 2)])
def test_lightning_deepspeed_checkpoint_of_another_world_size_is_refused_before_deepspeed_loads_it(
        workers: Workers, tmp_path: Path, saved: int, resumed: int) -> None:
    # 2 ranks resumed by 1: one process decides; 1 resumed by 2: rank 0 decides, both raise alike.
    directory = tmp_path / "ckpts"
    workers.start(saved, role="lightning", dir=str(directory), max_steps=2, port=free_port()).finished()
    run = workers.start(resumed, role="lightning", dir=str(directory), max_steps=4, port=free_port())
    run.finished(failed=resumed)
    errors = [e for e in run.events if e["event"] == "error"]
    assert [e["type"] for e in errors] == ["TrainingStatusCheckpointError"] * resumed, errors
    for error in errors:
        assert error["message"].startswith(
            f"Cannot resume from {directory / 'last.ckpt'}: it was saved by {saved} rank{'s' if saved > 1 else ''} "
            f"with DeepSpeed and this run has {resumed}, and ZeRO partitions the optimizer's state across the ranks "
            "that saved it"), error
        assert "ds_to_universal" in error["message"], error
    assert recorded(directory, "lightning")[-1]["steps"] == 2  # nothing trained, nothing saved


def test_an_elastic_restart_resumes_every_rank_from_the_newest_recorded_tag(deepspeed_python: Path,
                                                                            tmp_path: Path) -> None:
    # torchrun --max-restarts=1: rank 1 dies once global_step2 is recorded; torchrun ends rank 0
    # and starts both again, which load it together and finish.
    directory = tmp_path / "ckpt"
    env = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")}
    launch = elastic(deepspeed_python, TRAINER, {"dir": str(directory), "steps": 4, "exit_once": [1, 2],
                                                 "timeout": BOUND}, tmp_path, env=env, bound=BOUND)
    after = restarted(launch)
    assert [(e["tag"], e["step"]) for e in after] == [("global_step2", 2)] * 2
    assert [e["steps"] for e in recorded(directory)][-1] == 4
