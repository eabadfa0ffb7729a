"""The run lease (issue 38 item 4): one job per status file. ``integrations._shared.lease`` on a
real folder with real processes (``flock`` spans processes; pyfakefs would make it a no-op): a
second job is refused naming the first, a job that died leaves its lease to the next with a note,
a job that ends leaves nothing, a forked child never keeps its parent's lease, and each step of
the take is faulted where it matters. How each integration takes it: the integrations groups."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import pickle
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _lease_holder import start as _start

from trainstatus import TrainingStatusInUseError, TrainingStatusWarning
from trainstatus.integrations._shared import lease


@pytest.fixture
def status(tmp_path: Path) -> str:
    return str(tmp_path / "out" / "training_status.json")


@pytest.fixture
def jobs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for job in started:
        if job.poll() is None:
            job.kill()
        job.wait()
        for pipe in (getattr(job, "stdin", None), getattr(job, "stdout", None)):
            if pipe is not None:
                pipe.close()


def start(jobs: list[subprocess.Popen[str]], status: str, run: str = "other-run", how: str = "plain") -> subprocess.Popen[str]:
    job = _start(status, run, how)
    jobs.append(job)
    assert job.stdout is not None
    if how == "fork":  # the child's pid, "held", and the child's "child" (once its fork handlers ran), in any order
        lines = [job.stdout.readline().strip() for _ in range(3)]
        pids = [int(line) for line in lines if line.isdigit()]
        jobs.extend(_Pid(pid) for pid in pids)  # type: ignore[misc]
        assert len(pids) == 1 and sorted(line for line in lines if not line.isdigit()) == ["child", "held"], lines
        return job
    line = job.stdout.readline().strip()
    assert line == "held", line
    return job


class _Pid:
    """A forked grandchild, killed at the end like the jobs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> None:
        return None

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> None:
        pass


def test_a_second_job_is_refused_naming_the_first(status: str, jobs: list[subprocess.Popen[str]]) -> None:
    first = start(jobs, status, run="bert-7")
    with pytest.raises(TrainingStatusInUseError) as raised:
        lease.take(status, "TrainStatusCallback")
    message = str(raised.value)
    assert message.startswith(f"TrainStatusCallback: another job is training on {status}: process {first.pid} on "), message
    assert f"(python -c ...), run 'bert-7', started 20" in message
    assert f". It holds the run lease {status}.run. " in message
    assert message.endswith("Give this job a folder of its own (or a status file of its own), or stop the other job "
                            f"first; if that process is gone (a machine lost while it held a lock on NFS), delete "
                            f"{status}.run. This job stopped before writing anything."), message
    assert raised.value.holder["pid"] == first.pid and raised.value.holder["run"] == "bert-7"
    assert raised.value.lock_file == status + ".run" and raised.value.path == status
    copy = pickle.loads(pickle.dumps(raised.value))  # ranks ship it to each other
    assert type(copy) is TrainingStatusInUseError and copy.holder == raised.value.holder and str(copy) == message
    assert lease.held() == []


def test_a_job_that_ends_leaves_the_lease_empty_and_the_next_takes_it_without_a_note(
        status: str, jobs: list[subprocess.Popen[str]], caplog: pytest.LogCaptureFixture) -> None:
    first = start(jobs, status)
    assert os.path.exists(status + ".run")
    first.communicate("\n")  # returns from its script: atexit releases
    assert first.returncode == 0
    assert Path(status + ".run").read_bytes() == b""  # emptied, not deleted: a job opening it meanwhile is safe
    with caplog.at_level(logging.WARNING, logger="trainstatus"):
        assert lease.take(status, "job", run="mine") is True
    assert caplog.records == []
    assert lease.held() == [status + ".run"]
    lease.release(status)
    assert Path(status + ".run").read_bytes() == b"" and lease.held() == []


def test_a_killed_job_s_lease_is_taken_over_with_a_note_naming_it(
        status: str, jobs: list[subprocess.Popen[str]], caplog: pytest.LogCaptureFixture) -> None:
    first = start(jobs, status, run="bert-7")
    first.kill()
    first.wait()
    with caplog.at_level(logging.WARNING, logger="trainstatus"):
        assert lease.take(status, "job", run="bert-7") is True
    [record] = caplog.records
    assert record.getMessage().startswith(
        f"trainstatus took over the run lease {status}.run from process {first.pid} on "), record.getMessage()
    assert "that job ended without releasing it" in record.getMessage()
    with open(status + ".run", "rb") as f:
        assert f'"pid":{os.getpid()}'.encode() in f.read()  # now names this process


def test_a_damaged_lease_file_is_taken_over_with_a_note(status: str, caplog: pytest.LogCaptureFixture) -> None:
    os.makedirs(os.path.dirname(status))
    Path(status + ".run").write_bytes(b"\x00\x00garbage")
    with caplog.at_level(logging.WARNING, logger="trainstatus"):
        assert lease.take(status, "job") is True
    [record] = caplog.records
    assert "from a process that left no name (the lease file is empty, damaged" in record.getMessage()


def test_jobs_started_at_the_same_moment_one_runs_and_the_other_names_it(
        status: str, jobs: list[subprocess.Popen[str]]) -> None:
    # Both open the file as it is made (or find it empty): one locks it, the other finds it locked
    # and waits for the holder's name rather than blaming "a process that left no name".
    for attempt in range(8):
        os.makedirs(os.path.dirname(status), exist_ok=True)
        if attempt % 2:
            Path(status + ".run").unlink(missing_ok=True)  # made by one of them, or found empty
        racers = [_start(status, f"racer-{i}", "race") for i in range(2)]
        jobs.extend(racers)
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.write("\n")
            racer.stdin.flush()
        said = [racer.stdout.readline().split() for racer in racers if racer.stdout is not None]
        assert sorted(words[0] for words in said) == ["held", "refused"], said
        winner = racers[[words[0] for words in said].index("held")]
        assert [words for words in said if words[0] == "refused"] == [["refused", str(winner.pid)]], said
        for racer in racers:
            racer.communicate("\n")
        assert Path(status + ".run").read_bytes() == b""


def test_the_same_process_takes_it_once(status: str) -> None:
    assert lease.take(status, "a") is True
    assert lease.take(status, "b") is True
    assert lease.held() == [status + ".run"]
    lease.release(status)
    lease.release(status)  # a second release does nothing
    assert lease.held() == []


def test_a_forked_child_does_not_keep_its_parent_s_lease(status: str, jobs: list[subprocess.Popen[str]]) -> None:
    # A DataLoader worker forked by the trainer outlives it (killed): the lease must be free, or
    # every resume after a kill would be refused until the orphan ends.
    first = start(jobs, status, how="fork")
    first.kill()
    first.wait()
    assert lease.take(status, "job") is True


def test_a_lease_file_deleted_between_open_and_lock_is_opened_again(
        status: str, jobs: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    # This job opens the lease file a job is ending with; that job deletes it, and another starts and
    # takes a new file of the same name before this one locks the old: locking the deleted file
    # would let both run.
    os.makedirs(os.path.dirname(status))
    open(status + ".run", "w").close()
    opened = lease._open
    faulted: list[bool] = []

    def open_then_the_file_changes(path: str, who: str) -> tuple[int, bool] | None:
        fd = opened(path, who)
        if not faulted:
            faulted.append(True)
            os.unlink(path)
            start(jobs, status, run="the-new-one")
        return fd

    monkeypatch.setattr(lease, "_open", open_then_the_file_changes)
    with pytest.raises(TrainingStatusInUseError, match="run 'the-new-one'"):
        lease.take(status, "job")
    assert lease.held() == []


def test_a_filesystem_without_flock_warns_and_goes_on(status: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.warns(TrainingStatusWarning, match=r"has no flock \(No locks available\), so this job cannot hold the run lease"):
        assert lease.take(status, "job") is False
    assert lease.held() == []


def test_another_flock_error_is_raised(status: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int, operation: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fcntl, "flock", broken)
    with pytest.raises(OSError, match="Input/output error"):
        lease.take(status, "job")
    assert lease.held() == []


needs_chattr = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or subprocess.run(["which", "chattr"], capture_output=True).returncode,
    reason="marks a folder immutable: needs root and chattr (e2fsprogs)")


@needs_chattr
def test_a_folder_this_process_cannot_write_goes_on_without_a_lease(tmp_path: Path) -> None:
    # A read-only resume (an evaluation job on a read-only mount): nothing is written there.
    subprocess.run(["chattr", "+i", str(tmp_path)], check=True)
    try:
        assert lease.take(str(tmp_path / "training_status.json"), "job") is False
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path)], check=True)
    assert lease.held() == [] and os.listdir(tmp_path) == []


def test_an_object_store_s_status_has_no_lease(tmp_path: Path) -> None:
    assert lease.take("s3://bucket/run/training_status.json", "job") is False
    assert lease.held() == []


def test_a_lease_file_this_user_cannot_write_is_locked_read_only_and_still_excludes(
        status: str, jobs: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    # Another user's lease file (0644) in a shared folder: this job cannot open it for writing, and
    # must not go on as if there were no lease while that user's job runs.
    first = start(jobs, status, run="their-job")
    real_open = os.open

    def not_writable(path: str, flags: int, mode: int = 0o777, **kwargs: object) -> int:
        if path.endswith(".run") and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", not_writable)
    with pytest.raises(TrainingStatusInUseError, match=f"process {first.pid} on .*, run 'their-job'"):
        lease.take(status, "job")
    first.communicate("\n")
    assert lease.take(status, "job") is True  # free now: held read-only, this job's name not written
    assert Path(status + ".run").read_bytes() == b""


def test_a_status_file_of_the_longest_name_has_its_lease_beside_it(tmp_path: Path) -> None:
    status = str(tmp_path / ("s" * 250 + ".json"))  # 255 bytes: "<name>.run" would not fit
    assert lease.take(status, "job") is True
    [held] = lease.held()
    assert os.path.dirname(held) == str(tmp_path) and len(os.path.basename(held)) <= 255 and held.endswith(".run")


def test_a_folder_that_cannot_be_made_goes_on_without_a_lease(status: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(path: str, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "makedirs", refused)
    assert lease.take(status, "job") is False and lease.held() == []

