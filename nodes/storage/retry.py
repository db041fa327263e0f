"""The retry policy: which errors are transient, bounded retries with back-off, and the
error raised when a read fails for good."""

from __future__ import annotations

import errno
import io
import time
from collections.abc import Callable
from typing import Any

from nodes.storage import fsspec_http

# OS error numbers that may clear up (network trouble); any other errno is final.
_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EAGAIN",
        "EINTR",
        "EIO",
        "ETIMEDOUT",
        "ECONNRESET",
        "ECONNREFUSED",
        "ECONNABORTED",
        "EPIPE",
        "ENETDOWN",
        "ENETUNREACH",
        "EHOSTUNREACH",
        "EHOSTDOWN",
        "ESTALE",
    )
    if hasattr(errno, name)
)

# Errors that say "this will not get better by trying again".
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(error: BaseException) -> bool:
    """Whether a read error may go away on retry (network trouble, 5xx, timeouts).

    A ``FileNotFoundError`` that wraps an HTTP error (see
    :func:`nodes.storage.fsspec_http.wrapped_error`) is judged by that error.
    """
    cause = fsspec_http.wrapped_error(error)
    if cause is not None:
        return is_transient(cause)
    if isinstance(error, (*_PERMANENT, io.UnsupportedOperation)):
        return False
    status = fsspec_http.http_status(error)
    if status is not None:
        return status >= 500 or status in (408, 429)
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno in _TRANSIENT_ERRNOS
    if isinstance(error, OSError | TimeoutError | ConnectionError):
        return True
    return fsspec_http.is_http_client_error(error)


class ReadFailedError(OSError):
    """Reading a file failed for good: not found, refused, or still failing after retries."""


def with_retries(
    action: Callable[[], Any],
    retries: int,
    *,
    url: str,
    doing: Callable[[], str],
    between: Callable[[], None] | None = None,
    backoff: float = 0.05,
) -> Any:
    """``action()`` on ``url``, retried up to ``retries`` times on transient errors.

    ``doing()`` names the operation in the error raised when it still fails
    (``"read at byte offset 10"``); ``between()`` runs before each retry (to
    reopen a file). A missing file is a ``FileNotFoundError``, never retried.
    The back-off before retry ``k`` (from 0) is ``backoff * 2**k`` seconds.
    """
    for attempt in range(retries + 1):
        try:
            return action()
        except Exception as error:  # noqa: BLE001 - classified below
            transient = is_transient(error)
            if isinstance(error, FileNotFoundError) and not transient:
                status = fsspec_http.refused_status(error)
                if status is not None:
                    raise PermissionError(f"{url}: access denied (HTTP {status})") from error
                raise FileNotFoundError(f"{url}: no such file") from error
            if not transient or attempt == retries:
                cause = fsspec_http.wrapped_error(error)
                shown = error if cause is None else cause
                raise ReadFailedError(
                    f"{url}: {doing()} failed after {attempt + 1} attempt(s): "
                    f"{type(shown).__name__}: {shown}"
                ) from error
            time.sleep(backoff * 2**attempt)
            if between is not None:
                between()
    raise AssertionError("unreachable")
