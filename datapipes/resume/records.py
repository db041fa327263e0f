"""Loader states written out: a rank's state, a whole job's, and the records inside them.

The layout (plain data: json and ``torch.load(weights_only=True)`` safe)::

    {"version": 5, "fingerprint": "...", "steps": [...], "seed": 0,
     "topology": {"world_size": 2, "num_workers": 4, "even_batches": True},
     "ranks": {"1": {"epoch": 3, "node": "<this rank's node states, as JSON>",
                     "digest": "<16 hex digits of the node JSON's sha256>",
                     "graph": "<the shape of this rank's built graph, as JSON>"}}}

What all ranks share sits at the top; each rank's position sits under its own
key in ``ranks``, with the node states as one JSON string, so in a
``torch.distributed.checkpoint`` save every rank writes its own position. A
rank's entry may also hold ``"plans"`` (its consumers' shares after a resume on
another topology), ``"dispatch"`` (the units its consumers claimed under
dynamic dispatch) and ``"dropped"`` (final drop counts). A merged state keeps
ranks at an epoch's start as ranges (``"idle"``) and may hold the epoch's
``"remaining"`` work, worked out once.

``"digest"`` guards the node states against damage after the save: a moved
position cannot be told from a real one by looking at it, so without it such
damage would resume quietly at the wrong place. It is a checksum, not a
signature: the node states' own checks (``Node.validate_state``) stand behind it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from datapipes.resume.model import JobSetup, JobState, RankEntry
from datapipes.resume.parse import STATE_VERSION
from datapipes.resume.schema import node_digest


def _text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def dispatch_record(
    *,
    epoch: int,
    key: str,
    consumers: int,
    unit_items: int,
    work: Any,
    claims: Mapping[int, Mapping[str, list[int]]],
) -> dict[str, Any]:
    """A rank's ``"dispatch"`` record: the units each of its consumers claimed of ``epoch``
    (``work``: the work handed out, ``None`` for the epoch's whole work)."""
    return {
        "epoch": epoch,
        "key": key,
        "consumers": consumers,
        "unit_items": unit_items,
        "work": work,
        "claims": {str(c): {p: list(u) for p, u in places.items()} for c, places in claims.items()},
    }


def rank_state(
    *,
    fingerprint: str,
    steps: Sequence[str],
    setup: JobSetup,
    rank: int,
    epoch: int,
    node: Any,
    graph: str | None = None,
    plans: tuple[int, list[Any]] | None = None,
    dispatch: dict[str, Any] | None = None,
    dropped: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Loader state (the layout in the module doc) of ``rank`` at ``epoch``.

    ``node``: the rank's node state (``None``: at the start of ``epoch``); ``graph``: the
    JSON text of its graph record; ``plans``: ``(epoch, its consumers' plans)``;
    ``dispatch``: a :func:`dispatch_record`; ``dropped``: ``{"epoch", "counts"[, "carried"]}``.

    >>> state = rank_state(fingerprint="f", steps=["dp.range(3)"], setup=JobSetup(1, 0, 0),
    ...                    rank=0, epoch=2, node={"position": 1})
    >>> state["ranks"]["0"]["node"], state["ranks"]["0"]["digest"]
    ('{"position":1}', 'de5b3165bc431989')
    """
    text = None if node is None else _text(node)
    entry: dict[str, Any] = {
        "epoch": epoch,
        "node": text,
        "digest": None if text is None else node_digest(text),
        "graph": graph,
    }
    if plans is not None:
        plans_text = _text({"epoch": plans[0], "consumers": plans[1]})
        entry["plans"] = {"text": plans_text, "digest": node_digest(plans_text)}
    if dispatch is not None:
        entry["dispatch"] = dispatch
    if dropped:
        entry["dropped"] = dropped
    return {
        "version": STATE_VERSION,
        "fingerprint": fingerprint,
        "steps": list(steps),
        "seed": setup.seed,
        "topology": setup.topology(),
        "ranks": {str(rank): entry},
    }


def at_epoch_start(state: dict[str, Any], rank: int) -> bool:
    """Whether ``state``, as :func:`rank_state` just wrote it, holds ``rank`` at its epoch's
    start (no node state): read from the layout, without parsing the state again.

    >>> at_epoch_start(rank_state(fingerprint="f", steps=[], setup=JobSetup(1, 0, 0),
    ...                           rank=0, epoch=1, node=None), 0)
    True
    """
    return state["ranks"][str(rank)]["node"] is None


def _entry(entry: RankEntry) -> dict[str, Any]:
    """The raw form of a parsed entry, as :func:`rank_state` writes it."""
    dispatch = None
    if entry.dispatch is not None:
        record = entry.dispatch
        dispatch = dispatch_record(
            epoch=record.epoch,
            key=record.key,
            consumers=record.consumers,
            unit_items=record.unit_items,
            work=record.work,
            claims=record.claims,
        )
    dropped = None
    if entry.dropped is not None:
        dropped = {"epoch": entry.dropped.epoch, "counts": dict(entry.dropped.counts)}
        if entry.dropped.carried:
            dropped["carried"] = dict(entry.dropped.carried)
    plans = None
    if entry.plans is not None:
        plans = (entry.plans.epoch, list(entry.plans.consumers))
    state = rank_state(
        fingerprint="",
        steps=(),
        setup=JobSetup(1, 0, 0),
        rank=entry.rank,
        epoch=entry.epoch,
        node=entry.node,
        graph=entry.graph,
        plans=plans,
        dispatch=dispatch,
        dropped=dropped,
    )
    return state["ranks"][str(entry.rank)]


def job_state(state: JobState, *, idle_as_ranges: bool = True) -> dict[str, Any]:
    """The raw Loader state of a parsed (or merged) :class:`JobState`.

    ``idle_as_ranges``: ranks at an epoch's start with nothing else to say (those that
    finished their share, typically) are kept as ranges, so a merged state's size does
    not grow with them. The graph record is kept once (every rank built the same shape).
    """
    out: dict[str, Any] = {
        "version": STATE_VERSION,
        "fingerprint": state.fingerprint,
        "steps": list(state.steps),
        "seed": state.setup.seed,
        "topology": state.setup.topology(),
    }
    kept: dict[str, Any] = {}
    idle: dict[int, list[int]] = {}
    keeper = next((rank for rank, e in state.ranks.items() if e.graph is not None), None)
    for rank, entry in state.ranks.items():
        if rank != keeper:  # the graph record is kept once: every rank built the same shape
            entry = dataclasses.replace(entry, graph=None)
        if idle_as_ranges and entry.is_idle:
            idle.setdefault(entry.epoch, []).append(rank)
            continue
        raw = _entry(entry)
        if raw["graph"] is None:
            del raw["graph"]
        kept[str(rank)] = raw
    if not kept:  # one entry at least, as every state has
        epoch = min(idle)
        first = idle[epoch].pop(0)
        kept[str(first)] = {"epoch": epoch, "node": None, "digest": None}
    out["ranks"] = kept
    ranges = []
    for epoch in sorted(idle):
        spans: list[list[int]] = []
        for rank in sorted(idle[epoch]):
            if spans and spans[-1][1] == rank - 1:
                spans[-1][1] = rank
            else:
                spans.append([rank, rank])
        if spans:
            ranges.append({"epoch": epoch, "ranks": spans})
    if ranges:
        out["idle"] = ranges
    if state.remaining is not None:
        remaining = state.remaining
        text = _text(
            {"epoch": remaining.epoch, "work": remaining.work, "dropped": dict(remaining.dropped)}
        )
        out["remaining"] = {"text": text, "digest": node_digest(text)}
    return out
