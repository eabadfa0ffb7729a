"""StatusStore on s3:// against a real S3-compatible server (moto's, on loopback; tests/_s3server.py).

What only S3 does (boto3's options, retries and events, its error words); what every object store
does is in test_object_store.py, which runs on this server too. Many processes, the server killed
mid-run and the benchmark are in test_s3_processes.py and test_object_store_processes.py. boto3
and moto are imported at the top on purpose: they are in the ``test`` extra, so a missing one is a
collection error, never a quiet skip.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3  # noqa: F401 - see the module doc
import botocore.client
import moto  # noqa: F401 - see the module doc
import pytest
from _helpers import assert_memory_is_object, conflicts, stored
from _s3server import Bucket

from trainstatus import (
    StatusStore,
    TrainingStatusConflictError,
    TrainingStatusError,
    TrainingStatusReadError,
    TrainingStatusValueError,
    TrainingStatusWriteError,
)

OPTIONS_LIST = "anon, client_kwargs, conditional_writes, config_kwargs, endpoint_url, key, profile, region_name, secret, token"
# Fail fast where the server is meant to be unreachable (botocore's own retries are the spec's default).
NO_RETRY = {"retries": {"total_max_attempts": 1}, "connect_timeout": 2, "read_timeout": 5}


# -- helpers ---------------------------------------------------------------------------------------


def open_s3(s3: Bucket, key: str = Bucket.KEY, **options: Any) -> StatusStore:
    return StatusStore(s3.url(key), storage_options=s3.storage_options, **options)  # type: ignore[call-arg]


def boto_client_of(store: StatusStore) -> Any:
    """The botocore client the store's storage made (it makes one per process, on first use)."""
    store._storage._s3()  # type: ignore[attr-defined]
    found = [v for v in vars(store._storage).values() if isinstance(v, botocore.client.BaseClient)]
    assert len(found) == 1, found
    return found[0]


def before_each_put(store: StatusStore, action: Callable[[], None]) -> None:
    """Run ``action`` just before every PutObject ``store`` sends: a rival that always wins the race."""
    boto_client_of(store).meta.events.register("before-call.s3.PutObject", lambda **_: action())


# -- round trip --------------------------------------------------------------------------------------


# -- options, URLs, the extra --------------------------------------------------------------------


def test_unknown_storage_option_is_refused_by_name(s3: Bucket) -> None:
    url = s3.url()
    with pytest.raises(TrainingStatusValueError) as caught:
        StatusStore(url, storage_options={**s3.storage_options, "endpoint": "x", "acl": "y"})  # type: ignore[call-arg]
    assert isinstance(caught.value, ValueError)
    assert str(caught.value) == (
        f"Unknown storage option(s) 'acl', 'endpoint' for {url}; the options understood are "
        f"{OPTIONS_LIST} (named as in s3fs)."
    )
    assert caught.value.path == url


def test_client_kwargs_and_config_kwargs_are_passed_to_boto3(s3: Bucket) -> None:
    options = {
        "key": "testing", "secret": "testing", "token": "session-token",
        "client_kwargs": {"endpoint_url": s3.endpoint_url, "region_name": "us-east-1"},
        "config_kwargs": {"connect_timeout": 3, "retries": {"total_max_attempts": 2}},
    }
    with StatusStore(s3.url(), storage_options=options) as store:  # type: ignore[call-arg]
        store.set("a", "x", 1)
        client = boto_client_of(store)
        assert client.meta.endpoint_url == s3.endpoint_url
        assert client.meta.config.connect_timeout == 3
    assert stored(s3)["a"] == {"x": 1}


def test_default_config_bounds_retries_and_connect_timeout(s3: Bucket) -> None:
    config = boto_client_of(open_s3(s3)).meta.config
    assert config.connect_timeout == 5
    assert config.retries["total_max_attempts"] == 3


def test_anonymous_access_sends_unsigned_requests(s3: Bucket) -> None:
    store = StatusStore(s3.url(), storage_options={"endpoint_url": s3.endpoint_url, "anon": True,  # type: ignore[call-arg]
                                                   "region_name": "us-east-1"})
    client = boto_client_of(store)
    assert client.meta.config.signature_version is botocore.UNSIGNED  # type: ignore[attr-defined]


def test_without_options_the_aws_environment_applies(s3: Bucket, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {
        "AWS_ENDPOINT_URL": s3.endpoint_url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }.items():
        monkeypatch.setenv(name, value)
    with StatusStore(s3.url()) as store:
        store.set("env", "works", True)
    assert stored(s3)["env"] == {"works": True}


@pytest.mark.parametrize("url", ["s3://", "s3://bucket", "s3://bucket/", "s3:///key", "s3://bucket/dir/"])
def test_url_without_bucket_or_key_is_refused(url: str) -> None:
    with pytest.raises(TrainingStatusValueError) as caught:
        StatusStore(url, storage_options={})  # type: ignore[call-arg]
    assert str(caught.value) == (
        f"{url!r} does not name an object: use s3://<bucket>/<key>, e.g. "
        "s3://my-bucket/run/run_logs/training_status.json."
    )


def test_storage_options_on_a_local_path_are_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "status.json")
    with pytest.raises(TrainingStatusValueError) as caught:
        StatusStore(path, storage_options={"key": "x"})  # type: ignore[call-arg]
    assert isinstance(caught.value, ValueError) and caught.value.path == path
    assert str(caught.value) == (
        f"storage_options= is for s3://, gs:// and az:// URLs; {path!r} is a local path, which takes none. "
        "Leave storage_options out, or give an object store URL such as s3://bucket/key."
    )


def test_soft_lock_mode_is_refused_for_s3(s3: Bucket) -> None:
    url = s3.url()
    with pytest.raises(TrainingStatusValueError) as caught:
        open_s3(s3, lock="soft")
    assert isinstance(caught.value, ValueError) and caught.value.path == url
    assert str(caught.value) == (
        f"lock='soft' is for local paths; {url!r} is an s3:// object, which takes no lock "
        "(writes are conditional). Leave lock= out."
    )


_WITHOUT_BOTO3 = """
import sys
sys.modules["boto3"] = None  # import boto3 raises ImportError, as when the extra is not installed
from trainstatus import StatusStore, TrainingStatusDependencyError, TrainingStatusError
try:
    StatusStore("s3://bucket/run/status.json", storage_options={"key": "k"})
except TrainingStatusError as exc:
    # A public class (no private name in the traceback), an ImportError too.
    assert type(exc) is TrainingStatusDependencyError and isinstance(exc, ImportError), type(exc).__mro__
    assert isinstance(exc.__cause__, ImportError) and exc.path == "s3://bucket/run/status.json"
    print(exc)
store = StatusStore(sys.argv[1])  # a local path needs none of it
store.set("a", "x", 1)
assert "boto3" not in sys.modules or sys.modules["boto3"] is None
print("local ok")
"""


def test_without_boto3_s3_says_which_extra_and_local_paths_work(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _WITHOUT_BOTO3, str(tmp_path / "status.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        'Opening s3://bucket/run/status.json needs boto3, which is not installed: pip install "trainstatus[s3]".\n'
        "local ok\n"
    )


# -- missing bucket, unreachable server ----------------------------------------------------------------


def test_opening_in_a_missing_bucket_raises_read_error(s3: Bucket) -> None:
    url = "s3://no-such-bucket-here/run/status.json"
    with pytest.raises(TrainingStatusReadError) as caught:
        StatusStore(url, storage_options=s3.storage_options)  # type: ignore[call-arg]
    assert isinstance(caught.value, OSError)
    assert caught.value.path == url
    assert str(caught.value) == (
        f"Cannot read {url}: the bucket 'no-such-bucket-here' does not exist. Nothing was changed; "
        "create it (aws s3 mb s3://no-such-bucket-here) or fix the URL."
    )


def test_bucket_deleted_after_open_write_error_then_recreated(s3: Bucket) -> None:
    store = open_s3(s3)
    s3.empty_and_delete()
    with pytest.raises(TrainingStatusWriteError) as caught:
        store.set("a", "x", 1)
    assert caught.value.path == s3.url()
    assert str(caught.value) == (
        f"Could not save {s3.url()}: the bucket {s3.name!r} does not exist. Nothing was written and "
        "the store kept its state as before this call; create it "
        f"(aws s3 mb s3://{s3.name}) or fix the URL."
    )
    assert store.get("a", "x") is None  # memory unchanged
    s3.server.client().create_bucket(Bucket=s3.name)
    store.set("a", "y", 2)
    assert stored(s3)["a"] == {"y": 2}
    assert_memory_is_object(store, s3)


@pytest.fixture
def down(s3: Bucket) -> Iterator[tuple[StatusStore, str, str]]:
    """A store that wrote a/x = 1 on a server of its own, which is then killed: (store, url, endpoint)."""
    from _s3server import S3Server

    with S3Server() as server:
        url = f"s3://{server.new_bucket()}/status.json"
        store = StatusStore(url, storage_options={**server.storage_options, "config_kwargs": NO_RETRY})  # type: ignore[call-arg]
        store.set("a", "x", 1)
        endpoint = server.endpoint_url
        server.kill()
        yield store, url, endpoint


UNREACHABLE = {
    # A failed PUT:
    TrainingStatusWriteError: ("Could not save {url}: the endpoint could not be reached (",
                               "The store kept its state as before this call, and the object may or may "
                               "not hold this change; check the network and endpoint_url, then set the "
                               "value again."),
    # A write that must read the object first fails on that read, as a local store's write fails
    # with a read error when its merge cannot read the file: still an OSError, nothing changed.
    TrainingStatusReadError: ("Cannot read {url}: the endpoint could not be reached (",
                              "Nothing was changed; check the network and endpoint_url, then try again."),
}


def assert_unreachable(error: BaseException, expected: type[Exception], url: str, endpoint: str, attempt: int = 1,
                       again: str = "set the value again") -> None:
    assert isinstance(error, expected), f"attempt {attempt}: {type(error).__name__}: {error}"
    assert isinstance(error, OSError) and error.path == url  # type: ignore[attr-defined]
    start, end = UNREACHABLE[expected]
    end = end.replace("set the value again", again)
    message = str(error)
    assert message.startswith(start.format(url=url)) and message.endswith(end)
    assert endpoint in message
    assert isinstance(error.__cause__, botocore.exceptions.EndpointConnectionError)


WRITES_WHILE_DOWN: dict[str, Callable[[StatusStore], object]] = {
    "set": lambda s: s.set("a", "z", 3),
    "delete": lambda s: s.delete("a", "x"),
    "transaction": lambda s: s.run_transaction(lambda t: t.set("a", "n", t.get("a", "x") + 1)),  # type: ignore[attr-defined]
    "save": lambda s: s.save(),
}


@pytest.mark.parametrize("write", list(WRITES_WHILE_DOWN))
def test_writes_to_an_unreachable_endpoint_fail_clearly(down: Any, write: str) -> None:
    # Twice. set and save send their PUT at once: the first attempt is a write error. It may have
    # reached the server, so the store forgets the ETag and reads before its next write; while
    # the server is still down that read fails: a read error. A transaction (delete is one) asks
    # the server first, so its read fails each time.
    store, url, endpoint = down
    for attempt in (1, 2):
        with pytest.raises(OSError) as caught:
            WRITES_WHILE_DOWN[write](store)
        first_put = write in ("set", "save") and attempt == 1
        expected = TrainingStatusWriteError if first_put else TrainingStatusReadError
        again = "save again" if write == "save" else "set the value again"  # each call says its own
        assert_unreachable(caught.value, expected, url, endpoint, attempt, again)
        assert store.to_dict()["a"] == {"x": 1}, f"memory changed by failed attempt {attempt}"


def test_unreachable_endpoint_at_open_is_a_read_error(down: Any) -> None:
    _, url, endpoint = down
    with pytest.raises(TrainingStatusReadError) as caught:
        StatusStore(url, storage_options={"endpoint_url": endpoint, "key": "k", "secret": "s",  # type: ignore[call-arg]
                                          "config_kwargs": NO_RETRY})
    assert str(caught.value).startswith(f"Cannot read {url}: the endpoint could not be reached (")


# -- corrupt objects ---------------------------------------------------------------------------------

DAMAGED = {
    "not json": b'{"Walker": {"lesson": 3',
    "top level a list": b"[1, 2, 3]\n",
    "category not an object": b'{"Walker": 7, "metadata": {"stats_format_version": "0.3.0"}}',
    "empty": b"",
}


# -- conflicts and transactions ----------------------------------------------------------------------


def test_run_transaction_runs_once_on_a_local_file(tmp_path: Path) -> None:
    store = StatusStore(tmp_path / "status.json")
    calls: list[int] = []

    def bump(s: StatusStore) -> str:
        calls.append(1)
        s.set("c", "n", s.get("c", "n", 0) + 1)
        return "done"

    assert store.run_transaction(bump) == "done"  # type: ignore[attr-defined]
    assert calls == [1]
    assert StatusStore(tmp_path / "status.json").get("c", "n") == 1


@pytest.fixture
def always_losing(s3: Bucket) -> Iterator[tuple[StatusStore, StatusStore, list[int]]]:
    """A store whose every PUT loses to a rival store that writes just before it."""
    store, rival = open_s3(s3, lock_timeout=1.5), open_s3(s3)
    store.set("mine", "kept", 0)
    written: list[int] = []

    def rival_writes() -> None:
        written.append(len(written) + 1)
        rival.set("rival", "n", written[-1])

    before_each_put(store, rival_writes)
    yield store, rival, written


def test_conflicts_past_lock_timeout_raise_conflict_error(s3: Bucket, always_losing: Any) -> None:
    store, _, written = always_losing
    with pytest.raises(TrainingStatusConflictError) as caught:
        store.set("mine", "lost", 1)
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, TrainingStatusError)
    assert caught.value.path == s3.url()
    assert str(caught.value) == (
        f"Could not save {s3.url()}: other writers kept changing it for 1.5 s (lock_timeout), each "
        "time before this store's conditional write landed, so nothing of this call was written. "
        "Open the store with a longer lock_timeout=, or write less often."
    )
    assert len(written) >= 3  # retried with backoff, not given up at once
    assert conflicts(store) == len(written)
    assert "lost" not in stored(s3)["mine"]
    assert store.get("mine", "lost") is None
    assert store.get("mine", "kept") == 0
    # Memory shows the version that won last, other writers' values included.
    assert store.get("rival", "n") == len(written)
    assert {k: v for k, v in store.to_dict().items() if k != "metadata"} == {
        k: v for k, v in stored(s3).items() if k != "metadata"}


def test_run_transaction_gives_up_after_lock_timeout(s3: Bucket, always_losing: Any) -> None:
    store, _, written = always_losing
    with pytest.raises(TrainingStatusConflictError):
        store.run_transaction(lambda s: s.set("mine", "n", s.get("mine", "kept") + 1))  # type: ignore[attr-defined]
    assert written and "n" not in stored(s3)["mine"]


# -- found in review: ambiguity, fork, reads by delete, interrupted reads --------------------------------


def test_a_retried_put_whose_first_try_landed_is_never_merged_again(s3: Bucket) -> None:
    # botocore retries a PUT whose answer was lost (timeout, reset, 5xx after commit). If the first
    # try was applied, the retry gets 412 because of it: merging and retrying then would lay this
    # older change over whatever a rival wrote in between.
    store, rival = open_s3(s3), open_s3(s3)
    store.set("lesson", "num", 0)
    armed = [True]

    def lose_the_answer(response: Any = None, **_: Any) -> int | None:
        if armed[0] and response is not None and response[0] is not None and response[0].status_code == 200:
            armed[0] = False
            rival.set("lesson", "num", 2)  # acknowledged to the rival, after our (applied) first try
            return 0  # retry now, as botocore does after a lost answer
        return None

    boto_client_of(store).meta.events.register_first("needs-retry.s3.PutObject", lose_the_answer)
    with pytest.raises(TrainingStatusWriteError) as caught:
        store.set("lesson", "num", 1)
    assert str(caught.value) == (
        f"Could not save {s3.url()}: the answer to the write was lost and the automatic retry was "
        "then refused (412 PreconditionFailed), so the first try may or may not have been applied. "
        "The store kept its state as before this call; reload() to see the object, then make the "
        "change again if it is missing."
    )
    assert not armed[0]
    assert stored(s3)["lesson"] == {"num": 2}  # the rival's acknowledged value stands
    assert conflicts(store) == 0
    store.set("other", "k", 1)  # reads first (the version is unknown), then writes over it
    assert stored(s3)["lesson"] == {"num": 2} and stored(s3)["other"] == {"k": 1}


def _open_and_set(url: str, options: dict[str, Any], done: Any) -> None:
    store = StatusStore(url, storage_options=options)  # type: ignore[call-arg]
    store.set("child", "k", 1)
    done.set()


def test_a_child_forked_while_a_client_is_being_made_does_not_hang(s3: Bucket) -> None:
    import multiprocessing

    from trainstatus._remote import s3 as _s3

    context = multiprocessing.get_context("fork")
    done = context.Event()
    # As if another thread were making a boto3 session (0.3 s) at the moment of the fork.
    with _s3._sessions_lock:
        child = context.Process(target=_open_and_set, args=(s3.url(), s3.storage_options, done))
        child.start()
        finished = done.wait(30)
    child.join(30)
    if child.is_alive():
        child.kill()
    assert finished, "the forked child blocked on a lock its parent held at the fork"
    assert child.exitcode == 0
    assert stored(s3)["child"] == {"k": 1}


def test_what_delete_returned_inside_a_transaction_is_a_read(s3: Bucket) -> None:
    # Claiming a slot: "if delete(free): set(owner)". A rival claiming it between our read and our
    # write must make ours stale, not be overwritten by it.
    store, rival = open_s3(s3), open_s3(s3)
    store.set("slot", "free", True)
    claimed_by_rival: list[bool] = []

    def rival_claims() -> None:
        if not claimed_by_rival:
            with rival.transaction():
                claimed_by_rival.append(rival.delete("slot", "free"))
                rival.set("slot", "owner", "rival")

    before_each_put(store, rival_claims)

    def claim(s: StatusStore) -> bool:
        if s.delete("slot", "free"):
            s.set("slot", "owner", "us")
            return True
        return False

    assert store.run_transaction(claim) is False  # type: ignore[attr-defined]  # rerun: the slot was taken
    assert claimed_by_rival == [True]
    assert stored(s3)["slot"] == {"owner": "rival"}
    assert store.delete("other", "absent") is False  # a plain delete outside a transaction still works


def test_a_transaction_that_read_from_an_object_deleted_meanwhile_is_stale(s3: Bucket) -> None:
    store = open_s3(s3)
    store.set("c", "n", 5)
    deleted: list[bool] = []

    def delete_the_object() -> None:
        if not deleted:
            deleted.append(True)
            s3.server.client().delete_object(Bucket=s3.name, Key=Bucket.KEY)

    before_each_put(store, delete_the_object)
    with pytest.raises(TrainingStatusConflictError) as caught:
        with store.transaction():
            store.set("c", "n", store.get("c", "n") + 1)
    assert type(caught.value).__name__ == "_StaleRead"
    assert s3.read() is None  # nothing written over the deletion
