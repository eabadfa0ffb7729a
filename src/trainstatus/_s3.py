"""The status document as one S3 object, kept with conditional writes instead of a lock.

A lock file on one machine's disk excludes nobody on another, so nothing here locks. Every write
is a ``PutObject`` on a condition: ``If-Match: <ETag of the version last read or written>``, or
``If-None-Match: *`` while the store believes there is no object. S3 applies the condition and the
write atomically; a writer that lost the race gets ``412 Precondition Failed`` (``409`` when two
conditional writes overlap), which ``replace`` turns into ``Conflict``: the store reads the object
again, lays its pending changes over it key by key and tries again (``StatusStore._write``).

An ETag is the MD5 of the bytes (for a single-part upload), so two versions with the same bytes
share one; that is harmless here, since equal bytes are equal documents.

boto3 is imported only when an ``s3://`` store is opened (``pip install "trainstatus[s3]"``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
from collections.abc import Mapping
from typing import Any, ContextManager

from . import _interrupts
from . import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log
from ._errors import (
    TrainingStatusDependencyError,
    TrainingStatusReadError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusWriteError,
)
from ._location import is_s3_url
from ._storage import Conflict, Storage

__all__ = ["S3Object", "is_s3_url"]

logger = logging.getLogger("trainstatus")

# storage_options, named as fsspec/s3fs name them (what pandas and Lightning users already pass),
# mapped to boto3's names.
_CREDENTIALS = {"key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token"}
_OPTIONS = frozenset({*_CREDENTIALS, "endpoint_url", "region_name", "profile", "anon", "client_kwargs", "config_kwargs"})

_OPTION_KINDS: dict[str, type] = {"anon": bool, "client_kwargs": Mapping, "config_kwargs": Mapping}
_KIND_NAMES = {str: "a str", bool: "True or False", Mapping: "a dict"}

# botocore retries a failed request itself before we see an error; its default (legacy mode, a
# 60 s connect timeout) would make a set hang for minutes on an unreachable endpoint.
_CONFIG_DEFAULTS: dict[str, Any] = {"retries": {"total_max_attempts": 3, "mode": "standard"}, "connect_timeout": 5, "read_timeout": 30}

_CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_MISSING_KEY_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url[5:].partition("/")
    if not bucket or not key or key.endswith("/"):
        raise TrainingStatusValueError(
            f"{url!r} does not name an object: use s3://<bucket>/<key>, e.g. "
            "s3://my-bucket/run/run_logs/training_status.json.",
            path=url,
        )
    return bucket, key


def _client_factory(url: str, options: Mapping[str, Any]) -> Any:
    """A function making a boto3 S3 client for ``options`` (checked now, not at the first request)."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TrainingStatusValueError(
            f"Unknown storage option(s) {', '.join(map(repr, unknown))} for {url}; the options "
            f"understood are {', '.join(sorted(_OPTIONS))} (named as in s3fs).",
            path=url,
        )
    try:
        import boto3
        import botocore.config
    except ImportError as exc:
        raise TrainingStatusDependencyError(
            f"Opening {url} needs boto3, which is not installed: pip install \"trainstatus[s3]\".",
            path=url,
        ) from exc
    for name in sorted(_OPTIONS):
        value = options.get(name)
        kind = _OPTION_KINDS.get(name, str)
        if value is not None and not isinstance(value, kind):
            raise TrainingStatusTypeError(
                f"storage_options[{name!r}] must be {_KIND_NAMES[kind]} or None, not {type(value).__name__!r} "
                f"({value!r}), for {url}.",
                path=url,
            )
    session_args: dict[str, Any] = {boto: options[ours] for ours, boto in _CREDENTIALS.items() if options.get(ours) is not None}
    if options.get("profile") is not None:
        session_args["profile_name"] = options["profile"]
    client_args: dict[str, Any] = dict(options.get("client_kwargs") or {})
    for name in ("endpoint_url", "region_name"):
        if options.get(name) is not None:
            client_args[name] = options[name]
    config_args = {**_CONFIG_DEFAULTS, **(options.get("config_kwargs") or {})}
    if options.get("anon"):
        import botocore

        config_args["signature_version"] = botocore.UNSIGNED
    try:
        config = botocore.config.Config(**config_args)
    except (TypeError, ValueError) as exc:
        raise TrainingStatusValueError(
            f"storage_options['config_kwargs'] {options.get('config_kwargs')!r} for {url} is refused by "
            f"botocore.config.Config: {exc}. Give the arguments botocore.config.Config takes.",
            path=url,
        ) from exc

    def make() -> Any:
        # A new Session parses botocore's S3 model again (0.2-0.4 s); one per set of credentials
        # and per process makes opening a store ~10 ms. Sessions are not thread-safe: one lock.
        with _sessions_lock:
            # The AWS_* environment is read by the session: a changed environment, a new session.
            environment = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
            cache_key = (os.getpid(), repr((sorted(session_args.items()), environment)))
            session = _sessions.get(cache_key)
            if session is None:
                session = _sessions[cache_key] = boto3.session.Session(**session_args)
            try:
                return session.client("s3", config=config, **client_args)
            except (TypeError, ValueError) as exc:
                raise TrainingStatusValueError(
                    f"boto3 refused the storage_options of {url} (endpoint_url, region_name, client_kwargs "
                    f"{options.get('client_kwargs')!r}): {exc}. Fix them: endpoint_url is a URL such as "
                    "'http://localhost:9000'; client_kwargs are the arguments of boto3's client().",
                    path=url,
                ) from exc

    return make


_sessions: dict[tuple[int, str], Any] = {}
# Guards _sessions and making clients. Renewed in a forked child: another thread of the parent
# may have held it (making a client takes ~10 ms, a session 0.3 s) and would never release it there.
_sessions_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _sessions_lock
    _sessions_lock = threading.Lock()
    _sessions.clear()  # the parent's, keyed by its pid: useless here


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class S3Object(Storage):
    """A JSON document stored as one S3 (or S3-compatible) object."""

    conditional = True

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.location = url
        self._bucket, self._key = _split(url)
        self._make_client = _client_factory(url, storage_options or {})
        self._client: Any = None
        self._client_pid = -1
        # ETag of the version last read or written; None: there was no object; _UNKNOWN: forgotten.
        self._etag: str | None | object = _UNKNOWN
        self._last: bytes | None = None  # the bytes last read (what move_aside keeps)
        self.requests = 0  # sent, and answered with a conflict: for tests and benchmarks
        self.conflicts = 0

    # -- the client ------------------------------------------------------------------------------

    def _s3(self) -> Any:
        # boto3 clients are thread-safe but not fork-safe (their connection pool): one per process.
        # Two threads may both make one at first; either is fine. No lock here that a fork
        # could leave held (making it takes _sessions_lock, renewed in a child).
        if self._client_pid != os.getpid():
            self._client = self._make_client()
            self._client_pid = os.getpid()
        self.requests += 1
        return self._client

    def _failure(self, exc: Exception, doing: str) -> tuple[str, str]:
        """(what went wrong, what to do) for an error of botocore."""
        code, status = _code(exc)
        if code == "NoSuchBucket":
            return (f"the bucket {self._bucket!r} does not exist",
                    f"create it (aws s3 mb s3://{self._bucket}) or fix the URL")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken") or type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            return (f"access was refused ({code or type(exc).__name__})",
                    "check the credentials (storage_options key/secret/token, AWS_ACCESS_KEY_ID, "
                    "AWS_SECRET_ACCESS_KEY or ~/.aws) and the bucket's policy")
        if status is not None:
            return f"the server answered {status} {code}", f"check the server, then {doing}"
        return (f"the endpoint could not be reached ({exc})",
                f"check the network and endpoint_url, then {doing}")

    # -- reading -----------------------------------------------------------------------------------

    def read(self) -> bytes | None:
        try:
            with _interrupts.interruptible():  # a request may hang for minutes: Ctrl-C stops it
                answer = self._s3().get_object(Bucket=self._bucket, Key=self._key)
                data: bytes = answer["Body"].read()
        except Exception as exc:
            if _code(exc)[0] in _MISSING_KEY_CODES:
                self._etag, self._last = None, None
                return None
            if not _is_boto_error(exc):
                raise
            what, todo = self._failure(exc, "try again")
            raise TrainingStatusReadError(
                f"Cannot read {self.location}: {what}. Nothing was changed; {todo}.", path=self.location,
            ) from exc
        self._etag, self._last = answer["ETag"], data
        return data

    def changed(self) -> bool:
        try:
            with _interrupts.interruptible():
                answer = self._s3().head_object(Bucket=self._bucket, Key=self._key)
        except Exception as exc:
            if _code(exc)[0] in _MISSING_KEY_CODES:
                return self._etag is not None
            if not _is_boto_error(exc):
                raise
            return True  # let the read that follows report it
        return bool(answer["ETag"] != self._etag)

    def stale(self) -> bool:
        return self._etag is _UNKNOWN

    def forget(self) -> None:
        self._etag = _UNKNOWN

    # -- writing -----------------------------------------------------------------------------------

    def lock(self, timeout: float | None, *, configured: float | None = None) -> ContextManager[None]:
        return contextlib.nullcontext()  # the condition on each write does the excluding

    def replace(self, data: bytes) -> None:
        if self._etag is _UNKNOWN:  # pragma: no cover - the store reads before writing then
            raise Conflict()
        condition = {"IfNoneMatch": "*"} if self._etag is None else {"IfMatch": self._etag}
        try:
            # Interrupted, the write may or may not have landed: the store forgets the version
            # then, and its next write reads the object first.
            with _interrupts.interruptible():
                answer = self._s3().put_object(Bucket=self._bucket, Key=self._key, Body=data,
                                               ContentType="application/json", **condition)
        except Exception as exc:
            code, status = _code(exc)
            refused = code in _CONFLICT_CODES or status in (409, 412) or (self._etag is not None and code in _MISSING_KEY_CODES)
            # (If-Match on an object deleted meanwhile answers 404: also someone else's change.)
            if refused and not _retried(exc):
                self.conflicts += 1
                self.forget()
                raise Conflict() from exc
            if refused:
                # botocore retried after a first try whose answer was lost (a timeout, a reset, a
                # 5xx): that try may have been applied, and then the retry is refused because of
                # it. Merging and retrying here would apply this change again over whatever a
                # rival wrote since (an increment twice, or an older value over a newer one).
                self.forget()
                raise TrainingStatusWriteError(
                    f"Could not save {self.location}: the answer to the write was lost and the "
                    f"automatic retry was then refused ({status} {code}), so the first try may or "
                    "may not have been applied. The store kept its state as before this call; "
                    "reload() to see the object, then make the change again if it is missing.",
                    path=self.location,
                ) from exc
            if not _is_boto_error(exc):
                self.forget()
                raise
            # Without an answer (or with a 5xx) the write may still have been applied: read
            # again before the next one. A 4xx answer means it was refused.
            self.forget()
            what, todo = self._failure(exc, "set the value again")
            if status is not None and status < 500:
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
        self._etag, self._last = answer["ETag"], None
        logger.debug("wrote %s (%d bytes)", self.location, len(data))

    def move_aside(self) -> str:
        """Copy the object last read to ``<key>.corrupt-<UTC time>[-N]``; the next write replaces it.

        The damaged object is not deleted: a delete conditional on its ETag is recent on AWS and
        ignored by some S3-compatible servers, where it could delete a good version another writer
        put there meanwhile. The next write is conditional on the damaged version's ETag instead.
        """
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        base = f"{self._key}.corrupt-{stamp}"
        aside, n = base, 0
        data = self._last if self._last is not None else b""
        while True:
            try:
                self._s3().put_object(Bucket=self._bucket, Key=aside, Body=data, IfNoneMatch="*")
                break
            except Exception as exc:
                if _code(exc)[0] not in _CONFLICT_CODES:
                    raise _as_os_error(exc) from exc
            n += 1
            aside = f"{base}-{n}"
        self._last = None
        return f"s3://{self._bucket}/{aside}"

    def close(self) -> None:
        client, self._client, self._client_pid = self._client, None, -1
        if client is not None and hasattr(client, "close"):
            client.close()


_UNKNOWN: Any = object()


def _code(exc: BaseException) -> tuple[str, int | None]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", None
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status if isinstance(status, int) else None


def _retried(exc: BaseException) -> bool:
    """Whether botocore had sent the request more than once before this answer."""
    response = getattr(exc, "response", None)
    attempts = response.get("ResponseMetadata", {}).get("RetryAttempts", 0) if isinstance(response, dict) else 0
    return isinstance(attempts, int) and attempts > 0


def _is_boto_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("botocore", "boto3", "urllib3") or isinstance(exc, (ConnectionError, TimeoutError))


def _as_os_error(exc: Exception) -> OSError:
    return OSError(f"{type(exc).__name__}: {exc}")
