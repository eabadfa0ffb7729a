"""trainstatus.integrations.ray on Ray Train's real controller: ``TorchTrainer`` with 2 CPU workers
(DDP on gloo) on a local Ray cluster the module starts in a temp folder of its own.

Every test runs Ray in .venv-ray (tests/_ray_env.py) through one driver process (tests/_ray_trainer.py,
tests/_ray_cluster.py), so they are all in the ``ray`` group (the ``ray_python`` fixture marks them).
Starting Ray and importing torch take most of the time: the module shares one cluster, and one
finished run, which the tests that damage a run copy first. Each test shows what Ray's own resume does (the
same ``RunConfig(name=...)``, Ray's snapshot) beside what ``last_complete_checkpoint`` gives a new
run; docs/ray.md quotes both.
"""

from __future__ import annotations

import json
import subprocess
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _ray_cluster import Cluster, events, wait_for
from _s3server import KEY, REGION, SECRET

from trainstatus import StatusStore

SNAPSHOT = "checkpoint_manager_snapshot.json"
FILES = ["model.pt", "rank_0.pt", "rank_1.pt"]  # rank 0's model, and each worker's own file


@pytest.fixture(scope="module")
def cluster(ray_python: Path, s3_server: Any) -> Iterator[Cluster]:
    """The module's Ray cluster (its driver); S3 through the session's moto server, as Ray and the
    store both take it from the environment."""
    env = {"AWS_ENDPOINT_URL": s3_server.endpoint_url, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_DEFAULT_REGION": REGION}
    running = Cluster(ray_python, env)
    try:
        running.start()
        yield running
    finally:
        left = running.close()
    assert left == [], f"processes of the test's Ray cluster outlived ray.shutdown() (killed): {left}"


@pytest.fixture(scope="module")
def finished(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 epochs with the callback and num_to_keep=2, finished: its folder (tests copy it)."""
    storage = tmp_path_factory.mktemp("runs")
    answer = cluster.ask(do="fit", storage_path=str(storage), name="base", epochs=4, num_to_keep=2,
                         events=str(storage / "base.events"))
    assert answer["ok"], answer
    return storage / "base"


def status(run: Path) -> list[dict[str, Any]]:
    with StatusStore(run / "training_status.json") as store:
        return list(store.get("ray", "checkpoints") or [])


def snapshot(run: Path) -> list[str]:
    """The checkpoint folders Ray's own snapshot lists."""
    return [r["checkpoint_dir_name"] for r in json.loads((run / SNAPSHOT).read_text())["checkpoint_results"]]


def folders(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if p.is_dir() and p.name.startswith("checkpoint_"))


def copy(run: Path, tmp_path: Path, name: str) -> Path:
    """A copy of ``run`` under a new name (the status file records its folder relative to itself)."""
    shutil.copytree(run, tmp_path / name)
    return tmp_path / name


def starts(path: Path) -> list[int]:
    """The epoch each worker's training function started from, in order."""
    return [e["start"] for e in events(path) if e["event"] == "start"]


def own_resume(cluster: Cluster, run: Path, events_file: Path) -> dict[str, Any]:
    """Ray's own resume: the same storage_path and name, so Ray reads its snapshot; no trainstatus."""
    return cluster.ask(do="fit", storage_path=str(run.parent), name=run.name, epochs=5, callback=False,
                       events=str(events_file))


def test_each_checkpoint_ray_registers_is_recorded_in_step_with_num_to_keep(finished: Path) -> None:
    recorded = status(finished)
    # What Ray keeps (its snapshot) and what is on disk: the two newest; the record names the same.
    assert [e["file_path"] for e in recorded] == snapshot(finished) == folders(finished)
    assert [e["steps"] for e in recorded] == [3, 4]  # the 3rd and 4th checkpoints: Ray removed the first two
    for entry, epoch in zip(recorded, [2, 3]):
        name = entry["file_path"]
        assert entry["files"] == {f"{name}/{f}": (finished / name / f).stat().st_size for f in FILES}
        assert entry["metrics"]["epoch"] == epoch and isinstance(entry["metrics"]["loss"], float)
    with StatusStore(finished / "training_status.json") as store:
        assert store.get("ray", "checkpoint_root") == "."  # found from any current directory


def test_a_truncated_snapshot_stops_rays_resume_and_a_new_run_continues_from_the_newest(
        cluster: Cluster, finished: Path, tmp_path: Path) -> None:
    run = copy(finished, tmp_path, "truncated")
    data = (run / SNAPSHOT).read_bytes()
    (run / SNAPSHOT).write_bytes(data[: len(data) // 2])  # what a kill during Ray's in-place write leaves

    own = own_resume(cluster, run, tmp_path / "own.events")
    assert not own["ok"] and "CheckpointManagerInitializationError: Unterminated string" in own["message"]
    assert starts(tmp_path / "own.events") == []  # no worker ever started

    assert cluster.ask(do="last", run_path=str(run)) == {
        "event": "answer", "path": str(run / status(run)[-1]["file_path"]), "epoch": 3, "warnings": [],
        "filesystem": "local"}
    ours = cluster.ask(do="fit", storage_path=str(tmp_path), name="truncated-resumed", resume_from=str(run),
                       epochs=5, events=str(tmp_path / "ours.events"))
    assert ours["ok"], ours
    assert starts(tmp_path / "ours.events") == [4, 4]  # both workers, from the newest epoch, 3


def test_a_deleted_listed_folder_stops_rays_resume_and_the_one_before_is_returned(
        cluster: Cluster, finished: Path, tmp_path: Path) -> None:
    run = copy(finished, tmp_path, "deleted")
    older, newest = (e["file_path"] for e in status(run))
    shutil.rmtree(run / newest)  # removed by anything else: a cleanup script, a quota, a hand

    own = own_resume(cluster, run, tmp_path / "own.events")
    assert not own["ok"] and (
        "CheckpointManagerInitializationError: The run snapshot contains a reference to a checkpoint that does not "
        f"exist anymore (Checkpoint(filesystem=local, path={run / newest}))") in own["message"]

    assert cluster.ask(do="last", run_path=str(run)) == {
        "event": "answer", "path": str(run / older), "epoch": 2, "filesystem": "local", "warnings": [
            f"{run / older} is the newest whole checkpoint recorded in {run / 'training_status.json'}; the newer "
            f"ones cannot be resumed from: {newest} is missing. Nothing was removed: a new run (a new "
            f"RunConfig(name=...)) writes into a folder of its own and leaves {run} as it is. If you have whole "
            "copies of them, put them back and call last_complete_checkpoint() again."]}


def test_a_listed_file_cut_short_is_passed_over(cluster: Cluster, finished: Path, tmp_path: Path) -> None:
    # Ray would resume from it (its snapshot names the folder, which is there) and fail in the load.
    run = copy(finished, tmp_path, "cut")
    older, newest = (e["file_path"] for e in status(run))
    size = (run / newest / "rank_1.pt").stat().st_size
    os.truncate(run / newest / "rank_1.pt", size // 2)
    answer = cluster.ask(do="last", run_path=str(run))
    assert (answer["path"], answer["epoch"]) == (str(run / older), 2)
    assert f"the newer ones cannot be resumed from: {newest}/rank_1.pt has {size // 2:,} bytes, {size:,} recorded." \
        in answer["warnings"][0]


def test_a_worker_killed_after_reporting_ray_goes_back_and_the_record_stays_in_step_with_it(
        cluster: Cluster, tmp_path: Path) -> None:
    run, log = tmp_path / "lost", tmp_path / "lost.events"
    # Worker 1 is SIGKILLed right after its report() of epoch 1 returned; Ray restarts the workers once.
    answer = cluster.ask(do="fit", storage_path=str(tmp_path), name="lost", epochs=4, num_to_keep=2, max_failures=1,
                         kill_rank=1, kill_after=1, events=str(log))
    assert answer["ok"], answer
    assert [e["epoch"] for e in events(log) if e["event"] == "killing"] == [1]
    # Ray went back: the restarted workers began epoch 1 again, from epoch 0's checkpoint...
    assert starts(log) == [0, 0, 1, 1]
    # ...though epoch 1's folder was uploaded whole by both workers: Ray never registered it, and its
    # num_to_keep never removes it. The record named it at no time: it names what Ray kept.
    recorded = [e["file_path"] for e in status(run)]
    orphans = [f for f in folders(run) if f not in snapshot(run)]
    assert recorded == snapshot(run) and len(orphans) == 1
    assert sorted(p.name for p in (run / orphans[0]).iterdir()) == FILES
    answer = cluster.ask(do="last", run_path=str(run))
    assert (answer["path"], answer["epoch"]) == (str(run / recorded[-1]), 3)
    assert answer["warnings"] == [
        f"Passed over {orphans[0]} in {run}: not recorded in {run / 'training_status.json'}: uploads Ray Train had "
        "not registered when the run stopped (a worker or the controller lost after the upload), or folders of a run "
        "without TrainStatusCallback; nothing says they are whole. Ray's num_to_keep never removes them: remove them "
        "by hand when you no longer need them."]


def test_the_driver_and_every_ray_process_killed_in_rays_snapshot_write(cluster: Cluster, tmp_path: Path) -> None:
    run, log = tmp_path / "killed", tmp_path / "killed.events"
    # A test hook holds Ray's in-place snapshot write halfway at its 3rd registration (epoch 2);
    # everything is killed there, as a kill (or a node lost) during that write would.
    cluster.send(do="fit", storage_path=str(tmp_path), name="killed", epochs=5, num_to_keep=2, hold_at=3,
                 events=str(log))
    wait_for(log, "holding", cluster)
    assert cluster.kill_everything() >= 5  # the driver, Ray's GCS and raylet, the controller, the workers
    assert cluster.processes() == []
    cluster.start()  # a new cluster, as after a reboot

    own = own_resume(cluster, run, tmp_path / "own.events")
    assert not own["ok"] and "CheckpointManagerInitializationError: Unterminated string" in own["message"]

    answer = cluster.ask(do="last", run_path=str(run))
    assert answer["epoch"] == 1  # the 2nd registration, the last one Ray finished before the kill
    ours = cluster.ask(do="fit", storage_path=str(tmp_path), name="killed-resumed", resume_from=str(run), epochs=4,
                       events=str(tmp_path / "ours.events"))
    assert ours["ok"], ours
    assert starts(tmp_path / "ours.events") == [2, 2]


def test_a_status_file_on_s3_for_a_run_stored_on_s3(cluster: Cluster, s3_server: Any, tmp_path: Path) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    answer = cluster.ask(do="fit", storage_path=f"s3://{bucket}/runs", name="s3run", epochs=3, num_to_keep=2,
                         events=str(tmp_path / "s3.events"))
    assert answer["ok"], answer
    objects = {o["Key"]: o["Size"] for o in client.list_objects_v2(Bucket=bucket, Prefix="runs/s3run/")["Contents"]}
    url = f"s3://{bucket}/runs/s3run/training_status.json"
    with StatusStore(url, storage_options=s3_server.storage_options) as store:
        recorded = list(store.get("ray", "checkpoints"))
    ray_kept = json.loads(client.get_object(Bucket=bucket, Key=f"runs/s3run/{SNAPSHOT}")["Body"].read())
    assert [e["file_path"] for e in recorded] == [r["checkpoint_dir_name"] for r in ray_kept["checkpoint_results"]]
    assert len(recorded) == 2
    for entry in recorded:
        name = entry["file_path"]
        assert entry["files"] == {f"{name}/{f}": objects[f"runs/s3run/{name}/{f}"] for f in FILES}

    older, newest = (e["file_path"] for e in recorded)
    answer = cluster.ask(do="last", run_path=f"s3://{bucket}/runs/s3run")
    assert answer == {"event": "answer", "path": f"{bucket}/runs/s3run/{newest}", "epoch": 2, "warnings": [],
                      "filesystem": "s3"}
    client.delete_object(Bucket=bucket, Key=f"runs/s3run/{newest}/rank_1.pt")
    answer = cluster.ask(do="last", run_path=f"s3://{bucket}/runs/s3run")
    assert (answer["path"], answer["epoch"]) == (f"{bucket}/runs/s3run/{older}", 1)
    assert answer["warnings"] == [
        f"s3://{bucket}/runs/s3run/{older} is the newest whole checkpoint recorded in s3://{bucket}/runs/s3run/"
        f"training_status.json; the newer ones cannot be resumed from: {newest}/rank_1.pt is missing. Nothing was "
        f"removed: a new run (a new RunConfig(name=...)) writes into a folder of its own and leaves "
        f"s3://{bucket}/runs/s3run as it is. If you have whole copies of them, put them back and call "
        "last_complete_checkpoint() again."]


def test_an_object_uploaded_again_one_byte_off_its_recorded_size_is_passed_over(
        cluster: Cluster, s3_server: Any, tmp_path: Path) -> None:
    # Rank 1's file of the newest checkpoint uploaded again one byte shorter, one byte longer, then
    # as it was: only the size in the listing can tell (Ray's snapshot names the folder all along).
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    answer = cluster.ask(do="fit", storage_path=f"s3://{bucket}/runs", name="sizes", epochs=2, num_to_keep=2,
                         events=str(tmp_path / "sizes.events"))
    assert answer["ok"], answer
    with StatusStore(f"s3://{bucket}/runs/sizes/training_status.json", storage_options=s3_server.storage_options) \
            as store:
        older, newest = (e["file_path"] for e in store.get("ray", "checkpoints"))
    key = f"runs/sizes/{newest}/rank_1.pt"
    original = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    size = len(original)
    for body in (original[:-1], original + b"\0"):
        client.put_object(Bucket=bucket, Key=key, Body=body)
        answer = cluster.ask(do="last", run_path=f"s3://{bucket}/runs/sizes")
        assert (answer["path"], answer["epoch"]) == (f"{bucket}/runs/sizes/{older}", 0), answer
        [warning] = answer["warnings"]
        assert f"the newer ones cannot be resumed from: {newest}/rank_1.pt has {len(body):,} bytes, {size:,} " \
            "recorded. Nothing was removed" in warning, warning
    client.put_object(Bucket=bucket, Key=key, Body=original)
    answer = cluster.ask(do="last", run_path=f"s3://{bucket}/runs/sizes")
    assert (answer["path"], answer["epoch"], answer["warnings"]) == (f"{bucket}/runs/sizes/{newest}", 1, [])


CHECKPOINT_GIVEN = r"""
import json, sys
from trainstatus.integrations.ray import last_complete_checkpoint
seen = []
for given in sys.argv[1:]:
    try:
        seen.append(["returned", str(last_complete_checkpoint(given))])
    except Exception as exc:
        seen.append([type(exc).__name__, str(exc)])
print(json.dumps(seen))
"""


STATUS_INSIDE = r"""
import json, sys
from trainstatus.integrations.ray import TrainStatusCallback, last_complete_checkpoint
seen = []
for call in (lambda: last_complete_checkpoint(sys.argv[1], status_path=sys.argv[2]),
             lambda: TrainStatusCallback(status_path=sys.argv[2])):
    try:
        seen.append(["returned", str(call())])
    except Exception as exc:
        seen.append([type(exc).__name__, str(exc)])
print(json.dumps(seen))
"""


def test_a_checkpoint_folder_given_for_its_run_is_refused_naming_the_run(ray_python: Path, tmp_path: Path) -> None:
    # It returned None in silence, on a disk and on S3: a new run from scratch beside the checkpoints.
    # And a status file inside a checkpoint folder (Ray's num_to_keep removes it whole) is refused.
    name = "checkpoint_2026-12-07_10-00-00.123456"
    local, remote = tmp_path / "run" / name, f"s3://bucket/runs/run/{name}/"
    local.mkdir(parents=True)
    done = subprocess.run([str(ray_python), "-c", CHECKPOINT_GIVEN, str(local), remote], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    on_disk, on_s3 = json.loads(done.stdout.splitlines()[-1])
    inside = subprocess.run([str(ray_python), "-c", STATUS_INSIDE, str(tmp_path / "run"), str(local / "status.json")],
                            capture_output=True, text=True, timeout=300)
    assert inside.returncode == 0, inside.stderr
    said = (f"the status file {local / 'status.json'} would lie inside the checkpoint folder {name}, which Ray removes "
            "whole when num_to_keep drops it, the status file with it. Keep it in the run's folder (the default), or "
            "pass status_path= outside every checkpoint folder. Nothing was read or changed.")
    assert json.loads(inside.stdout.splitlines()[-1]) == [
        ["TrainingStatusValueError", f"last_complete_checkpoint('{tmp_path / 'run'}'): {said}"],
        ["TrainingStatusValueError", f"TrainStatusCallback: {said}"]]
    assert on_disk == ["TrainingStatusValueError", (
        f"last_complete_checkpoint('{local}'): {local} is one of a run's checkpoint folders, named as Ray names "
        f"them. Pass the run's folder that holds them (<storage_path>/<name>), {tmp_path / 'run'}: the answer is "
        "the newest whole checkpoint recorded there. Nothing was read.")], on_disk
    assert on_s3[0] == "TrainingStatusValueError" and on_s3[1].startswith(
        f"last_complete_checkpoint('{remote}'): s3://bucket/runs/run/{name} is one of a run's checkpoint folders"
        ) and "s3://bucket/runs/run:" in on_s3[1], on_s3
