"""The status document as one object in an object store, kept with conditional writes instead of a lock.

A lock file on one machine's disk excludes nobody on another, so nothing here locks. Every write
is one upload on a condition: "only if the object is still the version last read or written"
(S3 ``If-Match: <ETag>``, GCS ``ifGenerationMatch=<generation>``, Azure ``If-Match: <ETag>``), or
"only if there is no object" while the store believes there is none (``If-None-Match: *``,
``ifGenerationMatch=0``). The store applies the condition and the write atomically; a writer that
lost the race is refused (412, or 409 for a create), which ``replace`` turns into ``Conflict``: the
store reads the object again, lays its pending changes over it key by key and tries again
(``StatusStore._write``).

This module holds that protocol once. An adapter (``_remote.s3``, ``_remote.gcs``, ``_remote.azure``) only says how to
send four requests (get with version, head, conditional put, make a client) and what an error of
its SDK means (``Failure``).

Nothing here relies on a server-side copy or delete honouring a condition: some servers ignore
conditions there (fake-gcs-server on copy and delete; DeleteObject ``If-Match`` is recent on AWS
and missing on some S3-compatible servers). A damaged object is kept aside by uploading the bytes
read to a new name, create-only, and is then replaced by the next conditional write.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import importlib
import logging
import os
from collections.abc import Mapping
from typing import Any, ContextManager, NamedTuple

from .. import _interrupts
from . import probe as _probe
from .._errors import (
    TrainingStatusDependencyError,
    TrainingStatusReadError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusWriteError,
)
from .._storage.base import Conflict, Storage

__all__ = ["Failure", "ObjectStorage", "check_options", "import_sdk"]

logger = logging.getLogger("trainstatus")

# What an error of an SDK means for the protocol (Failure.kind):
CONFLICT = "conflict"  # the condition failed: another writer's version is there (412, 409 on create)
MISSING = "missing"  # there is no such object
CONTAINER = "container"  # the bucket or container does not exist
DENIED = "denied"  # credentials missing or refused
ERROR = "error"  # any other answer (status set), or none at all (status None: unreachable)
FOREIGN = "foreign"  # not an error of the SDK or the network: a bug, re-raised as it is

_KIND_NAMES: dict[Any, str] = {str: "a str", bool: "True or False", Mapping: "a dict"}


class Failure(NamedTuple):
    kind: str
    status: int | None = None
    code: str = ""
    retried: bool = False  # the SDK had sent the request more than once before this answer


def check_options(url: str, options: Mapping[str, Any], kinds: Mapping[str, Any], named_as: str) -> None:
    """Refuse an option not in ``kinds`` (naming it and the known ones) or of the wrong type.

    ``kinds`` maps each option to the type its value must have (None is always allowed), or to
    None where the adapter checks the value itself.
    """
    kinds = {**kinds, _probe.OPTION: None}  # every object store's: the probe checks its value
    unknown = sorted(set(options) - set(kinds))
    if unknown:
        raise TrainingStatusValueError(
            f"Unknown storage option(s) {', '.join(map(repr, unknown))} for {url}; the options "
            f"understood are {', '.join(sorted(kinds))} (named as in {named_as}).",
            path=url,
        )
    for name in sorted(kinds):
        value, kind = options.get(name), kinds[name]
        if value is not None and kind is not None and not isinstance(value, kind):
            raise TrainingStatusTypeError(
                f"storage_options[{name!r}] must be {_KIND_NAMES[kind]} or None, not {type(value).__name__!r} "
                f"({value!r}), for {url}.",
                path=url,
            )


def import_sdk(url: str, module: str, package: str, extra: str) -> Any:
    """Import ``module`` of an optional SDK, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TrainingStatusDependencyError(
            f"Opening {url} needs {package}, which is not installed: pip install \"trainstatus[{extra}]\".",
            path=url,
        ) from exc


class ObjectStorage(Storage):
    """A JSON document stored as one object, written with conditional uploads.

    Subclasses set ``scheme``, ``container`` (bucket or container name), ``name`` (the object's
    name in it) and ``endpoint`` (the server's URL: the probe that it honours conditional writes
    runs once per endpoint and process, ``_remote.probe``), and implement the ``_``-methods below.
    """

    conditional = True
    scheme = ""  # as the URLs of moved-aside copies are written: "s3", "gs", "az"
    container_word = "bucket"  # what the SDK calls a container, for messages

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        self.location = url
        # Checks the conditional_writes option now, and before the first write proves that the
        # server honours the condition (unless the option says not to).
        self._probe = _probe.Gate(url, options or {})
        self.container = ""
        self.name = ""
        self.endpoint = ""
        self._client: Any = None
        self._client_pid = -1
        # Version token (ETag or generation) of the version last read or written; None: there
        # was no object; _UNKNOWN: forgotten (a write must read first).
        self._version: str | None | object = _UNKNOWN
        self._last: bytes | None = None  # the bytes last read (what move_aside keeps)
        self.requests = 0  # sent, and answered with a conflict: for tests and benchmarks
        self.conflicts = 0

    # -- what an adapter implements ----------------------------------------------------------------

    def _make_client(self) -> Any:
        raise NotImplementedError

    def _get(self, client: Any) -> tuple[bytes, str]:
        """The object's bytes and version, read in one request (an error if there is none)."""
        raise NotImplementedError

    def _head(self, client: Any) -> str:
        """The object's version (an error if there is none)."""
        raise NotImplementedError

    def _put(self, client: Any, name: str, data: bytes, version: str | None) -> str:
        """Upload ``data`` as ``name`` only if its version is ``version`` (None: only if there is
        no object); the new version. Sent once, or, where the SDK retries it, ``_classify`` says so
        (``Failure.retried``): a retry refused because its own first try landed is no conflict."""
        raise NotImplementedError

    def _delete(self, client: Any, name: str) -> None:
        """Delete ``name``, unconditionally (only the probe's own object is ever deleted)."""
        raise NotImplementedError

    def _classify(self, exc: BaseException, *, writing: bool) -> Failure:
        raise NotImplementedError

    def _create_advice(self) -> str:
        """What to do when the bucket or container does not exist."""
        raise NotImplementedError

    def _credentials_advice(self) -> str:
        raise NotImplementedError

    def url_of(self, name: str) -> str:
        return f"{self.scheme}://{self.container}/{name}"

    # -- the client ------------------------------------------------------------------------------

    def _connection(self) -> Any:
        # SDK clients are thread-safe but not fork-safe (their connection pool): one per process.
        # Two threads may both make one at first; either is fine. No lock here that a fork
        # could leave held.
        if self._client_pid != os.getpid():
            self._client = self._make_client()
            self._client_pid = os.getpid()
        self.requests += 1
        return self._client

    def _failure(self, failure: Failure, exc: BaseException, doing: str) -> tuple[str, str]:
        """(what went wrong, what to do) for an error of the SDK."""
        if failure.kind == CONTAINER:
            return f"the {self.container_word} {self.container!r} does not exist", self._create_advice()
        if failure.kind == DENIED:
            return f"access was refused ({failure.code or type(exc).__name__})", self._credentials_advice()
        if failure.status is not None:
            return f"the server answered {failure.status} {failure.code}", f"check the server, then {doing}"
        return (f"the endpoint could not be reached ({exc})",
                f"check the network and endpoint_url, then {doing}")

    # -- reading -----------------------------------------------------------------------------------

    def read(self) -> bytes | None:
        try:
            with _interrupts.interruptible():  # a request may hang for minutes: Ctrl-C stops it
                data, version = self._get(self._connection())
        except Exception as exc:
            failure = self._classify(exc, writing=False)
            if failure.kind == MISSING:
                self._version, self._last = None, None
                return None
            if failure.kind == FOREIGN:
                raise
            what, todo = self._failure(failure, exc, "try again")
            raise TrainingStatusReadError(
                f"Cannot read {self.location}: {what}. Nothing was changed; {todo}.", path=self.location,
            ) from exc
        self._version, self._last = version, data
        return data

    def changed(self) -> bool:
        try:
            with _interrupts.interruptible():
                version = self._head(self._connection())
        except Exception as exc:
            failure = self._classify(exc, writing=False)
            if failure.kind == MISSING:
                return self._version is not None
            if failure.kind == FOREIGN:
                raise
            return True  # let the read that follows report it
        return version != self._version

    def stale(self) -> bool:
        return self._version is _UNKNOWN

    def found(self) -> bool:
        """Whether the last read or write found an object (False after a read of none)."""
        return self._version is not None

    def forget(self) -> None:
        self._version = _UNKNOWN

    # -- writing -----------------------------------------------------------------------------------

    def lock(self, timeout: float | None, *, configured: float | None = None) -> ContextManager[object]:
        return contextlib.nullcontext()  # the condition on each write does the excluding

    # -- what the probe of conditional writes uses (_remote.probe.Probed) -----------------------------------

    def beside(self, url: str) -> ObjectStorage:
        """A storage on the object ``url`` (this object's URL plus a suffix) of the same server,
        sharing this one's client, with no probe of its own."""
        if not url.startswith(self.location):  # pragma: no cover - the probe's names always do
            raise ValueError(f"{url!r} is not beside {self.location!r}")
        if self._client_pid != os.getpid():  # made now, so that the copies share it (after a fork too)
            self._client, self._client_pid = self._make_client(), os.getpid()
        other = copy.copy(self)
        other.location, other.name = url, self.name + url[len(self.location):]
        other._probe = _probe.Gate(url, {_probe.OPTION: "unchecked"})
        other._version, other._last = _UNKNOWN, None
        return other

    def remove(self) -> None:
        with _interrupts.interruptible():
            self._delete(self._connection(), self.name)

    def replace(self, data: bytes) -> None:
        if self._version is _UNKNOWN:  # pragma: no cover - the store reads before writing then
            raise Conflict()
        version: str | None = self._version  # type: ignore[assignment]
        self._probe.check(self)
        try:
            # Interrupted, the write may or may not have landed: the store forgets the version
            # then, and its next write reads the object first.
            with _interrupts.interruptible():
                new_version = self._put(self._connection(), self.name, data, version)
        except Exception as exc:
            failure = self._classify(exc, writing=True)
            # (A condition on an object deleted meanwhile may answer 404: also someone else's change.)
            refused = failure.kind == CONFLICT or (version is not None and failure.kind == MISSING)
            if refused and not failure.retried:
                self.conflicts += 1
                self.forget()
                raise Conflict() from exc
            self.forget()
            if refused:
                # The SDK retried after a first try whose answer was lost (a timeout, a reset, a
                # 5xx): that try may have been applied, and then the retry is refused because of
                # it. Merging and retrying here would apply this change again over whatever a
                # rival wrote since (an increment twice, or an older value over a newer one).
                raise TrainingStatusWriteError(
                    f"Could not save {self.location}: the answer to the write was lost and the "
                    f"automatic retry was then refused ({failure.status} {failure.code}), so the first try may or "
                    "may not have been applied. The store kept its state as before this call; "
                    "reload() to see the object, then make the change again if it is missing.",
                    path=self.location,
                ) from exc
            if failure.kind == FOREIGN:
                raise
            # Without an answer (or with a 5xx) the write may still have been applied: read
            # again before the next one. A 4xx answer means it was refused.
            what, todo = self._failure(failure, exc, "set the value again")
            if failure.kind in (CONTAINER, DENIED) or (failure.status is not None and failure.status < 500):
                outcome = "Nothing was written and the store kept its state as before this call"
            else:
                outcome = ("The store kept its state as before this call, and the object may or may "
                           "not hold this change")
            raise TrainingStatusWriteError(
                f"Could not save {self.location}: {what}. {outcome}; {todo}.",
                path=self.location,
            ) from exc
        except BaseException:  # interrupted (Ctrl-C): the write may or may not have landed
            self.forget()
            raise
        self._version, self._last = new_version, None
        logger.debug("wrote %s (%d bytes)", self.location, len(data))

    def move_aside(self) -> str:
        """Copy the object last read to ``<name>.corrupt-<UTC time>[-N]``; the next write replaces it.

        A create-only upload of the bytes read, not a server-side copy, and the damaged object is
        not deleted: a delete conditional on its version is ignored by some servers, where it
        could delete a good version another writer put there meanwhile. The next write is
        conditional on the damaged version instead.
        """
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        base = f"{self.name}.corrupt-{stamp}"
        aside, n = base, 0
        data = self._last if self._last is not None else b""
        while True:
            try:
                self._put(self._connection(), aside, data, None)
                break
            except Exception as exc:
                if self._classify(exc, writing=True).kind != CONFLICT:
                    raise OSError(f"{type(exc).__name__}: {exc}") from exc
            n += 1
            aside = f"{base}-{n}"
        self._last = None
        return self.url_of(aside)

    def close(self) -> None:
        client, self._client, self._client_pid = self._client, None, -1
        if client is not None and hasattr(client, "close"):
            client.close()


_UNKNOWN: Any = object()
