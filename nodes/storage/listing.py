"""Listings: URL patterns (lists, globs, brace ranges) to one sorted list of URLs, the same
in every process, and the digest that notices when a listing changed."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from typing import Any

import fsspec

from nodes.credentials import remember, shown_url
from nodes.storage import fsspec_http
from nodes.storage.retry import RetryPolicy, as_policy, with_retries
from nodes.storage.watchdog import watchdog_for

_BRACE = re.compile(r"\{([^{}]*)\}")
_NUMERIC_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_GLOB_CHARS = re.compile(r"[*?\[]")


def url_path(url: str) -> str:
    """The URL without an HTTP query string (``?X-Amz-Signature=...`` is not a glob)."""
    if url.startswith(("http://", "https://")):
        return url.split("?", 1)[0]
    return url


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{a,b}`` lists and ``{000..127}`` ranges (zero padding kept), left to right.

    >>> expand_braces("shard-{0..2}.tar")
    ['shard-0.tar', 'shard-1.tar', 'shard-2.tar']
    >>> expand_braces("{train,val}-{00..01}.jsonl")
    ['train-00.jsonl', 'train-01.jsonl', 'val-00.jsonl', 'val-01.jsonl']
    """
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    numeric = _NUMERIC_RANGE.match(body)
    if numeric:
        lo, hi = int(numeric.group(1)), int(numeric.group(2))
        width = len(numeric.group(1)) if numeric.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        choices = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    else:
        choices = body.split(",")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [head + choice + rest for choice in choices for rest in expand_braces(tail)]


def as_patterns(urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The URL patterns as a list of strings (paths are accepted too)."""
    patterns = [urls] if isinstance(urls, str | os.PathLike) else list(urls)
    if not patterns:
        raise ValueError("dp.files() got an empty list of URLs")
    for pattern in patterns:
        if not isinstance(pattern, str | os.PathLike):
            raise TypeError(f"dp.files() takes URL strings or paths, got {pattern!r}")
    return [os.fspath(pattern) for pattern in patterns]


def list_files(
    urls: str | Sequence[str],
    storage_options: dict[str, Any],
    retries: int | RetryPolicy | None = 3,
) -> list[str]:
    """The sorted, de-duplicated URLs that ``urls`` names (lists, globs, brace ranges).

    The result is the same in every process that sees the same storage, which
    is what lets every consumer deal the same list. Patterns that match
    nothing are an error naming the pattern. A listing is retried and timed
    out as reads are (``retries``: a :class:`~nodes.storage.retry.RetryPolicy` or a count).
    """
    for pattern in [urls] if isinstance(urls, str) else urls:
        remember(pattern)
    policy = as_policy(retries)
    found: set[str] = set()
    for pattern in as_patterns(urls):
        for url in expand_braces(pattern):
            if not _GLOB_CHARS.search(url_path(url)):
                found.add(url)
                continue
            options = fsspec_http.with_read_timeout(url, storage_options, policy.timeout)
            fs, path = fsspec.core.url_to_fs(url, **options)
            with watchdog_for(fs, policy.timeout) as watchdog:
                listing = with_retries(
                    lambda fs=fs, path=path: fs.glob(path, detail=True),
                    policy,
                    url=url,
                    doing=lambda: "listing",
                    watchdog=watchdog,
                )
            matches = [p for p, info in listing.items() if _is_file(info)]
            if not matches:
                raise FileNotFoundError(f"dp.files(): {url!r} matched no files")
            found.update(_as_url(fs, url, match) for match in matches)
    return sorted(found)


def _is_file(info: dict[str, Any]) -> bool:
    return info.get("type", "file") != "directory"


def _as_url(fs: Any, pattern: str, path: str) -> str:
    """A glob match written the way the user wrote the pattern (local paths stay paths)."""
    if "://" not in pattern and not pattern.startswith("file:"):
        # A local pattern: keep relative paths relative, so listings match across machines.
        return path if os.path.isabs(pattern) else os.path.relpath(path)
    return fs.unstrip_protocol(path)


def listing_digest(urls: Sequence[str]) -> str:
    """A short digest of a listing, kept in states to notice that the files changed."""
    # Query strings (signatures of pre-signed URLs) change when URLs are re-signed, and a
    # password when it is rotated: neither makes it another file.
    shown = (shown_url(url_path(url)) for url in urls)
    return hashlib.sha256("\n".join(shown).encode()).hexdigest()[:16]
