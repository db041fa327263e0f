"""The file format protocol: how a format reads a file in blocks, and checks its cursors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from nodes.errors import ErrorPolicy, InvalidStateError
from nodes.storage import SourceFile

if TYPE_CHECKING:
    from nodes.sources.files import FileSet

Cursor = Any  # plain data (int, list of ints, dict) marking the start of a block


class RecordFormat:
    """How one file format turns a file (or a part of one) into blocks of records.

    A format yields ``(records, cursor_after)`` pairs: a list of records and
    a plain-data cursor from which :meth:`blocks` can start again to produce
    exactly the blocks that follow (``None`` once the part is done). Block
    boundaries must depend only on where a block starts, so that a resumed
    reader re-reads the same block and skips to the same record.

    ``splittable`` says whether a file can be divided among several consumers
    (line-based text, rows of an array, samples of a tar); a format with one
    record per file cannot.
    """

    name = "read"
    splittable = True

    def bind(self, files: FileSet) -> None:
        """Called once by the reader as it is built, with the files it reads.

        A format imports what it needs here (a missing optional library is an
        ``ImportError`` naming the extra, when the pipeline is built) and keeps
        what it compares files with (``read_parquet``: the listing's first file's
        schema). Nothing is listed or opened yet. The default does nothing.
        """

    def blocks(
        self, source: SourceFile, part: int, parts: int, cursor: Cursor, errors: ErrorPolicy
    ) -> Iterator[tuple[list[Any], Cursor]]:
        raise NotImplementedError

    def check_cursor(self, source: SourceFile, cursor: Cursor, path: str) -> None:
        """Refuse (:class:`nodes.errors.InvalidStateError`, naming ``path``) a cursor that
        does not point where a block of ``source`` starts, before a resume reads there.

        Called once per load, never per record. The default accepts any cursor: a
        format of the user's keeps its cursors opaque.
        """


# ----- what the cursor checks of the formats share -------------------------------------------


def source_size(source: SourceFile) -> int | None:
    """The file's size when its offsets are bytes of it (uncompressed), else ``None``."""
    if not source.seekable:
        return None
    try:
        return source.size()
    except OSError:
        return None  # unreachable now: the resume reports it as it reads


def past_end(source: SourceFile, offset: int, size: int | None, path: str) -> NoReturn:
    """Refuse a cursor whose byte ``offset`` is past the end of ``source``."""
    raise InvalidStateError(
        path,
        f"a byte offset within {source.url}"
        + (f" (size {size} bytes)" if size is not None else ""),
        offset,
        note="the cursor points past the end of the file: the file changed, or the state is "
        "corrupt",
    )
