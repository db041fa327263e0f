"""A tar reader's cursor, checked against the archive it points into (once per load)."""

from __future__ import annotations

from typing import Any

from nodes.errors import InvalidStateError
from nodes.readers.format import past_end, source_size
from nodes.state_checks import at, check_int
from nodes.storage import SourceFile

_TAR_BLOCK = 512


def check_tar_cursor(source: SourceFile, cursor: Any, path: str) -> None:
    """Refuse a cursor that is not ``[offset of a valid member header, sample number]``."""
    if not isinstance(cursor, list) or len(cursor) != 2:
        raise InvalidStateError(path, "[header offset, sample number]", cursor)
    offset = check_int(cursor[0], at(path, 0))
    check_int(cursor[1], at(path, 1))
    if offset % _TAR_BLOCK:
        raise InvalidStateError(at(path, 0), "a multiple of 512 (a tar header offset)", offset)
    size = source_size(source)
    if size is not None and offset >= size:
        past_end(source, offset, size, at(path, 0))
    with source.open(offset) as f:
        header = f.read(_TAR_BLOCK)
    if not header and size is None:
        past_end(source, offset, size, at(path, 0))
    if header and header.strip(b"\0") and not _valid_tar_header(header):
        raise InvalidStateError(
            at(path, 0),
            f"the offset of a tar member header in {source.url}",
            offset,
            note="the block there is no header: the cursor was moved, or the file changed",
        )


def _valid_tar_header(block: bytes) -> bool:
    """Whether a 512-byte block is a tar header with a matching checksum."""
    if len(block) < _TAR_BLOCK:
        return False
    field = block[148:156].split(b"\0", 1)[0].strip()
    try:
        saved = int(field or b"0", 8)
    except ValueError:
        return False
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:_TAR_BLOCK])
    return saved == unsigned
