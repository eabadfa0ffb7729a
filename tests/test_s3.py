"""StatusStore on s3:// against a real S3-compatible server (moto's, on loopback; tests/_s3server.py).

One process here; many processes, the server killed mid-run and the benchmark are in
test_s3_processes.py. boto3 and moto are imported at the top on purpose: they are in the ``test``
extra, so a missing one is a collection error, never a quiet skip.
"""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3  # noqa: F401 - see the module doc
import botocore.client
import moto  # noqa: F401 - see the module doc
import pytest
from _helpers import same
from _s3server import Bucket

from trainstatus import (
    STATUS_FORMAT_VERSION,
    StatusStore,
    TrainingStatusConflictError,
    TrainingStatusCorruptError,
    TrainingStatusCorruptWarning,
    TrainingStatusError,
    TrainingStatusMissingWarning,
    TrainingStatusReadError,
    TrainingStatusValueError,
    TrainingStatusVersionWarning,
    TrainingStatusWriteError,
    __version__,
)

OPTIONS_LIST = "anon, client_kwargs, config_kwargs, endpoint_url, key, profile, region_name, secret, token"
# Fail fast where the server is meant to be unreachable (botocore's own retries are the spec's default).
NO_RETRY = {"retries": {"total_max_attempts": 1}, "connect_timeout": 2, "read_timeout": 5}


# -- helpers ---------------------------------------------------------------------------------------


def open_s3(s3: Bucket, key: str = Bucket.KEY, **options: Any) -> StatusStore:
    return StatusStore(s3.url(key), storage_options=s3.storage_options, **options)  # type: ignore[call-arg]


def stored(s3: Bucket, key: str = Bucket.KEY) -> dict[str, Any]:
    """The object as another reader parses it (Python's json: NaN literals allowed)."""
    data = s3.read(key)
    assert data is not None, f"no object at {key}"
    return json.loads(data)  # type: ignore[no-any-return]


def assert_memory_is_object(store: StatusStore, s3: Bucket) -> None:
    assert same(store.to_dict(), stored(s3))


def requests(store: StatusStore) -> int:
    return store._storage.requests  # type: ignore[attr-defined, no-any-return]


def conflicts(store: StatusStore) -> int:
    return store._storage.conflicts  # type: ignore[attr-defined, no-any-return]


def boto_client_of(store: StatusStore) -> Any:
    """The botocore client the store's storage made (it makes one per process, on first use)."""
    store._storage._s3()  # type: ignore[attr-defined]
    found = [v for v in vars(store._storage).values() if isinstance(v, botocore.client.BaseClient)]
    assert len(found) == 1, found
    return found[0]


def before_each_put(store: StatusStore, action: Callable[[], None]) -> None:
    """Run ``action`` just before every PutObject ``store`` sends: a rival that always wins the race."""
    boto_client_of(store).meta.events.register("before-call.s3.PutObject", lambda **_: action())


def fill(store: StatusStore) -> None:
    """The same changes, on any store: categories, a NaN, infinities, a delete, nesting."""
    store.set("wall_height", "lesson_num", 3)
    store.set("SoccerTwos?team=0", "elo", 1234.5)
    store.set("Walker", "checkpoints", [{"steps": 500_000, "reward": math.nan, "file_path": "Walker-500000.onnx"}])
    store.set("Walker", "final_checkpoint", None)
    store.set("extremes", "inf", [math.inf, -math.inf, 2**64 - 1, -(2**63)])
    store.set("extremes", "unicode", "größe ✓")
    store.set("gone", "soon", 1)
    assert store.delete("gone", "soon") is True
    with store.transaction():
        store.set("wall_height", "lesson_num", 4)
        store.set("Walker", "lesson", {"nested": {"deep": [1, 2.5, "x", True]}})


# -- round trip --------------------------------------------------------------------------------------


def test_round_trip_bytes_are_the_local_file_layout(s3: Bucket, tmp_path: Path) -> None:
    local_path = tmp_path / "training_status.json"
    metadata = {"torch_version": "2.5.1"}
    with open_s3(s3, metadata=metadata) as remote, StatusStore(local_path, metadata=metadata) as local:
        fill(remote)
        fill(local)
        assert remote.path == s3.url()
    assert s3.read() == local_path.read_bytes()
    with open_s3(s3, metadata=metadata) as again:
        assert same(again.to_dict(), StatusStore(local_path).to_dict())
        assert again.get("wall_height", "lesson_num") == 4
        assert again.get("metadata", "stats_format_version") == STATUS_FORMAT_VERSION
        assert again.get("metadata", "trainstatus_version") == __version__
        assert again.get("metadata", "torch_version") == "2.5.1"


def test_nan_and_infinity_round_trip_as_json_literals(s3: Bucket) -> None:
    with open_s3(s3) as store:
        store.set("Walker", "reward", math.nan)
        store.set("Walker", "bounds", [math.inf, -math.inf])
    data = s3.read()
    assert data is not None
    assert b'"reward": NaN' in data and b"Infinity" in data and b"-Infinity" in data
    with open_s3(s3) as again:
        assert math.isnan(again.get("Walker", "reward"))
        assert again.get("Walker", "bounds") == [math.inf, -math.inf]


def test_memory_is_the_object_after_every_call(s3: Bucket) -> None:
    store = open_s3(s3)
    steps: list[Callable[[], object]] = [
        lambda: store.set("a", "x", 1),
        lambda: store.set("b", "y", [1, 2]),
        lambda: store.delete("a", "x"),
        lambda: store.save(),
        lambda: store.clear(),
        lambda: store.set("c", "z", {"k": "v"}),
    ]
    for step in steps:
        step()
        assert_memory_is_object(store, s3)
    assert store.delete("nothing", "here") is False
    assert list(stored(s3)) == ["c", "metadata"]


def test_one_request_per_uncontended_set(s3: Bucket) -> None:
    store = open_s3(s3)
    store.set("warm", "up", 0)  # creates the object
    before = requests(store)
    for i in range(5):
        store.set("a", f"k{i}", i)
    assert requests(store) - before == 5  # a PUT each: no HEAD, no GET before it
    assert conflicts(store) == 0


def test_reload_and_transaction_ask_head_and_read_only_a_changed_object(s3: Bucket) -> None:
    store, other = open_s3(s3), open_s3(s3)
    store.set("a", "x", 1)
    before = requests(store)
    store.reload()
    assert requests(store) - before == 1  # HEAD only: unchanged
    other.set("a", "y", 2)
    assert store.get("a", "y") is None  # get reads memory, never the server
    before = requests(store)
    store.reload()
    assert requests(store) - before == 2  # HEAD, then GET
    assert store.get("a", "y") == 2
    other.set("a", "z", 3)
    before = requests(store)
    with store.transaction():
        assert store.get("a", "z") == 3  # read fresh at the start
        store.set("a", "w", 4)
    assert requests(store) - before == 3  # HEAD, GET, PUT
    assert_memory_is_object(store, s3)


def test_missing_object_starts_empty_and_warns_only_when_resuming(s3: Bucket) -> None:
    assert open_s3(s3).to_dict() == {"metadata": {"stats_format_version": STATUS_FORMAT_VERSION,
                                                  "trainstatus_version": __version__}}
    assert s3.read() is None  # opening writes nothing
    with pytest.warns(TrainingStatusMissingWarning) as caught:
        open_s3(s3, resume=True)
    assert caught[0].message.path == s3.url()  # type: ignore[union-attr]
    assert s3.url() in str(caught[0].message)


def test_metadata_mismatch_warns_as_for_a_file(s3: Bucket) -> None:
    open_s3(s3, metadata={"torch_version": "1"}).save()
    with pytest.warns(TrainingStatusVersionWarning, match="torch_version"):
        open_s3(s3, metadata={"torch_version": "2"})


def test_durable_false_is_accepted_and_writes_the_same(s3: Bucket) -> None:
    with open_s3(s3, durable=False) as store:
        store.set("a", "x", 1)
    assert stored(s3)["a"] == {"x": 1}


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
        f"storage_options= is for s3:// URLs; {path!r} is a local path, which takes none. "
        "Leave storage_options out, or give an s3://bucket/key URL."
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


def test_a_forked_child_makes_its_own_client_and_writes(s3: Bucket) -> None:
    import multiprocessing

    store = open_s3(s3)
    store.set("parent", "before", 1)  # the parent's client exists and has a pooled connection
    child = multiprocessing.get_context("fork").Process(target=store.set, args=("child", "k", 2))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    store.set("parent", "after", 3)  # 412 (the child wrote), re-read, merged
    assert stored(s3)["child"] == {"k": 2} and stored(s3)["parent"] == {"before": 1, "after": 3}


# -- corrupt objects ---------------------------------------------------------------------------------

DAMAGED = {
    "not json": b'{"Walker": {"lesson": 3',
    "top level a list": b"[1, 2, 3]\n",
    "category not an object": b'{"Walker": 7, "metadata": {"stats_format_version": "0.3.0"}}',
    "empty": b"",
}


def corrupt_copies(s3: Bucket) -> list[str]:
    return [key for key in s3.keys() if key.startswith(f"{Bucket.KEY}.corrupt-")]


@pytest.mark.parametrize("damage", list(DAMAGED), ids=list(DAMAGED))
def test_corrupt_object_is_kept_aside_warned_and_store_starts_empty(s3: Bucket, damage: str) -> None:
    data = DAMAGED[damage]
    s3.write(data)
    with pytest.warns(TrainingStatusCorruptWarning) as caught:
        store = open_s3(s3)
    warning = caught[0].message
    assert isinstance(warning, TrainingStatusCorruptWarning)
    [copy] = corrupt_copies(s3)
    assert warning.moved_to == f"s3://{s3.name}/{copy}"
    assert warning.path == s3.url()
    assert str(warning).startswith(f"{s3.url()} was damaged (")
    assert str(warning).endswith(
        f"; it was kept, byte for byte, as {warning.moved_to} and the store starts empty. "
        "Inspect that file to recover anything newer."
    )
    assert copy[len(f"{Bucket.KEY}.corrupt-"):].endswith("Z")  # a UTC stamp
    assert s3.read(copy) == data
    assert list(store.to_dict()) == ["metadata"]
    store.set("fresh", "start", 1)
    assert stored(s3)["fresh"] == {"start": 1}
    assert s3.read(copy) == data  # the copy outlives the next write


def test_corrupt_object_is_copied_and_left_for_the_next_write_to_replace(s3: Bucket) -> None:
    # The spec: copied aside; "the object itself is replaced by the next write", by a PUT on the
    # damaged version's ETag. Deleting it at open instead relies on DeleteObject honouring If-Match,
    # which AWS does only since 2025-09 and S3-compatible servers may ignore: then another
    # writer's good object, written meanwhile, would be deleted with everything in it.
    s3.write(DAMAGED["not json"])
    etag = s3.etag()
    with pytest.warns(TrainingStatusCorruptWarning):
        store = open_s3(s3)
    assert s3.read() == DAMAGED["not json"] and s3.etag() == etag
    store.set("fresh", "start", 1)
    assert stored(s3)["fresh"] == {"start": 1}


def test_corrupt_object_with_strict_raises_and_is_left_untouched(s3: Bucket) -> None:
    s3.write(DAMAGED["not json"])
    etag = s3.etag()
    with pytest.raises(TrainingStatusCorruptError) as caught:
        open_s3(s3, strict=True)
    assert caught.value.path == s3.url()
    assert str(caught.value).startswith(f"{s3.url()} is damaged: it is not valid JSON (")
    assert s3.read() == DAMAGED["not json"] and s3.etag() == etag
    assert s3.keys() == [Bucket.KEY]


def test_a_second_damage_never_overwrites_the_first_copy(s3: Bucket) -> None:
    s3.write(b"first damage")
    with pytest.warns(TrainingStatusCorruptWarning) as first:
        open_s3(s3)
    s3.write(b"second damage")
    with pytest.warns(TrainingStatusCorruptWarning) as second:
        open_s3(s3)
    first_url = first[0].message.moved_to  # type: ignore[union-attr]
    second_url = second[0].message.moved_to  # type: ignore[union-attr]
    assert first_url != second_url
    prefix = f"s3://{s3.name}/"
    assert s3.read(first_url[len(prefix):]) == b"first damage"
    assert s3.read(second_url[len(prefix):]) == b"second damage"


def test_damage_found_on_a_later_write_keeps_the_last_good_state(s3: Bucket) -> None:
    store = open_s3(s3)
    store.set("mine", "a", 1)
    s3.write(b"garbled by someone")  # another writer's damage: our next PUT gets 412
    with pytest.warns(TrainingStatusCorruptWarning) as caught:
        store.set("mine", "b", 2)
    moved = caught[0].message.moved_to  # type: ignore[union-attr]
    assert s3.read(moved[len(f"s3://{s3.name}/"):]) == b"garbled by someone"
    assert stored(s3)["mine"] == {"a": 1, "b": 2}
    assert_memory_is_object(store, s3)


# -- conflicts and transactions ----------------------------------------------------------------------


def test_plain_sets_on_different_keys_merge_after_a_conflict(s3: Bucket) -> None:
    a, b = open_s3(s3), open_s3(s3)
    a.set("shared", "a", 1)
    b.set("shared", "b", 2)  # b's first PUT (If-None-Match: *) conflicts, b re-reads, retries
    a.set("shared", "c", 3)  # a's PUT (If-Match: stale ETag) conflicts too
    assert stored(s3)["shared"] == {"a": 1, "b": 2, "c": 3}
    assert conflicts(a) == 1 and conflicts(b) == 1
    assert_memory_is_object(a, s3)


def test_transaction_read_conflict_raises_and_writes_nothing(s3: Bucket) -> None:
    a, b = open_s3(s3), open_s3(s3)
    a.set("c", "n", 1)
    b.reload()
    with pytest.raises(TrainingStatusConflictError) as caught, a.transaction():
        n = a.get("c", "n")
        b.set("c", "n", 10)  # another writer, between our read and our write
        a.set("c", "n", n + 1)
        a.set("c", "blind", True)
    assert isinstance(caught.value, TimeoutError)
    assert (caught.value.path, caught.value.category, caught.value.key) == (s3.url(), "c", "n")
    assert str(caught.value) == (
        f"Another writer changed c/n in {s3.url()} after this transaction read it, so the "
        "transaction was not written: its changes may rest on the old value. Run it again on the "
        "new state (store.run_transaction(func) does that)."
    )
    again = pickle.loads(pickle.dumps(caught.value))  # trainers ship errors between processes
    assert isinstance(again, TrainingStatusConflictError) and str(again) == str(caught.value)
    assert (again.path, again.category, again.key) == (s3.url(), "c", "n")
    assert stored(s3)["c"] == {"n": 10}
    assert a.get("c", "blind") is None
    assert a.get("c", "n") == 10  # memory took in the version read, without our change


def test_transaction_reading_the_whole_document_conflicts_on_any_change(s3: Bucket) -> None:
    a, b = open_s3(s3), open_s3(s3)
    a.set("c", "n", 1)
    with pytest.raises(TrainingStatusConflictError) as caught, a.transaction():
        total = sum(len(keys) for keys in a.to_dict().values())
        b.set("elsewhere", "x", 1)
        a.set("c", "total", total)
    assert caught.value.category is None and caught.value.key is None
    assert f"Another writer changed the document in {s3.url()} after" in str(caught.value)
    assert "total" not in stored(s3)["c"]


def test_blind_write_transaction_merges_other_writers_keys(s3: Bucket) -> None:
    a, b = open_s3(s3), open_s3(s3)
    a.set("c", "read", 1)
    with a.transaction():
        assert a.get("c", "read") == 1  # read a key nobody else changes
        a.set("c", "x", 1)
        b.set("c", "y", 2)
        b.set("other", "z", 3)
        a.set("c", "x2", 4)
        a.get("c", "x")  # reading our own change does not count as a read of the object
    document = stored(s3)
    assert document["c"] == {"read": 1, "y": 2, "x": 1, "x2": 4} and document["other"] == {"z": 3}
    assert conflicts(a) == 1
    assert_memory_is_object(a, s3)


def test_failed_transaction_body_writes_nothing(s3: Bucket) -> None:
    a = open_s3(s3)
    a.set("c", "n", 1)
    etag = s3.etag()
    with pytest.raises(RuntimeError), a.transaction():
        a.set("c", "n", 2)
        raise RuntimeError("body failed")
    assert s3.etag() == etag and a.get("c", "n") == 1


def test_run_transaction_reruns_the_function_on_a_read_conflict(s3: Bucket) -> None:
    a, b = open_s3(s3), open_s3(s3)
    seen: list[int] = []

    def bump(store: StatusStore) -> int:
        n: int = store.get("c", "n", 0)
        seen.append(n)
        if len(seen) == 1:
            b.set("c", "n", 10)
        store.set("c", "n", n + 1)
        return n + 1

    assert a.run_transaction(bump) == 11  # type: ignore[attr-defined]
    assert seen == [0, 10]
    assert stored(s3)["c"] == {"n": 11}
    assert_memory_is_object(a, s3)


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
    store, rival = open_s3(s3, lock_timeout=0.4), open_s3(s3)
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
        f"Could not save {s3.url()}: other writers kept changing it for 0.4 s (lock_timeout), each "
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

    from trainstatus import _s3

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


def test_an_interrupted_read_is_forgotten_so_the_next_write_reads_again(s3: Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainstatus._opening

    store, rival = open_s3(s3), open_s3(s3)
    store.set("c", "ours", 1)
    rival.set("c", "rival", 1)  # acknowledged to the rival
    real = trainstatus._opening.load_document

    def interrupted(data: bytes) -> Any:
        monkeypatch.setattr(trainstatus._opening, "load_document", real)
        raise KeyboardInterrupt  # Ctrl-C while the document read is parsed

    monkeypatch.setattr(trainstatus._opening, "load_document", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.reload()
    store.set("c", "ours", 2)
    assert stored(s3)["c"] == {"ours": 2, "rival": 1}


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
