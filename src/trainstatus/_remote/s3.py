"""The status document as one S3 (or S3-compatible) object: the boto3 adapter of ``_remote.object_store``.

Each write is a ``PutObject`` with ``If-Match: <ETag>`` or ``If-None-Match: *``; a lost race is
``412 Precondition Failed`` (``409`` when two conditional writes overlap). An ETag is the MD5 of the
bytes (for a single-part upload), so two versions with the same bytes share one; that is harmless
here, since equal bytes are equal documents. botocore retries a failed PUT itself: ``_classify``
reports such a retry (``Failure.retried``), whose refusal may be caused by its own first try.

boto3 is imported only when an ``s3://`` store is opened (``pip install "trainstatus[s3]"``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from .._errors import TrainingStatusValueError
from .location import is_s3_url
from .object_store import (
    CONFLICT,
    CONTAINER,
    DENIED,
    ERROR,
    FOREIGN,
    MISSING,
    Failure,
    ObjectStorage,
    check_options,
    import_sdk,
)

__all__ = ["S3Object", "is_s3_url"]

# storage_options, named as fsspec/s3fs name them (what pandas and Lightning users already pass),
# mapped to boto3's names.
_CREDENTIALS = {"key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token"}
_OPTIONS = frozenset({*_CREDENTIALS, "endpoint_url", "region_name", "profile", "anon", "client_kwargs", "config_kwargs"})

_OPTION_KINDS: dict[str, type] = {"anon": bool, "client_kwargs": Mapping, "config_kwargs": Mapping}

# botocore retries a failed request itself before we see an error; its default (legacy mode, a
# 60 s connect timeout) would make a set hang for minutes on an unreachable endpoint.
_CONFIG_DEFAULTS: dict[str, Any] = {"retries": {"total_max_attempts": 3, "mode": "standard"}, "connect_timeout": 5, "read_timeout": 30}

_CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_DENIED_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"})
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
    check_options(url, options, {name: _OPTION_KINDS.get(name, str) for name in _OPTIONS}, "s3fs")
    import_sdk(url, "boto3", "boto3", "s3")
    import boto3
    import botocore.config

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


class S3Object(ObjectStorage):
    """A JSON document stored as one S3 (or S3-compatible) object."""

    scheme = "s3"

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        self.container, self.name = _split(url)
        options = storage_options or {}
        self._make_client = _client_factory(url, options)  # type: ignore[method-assign]
        # The server, as botocore picks it (the probe of conditional writes runs once per endpoint).
        self.endpoint = str(options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
                            or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                            or "https://s3.amazonaws.com")

    def _s3(self) -> Any:
        return self._connection()

    def _get(self, client: Any) -> tuple[bytes, str]:
        answer = client.get_object(Bucket=self.container, Key=self.name)
        return answer["Body"].read(), answer["ETag"]

    def _head(self, client: Any) -> str:
        return str(client.head_object(Bucket=self.container, Key=self.name)["ETag"])

    def _put(self, client: Any, name: str, data: bytes, version: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        answer = client.put_object(Bucket=self.container, Key=name, Body=data,
                                   ContentType="application/json", **condition)
        return str(answer["ETag"])

    def _delete(self, client: Any, name: str) -> None:
        client.delete_object(Bucket=self.container, Key=name)

    def _classify(self, exc: BaseException, *, writing: bool) -> Failure:
        code, status = _code(exc)
        retried = _retried(exc)
        if code in _CONFLICT_CODES or status in (409, 412):
            return Failure(CONFLICT, status, code, retried)
        if code in _MISSING_KEY_CODES:
            return Failure(MISSING, status, code, retried)
        if code == "NoSuchBucket":
            return Failure(CONTAINER, status, code)
        if code in _DENIED_CODES or type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            return Failure(DENIED, status, code)
        if not _is_boto_error(exc):
            return Failure(FOREIGN)
        return Failure(ERROR, status, code)

    def _create_advice(self) -> str:
        return f"create it (aws s3 mb s3://{self.container}) or fix the URL"

    def _credentials_advice(self) -> str:
        return ("check the credentials (storage_options key/secret/token, AWS_ACCESS_KEY_ID, "
                "AWS_SECRET_ACCESS_KEY or ~/.aws) and the bucket's policy")




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


