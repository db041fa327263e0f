"""What a job's checkpoint says about resuming it: coverage, the remaining work, its deal.

A state (parsed once, :class:`datapipes.resume.JobState`) covers every rank of
its job (it can resume on any topology) or some ranks only (it resumes on the
saved topology). For a state that covers its job, :func:`elastic_report` says,
with the recipe, how much of the interrupted epoch remains (per source: items
of a positions source, records and file rests of a file source, counted by
:mod:`datapipes.inspect.counts`) and how it would be dealt to another
topology; without the recipe, what the state itself tells (each rank's epoch,
the ranks that finished it, the plans a rank holds after a resume on another
topology, the units its consumers claimed under dynamic dispatch, from
:mod:`datapipes.inspect.dispatch`). Everything is plain data (the ``--json``
output); :mod:`datapipes.inspect.render` writes it as text.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from datapipes.inspect.counts import plans_summary, source_rows
from datapipes.inspect.dispatch import dispatch_ranks, job_units
from datapipes.inspect.tree import source_labels
from datapipes.pipe import DataPipe
from datapipes.resume import JobSetup, JobState, RankEntry, parse_state, remaining_work
from datapipes.resume.claims import ReplayDispatch
from datapipes.resume.remaining import resume_epoch
from nodes import elastic as el
from nodes.errors import InvalidStateError, StateMismatchError


class Shown(NamedTuple):
    """A Loader state to report on, where it came from, and its parsed model."""

    path: str  # where it was found ("file:path" when several checkpoints were given)
    state: dict[str, Any]  # as found or merged: what --json shows and a Loader loads
    merged_from: list[str]  # the paths of the states merged into it ([]: shown as found)
    problem: str  # why the states of its job that were given could not be merged ("": none)
    parsed: JobState | None  # None: it does not parse, and is shown as found
    unreadable: str  # why it does not parse ("": it does)

    @classmethod
    def found(cls, path: str, state: dict[str, Any]) -> Shown:
        """``state`` found at ``path``, parsed once."""
        try:
            return cls(path, state, [], "", parse_state(state), "")
        except Exception as error:  # noqa: BLE001 - shown as the reason, never as a traceback
            known = isinstance(error, StateMismatchError)  # InvalidStateError included
            why = str(error) if known else f"{type(error).__name__}: {error}"
            return cls(path, state, [], "", None, why)


# ----- coverage ------------------------------------------------------------------------------


def ranks_text(ranks: list[int]) -> str:
    """Rank numbers (or unit indices), runs written as ranges.

    >>> ranks_text([0, 1, 2, 5, 7, 8])
    '0-2, 5, 7-8'
    """
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and runs[-1][1] == rank - 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def coverage(state: JobState) -> tuple[bool, str]:
    """Whether a state holds every rank of its job, and what that means for a resume.

    >>> import datapipes as dp
    >>> one = dp.Loader(dp.range(4), rank=1, world_size=3).state_dict()
    >>> coverage(parse_state(one))[1].split(";")[0]
    'holds rank 1 of 3 only: resumes on the saved topology'
    """
    world_size = state.setup.world_size
    ranks = sorted(state.ranks)
    noun = "rank" if len(ranks) == 1 else "ranks"
    if state.covers_job:
        where = f"{noun} {ranks_text(ranks)} of {world_size}"
        return True, f"covers {where}: can resume on any topology"
    return False, (
        f"holds {noun} {ranks_text(ranks)} of {world_size} only: resumes on the saved topology; "
        "merge every rank's state to resume elsewhere"
    )


# ----- the report --------------------------------------------------------------------------------


def elastic_report(
    state: dict[str, Any],
    pipe: DataPipe[Any] | None = None,
    world_size: int | None = None,
    num_workers: int | None = None,
) -> dict[str, Any]:
    """What ``state`` (a Loader state) says about resuming its job elsewhere, as plain data.

    Always: whether it covers every rank of its job, each saved rank's epoch
    and status (mid-epoch, not started, finished the epoch) and the plans it
    holds. With ``pipe`` (the recipe; its fingerprint must be the state's) and
    a state that covers the job: ``remaining``, the interrupted epoch's
    remaining work per source (:func:`datapipes.inspect.counts.summarize`);
    with ``world_size`` or ``num_workers``, ``deal``: what each consumer of
    that topology would get.
    ``problem`` says why something asked for cannot be told (a refusal of an
    elastic resume, :class:`datapipes.ElasticResumeError`, is ``refused``).
    """
    return _report(Shown.found("", state), pipe, world_size, num_workers)


def job_report(
    item: Shown,
    pipe: DataPipe[Any] | None,
    world_size: int | None = None,
    num_workers: int | None = None,
) -> dict[str, Any]:
    """:func:`elastic_report` of a state found, with where it was merged from."""
    report = _report(item, pipe, world_size, num_workers)
    report.update(merged_from=item.merged_from, merge_problem=item.problem or None)
    return report


def _report(
    item: Shown,
    pipe: DataPipe[Any] | None,
    world_size: int | None,
    num_workers: int | None,
) -> dict[str, Any]:
    report: dict[str, Any] = {"problem": None, "refused": False}
    state = item.parsed
    if state is None:
        report["problem"] = f"this state cannot be read for a resume: {item.unreadable}"
        return report
    setup = state.setup
    covers, text = coverage(state)
    report.update(
        saved_topology={"world_size": setup.world_size, "num_workers": setup.num_workers},
        ranks=sorted(state.ranks),
        covers_job=covers,
        coverage=text,
    )
    try:
        epoch = resume_epoch(state.ranks)
    except StateMismatchError as error:  # ranks of different checkpoints: no job to resume
        report["covers_job"] = False
        report["coverage"] = (
            f"holds ranks {ranks_text(report['ranks'])} of {setup.world_size}, which do not "
            "make one checkpoint"
        )
        report["problem"] = str(error)
        return report
    report["epoch"] = epoch
    report["rank_status"] = {str(r): _rank_status(e, epoch) for r, e in state.ranks.items()}
    same_recipe = pipe is not None and pipe.fingerprint() == state.fingerprint
    dispatch = dispatch_ranks(state, pipe if same_recipe else None)
    if dispatch:
        report["dispatch"] = {"ranks": dispatch}
    asked = world_size is not None or num_workers is not None
    target = dataclasses.replace(
        setup,
        world_size=setup.world_size if world_size is None else world_size,
        num_workers=setup.num_workers if num_workers is None else num_workers,
    )
    deal = {"world_size": target.world_size, "num_workers": target.num_workers, "consumers": None}
    report["needs_recipe"] = pipe is None
    if pipe is None:
        if asked:
            report["deal"] = deal
            report["problem"] = (
                "the remaining work and its deal need the recipe (--recipe MODULE:NAME): "
                "the positions point into the data it names"
            )
        return report
    if not same_recipe:
        report["problem"] = "the recipe is not the checkpoint's (see the recipe check)"
        return report
    same = target.same_topology(setup)
    if not covers:  # the ranks not saved here hold the rest of the job's work
        if asked and not same:
            report["deal"] = deal
            report["problem"] = (
                f"cannot be dealt to world size {target.world_size}, "
                f"{target.num_workers} workers: only some ranks' states were given; pass "
                "every rank's checkpoint (they are merged) to resume on another topology"
            )
        return report
    try:
        labels = _remaining(report, pipe, state)
        if asked:
            report["deal"] = deal
            deal["exact_resume"] = same
            deal["consumers"] = _deal(report, pipe, state, target, labels)
    except StateMismatchError as error:  # ElasticResumeError included: a refusal, with its reason
        report["problem"] = str(error)
        report["refused"] = isinstance(error, el.ElasticResumeError)
    except OSError as error:  # the files the positions point into
        report["problem"] = f"reading the recipe's files failed: {error}"
    except Exception as error:  # noqa: BLE001 - shown as the reason, never as a traceback
        report["problem"] = f"telling the remaining work failed: {type(error).__name__}: {error}"
    return report


def _rank_status(entry: RankEntry, epoch: int) -> dict[str, Any]:
    plans = plans_summary(entry.plans, epoch)
    if entry.epoch > epoch:
        status = "finished"
    elif entry.node is not None:
        status = "mid-epoch"
    elif plans is not None and plans.get("current"):
        status = "dealt, not started"
    else:
        status = "not started"
    return {"epoch": entry.epoch, "status": status, "plans": plans}


def _remaining(report: dict[str, Any], pipe: DataPipe[Any], state: JobState) -> dict[str, str]:
    """The remaining work of the job's (first unfinished) epoch, per source; the sources'
    labels."""
    replays: list[ReplayDispatch] = []
    try:
        at, work = remaining_work(pipe, state, replays=replays)
    except InvalidStateError as error:
        raise StateMismatchError(str(error)) from error
    labels = source_labels(pipe, state.setup, at)
    if replays:  # a dynamic epoch: its units, and those no consumer reached
        records = [e.dispatch for e in state.ranks.values() if e.dispatch is not None]
        dispatch = report.setdefault("dispatch", {"ranks": {}})
        at_epoch = [record for record in records if record.epoch == at]
        dispatch.update(epoch=at, sources=job_units(replays[0], at_epoch, labels))
    report["remaining"] = {
        "epoch": at,
        "whole_epoch": work is None,
        "sources": source_rows(work, labels),
    }
    if work is not None:
        report["work"] = work
    return labels


def _deal(
    report: dict[str, Any],
    pipe: DataPipe[Any],
    state: JobState,
    target: JobSetup,
    labels: dict[str, str],
) -> list[dict[str, Any]]:
    """Each consumer of ``target``'s share of the remaining work.

    On the saved topology nothing is dealt: each rank resumes exactly where it
    stopped, so each rank's share is the remaining work of its own state.
    """
    epoch, work = report["remaining"]["epoch"], report.get("work")
    consumers = []
    if target.same_topology(state.setup):
        for rank in state.ranks:
            at, own = remaining_work(pipe, state.only(rank))
            sources = source_rows(own, labels) if at == epoch else []
            consumers.append({"rank": rank, "worker": None, "sources": sources})
    elif work is not None:
        for index, plan in enumerate(el.deal(work, target.num_consumers)):
            rank, worker = divmod(index, target.consumers_per_rank)
            kinds = {place: {"kind": work[place]["kind"], "pieces": p} for place, p in plan.items()}
            worker_id = worker if target.num_workers else None
            consumers.append(
                {"rank": rank, "worker": worker_id, "sources": source_rows(kinds, labels)}
            )
    return consumers
