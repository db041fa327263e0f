"""Pieces of remaining work: what they are, how to cut and read them, how to check them.

See :mod:`nodes.elastic` for the vocabulary (source, piece, origin, work, plan).
"""

from __future__ import annotations

import heapq
import math
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
    check_disjoint(pieces, path)


#: A piece of at most this many positions is compared with the others position by position.
_FEW = 32


def check_disjoint(pieces: list[Piece], path: str) -> None:
    """Refuse two positions pieces (checked one by one already) that hold one position: its
    item would be read twice. Two pieces may share a position when both select outputs of
    it (of the ``flat_map`` above the source) that do not overlap.

    A sweep over the pieces by start: each is compared with the pieces still open there,
    grouped by step and residue, so the interleaved strides of a deal cost no pairwise
    comparison.

    >>> check_disjoint([positions(0, 10, 2), positions(1, 9, 2), positions(10, 12)], "p")
    >>> check_disjoint([positions(0, 10, 2), positions(3, 7)], "p")
    Traceback (most recent call last):
    ...
    nodes.errors.InvalidStateError: invalid state at p[1].range: expected positions no other \
piece holds (piece 0 holds position 4), found [3, 7, 1]...
    """
    order = sorted(range(len(pieces)), key=lambda i: pieces[i]["range"][0])
    open_: dict[int, dict[int, dict[int, float]]] = {}  # step -> residue -> {piece: stop}
    ends: list[tuple[float, int]] = []  # (stop, piece) of the open pieces
    for i in order:
        start, stop, step = pieces[i]["range"]
        while ends and ends[0][0] <= start:
            _, j = heapq.heappop(ends)
            first, _, every = pieces[j]["range"]
            del open_[every][first % every][j]
        for every, residues in open_.items():
            for j, position in _meeting(start, stop, step, every, residues):
                if not _apart(pieces[i], pieces[j]):
                    raise InvalidStateError(
                        f"{path}[{i}].range",
                        f"positions no other piece holds (piece {j} holds position {position})",
                        pieces[i]["range"],
                    )
        end = math.inf if stop is None else stop
        open_.setdefault(step, {}).setdefault(start % step, {})[i] = end
        heapq.heappush(ends, (end, i))


def _meeting(
    start: int, stop: int | None, step: int, every: int, residues: dict[int, dict[int, float]]
) -> Iterator[tuple[int, int]]:
    """``(piece, position)`` for the open pieces of step ``every`` (each began at or before
    ``start`` and ends after it) that hold a position of ``range(start, stop, step)``."""
    if every == step:  # the same stride: those of start's residue hold start itself
        for j in residues.get(start % every, {}):
            yield j, start
        return
    if stop is not None and (stop - start) // step <= _FEW:
        for position in range(start, stop, step):
            for j, end in residues.get(position % every, {}).items():
                if position < end:
                    yield j, position
        return
    g = math.gcd(step, every)
    for residue, open_pieces in residues.items():
        if (residue - start) % g:
            continue  # no position of one is a position of the other
        # the first position >= start of both strides (start + step * t = residue mod every)
        modulus = every // g
        t = ((residue - start) // g * pow(step // g, -1, modulus)) % modulus
        position = start + step * t
        if stop is not None and position >= stop:
            continue
        for j, end in open_pieces.items():
            if position < end:
                yield j, position


def _apart(one: Piece, other: Piece) -> bool:
    """Whether both pieces select outputs of their items, and none of the same."""
    if not (has_selection(one) and has_selection(other)):
        return False
    a, b = _outputs_of(one), _outputs_of(other)
    if isinstance(a, set) and isinstance(b, set):
        return not a & b
    if isinstance(a, set):
        a, b = b, a
    lo, hi = a  # type: ignore[misc]
    if isinstance(b, set):
        return not any(lo <= output < hi for output in b)
    return hi <= b[0] or b[1] <= lo


def _outputs_of(piece: Piece) -> set[int] | tuple[float, float]:
    if "from" in piece:
        return (piece["from"], piece.get("upto", math.inf))
    return set(piece["outputs"])


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
