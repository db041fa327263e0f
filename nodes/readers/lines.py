"""Line-based text formats: plain lines, JSON lines and CSV.

A file (or a consumer's byte range of it) is read in blocks of about
``block_size`` bytes, each cut after its last complete record, so a block
is defined by its start offset alone. The cursor is
``[byte offset, line number or -1, block number]``; resume seeks to the
offset and re-reads one block.

Splitting a file among consumers: an uncompressed file is divided into
byte ranges, each aligned to the next record start, and a record belongs to
the range its first byte falls in. A compressed file cannot seek, so every
consumer decompresses it and keeps every ``parts``-th block.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from bisect import bisect_right
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from nodes.errors import BadRecordError, ErrorPolicy
from nodes.readers.reader import Cursor, RecordFormat
from nodes.storage import SourceFile, read_full

try:  # optional (pip install datapipes-torch[json]): JSON lines decode about 2x faster
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - the stdlib decodes the same records
    _orjson_loads = None

_UNBOUNDED = float("inf")

#: The UTF-8 byte order mark some editors write at the start of a text file.
_BOM = b"\xef\xbb\xbf"

#: What decoding a bad record raises; RecursionError: JSON nested deeper than Python's stack.
_BAD_TEXT = (ValueError, UnicodeDecodeError, csv.Error, RecursionError)

_first, _second = itemgetter(0), itemgetter(1)

#: Bytes of text decoded per block. Measured: 32-64 KiB keeps a block in cache and
#: matches a plain `for line in f: json.loads(line)` loop; 1 MiB blocks were 40% slower.
RECORD_BLOCK_SIZE = 1 << 16


class LineFormat(RecordFormat):
    """One record per line of text (``str``, without the line ending)."""

    name = "read_lines"

    def __init__(self, encoding: str = "utf-8", block_size: int = RECORD_BLOCK_SIZE) -> None:
        if "\n".encode(encoding) != b"\n":
            raise ValueError(
                f"text readers split files at the byte 0x0A, which is not a line break in "
                f"{encoding!r}; use an ASCII-compatible encoding (utf-8, latin-1, cp1252, ...) "
                "or read whole files with read_bytes() and decode them in a map"
            )
        if block_size < 1:
            raise ValueError(f"block_size must be a positive number of bytes, got {block_size}")
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
                leftover = read_full(f, len(_BOM))
                if leftover == _BOM:
                    leftover, offset = b"", len(_BOM)
            while True:
                chunk, leftover, last = self._next_chunk(f, leftover, offset, end)
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

    def _next_chunk(
        self, f: Any, leftover: bytes, offset: int, end: float
    ) -> tuple[bytes, bytes, bool]:
        """The block at ``offset``: ``block_size`` bytes cut after the last whole record."""
        need = self.block_size - len(leftover)  # the BOM check may have read past a tiny block
        data = leftover + read_full(f, need) if need > 0 else leftover
        at_eof = len(data) < self.block_size
        cut = len(data) if at_eof else self.block_end(data)
        if cut == 0 and not at_eof:
            data, cut, at_eof = self._read_long_record(f, data)
        chunk, leftover = data[:cut], data[cut:]
        if offset + len(chunk) >= end:  # keep only the records that start before `end`
            stop = self.record_end(chunk, max(0, int(end - offset) - 1))
            return (chunk[:stop] if stop else chunk), b"", True
        return chunk, leftover, at_eof and not leftover

    def _read_long_record(self, f: Any, data: bytes) -> tuple[bytes, int, bool]:
        """``(data, cut, at_eof)`` once a record longer than ``data`` ends (or the file does).

        Only the bytes just read are searched for a line break (every record
        ends at one), and the pieces are joined once: a line of n bytes costs
        O(n), where joining and searching the whole buffer per read cost O(n^2).
        """
        pieces = [data]
        while True:
            more = read_full(f, self.block_size)
            pieces.append(more)
            at_eof = len(more) < self.block_size
            if at_eof or b"\n" in more:
                data = b"".join(pieces)
                cut = len(data) if at_eof else self.block_end(data)
                if cut or at_eof:
                    return data, cut, at_eof
                pieces = [data]  # a quoted CSV line break: the record goes on

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


class JsonLinesFormat(LineFormat):
    """One JSON value per line; blank lines are ignored.

    With ``orjson`` installed (and no ``loads`` given), a block's lines are
    parsed from its bytes by ``orjson.loads``; a block where orjson could
    differ from :func:`json.loads` (it rejects NaN, Infinity, lone surrogates
    and numbers beyond a double, and reads integers beyond 64 bits as floats)
    takes the stdlib path, so the records are the same either way.
    """

    name = "read_jsonl"

    def __init__(
        self, block_size: int = RECORD_BLOCK_SIZE, loads: Callable[[str], Any] | None = None
    ) -> None:
        super().__init__("utf-8", block_size)
        decoder = json.JSONDecoder()
        self.loads = loads or decoder.decode
        # The fast path calls the C scanner that json.loads ends in, skipping loads's per-call
        # checks and whitespace regexes: measured 2.1 us instead of 3.1 us per 150-byte record.
        self._scan = decoder.scan_once if loads is None else None
        # orjson per line, guarded: measured 1.1-1.2 us instead of 2.3-2.7 us per 214-byte record
        # of benchmarks/jsonl_pipeline.py. One orjson call on the whole block (the lines
        # wrapped and joined into one array) parsed them in 0.8 us, but proving that the
        # array's items are the lines (a line `1,2`, or `[1` followed by `2]`, must still be
        # a bad record) cost more than it saved: 1.4 us.
        self._fast_loads = _orjson_loads if loads is None else None

    def decode_records(self, chunk: bytes, meta: Any) -> list[Any]:
        if self._fast_loads is not None:
            records = self._decode_fast(chunk)
            if records is not None:
                return records
        lines = self.split_lines(chunk)
        if self._scan is None:
            return list(map(self.loads, lines))
        # A line that is not exactly one JSON value (blank, padded, malformed) stops the
        # scan early (StopIteration ends `list`) or ends elsewhere than the line's end; the
        # whole block then takes the per-line path, which parses like json.loads.
        parsed = list(map(self._scan, lines, repeat(0)))
        if len(parsed) != len(lines) or list(map(_second, parsed)) != list(map(len, lines)):
            raise ValueError("a line needs the per-line path")
        return list(map(_first, parsed))

    def _decode_fast(self, chunk: bytes) -> list[Any] | None:
        """The chunk's records parsed by orjson; ``None`` where json.loads must decide."""
        if _may_overflow_64_bits(chunk):
            return None
        lines = chunk.split(b"\n")
        if not lines[-1]:
            lines.pop()
        loads = self._fast_loads
        try:
            return list(map(loads, lines))
        except ValueError:  # orjson.JSONDecodeError: a blank or bad line, NaN, ...
            pass
        # Blank lines are ignored, as on the per-line path: parse the others.
        kept = [line for line in lines if not self.ignores(line)]
        if len(kept) == len(lines):
            return None
        try:
            return list(map(loads, kept))
        except ValueError:
            return None

    def ignores(self, line: bytes) -> bool:
        return not line.strip()

    def decode_one(self, line: bytes, meta: Any) -> Any:
        return self.loads(line.decode())


_DIGIT_IS_1 = bytes(48 <= byte <= 57 for byte in range(256))
_NINETEEN_1 = b"\x01" * 19


def _may_overflow_64_bits(chunk: bytes) -> bool:
    """Whether ``chunk`` may hold an integer out of orjson's range, which it reads as a float.

    Outside [-2**63, 2**64) a literal has 20 digits or more, or a minus sign
    and 19 or more; digit runs inside strings and fractions count too (the
    stdlib then parses the block, exactly). Measured: 1 us for 512 bytes with
    bytes methods; 30 us for 64 KiB with numpy (0.1 us per 214-byte record),
    whose fixed cost of about 9 us a call is the larger below 8 KiB.
    """
    if len(chunk) < 8192 and chunk.translate(_DIGIT_IS_1).find(_NINETEEN_1) < 0:
        return False
    text = np.frombuffer(chunk, np.uint8)
    run = (text - 48) < 10  # uint8 arithmetic wraps: only b"0" ... b"9" are below 10
    # run[i] <- whether text[i : i + k] is all digits, for k = 2, 4, 8, 16, 19
    run = run[:-1] & run[1:]
    run = run[:-2] & run[2:]
    run = run[:-4] & run[4:]
    run = run[:-8] & run[8:]
    run = run[:-3] & run[3:]
    if not run.any():
        return False
    return bool((run[:-1] & run[1:]).any() or ((text[:-19] == 45) & run[1:]).any())


class CsvFormat(LineFormat):
    """One ``dict`` per CSV row, keyed by the header row; values are strings.

    Row ends are found by the csv module itself (quoted line breaks, escape
    characters and stray quotes are judged as the rows are parsed), and the
    rows parsed to find a block's end are the rows returned. A row with a
    different number of fields than the header is a bad record. Splitting one
    file among several consumers starts each byte range at a line break, so
    it needs rows without quoted line breaks; files dealt whole have no limit.
    """

    name = "read_csv"

    def __init__(
        self, encoding: str = "utf-8", block_size: int = RECORD_BLOCK_SIZE, **fmtparams: Any
    ) -> None:
        super().__init__(encoding, block_size)
        self.fmtparams = fmtparams
        csv.reader([], **fmtparams)  # a bad dialect fails here
        self._parsed: tuple[bytes, list[int], list[list[str]]] = (b"", [], [])

    def prepare(self, source: SourceFile) -> tuple[int, int, Any]:
        with source.open(0) as f:
            data = b""
            while True:
                more = f.read(1 << 16)
                data += more
                end = self.record_end(data, 0)
                if end or not more:
                    break
        head = data[: end or len(data)]
        text = head.removeprefix(_BOM) if self.strips_bom else head
        header = next(
            csv.reader(io.StringIO(text.decode(self.encoding), newline=""), **self.fmtparams), None
        )
        if header is None:
            return len(head), 0, []
        return len(head), head.count(b"\n"), header

    def block_end(self, buf: bytes) -> int:
        ends = self._record_ends(buf)
        return ends[-1] if ends else 0

    def record_end(self, buf: bytes, start: int) -> int:
        return next((end for end in self._record_ends(buf) if end > start), 0)

    def _record_ends(self, buf: bytes) -> list[int]:
        """Byte offsets just after each complete record of ``buf`` (which starts a record).

        The csv module itself finds them, so quoted line breaks, escape
        characters and quotes inside unquoted fields are judged as the rows
        will be parsed. A record still open at the end of ``buf`` is left out.
        """
        line_ends = []
        found = buf.find(b"\n")
        while found >= 0:
            line_ends.append(found + 1)
            found = buf.find(b"\n", found + 1)
        if not line_ends:
            return []
        try:
            lines = buf[: line_ends[-1]].decode(self.encoding).split("\n")
        except UnicodeDecodeError:  # the decoder reports it, record by record
            return line_ends
        lines.pop()
        ran_out = False

        def feed() -> Iterator[str]:
            nonlocal ran_out
            for line in lines:
                yield line + "\n"
            ran_out = True

        reader = csv.reader(feed(), **self.fmtparams)
        ends, rows = [], []
        try:
            for row in reader:
                if ran_out:  # the reader wanted more lines: this record goes on past buf
                    break
                ends.append(line_ends[reader.line_num - 1])
                rows.append(row)
        except csv.Error:
            pass  # a malformed row: the records before it are still whole
        # The block about to be decoded is buf up to one of these ends: keep the parsed rows.
        self._parsed = (buf, ends, rows)
        return ends

    def _rows(self, chunk: bytes) -> Any:
        return csv.reader(io.StringIO(chunk.decode(self.encoding), newline=""), **self.fmtparams)

    def _parsed_rows(self, chunk: bytes) -> list[list[str]] | None:
        """The rows of ``chunk`` if finding its end parsed them already."""
        buf, ends, rows = self._parsed
        if not ends or len(chunk) > ends[-1] or not buf.startswith(chunk):
            return None
        count = bisect_right(ends, len(chunk))
        return rows[:count] if count and ends[count - 1] == len(chunk) else None

    def decode_records(self, chunk: bytes, meta: Any) -> list[Any]:
        width = len(meta)
        parsed = self._parsed_rows(chunk)
        rows = [row for row in (self._rows(chunk) if parsed is None else parsed) if row]
        if any(len(row) != width for row in rows):
            raise ValueError("row width differs from the header")
        return [dict(zip(meta, row)) for row in rows]

    def decode_slowly(
        self, chunk: bytes, meta: Any
    ) -> Iterator[tuple[int, int, Callable[[], Any] | None]]:
        reader = self._rows(chunk)
        position = 0
        while True:
            line = reader.line_num
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as cause:
                yield position, line, (lambda cause=cause: _raise(cause))
                return
            raw_end = self.record_end(chunk, position) or len(chunk)
            if row:
                yield position, line, (lambda row=row: self._row_dict(row, meta))
            position = raw_end

    def _row_dict(self, row: list[str], header: list[str]) -> dict[str, str]:
        if len(row) != len(header):
            raise ValueError(
                f"the row has {len(row)} fields, the header {len(header)}: {row[:8]!r}"
            )
        return dict(zip(header, row))


def _raise(error: Exception) -> Any:
    raise error


def _explain(cause: Exception) -> str:
    """The reason a record failed; JSON errors give the column within the line."""
    if isinstance(cause, json.JSONDecodeError):
        return f"invalid JSON: {cause.msg} (column {cause.colno})"
    return f"{type(cause).__name__}: {cause}"
