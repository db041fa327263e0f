"""The schema of a Loader state's envelope: what :mod:`datapipes.resume.parse` checks first.

Shapes and types come before any comparison with the Loader (recipe,
topology, seed), so a corrupt state is refused as what it is, with the path
inside the state (``ranks["0"].epoch``) and what belongs there, rather than
as a raw ``KeyError`` or a confusing mismatch (a seed ``"0"`` is not ``0``).

>>> check_envelope({"version": 4, "fingerprint": "f", "steps": [], "seed": "0",
...                 "topology": {}, "ranks": {}})
Traceback (most recent call last):
...
nodes.errors.InvalidStateError: invalid state at seed: expected an int ...
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from nodes.elastic.pieces import check_positions, check_records
from nodes.errors import InvalidStateError
from nodes.state_checks import check_int, expect_bool, expect_int, expect_keys, is_int
from nodes.workers.bundles import AUTO

#: A bound for file indices where the listing is not known yet.
ANY_FILE = 1 << 62

_KEYS = ("version", "fingerprint", "steps", "seed", "topology", "ranks")
_TOPOLOGY = ("world_size", "num_workers", "even_batches")


def rank_path(rank: Any) -> str:
    """The path of a rank's entry: ``ranks["0"]``."""
    shown = json.dumps(rank) if isinstance(rank, str) else repr(rank)
    return f"ranks[{shown}]"


def check_envelope(state: dict[str, Any]) -> None:
    """Refuse (:class:`nodes.errors.InvalidStateError`) a Loader state (of this version)
    whose envelope has a missing, unknown or mistyped field; node states are parsed, not
    checked against a graph (that needs the recipe: ``Loader.load_state_dict``)."""
    expect_keys(state, "", _KEYS, optional={"idle", "remaining"})
    fingerprint = state["fingerprint"]
    if not isinstance(fingerprint, str):
        raise InvalidStateError("fingerprint", "the recipe's fingerprint (a string)", fingerprint)
    steps = state["steps"]
    if not isinstance(steps, list) or not all(isinstance(step, str) for step in steps):
        raise InvalidStateError("steps", "a list of strings (the recipe's steps)", steps)
    if not is_int(state["seed"]):
        raise InvalidStateError("seed", "an int (the Loader's seed)", state["seed"])
    topology = state["topology"]
    expect_keys(topology, "topology", _TOPOLOGY, optional={"items_per_transfer"})
    world_size = expect_int(topology, "world_size", "topology", 1)
    workers = expect_int(topology, "num_workers", "topology", 0)
    expect_bool(topology, "even_batches", "topology")
    if "items_per_transfer" in topology:  # recorded when not 1, and only with workers
        if not workers:
            where, value = "topology.items_per_transfer", topology["items_per_transfer"]
            raise InvalidStateError(where, "no entry (there are no workers)", value)
        per = topology["items_per_transfer"]
        if not (per == AUTO and type(per) is str) and not (is_int(per) and per >= 2):
            raise InvalidStateError("topology.items_per_transfer", "'auto' or an int >= 2", per)
    ranks = state["ranks"]
    idle = state.get("idle", [])
    if not isinstance(ranks, dict) or (not ranks and not idle):
        raise InvalidStateError("ranks", "a dict of ranks' positions, one at least", ranks)
    for rank, mine in ranks.items():
        check_rank(rank, mine, world_size)
    check_idle(idle, set(ranks), world_size)
    if "remaining" in state:
        check_remaining(state["remaining"])


def check_remaining(remaining: Any) -> None:
    """Refuse a merged state's ``"remaining"`` (its epoch's remaining work, worked out by
    ``merge_states``) that is not its JSON text with a matching digest and the right shape;
    each piece is checked again by the source that reads it."""
    expect_keys(remaining, "remaining", {"text", "digest"})
    check_digest(remaining["text"], remaining["digest"], "remaining.digest")
    value = node_state(remaining["text"], "remaining.text")
    path = "remaining.text"
    expect_keys(value, path, {"epoch", "work", "dropped"})
    expect_int(value, "epoch", path)
    check_work(value["work"], f"{path}.work")
    dropped = value["dropped"]
    if not isinstance(dropped, dict) or not all(
        isinstance(k, str) and is_int(n) and n >= 0 for k, n in dropped.items()
    ):
        raise InvalidStateError(f"{path}.dropped", "a dict of counts >= 0 by step", dropped)


def check_work(work: Any, path: str) -> None:
    """Refuse an epoch's work (``None``: the whole epoch) that is not ``{source place:
    {"kind", "pieces"}}`` with pieces of that kind, no position in two of them. Shapes
    here, before the work is dealt or cut into units; the bounds need the recipe, its
    data and listing (:func:`datapipes.resume.claims.check_work_bounds`)."""
    if work is not None and not (
        isinstance(work, dict)
        and all(
            isinstance(entry, dict)
            and isinstance(entry.get("pieces"), list)
            and entry.get("kind") in ("positions", "stream", "records", "files")
            for entry in work.values()
        )
    ):
        raise InvalidStateError(path, "null or {source: {kind, pieces}}", work)
    for place, entry in (work or {}).items():
        expect_keys(entry, f"{path}[{place!r}]", {"kind", "pieces"}, optional={"held"})
        if "held" in entry:  # items read but not delivered among the pieces (for inspect)
            expect_int(entry, "held", f"{path}[{place!r}]", 0)
        where = f"{path}[{place!r}].pieces"
        if entry["kind"] in ("positions", "stream"):
            check_positions(entry["pieces"], where, None)
        else:
            check_records(entry["pieces"], where, ANY_FILE)


def check_idle(idle: Any, ranks: set[str], world_size: int) -> None:
    """Refuse a merged state's ``"idle"`` (ranks at an epoch's start, kept as ranges:
    ``[{"epoch": 3, "ranks": [[0, 61]]}]``) that overlaps ``ranks`` or leaves the job."""
    if not isinstance(idle, list):
        raise InvalidStateError("idle", "a list of {epoch, ranks} groups", idle)
    for i, group in enumerate(idle):
        where = f"idle[{i}]"
        expect_keys(group, where, {"epoch", "ranks"})
        expect_int(group, "epoch", where, 0)
        spans = group["ranks"]
        if not isinstance(spans, list) or not all(
            isinstance(s, list) and len(s) == 2 and all(is_int(r) for r in s) for s in spans
        ):
            raise InvalidStateError(f"{where}.ranks", "a list of [first, last] rank ranges", spans)
        for first, last in spans:
            if not 0 <= first <= last < world_size or any(
                str(r) in ranks for r in range(first, last + 1)
            ):
                raise InvalidStateError(
                    f"{where}.ranks", f"ranks in [0, {world_size}) not in ranks", [first, last]
                )
            ranks |= {str(r) for r in range(first, last + 1)}


def check_rank(rank: Any, mine: Any, world_size: int) -> None:
    """Refuse a rank's entry of ``ranks`` that is not ``{"epoch", "node", "digest", "graph"}``
    as made, or whose node states do not match their digest."""
    path = rank_path(rank)
    if not isinstance(rank, str) or not rank.isdigit() or str(int(rank)) != rank:
        raise InvalidStateError(path, 'a rank written as a string ("0")', rank)
    check_int(int(rank), path, 0, world_size - 1)
    optional = {"graph", "plans", "dropped", "dispatch"}
    expect_keys(mine, path, {"epoch", "node", "digest"}, optional=optional)
    expect_int(mine, "epoch", path)
    check_digest(mine["node"], mine["digest"], f"{path}.digest")
    node_state(mine["node"], f"{path}.node")
    if "plans" in mine:
        check_plans(mine["plans"], f"{path}.plans")
    if "dropped" in mine:
        check_drops(mine["dropped"], f"{path}.dropped")
    if "dispatch" in mine:
        check_dispatch_record(mine["dispatch"], f"{path}.dispatch")
    graph = mine.get("graph")
    if graph is not None and not isinstance(graph, str):
        raise InvalidStateError(f"{path}.graph", "null or the graph record's JSON text", graph)


def check_dispatch_record(record: Any, path: str) -> None:
    """Refuse (``InvalidStateError`` naming the field) a damaged dispatch record."""
    expect_keys(record, path, {"epoch", "key", "consumers", "unit_items", "work", "claims"})
    expect_int(record, "epoch", path, 0)
    expect_int(record, "consumers", path, 1)
    expect_int(record, "unit_items", path, 1)
    if not isinstance(record["key"], str):
        raise InvalidStateError(f"{path}.key", "the run's key (a string)", record["key"])
    check_work(record["work"], f"{path}.work")
    claims = record["claims"]
    if not isinstance(claims, dict):
        raise InvalidStateError(f"{path}.claims", "claims by consumer (a dict)", claims)
    for consumer, places in claims.items():
        if not (consumer.isdigit() and int(consumer) < record["consumers"]):
            where = f"{path}.claims"
            raise InvalidStateError(where, f"consumers in [0, {record['consumers']})", consumer)
        if not isinstance(places, dict) or not all(
            isinstance(units, list) and all(type(u) is int and u >= 0 for u in units)
            for units in places.values()
        ):
            raise InvalidStateError(f"{path}.claims[{consumer!r}]", "unit indices by place", places)


def check_drops(dropped: Any, path: str) -> None:
    """Refuse a rank's ``"dropped"`` that is not ``{"epoch": e, "counts": {step: n >= 0}}``
    (with ``"carried"``, the part of them made before a resume on another topology)."""
    expect_keys(dropped, path, {"epoch", "counts"}, optional={"carried"})
    expect_int(dropped, "epoch", path)
    for key in ("counts", "carried"):
        counts = dropped.get(key, {})
        if not isinstance(counts, dict) or not all(
            isinstance(step, str) and is_int(n) and n >= 0 for step, n in counts.items()
        ):
            raise InvalidStateError(f"{path}.{key}", "a dict of counts >= 0 by step", counts)


def check_plans(plans: Any, path: str) -> None:
    """Refuse a rank's ``"plans"`` (its consumers' shares after a topology change) that is
    not ``{"text": JSON, "digest": its digest}`` with an epoch and one plan per consumer."""
    expect_keys(plans, path, {"text", "digest"})
    check_digest(plans["text"], plans["digest"], f"{path}.digest")
    value = node_state(plans["text"], f"{path}.text")
    if value is None:
        raise InvalidStateError(f"{path}.text", "the plans' JSON text", None)
    expect_keys(value, f"{path}.text", {"epoch", "consumers"})
    expect_int(value, "epoch", f"{path}.text")
    consumers = value["consumers"]
    if (
        not isinstance(consumers, list)
        or not consumers
        or not all(
            isinstance(plan, dict) and all(isinstance(p, list) for p in plan.values())
            for plan in consumers
        )
    ):
        raise InvalidStateError(
            f"{path}.text.consumers", "one plan ({source: [pieces]}) per consumer", consumers
        )


def node_digest(text: str) -> str:
    """The checksum a rank's entry keeps of its node JSON text: 16 hex digits of its sha256.

    >>> node_digest('{"position":4}')
    '82a691337ed143b5'
    """
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_digest(text: Any, digest: Any, path: str) -> None:
    """Refuse node JSON text that no longer matches the digest saved with it."""
    if text is None:
        if digest is not None:
            raise InvalidStateError(path, "null, as the node states are null", digest)
        return
    if not isinstance(text, str):
        return  # node_state names the problem
    if not isinstance(digest, str) or digest != node_digest(text):
        raise InvalidStateError(
            path,
            f"{node_digest(text)!r}, the digest of the node states as found",
            digest,
            note="the node states were changed or damaged after the save; resume from "
            "another checkpoint",
        )


def node_state(text: Any, path: str) -> dict[str, Any] | None:
    """The node state a rank's ``"node"`` JSON text holds: a dict, or ``None`` (an epoch's
    start); anything else is refused."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidStateError(path, "null or the node states' JSON text", text)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        note = f"it does not parse: {reason}"
        raise InvalidStateError(path, "JSON text", text, note=note) from None
    if value is not None and not isinstance(value, dict):
        raise InvalidStateError(path, "JSON text of a dict (the node states) or null", value)
    return value
