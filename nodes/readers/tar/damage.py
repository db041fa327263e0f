"""What a tar reader does about damaged bytes: count them, and judge the samples next to them.

Under ``on_error="skip"`` a damaged range (from where a header should be to
the next header whose checksum verifies, or to the end of the file) is one
counted loss: a skip, a range, and its bytes where the stored file is the
archive itself. The samples on either side of it were read from intact
members, but a member of theirs may have been in the damaged bytes: a sample
that lacks a field which the sample on the other side of the damage has (or,
with nothing after the damage, the sample before it in the same block) is a
bad record, counted in ``records``. Samples wholly inside the damaged bytes
cannot be counted, so ``records`` is then a lower bound.

Verdicts use only what was read since the start of the block being read, so
a resume, which re-reads its block from its start cursor, judges alike.
"""

from __future__ import annotations

from typing import Any

from nodes.errors import BadRecordError, ErrorPolicy
from nodes.readers.format import Cursor
from nodes.readers.tar.walker import TarWalker
from nodes.storage import SourceFile


class Group:
    """One sample as read: key, where it starts, number, fields, data (if its owner's)."""

    __slots__ = (
        "key",
        "start",
        "number",
        "mine",
        "fields",
        "sample",
        "size",
        "problem",
        "after",
        "damaged_before",
        "damaged_after",
        "counted",
    )

    def __init__(self, key: str, start: int, number: int, mine: bool, url: str) -> None:
        self.key, self.start, self.number, self.mine = key, start, number, mine
        self.fields: set[str] = set()
        self.sample: dict[str, Any] = {"__key__": key, "__url__": url}
        self.size = 0
        self.problem: BadRecordError | None = None  # why it must not be handed out
        self.after: Cursor = None  # where the next sample starts (None: nothing follows)
        self.damaged_before = False  # damaged bytes were skipped to reach it
        self.damaged_after = False  # damaged bytes (or a cut member of its own) follow it
        self.counted = False  # lost with a damaged range (a member of it was cut), counted there

    def judge(self, other: set[str] | None, url: str) -> None:
        """Make it a bad record if it lacks a field of the sample ``other`` across the damage."""
        missing = sorted((other or set()) - self.fields)
        if missing and self.problem is None:
            self.problem = BadRecordError(
                url,
                f"sample {self.key!r} at byte offset {self.start}",
                f"next to damaged bytes, it lacks the field(s) {missing} that the sample on the "
                "other side of the damage has: its member was probably in the damaged bytes",
            )


class BlockMemory:
    """What reading one block remembers: its keys, and the fields of its last good sample."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.last: set[str] | None = None

    def clear(self) -> None:
        """A new block starts (a resume starts there knowing nothing before it)."""
        self.seen.clear()
        self.last = None


class Loss:
    """Raises damage, or counts a damaged range and resynchronises after it."""

    def __init__(self, source: SourceFile, errors: ErrorPolicy) -> None:
        self.source, self.errors = source, errors

    def gap(
        self,
        walker: TarWalker,
        error: BadRecordError,
        cursor: Cursor,
        report: bool,
        records: int | None = None,
    ) -> bool:
        """Raise ``error``, or count its damaged range and skip it: whether a header follows.

        ``cursor`` is where a resume meets the damage again (the sample it broke);
        ``report``: this consumer counts the range (one consumer of a shared file);
        ``records``: the samples known lost with it (one whose member was cut).
        """
        error.cursor = cursor  # type: ignore[attr-defined]
        if not self.errors.skip:
            raise error
        at: int = getattr(error, "at", walker.offset)
        header = walker.resync()
        if report:
            whole = at == 0 and header is None
            what = None if header is None else "a damaged range, up to the next valid tar header"
            nbytes = self._bytes(at, header)
            self.errors.lose(error, whole_file=whole, records=records, nbytes=nbytes, what=what)
        return header is not None

    def _bytes(self, at: int, header: int | None) -> int | None:
        """The stored bytes from ``at`` to ``header`` (None: the end), where they are known."""
        if self.source.compression is not None:  # offsets are into the decompressed archive
            return None
        if header is not None:
            return header - at
        try:
            size = self.source.size()
        except OSError:
            return None
        return None if size is None else max(0, size - at)
