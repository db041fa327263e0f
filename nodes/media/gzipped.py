"""A gzip-compressed sample field (``json.gz``), expanded at most to ``MAX_RECORD_BYTES``."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from nodes import errors


class Gunzipped:
    """Decodes a gzip-compressed field with the decoder of the field it compresses."""

    def __init__(self, inner: Callable[[bytes], Any] | None) -> None:
        self.inner = inner

    def __call__(self, data: bytes) -> Any:
        data = gunzip_at_most(data, errors.MAX_RECORD_BYTES)
        return data if self.inner is None else self.inner(data)


def gunzip_at_most(data: bytes, limit: int) -> bytes:
    """``gzip.decompress(data)``, refusing (``ValueError``) to make more than ``limit``
    bytes: the output never grows past it, so a field that is a bomb costs ``limit`` at most.

    >>> import gzip
    >>> gunzip_at_most(gzip.compress(b"ab" * 3), 10)
    b'ababab'
    """
    parts, made, rest = [], 0, data
    while rest:  # one gzip member after another, as gzip.decompress reads them
        member = zlib.decompressobj(wbits=31)
        parts.append(member.decompress(rest, limit - made + 1))
        made += len(parts[-1])
        if made > limit or member.unconsumed_tail:
            raise ValueError(
                f"it expands past {limit:,} bytes (nodes.errors.MAX_RECORD_BYTES) from "
                f"{len(data):,} compressed"
            )
        if not member.eof:
            raise EOFError("the gzip data ends inside a member (truncated)")
        rest = member.unused_data
    return b"".join(parts)
