"""The probe of conditional writes (src/trainstatus/_remote/probe.py), against moto's S3 server on loopback.

A server that ignores the condition is the real one behind a proxy that strips ``If-Match`` /
``If-None-Match`` (tests/_s3proxy.py); a pass-through proxy counts what a store sends. Every test
starts with no endpoint probed, as a new process does.
"""

from __future__ import annotations

import multiprocessing
import pickle
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _s3proxy import Proxy
from _s3server import Bucket

from trainstatus import (
    STATUS_FORMAT_VERSION,
    StatusStore,
    TrainingStatusBackendError,
    TrainingStatusError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusWriteError,
)
from trainstatus._remote import probe as _probe
from trainstatus._remote.s3 import S3Object

CONDITIONS = ("If-Match", "If-None-Match")
# The probe's requests on a server that honours the condition, in order, with the condition each carries.
HONOURED = [("GET", None), ("GET", None), ("PUT", "if-none-match"), ("PUT", "if-none-match"),
            ("GET", None), ("PUT", "if-match"), ("PUT", "if-match"), ("DELETE", None)]
UNCHECKED = {"conditional_writes": "unchecked"}
NO_RETRY = {"retries": {"total_max_attempts": 1}, "connect_timeout": 2, "read_timeout": 5}
HOW = {
    "If-None-Match": "on the condition that there was no object, over an existing one",
    "If-Match": "on the condition that the object was still at a version since replaced",
}


@pytest.fixture(autouse=True)
def _no_endpoint_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_probe, "_honoured", set())


@pytest.fixture
def ignoring(s3: Bucket) -> Iterator[Proxy]:
    """The test server behind a proxy that strips both conditions: a server that ignores them."""
    with Proxy(s3.endpoint_url, strip=CONDITIONS) as proxy:
        yield proxy


@pytest.fixture
def counting(s3: Bucket) -> Iterator[Proxy]:
    """The test server behind a proxy that changes nothing and records every request."""
    with Proxy(s3.endpoint_url) as proxy:
        yield proxy


def open_via(proxy: Proxy, s3: Bucket, key: str = Bucket.KEY, **options: Any) -> StatusStore:
    return StatusStore(s3.url(key), storage_options=proxy.options({**s3.storage_options, **options}))  # type: ignore[call-arg]


def open_s3(s3: Bucket, key: str = Bucket.KEY, **kwargs: Any) -> StatusStore:
    return StatusStore(s3.url(key), storage_options=s3.storage_options, **kwargs)  # type: ignore[call-arg]


def probe_requests(proxy: Proxy) -> list[tuple[str, str | None]]:
    """(method, condition sent) of each request the proxy saw for a probe object."""
    seen = proxy.requests_to(_probe.MARK)
    return [(s.method, next((h for h in ("if-match", "if-none-match") if h in s.headers), None)) for s in seen]


def probe_url_in(message: str) -> str:
    found = re.search(r"s3://\S+\.trainstatus-probe-[0-9a-f]{16}", message)
    assert found, message
    return found.group(0).rstrip(",)")


def refusal(url: str, endpoint: str, probe_url: str, how: str) -> str:
    return (
        f"Could not save {url}: the server at {endpoint} ignores conditional writes (it accepted a write "
        f"to {probe_url} {how}), so concurrent writers of this status would silently lose each other's "
        "values. Nothing of this call was written. Use a server that honours conditional writes, or, if "
        "only one writer ever writes this status, open the store with "
        "storage_options={'conditional_writes': 'unchecked'}."
    )


# -- a server that ignores the condition ----------------------------------------------------------


def test_a_server_that_ignores_conditions_is_refused_and_nothing_is_left(s3: Bucket, ignoring: Proxy) -> None:
    store = open_via(ignoring, s3)
    with pytest.raises(TrainingStatusBackendError) as caught:
        store.set("a", "x", 1)
    error = caught.value
    assert str(error) == refusal(s3.url(), ignoring.endpoint_url, probe_url_in(str(error)), HOW["If-None-Match"])
    assert (error.path, error.endpoint) == (s3.url(), ignoring.endpoint_url)
    assert isinstance(error, TrainingStatusError) and not isinstance(error, OSError)  # not a transient failure
    again = pickle.loads(pickle.dumps(error))  # trainers ship errors between processes
    assert type(again) is TrainingStatusBackendError and str(again) == str(error) and again.endpoint == error.endpoint
    assert s3.keys() == []  # neither the status nor the probe object
    assert store.get("a", "x") is None
    # A refusal is not remembered: the next write proves it again (and is refused again).
    with pytest.raises(TrainingStatusBackendError):
        store.set("a", "x", 1)
    assert probe_requests(ignoring) == 2 * [*HONOURED[:4], ("DELETE", None)]  # refused at the 4th each time
    assert s3.keys() == []


@pytest.mark.parametrize("stripped", CONDITIONS)
def test_a_server_that_ignores_one_of_the_two_conditions_is_refused(s3: Bucket, stripped: str) -> None:
    with Proxy(s3.endpoint_url, strip=(stripped,)) as proxy:
        with pytest.raises(TrainingStatusBackendError) as caught:
            open_via(proxy, s3).set("a", "x", 1)
        assert str(caught.value) == refusal(s3.url(), proxy.endpoint_url, probe_url_in(str(caught.value)), HOW[stripped])
        assert probe_requests(proxy)[-1] == ("DELETE", None)
    assert s3.keys() == []


def test_the_opt_out_writes_through_a_server_that_ignores_conditions_without_probing(s3: Bucket, ignoring: Proxy) -> None:
    with open_via(ignoring, s3, **UNCHECKED) as store:
        store.set("a", "x", 1)
        store.set("a", "y", 2)
    assert s3.read() is not None and b'"x": 1' in s3.read()  # type: ignore[operator]
    assert ignoring.requests_to(_probe.MARK) == []
    assert s3.keys() == [Bucket.KEY]


def test_the_opt_out_of_one_store_does_not_vouch_for_the_server(s3: Bucket, ignoring: Proxy) -> None:
    open_via(ignoring, s3, **UNCHECKED).set("a", "x", 1)
    with pytest.raises(TrainingStatusBackendError):
        open_via(ignoring, s3).set("a", "y", 2)


# -- a server that honours it ------------------------------------------------------------------------


def test_a_server_that_honours_conditions_costs_one_probe_per_process(s3: Bucket, counting: Proxy) -> None:
    first = open_via(counting, s3)
    first.set("a", "x", 1)
    assert probe_requests(counting) == HONOURED
    first.set("a", "y", 2)
    second = open_via(counting, s3, key="other/training_status.json")  # another store, same server
    second.set("b", "z", 3)
    with second.transaction():
        second.set("b", "w", 4)
    assert probe_requests(counting) == HONOURED  # no second probe
    assert s3.keys() == ["other/training_status.json", Bucket.KEY]  # the probe object is gone
    assert first.get("a", "x") == 1 and second.get("b", "w") == 4


def test_the_result_is_kept_per_endpoint(s3: Bucket, counting: Proxy) -> None:
    open_via(counting, s3).set("a", "x", 1)
    with Proxy(s3.endpoint_url) as other:  # the same server under another endpoint URL
        open_via(other, s3).set("a", "y", 2)
        assert probe_requests(other) == HONOURED
    assert probe_requests(counting) == HONOURED


def test_reading_never_probes(s3: Bucket, counting: Proxy) -> None:
    s3.write(b'{"a": {"x": 1}, "metadata": {"stats_format_version": "%s"}}' % STATUS_FORMAT_VERSION.encode())
    store = open_via(counting, s3)
    store.reload()
    assert store.get("a", "x") == 1
    assert counting.requests_to(_probe.MARK) == []


def test_threads_making_their_first_writes_at_once_send_one_probe(s3: Bucket, counting: Proxy) -> None:
    stores = [open_via(counting, s3, key=f"t{i}/training_status.json") for i in range(4)]
    start = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def write(store: StatusStore) -> None:
        try:
            start.wait(10)
            store.set("a", "x", 1)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert probe_requests(counting) == HONOURED
    assert len(s3.keys()) == len(stores)


def _set_and_report(store: StatusStore, done: Any) -> None:
    store.set("child", "k", 1)
    done.set()


def test_a_forked_child_trusts_its_parents_probe(s3: Bucket, counting: Proxy) -> None:
    store = open_via(counting, s3)
    store.set("parent", "k", 1)
    context = multiprocessing.get_context("fork")
    done = context.Event()
    child = context.Process(target=_set_and_report, args=(open_via(counting, s3, key="child.json"), done))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and done.is_set()
    assert probe_requests(counting) == HONOURED  # the child sent none
    assert s3.keys() == ["child.json", Bucket.KEY]


def test_a_child_forked_while_another_thread_probes_does_not_hang(s3: Bucket) -> None:
    context = multiprocessing.get_context("fork")
    done = context.Event()
    store = open_s3(s3)
    with _probe._lock:  # as if another thread of this process were probing at the moment of the fork
        child = context.Process(target=_set_and_report, args=(store, done))
        child.start()
        finished = done.wait(20)
    child.join(30)
    if child.is_alive():
        child.kill()
    assert finished, "the forked child blocked on the probe lock its parent held at the fork"
    assert child.exitcode == 0


# -- errors on the way are not answers ------------------------------------------------------------------


def test_a_server_down_during_the_probe_is_a_write_error_not_a_refusal(s3: Bucket, counting: Proxy) -> None:
    store = open_via(counting, s3, config_kwargs=NO_RETRY)  # opening reads the status: the server is up
    counting.down = True
    with pytest.raises(TrainingStatusWriteError) as caught:
        store.set("a", "x", 1)
    error = caught.value
    assert not isinstance(error, TrainingStatusBackendError) and isinstance(error, OSError)
    probe_url = probe_url_in(str(error))
    assert str(error).startswith(
        f"Could not save {s3.url()}: before the first write to {counting.endpoint_url}, a store proves that "
        f"the server honours conditional writes, on an object of its own ({probe_url}), and that failed. "
        f"Nothing of this call was written; the probe's error: Cannot read {probe_url}: the endpoint "
        "could not be reached ("
    )
    assert isinstance(error.__cause__, OSError) and error.path == s3.url()
    assert store.get("a", "x") is None
    assert [s.method for s in counting.requests_to(_probe.MARK)] == ["GET"]  # no DELETE: nothing was created
    counting.down = False  # back: the next write probes, passes and writes
    store.set("a", "x", 1)
    assert probe_requests(counting)[1:] == HONOURED
    assert s3.keys() == [Bucket.KEY]


def test_a_server_that_refuses_every_conditional_write_is_refused_at_once(s3: Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the probe such a store would retry for lock_timeout and raise a conflict error.
    from trainstatus._storage.base import Conflict

    real = S3Object.replace

    def refuse_probes(self: S3Object, data: bytes) -> None:
        if _probe.MARK in self.location:
            raise Conflict()
        real(self, data)

    monkeypatch.setattr(S3Object, "replace", refuse_probes)
    # (lock_timeout: without the probe's answer, the store would retry for that long.)
    store = open_s3(s3, lock_timeout=1)
    with pytest.raises(TrainingStatusBackendError) as caught:
        store.set("a", "x", 1)
    probe_url = probe_url_in(str(caught.value))
    assert str(caught.value) == (
        f"Could not save {s3.url()}: the server at {s3.endpoint_url} refused a conditional write to "
        f"{probe_url} that nothing had raced (on the version just read, or creating an object that did "
        "not exist), so it would refuse this store's writes too. Nothing of this call was written. Check "
        "the server's support for conditional writes (a proxy in front of it may alter them)."
    )
    assert s3.keys() == []


# -- the option ----------------------------------------------------------------------------------------

URL = "s3://bucket-name/run/run_logs/training_status.json"


@pytest.mark.parametrize("value", ["checked", "unchecked", None])
def test_the_option_takes_checked_or_unchecked(value: str | None) -> None:
    S3Object(URL, {"conditional_writes": value})


def test_another_option_value_is_refused_at_open() -> None:
    with pytest.raises(TrainingStatusValueError) as caught:
        S3Object(URL, {"conditional_writes": "off"})
    assert str(caught.value) == (
        f"storage_options['conditional_writes'] is 'off' for {URL}; use 'checked' (the default: the "
        "first write to a server proves it honours conditional writes) or 'unchecked' (no proof, for a "
        "status only one writer ever writes)."
    )
    assert caught.value.path == URL


def test_an_option_of_another_type_is_refused_by_any_backend() -> None:
    # S3's own option check says the same first; a backend without one relies on the gate's.
    expected = f"storage_options['conditional_writes'] must be a str or None, not 'bool' (False), for {URL}."
    for make in (lambda: S3Object(URL, {"conditional_writes": False}), lambda: _probe.Gate(URL, {"conditional_writes": False})):
        with pytest.raises(TrainingStatusTypeError) as caught:
            make()
        assert str(caught.value) == expected


def test_the_probes_own_writes_are_never_probed(s3: Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    # A backend whose ``beside`` forgets to turn the probe off must not wait for its own lock.
    real = S3Object.beside

    def beside_probing_too(self: S3Object, url: str) -> S3Object:
        other = real(self, url)
        other._probe = _probe.Gate(url, {})
        return other

    monkeypatch.setattr(S3Object, "beside", beside_probing_too)
    done: list[bool] = []
    writer = threading.Thread(target=lambda: done.append(open_s3(s3).set("a", "x", 1) is None), daemon=True)
    writer.start()
    writer.join(20)
    assert done == [True], "the probe waited for its own lock"
    assert s3.keys() == [Bucket.KEY]
