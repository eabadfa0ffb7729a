"""A real S3-compatible server on loopback for the S3 tests and benchmark: moto's server mode.

Run as a script it *is* the server (one process); imported, ``S3Server`` starts that script as a
subprocess, so a test can kill it (SIGKILL, like a crashed or unreachable endpoint) and start it
again on the same port, which an in-process server thread could not model.

Two things differ from ``python -m moto.server``:

- Requests are served one at a time. moto's server is threaded, and its PutObject checks
  ``If-Match`` / ``If-None-Match`` and then stores the object in two steps without a lock
  (moto/s3/responses.py, ``put_object``): two writers with the same ETag can both pass the check
  and both get 200, the second silently overwriting the first. Real S3 makes the condition and the
  put one atomic step, which is the whole promise trainstatus's optimistic concurrency rests on.
  So the WSGI app runs behind a middleware holding one lock for the whole request, response body
  included. Connections stay threaded (HTTP/1.1 keep-alive, as a client of real S3 has); only the
  handling is serialized. Without this the tests would catch moto's race, not ours.
- Only S3 is served (see ``serve``): moto's dispatcher of all its services would add ~3 ms of
  server CPU to every request.
- ``--state FILE`` keeps every bucket and object in FILE after each request that may change
  them, and loads FILE at start: a server killed with SIGKILL and started again still holds every
  object whose PUT it acknowledged, as S3 does through an outage. (ETags are the MD5 of the bytes,
  so a restored object keeps its ETag.) Without it a restarted server starts empty.

The child exits when its stdin closes, so a test run that dies (even by SIGKILL) leaves no server.
"""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from _objectservers import HOST, _Server

REGION = "us-east-1"
# moto accepts any credentials; these are the ones its documentation uses.
KEY = "testing"
SECRET = "testing"
_MUTATING = frozenset({"PUT", "POST", "DELETE"})


# -- the server process ---------------------------------------------------------------------------


class _Serialized:
    """WSGI middleware: one request at a time, so moto's conditional PUT is atomic (see above)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], after_change: Callable[[], None] | None) -> None:
        self._app = app
        self._after_change = after_change
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            result = self._app(environ, start_response)
            try:
                body = b"".join(result)  # the whole response is made under the lock
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
            if self._after_change is not None and environ.get("REQUEST_METHOD") in _MUTATING:
                self._after_change()
        return [body]


def _s3_backend() -> Any:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]


def _snapshot() -> dict[str, dict[str, bytes]]:
    backend = _s3_backend()
    state: dict[str, dict[str, bytes]] = {}
    for name, bucket in backend.buckets.items():
        state[name] = {key_name: key.value for key_name, key in bucket.keys.items()}
    return state


def _save_state(path: str) -> None:
    data = pickle.dumps(_snapshot())
    temp = f"{path}.tmp"
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def _load_state(path: str) -> None:
    try:
        with open(path, "rb") as f:
            state = pickle.load(f)
    except FileNotFoundError:
        return
    backend = _s3_backend()
    for name, objects in state.items():
        backend.create_bucket(name, REGION)
        for key_name, value in objects.items():
            backend.put_object(name, key_name, value)


def _exit_when_parent_goes() -> None:
    # The parent holds our stdin open for as long as it wants the server; EOF means it is gone.
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os._exit(0)


def serve(port: int, state: str | None) -> None:
    import logging

    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    if state is not None:
        _load_state(state)
        after_change: Callable[[], None] | None = lambda: _save_state(state)  # noqa: E731
    else:
        after_change = None
    # S3's app alone, not moto's DomainDispatcherApplication: that one works out which of moto's
    # hundred services a request is for by scanning them all: about 3 ms more per request here,
    # more than S3's handling itself, which would make the benchmark measure moto's dispatcher.
    app = _Serialized(create_backend_app("s3"), after_change)
    server = make_server(HOST, port, app, threaded=True, request_handler=MotoRequestHandler)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    threading.Thread(target=_exit_when_parent_goes, daemon=True).start()
    print(f"listening {server.server_port}", flush=True)
    server.serve_forever()


# -- the test side --------------------------------------------------------------------------------


class S3Server(_Server):
    """The server subprocess: ``start()``, ``kill()``, ``restart()`` on the same port (see
    tests/_objectservers.py's ``_Server``, which the GCS and Azure servers share).

    ``persistent=True`` keeps objects across restarts (``--state``, see the module doc).
    """

    name = "moto"
    scheme = "s3"

    def __init__(self, *, persistent: bool = False) -> None:
        super().__init__(persistent=persistent)
        self._state = os.path.join(self._dir, "state.pickle") if persistent else None

    def command(self) -> list[str]:
        command = [sys.executable, os.path.abspath(__file__), "--port", str(self.port)]
        return command if self._state is None else [*command, "--state", self._state]

    def stdin(self) -> int:
        return subprocess.PIPE  # the server exits when this pipe closes (see serve)

    def ready_url(self) -> str:
        return f"{self.endpoint_url}/"  # ListBuckets

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "key": KEY, "secret": SECRET, "region_name": REGION}

    def client(self) -> Any:
        """A boto3 S3 client on this server (made once: boto3 clients are slow to make)."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client(
                "s3", endpoint_url=self.endpoint_url, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                region_name=REGION, config=Config(retries={"max_attempts": 2, "mode": "standard"}),
            )
        return self._client

    def new_bucket(self, prefix: str = "ts") -> str:
        """Create a bucket no other test uses and return its name."""
        name = self.bucket_name(prefix)
        self.client().create_bucket(Bucket=name)
        return name


class Bucket:
    """One bucket on an ``S3Server``, with what the tests read and write behind the store's back."""

    KEY = "run/run_logs/training_status.json"
    scheme = "s3"

    def __init__(self, server: S3Server, name: str) -> None:
        self.server = server
        self.name = name

    @property
    def endpoint_url(self) -> str:
        return self.server.endpoint_url

    @property
    def storage_options(self) -> dict[str, Any]:
        return self.server.storage_options

    def url(self, key: str = KEY) -> str:
        return f"s3://{self.name}/{key}"

    def read(self, key: str = KEY) -> bytes | None:
        """The object's bytes, or None if there is none."""
        client = self.server.client()
        try:
            return bytes(client.get_object(Bucket=self.name, Key=key)["Body"].read())
        except client.exceptions.NoSuchKey:
            return None

    def etag(self, key: str = KEY) -> str:
        return str(self.server.client().head_object(Bucket=self.name, Key=key)["ETag"])

    def write(self, data: bytes, key: str = KEY) -> str:
        """Replace the object unconditionally (another writer, or damage); its new ETag."""
        return str(self.server.client().put_object(Bucket=self.name, Key=key, Body=data)["ETag"])

    def delete(self, key: str = KEY) -> None:
        self.server.client().delete_object(Bucket=self.name, Key=key)

    def put_if(self, data: bytes, version: str | None, key: str = KEY) -> bool:
        """boto3's own conditional PUT: True if accepted, False if refused as stale."""
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            self.server.client().put_object(Bucket=self.name, Key=key, Body=data, **condition)
            return True
        except Exception as exc:
            if getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
                return False
            raise

    def keys(self) -> list[str]:
        listing = self.server.client().list_objects_v2(Bucket=self.name)
        return sorted(item["Key"] for item in listing.get("Contents", []))

    def empty_and_delete(self) -> None:
        client = self.server.client()
        for key in self.keys():
            client.delete_object(Bucket=self.name, Key=key)
        client.delete_bucket(Bucket=self.name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed at start)")
    parser.add_argument("--state", default=None, help="keep buckets and objects in this file across restarts")
    args = parser.parse_args(argv)
    serve(args.port, args.state)


if __name__ == "__main__":
    main()
