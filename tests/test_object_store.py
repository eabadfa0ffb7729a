"""StatusStore on every object store (S3, GCS, Azure Blob) against real servers on loopback.

The ``bucket`` fixture (tests/conftest.py) runs each test on moto's S3 server (tests/_s3server.py),
fake-gcs-server and Azurite (tests/_objectservers.py) in turn, each started once per session: the
conditional-write protocol (``trainstatus._remote.object_store``) is one, so its tests are too. What only
one backend does (boto3's retries and events, a credentials file, an SDK's error words) is in
test_s3.py, test_gcs.py and test_azure.py; many processes and a server killed mid-run in
test_object_store_processes.py. The SDKs are imported at the top on purpose: they are in the
``test`` extra, so a missing one is a collection error, never a quiet skip.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import azure.storage.blob  # noqa: F401 - see the module doc
import boto3  # noqa: F401
import google.cloud.storage  # noqa: F401
import pytest
from _helpers import (
    OBJECT_KEY,
    assert_memory_is_object,
    conflicts,
    fill,
    requests,
    same,
    stored,
)

from trainstatus import (
    STATUS_FORMAT_VERSION,
    StatusStore,
    TrainingStatusConflictError,
    TrainingStatusCorruptError,
    TrainingStatusCorruptWarning,
    TrainingStatusMissingWarning,
    TrainingStatusReadError,
    TrainingStatusVersionWarning,
    TrainingStatusWriteError,
    __version__,
)

KEY = OBJECT_KEY  # where every bucket keeps its test object


# -- helpers ---------------------------------------------------------------------------------------


def open_at(bucket: Any, key: str = KEY, **options: Any) -> StatusStore:
    return StatusStore(bucket.url(key), storage_options=bucket.storage_options, **options)  # type: ignore[call-arg]


DAMAGED = {
    "not json": b'{"Walker": {"lesson": 3',
    "top level a list": b"[1, 2, 3]\n",
    "category not an object": b'{"Walker": 7, "metadata": {"stats_format_version": "0.3.0"}}',
    "empty": b"",
}


# -- first: the server really refuses a stale condition, so a pass below means something ------------


def test_the_server_refuses_a_stale_condition(bucket: Any) -> None:
    assert bucket.put_if(b"first", None)
    first = bucket.etag()
    assert not bucket.put_if(b"second create", None)  # create-only over an existing object
    assert bucket.put_if(b"second", first)
    assert not bucket.put_if(b"stale", first)  # conditional on a version no longer there
    assert bucket.read() == b"second"


# -- round trip --------------------------------------------------------------------------------------


def test_round_trip_bytes_are_the_local_file_layout(bucket: Any, tmp_path: Path) -> None:
    local_path = tmp_path / "training_status.json"
    metadata = {"torch_version": "2.5.1"}
    with open_at(bucket, metadata=metadata) as remote, StatusStore(local_path, metadata=metadata) as local:
        fill(remote)
        fill(local)
        assert remote.path == bucket.url()
    assert bucket.read() == local_path.read_bytes()
    with open_at(bucket, metadata=metadata) as again:
        assert same(again.to_dict(), StatusStore(local_path).to_dict())
        assert again.get("wall_height", "lesson_num") == 4
        assert again.get("metadata", "stats_format_version") == STATUS_FORMAT_VERSION
        assert again.get("metadata", "trainstatus_version") == __version__
        assert again.get("metadata", "torch_version") == "2.5.1"


def test_nan_and_infinity_round_trip_as_json_literals(bucket: Any) -> None:
    with open_at(bucket) as store:
        store.set("Walker", "reward", math.nan)
        store.set("Walker", "bounds", [math.inf, -math.inf])
    data = bucket.read()
    assert data is not None
    assert b'"reward": NaN' in data and b"Infinity" in data and b"-Infinity" in data
    with open_at(bucket) as again:
        assert math.isnan(again.get("Walker", "reward"))
        assert again.get("Walker", "bounds") == [math.inf, -math.inf]


def test_memory_is_the_object_after_every_call(bucket: Any) -> None:
    store = open_at(bucket)
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
        assert_memory_is_object(store, bucket)
    assert store.delete("nothing", "here") is False
    assert list(stored(bucket)) == ["c", "metadata"]


def test_one_request_per_uncontended_set(bucket: Any) -> None:
    store = open_at(bucket)
    store.set("warm", "up", 0)  # creates the object
    before = requests(store)
    for i in range(5):
        store.set("a", f"k{i}", i)
    assert requests(store) - before == 5  # a PUT each: no HEAD, no GET before it
    assert conflicts(store) == 0


def test_reload_and_transaction_ask_head_and_read_only_a_changed_object(bucket: Any) -> None:
    store, other = open_at(bucket), open_at(bucket)
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
    assert_memory_is_object(store, bucket)


def test_missing_object_starts_empty_and_warns_only_when_resuming(bucket: Any) -> None:
    assert open_at(bucket).to_dict() == {"metadata": {"stats_format_version": STATUS_FORMAT_VERSION,
                                                  "trainstatus_version": __version__}}
    assert bucket.read() is None  # opening writes nothing
    with pytest.warns(TrainingStatusMissingWarning) as caught:
        open_at(bucket, resume=True)
    assert caught[0].message.path == bucket.url()  # type: ignore[union-attr]
    assert bucket.url() in str(caught[0].message)


def test_metadata_mismatch_warns_as_for_a_file(bucket: Any) -> None:
    open_at(bucket, metadata={"torch_version": "1"}).save()
    with pytest.warns(TrainingStatusVersionWarning, match="torch_version"):
        open_at(bucket, metadata={"torch_version": "2"})


def test_durable_false_is_accepted_and_writes_the_same(bucket: Any) -> None:
    with open_at(bucket, durable=False) as store:
        store.set("a", "x", 1)
    assert stored(bucket)["a"] == {"x": 1}


def test_a_forked_child_makes_its_own_client_and_writes(bucket: Any) -> None:
    import multiprocessing

    store = open_at(bucket)
    store.set("parent", "before", 1)  # the parent's client exists and has a pooled connection
    child = multiprocessing.get_context("fork").Process(target=store.set, args=("child", "k", 2))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    store.set("parent", "after", 3)  # 412 (the child wrote), re-read, merged
    assert stored(bucket)["child"] == {"k": 2} and stored(bucket)["parent"] == {"before": 1, "after": 3}


def corrupt_copies(bucket: Any) -> list[str]:
    return [key for key in bucket.keys() if key.startswith(f"{KEY}.corrupt-")]


@pytest.mark.parametrize("damage", list(DAMAGED), ids=list(DAMAGED))
def test_corrupt_object_is_kept_aside_warned_and_store_starts_empty(bucket: Any, damage: str) -> None:
    data = DAMAGED[damage]
    bucket.write(data)
    with pytest.warns(TrainingStatusCorruptWarning) as caught:
        store = open_at(bucket)
    warning = caught[0].message
    assert isinstance(warning, TrainingStatusCorruptWarning)
    [copy] = corrupt_copies(bucket)
    assert warning.moved_to == f"{bucket.scheme}://{bucket.name}/{copy}"
    assert warning.path == bucket.url()
    assert str(warning).startswith(f"{bucket.url()} was damaged (")
    assert str(warning).endswith(
        f"; it was kept, byte for byte, as {warning.moved_to} and the store starts empty. "
        "Inspect that file to recover anything newer."
    )
    assert copy[len(f"{KEY}.corrupt-"):].endswith("Z")  # a UTC stamp
    assert bucket.read(copy) == data
    assert list(store.to_dict()) == ["metadata"]
    store.set("fresh", "start", 1)
    assert stored(bucket)["fresh"] == {"start": 1}
    assert bucket.read(copy) == data  # the copy outlives the next write


def test_corrupt_object_is_copied_and_left_for_the_next_write_to_replace(bucket: Any) -> None:
    # The spec: copied aside; "the object itself is replaced by the next write", by a PUT on the
    # damaged version's ETag. Deleting it at open instead relies on DeleteObject honouring If-Match,
    # which AWS does only since 2025-09 and S3-compatible servers may ignore: then another
    # writer's good object, written meanwhile, would be deleted with everything in it.
    bucket.write(DAMAGED["not json"])
    etag = bucket.etag()
    with pytest.warns(TrainingStatusCorruptWarning):
        store = open_at(bucket)
    assert bucket.read() == DAMAGED["not json"] and bucket.etag() == etag
    store.set("fresh", "start", 1)
    assert stored(bucket)["fresh"] == {"start": 1}


def test_corrupt_object_with_strict_raises_and_is_left_untouched(bucket: Any) -> None:
    bucket.write(DAMAGED["not json"])
    etag = bucket.etag()
    with pytest.raises(TrainingStatusCorruptError) as caught:
        open_at(bucket, strict=True)
    assert caught.value.path == bucket.url()
    assert str(caught.value).startswith(f"{bucket.url()} is damaged: it is not valid JSON (")
    assert bucket.read() == DAMAGED["not json"] and bucket.etag() == etag
    assert bucket.keys() == [KEY]


def test_a_second_damage_never_overwrites_the_first_copy(bucket: Any) -> None:
    bucket.write(b"first damage")
    with pytest.warns(TrainingStatusCorruptWarning) as first:
        open_at(bucket)
    bucket.write(b"second damage")
    with pytest.warns(TrainingStatusCorruptWarning) as second:
        open_at(bucket)
    first_url = first[0].message.moved_to  # type: ignore[union-attr]
    second_url = second[0].message.moved_to  # type: ignore[union-attr]
    assert first_url != second_url
    prefix = f"{bucket.scheme}://{bucket.name}/"
    assert bucket.read(first_url[len(prefix):]) == b"first damage"
    assert bucket.read(second_url[len(prefix):]) == b"second damage"


def test_damage_found_on_a_later_write_keeps_the_last_good_state(bucket: Any) -> None:
    store = open_at(bucket)
    store.set("mine", "a", 1)
    bucket.write(b"garbled by someone")  # another writer's damage: our next PUT gets 412
    with pytest.warns(TrainingStatusCorruptWarning) as caught:
        store.set("mine", "b", 2)
    moved = caught[0].message.moved_to  # type: ignore[union-attr]
    assert bucket.read(moved[len(f"{bucket.scheme}://{bucket.name}/"):]) == b"garbled by someone"
    assert stored(bucket)["mine"] == {"a": 1, "b": 2}
    assert_memory_is_object(store, bucket)


def test_plain_sets_on_different_keys_merge_after_a_conflict(bucket: Any) -> None:
    a, b = open_at(bucket), open_at(bucket)
    a.set("shared", "a", 1)
    b.set("shared", "b", 2)  # b's first PUT (If-None-Match: *) conflicts, b re-reads, retries
    a.set("shared", "c", 3)  # a's PUT (If-Match: stale ETag) conflicts too
    assert stored(bucket)["shared"] == {"a": 1, "b": 2, "c": 3}
    assert conflicts(a) == 1 and conflicts(b) == 1
    assert_memory_is_object(a, bucket)


def test_transaction_read_conflict_raises_and_writes_nothing(bucket: Any) -> None:
    a, b = open_at(bucket), open_at(bucket)
    a.set("c", "n", 1)
    b.reload()
    with pytest.raises(TrainingStatusConflictError) as caught, a.transaction():
        n = a.get("c", "n")
        b.set("c", "n", 10)  # another writer, between our read and our write
        a.set("c", "n", n + 1)
        a.set("c", "blind", True)
    assert isinstance(caught.value, TimeoutError)
    assert (caught.value.path, caught.value.category, caught.value.key) == (bucket.url(), "c", "n")
    assert str(caught.value) == (
        f"Another writer changed c/n in {bucket.url()} after this transaction read it, so the "
        "transaction was not written: its changes may rest on the old value. Run it again on the "
        "new state (store.run_transaction(func) does that)."
    )
    again = pickle.loads(pickle.dumps(caught.value))  # trainers ship errors between processes
    assert isinstance(again, TrainingStatusConflictError) and str(again) == str(caught.value)
    assert (again.path, again.category, again.key) == (bucket.url(), "c", "n")
    assert stored(bucket)["c"] == {"n": 10}
    assert a.get("c", "blind") is None
    assert a.get("c", "n") == 10  # memory took in the version read, without our change


def test_transaction_reading_the_whole_document_conflicts_on_any_change(bucket: Any) -> None:
    a, b = open_at(bucket), open_at(bucket)
    a.set("c", "n", 1)
    with pytest.raises(TrainingStatusConflictError) as caught, a.transaction():
        total = sum(len(keys) for keys in a.to_dict().values())
        b.set("elsewhere", "x", 1)
        a.set("c", "total", total)
    assert caught.value.category is None and caught.value.key is None
    assert f"Another writer changed the document in {bucket.url()} after" in str(caught.value)
    assert "total" not in stored(bucket)["c"]


def test_blind_write_transaction_merges_other_writers_keys(bucket: Any) -> None:
    a, b = open_at(bucket), open_at(bucket)
    a.set("c", "read", 1)
    with a.transaction():
        assert a.get("c", "read") == 1  # read a key nobody else changes
        a.set("c", "x", 1)
        b.set("c", "y", 2)
        b.set("other", "z", 3)
        a.set("c", "x2", 4)
        a.get("c", "x")  # reading our own change does not count as a read of the object
    document = stored(bucket)
    assert document["c"] == {"read": 1, "y": 2, "x": 1, "x2": 4} and document["other"] == {"z": 3}
    assert conflicts(a) == 1
    assert_memory_is_object(a, bucket)


def test_failed_transaction_body_writes_nothing(bucket: Any) -> None:
    a = open_at(bucket)
    a.set("c", "n", 1)
    etag = bucket.etag()
    with pytest.raises(RuntimeError), a.transaction():
        a.set("c", "n", 2)
        raise RuntimeError("body failed")
    assert bucket.etag() == etag and a.get("c", "n") == 1


def test_run_transaction_reruns_the_function_on_a_read_conflict(bucket: Any) -> None:
    a, b = open_at(bucket), open_at(bucket)
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
    assert stored(bucket)["c"] == {"n": 11}
    assert_memory_is_object(a, bucket)


def test_an_interrupted_read_is_forgotten_so_the_next_write_reads_again(bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainstatus._opening

    store, rival = open_at(bucket), open_at(bucket)
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
    assert stored(bucket)["c"] == {"ours": 2, "rival": 1}


# -- a missing bucket, an unreachable endpoint -------------------------------------------------------

CREATE_ADVICE = {
    "s3": "the bucket '{name}' does not exist. {outcome}; create it (aws s3 mb s3://{name}) or fix the URL.",
    "gs": "the bucket '{name}' does not exist. {outcome}; create it (gcloud storage buckets create gs://{name}) or fix the URL.",
    "az": "the container '{name}' does not exist. {outcome}; create it (az storage container create --name {name}) or fix the URL.",
}


def test_a_missing_bucket_is_an_error_naming_it_and_how_to_create_it(bucket: Any) -> None:
    missing = type(bucket)(bucket.server, "no-such-bucket-here")
    url = missing.url()
    if bucket.scheme == "gs":
        # A GCS read answers the same 404 for a missing object as for a missing bucket: the store
        # opens empty, and the first write (whose 404 can only be the bucket's) says so.
        store = open_at(missing)
        with pytest.raises(TrainingStatusWriteError) as caught:
            store.set("a", "x", 1)
        outcome, start = "Nothing was written and the store kept its state as before this call", f"Could not save {url}: "
        assert store.get("a", "x") is None
    else:
        with pytest.raises(TrainingStatusReadError) as caught:  # type: ignore[assignment]
            open_at(missing)
        outcome, start = "Nothing was changed", f"Cannot read {url}: "
    assert isinstance(caught.value, OSError) and caught.value.path == url
    assert str(caught.value) == start + CREATE_ADVICE[bucket.scheme].format(name="no-such-bucket-here", outcome=outcome)


def dead_endpoint(scheme: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """storage_options naming a loopback port nobody listens on, the SDK's retries cut short."""
    from _launch import free_port
    from _objectservers import AZURE_ACCOUNT, AZURE_KEY

    from trainstatus._remote import azure as _azure, gcs as _gcs

    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(_gcs, "_READ_RETRY_S", 0.2)
    monkeypatch.setattr(_azure, "_READ_RETRIES", 0)
    if scheme == "gs":
        return {"endpoint_url": endpoint, "token": "anon"}
    return {"connection_string": f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
                                 f"BlobEndpoint={endpoint}/{AZURE_ACCOUNT};"}


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_an_unreachable_endpoint_at_open_is_a_read_error(scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"{scheme}://bucket/run/status.json"
    with pytest.raises(TrainingStatusReadError) as caught:
        StatusStore(url, storage_options=dead_endpoint(scheme, monkeypatch))  # type: ignore[call-arg]
    message = str(caught.value)
    assert message.startswith(f"Cannot read {url}: the endpoint could not be reached (")
    assert message.endswith("Nothing was changed; check the network and endpoint_url, then try again.")


@pytest.mark.parametrize("server_class", ["GCSServer", pytest.param("AzuriteServer", marks=pytest.mark.long)])
def test_writes_while_the_server_is_gone_fail_clearly_and_keep_memory(server_class: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import _objectservers

    from trainstatus._remote import azure as _azure, gcs as _gcs

    monkeypatch.setattr(_gcs, "_READ_RETRY_S", 0.2)
    monkeypatch.setattr(_azure, "_READ_RETRIES", 0)
    with getattr(_objectservers, server_class)() as server:
        container = server.container(server.new_bucket())
        store = open_at(container)
        store.set("a", "x", 1)
        server.kill()
        # The upload fails: it may or may not have landed, so the store forgets the version and
        # its next write reads first, which fails too while the server is down.
        for attempt, expected in enumerate([TrainingStatusWriteError, TrainingStatusReadError]):
            with pytest.raises(expected) as caught:
                store.set("a", "y", 2)
            assert str(caught.value).startswith(
                f"{'Could not save' if attempt == 0 else 'Cannot read'} {container.url()}: the endpoint could not be reached (")
            assert store.to_dict()["a"] == {"x": 1}



# -- what every store shares: messages naming the scheme, the first-write hook ------------------------


def test_lock_and_history_options_are_refused_naming_the_store(bucket: Any) -> None:
    url = bucket.url()
    article = "a" if bucket.scheme == "gs" else "an"
    with pytest.raises(ValueError, match="lock") as caught:
        open_at(bucket, lock="soft")
    assert str(caught.value) == (f"lock='soft' is for local paths; {url!r} is {article} {bucket.scheme}:// object, which "
                                 "takes no lock (writes are conditional). Leave lock= out.")
    with pytest.raises(ValueError, match="history") as caught:
        open_at(bucket, history=3)
    assert str(caught.value).startswith(f"history=3 is kept for local files only; {url!r} is {article} {bucket.scheme}:// object.")


def test_the_probe_of_conditional_writes_passes_once_per_endpoint_and_leaves_nothing(bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each server refuses a stale condition (this module's first test), so the probe
    # (trainstatus._remote.probe, tested in depth on S3 in test_probe.py) must pass on each, once per
    # endpoint and process, through each adapter's own requests and delete.
    from trainstatus._remote import probe as _probe

    probed: list[str] = []
    real = _probe._probe
    monkeypatch.setattr(_probe, "_honoured", set())
    monkeypatch.setattr(_probe, "_probe", lambda storage, endpoint: (probed.append(endpoint), real(storage, endpoint))[1])
    first, second = open_at(bucket), open_at(bucket, key="other/training_status.json")
    assert probed == []  # opening reads only
    first.set("a", "x", 1)
    second.set("a", "x", 1)
    first.set("a", "y", 2)
    assert len(probed) == 1 and probed[0].startswith(bucket.endpoint_url)
    assert sorted(bucket.keys()) == sorted([KEY, "other/training_status.json"])  # the probe object removed
    assert stored(bucket)["a"] == {"x": 1, "y": 2}


def test_a_server_that_ignores_conditional_writes_is_refused_on_every_backend(bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The server behind a proxy that strips each backend's condition (S3's and Azure's headers,
    # GCS's query parameter) applies every write: the first write must be refused, nothing written.
    from _s3proxy import Proxy

    from trainstatus import TrainingStatusBackendError
    from trainstatus._remote import probe as _probe

    monkeypatch.setattr(_probe, "_honoured", set())
    with Proxy(bucket.endpoint_url, strip=("If-Match", "If-None-Match"), strip_query=("ifGenerationMatch",)) as proxy:
        options = dict(bucket.storage_options)
        if "connection_string" in options:
            # A shared-key signature covers the headers the proxy strips (Azurite would answer 403):
            # a SAS token, which signs none, as a user of SAS tokens sends.
            import datetime

            from _objectservers import AZURE_ACCOUNT, AZURE_KEY
            from azure.storage.blob import (
                AccountSasPermissions,
                ResourceTypes,
                generate_account_sas,
            )

            sas = generate_account_sas(
                AZURE_ACCOUNT, AZURE_KEY, ResourceTypes(service=True, container=True, object=True),
                AccountSasPermissions(read=True, write=True, delete=True, list=True, create=True, add=True),
                expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
            options = {"connection_string": f"BlobEndpoint={proxy.endpoint_url}/{AZURE_ACCOUNT};SharedAccessSignature={sas}"}
        else:
            options["endpoint_url"] = proxy.endpoint_url
        store = StatusStore(bucket.url(KEY), storage_options=options)  # type: ignore[call-arg]
        with pytest.raises(TrainingStatusBackendError, match="ignores conditional writes") as caught:
            store.set("a", "x", 1)
        assert caught.value.endpoint.startswith(proxy.endpoint_url)
        store.close()
    assert bucket.keys() == []  # neither the status nor the probe object


def test_an_object_deleted_behind_the_stores_back_counts_as_changed(bucket: Any) -> None:
    store = open_at(bucket)
    store.set("a", "x", 1)
    assert store._storage.changed() is False  # type: ignore[attr-defined]
    bucket.delete()
    assert store._storage.changed() is True  # type: ignore[attr-defined]  # HEAD's 404, where it had a version
    store.set("a", "y", 2)  # the upload on the old version is refused; read (none), then create
    assert stored(bucket)["a"]["y"] == 2
    assert_memory_is_object(store, bucket)
