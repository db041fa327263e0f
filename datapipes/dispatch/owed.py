"""What a taken-over rank owes, and the positions a takeover publishes, as Loader states.

A taker converts a stalled rank's published position like a checkpoint
(:func:`datapipes.resume.claimed_work`); the positions it publishes while reading a
takeover phase are one-consumer-per-rank Loader states, so that its own taker can
convert them the same way. :mod:`datapipes.dispatch.takeover` runs the leases.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from datapipes.resume import JobSetup, claimed_work, parse_state, rank_state
from datapipes.resume.records import dispatch_record
from nodes import elastic as el
from nodes.dispatch import DispatchSpec
from nodes.dispatch.dispatcher import claim_list_key, claims_in, seal
from nodes.dispatch.lease import LeaseWatch
from nodes.errors import InvalidStateError

if TYPE_CHECKING:
    from datapipes.placement import RecipePlan


def lease_text(state: dict[str, Any]) -> str:
    """``state`` as the compact JSON a lease carries."""
    return json.dumps(state, separators=(",", ":"))


def taken_work(
    recipe: RecipePlan, state: dict[str, Any], rank: int, since: int, client: Any, listings: Any
) -> el.Work:
    """What ``rank`` had not delivered: its state ``state`` (a Loader state) ``since``
    items on, and the units its consumers claimed but had not reached.

    Its claims are sealed first (no consumer of it claims after this), then read from
    the store: they include units claimed after ``state`` was published.
    """
    parsed = parse_state(state)
    entry = parsed.ranks.get(rank)
    if entry is None or entry.dispatch is None:  # a position, but not this rank's
        where = f'ranks["{rank}"].dispatch'
        raise InvalidStateError(where, "the rank's dispatch record", None)
    consumers = parsed.setup.consumers_of(rank)
    claims: dict[int, dict[str, list[int]]] = {c: {} for c in consumers}
    for place in {place for units in entry.dispatch.claims.values() for place in units}:
        entries = seal(client, claim_list_key(entry.dispatch.key, place), rank)
        for consumer in consumers:
            claims[consumer][place] = claims_in(entries, consumer)
    return claimed_work(recipe.recipe, parsed, rank, since, listings, claims=claims)


def work_of(
    recipe: RecipePlan,
    watch: LeaseWatch,
    rank: int,
    old: dict[str, Any],
    client: Any,
    listings: Any,
    start_state: Callable[[int], dict[str, Any]],
) -> el.Work:
    """What taken-over ``rank`` owes, from the last position its lease ``old`` names
    (``start_state(rank)`` when it published none: it delivered nothing this epoch)."""
    number = old.get("state", -1)
    text = watch.state_text(rank, number) if number >= 0 else None
    if text is None:  # it never published a position: it delivered nothing this epoch
        state = start_state(rank)
        since = 0
    else:
        try:
            state = json.loads(text)
        except ValueError as error:
            raise InvalidStateError(
                f"dispatch lease {rank} state {number}", "a Loader state (JSON)", text[:60]
            ) from error
        since = int(old.get("since", 0))
    return taken_work(recipe, state, rank, since, client, listings)


def phase_state(
    recipe: RecipePlan, setup: JobSetup, rank: int, phase: DispatchSpec, root: Any
) -> Callable[..., dict[str, Any]]:
    """The position of ``rank`` in takeover ``phase`` (read by ``root``) as a
    one-consumer-per-rank Loader state (what a taker of this rank converts)."""
    setup = dataclasses.replace(setup, num_workers=0, items_per_transfer=1, even_batches=False)
    record = dispatch_record(
        epoch=phase.epoch,
        key=phase.key,
        consumers=phase.consumers,
        unit_items=phase.unit_items,
        work=phase.work,
        claims={rank: {place: [] for place in phase.work}},
    )

    def state(start: bool = False) -> dict[str, Any]:
        return rank_state(
            fingerprint=recipe.fingerprint,
            steps=list(recipe.steps),
            setup=setup,
            rank=rank,
            epoch=phase.epoch,
            node=None if start else root.state_dict(),
            dispatch=record,
        )

    return state
