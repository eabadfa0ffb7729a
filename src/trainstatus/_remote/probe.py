"""Before the first write to an object store, prove that its server honours conditional writes.

An object-store status has no lock: every write is conditional on the version last read or
written, and a writer that lost the race is refused (``Conflict``), re-reads and merges. A server
that ignores the condition (some MinIO, Ceph and other S3-compatible releases shipped without it,
or with it broken) accepts every write instead, and concurrent writers silently lose each other's
values. Nothing in the answers tells the two apart, so the first write a process makes to a server
first runs a probe, on an object of its own beside the status (``<key>.trainstatus-probe-<random>``),
through the same storage seam as the status's writes:

1. two storages on the probe object read it (both see that there is none);
2. the first creates it, on the condition that there is none;
3. the second does the same, over the object now there: it **must** be refused;
4. the second reads the object, the first replaces it (conditional on the version both read);
5. the second writes on that version, replaced meanwhile: it **must** be refused;
6. the probe object is deleted (best effort; a failure is only logged).

A server that accepts the write of step 3 or 5 is refused with ``TrainingStatusBackendError``.
That costs 8 requests (3 GETs, 4 PUTs, a DELETE), once per server and process: the result is kept
per endpoint, a forked child inherits it, and a refusal is not kept (each write asks again, and
fails again, until the server is fixed or the store is opened with the opt-out). An error on the
way (the server down, access refused) is a ``TrainingStatusWriteError``, never taken for a server
that ignores conditions.

The opt-out is a storage option, so that it works for every object store and anywhere storage
options are given as strings: ``storage_options={"conditional_writes": "unchecked"}``, for a
status only one writer ever writes.

A storage takes part through ``Gate`` (made at open, checked at the start of every ``replace``) and
three methods (``Probed``): the endpoint it talks to, a storage on another object of the same
server, and deleting that object.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from .. import _interrupts
from .._errors import (
    TrainingStatusBackendError,
    TrainingStatusError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusWriteError,
)
from .._storage.base import Conflict

__all__ = ["MARK", "OPTION", "Gate", "Probed"]

logger = logging.getLogger("trainstatus")

OPTION = "conditional_writes"
_VALUES = ("checked", "unchecked")
MARK = ".trainstatus-probe-"


def _content(step: int) -> bytes:
    # Different bytes at each step: an S3 ETag is the MD5 of the bytes, and two versions with one
    # ETag would let the write of step 5 match the version that replaced the one it names. A reader
    # who finds a probe object left behind learns what it is.
    return b'{"trainstatus": "a probe of conditional writes; safe to delete", "step": %d}\n' % step


class Probed(Protocol):
    """What a storage offers the probe, besides ``read``/``replace`` (which raises ``Conflict``)."""

    location: str
    endpoint: str  # the server this storage talks to: the probe's result is kept per endpoint

    def read(self) -> bytes | None: ...

    def replace(self, data: bytes) -> None: ...


    def beside(self, url: str) -> Probed:
        """A storage on the object ``url`` of the same server, with no probe of its own.

        It may share this storage's connection: the probe never closes it."""

    def remove(self) -> None:
        """Delete this storage's object, unconditionally."""


# Endpoints whose probe passed in this process (or in the parent it was forked from: the answer
# holds there too). Guarded by _lock, which is held across a probe so that threads making their
# first writes at once send one probe, not one each.
_honoured: set[str] = set()
_lock = threading.Lock()
# Set while this thread probes: the probe's own writes are never probed (a storage whose ``beside``
# forgot to turn its probe off would otherwise wait for the lock its own thread holds).
_local = threading.local()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have been probing


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Gate:
    """One storage's probe: ``check`` before each write, which probes the first time it matters."""

    def __init__(self, url: str, options: Mapping[str, Any]) -> None:
        value = options.get(OPTION)
        if value is not None and not isinstance(value, str):
            raise TrainingStatusTypeError(
                f"storage_options[{OPTION!r}] must be a str or None, not {type(value).__name__!r} ({value!r}), "
                f"for {url}.",
                path=url,
            )
        if value is not None and value not in _VALUES:
            raise TrainingStatusValueError(
                f"storage_options[{OPTION!r}] is {value!r} for {url}; use 'checked' (the default: the "
                "first write to a server proves it honours conditional writes) or 'unchecked' (no "
                "proof, for a status only one writer ever writes).",
                path=url,
            )
        self._passed = value == "unchecked"

    def check(self, storage: Probed) -> None:
        if self._passed or getattr(_local, "probing", False):
            return
        endpoint = storage.endpoint
        if endpoint not in _honoured:
            # Waiting for another thread's probe (a few requests, or a timeout): Ctrl-C stops it.
            _interrupts.acquire(_lock, None)
            try:
                if endpoint not in _honoured:
                    _local.probing = True
                    try:
                        _probe(storage, endpoint)
                    finally:
                        _local.probing = False
                    _honoured.add(endpoint)
            finally:
                _lock.release()
        self._passed = True


def _probe(storage: Probed, endpoint: str) -> None:
    url = storage.location
    probe_url = f"{url}{MARK}{secrets.token_hex(8)}"
    first, second = storage.beside(probe_url), storage.beside(probe_url)
    created = False
    try:
        first.read()
        second.read()
        created = True  # from here on the object may exist (a failed create may have landed)
        first.replace(_content(2))
        if _accepted(second, 3):
            _refuse(url, endpoint, probe_url, "on the condition that there was no object, over an existing one")
        second.read()
        first.replace(_content(4))
        if _accepted(second, 5):
            _refuse(url, endpoint, probe_url, "on the condition that the object was still at a version since replaced")
    except Conflict as exc:
        # A create on a fresh name, or a write on the version just read, refused: nothing could
        # have raced it, so no conditional write of the store's would ever be accepted there.
        raise TrainingStatusBackendError(
            f"Could not save {url}: the server at {endpoint} refused a conditional write to {probe_url} "
            "that nothing had raced (on the version just read, or creating an object that did not "
            "exist), so it would refuse this store's writes too. Nothing of this call was written. "
            "Check the server's support for conditional writes (a proxy in front of it may alter them).",
            path=url, endpoint=endpoint,
        ) from exc
    except TrainingStatusBackendError:
        raise
    except TrainingStatusError as exc:
        if not isinstance(exc, OSError):
            raise
        # The server down, access refused...: not an answer about conditions. Said as a failed
        # write of the status (an OSError, as the store's own write errors), the probe's error kept.
        raise TrainingStatusWriteError(
            f"Could not save {url}: before the first write to {endpoint}, a store proves that the "
            f"server honours conditional writes, on an object of its own ({probe_url}), and that "
            f"failed. Nothing of this call was written; the probe's error: {exc}",
            path=url,
        ) from exc
    finally:
        if created:
            _remove(first, probe_url)
    logger.debug("%s honours conditional writes (probed with %s)", endpoint, probe_url)


def _accepted(storage: Probed, step: int) -> bool:
    """Whether a write that must be refused, as ``storage`` stands, went through."""
    try:
        storage.replace(_content(step))
    except Conflict:
        return False
    return True


def _refuse(url: str, endpoint: str, probe_url: str, how: str) -> None:
    raise TrainingStatusBackendError(
        f"Could not save {url}: the server at {endpoint} ignores conditional writes (it accepted a write "
        f"to {probe_url} {how}), so concurrent writers of this status would silently lose each "
        "other's values. Nothing of this call was written. Use a server that honours conditional "
        f"writes, or, if only one writer ever writes this status, open the store with "
        f"storage_options={{{OPTION!r}: 'unchecked'}}.",
        path=url, endpoint=endpoint,
    )


def _remove(storage: Probed, probe_url: str) -> None:
    try:
        storage.remove()
    except Exception as exc:  # noqa: BLE001 - best effort: the answer about the server stands
        logger.debug("could not delete the probe object %s: %s", probe_url, exc)
