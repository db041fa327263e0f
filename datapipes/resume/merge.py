"""One state for a whole job from its ranks' states, and the check that a state is of this recipe.

:func:`merge_states` puts the ranks' states of one checkpoint together into one state
that loads on any topology; with the recipe it also works out the interrupted epoch's
remaining work (:mod:`datapipes.resume.remaining`) once, for every later Loader.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from datapipes.resume.graph_record import explain_difference
from datapipes.resume.model import JobState, RankEntry, Remaining
from datapipes.resume.parse import parse_state
from datapipes.resume.records import job_state
from datapipes.resume.remaining import remaining_work, resume_epoch
from nodes.errors import StateMismatchError

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe


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

    >>> import datapipes as dp
    >>> loaders = [dp.Loader(dp.range(8), rank=r, world_size=2) for r in range(2)]
    >>> its = [iter(loader) for loader in loaders]; _ = [next(it) for it in its]
    >>> merged = dp.merge_states([loader.state_dict() for loader in loaders])
    >>> sorted(merged["ranks"])
    ['0', '1']
    """
    parsed = [parse_state(state) for state in states]
    if not parsed:
        raise ValueError("merge_states needs the states of every rank, got none")
    first = parsed[0]
    ranks: dict[int, RankEntry] = {}
    for state in parsed:
        _check_same_job(first, state)
        for rank, entry in state.ranks.items():
            if rank in ranks and _without_graph(ranks[rank]) != _without_graph(entry):
                raise StateMismatchError(
                    f"merge_states got two different states of rank {rank}: they come from "
                    "different checkpoints (different steps); pass each rank's state of one "
                    "checkpoint once"
                )
            if rank not in ranks or ranks[rank].graph is None:
                ranks[rank] = entry
    world_size = first.setup.world_size
    missing = [r for r in range(world_size) if r not in ranks]
    if missing:
        raise StateMismatchError(
            f"merge_states got the states of rank(s) {sorted(ranks)} of a job "
            f"of {world_size} ranks: rank(s) {missing} are missing. Pass every rank's state "
            "(each rank's Loader.state_dict(), or dp.load_dcp_states for a DCP checkpoint)."
        )
    resume_epoch(ranks)  # refuses ranks in epochs one checkpoint cannot hold
    merged = JobState(first.fingerprint, first.steps, first.setup, dict(sorted(ranks.items())))
    if pipe is not None:
        check_recipe(merged, pipe.fingerprint(), pipe.steps())
        dropped: dict[str, int] = {}
        epoch, work = remaining_work(pipe, merged, None, dropped)
        merged = dataclasses.replace(merged, remaining=Remaining(epoch, work, dropped))
    return job_state(merged)


def check_recipe(state: JobState, fingerprint: str, steps: Iterable[str]) -> None:
    """Refuse (:class:`StateMismatchError`, showing the steps that differ) a state of
    another recipe."""
    if state.fingerprint != fingerprint:
        raise StateMismatchError(
            "this checkpoint was taken with a different recipe:\n"
            + explain_difference(list(state.steps), list(steps))
        )


def _check_same_job(first: JobState, state: JobState) -> None:
    if state.fingerprint != first.fingerprint:
        raise StateMismatchError(
            "merge_states got states of different recipes:\n"
            + explain_difference(list(first.steps), list(state.steps))
        )
    if state.setup.seed != first.setup.seed:
        raise StateMismatchError(
            f"merge_states got states of different seeds: {first.setup.seed} and "
            f"{state.setup.seed}; pass the states of one checkpoint of one job"
        )
    if state.setup != first.setup:
        raise StateMismatchError(
            f"merge_states got states of different topologies: {first.setup.topology()} and "
            f"{state.setup.topology()}; pass the states of one checkpoint of one job"
        )


def _without_graph(entry: RankEntry) -> RankEntry:
    return dataclasses.replace(entry, graph=None)
