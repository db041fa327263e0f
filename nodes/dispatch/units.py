"""Cutting one source's work for an epoch into the units that dynamic dispatch hands out.

A pure function of (the work, the number of consumers, the unit size), so
every process of a job computes the same list and a unit is named by its
index. Positions (a random-access source) are cut into contiguous runs of
about ``unit_items`` positions of the epoch's permutation; records are dealt
one file (or file part, or rest of a file) per unit, with whole files split
into parts when there are fewer than ``PARTS_PER_CONSUMER`` per consumer, so
that the last units of an epoch are small enough to balance; single records
(read but not delivered by an interrupted run) go in runs of ``unit_items``.
The rests of partly delivered items (a ``flat_map``'s outputs not delivered)
make unit 0 together.
"""

from __future__ import annotations

from nodes.elastic import POSITIONS, RECORDS, STREAM, Piece, deal
from nodes.elastic.pieces import has_selection, piece_length
from nodes.elastic.work import split_whole_files

#: Files are split into parts until each consumer has about this many units to claim.
PARTS_PER_CONSUMER = 4


def units_of(kind: str, pieces: list[Piece], consumers: int, unit_items: int) -> list[list[Piece]]:
    """The units of one source's work: each a list of pieces (a plan for that source).

    >>> units_of("positions", [{"range": [0, 10, 1]}], consumers=2, unit_items=4)
    [[{'range': [0, 3, 1]}], [{'range': [3, 6, 1]}], [{'range': [6, 10, 1]}]]
    """
    if kind == STREAM:
        raise ValueError("a shard() stream is read whole by every consumer: nothing to dispatch")
    # The rests of partly delivered items (a flat_map's outputs still to deliver) all go in
    # unit 0, first: the flat_map above applies them to the first parents of its first unit.
    selections = [p for p in pieces if has_selection(p)]
    if selections:
        rest = [p for p in pieces if not has_selection(p)]
        return [selections] + (units_of(kind, rest, consumers, unit_items) if rest else [])
    if kind == POSITIONS:
        total = sum(piece_length(p) or 0 for p in pieces)
        count = max(1, -(-total // max(1, unit_items)))
        shares = deal({"_": {"kind": kind, "pieces": pieces}}, count)
        return [share["_"] for share in shares if share["_"]]
    singles = [p for p in pieces if p.get("one")]
    rests = [p for p in pieces if not p.get("one")]
    if kind == RECORDS:  # splittable: whole files into parts, up to a few units per consumer
        rests = split_whole_files(rests, PARTS_PER_CONSUMER * consumers)
    runs = [singles[i : i + unit_items] for i in range(0, len(singles), max(1, unit_items))]
    return runs + [[piece] for piece in rests]
