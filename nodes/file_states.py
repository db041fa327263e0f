"""Validation of the states of file nodes: the listing, the plan's units, and cursors in files.

A file reader's cursor is checked against the file it points into, which is
opened for that (once per load): a byte offset past the end names the URL,
the offset and the file's size; an offset that is not where a record starts
(a moved cursor) is refused rather than read as a spurious bad record.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nodes.errors import InvalidStateError, StateMismatchError
from nodes.files import FileSet, Unit
from nodes.readers.lines import LineFormat
from nodes.readers.npy import NpyFormat
from nodes.readers.raw import BytesFormat
from nodes.readers.reader import RecordFormat
from nodes.readers.tar import TarFormat
from nodes.state_checks import (
    at,
    check_int,
    expect_int,
    expect_ints,
    expect_keys,
    expect_list,
    is_int,
)
from nodes.storage import SourceFile

_TAR_BLOCK = 512
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which text readers skip


def check_listing(files: FileSet, state: dict[str, Any], path: str) -> None:
    """Refuse a state taken over another listing (its positions would point elsewhere)."""
    saved = state.get("listing")
    where = at(path, "listing")
    expect_keys(saved, where, {"files", "digest"})
    check_int(saved["files"], at(where, "files"))
    if not isinstance(saved["digest"], str):
        raise InvalidStateError(at(where, "digest"), "the listing's digest (a string)", saved)
    ours = files.listing_state()
    if saved != ours:
        raise StateMismatchError(
            f"{where}: the files changed since this state was taken: it was taken over "
            f"{saved['files']} files (digest {saved['digest']}), {files.patterns!r} now lists "
            f"{ours['files']} (digest {ours['digest']}). Resume needs the same files."
        )


def validate_file_list(files: FileSet, units: list[Unit], state: Any, path: str) -> None:
    """A :class:`nodes.FileListNode` state: a position within this consumer's ``units``."""
    expect_keys(state, path, {"position", "listing"})
    check_listing(files, state, path)
    expect_int(state, "position", path, 0, len(units))


class _CursorChecks(threading.local):
    on = True


#: Whether validate_reader opens the file to check a cursor (see :func:`cursors_checked_later`).
_cursor_checks = _CursorChecks()


@contextmanager
def cursors_checked_later() -> Iterator[None]:
    """Within this block, reader states are checked without opening their files.

    For converting a checkpoint for another topology: every old consumer's
    state is read there, but only the pieces a new consumer will read need
    their cursors checked, which its plan's check does (``validate_plan``).
    """
    _cursor_checks.on = False
    try:
        yield
    finally:
        _cursor_checks.on = True


def validate_reader(
    files: FileSet, fmt: RecordFormat, units: list[Unit], state: Any, path: str
) -> None:
    """A :class:`nodes.FileReaderNode` state: unit within the plan, cursor within the file."""
    keys = {"unit", "file", "part", "cursor", "index", "skipped", "listing"}
    expect_keys(state, path, keys, optional={"lost"})  # "lost": only after a lost file
    if "lost" in state:
        expect_ints(state, "lost", path)
        expect_list(state, "lost", path, 4)
    check_listing(files, state, path)
    unit = expect_int(state, "unit", path, 0, len(units))
    expect_int(state, "index", path)
    expect_int(state, "skipped", path)
    if unit == len(units):  # past this consumer's last unit: nothing left to point into
        past = "(the reader is past its units)"
        for key in ("file", "part", "cursor"):
            if state[key] is not None:
                raise InvalidStateError(at(path, key), f"null {past}", state[key])
        if state["index"] != 0:
            raise InvalidStateError(at(path, "index"), f"0 {past}", state["index"])
        return
    planned = units[unit]
    if state["file"] != planned.file or not is_int(state["file"]):
        raise InvalidStateError(
            at(path, "file"), f"{planned.file} (unit {unit}'s file in this plan)", state["file"]
        )
    part = expect_list(state, "part", path, 2)
    if part != [planned.part, planned.parts] or not all(is_int(p) for p in part):
        raise InvalidStateError(
            at(path, "part"), f"{[planned.part, planned.parts]} (unit {unit}'s part)", part
        )
    cursor = state["cursor"]
    if cursor is not None:
        source = files.source(planned.file)
        if _cursor_checks.on:
            check_cursor(fmt, source, cursor, planned.part, planned.parts, at(path, "cursor"))


def check_cursor(
    fmt: RecordFormat, source: SourceFile, cursor: Any, part: int, parts: int, path: str
) -> None:
    """Refuse a cursor that does not point where a block of ``source`` starts.

    A format this module does not know (a user's) keeps its cursors opaque.
    """
    if isinstance(fmt, LineFormat):
        _line_cursor(fmt, source, cursor, path)
    elif isinstance(fmt, TarFormat):
        _tar_cursor(source, cursor, path)
    elif isinstance(fmt, NpyFormat):
        check_int(cursor, path)  # the row: bounded by the file's rows when it is opened
    elif isinstance(fmt, BytesFormat):
        raise InvalidStateError(path, "null (a whole file is one block)", cursor)


def _size(source: SourceFile) -> int | None:
    """The file's size when its offsets are bytes of it (uncompressed), else ``None``."""
    if not source.seekable:
        return None
    try:
        return source.size()
    except OSError:
        return None  # unreachable now: the resume reports it as it reads


def _past_end(source: SourceFile, offset: int, size: int | None, path: str) -> None:
    raise InvalidStateError(
        path,
        f"a byte offset within {source.url}"
        + (f" (size {size} bytes)" if size is not None else ""),
        offset,
        note="the cursor points past the end of the file: the file changed, or the state is "
        "corrupt",
    )


def _line_cursor(fmt: LineFormat, source: SourceFile, cursor: Any, path: str) -> None:
    if not isinstance(cursor, list) or len(cursor) != 3:
        raise InvalidStateError(path, "[byte offset, line number or -1, block number]", cursor)
    offset = check_int(cursor[0], at(path, 0))
    line = check_int(cursor[1], at(path, 1), -1)
    if line == 0:
        raise InvalidStateError(at(path, 1), "a line number >= 1, or -1 (not counted)", line)
    check_int(cursor[2], at(path, 2))
    size = _size(source)
    if size is not None and offset > size:
        _past_end(source, offset, size, at(path, 0))
    data_start = fmt.prepare(source)[0] if offset else 0
    if offset < data_start:
        raise InvalidStateError(
            at(path, 0), f"an offset >= {data_start} (after the header of {source.url})", offset
        )
    if offset == data_start:
        return
    if offset == len(_BOM) and getattr(fmt, "strips_bom", False):
        with source.open(0) as f:
            if f.read(len(_BOM)) == _BOM:
                return  # the first record, after a byte order mark
    with source.open(offset - 1) as f:
        before = f.read(1)
    if not before:
        _past_end(source, offset, size, at(path, 0))
    if before != b"\n":
        raise InvalidStateError(
            at(path, 0),
            f"the byte offset of a record start in {source.url} (just after a line break)",
            offset,
            note=f"byte {offset - 1} is {before!r}: the cursor was moved, or the file changed",
        )


def _tar_cursor(source: SourceFile, cursor: Any, path: str) -> None:
    if not isinstance(cursor, list) or len(cursor) != 2:
        raise InvalidStateError(path, "[header offset, sample number]", cursor)
    offset = check_int(cursor[0], at(path, 0))
    check_int(cursor[1], at(path, 1))
    if offset % _TAR_BLOCK:
        raise InvalidStateError(at(path, 0), "a multiple of 512 (a tar header offset)", offset)
    size = _size(source)
    if size is not None and offset >= size:
        _past_end(source, offset, size, at(path, 0))
    with source.open(offset) as f:
        header = f.read(_TAR_BLOCK)
    if not header and size is None:
        _past_end(source, offset, size, at(path, 0))
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
