"""Pieces of remaining work: what they are, how to cut and read them, how to check them.

See :mod:`nodes.elastic` for the vocabulary (source, piece, origin, work, plan).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterator
from itertools import count
from typing import Any

from nodes.errors import InvalidStateError
from nodes.state_checks import check_int, expect_bool, expect_int, expect_keys

Piece = dict[str, Any]
Origin = tuple[str, Piece]  # (the source's place, a piece of one item)

#: The "place" of a batch's origin: ``(BATCH, [the origins of its items])``.
BATCH = "<batch>"


def item_origins(origin: Any) -> list[Origin]:
    """The origins of the items behind ``origin`` (a batch's: each of its items')."""
    if origin[0] == BATCH:
        return [o for inner in origin[1] for o in item_origins(inner)]
    return [origin]


def has_selection(piece: Piece) -> bool:
    """Whether only some outputs of the ``flat_map`` above the source remain of ``piece``."""
    return "outputs" in piece or "from" in piece


Work = dict[str, dict[str, Any]]  # place -> {"kind": ..., "pieces": [...]}

#: The kinds of source, by how their pieces are dealt.
POSITIONS, STREAM, RECORDS, FILES = "positions", "stream", "records", "files"


# ----- pieces ---------------------------------------------------------------------------------


def positions(start: int, stop: int | None, step: int = 1) -> Piece:
    """A piece of positions ``range(start, stop, step)`` (``stop=None``: open-ended)."""
    if stop is not None:
        count = max(0, -(-(stop - start) // step))
        stop = start + count * step  # canonical: the stop right after the last position
        if count == 1:
            step = 1
            stop = start + 1
    return {"range": [start, stop, step]}


def piece_length(piece: Piece) -> int | None:
    """How many items a positions piece holds (``None``: open-ended or a records tail)."""
    if "range" in piece:
        start, stop, step = piece["range"]
        return None if stop is None else max(0, -(-(stop - start) // step))
    return 1 if piece.get("one") else None


def cut(piece: Piece, lo: int, hi: int | None) -> Piece:
    """Items ``lo`` to ``hi`` (exclusive; ``None``: to the end) of a positions piece."""
    start, stop, step = piece["range"]
    new_stop = stop if hi is None else start + hi * step
    if stop is not None and new_stop is not None:
        new_stop = min(new_stop, stop)
    out = positions(start + lo * step, new_stop, step)
    return _with_selection(out, piece)


def single(position: int, piece: Piece | None = None) -> Piece:
    """A piece of the one item at ``position``, keeping ``piece``'s output selection."""
    return _with_selection(positions(position, position + 1), piece or {})


def reranged(piece: Piece, start: int, stop: int | None, step: int) -> Piece:
    """``piece`` over other positions, keeping its output selection."""
    return _with_selection(positions(start, stop, step), piece)


def reranged_record(record: Piece, piece: Piece) -> Piece:
    """A record's piece with the output selection of the plan ``piece`` it was read from."""
    return _with_selection(record, piece)


def _with_selection(out: Piece, piece: Piece) -> Piece:
    if len(piece) > 1 or "range" not in piece:  # a plain range has nothing more to keep
        for key in ("outputs", "from", "upto"):
            if key in piece:
                out[key] = piece[key]
    return out


def select(piece: Piece, outputs: list[int]) -> Piece:
    """``piece`` (of one item) limited to these outputs of the ``flat_map`` above its source."""
    out = {k: v for k, v in piece.items() if k not in ("outputs", "from", "upto")}
    if outputs and outputs == list(range(outputs[0], outputs[0] + len(outputs))):
        out["from"] = outputs[0]  # the rest of the item's outputs: no list to keep
        out["upto"] = outputs[-1] + 1
    else:
        out["outputs"] = list(outputs)
    return out


def selected(piece: Piece, count: int) -> list[int]:
    """Which of ``count`` outputs of the ``flat_map`` above the source ``piece`` keeps."""
    if "from" in piece:
        return list(range(piece["from"], min(count, piece.get("upto", count))))
    if "outputs" in piece:
        return [i for i in piece["outputs"] if i < count]
    return list(range(count))


def position_at(pieces: list[Piece], starts: list[int], k: int) -> tuple[int, Piece]:
    """The position of item ``k`` of a positions plan, and the piece it is in."""
    i = bisect_right(starts, k) - 1
    piece = pieces[i]
    start, _, step = piece["range"]
    return start + (k - starts[i]) * step, piece


def plan_starts(pieces: list[Piece]) -> tuple[list[int], int]:
    """Each piece's first item number in a positions plan, and the plan's length."""
    starts, total = [], 0
    for piece in pieces:
        starts.append(total)
        total += piece_length(piece) or 0
    return starts, total


def rest_of_plan(pieces: list[Piece], k: int) -> list[Piece]:
    """The pieces of a positions plan after its first ``k`` items."""
    out, seen = [], 0
    for piece in pieces:
        length = piece_length(piece)
        if length is None:  # an open-ended stream tail
            out.append(cut(piece, max(0, k - seen), None))
            continue
        if seen + length > k:
            out.append(cut(piece, max(0, k - seen), length))
        seen += length
    return out


def stream_targets(pieces: list[Piece]) -> Iterator[int]:
    """The stream positions of a plan, in increasing order (pieces may interleave)."""
    ranges = []
    for piece in pieces:
        start, stop, step = piece["range"]
        ranges.append(count(start, step) if stop is None else range(start, stop, step))
    return heapq.merge(*ranges)


def check_positions(pieces: Any, path: str, end: int | None) -> None:
    """Refuse a plan's positions pieces outside ``[0, end)`` (``end=None``: a stream)."""

    if not isinstance(pieces, list):
        raise InvalidStateError(path, "a list of pieces", pieces)
    for i, piece in enumerate(pieces):
        where = f"{path}[{i}]"
        expect_keys(piece, where, {"range"}, optional={"outputs", "from", "upto"})
        bounds = piece["range"]
        if not isinstance(bounds, list) or len(bounds) != 3:
            raise InvalidStateError(f"{where}.range", "[start, stop, step]", bounds)
        start = check_int(bounds[0], f"{where}.range[0]", 0, None if end is None else end - 1)
        step = check_int(bounds[2], f"{where}.range[2]", 1)
        if bounds[1] is None and end is not None:
            raise InvalidStateError(f"{where}.range[1]", f"a stop <= {end}", None)
        if bounds[1] is not None:
            check_int(
                bounds[1], f"{where}.range[1]", start + 1, end if end is None else end + step - 1
            )
        _check_selection(piece, where)


def check_records(pieces: Any, path: str, files: int) -> None:
    """Refuse a plan's records pieces whose file, part or index cannot be in the listing."""

    if not isinstance(pieces, list):
        raise InvalidStateError(path, "a list of pieces", pieces)
    for i, piece in enumerate(pieces):
        where = f"{path}[{i}]"
        keys = {"file", "part", "cursor", "index", "one"}
        expect_keys(piece, where, keys, optional={"outputs", "from", "upto"})
        expect_int(piece, "file", where, 0, files - 1)
        part = piece["part"]
        if not isinstance(part, list) or len(part) != 2:
            raise InvalidStateError(f"{where}.part", "[part, parts]", part)
        parts = check_int(part[1], f"{where}.part[1]", 1)
        check_int(part[0], f"{where}.part[0]", 0, parts - 1)
        expect_int(piece, "index", where)
        expect_bool(piece, "one", where)
        _check_selection(piece, where)


def _check_selection(piece: Piece, path: str) -> None:

    for key in ("from", "upto"):
        if key in piece:
            check_int(piece[key], f"{path}.{key}", 0)
    outputs = piece.get("outputs", [])
    if not isinstance(outputs, list) or len(set(map(repr, outputs))) != len(outputs):
        raise InvalidStateError(f"{path}.outputs", "a list of distinct output indices", outputs)
    for j, value in enumerate(outputs):
        check_int(value, f"{path}.outputs[{j}]", 0)
