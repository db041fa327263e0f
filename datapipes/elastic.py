"""Elastic resume: merging the ranks' states of one checkpoint, and the work that remains.

A checkpoint of a job of ``R`` ranks x ``W`` workers holds each consumer's
position. :func:`merge_states` puts the ranks' states together into one state
for the whole job. :func:`remaining_work` turns such a state into the
interrupted epoch's remaining work in canonical coordinates (see
:mod:`nodes.elastic`): for each old consumer it builds the graph that
consumer ran, restores it, and asks its buffers what they hold and its
sources what they have not read. :func:`consumer_plans` deals that work to
the consumers of a new topology, a pure function of (state, new topology),
so every new rank computes the same deal without talking to the others.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from datapipes import checkpoint
from datapipes.checkpoint_schema import node_state
from datapipes.dispatch import ReplayDispatch, epoch_work
from datapipes.placement import rebuild_on, split_main_steps
from nodes import UPSTREAM, Context, Node
from nodes import elastic as el
from nodes import torchdata_adapter as torchdata
from nodes.base import walk_graph
from nodes.batch import drop_counts
from nodes.errors import InvalidStateError, StateMismatchError
from nodes.file_states import cursors_checked_later

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe
    from nodes.files import Listings

_END = object()


# ----- merging ------------------------------------------------------------------------------


def merge_states(
    states: Iterable[dict[str, Any]], pipe: DataPipe[Any] | None = None
) -> dict[str, Any]:
    """One Loader state for a whole job, from every rank's ``Loader.state_dict()``.

    ``states`` are the states of one checkpoint (each rank's own, or states
    that already hold several ranks), in any order. The result loads into a
    Loader of any ``rank``, ``world_size`` and ``num_workers``: on the saved
    topology it resumes exactly as each rank's own state would; on another,
    the interrupted epoch's remaining items are dealt to the new consumers,
    each exactly once. It is plain data, like every Loader state.

    Refused with :class:`datapipes.StateMismatchError`, saying which: a rank
    missing, states of different recipes, seeds or topologies, two different
    states of one rank, ranks in epochs that cannot belong to one checkpoint.

    With ``pipe`` (the recipe the states were taken with), the interrupted
    epoch's remaining work is worked out here, once, and kept in the merged
    state (``"remaining"``, with a digest): a Loader on another topology then
    only deals it, instead of restoring every old consumer's graph itself.
    Worth it when one process merges for a large job (rank 0 saves the merged
    state, every new rank loads that file).

    >>> import datapipes as dp
    >>> loaders = [dp.Loader(dp.range(8), rank=r, world_size=2) for r in range(2)]
    >>> its = [iter(loader) for loader in loaders]; _ = [next(it) for it in its]
    >>> merged = dp.merge_states([loader.state_dict() for loader in loaders])
    >>> sorted(merged["ranks"])
    ['0', '1']
    """
    states = list(states)
    if not states:
        raise ValueError("merge_states needs the states of every rank, got none")
    for state in states:
        checkpoint.check_shape(state)
    states = [checkpoint.with_idle_ranks(state) for state in states]
    first = states[0]
    ranks: dict[str, dict[str, Any]] = {}
    for state in states:
        _check_same_job(first, state)
        for rank, entry in state["ranks"].items():
            if rank in ranks and _without_graph(ranks[rank]) != _without_graph(entry):
                raise StateMismatchError(
                    f"merge_states got two different states of rank {rank}: they come from "
                    "different checkpoints (different steps); pass each rank's state of one "
                    "checkpoint once"
                )
            ranks.setdefault(rank, entry)
    world_size = first["topology"]["world_size"]
    missing = [r for r in range(world_size) if str(r) not in ranks]
    if missing:
        raise StateMismatchError(
            f"merge_states got the states of rank(s) {sorted(int(r) for r in ranks)} of a job "
            f"of {world_size} ranks: rank(s) {missing} are missing. Pass every rank's state "
            "(each rank's Loader.state_dict(), or dp.load_dcp_states for a DCP checkpoint)."
        )
    resume_epoch(ranks)  # refuses ranks in epochs one checkpoint cannot hold
    merged = {key: first[key] for key in first if key not in ("ranks", "remaining")}
    merged["ranks"] = _deduplicated_graphs({r: ranks[r] for r in sorted(ranks, key=int)})
    merged = checkpoint.without_idle_ranks(merged)
    if pipe is not None:
        checkpoint.check_recipe_of(merged, pipe.fingerprint(), pipe.steps())
        dropped: dict[str, int] = {}
        epoch, work = remaining_work(pipe, merged, None, dropped)
        merged["remaining"] = checkpoint.remaining_record(epoch, work, dropped)
    return merged


def _check_same_job(first: dict[str, Any], state: dict[str, Any]) -> None:
    if state["fingerprint"] != first["fingerprint"]:
        raise StateMismatchError(
            "merge_states got states of different recipes:\n"
            + checkpoint.explain_difference(list(first["steps"]), list(state["steps"]))
        )
    for key, what in (("seed", "seeds"), ("topology", "topologies")):
        if state[key] != first[key]:
            raise StateMismatchError(
                f"merge_states got states of different {what}: {first[key]} and {state[key]}; "
                "pass the states of one checkpoint of one job"
            )


def _without_graph(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "graph"}


def _deduplicated_graphs(ranks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Ranks' entries with the graph record kept once (every rank built the same shape)."""
    out, kept = {}, False
    for rank, entry in ranks.items():
        if entry.get("graph") is not None:
            if kept:
                entry = {k: v for k, v in entry.items() if k != "graph"}
            kept = True
        out[rank] = entry
    return out


def covers_job(state: dict[str, Any]) -> bool:
    """Whether a (checked) state holds every rank of the job that saved it."""
    state = checkpoint.with_idle_ranks(state)
    world_size = state["topology"]["world_size"]
    return all(str(r) in state["ranks"] for r in range(world_size))


def resume_epoch(ranks: dict[str, dict[str, Any]]) -> int:
    """The epoch a job's ranks resume: the earliest; the others must have finished it."""
    epochs = {rank: entry["epoch"] for rank, entry in ranks.items()}
    epoch = min(epochs.values())
    for rank, entry in ranks.items():
        if entry["epoch"] > epoch and (entry["epoch"] > epoch + 1 or entry["node"] is not None):
            raise StateMismatchError(
                f"rank {rank} is in epoch {entry['epoch']} "
                f"({'mid-epoch' if entry['node'] is not None else 'at its start'}) while rank(s) "
                f"{sorted(int(r) for r, e in epochs.items() if e == epoch)} are in epoch {epoch}: "
                "these states do not come from one checkpoint"
            )
    return epoch


# ----- the remaining work -----------------------------------------------------------------


def remaining_work(
    pipe: DataPipe[Any],
    state: dict[str, Any],
    listings: Listings | None = None,
    drops: dict[str, int] | None = None,
    replays: list[ReplayDispatch] | None = None,
) -> tuple[int, el.Work | None]:
    """``(epoch, remaining work)`` of a (checked) state that covers every rank of its job.

    ``pipe`` is the recipe the state was taken with (a Loader's, with its
    ``pin_memory``/``to_device`` steps). The work is ``None`` when the epoch
    has not started on any rank (a fresh epoch of any topology deals it).
    Raises :class:`nodes.elastic.ElasticResumeError` naming a step that has
    no exact answer. ``drops``, when given, receives what the DataLoader workers
    that had ended their share dropped (``batch(drop_last=True)``), which no
    rank's entry can say for sure (a count taken mid-epoch may be read-ahead).
    ``replays``, when given, receives the replay of a dynamically dispatched epoch
    (:class:`datapipes.dispatch.ReplayDispatch`: which units no consumer reached).
    """
    ranks = checkpoint.with_idle_ranks(state)["ranks"]
    epoch = resume_epoch(ranks)
    setup = checkpoint.saved_setup(state)
    works = []
    replay = _replay_dispatch(pipe, setup, ranks, epoch, listings)
    if replay is not None and replays is not None:
        replays.append(replay)
    started = replay is not None and replay.started
    for rank in sorted(ranks, key=int):
        entry = ranks[rank]
        if entry["epoch"] != epoch:
            started = True  # it finished the epoch: the others' shares are what remains
            continue
        node = node_state(entry["node"], f"{checkpoint.node_path(int(rank))}")
        plans = checkpoint.entry_plans(entry, epoch)
        started = started or node is not None or plans is not None
        if setup["even_batches"] and node is not None:
            node = node[UPSTREAM]  # the Loader's even_batches wrapper: its input's position
        try:
            with cursors_checked_later():  # the new consumers check the pieces they read
                works.extend(
                    _rank_work(pipe, setup, int(rank), epoch, node, plans, listings, drops, replay)
                )
        except (StateMismatchError, OSError):
            raise
        except (KeyError, TypeError, ValueError, IndexError, StopIteration) as error:
            # A damaged state that the node checks let through: never a raw error.
            raise InvalidStateError(
                checkpoint.node_path(int(rank)),
                "a position this recipe can resume",
                "?",
                note=f"converting it for another topology failed: {type(error).__name__}: {error}",
            ) from error
    if not started:
        return epoch, None
    if replay is not None:  # dynamic dispatch: the units no consumer had reached
        works.append(replay.unreached())
    return epoch, el.merge_work(works)


def claimed_work(
    pipe: DataPipe[Any],
    state: dict[str, Any],
    rank: int,
    since: int = 0,
    listings: Listings | None = None,
) -> el.Work:
    """What one rank of a dynamically dispatched epoch had not delivered, the other ranks
    going on: its position in (checked) ``state`` ``since`` items on, and the units its
    consumers claimed (its ``"dispatch"`` record) but had not reached. Unlike
    :func:`remaining_work`, no unit that nobody claimed is in it: the ranks still hand
    those out (see :mod:`datapipes.takeover`)."""
    setup = checkpoint.saved_setup(state)
    entry = state["ranks"][str(rank)]
    epoch = entry["epoch"]
    replay = _replay_dispatch(pipe, setup, {str(rank): entry}, epoch, listings)
    if replay is None:
        raise InvalidStateError(
            f'ranks["{rank}"].dispatch',
            "the rank's dispatch record of its epoch",
            entry.get("dispatch"),
        )
    node = node_state(entry["node"], checkpoint.node_path(rank))
    if since:
        node = _advanced(pipe, setup, rank, epoch, node, since, replay, listings)
    works = _rank_work(pipe, setup, rank, epoch, node, None, listings, None, replay)
    works.append(replay.unreached(claimed_only=True))
    return el.merge_work(works)


def _advanced(
    pipe: Any,
    setup: dict[str, Any],
    rank: int,
    epoch: int,
    node: Any,
    since: int,
    replay: Any,
    listings: Any,
) -> Any:
    """``node`` (a rank's Loader graph state) after ``since`` more items were delivered."""
    if setup["num_workers"]:  # the DataLoader replays them from its snapshot
        return _with_more_steps(node, since, checkpoint.node_path(rank))
    ctx = _context(setup, rank, 0, epoch, None, listings, replay)
    root = pipe.build(ctx)
    try:
        if node is not None:
            root.validate_state(node, checkpoint.node_path(rank))
        root.reset(node)
        items = iter(root)
        for _ in range(since):
            next(items)
        return root.state_dict()
    except StopIteration:
        raise InvalidStateError(
            checkpoint.node_path(rank), "a position within the data", "?",
            note=f"the lease said {since} items were delivered after it; the data ran out",
        ) from None  # fmt: skip
    finally:
        root.close()


def _with_more_steps(node: Any, since: int, path: str) -> Any:
    if not isinstance(node, dict):
        raise InvalidStateError(path, "a DataLoader state to replay items after", node)
    if "dataloader" in node:
        loader = node["dataloader"]
        summary = torchdata.snapshot_summary(loader)
        moved = torchdata.at_step(loader, summary["snapshot_step"] + summary["steps_since"] + since)
        return {**node, "dataloader": moved}
    return {**node, UPSTREAM: _with_more_steps(node.get(UPSTREAM), since, path)}


def _replay_dispatch(
    pipe: DataPipe[Any],
    setup: dict[str, Any],
    ranks: dict[str, dict[str, Any]],
    epoch: int,
    listings: Any,
) -> ReplayDispatch | None:
    """The claims of ``epoch`` if it was dispatched dynamically (see datapipes.dispatch)."""
    records = [
        entry["dispatch"]
        for entry in ranks.values()
        if entry.get("dispatch") is not None and entry["dispatch"]["epoch"] == epoch
    ]
    if not records:
        return None
    whole = None
    if records[0]["work"] is None:  # the epoch's whole work: worked out again
        ctx = Context(epoch=epoch, seed=setup["seed"])
        ctx.listings = listings
        part = split_main_steps(pipe)[0] if setup["num_workers"] else pipe
        whole = epoch_work(part, ctx)
    return ReplayDispatch(records, whole)


def _context(
    setup: dict[str, Any],
    rank: int,
    worker: int,
    epoch: int,
    plans: Any,
    listings: Any,
    replay: ReplayDispatch | None = None,
) -> Context:
    workers = max(setup["num_workers"], 1)
    ctx = Context(
        rank=rank,
        world_size=setup["world_size"],
        worker_id=worker,
        num_workers=workers,
        epoch=epoch,
        seed=setup["seed"],
    )
    ctx.listings = listings
    ctx.plans = None if plans is None else plans[worker]
    ctx.plans_epoch = epoch
    if replay is not None:  # its claims, replayed: a source reads the units it claimed
        ctx.dispatch = ctx.plans = replay.for_consumer(ctx.consumer_index)
    return ctx


def _rank_work(
    pipe: DataPipe[Any],
    setup: dict[str, Any],
    rank: int,
    epoch: int,
    node: Any,
    plans: Any,
    listings: Any,
    drops: dict[str, int] | None = None,
    replay: ReplayDispatch | None = None,
) -> list[el.Work]:
    if not setup["num_workers"]:
        root = pipe.build(_context(setup, rank, 0, epoch, plans, listings, replay))
        if node is not None:
            root.validate_state(node, checkpoint.node_path(rank))
        return [el.consumer_work(root, node)]
    worker_part, main_steps = split_main_steps(pipe)
    _check_main_steps(main_steps)
    loader_state = _workers_state(node)
    workers = setup["num_workers"]
    if loader_state is None:  # the rank had ended its epoch
        if replay is not None:
            for worker in range(workers):
                replay.finished(rank * workers + worker)
        return []
    states = _worker_positions(
        worker_part,
        setup,
        rank,
        epoch,
        (loader_state, _bundle_taken(node)),
        plans,
        listings,
        drops,
        replay,
    )
    works = []
    for worker, position in enumerate(states):
        if position is _END:
            if replay is not None:
                replay.finished(rank * workers + worker)
            continue
        ctx = _context(setup, rank, worker, epoch, plans, listings, replay)
        works.append(el.consumer_work(worker_part.build(ctx), position))
    return works


def _check_main_steps(main_steps: list[Any]) -> None:
    """Steps in the main process above the workers must hold no items of their own."""
    from datapipes.sources import range as empty_range

    root = rebuild_on(empty_range(0), main_steps).build(Context())
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


def _workers_state(node: Any) -> dict[str, Any] | None:
    """The StatefulDataLoader state under the main-process steps (their state is its)."""
    if node is None:
        return {}
    while isinstance(node, dict) and "dataloader" not in node and "ended" not in node:
        node = node.get(UPSTREAM)
    if not isinstance(node, dict) or node.get("ended"):
        return None
    return node.get("dataloader") or {}


def _bundle_taken(node: Any) -> int:
    """Items of the current bundle the workers' node had returned (``items_per_transfer``
    > 1, see nodes.WorkerStreamNode), after the DataLoader position of its state."""
    while isinstance(node, dict) and "dataloader" not in node and "ended" not in node:
        node = node.get(UPSTREAM)
    taken = node.get("taken", 0) if isinstance(node, dict) else 0
    return taken if isinstance(taken, int) and not isinstance(taken, bool) else 0


def _worker_positions(
    worker_part: DataPipe[Any],
    setup: dict[str, Any],
    rank: int,
    epoch: int,
    position: tuple[dict[str, Any], int],
    plans: Any,
    listings: Any,
    drops: dict[str, int] | None = None,
    replay: ReplayDispatch | None = None,
) -> list[Any]:
    """Each worker's node state after the last item the main process returned from it.

    ``position``: the DataLoader's state and the items taken of the bundle after it.
    The DataLoader's state is every worker's state at the last snapshot and how
    many transfers were returned since, from the workers in turn; each transfer is
    one item, or up to ``items_per_transfer`` (a worker at the end of its share
    sends fewer, then none). Those transfers are replayed here, each worker's graph
    built as that worker built it, then the items taken of the next one.
    """
    workers = setup["num_workers"]
    per_transfer = setup.get("items_per_transfer", 1)
    loader_state, taken = position
    if not loader_state:
        return [None] * workers
    snapshots = dict(torchdata.worker_dataset_states(loader_state))
    summary = torchdata.snapshot_summary(loader_state)
    roots: list[Node[Any]] = []
    ended = []
    try:
        for worker in range(workers):
            saved = snapshots.get(worker) or {}
            ctx = _context(setup, rank, worker, epoch, plans, listings, replay)
            root = worker_part.build(ctx)
            roots.append(root)
            if saved.get("node") is not None:
                where = f"{checkpoint.node_path(rank)}.dataloader.worker_{worker}.node"
                root.validate_state(saved["node"], where)
            root.reset(saved.get("node"))
            ended.append(bool(saved) and torchdata.fetcher_ended(loader_state, worker))
        turn = 0 if summary["last_worker"] is None else (summary["last_worker"] + 1) % workers
        # A worker that sent a short bundle has no item left: it sends none next.
        exhausted = [False] * workers

        def transfer(worker: int, limit: int) -> int:
            count = 0
            while count < limit and not exhausted[worker]:
                if next(iter(roots[worker]), _END) is _END:
                    exhausted[worker] = True
                    break
                count += 1
            return count

        if not 0 <= taken < per_transfer:
            where = f"{checkpoint.node_path(rank)}.taken"
            raise InvalidStateError(where, f"an int in [0, {per_transfer - 1}]", taken)
        limits = [per_transfer] * summary["steps_since"] + ([taken] if taken else [])
        for index, limit in enumerate(limits):
            count = 0
            for _ in range(workers):
                worker, turn = turn, (turn + 1) % workers
                if not ended[worker]:
                    count = transfer(worker, limit)
                    if count:
                        break
                    ended[worker] = True
            if taken and index == len(limits) - 1 and count < taken:
                # The bundle the state says was begun holds fewer items than were taken.
                where = f"{checkpoint.node_path(rank)}.taken"
                raise InvalidStateError(where, f"at most {count} (the items left)", taken)
        ended = [e or x for e, x in zip(ended, exhausted, strict=True)]
        if drops is not None:  # what the workers that ended their share dropped at its end
            for worker in range(workers):
                if ended[worker]:
                    saved = (snapshots.get(worker) or {}).get("dropped", {})
                    for step, count in {**saved, **drop_counts(roots[worker])}.items():
                        drops[step] = drops.get(step, 0) + count
        return [_END if ended[w] else roots[w].state_dict() for w in range(workers)]
    finally:
        for root in roots:
            root.close()


def validate_plans(
    pipe: DataPipe[Any],
    setup: dict[str, Any],
    rank: int,
    epoch: int,
    plans: list[Any],
    listings: Any,
    path: str,
) -> None:
    """Refuse (``InvalidStateError`` naming the place) a rank's consumers' plans that its
    sources could not read: positions past the data, files past the listing, bad cursors."""
    part = split_main_steps(pipe)[0] if setup["num_workers"] else pipe
    if len(plans) != max(setup["num_workers"], 1):
        raise InvalidStateError(path, f"{max(setup['num_workers'], 1)} plans", len(plans))
    for worker, plan in enumerate(plans):
        root = part.build(_context(setup, rank, worker, epoch, plans, listings))
        try:
            places = set()
            for node in walk_graph(root):
                if node.elastic == "source" and getattr(node, "place", None) in plan:
                    places.add(node.place)
                    node.validate_plan(plan[node.place], f"{path}[{worker}][{node.place!r}]")
            unknown = set(plan) - places
            if unknown:
                raise InvalidStateError(
                    f"{path}[{worker}]", "plans of this recipe's sources", sorted(unknown)
                )
        finally:
            root.close()


# ----- dealing ------------------------------------------------------------------------------


def remaining_here(
    pipe: DataPipe[Any],
    state: dict[str, Any],
    where: tuple[int, int, int, int],
    listings: Any,
) -> tuple[int, el.Work | None, dict[str, int]]:
    """``(epoch, remaining work or None, dropped)`` of a state that covers its whole job,
    for a Loader at ``where`` (rank, world size, num_workers, seed).

    ``None``: the epoch had not started (a fresh epoch of any topology reads it);
    ``dropped``: what the saved job's ended DataLoader workers had dropped.
    """
    rank, world_size, num_workers, seed = where
    if not covers_job(state):
        saved = sorted(int(r) for r in state["ranks"])
        raise StateMismatchError(
            f"this checkpoint was taken with topology {state['topology']} and holds "
            f"rank(s) {saved} only, but this Loader is rank {rank} of {world_size} with "
            f"num_workers={num_workers}"
            + (
                ""
                if not checkpoint.was_dispatched(state)
                else " and its epoch was dispatched dynamically (every rank's claims count)"
            )
            + ". To resume on another world size or number of "
            "workers, merge every rank's state first: dp.merge_states([state of rank 0, "
            "state of rank 1, ...]) (or dp.load_dcp_states for a DCP checkpoint); or "
            "resume with the saved topology, each rank from its own state."
        )
    if state["seed"] != seed:
        raise StateMismatchError(
            f"this checkpoint was taken with seed={state['seed']}, this Loader has "
            f"seed={seed}; the remaining items would be others. Pass seed={state['seed']}."
        )
    dropped: dict[str, int] = {}
    if "remaining" in state:  # worked out once, when the states were merged
        epoch, work, dropped = checkpoint.saved_remaining(state, resume_epoch(state["ranks"]))
    else:
        epoch, work = remaining_work(pipe, state, listings, dropped)
    return epoch, work, dropped


def deal_here(
    pipe: DataPipe[Any],
    state: dict[str, Any],
    where: tuple[int, int, int, int],
    listings: Any,
) -> tuple[int, tuple[int, list[Any]] | None, dict[str, int]]:
    """``(epoch, (epoch, every new consumer's plan) or None, dropped)`` for a Loader at
    ``where`` (rank, world size, num_workers, seed) resuming a state of another topology
    (see :func:`remaining_here`). This rank's plans are checked before they are used
    (the cursors of the files they read).
    """
    rank, world_size, num_workers, seed = where
    epoch, work, dropped = remaining_here(pipe, state, where, listings)
    if work is None:
        return epoch, None, dropped
    plans = full_deal(work, world_size, num_workers)
    per_rank = max(num_workers, 1)
    setup = {"world_size": world_size, "num_workers": num_workers, "seed": seed}
    validate_plans(
        pipe,
        setup,
        rank,
        epoch,
        plans[rank * per_rank : (rank + 1) * per_rank],
        listings,
        f"{checkpoint.rank_path(rank)} (this rank's share of epoch {epoch})",
    )
    return epoch, (epoch, plans), dropped


def saved_deal(state: dict[str, Any], epoch: int, world_size: int, num_workers: int) -> list[Any]:
    """Every consumer's plan of a dealt epoch, as far as the state holds them (a rank's own
    state holds its own; the others' are needed only to count even batches)."""
    per_rank = max(num_workers, 1)
    deal: list[Any] = [None] * (world_size * per_rank)
    for rank, entry in state["ranks"].items():
        theirs = checkpoint.entry_plans(entry, epoch)
        if theirs is not None:
            deal[int(rank) * per_rank : (int(rank) + 1) * per_rank] = theirs
    return deal


def full_deal(work: el.Work, world_size: int, num_workers: int) -> list[Any]:
    """Every consumer's plan of ``work`` on a topology, rank-major (one per worker, or one
    per rank without workers): the same on every rank that computes it."""
    return el.deal(work, world_size * max(num_workers, 1))


def plans_text(epoch: int, plans: list[Any]) -> str:
    """The JSON text a rank's entry keeps of its consumers' plans for ``epoch``."""
    return json.dumps({"epoch": epoch, "consumers": plans}, separators=(",", ":"))
