"""The retry policy: which errors are transient, how long a read may make no progress, how
long and how often a failing read is retried, and the error raised when it fails for good."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import io
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from nodes.storage import fsspec_http, fsspec_s3

if TYPE_CHECKING:
    from nodes.storage.watchdog import Watchdog

#: Seconds a read (or an open) may go without receiving a byte before it counts as failed.
DEFAULT_TIMEOUT = 60.0
#: Seconds after the first failure of a read during which it is retried.
DEFAULT_RETRY_SECONDS = 60.0
#: The first back-off; each next one doubles, up to ``MAX_WAIT``.
FIRST_WAIT = 0.1
MAX_WAIT = 5.0

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


#: A timeout, whoever raised it: on Python 3.10 asyncio's (fsspec's ``FSTimeoutError``, an
#: aiohttp read timeout) and concurrent.futures' are not the builtin ``TimeoutError``.
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)


def is_transient(error: BaseException) -> bool:
    """Whether a read error may go away on retry (network trouble, 5xx, timeouts).

    A ``FileNotFoundError`` that wraps an HTTP error (see
    :func:`nodes.storage.fsspec_http.wrapped_error`) is judged by that error; an s3fs
    error by the status of the S3 answer behind it (see :mod:`nodes.storage.fsspec_s3`).
    """
    cause = fsspec_http.wrapped_error(error)
    if cause is not None:
        return is_transient(cause)
    if isinstance(error, (*_PERMANENT, io.UnsupportedOperation)):
        return False
    status = fsspec_http.http_status(error)
    if status is None:  # s3fs: an OSError (EBUSY for a 503 SlowDown) from botocore's answer
        status = fsspec_s3.http_status(error)
    if status is not None:
        return status >= 500 or status in (408, 429)
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno in _TRANSIENT_ERRNOS
    if isinstance(error, (OSError, ConnectionError, *_TIMEOUTS)):
        return True
    return fsspec_http.is_http_client_error(error) or fsspec_s3.is_network_error(error)


class ReadFailedError(OSError):
    """Reading a file failed for good: not found, refused, or still failing after retries."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long a read may stall, and how long and how often a failing one is retried.

    A read or open that receives nothing for ``timeout`` seconds fails with a
    ``TimeoutError`` (``None``: no timeout of ours). A read that fails with a
    transient error is retried after a back-off that doubles from
    ``first_wait`` up to ``max_wait`` seconds, each wait scaled by a jitter in
    [0.5, 1) drawn from an RNG seeded with the URL and the operation (so the
    schedule is deterministic, and consumers reading different offsets do not
    retry in step). Retrying stops at whichever comes first: ``retries``
    retries (``None``: no count cap) or ``retry_seconds`` seconds since the
    read first failed (the last wait is shortened to end there, and one last
    attempt is made). So a read gives up at most about
    ``timeout + retry_seconds + timeout`` seconds after it started.
    ``clock`` and ``sleep`` are there for tests.
    """

    retries: int | None = None
    retry_seconds: float = DEFAULT_RETRY_SECONDS
    timeout: float | None = DEFAULT_TIMEOUT
    first_wait: float = FIRST_WAIT
    max_wait: float = MAX_WAIT
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.retries is not None and (
            not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0
        ):
            raise ValueError(f"retries must be None or an int >= 0, got {self.retries!r}")
        for name in ("retry_seconds", "first_wait", "max_wait"):
            value = getattr(self, name)
            if not _is_number(value) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        if self.timeout is not None and (
            not _is_number(self.timeout) or not 0 < self.timeout < math.inf
        ):
            raise ValueError(
                f"timeout must be None or a finite number of seconds > 0, got {self.timeout!r}"
            )

    def waits(self, key: str) -> Iterator[float]:
        """The back-offs before retry 1, 2, ... of the operation ``key`` (deterministic)."""
        rng = random.Random(key)  # a seeded RNG of its own: the global one is the user's
        for k in range(1 << 62):
            cap = min(self.max_wait, self.first_wait * 2.0 ** min(k, 64))
            yield cap * (0.5 + 0.5 * rng.random())

    def budget(self) -> str:
        """The limits, as the user sets them on ``dp.files``."""
        timeout = "None" if self.timeout is None else f"{self.timeout:g} s"
        return f"timeout={timeout}, retries={self.retries}, retry_seconds={self.retry_seconds:g}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def as_policy(retries: int | RetryPolicy | None) -> RetryPolicy:
    """A policy from a count of retries (the other limits at their defaults) or a policy."""
    return retries if isinstance(retries, RetryPolicy) else RetryPolicy(retries=retries)


def with_retries(
    action: Callable[[], Any],
    retries: int | RetryPolicy | None,
    *,
    url: str,
    doing: Callable[[], str],
    between: Callable[[], None] | None = None,
    backoff: float | None = None,
    watchdog: Watchdog | None = None,
) -> Any:
    """``action()`` on ``url``, retried on transient errors within a :class:`RetryPolicy`.

    ``retries`` is the policy, or a count of retries (other limits at their
    defaults). ``doing()`` names the operation in the error raised when it
    still fails (``"read at byte offset 10"``); ``between()`` runs before each
    retry (to drop a broken file). A missing file is a ``FileNotFoundError``,
    never retried. ``backoff`` replaces the policy's first wait; ``watchdog``
    runs each attempt under the policy's timeout.
    """
    policy = as_policy(retries)
    if backoff is not None:
        policy = replace(policy, first_wait=backoff)
    started = policy.clock()
    attempt, first_failure, waits = 0, started, iter(())
    while True:
        attempt += 1
        try:
            return action() if watchdog is None else watchdog.call(action)
        except Exception as error:  # noqa: BLE001 - classified below
            transient = is_transient(error)
            if isinstance(error, FileNotFoundError) and not transient:
                status = fsspec_http.refused_status(error)
                if status is not None:
                    raise PermissionError(f"{url}: access denied (HTTP {status})") from error
                raise FileNotFoundError(f"{url}: no such file") from error
            now = policy.clock()
            if attempt == 1:
                first_failure, waits = now, policy.waits(f"{url} {doing()}")
            left = policy.retry_seconds - (now - first_failure)
            spent = policy.retries is not None and attempt > policy.retries
            if not transient or spent or left <= 0:
                failed = _failed(url, doing(), attempt, now - started, error, policy, transient)
                raise failed from error
            policy.sleep(min(next(waits), left))
            if between is not None:
                between()


def _failed(
    url: str,
    doing: str,
    attempts: int,
    elapsed: float,
    error: BaseException,
    policy: RetryPolicy,
    transient: bool,
) -> ReadFailedError:
    cause = fsspec_http.wrapped_error(error)
    shown = error if cause is None else cause
    # rstrip: S3's messages end with a full stop ("Please reduce your request rate.").
    message = (
        f"{url}: {doing} failed after {attempts} attempt(s) in {elapsed:.1f} s: "
        f"{type(shown).__name__}: {str(shown).rstrip('.')}"
    )
    if transient:
        message += (
            f". The retry budget is spent ({policy.budget()}); if the storage needs longer to "
            f"recover, raise retry_seconds= (or timeout=) of dp.files()"
        )
    return ReadFailedError(message)
