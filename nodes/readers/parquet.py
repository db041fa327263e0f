"""Parquet files through pyarrow (optional: ``pip install 'datapipes-torch[parquet]'``).

A file is opened through the library's storage (:class:`nodes.storage.SourceFile`: any
fsspec URL, retried reads, range reads), and pyarrow reads its footer and then only the
row groups (and columns) it needs. Records are one ``dict`` per row (as
``RecordBatch.to_pylist`` makes them), or with ``batches=True`` whole
``pyarrow.RecordBatch``es.

Positions are ``[row group, row within it]``: a resume reads the row group it points
into (decoding its rows before the position once) and nothing before it. Blocks are
aligned to multiples of the block's row count from the row group's start, so a block
depends only on where it starts. A file is split among consumers by row groups, and when
it has fewer row groups than parts, each row group by row ranges (see :func:`part_ranges`).

Bad input (a cut file, a damaged footer, wrong magic bytes, a footer whose row groups
claim bytes outside the file or more rows than their columns hold, data pyarrow cannot
decode, a schema that differs from the listing's first file) is a
:class:`nodes.errors.BadRecordError` naming the file; under ``on_error="skip"`` it is
counted: a file that cannot be read at all, or whose schema differs, as a lost file; a
row group that cannot be read as a lost range (its rows counted where the footer is
believable), after which the next row group is read.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from nodes.errors import BadRecordError, ErrorPolicy, InvalidStateError
from nodes.readers.format import Cursor, RecordFormat
from nodes.readers.parquet_file import Opened, UnbelievableRows, import_pyarrow
from nodes.state_checks import is_int
from nodes.storage import SourceFile

if TYPE_CHECKING:
    from nodes.sources.files import FileSet

#: Rows per block at most, and the encoded column bytes a block holds about (when
#: ``batch_size`` is not given, from the row group's sizes in the footer).
MAX_BLOCK_ROWS = 65536
BLOCK_BYTES = 8 << 20
#: Rows per block at most for dicts with lists or dicts inside: rows the collector tracks.
#: Every block's rows outlive a few of its collections while they wait to be consumed, and
#: are scanned again with the whole heap: 400,000 such rows (a list of 8 floats each) took
#: 1.1 s of CPU to read and consume in blocks of 1,024 rows, 1.6 s in blocks of 10,000.
#: Rows of plain values are untracked dicts: blocks of 1,024 of those were 15% slower.
MAX_NESTED_ROWS = 1024


def part_ranges(rows: list[int], part: int, parts: int) -> list[tuple[int, int, int]]:
    """Part ``part`` of ``parts`` of a file with these row counts per row group, as
    ``(row group, first row, end row)`` ranges.

    At least as many row groups as parts: contiguous runs of whole row groups. Fewer:
    row group ``g`` of ``G`` is cut into ``parts // G`` row ranges (one more for the first
    ``parts % G``), so that every part reads one row group.

    >>> part_ranges([10, 10, 10], 1, 2)
    [(1, 0, 10), (2, 0, 10)]
    >>> part_ranges([10, 4], 1, 3)
    [(0, 5, 10)]
    """
    groups = len(rows)
    if parts <= 1:
        return [(g, 0, n) for g, n in enumerate(rows)]
    if groups >= parts:
        return [
            (g, 0, rows[g]) for g in range(part * groups // parts, (part + 1) * groups // parts)
        ]
    base, extra = divmod(parts, groups) if groups else (0, 0)
    k = part
    for g, n in enumerate(rows):
        cuts = base + (g < extra)
        if k < cuts:
            return [(g, k * n // cuts, (k + 1) * n // cuts)]
        k -= cuts
    return []


def _check_columns(columns: Any) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"read_parquet(columns=...) takes a list of column names, got {columns!r}")
    return list(columns)


class ParquetFormat(RecordFormat):
    """Rows of Parquet files as dicts, or ``batches=True``: ``pyarrow.RecordBatch``es.

    ``columns`` selects columns (a nested field by a dotted path, as pyarrow
    does); ``batch_size`` is the rows per block (the size of a RecordBatch in
    batches mode); by default, as many rows as hold about 8 MiB of encoded
    column data, at most 65,536 (1,024 for dicts holding lists or structs).
    Every file is compared with the listing's first
    file: a file whose (selected) columns have other names or types is a bad file.
    """

    name = "read_parquet"
    splittable = True

    def __init__(
        self,
        columns: list[str] | None = None,
        batches: bool = False,
        batch_size: int | None = None,
    ) -> None:
        self.columns = _check_columns(columns)
        if not isinstance(batches, bool):
            raise TypeError(f"read_parquet(batches=...) takes True or False, got {batches!r}")
        if batch_size is not None and (not is_int(batch_size) or batch_size < 1):
            raise ValueError(f"batch_size must be an int >= 1 or None, got {batch_size!r}")
        self.batches = batches
        self.batch_size = batch_size
        self._files: FileSet | None = None
        # (url, fields) of the listing's first file once read; fields None: unreadable
        self._reference: tuple[str, list[tuple[str, Any]] | None] | None = None
        self._to_rows: Callable[[Any], list[Any]] | None = None

    def bind(self, files: FileSet) -> None:
        import_pyarrow()  # a missing pyarrow fails when the reader is built
        self._files = files

    # ----- cursors --------------------------------------------------------------------------
    def check_cursor(self, source: SourceFile, cursor: Cursor, path: str) -> None:
        if not (
            type(cursor) is list and len(cursor) == 2 and all(is_int(v) and v >= 0 for v in cursor)
        ):
            raise InvalidStateError(path, "[row group, row]: two integers >= 0", cursor)
        try:
            with source.open(0) as f:
                rows = Opened(f, source.url).rows
        except (OSError, BadRecordError):
            return  # unreadable now: the read reports it (or counts it under "skip")
        group, row = cursor
        if group >= len(rows) or row >= rows[group]:
            inside = f"{len(rows)} row groups" + (
                f", row group {group} has {rows[group]} rows" if group < len(rows) else ""
            )
            raise InvalidStateError(
                path,
                f"[row group, row] within {source.url} ({inside})",
                cursor,
                note="the cursor points past the file's row groups or rows: the file changed, "
                "or the state is corrupt",
            )

    # ----- reading --------------------------------------------------------------------------
    def blocks(
        self, source: SourceFile, part: int, parts: int, cursor: Cursor, errors: ErrorPolicy
    ) -> Iterator[tuple[list[Any], Cursor]]:
        if source.compression is not None:
            raise BadRecordError(
                source.url,
                "whole file",
                f"a {source.compression}-compressed Parquet file cannot be read by row groups "
                "(Parquet compresses its pages itself): store it uncompressed",
            )
        with source.open(0) as f:
            remote = source.can_stall
            opened = Opened(f, source.url, pre_buffer=remote)
            ranges = part_ranges([max(0, n) for n in opened.rows], part, parts)
            first, begin = 0, None
            if cursor is not None:
                first, begin = _locate(ranges, cursor, source.url)
            if not remote or (ranges[first:] and ranges[first][0] == 0):
                # Remote, only with row group 0, whose data follows the magic bytes: a
                # consumer that reads later row groups downloads nothing before them.
                opened.check_head()
            try:
                fields = self._check_schema(opened)
                leaves = opened.leaves(self.columns)
            except BadRecordError as error:
                rest = sum(stop - start for _, start, stop in ranges[first:])
                if begin is not None:
                    rest -= begin - ranges[first][1]
                errors.lose(error, whole_file=cursor is None, records=rest)
                return
            limit = MAX_BLOCK_ROWS
            if not self.batches and any(opened.pa.types.is_nested(t) for _, t in fields):
                limit = MAX_NESTED_ROWS
            for i in range(first, len(ranges)):
                g, start, stop = ranges[i]
                after_range = list(ranges[i + 1][:2]) if i + 1 < len(ranges) else None
                yield from self._range_blocks(
                    opened,
                    g,
                    start if i != first or begin is None else begin,
                    stop,
                    after_range,
                    leaves,
                    limit,
                    errors,
                )

    def _range_blocks(
        self,
        opened: Opened,
        g: int,
        row: int,
        stop: int,
        after_range: Cursor,
        leaves: list[int],
        limit: int,
        errors: ErrorPolicy,
    ) -> Iterator[tuple[list[Any], Cursor]]:
        """Blocks of rows ``row .. stop - 1`` of row group ``g``; a row group that cannot
        be read is lost from where it failed (raised, or counted and passed over)."""
        try:
            encoded = opened.check_row_group(g, leaves)
        except BadRecordError as error:
            believable = not isinstance(error, UnbelievableRows)
            errors.lose(error, whole_file=False, records=(stop - row) if believable else None)
            return
        step = self.batch_size or _block_rows(encoded, opened.rows[g], limit)
        pieces = _cut(opened.batches(g, self.columns, step), row, stop, step)
        convert = self._converter(opened.pa)
        while row < stop:
            try:
                batch, end = next(pieces)
            except StopIteration:
                error = BadRecordError(
                    opened.url,
                    f"row group {g}, row {row}",
                    f"the data ends there, the footer claims {opened.rows[g]:,} rows",
                )
                errors.lose(error, whole_file=False, records=None)
                return
            except Exception as error:  # noqa: BLE001 - pyarrow's (or the storage's) error
                failure = opened.bad(error, f"row group {g}, rows from {row}")
                if not isinstance(failure, BadRecordError):
                    raise failure from None  # the storage failed: the reader reports it
                errors.lose(failure, whole_file=False, records=stop - row)
                return
            row = end
            yield convert(batch), ([g, end] if end < stop else after_range)

    def _converter(self, pa: Any) -> Callable[[Any], list[Any]]:
        if self._to_rows is None:
            self._to_rows = _one_batch if self.batches else _dict_rows(pa)
        return self._to_rows

    def _check_schema(self, opened: Opened) -> list[tuple[str, Any]]:
        """The file's (selected) columns; refused if they differ from the listing's first
        file's."""
        fields = opened.fields(self.columns)
        if self._files is None:
            return fields  # a reader made without a listing (not through FileReaderNode)
        first_url = self._files.urls[0]
        if self._reference is None:
            if opened.url == first_url:
                self._reference = (first_url, fields)
                return fields
            self._reference = (first_url, self._fields_of(self._files.source(0)))
        reference_url, expected = self._reference
        if expected is None or reference_url == opened.url or expected == fields:
            return fields
        raise BadRecordError(
            opened.url,
            "schema",
            f"differs from the first file's ({reference_url}): " + _difference(expected, fields),
        )

    def _fields_of(self, source: SourceFile) -> list[tuple[str, Any]] | None:
        """The first file's fields, or ``None`` if it cannot be read (it reports itself)."""
        try:
            with source.open(0) as f:
                return Opened(f, source.url).fields(self.columns)
        except (OSError, BadRecordError):
            return None


def _locate(ranges: list[tuple[int, int, int]], cursor: Cursor, url: str) -> tuple[int, int]:
    """The index of the range a resume cursor is in, and its row; refused if in none."""
    group, row = cursor
    for i, (g, start, stop) in enumerate(ranges):
        if g == group and start <= row < stop:
            return i, row
    raise InvalidStateError(
        "cursor",
        f"[row group, row] within this part of {url}: "
        + (", ".join(f"row group {g} rows [{a}, {b})" for g, a, b in ranges) or "nothing"),
        cursor,
    )


def _block_rows(encoded: int, rows: int, limit: int) -> int:
    """Rows per block of a row group: about BLOCK_BYTES of its encoded columns, at most
    ``limit``."""
    if rows <= 0 or encoded <= 0:
        return limit
    return max(1, min(limit, BLOCK_BYTES * rows // encoded))


def _cut(batches: Iterator[Any], row: int, stop: int, step: int) -> Iterator[tuple[Any, int]]:
    """``(rows, end)`` of each block from ``row`` to ``stop`` of a row group read in
    ``batches``: blocks end at the multiples of ``step`` (and at ``stop``), so a block
    depends only on where it starts. The rows are one arrow batch, or a list of them
    where a block spans pyarrow's batches (pyarrow's batches of ``step`` rows align)."""
    at = 0  # rows of the row group in the batches so far
    pending: list[Any] = []
    held = 0  # rows in pending, which start at `row`
    end = min(stop, (row // step + 1) * step)
    for batch in batches:
        first, at = at, at + batch.num_rows
        if at <= row + held:
            continue  # rows before the position: decoded, dropped
        rest = batch.slice(row + held - first) if first < row + held else batch
        while rest.num_rows:
            need = end - row - held
            if rest.num_rows <= need:
                piece, rest = rest, rest.slice(rest.num_rows)
            else:
                piece, rest = rest.slice(0, need), rest.slice(need)
            pending.append(piece)
            held += piece.num_rows
            if held == end - row:
                yield (pending[0] if len(pending) == 1 else pending), end
                if end >= stop:
                    return
                row, pending, held = end, [], 0
                end = min(stop, end + step)
    if held:  # the row group ends before the footer says: its rows, then the error
        yield (pending[0] if len(pending) == 1 else pending), row + held


def _one_batch(piece: Any) -> list[Any]:
    """The block as one ``RecordBatch`` (its pieces joined when it spans pyarrow's batches)."""
    if isinstance(piece, list):
        import pyarrow as pa

        piece = pa.Table.from_batches(piece).combine_chunks().to_batches()[0]
    return [piece]


def _dict_rows(pa: Any) -> Callable[[Any], list[Any]]:
    """A converter of a block's arrow rows to one dict per row."""
    struct = pa.StructArray.from_arrays

    def rows(piece: Any) -> list[Any]:
        if isinstance(piece, list):
            return [row for part in piece for row in rows(part)]
        if not piece.num_columns:
            return [{} for _ in range(piece.num_rows)]
        # One struct array's to_pylist: measured 10-25% faster than RecordBatch.to_pylist,
        # whose dicts are made by a comprehension over columns per row. The rows are trees
        # of new dicts and lists (no cycles to find): without the collector running every
        # 700 of them, converting 200,000 rows of 4 columns (one a list of 8 floats) took
        # 0.25 s instead of 0.86 s of CPU (it scans every young object, and the old ones
        # again and again as the block's rows pile up). It runs once after the block.
        if not gc.isenabled():
            return struct(piece.columns, names=piece.schema.names).to_pylist()
        gc.disable()
        try:
            return struct(piece.columns, names=piece.schema.names).to_pylist()
        finally:
            gc.enable()

    return rows


def _difference(expected: list[tuple[str, Any]], found: list[tuple[str, Any]]) -> str:
    """What differs between two column lists, in words."""
    names, others = [n for n, _ in expected], [n for n, _ in found]
    if names != others:
        return f"columns {names} there, {others} here"
    for (name, a), (_, b) in zip(expected, found):
        if a != b:
            return f"column {name!r} is {a} there, {b} here"
    return "the columns differ"
