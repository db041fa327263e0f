"""One Parquet file opened through the storage: its footer read and not believed blindly.

:class:`Opened` wraps the library's storage file for pyarrow, tells a storage failure
(retried by the reader) from a corrupt file (a :class:`nodes.errors.BadRecordError`
naming it), checks the magic bytes at both ends, and refuses a row group whose footer
claims bytes outside the file or more rows than its columns hold before anything is
read or allocated for it (:meth:`Opened.check_row_group`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

from nodes import errors
from nodes.errors import BadRecordError

#: What a missing pyarrow is told to install.
PARQUET_EXTRA = "pip install 'datapipes-torch[parquet]' (or pyarrow>=14)"
MIN_PYARROW = (14, 0)
MAGIC = b"PAR1"


def import_pyarrow() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or an ImportError naming the extra to install."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:
        raise ImportError(f"read_parquet needs pyarrow: {PARQUET_EXTRA}") from error
    found = tuple(int(part) for part in pyarrow.__version__.split(".")[:2] if part.isdigit())
    if found < MIN_PYARROW:
        raise ImportError(
            f"read_parquet needs pyarrow >= {'.'.join(map(str, MIN_PYARROW))}, found "
            f"{pyarrow.__version__}: {PARQUET_EXTRA}"
        )
    return pyarrow, pyarrow.parquet


class UnbelievableRows(BadRecordError):
    """A row group whose row count in the footer cannot be true (its loss counts no rows)."""


class Watched:
    """The file pyarrow reads, keeping the error the storage raised, if any.

    pyarrow hands a Python error from the file back unchanged, and raises ``OSError`` of
    its own for corrupt data: a failure is the storage's when this saw it.
    """

    def __init__(self, f: Any) -> None:
        self._f = f
        self.failure: BaseException | None = None

    def read(self, size: int = -1) -> bytes:
        try:
            return self._f.read(size)
        except BaseException as error:
            self.failure = error
            raise

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        try:
            return self._f.seek(offset, whence)
        except BaseException as error:
            self.failure = error
            raise

    def tell(self) -> int:
        return self._f.tell()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        pass  # the storage's file is closed by whoever opened it


class Opened:
    """One Parquet file open: its footer read, its magic bytes and row counts known."""

    def __init__(self, f: Any, url: str, *, pre_buffer: bool = False) -> None:
        self.pa, pq = import_pyarrow()
        self.url = url
        self._f = f
        self.file = Watched(f)
        self.size = self._storage(lambda: f.seek(0, io.SEEK_END), "size")
        try:
            # pre_buffer: a row group's column chunks read in few coalesced requests, for
            # remote files; on local disk and memory:// it measured 15% slower.
            pyfile = self.pa.PythonFile(self.file, mode="r")
            self.pf = pq.ParquetFile(pyfile, pre_buffer=pre_buffer)
            self.meta = self.pf.metadata
            self.rows = [self.meta.row_group(g).num_rows for g in range(self.meta.num_row_groups)]
        except Exception as error:  # noqa: BLE001 - sorted out by bad()
            failure = self.bad(error, "footer")
            if isinstance(failure, BadRecordError):
                self.check_head()  # not a Parquet file at all: say so rather than "footer"
            raise failure from None

    def check_head(self) -> None:
        """Refuse a file that does not start with Parquet's magic bytes (pyarrow checks
        only the ones at the end)."""
        f = self._f
        head = self._storage(lambda: (f.seek(0), f.read(4))[1], "byte offset 0")
        if head != MAGIC:
            raise BadRecordError(
                self.url,
                "byte offset 0",
                f"not a Parquet file: it starts with {head!r}, not {MAGIC!r}",
            )

    def _storage(self, action: Callable[[], Any], where: str) -> Any:
        try:
            return action()
        except OSError:
            raise  # the storage failed: the reader reports it
        except Exception as error:  # noqa: BLE001 - a file that cannot be positioned
            raise BadRecordError(self.url, where, f"{type(error).__name__}: {error}") from None

    def bad(self, error: BaseException, where: str) -> BaseException:
        """The storage's own error if it failed, else a bad record naming the file."""
        failure, self.file.failure = self.file.failure, None
        if failure is not None:
            return failure
        if isinstance(error, BadRecordError):
            return error
        text = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {text[0] if text else ''}"
        return BadRecordError(self.url, where, f"cannot read it: {reason}")

    def leaves(self, columns: list[str] | None) -> list[int]:
        """The leaf columns (indices in the footer) that ``columns`` select."""
        schema = self.pf.schema
        paths = [schema.column(i).path for i in range(len(schema))]
        if columns is None:
            return list(range(len(paths)))
        chosen: list[int] = []
        for name in columns:
            found = [i for i, p in enumerate(paths) if p == name or p.startswith(name + ".")]
            if not found:
                top = self.pf.schema_arrow.names
                raise BadRecordError(self.url, "schema", f"no column {name!r} (its columns: {top})")
            chosen.extend(i for i in found if i not in chosen)
        return chosen

    def fields(self, columns: list[str] | None) -> list[tuple[str, Any]]:
        """``(name, type)`` of each column the records have (after projection)."""
        self.leaves(columns)  # a missing column is named here
        try:
            schema = self.pf.read_row_groups([], columns=columns).schema
        except Exception as error:  # noqa: BLE001 - sorted out by bad()
            raise self.bad(error, "schema") from None
        return [(field.name, field.type) for field in schema]

    def check_row_group(self, g: int, leaves: list[int]) -> int:
        """Refuse a row group whose footer entry cannot be true; its selected encoded bytes."""
        group = self.meta.row_group(g)
        rows, where = group.num_rows, f"row group {g}"
        columns = [group.column(j) for j in range(group.num_columns)]
        if rows < 0:
            raise UnbelievableRows(self.url, where, f"the footer claims {rows} rows")
        for column in columns:  # every row has a value (or a null) in every column
            if column.num_values < rows:
                raise UnbelievableRows(
                    self.url,
                    where,
                    f"the footer claims {rows:,} rows, but column {column.path_in_schema!r} "
                    f"holds {column.num_values:,} values",
                )
        encoded = 0
        for j, column in enumerate(columns):
            start, length = column.data_page_offset, column.total_compressed_size
            dictionary = column.dictionary_page_offset
            if column.has_dictionary_page and dictionary and 0 < dictionary < start:
                start = dictionary
            if start < 0 or length < 0 or start + length > self.size:
                raise BadRecordError(
                    self.url,
                    f"{where}, column {column.path_in_schema!r}",
                    f"the footer claims bytes [{start:,}, {start + length:,}) of a "
                    f"{self.size:,}-byte file",
                )
            if j in leaves:
                encoded += max(0, column.total_uncompressed_size)
        if rows and encoded > errors.MAX_RECORD_BYTES * rows:  # some row is that big at least
            raise BadRecordError(
                self.url,
                where,
                f"its {rows:,} rows expand to {encoded:,} bytes: rows of over "
                f"{errors.MAX_RECORD_BYTES:,} bytes (nodes.errors.MAX_RECORD_BYTES)",
            )
        return encoded

    def batches(self, g: int, columns: list[str] | None, step: int) -> Iterator[Any]:
        return self.pf.iter_batches(batch_size=step, row_groups=[g], columns=columns)
