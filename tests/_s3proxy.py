"""An HTTP proxy on loopback in front of a test server: a server that ignores conditional writes.

``Proxy(upstream, strip=("If-Match", "If-None-Match"))`` forwards every request to ``upstream``
without the headers named in ``strip`` (and the query parameters named in ``strip_query``, where
GCS puts its condition, ``ifGenerationMatch``): the server behind it then applies every write
unconditionally, as an S3-compatible release without conditional writes does, while answering
like the real one in every other way. With nothing stripped it is a pass-through that counts
requests (``seen``), so a test can count what a store sends, probe included, without touching
its client. ``down = True`` makes it drop every request unanswered (a server gone mid-run).

It is a plain stdlib server on a thread: one upstream connection per client connection, bodies
read whole (the status documents are small), hop-by-hop headers dropped. moto's server does not
check request signatures, so a request with a header removed is still accepted; a real S3 server
would refuse it, which is why this is a test tool only.
"""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

HOST = "127.0.0.1"
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                         "upgrade", "content-length"})


class Seen(NamedTuple):
    """One request as the proxy received it: method, path (query included), header names (lower case)."""

    method: str
    path: str
    headers: frozenset[str]


class Proxy:
    """See the module doc. ``with Proxy(...) as proxy:`` starts it and stops it, connections included."""

    def __init__(self, upstream: str, *, strip: tuple[str, ...] = (), strip_query: tuple[str, ...] = ()) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._upstream = (parsed.hostname or HOST, parsed.port or 80)
        self.strip = frozenset(name.lower() for name in strip)
        self.strip_query = frozenset(strip_query)
        self.down = False
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://{HOST}:{self._server.server_address[1]}"

    def options(self, storage_options: dict[str, Any]) -> dict[str, Any]:
        """``storage_options`` for the server behind, pointed at this proxy."""
        return {**storage_options, "endpoint_url": self.endpoint_url}

    def without_query(self, path: str) -> str:
        if not self.strip_query:
            return path
        parts = urllib.parse.urlsplit(path)
        query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k not in self.strip_query]
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))

    def requests_to(self, marker: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if marker in urllib.parse.unquote(s.path)]

    def start(self) -> Proxy:
        server = ThreadingHTTPServer((HOST, 0), _Handler)
        server.daemon_threads = True
        server.proxy = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="s3-proxy", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        # Each open client connection has a thread blocked reading its next request: end them.
        with self._lock:
            sockets, self._sockets = set(self._sockets), set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # for the handler

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def _connected(self, sock: socket.socket, open_: bool) -> None:
        with self._lock:
            (self._sockets.add if open_ else self._sockets.discard)(sock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as boto3 expects of S3
    server: Any

    def setup(self) -> None:
        super().setup()
        self._upstream: http.client.HTTPConnection | None = None
        self.server.proxy._connected(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._connected(self.connection, False)
            if self._upstream is not None:
                self._upstream.close()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no line per request on stderr

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size + 2)[:size]  # the chunk and its CRLF
                if not size:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(chunks)
                chunks.append(chunk)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self) -> None:
        proxy: Proxy = self.server.proxy
        body = self._body()
        proxy._record(Seen(self.command, self.path, frozenset(k.lower() for k in self.headers)))
        if proxy.down:
            self.close_connection = True  # no answer at all: the client sees the connection dropped
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in proxy.strip | _HOP_BY_HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        if self._upstream is None:
            self._upstream = http.client.HTTPConnection(*proxy._upstream, timeout=30)
        try:
            self._upstream.request(self.command, proxy.without_query(self.path), body=body, headers=headers)
            answer = self._upstream.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException):
            self._upstream.close()
            self._upstream = None
            self.close_connection = True
            return
        self.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", answer.getheader("Content-Length") or "0")
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward
