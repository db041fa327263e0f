"""A real S3-protocol server on 127.0.0.1 for tests (moto's server mode), and a reverse
proxy in front of it that injects faults: 503 ``SlowDown`` answers, bodies cut short, and
bodies that stall.

``moto_server()`` starts moto in a thread of this process on a free port and stops it
(closing its socket and joining its thread) when the block ends. ``FaultProxy(endpoint)``
forwards every request to ``endpoint`` unchanged (moto does not check signatures, so
requests signed for the proxy's address are fine) unless a fault is due.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Credentials moto accepts (it accepts any); the tests pass them the documented ways.
KEY = "datapipes-test-key"
SECRET = "datapipes-test-secret"  # noqa: S105 - a fake credential for a local server
REGION = "eu-west-1"

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message>"
    b"<RequestId>datapipes-fault</RequestId></Error>"
)

# Headers that describe one hop's connection, not the request: never forwarded.
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "proxy-connection"})


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a free port) for the block; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs a line per request to stderr: keep test output readable.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()  # shuts the serve loop down and joins its thread
        if server._server is not None:  # noqa: SLF001 - moto's stop() leaves the socket open
            server._server.server_close()  # noqa: SLF001


def is_object_get(method: str, path: str) -> bool:
    """A GET of an object (``/bucket/key``), not of a bucket (a listing: ``/bucket?...``)."""
    bucket_and_key = urlsplit(path).path.lstrip("/")
    return method == "GET" and "/" in bucket_and_key.rstrip("/")


class FaultProxy:
    """A reverse proxy on 127.0.0.1 in front of ``target`` (an ``http://host:port`` URL).

    Faults apply to object GETs (reads of file contents) unless ``every_request`` is set:

    - ``fail_next(n)``: the next ``n`` answer 503 ``SlowDown``;
    - ``outage(seconds)``: every one answers 503 until then (``inf``: for good);
    - ``cut_next(n)``: the next ``n`` send the headers and half of the body, then hang up;
    - ``stall_next(n)``: the next ``n`` send the headers and half of the body, then nothing
      until ``release`` is set (or 30 s: the proxy never holds a thread for ever).

    ``log`` holds ``(monotonic time, method, path, status, Range header or "")`` for every
    request.
    """

    def __init__(self, target: str) -> None:
        split = urlsplit(target)
        self.target = (split.hostname or "127.0.0.1", split.port or 80)
        self.lock = threading.Lock()
        self.every_request = False
        self.failures_left = 0
        self.outage_until = 0.0
        self.cuts_left = 0
        self.stalls_left = 0
        self.release = threading.Event()
        self.done = {"503": 0, "cut": 0, "stall": 0}  # the faults dealt out
        self.log: list[tuple[float, str, str, int, str]] = []
        handler = partial(_ProxyHandler, proxy=self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def fail_next(self, count: int) -> None:
        with self.lock:
            self.failures_left = count

    def outage(self, seconds: float) -> None:
        with self.lock:
            self.outage_until = time.monotonic() + seconds

    def cut_next(self, count: int) -> None:
        with self.lock:
            self.cuts_left = count

    def stall_next(self, count: int) -> None:
        with self.lock:
            self.stalls_left = count

    def heal(self) -> None:
        """No more faults, and stalled answers end now."""
        with self.lock:
            self.failures_left = self.cuts_left = self.stalls_left = 0
            self.outage_until = 0.0
        self.release.set()

    def reset(self) -> None:
        """No faults, an empty log and fresh counts (stalls wait for ``release`` again)."""
        self.heal()
        with self.lock:
            self.every_request = False
            self.log.clear()
            self.done = dict.fromkeys(self.done, 0)
        self.release.clear()

    def count(self, status: int | None = None, *, objects: bool = True) -> int:
        """Requests logged (object GETs only, unless ``objects=False``), of ``status`` if set."""
        with self.lock:
            return sum(
                1
                for _, method, path, code, _ in self.log
                if (not objects or is_object_get(method, path)) and status in (None, code)
            )

    def fault_for(self, method: str, path: str) -> str | None:
        """The fault this request gets (``"503"``, ``"cut"``, ``"stall"``), or ``None``."""
        with self.lock:
            fault = self._due(method, path)
            if fault is not None:
                self.done[fault] += 1
            return fault

    def _due(self, method: str, path: str) -> str | None:
        """The fault due now (called under the lock)."""
        if not (self.every_request or is_object_get(method, path)):
            return None
        if time.monotonic() < self.outage_until:
            return "503"
        if self.failures_left > 0:
            self.failures_left -= 1
            return "503"
        if self.cuts_left > 0:
            self.cuts_left -= 1
            return "cut"
        if self.stalls_left > 0:
            self.stalls_left -= 1
            return "stall"
        return None

    def record(self, handler: BaseHTTPRequestHandler, status: int) -> None:
        entry = (time.monotonic(), handler.command, handler.path, status)
        with self.lock:
            self.log.append((*entry, handler.headers.get("Range", "")))

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the fault proxy's server thread did not end"


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards one request to the target, or answers it with the fault that is due."""

    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect

    def __init__(self, *args, proxy: FaultProxy, **kwargs) -> None:  # noqa: ANN002,ANN003
        self.proxy = proxy
        super().__init__(*args, **kwargs)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Keep test output quiet: no line per request."""

    def do_GET(self) -> None:  # noqa: N802
        self._handle()

    def do_HEAD(self) -> None:  # noqa: N802
        self._handle()

    def do_PUT(self) -> None:  # noqa: N802
        self._handle()

    def do_POST(self) -> None:  # noqa: N802
        self._handle()

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle()

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        fault = self.proxy.fault_for(self.command, self.path)
        if fault == "503":
            self._slow_down()
            return
        status, headers, content = self._forward(body)
        self.proxy.record(self, status)
        self.send_response(status)
        for name, value in headers:
            # A HEAD answer's Content-Length is the object's size: kept as the target sent it.
            if name.lower() not in _HOP_HEADERS and (
                self.command == "HEAD" or name.lower() != "content-length"
            ):
                self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if self.command == "HEAD":
            return
        with suppress(BrokenPipeError, ConnectionResetError):
            if fault is None or status >= 300 or len(content) < 2:
                self.wfile.write(content)
                return
            self.wfile.write(content[: len(content) // 2])
            self.wfile.flush()
            if fault == "stall":
                self.proxy.release.wait(30)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # mid-body: the client sees it end

    def _forward(self, body: bytes | None) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self.proxy.target, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            connection.request(self.command, self.path, body=body, headers=headers)
            answer = connection.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            connection.close()

    def _slow_down(self) -> None:
        self.proxy.record(self, 503)
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(SLOW_DOWN)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(SLOW_DOWN)


@contextmanager
def fault_proxy(target: str) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of ``target`` for the block."""
    proxy = FaultProxy(target).start()
    try:
        yield proxy
    finally:
        proxy.stop()
