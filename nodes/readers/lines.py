"""Line-based text: the block reading that plain lines, JSON lines and CSV share.

A file (or a consumer's byte range of it) is read in blocks of about
``block_size`` bytes, each cut after its last complete record, so a block
is defined by its start offset alone. The cursor is
``[byte offset, line number or -1, block number]``; resume seeks to the
offset and re-reads one block.

Splitting a file among consumers: an uncompressed file is divided into
byte ranges, each aligned to the next record start, and a record belongs to
the range its first byte falls in. A compressed file cannot seek, so every
consumer decompresses it and keeps every ``parts``-th block.

The formats that decode lines further are :mod:`nodes.readers.jsonl` and
:mod:`nodes.readers.csv_format`.
"""

from __future__ import annotations

import codecs
import csv
import json
from collections.abc import Callable, Iterator
from typing import Any

from nodes.errors import MAX_RECORD_BYTES, BadRecordError, ErrorPolicy, InvalidStateError
from nodes.readers.format import Cursor, RecordFormat, past_end, source_size
from nodes.state_checks import at as item_path
from nodes.state_checks import check_int
from nodes.storage import SourceFile, read_full

_UNBOUNDED = float("inf")

#: The UTF-8 byte order mark some editors write at the start of a text file.
BOM = b"\xef\xbb\xbf"

#: What decoding a bad record raises; RecursionError: JSON nested deeper than Python's stack.
_BAD_TEXT = (ValueError, UnicodeDecodeError, csv.Error, RecursionError)


#: Bytes of text decoded per block. Measured: 32-64 KiB keeps a block in cache and
#: matches a plain `for line in f: json.loads(line)` loop; 1 MiB blocks were 40% slower.
RECORD_BLOCK_SIZE = 1 << 16


class LineFormat(RecordFormat):
    """One record per line of text (``str``, without the line ending)."""

    name = "read_lines"

    def __init__(
        self,
        encoding: str = "utf-8",
        block_size: int = RECORD_BLOCK_SIZE,
        max_record_bytes: int | None = MAX_RECORD_BYTES,
    ) -> None:
        if "\n".encode(encoding) != b"\n":
            raise ValueError(
                f"text readers split files at the byte 0x0A, which is not a line break in "
                f"{encoding!r}; use an ASCII-compatible encoding (utf-8, latin-1, cp1252, ...) "
                "or read whole files with read_bytes() and decode them in a map"
            )
        if block_size < 1:
            raise ValueError(f"block_size must be a positive number of bytes, got {block_size}")
        if max_record_bytes is not None and (
            type(max_record_bytes) is not int or max_record_bytes < 1
        ):
            raise ValueError(
                "max_record_bytes must be a positive number of bytes, or None for no limit, "
                f"got {max_record_bytes!r}"
            )
        self.max_record_bytes = max_record_bytes
        self.encoding = encoding
        self.block_size = block_size
        # A UTF-8 byte order mark at a file's start is dropped (only at byte 0 of the file).
        self.strips_bom = codecs.lookup(encoding).name in ("utf-8", "utf-8-sig")

    # ----- hooks for the formats built on lines ---------------------------------
    def prepare(self, source: SourceFile) -> tuple[int, int, Any]:
        """``(data offset, lines before it, per-file metadata)``; CSV reads its header here."""
        return 0, 0, None

    def block_end(self, buf: bytes) -> int:
        """Where the last complete record in ``buf`` ends (0: none ends in it)."""
        return buf.rfind(b"\n") + 1

    def record_end(self, buf: bytes, start: int) -> int:
        """The end of the record that holds byte ``start`` (0: it does not end in ``buf``)."""
        return buf.find(b"\n", start) + 1

    def decode_records(self, chunk: bytes, meta: Any) -> list[Any]:
        """All records of a chunk of complete records; raises if any is bad (fast path)."""
        return self.split_lines(chunk)

    def split_lines(self, chunk: bytes) -> list[str]:
        """The chunk's lines as text, without their ``\n`` or ``\r\n`` endings."""
        text = chunk.decode(self.encoding)
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        if "\r" in text:
            lines = [line.removesuffix("\r") for line in lines]
        return lines

    def decode_slowly(
        self, chunk: bytes, meta: Any
    ) -> Iterator[tuple[int, int, Callable[[], Any] | None]]:
        """Per record: (byte offset in chunk, line offset in chunk, a call that decodes it).

        ``None`` instead of the call marks a line to ignore (a blank JSON line).
        """
        position = 0
        for i, line in enumerate(chunk.split(b"\n")):
            if position == len(chunk):
                return
            decode = None if self.ignores(line) else (lambda line=line: self.decode_one(line, meta))
            yield position, i, decode
            position += len(line) + 1

    def ignores(self, line: bytes) -> bool:
        """Whether a line holds no record (only JSON lines ignore blank lines)."""
        return False

    def decode_one(self, line: bytes, meta: Any) -> Any:
        return line.decode(self.encoding).removesuffix("\r")

    # ----- blocks ------------------------------------------------------------
    def check_cursor(self, source: SourceFile, cursor: Cursor, path: str) -> None:
        """Refuse a cursor that is not ``[offset of a record start, line or -1, block]``."""
        if not isinstance(cursor, list) or len(cursor) != 3:
            raise InvalidStateError(path, "[byte offset, line number or -1, block number]", cursor)
        at_offset, at_line = item_path(path, 0), item_path(path, 1)
        offset = check_int(cursor[0], at_offset)
        line = check_int(cursor[1], at_line, -1)
        if line == 0:
            raise InvalidStateError(at_line, "a line number >= 1, or -1 (not counted)", line)
        check_int(cursor[2], item_path(path, 2))
        size = source_size(source)
        if size is not None and offset > size:
            past_end(source, offset, size, at_offset)
        data_start = self.prepare(source)[0] if offset else 0
        if offset < data_start:
            raise InvalidStateError(
                at_offset, f"an offset >= {data_start} (after the header of {source.url})", offset
            )
        if offset == data_start:
            return
        if offset == len(BOM) and self.strips_bom:
            with source.open(0) as f:
                if f.read(len(BOM)) == BOM:
                    return  # the first record, after a byte order mark
        with source.open(offset - 1) as f:
            before = f.read(1)
        if not before:
            past_end(source, offset, size, at_offset)
        if before != b"\n":
            raise InvalidStateError(
                at_offset,
                f"the byte offset of a record start in {source.url} (just after a line break)",
                offset,
                note=f"byte {offset - 1} is {before!r}: the cursor was moved, or the file changed",
            )

    def blocks(
        self, source: SourceFile, part: int, parts: int, cursor: Cursor, errors: ErrorPolicy
    ) -> Iterator[tuple[list[Any], Cursor]]:
        data_start, header_lines, meta = self.prepare(source)
        # Split by byte ranges where the file seeks and has a known size; else by blocks.
        size = source.size() if parts > 1 and source.seekable else None
        by_range = size is not None
        span = (size - data_start) if size is not None else 0
        end = data_start + (part + 1) * span // parts if by_range else _UNBOUNDED
        if cursor is not None:
            offset, line, block_no = cursor
        elif by_range and part > 0:
            start = data_start + part * span // parts
            # A range that starts at the first record needs no aligning (tiny files).
            offset = self._align(source, start) if start > data_start else data_start
            line, block_no = -1 if start > data_start else header_lines + 1, 0
        else:
            offset, line, block_no = data_start, header_lines + 1, 0
        if offset >= end:
            return
        interleaved = parts > 1 and not by_range
        with source.open(offset) as f:
            leftover = b""
            if offset == 0 and self.strips_bom:  # a UTF-8 byte order mark is no record
                leftover = read_full(f, len(BOM))
                if leftover == BOM:
                    leftover, offset = b"", len(BOM)
            while True:
                chunk, leftover, last, dropped = self._next_chunk(f, leftover, offset, end)
                if dropped:  # one record over max_record_bytes, read past and not kept
                    after = (
                        None
                        if last
                        else [offset + dropped, line + 1 if line > 0 else -1, block_no + 1]
                    )
                    if not interleaved or block_no % parts == part:
                        error = self._oversized(source.url, offset, line)
                        if not errors.skip:
                            yield [], [offset, line, block_no]
                            raise error
                        errors.handle(error)
                        yield [], after
                    if after is None:
                        return
                    offset, line, block_no = after
                    continue
                lines = chunk.count(b"\n") + (not chunk.endswith(b"\n"))
                after = (
                    None
                    if last
                    else [offset + len(chunk), line + lines if line > 0 else -1, block_no + 1]
                )
                if not interleaved or block_no % parts == part:
                    records, bad = self._decode(chunk, offset, line, meta, source.url, errors)
                    if bad is not None:
                        # Resuming from here meets the same error again.
                        yield records, [bad[1], bad[2], block_no]
                        raise bad[0]
                    yield records, after
                if after is None:
                    return
                offset, line, block_no = after

    def _align(self, source: SourceFile, start: int) -> int:
        """The first record start at or after ``start`` (just after a line break)."""
        with source.open(start - 1) as f:
            position = start - 1
            while True:
                data = f.read(1 << 16)
                if not data:
                    return position
                found = data.find(b"\n")
                if found >= 0:
                    return position + found + 1
                position += len(data)

    def _oversized(self, url: str, offset: int, line: int) -> BadRecordError:
        where = f"byte offset {offset}" if line <= 0 else f"line {line} (byte offset {offset})"
        return BadRecordError(
            url,
            where,
            f"a record longer than max_record_bytes={self.max_record_bytes:,} bytes (after "
            "decompression); raise the limit on the read step, or pass None for none",
        )

    def _next_chunk(
        self, f: Any, leftover: bytes, offset: int, end: float
    ) -> tuple[bytes, bytes, bool, int]:
        """The block at ``offset``: ``block_size`` bytes cut after the last whole record;
        ``(chunk, leftover, last, dropped)``, where ``dropped`` counts the bytes of a record
        over ``max_record_bytes`` read past instead (the chunk is then empty)."""
        need = self.block_size - len(leftover)  # the BOM check may have read past a tiny block
        data = leftover + read_full(f, need) if need > 0 else leftover
        at_eof = len(data) < self.block_size
        cut = len(data) if at_eof else self.block_end(data)
        if cut == 0 and not at_eof:
            data, cut, at_eof, dropped = self._read_long_record(f, data)
            if dropped:
                return b"", data, (at_eof and not data) or offset + dropped >= end, dropped
        chunk, leftover = data[:cut], data[cut:]
        if offset + len(chunk) >= end:  # keep only the records that start before `end`
            stop = self.record_end(chunk, max(0, int(end - offset) - 1))
            return (chunk[:stop] if stop else chunk), b"", True, 0
        return chunk, leftover, at_eof and not leftover, 0

    def _read_long_record(self, f: Any, data: bytes) -> tuple[bytes, int, bool, int]:
        """``(data, cut, at_eof, 0)`` once a record longer than ``data`` ends (or the file
        does); past ``max_record_bytes``, ``(rest, 0, at_eof, dropped)``: the record's
        ``dropped`` bytes read to its line break and let go, ``rest`` what follows it.

        Only the bytes just read are searched for a line break (every record
        ends at one), and the pieces are joined once: a line of n bytes costs
        O(n), where joining and searching the whole buffer per read cost O(n^2).
        """
        pieces, held, limit = [data], len(data), self.max_record_bytes
        while True:
            more = read_full(f, self.block_size)
            pieces.append(more)
            held += len(more)
            at_eof = len(more) < self.block_size
            if limit is not None and held > limit and b"\n" not in more and not at_eof:
                return self._read_past_record(f, held)
            if at_eof or b"\n" in more:
                data = b"".join(pieces)
                cut = len(data) if at_eof else self.block_end(data)
                if cut or at_eof:
                    return data, cut, at_eof, 0
                pieces = [data]  # a quoted CSV line break: the record goes on

    def _read_past_record(self, f: Any, held: int) -> tuple[bytes, int, bool, int]:
        """Read on to the end of an oversized record, keeping one block at a time."""
        dropped = held
        while True:
            more = read_full(f, self.block_size)
            at_eof = len(more) < self.block_size
            found = more.find(b"\n")
            if found >= 0:
                return more[found + 1 :], 0, at_eof, dropped + found + 1
            dropped += len(more)
            if at_eof:
                return b"", 0, True, dropped

    def _decode(
        self, chunk: bytes, offset: int, line: int, meta: Any, url: str, errors: ErrorPolicy
    ) -> tuple[list[Any], tuple[BadRecordError, int, int] | None]:
        """The chunk's records; a bad one is skipped, or returned (with its place) to raise."""
        try:
            return self.decode_records(chunk, meta), None
        except _BAD_TEXT:
            pass
        records: list[Any] = []
        for at, line_offset, decode in self.decode_slowly(chunk, meta):
            if decode is None:
                continue
            try:
                records.append(decode())
            except _BAD_TEXT as cause:
                where = f"byte offset {offset + at}"
                if line > 0:
                    where = f"line {line + line_offset} ({where})"
                error = BadRecordError(url, where, _explain(cause))
                if not errors.skip:
                    return records, (error, offset + at, line + line_offset if line > 0 else -1)
                errors.handle(error)
        return records, None


def _explain(cause: Exception) -> str:
    """The reason a record failed; JSON errors give the column within the line."""
    if isinstance(cause, json.JSONDecodeError):
        return f"invalid JSON: {cause.msg} (column {cause.colno})"
    return f"{type(cause).__name__}: {cause}"
