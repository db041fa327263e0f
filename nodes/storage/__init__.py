"""Files through fsspec: deterministic listings, retried reads, transparent decompression.

Each module has one job:

- :mod:`~nodes.storage.listing`: URL patterns (lists, globs, brace ranges) to a sorted
  listing, ``listing_digest``, ``url_path``, ``as_patterns``;
- :mod:`~nodes.storage.retry`: which errors are transient, ``RetryPolicy`` (the read
  timeout, the back-off with jitter, the count and time caps), ``with_retries``,
  ``ReadFailedError``;
- :mod:`~nodes.storage.watchdog`: which filesystems can stall (all but local and memory)
  and ``Watchdog``, the deadline a read of those runs under;
- :mod:`~nodes.storage.streams`: the read-only stream bases, ``RetryingFile`` (reopens and
  retries), ``ForwardOnlyFile`` (a stream made seekable by reading), ``read_full``,
  ``skip_forward``;
- :mod:`~nodes.storage.compression`: ``Decompressed`` and ``ZstdReader`` (decoder errors
  name the file); :mod:`~nodes.storage.zstd_blocks`: where zstd blocks end, so a bomb
  decodes a few blocks at a time;
- :mod:`~nodes.storage.source`: ``SourceFile``, one URL opened with all of the above;
- :mod:`~nodes.storage.fsspec_http`: every quirk of fsspec's HTTP filesystem (servers that
  ignore Range, answers without a size, its error classes and messages, aiohttp's
  read timeout); no other module looks at fsspec class names or error text;
- :mod:`~nodes.storage.fsspec_s3`: how s3fs and botocore report failures (the HTTP status
  behind an s3fs ``OSError``, botocore's network errors), for ``is_transient``.

May import: nodes.errors, nodes.credentials.
"""

from nodes.storage.compression import Decompressed, ZstdReader, decompressing
from nodes.storage.fsspec_http import ignores_range_requests, is_stream
from nodes.storage.listing import (
    as_patterns,
    expand_braces,
    list_files,
    listing_digest,
    url_path,
)
from nodes.storage.retry import ReadFailedError, RetryPolicy, as_policy, is_transient, with_retries
from nodes.storage.source import SourceFile
from nodes.storage.streams import ForwardOnlyFile, RetryingFile, read_full, skip_forward
from nodes.storage.watchdog import Watchdog, can_stall

__all__ = [
    "Decompressed",
    "ForwardOnlyFile",
    "ReadFailedError",
    "RetryPolicy",
    "RetryingFile",
    "SourceFile",
    "Watchdog",
    "ZstdReader",
    "as_patterns",
    "as_policy",
    "can_stall",
    "decompressing",
    "expand_braces",
    "ignores_range_requests",
    "is_stream",
    "is_transient",
    "list_files",
    "listing_digest",
    "read_full",
    "skip_forward",
    "url_path",
    "with_retries",
]
