"""Remaining work: gathering it, coalescing its pieces, and dealing it to consumers.

See :mod:`nodes.elastic` for the vocabulary (source, piece, origin, work, plan).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import Any

from nodes.elastic.pieces import (
    POSITIONS,
    RECORDS,
    STREAM,
    Piece,
    Work,
    cut,
    has_selection,
    piece_length,
    positions,
)


def coalesce(pieces: Iterable[Piece]) -> list[Piece]:
    """Positions pieces merged where they join; the one-item pieces with selections kept.

    The untouched shares of ``C`` consumers dealt round-robin (``c, c + C, ...``)
    become one range from the furthest of them to the end plus one short
    range per consumer that lags behind it, so their number does not grow
    with the consumers that finished. Ranges of one step that continue each
    other become one, and so do single positions that extend a range: a
    share cut into runs and dealt comes back as the ranges it was cut from.
    """
    pieces = list(pieces)
    special = [p for p in pieces if "outputs" in p or "from" in p]
    plain = [p for p in pieces if not ("outputs" in p or "from" in p) and piece_length(p) != 0]
    plain = _fold_residues(plain)
    singles = sorted({p["range"][0] for p in plain if piece_length(p) == 1})
    ranges, _ = _join_ranges([list(p["range"]) for p in plain if piece_length(p) != 1])
    singles = _attach_all(ranges, singles)
    ranges = [r for r in ranges if r[3:] != ["gone"]]
    runs: list[list[int]] = []
    for value in singles:  # runs of single positions become ranges of step 1
        if runs and runs[-1][1] == value:
            runs[-1][1] = value + 1
        else:
            runs.append([value, value + 1])
    out = [positions(r[0], r[1], r[2]) for r in ranges]
    out += [positions(start, stop) for start, stop in runs]
    out.sort(key=lambda p: (p["range"][0], p["range"][2]))
    return special + out


def _join_ranges(ranges: list[list[Any]]) -> tuple[list[list[Any]], bool]:
    """Ranges of one step where one ends where the next starts, joined."""
    ranges = sorted(ranges, key=lambda r: (r[2], r[0]))
    by_end: dict[tuple[int, int], list[Any]] = {}
    out, changed = [], False
    for r in ranges:
        before = by_end.pop((r[2], r[0]), None)
        if before is not None:
            before[1] = r[1]
            changed = True
            if r[1] is not None:
                by_end[(r[2], r[1])] = before
            continue
        out.append(r)
        if r[1] is not None:
            by_end[(r[2], r[1])] = r
    return out, changed


def _attach_all(ranges: list[list[Any]], singles: list[int]) -> list[int]:
    """Extend ranges by the single positions right after (or before) them, joining ranges
    that then meet; the singles that extend none are returned. Dict lookups per single and
    step, so tens of thousands of buffered positions coalesce in milliseconds."""
    by_stop = {(r[2], r[1]): r for r in ranges if r[1] is not None}
    by_before = {(r[2], r[0] - r[2]): r for r in ranges}
    steps = sorted({r[2] for r in ranges})
    left = []
    for value in singles:
        for step in steps:
            r = by_stop.pop((step, value), None)
            if r is not None:  # value continues r: extend it, then join the range after it
                r[1] = value + step
                after = by_before.pop((step, value), None)
                if after is not None and after is not r:
                    del by_before[(step, r[0] - step)]
                    by_stop.pop((step, after[1]), None)
                    r[1] = after[1]
                    after.append("gone")
                    by_before[(step, r[0] - step)] = r
                if r[1] is not None:
                    by_stop[(step, r[1])] = r
                break
            r = by_before.pop((step, value), None)
            if r is not None:  # value comes right before r
                r[0] = value
                by_before[(step, value - step)] = r
                break
        else:
            left.append(value)
    return left


def _fold_residues(pieces: list[Piece]) -> list[Piece]:
    """Ranges of one step ``S``, one per residue mod ``S``, that end together: a shared tail.

    ``range(t_r, n, S)`` for every residue ``r`` covers ``range(T, n)`` for
    ``T = max(t_r)``, plus ``range(t_r, T, S)`` each (the consumers that lag).
    """
    groups: dict[tuple[int, bool], list[Piece]] = {}
    out = []
    for piece in pieces:
        start, stop, step = piece["range"]
        if step > 1:
            groups.setdefault((step, stop is None), []).append(piece)
        else:
            out.append(piece)
    for (step, open_ended), group in groups.items():
        residues = {p["range"][0] % step for p in group}
        lasts = [] if open_ended else [p["range"][1] - step for p in group]
        together = open_ended or min(lasts) > max(lasts) - step
        if len(group) != step or len(residues) != step or not together:
            out.extend(group)
            continue
        tail = max(p["range"][0] for p in group)
        end = None if open_ended else max(lasts) + 1
        for p in group:
            start = p["range"][0]
            if start < tail:
                out.append(positions(start, tail if end is None else min(tail, end), step))
        if end is None or tail < end:
            out.append(positions(tail, end, 1))
    return out


def deal(work: Work, consumers: int) -> list[dict[str, list[Piece]]]:
    """Each of ``consumers`` consumers' plan: a pure function of the work and their number.

    Positions are cut in contiguous runs of equal size (the items read but not
    delivered first); an open-ended stream tail is dealt round-robin; records
    of single items are cut in runs, the rests of files and parts dealt
    round-robin, one piece each, in order.

    >>> work = {"s": {"kind": "positions", "pieces": [{"range": [0, 10, 1]}]}}
    >>> [plan["s"] for plan in deal(work, 3)]
    [[{'range': [0, 3, 1]}], [{'range': [3, 6, 1]}], [{'range': [6, 10, 1]}]]
    """
    plans: list[dict[str, list[Piece]]] = [{} for _ in range(consumers)]
    for place, entry in sorted(work.items()):
        kind, pieces = entry["kind"], entry["pieces"]
        if kind in (POSITIONS, STREAM):
            shares = _deal_positions(pieces, consumers)
        else:
            shares = _deal_records(pieces, consumers, splittable=kind == RECORDS)
        for plan, share in zip(plans, shares):
            plan[place] = share
    return plans


def _deal_positions(pieces: list[Piece], consumers: int) -> list[list[Piece]]:
    finite = [p for p in pieces if piece_length(p) is not None]
    open_ended = [p for p in pieces if piece_length(p) is None]
    total = sum(piece_length(p) or 0 for p in finite)
    shares: list[list[Piece]] = [[] for _ in range(consumers)]
    bounds = [total * j // consumers for j in range(consumers + 1)]
    seen = 0
    for piece in finite:
        length = piece_length(piece) or 0
        j = max(0, bisect_right(bounds, seen) - 1)  # the first consumer the piece reaches
        while j < consumers and bounds[j] < seen + length:
            lo, hi = max(bounds[j], seen), min(bounds[j + 1], seen + length)
            if lo < hi:
                shares[j].append(cut(piece, lo - seen, hi - seen))
            j += 1
        seen += length
    for piece in open_ended:
        start, _, step = piece["range"]
        for j in range(consumers):
            shares[j].append(positions(start + j * step, None, step * consumers))
    return shares


def _deal_records(pieces: list[Piece], consumers: int, *, splittable: bool) -> list[list[Piece]]:
    singles = [p for p in pieces if p.get("one")]
    rests = [p for p in pieces if not p.get("one")]
    if splittable and len(rests) < consumers:
        rests = split_whole_files(rests, consumers)
    shares: list[list[Piece]] = [[] for _ in range(consumers)]
    for j in range(consumers):
        shares[j].extend(
            singles[len(singles) * j // consumers : len(singles) * (j + 1) // consumers]
        )
    for i, piece in enumerate(rests):
        shares[i % consumers].append(piece)
    return shares


def split_whole_files(rests: list[Piece], consumers: int) -> list[Piece]:
    """Untouched whole files split into parts, so that fewer files than consumers still give
    every consumer a share: part ``j`` of ``k`` of a whole file is what a fresh epoch on
    ``k`` consumers would read of it, in every splittable format."""
    whole = [p for p in rests if p["part"] == [0, 1] and p["cursor"] is None and not p["index"]]
    if not whole:
        return rests
    k = -(-(consumers - (len(rests) - len(whole))) // len(whole))
    if k <= 1:
        return rests
    out = []
    for piece in rests:
        if piece in whole:
            out.extend({**piece, "part": [j, k]} for j in range(k))
        else:
            out.append(piece)
    return out


def add_work(
    work: Work, place: str, kind: str, pieces: Iterable[Piece], *, first: bool = False
) -> None:
    """Add ``pieces`` of the source at ``place`` to ``work`` (``first``: items read but not
    delivered, before the others, and counted as ``"held"``)."""
    entry = work.setdefault(place, {"kind": kind, "pieces": [], "held": 0})
    pieces = list(pieces)
    if first:
        entry["pieces"][:0] = pieces
        entry["held"] += len(pieces)
    else:
        entry["pieces"].extend(pieces)


def normalize(work: Work) -> Work:
    """``work`` with positions coalesced and pieces in a canonical order (see :func:`coalesce`)."""
    out: Work = {}
    for place in sorted(work):
        kind, pieces = work[place]["kind"], work[place]["pieces"]
        if kind in (POSITIONS, STREAM):
            pieces = coalesce(pieces)
        else:
            # Records with a selection first: a flat_map counts them off as its first parents.
            singles = sorted(
                (p for p in pieces if p.get("one")),
                key=lambda p: (not has_selection(p), _record_key(p)),
            )
            rests = sorted((p for p in pieces if not p.get("one")), key=_record_key)
            pieces = singles + rests
        out[place] = {"kind": kind, "pieces": pieces, "held": work[place].get("held", 0)}
    return out


def _record_key(piece: Piece) -> tuple[Any, ...]:
    cursor = piece.get("cursor")
    return (piece["file"], piece["part"], cursor is not None, repr(cursor), piece.get("index", 0))


def count_items(work: Work) -> dict[str, Any]:
    """What ``work`` holds, for people: per kind, items (positions) or pieces (records)."""
    out: dict[str, Any] = {}
    for place, entry in work.items():
        pieces = entry["pieces"]
        lengths = [piece_length(p) for p in pieces]
        out[place] = {
            "kind": entry["kind"],
            "pieces": len(pieces),
            "items": None if any(n is None for n in lengths) else sum(lengths),  # type: ignore[arg-type]
        }
    return out


def merge_work(works: Iterable[Work]) -> Work:
    """The union of several consumers' remaining work, normalized."""
    total: Work = {}
    for work in works:
        for place, entry in work.items():
            add_work(total, place, entry["kind"], entry["pieces"])
            total[place]["held"] += entry.get("held", 0)
    return normalize(total)


def expand(work: Work, stream_limit: int = 1 << 20) -> dict[str, list[Any]]:
    """``work`` as a sorted list of items per source: what it holds, whatever its pieces.

    Positions become ``(position, selection)`` (an open-ended stream tail up to
    ``stream_limit``); records stay pieces (a file's records are only known
    by reading it). Two descriptions of the same remaining work expand
    equally, however they were cut and coalesced: for tests and tools, not
    for large data.
    """
    out: dict[str, list[Any]] = {}
    for place, entry in work.items():
        items: list[Any] = []
        for piece in entry["pieces"]:
            selection = {k: piece[k] for k in ("outputs", "from", "upto") if k in piece}
            if "range" in piece:
                start, stop, step = piece["range"]
                for position in range(start, stream_limit if stop is None else stop, step):
                    items.append((position, repr(sorted(selection.items()))))
            else:
                items.append(repr(sorted(piece.items())))
        out[place] = sorted(items, key=repr)
    return out
