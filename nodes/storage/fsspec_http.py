"""The one place that knows fsspec's HTTP filesystem: its quirks, classes and error messages.

fsspec's HTTP files (over aiohttp) report some conditions only through a class
name, an error message or a wrapped exception; everything else in
``nodes.storage`` asks the functions here instead of looking at them itself.
"""

from __future__ import annotations

from typing import Any

import fsspec.utils

# The HTTP client libraries whose own exceptions are network trouble, whatever their class.
_HTTP_LIBRARIES = ("aiohttp", "requests", "urllib3")


def ignores_range_requests(error: BaseException | None) -> bool:
    """Whether fsspec's HTTP file failed because the server answers Range requests in full.

    fsspec raises a plain ``ValueError`` for it (``python -m http.server`` is such a
    server), so its message is what tells it apart.
    """
    return isinstance(error, ValueError) and "support range requests" in str(error)


def is_stream(file: Any) -> bool:
    """Whether an fsspec file reads only forward (an HTTP server without ranges or size)."""
    return type(file).__name__ == "HTTPStreamFile"


def open_stream(fs: Any, path: str) -> Any:
    """``path`` opened to be read once from its start, without Range requests.

    ``block_size=0`` is how fsspec's HTTP filesystem is asked for a stream
    (an ``HTTPStreamFile``) instead of a file that fetches blocks by range.
    """
    return fs.open(path, "rb", block_size=0)


def with_read_timeout(url: str, options: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """``options`` for ``url`` with aiohttp timeouts of ``timeout`` s, unless the user set some.

    aiohttp's own default waits 300 s for a byte, and fsspec retries nothing, so a
    server that stalls mid-body would hold a read for 5 minutes per attempt. The
    timeouts are per socket read and per connection (``total`` stays unlimited: a slow
    but moving download is fine). A ``client_kwargs={"timeout": ...}`` of the user wins.
    """
    if timeout is None or fsspec.utils.get_protocol(url) not in ("http", "https"):
        return options
    client_kwargs = dict(options.get("client_kwargs") or {})
    if "timeout" in client_kwargs:
        return options
    import aiohttp  # optional (the "http" extra), and slow to import: only for HTTP URLs

    client_kwargs["timeout"] = aiohttp.ClientTimeout(
        total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
    )
    return {**options, "client_kwargs": client_kwargs}


def wrapped_error(error: BaseException) -> BaseException | None:
    """The HTTP error behind a ``FileNotFoundError`` that wraps one, else ``None``.

    fsspec's HTTP filesystem reports any failed metadata request as
    ``FileNotFoundError`` raised from the client's error; that error says what
    happened (a 404, a 503, a reset connection).
    """
    if isinstance(error, FileNotFoundError) and error.__cause__ is not None:
        return error.__cause__
    return None


def http_status(error: BaseException) -> int | None:
    """The HTTP status an HTTP client error carries (aiohttp's ``status``), if any."""
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


def refused_status(error: BaseException) -> int | None:
    """401 or 403 when ``error`` is fsspec's ``FileNotFoundError`` for a refused request.

    fsspec's HTTP filesystem reports a refused request as a missing file;
    ``None`` for anything else.
    """
    status = getattr(error.__cause__, "status", None)
    return status if status in (401, 403) else None


def is_http_client_error(error: BaseException) -> bool:
    """Whether ``error`` comes from an HTTP client library (a network failure of its own)."""
    return type(error).__module__.split(".")[0] in _HTTP_LIBRARIES
