"""Whole files as bytes: one sample per file, named like a webdataset sample."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from nodes.errors import ErrorPolicy, InvalidStateError
from nodes.readers.format import Cursor, RecordFormat
from nodes.readers.tar.samples import split_name
from nodes.storage import SourceFile


class BytesFormat(RecordFormat):
    """``{"__url__": url, "__key__": name without extension, extension: bytes}`` per file.

    Named like a tar sample, so ``.decode()`` treats loose files and tar
    members alike: ``dp.files("imgs/*.png").read_bytes().decode()``. A file
    without an extension has its bytes under ``"bytes"``.
    """

    name = "read_bytes"
    splittable = False

    def check_cursor(self, source: SourceFile, cursor: Cursor, path: str) -> None:
        raise InvalidStateError(path, "null (a whole file is one block)", cursor)

    def blocks(
        self, source: SourceFile, part: int, parts: int, cursor: Cursor, errors: ErrorPolicy
    ) -> Iterator[tuple[list[Any], Cursor]]:
        with source.open(0) as f:
            data = f.read()
        base = source.name.rsplit("/", 1)[-1]
        key, field = split_name(base) or (base, "bytes")
        yield [{"__url__": source.url, "__key__": key, field: data}], None
