"""What an interrupted epoch still owes: its remaining work, and a taken-over rank's claims.

A checkpoint of a job of ``R`` ranks x ``W`` workers holds each consumer's
position (:mod:`datapipes.resume.merge` puts the ranks' states together into one
state for the whole job). :func:`remaining_work` turns such a state into the
interrupted epoch's remaining work in canonical coordinates (see
:mod:`nodes.elastic`): for each old consumer it builds the graph that
consumer ran, restores it, and asks its buffers what they hold and its
sources what they have not read. :func:`claimed_work` is the same for one
rank of a dynamically dispatched epoch whose other ranks go on (a takeover).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from datapipes.placement import rebuild_on, worker_part
from datapipes.resume.claims import ReplayDispatch, check_work_bounds, whole_epoch
from datapipes.resume.graph_record import node_path
from datapipes.resume.model import JobSetup, JobState, RankEntry
from datapipes.resume.schema import rank_path
from nodes import UPSTREAM, Context, Node
from nodes import elastic as el
from nodes.base import walk_graph
from nodes.consumer_work import ConsumerWork, DealtWork
from nodes.errors import InvalidStateError, StateMismatchError
from nodes.readers.file_states import cursors_checked_later
from nodes.workers.replay import ENDED, with_more_steps, worker_positions

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe
    from nodes.sources.files import Listings


# ----- the remaining work -----------------------------------------------------------------


def resume_epoch(ranks: Mapping[int, RankEntry]) -> int:
    """The epoch a job's ranks resume: the earliest; the others must have finished it."""
    epoch = min(entry.epoch for entry in ranks.values())
    for rank, entry in ranks.items():
        if entry.epoch > epoch and (entry.epoch > epoch + 1 or entry.node is not None):
            at = sorted(r for r, e in ranks.items() if e.epoch == epoch)
            raise StateMismatchError(
                f"rank {rank} is in epoch {entry.epoch} "
                f"({'mid-epoch' if entry.node is not None else 'at its start'}) while rank(s) "
                f"{at} are in epoch {epoch}: these states do not come from one checkpoint"
            )
    return epoch


def remaining_work(
    pipe: DataPipe[Any],
    state: JobState,
    listings: Listings | None = None,
    drops: dict[str, int] | None = None,
    replays: list[ReplayDispatch] | None = None,
) -> tuple[int, el.Work | None]:
    """``(epoch, remaining work)`` of a state that covers every rank of its job.

    ``pipe`` is the recipe the state was taken with (a Loader's, with its
    ``pin_memory``/``to_device`` steps). The work is ``None`` when the epoch
    has not started on any rank (a fresh epoch of any topology deals it).
    Raises :class:`nodes.elastic.ElasticResumeError` naming a step that has
    no exact answer. ``drops``, when given, receives what the DataLoader workers
    that had ended their share dropped (``batch(drop_last=True)``), which no
    rank's entry can say for sure (a count taken mid-epoch may be read-ahead).
    ``replays``, when given, receives the replay of a dynamically dispatched epoch
    (:class:`datapipes.resume.claims.ReplayDispatch`: which units no consumer reached).
    """
    epoch = resume_epoch(state.ranks)
    replay = _replay_dispatch(pipe, state.setup, state.ranks.values(), epoch, listings)
    if replay is not None and replays is not None:
        replays.append(replay)
    started = replay is not None and replay.started
    first = _ranks_work(pipe, state, epoch, listings, {}, replay, {})
    reached = el.rounds_reached(place for work in first[1] for place in work)
    # Consumers stand in different rounds of an endless repeat: each one's shares of the
    # rounds up to the furthest any reached are work too, asked again now that it is known
    # (a repeat of a set number of times has given all its rounds already).
    lagging = any(
        round_ < reached[base]
        for work in first[1]
        for base, round_ in el.rounds_reached(work).items()
    )
    again = _ranks_work(pipe, state, epoch, listings, drops, replay, reached) if lagging else None
    if again is None and drops is not None:
        for step, count in first[2].items():
            drops[step] = drops.get(step, 0) + count
    started_here, works, _ = first if again is None else again
    if not (started or started_here):
        return epoch, None
    if replay is not None:  # dynamic dispatch: the units no consumer had reached
        works.append(replay.unreached())
    return epoch, el.merge_work(works)


def _ranks_work(
    pipe: DataPipe[Any],
    state: JobState,
    epoch: int,
    listings: Listings | None,
    drops: dict[str, int] | None,
    replay: ReplayDispatch | None,
    rounds: dict[str, int] | None = None,
) -> tuple[bool, list[el.Work], dict[str, int]]:
    """Whether any rank had started ``epoch``, every consumer's remaining work, and the
    items the ended workers dropped (also added to ``drops`` when given)."""
    setup = state.setup
    drops = {} if drops is None else drops
    works: list[el.Work] = []
    started = False
    for rank, entry in state.ranks.items():
        if entry.epoch != epoch:
            started = True  # it finished the epoch: the others' shares are what remains
            continue
        node = entry.node
        plans = entry.plans_of(epoch)
        started = started or node is not None or plans is not None
        if setup.even_batches and node is not None:
            node = node[UPSTREAM]  # the Loader's even_batches wrapper: its input's position
        try:
            with cursors_checked_later():  # the new consumers check the pieces they read
                works.extend(
                    _rank_work(
                        pipe, setup, rank, epoch, node, plans, listings, drops, replay, rounds
                    )
                )
        except (StateMismatchError, OSError):
            raise
        except (KeyError, TypeError, ValueError, IndexError, StopIteration) as error:
            # A damaged state that the node checks let through: never a raw error.
            raise InvalidStateError(
                node_path(rank),
                "a position this recipe can resume",
                "?",
                note=f"converting it for another topology failed: {type(error).__name__}: {error}",
            ) from error
    return started, works, drops


def claimed_work(
    pipe: DataPipe[Any],
    state: JobState,
    rank: int,
    since: int = 0,
    listings: Listings | None = None,
    claims: Mapping[int, Mapping[str, list[int]]] | None = None,
) -> el.Work:
    """What one rank of a dynamically dispatched epoch had not delivered, the other ranks
    going on: its position in ``state`` ``since`` items on, and the units its consumers
    claimed (its dispatch record) but had not reached. Unlike :func:`remaining_work`, no
    unit that nobody claimed is in it: the ranks still hand those out (see
    :mod:`datapipes.dispatch.takeover`). ``claims``: the rank's consumers' claims as the store
    holds them now (they include units claimed after ``state`` was published)."""
    setup = state.setup
    entry = state.ranks.get(rank)
    if entry is None or entry.dispatch is None:
        raise InvalidStateError(
            f'ranks["{rank}"].dispatch', "the rank's dispatch record of its epoch", None
        )
    epoch = entry.epoch
    replay = _replay_dispatch(pipe, setup, [entry], epoch, listings)
    if replay is None:
        raise InvalidStateError(
            f'ranks["{rank}"].dispatch.epoch', f"{epoch} (the rank's epoch)", entry.dispatch.epoch
        )
    if claims is not None:  # the store's: a claim that found every unit taken names none
        spec = replay.spec
        counts = {place: len(spec.units(place)) for place in spec.work}
        kept = {
            consumer: {p: [u for u in units if u < counts.get(p, 0)] for p, units in by.items()}
            for consumer, by in claims.items()
        }
        record = dataclasses.replace(entry.dispatch, claims=kept)
        entry = dataclasses.replace(entry, dispatch=record)
        replay = ReplayDispatch([record], spec.work if record.work is None else None)
    node = entry.node
    if since:
        node = _advanced(pipe, setup, rank, epoch, node, since, replay, listings)
    works = _rank_work(pipe, setup, rank, epoch, node, None, listings, None, replay)
    works.append(replay.unreached(claimed_only=True))
    return el.merge_work(works)


def _advanced(
    pipe: Any,
    setup: JobSetup,
    rank: int,
    epoch: int,
    node: Any,
    since: int,
    replay: ReplayDispatch,
    listings: Any,
) -> Any:
    """``node`` (a rank's Loader graph state) after ``since`` more items were delivered."""
    if setup.num_workers:  # the DataLoader replays them from its snapshot
        return with_more_steps(node, since, node_path(rank))
    root = pipe.build(_context(setup, rank, 0, epoch, None, listings, replay))
    try:
        if node is not None:
            root.validate_state(node, node_path(rank))
        root.reset(node)
        items = iter(root)
        for _ in range(since):
            next(items)
        return root.state_dict()
    except StopIteration:
        raise InvalidStateError(
            node_path(rank), "a position within the data", "?",
            note=f"the lease said {since} items were delivered after it; the data ran out",
        ) from None  # fmt: skip
    finally:
        root.close()


def _replay_dispatch(
    pipe: DataPipe[Any],
    setup: JobSetup,
    entries: Iterable[RankEntry],
    epoch: int,
    listings: Any,
) -> ReplayDispatch | None:
    """The claims of ``epoch`` if it was dispatched dynamically (see datapipes.dispatch.dynamic)."""
    dispatched = [
        entry for entry in entries if entry.dispatch is not None and entry.dispatch.epoch == epoch
    ]
    records = [entry.dispatch for entry in dispatched if entry.dispatch is not None]
    if not records:
        return None
    whole = None
    if records[0].work is None:  # the epoch's whole work: worked out again
        whole = whole_epoch(pipe, setup, epoch, listings)
    else:  # a resumed epoch's rest: checked before it is cut into units (the others agree)
        path = f"{rank_path(str(dispatched[0].rank))}.dispatch.work"
        check_work_bounds(pipe, setup, epoch, records[0].work, listings, path)
    return ReplayDispatch(records, whole)


def _context(
    setup: JobSetup,
    rank: int,
    worker: int,
    epoch: int,
    plans: list[Any] | None,
    listings: Any,
    replay: ReplayDispatch | None = None,
) -> Context:
    work: ConsumerWork | None = None
    if replay is not None:  # its claims, replayed: a source reads the units it claimed
        work = replay.for_consumer(setup.consumers_of(rank)[worker])
    elif plans is not None:
        work = DealtWork(epoch, plans[worker])
    return setup.context(rank, worker, epoch, listings=listings, work=work)


def _rank_work(
    pipe: DataPipe[Any],
    setup: JobSetup,
    rank: int,
    epoch: int,
    node: Any,
    plans: list[Any] | None,
    listings: Any,
    drops: dict[str, int] | None = None,
    replay: ReplayDispatch | None = None,
    rounds: dict[str, int] | None = None,
) -> list[el.Work]:
    if not setup.num_workers:
        root = pipe.build(_context(setup, rank, 0, epoch, plans, listings, replay))
        if node is not None:
            root.validate_state(node, node_path(rank))
        return [el.consumer_work(root, node, rounds)]
    part = worker_part(pipe, setup.num_workers)
    _check_main_steps(pipe)
    loader_state = _workers_state(node)
    consumers = setup.consumers_of(rank)
    if loader_state is None:  # the rank had ended its epoch
        if replay is not None:
            for consumer in consumers:
                replay.finished(consumer)
        return []

    def build(worker: int) -> Node[Any]:
        return part.build(_context(setup, rank, worker, epoch, plans, listings, replay))

    states = worker_positions(
        build,
        setup.num_workers,
        setup.items_per_transfer,
        loader_state,
        _bundle_taken(node),
        node_path(rank),
        drops,
    )
    works = []
    for worker, position in enumerate(states):
        if position is ENDED:
            if replay is not None:
                replay.finished(consumers[worker])
            continue
        works.append(el.consumer_work(build(worker), position, rounds))
    return works


def _check_main_steps(pipe: DataPipe[Any]) -> None:
    """Steps in the main process above the workers must hold no items of their own."""
    from datapipes.placement import split_main_steps
    from datapipes.steps.sources import range as empty_range

    root = rebuild_on(empty_range(0), split_main_steps(pipe)[1]).build(Context())
    try:
        for node in walk_graph(root):
            if node.inputs and node.elastic != "transparent":
                raise el.refuse(
                    node,
                    "runs in the main process above the DataLoader workers "
                    "and holds items there; move it before .pin_memory()/.to_device()",
                )
    finally:
        root.close()


def _loader_node(node: Any) -> Any:
    while isinstance(node, dict) and "dataloader" not in node and "ended" not in node:
        node = node.get(UPSTREAM)
    return node


def _workers_state(node: Any) -> dict[str, Any] | None:
    """The StatefulDataLoader state under the main-process steps (their state is its)."""
    if node is None:
        return {}
    node = _loader_node(node)
    if not isinstance(node, dict) or node.get("ended"):
        return None
    return node.get("dataloader") or {}


def _bundle_taken(node: Any) -> int:
    """Items of the current bundle the workers' node had returned (``items_per_transfer``
    > 1, see nodes.WorkerStreamNode), after the DataLoader position of its state."""
    node = _loader_node(node)
    taken = node.get("taken", 0) if isinstance(node, dict) else 0
    return taken if isinstance(taken, int) and not isinstance(taken, bool) else 0
