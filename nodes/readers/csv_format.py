"""CSV: one ``dict`` per row, keyed by the header row, rows found by the csv module."""

from __future__ import annotations

import csv
import io
from bisect import bisect_right
from collections.abc import Callable, Iterator
from typing import Any

from nodes.readers.lines import BOM, MAX_RECORD_BYTES, RECORD_BLOCK_SIZE, LineFormat
from nodes.storage import SourceFile


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
        self,
        encoding: str = "utf-8",
        block_size: int = RECORD_BLOCK_SIZE,
        max_record_bytes: int | None = MAX_RECORD_BYTES,
        **fmtparams: Any,
    ) -> None:
        super().__init__(encoding, block_size, max_record_bytes)
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
        text = head.removeprefix(BOM) if self.strips_bom else head
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
