"""NumPy ``.npy`` and ``.npz`` files: one record per row, or one per file.

By rows, the cursor is the row index and resume seeks straight to
``header + row * row_bytes``; a file is split among consumers by row ranges.
An ``.npz`` yields one ``dict`` per row with a field per member (all members
must have the same number of rows). Object arrays are refused: loading them
would unpickle data.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from nodes.adapters.third_party import read_npy_header_3_0
from nodes.errors import BadRecordError, ErrorPolicy, InvalidStateError, check_expanded_size
from nodes.readers.reader import Cursor, RecordFormat
from nodes.state_checks import check_int
from nodes.storage import SourceFile, read_full


def read_npy_header(f: Any, url: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` of the ``.npy`` stream ``f`` (at its start)."""
    start = f.tell()
    try:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
        elif version == (3, 0):  # utf-8 field names: numpy has no public reader
            shape, fortran, dtype = read_npy_header_3_0(f)
        else:
            raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
    except BadRecordError:
        raise  # the file under it is broken (truncated compressed data), already explained
    except (ValueError, EOFError, SyntaxError) as error:
        raise BadRecordError(url, f"byte offset {start}", f"not a .npy array: {error}") from None
    if dtype.hasobject:
        raise BadRecordError(url, "header", "object arrays are refused (loading would unpickle)")
    if fortran and len(shape) > 1:
        raise BadRecordError(
            url,
            "header",
            "a Fortran-ordered array cannot be read by rows; save it in C order "
            "(np.ascontiguousarray) or read it whole with read_npy(rows=False)",
        )
    if not shape:
        raise BadRecordError(url, "header", "a 0-d array has no rows; use read_npy(rows=False)")
    return tuple(shape), dtype, f.tell() - start


class _Member:
    """One array of a file, read by rows from its own stream."""

    def __init__(self, stream: Any, url: str, name: str | None) -> None:
        self.stream = stream
        self.url = url
        self.name = name  # the .npz member (without .npy), None for a plain .npy file
        self.where = "" if name is None else f"member {name + '.npy'!r}, "
        self.shape, self.dtype, self.data_offset = read_npy_header(stream, url)
        self.row_bytes = self.dtype.itemsize * math.prod(self.shape[1:])

    def read_rows(self, row: int, count: int) -> tuple[np.ndarray, BadRecordError | None]:
        """Rows ``row .. row + count - 1``; if the file ends early, the whole rows and the error."""
        self.stream.seek(self.data_offset + row * self.row_bytes)
        want = count * self.row_bytes
        data = read_full(self.stream, want)
        error = None
        if len(data) < want:
            got = len(data) // self.row_bytes if self.row_bytes else 0
            offset = self.data_offset + (row + got) * self.row_bytes
            error = BadRecordError(
                self.url,
                f"{self.where}row {row + got} (byte offset {offset})",
                f"truncated: the header promises {self.shape[0]} rows",
            )
            data, count = data[: got * self.row_bytes], got
        rows = np.frombuffer(bytearray(data), self.dtype).reshape(count, *self.shape[1:])
        return rows, error


class _Progress:
    """How far a part of a file was read, to count what its loss held (rows, bytes)."""

    def __init__(self) -> None:
        self.start = self.row = 0
        self.end: int | None = None  # None until the header was read
        self.members: list[_Member] = []

    def lost(self, source: SourceFile, is_npz: bool, counting: bool) -> dict[str, Any]:
        """``lose()``'s arguments for the rest of the part: its rows, and its bytes if known."""
        if self.end is None:
            return {"whole_file": True}
        nbytes = None
        if counting and not is_npz and source.compression is None and self.members:
            member = self.members[0]
            try:
                size = source.size()
            except OSError:
                size = None
            if size is not None:
                stop = min(size, member.data_offset + self.end * member.row_bytes)
                nbytes = max(0, stop - member.data_offset - self.row * member.row_bytes)
        return {
            "whole_file": self.row == self.start,
            "records": self.end - self.row,
            "nbytes": nbytes,
        }


class NpyFormat(RecordFormat):
    """Rows of ``.npy`` arrays (or ``.npz`` archives); ``rows=False``: one record per file."""

    name = "read_npy"

    def __init__(self, rows: bool = True, block_bytes: int = 1 << 22) -> None:
        self.rows = rows
        self.splittable = rows
        self.block_bytes = block_bytes

    def check_cursor(self, source: SourceFile, cursor: Cursor, path: str) -> None:
        """A row number, refused unless an int >= 0 (the file's rows bound it when opened)."""
        check_int(cursor, path)

    def blocks(
        self, source: SourceFile, part: int, parts: int, cursor: Cursor, errors: ErrorPolicy
    ) -> Iterator[tuple[list[Any], Cursor]]:
        is_npz = source.name.endswith(".npz")
        at = _Progress()
        try:
            with ExitStack() as stack:
                f = stack.enter_context(source.open(0))
                if not self.rows:
                    yield [self._whole(f, is_npz, source.url)], None
                    return
                members = self._members(f, is_npz, source, stack)
                yield from self._row_blocks(members, part, parts, cursor, at)
        except BadRecordError as error:  # the rest of the file is unreadable: raise or count
            if not self.rows:  # the file was one record
                errors.lose(error, whole_file=True, records=1)
            else:
                errors.lose(error, **at.lost(source, is_npz, errors.skip))
        except OSError as error:
            if at.end is None:
                raise  # nothing known of the file: the reader reports it
            errors.lose(error, **at.lost(source, is_npz, errors.skip))

    def _whole(self, f: Any, is_npz: bool, url: str) -> Any:
        try:
            if is_npz:
                with zipfile.ZipFile(f) as members:  # sizes from the central directory
                    check_expanded_size(sum(m.file_size for m in members.infolist()), "it")
                f.seek(0)
                with np.load(f, allow_pickle=False) as archive:
                    return {name: archive[name] for name in archive.files}
            return np.load(f, allow_pickle=False)
        except (ValueError, zipfile.BadZipFile, EOFError) as error:
            raise BadRecordError(url, "whole file", f"{type(error).__name__}: {error}") from None

    def _members(self, f: Any, is_npz: bool, source: SourceFile, stack: ExitStack) -> list[_Member]:
        url = source.url
        if not is_npz:
            return [_Member(f, url, None)]
        archive = self._archive(f, url, stack)
        names = [name for name in archive.namelist() if name.endswith(".npy")]
        # Each member reads from a file handle of its own: rows are read from the members in
        # turn, and on one shared handle every turn would seek back (a new download from the
        # start, on an HTTP server without Range support).
        archives = [archive] + [
            self._archive(stack.enter_context(source.open(0)), url, stack) for _ in names[1:]
        ]
        members = [
            _Member(stack.enter_context(opened.open(name)), url, name.removesuffix(".npy"))
            for opened, name in zip(archives, names)
        ]
        lengths = {m.name: m.shape[0] for m in members}
        if len(set(lengths.values())) > 1:
            raise BadRecordError(
                url,
                "archive",
                f"members have different numbers of rows: {lengths}; read it "
                "with read_npy(rows=False)",
            )
        return members

    @staticmethod
    def _archive(f: Any, url: str, stack: ExitStack) -> zipfile.ZipFile:
        try:
            return stack.enter_context(zipfile.ZipFile(f))
        except zipfile.BadZipFile as error:
            raise BadRecordError(url, "archive", f"not a .npz archive: {error}") from None

    def _row_blocks(
        self, members: list[_Member], part: int, parts: int, cursor: Cursor, at: _Progress
    ) -> Iterator[tuple[list[Any], Cursor]]:
        """Blocks of rows of this part; a truncated file yields its whole rows, then raises."""
        if not members:
            return
        rows = members[0].shape[0]
        end = (part + 1) * rows // parts
        at.start = part * rows // parts  # a loss from here is the whole part's
        row = at.start if cursor is None else int(cursor)
        at.row = row
        at.end, at.members = end, members
        if cursor is not None and not part * rows // parts <= row < end:  # a resume only
            raise InvalidStateError(
                "cursor", f"a row in [{part * rows // parts}, {end}) of {members[0].url}", row
            )
        per_block = max(1, self.block_bytes // max(1, sum(m.row_bytes for m in members)))
        names = [m.name for m in members]
        while row < end:
            read = [m.read_rows(row, min(per_block, end - row)) for m in members]
            count = min(len(rows_read) for rows_read, _ in read)
            arrays = [rows_read[:count] for rows_read, _ in read]
            if len(members) == 1 and members[0].name is None:
                records = list(arrays[0])
            else:
                records = [dict(zip(names, values)) for values in zip(*arrays)]
            row += count
            at.row = row
            failure = next((error for _, error in read if error is not None), None)
            if failure is not None:
                yield records, row  # resuming here meets the same error
                raise failure
            yield records, (row if row < end else None)
