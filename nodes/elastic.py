"""Resuming on another topology: an epoch's remaining work in canonical coordinates.

A checkpoint says where each consumer (rank x worker) stood. To resume on
another number of consumers, each consumer's position is turned into *work
that does not depend on the topology*, and that work is dealt again.

- A **source** is a node that deals data to consumers by itself and names its
  place in the recipe (``node.place``, the same on every topology):
  :class:`nodes.SequenceNode` (positions in the epoch's permutation of a
  random-access source), :class:`nodes.FileReaderNode` (records of files and
  file parts), :class:`nodes.FileListNode` (whole files) and
  :class:`nodes.ShardNode` (positions in the stream that every consumer reads).
- A **piece** is a run of one source's remaining work, as plain data:

  * ``{"range": [start, stop, step]}``: positions (``stop`` is ``None`` for
    the open end of a stream);
  * ``{"file": f, "part": [part, parts], "cursor": c, "index": i, "one": b}``:
    records of part ``part`` of ``parts`` of file ``f`` (an index into the
    listing), from the block starting at ``c`` (``None``: the part's start),
    record ``i`` of it; ``one``: only that record.

  A piece of one item may also say which outputs of the ``flat_map`` above
  the source remain (``"outputs": [i, ...]`` or ``"from": k``).
- **Remaining work** is ``{place: {"kind": kind, "pieces": [...]}}``; the
  items read but not delivered (shuffle buffers, a ``flat_map``'s current
  item, a parallel map's tasks) are pieces of one item, first; the untouched
  rest follows, coalesced. Its size grows with those, never with the data.
- A **plan** is one consumer's share of it (:func:`deal`): a source that
  finds a plan for its place in ``ctx.plans`` reads that instead of its own
  share of the epoch.

How a node takes part is its :attr:`nodes.Node.elastic`: ``"source"``;
``"transparent"`` (it holds no item between two ``next`` calls, and its state
is its input's position: map, filter, batch, prefetch); ``"buffer"`` (it holds
items and lists where they came from: :meth:`nodes.Node.in_flight`); ``None``:
no exact answer, and a resume on another topology is refused naming the step.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from nodes.errors import StateMismatchError

if TYPE_CHECKING:
    from nodes.base import Node, State

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


class ElasticResumeError(StateMismatchError):
    """A checkpoint cannot resume exactly on another topology: a step has no exact answer.

    The message names the step and what would work instead (resume on the
    saved topology, or a recipe whose steps can be re-dealt).
    """


def refuse(node: Node[Any], why: str) -> ElasticResumeError:
    """The error for ``node`` that cannot take part in a resume on another topology."""
    step = getattr(node, "kind", type(node).__name__)
    return ElasticResumeError(
        f"this checkpoint cannot resume on another topology: step '{step}' {why}. "
        "Resume it with the world size and num_workers it was saved with (that stays exact), "
        "or let the epoch end there and change the topology at the epoch boundary."
    )


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
    from bisect import bisect_right

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
        ranges.append(_count_from(start, step) if stop is None else range(start, stop, step))
    return heapq.merge(*ranges)


def _count_from(start: int, step: int) -> Iterator[int]:
    value = start
    while True:
        yield value
        value += step


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
    ranges = [list(p["range"]) for p in plain if piece_length(p) != 1]
    changed = True
    while changed:
        ranges, changed = _join_ranges(ranges)
        left = []
        for value in singles:
            if _attach(ranges, value):
                changed = True
            else:
                left.append(value)
        singles = left
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


def _attach(ranges: list[list[Any]], value: int) -> bool:
    """Extend a range by ``value`` where it is the position right after or before it."""
    for r in sorted(ranges, key=lambda r: r[2]):
        if r[1] == value:
            r[1] = value + r[2]
            return True
        if r[0] - r[2] == value:
            r[0] = value
            return True
    return False


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


def check_positions(pieces: Any, path: str, end: int | None) -> None:
    """Refuse a plan's positions pieces outside ``[0, end)`` (``end=None``: a stream)."""
    from nodes.errors import InvalidStateError
    from nodes.state_checks import check_int, expect_keys

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
    from nodes.errors import InvalidStateError
    from nodes.state_checks import check_int, expect_bool, expect_int, expect_keys

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
    from nodes.errors import InvalidStateError
    from nodes.state_checks import check_int

    for key in ("from", "upto"):
        if key in piece:
            check_int(piece[key], f"{path}.{key}", 0)
    outputs = piece.get("outputs", [])
    if not isinstance(outputs, list) or len(set(map(repr, outputs))) != len(outputs):
        raise InvalidStateError(f"{path}.outputs", "a list of distinct output indices", outputs)
    for j, value in enumerate(outputs):
        check_int(value, f"{path}.outputs[{j}]", 0)


# ----- dealing --------------------------------------------------------------------------------


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
        for j in range(consumers):
            lo, hi = max(bounds[j], seen), min(bounds[j + 1], seen + length)
            if lo < hi:
                shares[j].append(cut(piece, lo - seen, hi - seen))
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
        rests = _split_whole_files(rests, consumers)
    shares: list[list[Piece]] = [[] for _ in range(consumers)]
    for j in range(consumers):
        shares[j].extend(
            singles[len(singles) * j // consumers : len(singles) * (j + 1) // consumers]
        )
    for i, piece in enumerate(rests):
        shares[i % consumers].append(piece)
    return shares


def _split_whole_files(rests: list[Piece], consumers: int) -> list[Piece]:
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


# ----- one consumer's remaining work ----------------------------------------------------------


def sources_and_nodes(root: Node[Any]) -> Iterator[Node[Any]]:
    """Every node of ``root``'s graph that takes part, down to the sources (not below them)."""
    yield root
    if root.elastic == "source":
        return
    for node in root.inputs:
        yield from sources_and_nodes(node)


_NO_HOOK = (
    'declares no elastic hook: set the class attribute elastic = "transparent" on a node '
    "that holds no item between two next() calls and whose reset(state) puts its input right "
    "after the last item it returned, or implement in_flight() and last_origin() "
    "(see nodes.Node.elastic)"
)


def check_graph(root: Node[Any]) -> None:
    """Refuse (:class:`ElasticResumeError`) a graph with a step that has no exact answer."""
    for node in sources_and_nodes(root):
        if node.elastic is None:
            raise refuse(node, node.elastic_refusal or _NO_HOOK)


def consumer_work(root: Node[Any], state: State | None) -> Work:
    """The remaining work of the consumer whose graph is ``root``, at ``state``.

    Resets ``root`` to ``state`` in *conversion* mode (background threads run
    inline, buffers note where their items came from), then asks every
    buffer what it holds and every source what it has not read. Closes the
    graph after.
    """
    check_graph(root)
    nodes = list(sources_and_nodes(root))
    for node in nodes:
        node.begin_conversion()
    work: Work = {}
    try:
        root.reset(state)
        live = {id(n) for n in live_nodes(root)}
        for node in nodes:
            if node.elastic == "source":
                untouched = node.untouched() if id(node) in live else []
                add_work(work, node.place, node.elastic_kind, untouched)
        for node in nodes:
            if id(node) in live:
                for origin in node.in_flight():
                    for place, piece in item_origins(origin):
                        add_work(work, place, work[place]["kind"], [piece], first=True)
    finally:
        root.close()
    return work


def live_nodes(root: Node[Any]) -> Iterator[Node[Any]]:
    """The nodes whose work is not done: a concat's finished inputs are left out."""
    yield root
    if root.elastic == "source":
        return
    for node in root.live_inputs():
        yield from live_nodes(node)


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
