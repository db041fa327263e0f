"""Files through fsspec: deterministic listings, retried reads, transparent decompression.

Each module has one job:

- :mod:`~nodes.storage.listing`: URL patterns (lists, globs, brace ranges) to a sorted
  listing, ``listing_digest``, ``url_path``, ``as_patterns``;
- :mod:`~nodes.storage.retry`: which errors are transient, ``with_retries`` and its
  back-off, ``ReadFailedError``;
- :mod:`~nodes.storage.streams`: the read-only stream bases, ``RetryingFile`` (reopens and
  retries), ``ForwardOnlyFile`` (a stream made seekable by reading), ``read_full``,
  ``skip_forward``;
- :mod:`~nodes.storage.compression`: ``Decompressed`` and ``ZstdReader`` (decoder errors
  name the file);
- :mod:`~nodes.storage.source`: ``SourceFile``, one URL opened with all of the above;
- :mod:`~nodes.storage.fsspec_http`: every quirk of fsspec's HTTP filesystem (servers that
  ignore Range, answers without a size, its error classes and messages); no other module
  looks at fsspec class names or error text.
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
from nodes.storage.retry import ReadFailedError, is_transient, with_retries
from nodes.storage.source import SourceFile
from nodes.storage.streams import ForwardOnlyFile, RetryingFile, read_full, skip_forward

__all__ = [
    "Decompressed",
    "ForwardOnlyFile",
    "ReadFailedError",
    "RetryingFile",
    "SourceFile",
    "ZstdReader",
    "as_patterns",
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
