"""A real HTTP file server on 127.0.0.1 for tests: directory listings, Range requests, faults.

``serve(root, ranges=False)`` answers every GET with the whole file, as
``python -m http.server`` does, for the readers' fallback to streaming.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class FileServer:
    """Serves ``root`` over HTTP. ``fail_next(n)`` makes the next ``n`` GETs answer 503.

    With ``ranges=False`` the ``Range`` header is ignored (the whole file, status 200);
    ``announce_no_ranges=True`` also says ``Accept-Ranges: none``. ``range_requests``
    counts the GETs that asked for a range. ``cut_next(n, after)`` makes the next ``n``
    whole-file answers hang up after ``after`` bytes of the body.
    """

    def __init__(
        self,
        root: Path,
        *,
        ranges: bool = True,
        announce_no_ranges: bool = False,
        handler: type[_Handler] | None = None,
    ) -> None:
        self.root = root
        self.ranges = ranges and not announce_no_ranges
        self.announce_no_ranges = announce_no_ranges
        self.requests = 0
        self.range_requests = 0
        self.cuts_left = 0
        self.cut_after = 0
        self.failures_left = 0
        self.fail_status = 503
        self._lock = threading.Lock()
        answer = partial(handler or _Handler, directory=str(root), server_state=self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), answer)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def fail_next(self, count: int, status: int = 503) -> None:
        with self._lock:
            self.failures_left, self.fail_status = count, status

    def cut_next(self, count: int, after: int) -> None:
        with self._lock:
            self.cuts_left, self.cut_after = count, after

    def take_cut(self) -> int | None:
        """How many body bytes to send before hanging up, or None to send them all."""
        with self._lock:
            if self.cuts_left > 0:
                self.cuts_left -= 1
                return self.cut_after
            return None

    def take_failure(self, *, asks_range: bool = False) -> int | None:
        with self._lock:
            self.requests += 1
            self.range_requests += asks_range
            if self.failures_left > 0:
                self.failures_left -= 1
                return self.fail_status
            return None

    def start(self) -> FileServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread.is_alive():  # started (serve_forever returns once shut down)
            self._thread.join(timeout=10)
            assert not self._thread.is_alive(), "the file server's thread did not end"


class _Handler(SimpleHTTPRequestHandler):
    """The standard library's file handler plus single-range ``Range`` support."""

    def __init__(self, *args, server_state: FileServer, **kwargs) -> None:  # noqa: ANN002,ANN003
        self.server_state = server_state
        super().__init__(*args, **kwargs)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Keep test output quiet: no line per request."""

    def do_GET(self) -> None:  # noqa: N802
        status = self.server_state.take_failure(asks_range="Range" in self.headers)
        if status is not None:
            self.send_error(status, "injected failure")
            return
        path = self.translate_path(self.path)
        match = _RANGE.fullmatch(self.headers.get("Range", ""))
        if match is None or not os.path.isfile(path) or not self.server_state.ranges:
            super().do_GET()
            return
        size = os.path.getsize(path)
        start = int(match.group(1))
        end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
        if start >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.end_headers()
            return
        body = self.start_partial_content(path, start, end, str(size))
        self.wfile.write(body)

    def start_partial_content(self, path: str, start: int, end: int, total: str) -> bytes:
        """Send the 206 headers of bytes ``start..end`` of ``path`` (of ``total``, or ``*``)
        and return those bytes, for the caller to send as it likes (whole, cut, stalled)."""
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{total}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return body

    def end_headers(self) -> None:
        if self.server_state.announce_no_ranges:
            self.send_header("Accept-Ranges", "none")
        super().end_headers()

    def copyfile(self, source, outputfile) -> None:  # noqa: ANN001
        """A client that read what it needed and hung up is not an error (no traceback)."""
        cut = self.server_state.take_cut()
        with suppress(BrokenPipeError, ConnectionResetError):
            if cut is None:
                super().copyfile(source, outputfile)
                return
            outputfile.write(source.read(cut))
            outputfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # mid-body: the client sees a reset

    def do_HEAD(self) -> None:  # noqa: N802
        status = self.server_state.take_failure()
        if status is not None:
            self.send_error(status, "injected failure")
            return
        super().do_HEAD()


@contextmanager
def serve(
    root: Path,
    *,
    ranges: bool = True,
    announce_no_ranges: bool = False,
    handler: type[_Handler] | None = None,
) -> Iterator[FileServer]:
    """Serve ``root`` for the duration of the block (``ranges=False``: no Range support).

    ``handler``: a subclass of the server's request handler, to change how it answers.
    """
    server = FileServer(
        root, ranges=ranges, announce_no_ranges=announce_no_ranges, handler=handler
    ).start()
    try:
        yield server
    finally:
        server.stop()
