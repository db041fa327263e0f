"""Validation of a file reader's state: its unit in the plan, and its cursor in the file.

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

from nodes.errors import InvalidStateError
from nodes.readers.format import RecordFormat
from nodes.sources.files import FileSet, Unit, check_listing
from nodes.state_checks import (
    at,
    expect_int,
    expect_ints,
    expect_keys,
    expect_list,
    is_int,
)
from nodes.storage import SourceFile


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
    """Refuse a cursor that does not point where a block of ``source`` starts
    (:meth:`RecordFormat.check_cursor`; a format of the user's keeps its cursors opaque)."""
    fmt.check_cursor(source, cursor, path)
