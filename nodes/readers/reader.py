"""The node that reads records out of a consumer's files, block by block, resumable anywhere."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

from nodes import elastic as el
from nodes.base import Node, NotReset, State
from nodes.context import Context
from nodes.errors import BadRecordError, ErrorPolicy, InvalidStateError
from nodes.iterators import list_iterator_position, positioned_iterator
from nodes.readers.file_states import check_cursor, validate_reader
from nodes.readers.format import Cursor, RecordFormat
from nodes.sources.files import FileSet, Unit, consumer_units, unit_piece

Tally = tuple[int, int, int, int, int]  # ErrorPolicy.tally(): skips, files, ranges, bytes, rows


class FileReaderNode(Node):
    """Reads this consumer's units of files with a :class:`RecordFormat`.

    Records are handed out of a list per block through C iterators, so the
    per-record cost is that of the format's decoding. State: ``unit`` (the
    index in this consumer's plan, with its ``file`` index in the listing and
    its ``part``), the ``cursor`` of the current block, the ``index`` of the
    next record in it, the number of skips so far (``skipped``: bad records,
    and lost files and ranges of files, one each), after a lost file or range
    what the losses held (``lost``: ``[files, ranges, bytes, rows]``, see
    :meth:`ErrorPolicy.losses`), and the ``listing`` (file count and digest)
    that the positions refer to.
    Resume opens the file at the cursor (a byte offset, a row, a tar header)
    and re-reads at most one block; the cost does not grow with the position,
    except for compressed files, which are decompressed from their start.
    """

    kind = "reader"
    elastic = "source"
    elastic_kind = el.RECORDS

    def __init__(
        self,
        files: FileSet,
        fmt: RecordFormat,
        ctx: Context,
        *,
        on_error: str = "raise",
        step: str | None = None,
    ) -> None:
        super().__init__()
        self._files = files
        self._format = fmt
        bind = getattr(fmt, "bind", None)  # a format of the user's may predate the hook
        if bind is not None:
            bind(files)  # an optional library missing: an ImportError naming it, now
        self._ctx = ctx
        self.errors = ErrorPolicy(on_error, step or fmt.name)
        # Remaining files of a format that cannot split one are dealt whole (nodes.elastic).
        self.elastic_kind = el.RECORDS if fmt.splittable else el.FILES
        self._it: Iterator[Any] = NotReset(self)
        self._gen: Iterator[Any] | None = None
        self._was_reset = False

    def reset(self, state: State | None = None) -> None:
        self.close()
        if state is not None:
            self._files.check_state(state)
        self._units, self._plan = self._consumer_units()
        self._was_reset = True
        unit = 0 if state is None else int(state["unit"])
        cursor = None if state is None else state["cursor"]
        index = 0 if state is None else int(state["index"])
        if state is None:
            self.errors.restore((0, 0, 0, 0, 0))
        else:
            self.errors.load_state(state["skipped"], state.get("lost"), "reader state")
        self._at = _Place(unit, cursor, index, self.errors.tally())
        self._gen = self._blocks(unit, cursor, index)
        self._it = chain.from_iterable(self._gen)

    def _consumer_units(self) -> tuple[list[Unit], list[el.Piece] | None]:
        splittable = self._format.splittable
        return consumer_units(self._files, self._ctx, self.place, splittable)

    def _blocks(self, unit_index: int, cursor: Cursor, index: int) -> Iterator[Iterator[Any]]:
        for u in range(unit_index, len(self._units)):
            unit: Unit = self._units[u]
            one = False
            if self._plan is not None:  # a dealt piece starts where it says
                piece = self._plan[u]
                one = bool(piece["one"])
                if u != unit_index or (cursor is None and not index):
                    cursor, index = piece["cursor"], piece["index"]
            source = self._files.source(unit.file)
            blocks = self._format.blocks(source, unit.part, unit.parts, cursor, self.errors)
            try:
                read_any = cursor is not None  # a resume starts past the unit's start
                while True:
                    skipped_before = self.errors.tally()
                    try:
                        records, after = next(blocks)
                    except StopIteration:
                        break
                    except (OSError, BadRecordError) as error:
                        # Missing, unreadable, failing after retries, or corrupt compressed data:
                        # the rest of this file cannot be read; raise, or count the loss and go on.
                        self._lose(error, read_any)
                        break
                    read_any = True
                    if index and index >= len(records):  # only a resumed first block has an index
                        raise InvalidStateError(
                            "index",
                            f"an index below {len(records)} (the records of the block at "
                            f"cursor {cursor} of {source.url})",
                            index,
                        )
                    if one:  # a record that was read but not delivered before a topology change
                        it = iter(records[index : index + 1])
                        self._at = _Place(u, cursor, 0, skipped_before, it, 1, None, first=index)
                        yield it
                        break
                    it = positioned_iterator(records, index)
                    self._at = _Place(u, cursor, index, skipped_before, it, len(records), after)
                    index = 0
                    yield it
                    cursor = after
                    if after is None:
                        break
            finally:
                # The format's open file closes now, when the reader closes or moves on, on
                # every Python: not whenever the garbage collector reaches the generator
                # (on 3.13 it held a stream's watchdog thread past close()).
                close = getattr(blocks, "close", None)
                if close is not None:
                    close()
            # Past this unit: skips counted while finishing it must not be counted again.
            self._at = _Place(u + 1, None, 0, self.errors.tally())
            cursor, index = None, 0

    def _lose(self, error: Exception, read_any: bool) -> None:
        """Raise, or count the loss of a file (nothing of it read) or of the rest of one.

        What it held is unknown here (the storage failed, not the format): no
        size query is made of a file that just failed, whose server may be down.
        """
        self.errors.lose(error, whole_file=not read_any)

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        unit, cursor, index, tally = self._at.resume_point(self.errors.tally())
        # "file" and "part" say which data the position is in (for reading and for a
        # future resume on another topology); "unit" indexes this consumer's plan.
        where = self._units[unit] if unit < len(self._units) else None
        state = {
            "unit": unit,
            "file": None if where is None else where.file,
            "part": None if where is None else [where.part, where.parts],
            "cursor": cursor,
            "index": index,
            "skipped": tally[0],
            "listing": self._files.listing_state(),
        }
        lost = ErrorPolicy.lost_state(tally)
        if lost is not None:  # only after a lost file or range: other states stay as they were
            state["lost"] = lost
        return state

    def validate_state(self, state: Any, path: str = "node") -> None:
        """Refuse a state whose unit, file, cursor or counts this reader could not resume."""
        validate_reader(self._files, self._format, self._consumer_units()[0], state, path)

    # ----- elastic resume (nodes.elastic) ---------------------------------------------------
    def validate_plan(self, plan: Any, path: str) -> None:
        el.check_records(plan, path, len(self._files.urls))
        for i, piece in enumerate(plan):
            if piece["cursor"] is not None:
                source = self._files.source(piece["file"])
                part, parts = piece["part"]
                check_cursor(
                    self._format, source, piece["cursor"], part, parts, f"{path}[{i}].cursor"
                )

    def last_origin(self) -> el.Origin:
        at = self._at
        index = at.first + list_iterator_position(at.records, at.length) - 1
        piece = unit_piece(self._units[at.unit], at.cursor, index, one=True)
        if self._plan is not None and self._plan[at.unit]["one"]:  # keep its output selection
            piece = el.reranged_record(piece, self._plan[at.unit])
        return self.place, piece  # type: ignore[return-value]

    def untouched(self) -> list[el.Piece]:
        """The rest of this consumer's units (all of them before a reset), from its cursor."""
        units, plan = self._consumer_units()
        pieces = plan if plan is not None else [unit_piece(unit) for unit in units]
        if not self._was_reset:
            return list(pieces)
        unit, cursor, index, _ = self._at.resume_point(self.errors.tally())
        if unit >= len(pieces):
            return []
        current = pieces[unit]
        if cursor is not None or index:
            current = {**current, "cursor": cursor, "index": index}
        return [current, *pieces[unit + 1 :]]

    def close(self) -> None:
        if self._gen is not None:
            self._gen.close()  # type: ignore[attr-defined]
            self._gen = None


@dataclass
class _Place:
    """Where a reader is: a fixed position, or the block it is handing records out of."""

    unit: int
    cursor: Cursor  # where the block starts
    index: int  # records of the block returned before it was (re)entered
    skipped_before: Tally  # the skip counters before the block was read
    records: Iterator[Any] | None = None  # the block's records, shared with the consumer
    length: int = 0
    after: Cursor = None  # where the next block starts; None: the unit ends with this one
    first: int = 0  # the index in the block of records[0] (a single record handed out)

    def resume_point(self, skipped_now: Tally) -> tuple[int, Cursor, int, Tally]:
        """``(unit, cursor, index, skip counters)`` from which a reset continues exactly."""
        if self.records is None:
            return self.unit, self.cursor, self.index, self.skipped_before
        index = list_iterator_position(self.records, self.length)
        if index < self.length:
            return self.unit, self.cursor, self.first + index, self.skipped_before
        if self.after is not None:  # the block is used up: point at the next one
            return self.unit, self.after, 0, skipped_now
        return self.unit + 1, None, 0, skipped_now
