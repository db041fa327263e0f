"""The resume plan: (recipe, parsed state, new setup, listings) -> what each consumer reads.

A :class:`ResumePlan` says, for one rank of the job that resumes: the epoch,
the rank's graph position when the topology is the saved one, every new
consumer's share of the interrupted epoch after a topology change (the
*deal*), the work dynamic dispatch hands out, and the drop counts carried
over. The :class:`datapipes.Loader` only carries it out.

Which plan a state gives:

- **Dynamic dispatch** (the new Loader's): whatever the saved job was, the
  epoch's remaining work is what its units are cut from.
- **Same topology**, this rank's entry present, not dispatched: the rank's
  own position, item for item (and the plans it had been dealt, if any).
- **Another topology**: the state must cover its whole job
  (:func:`datapipes.merge_states`); its remaining work is dealt to the new
  consumers, a pure function of (state, new setup), so every new rank
  computes the same deal without talking to the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from datapipes.resume.claims import check_work_bounds
from datapipes.resume.graph_record import node_path
from datapipes.resume.model import JobSetup, JobState
from datapipes.resume.remaining import remaining_work, resume_epoch
from datapipes.resume.schema import rank_path
from nodes import elastic as el
from nodes.consumer_work import DealtWork
from nodes.errors import InvalidStateError, StateMismatchError

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe
    from datapipes.placement import RecipePlan

#: ``(epoch, every consumer's plan, rank-major)``: a resumed epoch dealt to a new topology.
Deal = tuple[int, list[Any]]


@dataclass(frozen=True)
class ResumePlan:
    """What one rank reads after a resume (see the module doc)."""

    epoch: int
    #: The rank's graph position (same topology, mid-epoch), else ``None``: the start.
    node: dict[str, Any] | None = None
    #: After a topology change: every consumer's share of ``deal[0]``, else ``None``.
    deal: Deal | None = None
    #: Under dynamic dispatch: the work the epoch hands out (``None``: the whole epoch).
    dispatch_work: el.Work | None = None
    #: ``(epoch, counts)`` of drops made before the checkpoint, reported by this rank.
    carried_drops: tuple[int | None, dict[str, int]] = (None, {})
    #: The saved graph record (labels for ``inspect``), if any.
    graph: str | None = None

    def consumer_work(self, setup: JobSetup, rank: int, worker: int) -> DealtWork | None:
        """The share consumer (``rank``, ``worker``) reads of the dealt epoch, if dealt."""
        if self.deal is None:
            return None
        plan = self.deal[1][setup.consumers_of(rank)[worker]]
        return None if plan is None else DealtWork(self.deal[0], plan)


def resume_plan(
    recipe: RecipePlan,
    state: JobState,
    setup: JobSetup,
    rank: int,
    listings: Any,
    *,
    dynamic: bool = False,
) -> ResumePlan:
    """The :class:`ResumePlan` of ``state`` (of ``recipe``) for ``rank`` of ``setup``.

    Raises :class:`StateMismatchError` when the state cannot resume here (a
    topology change without every rank's state, another seed, another
    ``even_batches``) and :class:`InvalidStateError` for plans that the
    sources could not read. The rank's node position is checked by the Loader,
    against the graph it will run.
    """
    pipe, part = recipe.recipe, recipe.consumer_part(setup.num_workers)
    saved = state.setup
    if dynamic:
        epoch, work, ended = _remaining(pipe, state, setup, rank, listings)
        carried = _job_drops(state, epoch, ended, rank, whole_epoch=work is None)
        return ResumePlan(epoch, dispatch_work=work, carried_drops=carried)
    if saved.same_topology(setup) and rank in state.ranks and not state.was_dispatched:
        return _own_position(recipe, state, setup, rank, listings)
    epoch, work, ended = _remaining(pipe, state, setup, rank, listings)
    deal = None
    if work is not None:
        plans = el.deal(work, setup.num_consumers)
        mine = plans[setup.consumers_of(rank).start : setup.consumers_of(rank).stop]
        where = f"{rank_path(rank)} (this rank's share of epoch {epoch})"
        validate_plans(part, setup, rank, epoch, mine, listings, where)
        deal = (epoch, plans)
    carried = _job_drops(state, epoch, ended, rank, whole_epoch=deal is None)
    return ResumePlan(epoch, deal=deal, carried_drops=carried)


def _own_position(
    recipe: RecipePlan, state: JobState, setup: JobSetup, rank: int, listings: Any
) -> ResumePlan:
    """Same topology: the rank's own position (and the plans it was dealt, if any)."""
    saved = state.setup
    if saved.even_batches != setup.even_batches:
        raise StateMismatchError(
            f"this checkpoint was taken with topology {saved.topology()} and holds rank(s) "
            f"{sorted(state.ranks)}, but this Loader is rank {rank} with {setup.topology()}; "
            "resume with the same world size, number of workers and even_batches, each rank "
            "from its own state"
        )
    _check_seed(saved, setup)
    entry = state.ranks[rank]
    epoch, node = entry.epoch, entry.node
    # A rank's plans for this epoch, or for the one it finished (kept one epoch on).
    plans_epoch, plans = epoch, entry.plans_of(epoch)
    if plans is None and node is None and epoch > 0:
        plans_epoch, plans = epoch - 1, entry.plans_of(epoch - 1)
    deal = None
    if plans is not None:
        where = f"{rank_path(rank)}.plans.text.consumers"
        part = recipe.consumer_part(saved.num_workers)
        validate_plans(part, saved, rank, plans_epoch, plans, listings, where)
        deal = (plans_epoch, _saved_deal(state, plans_epoch))
    carried: tuple[int | None, dict[str, int]] = (epoch, entry.drops_of(epoch, carried=True))
    if node is None and epoch > 0:
        carried = (epoch - 1, entry.drops_of(epoch - 1))
    return ResumePlan(
        epoch,
        node=node,
        deal=deal,
        carried_drops=carried,
        graph=entry.graph,
    )


def _check_seed(saved: JobSetup, setup: JobSetup) -> None:
    if saved.seed != setup.seed:
        raise StateMismatchError(
            f"this checkpoint was taken with seed={saved.seed}, this Loader has "
            f"seed={setup.seed}; the resumed order would differ. Pass seed={saved.seed}."
        )


def _remaining(
    pipe: DataPipe[Any], state: JobState, setup: JobSetup, rank: int, listings: Any
) -> tuple[int, el.Work | None, dict[str, int]]:
    """``(epoch, remaining work or None, dropped)`` of a state covering its whole job."""
    if not state.covers_job:
        dispatched = (
            " and its epoch was dispatched dynamically (every rank's claims count)"
            if state.was_dispatched
            else ""
        )
        raise StateMismatchError(
            f"this checkpoint was taken with topology {state.setup.topology()} and holds "
            f"rank(s) {sorted(state.ranks)} only, but this Loader is rank {rank} of "
            f"{setup.world_size} with num_workers={setup.num_workers}{dispatched}. To resume "
            "on another world size or number of workers, merge every rank's state first: "
            "dp.merge_states([state of rank 0, state of rank 1, ...]) (or dp.load_dcp_states "
            "for a DCP checkpoint); or resume with the saved topology, each rank from its "
            "own state."
        )
    if state.setup.seed != setup.seed:
        raise StateMismatchError(
            f"this checkpoint was taken with seed={state.setup.seed}, this Loader has "
            f"seed={setup.seed}; the remaining items would be others. "
            f"Pass seed={state.setup.seed}."
        )
    if state.remaining is not None:  # worked out once, when the states were merged
        epoch = resume_epoch(state.ranks)
        if state.remaining.epoch != epoch:
            raise InvalidStateError(
                "remaining.text.epoch",
                f"{epoch} (the epoch the ranks resume)",
                state.remaining.epoch,
            )
        # Dealt (static) or cut into units (dynamic): either way checked against the data.
        check_work_bounds(
            pipe, state.setup, epoch, state.remaining.work or {}, listings, "remaining.text.work"
        )
        return epoch, state.remaining.work, dict(state.remaining.dropped)
    dropped: dict[str, int] = {}
    epoch, work = remaining_work(pipe, state, listings, dropped)
    return epoch, work, dropped


def _job_drops(
    state: JobState, epoch: int, ended: dict[str, int], rank: int, whole_epoch: bool
) -> tuple[int, dict[str, int]]:
    """On another topology rank 0 carries what the saved job dropped of ``epoch`` (its
    ranks' final counts and its ended workers'); of the epoch before when every rank had
    ended it (``whole_epoch``: nothing of ``epoch`` was read)."""
    at = epoch - 1 if whole_epoch else epoch
    counts: dict[str, int] = {}
    if rank == 0:
        for entry in state.ranks.values():
            for step, count in entry.drops_of(at).items():
                counts[step] = counts.get(step, 0) + count
        for step, count in ended.items():
            counts[step] = counts.get(step, 0) + count
    return at, counts


def _saved_deal(state: JobState, epoch: int) -> list[Any]:
    """Every consumer's plan of a dealt epoch, as far as the state holds them (a rank's own
    state holds its own; the others' are needed only to count even batches)."""
    setup = state.setup
    deal: list[Any] = [None] * setup.num_consumers
    for rank, entry in state.ranks.items():
        theirs = entry.plans_of(epoch)
        if theirs is not None:
            consumers = setup.consumers_of(rank)
            deal[consumers.start : consumers.stop] = theirs
    return deal


def validate_plans(
    part: DataPipe[Any],
    setup: JobSetup,
    rank: int,
    epoch: int,
    plans: list[Any],
    listings: Any,
    path: str,
) -> None:
    """Refuse (``InvalidStateError`` naming the place) a rank's consumers' plans that its
    sources could not read: positions past the data, files past the listing, bad cursors.
    ``part``: what one consumer of ``setup`` runs (:meth:`RecipePlan.consumer_part`)."""
    if len(plans) != setup.consumers_per_rank:
        raise InvalidStateError(path, f"{setup.consumers_per_rank} plans", len(plans))
    for worker, plan in enumerate(plans):
        work = DealtWork(epoch, plan)
        root = part.build(setup.context(rank, worker, epoch, listings=listings, work=work))
        try:
            dealt, unknown = el.dealt_sources(root, plan, f"{path}[{worker}]")
            for node, place in dealt:
                node.validate_plan(plan[place], f"{path}[{worker}][{place!r}]")
            if unknown:
                raise InvalidStateError(
                    f"{path}[{worker}]", "plans of this recipe's sources", sorted(unknown)
                )
        finally:
            root.close()


__all__ = ["Deal", "ResumePlan", "node_path", "resume_plan", "validate_plans"]
