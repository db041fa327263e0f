"""A job's checkpoint as a whole: its ranks' states merged, and what remains of the epoch.

A job of several ranks often saves one file per rank (``torch.save`` of each
rank's ``Loader.state_dict()``), or a DCP folder that holds every rank. The
Loader states found in the checkpoints given are grouped by job (same recipe,
seed and topology) and each group is merged with :func:`datapipes.merge_states`,
so the report is about the job, not about one file.

For a state that covers every rank of its job, :func:`elastic_report` says,
with the recipe, how much of the interrupted epoch remains (per source: items
of a positions source, records and file rests of a file source) and how it
would be dealt to another topology; without the recipe, what the state itself
tells (each rank's epoch, the ranks that finished it, the plans a rank holds
after a resume on another topology). Everything is plain data (the ``--json``
output); :mod:`datapipes.inspect.render` writes it as text.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from datapipes.inspect.dispatch import job_units, rank_record, record_summary, unit_counts
from datapipes.pipe import DataPipe
from datapipes.placement import worker_part
from datapipes.resume import JobState, job_state, merge_states, parse_state, remaining_work
from datapipes.resume.claims import ReplayDispatch, epoch_work
from datapipes.resume.graph import find_loader_states
from datapipes.resume.remaining import resume_epoch
from nodes import Context
from nodes import elastic as el
from nodes.errors import InvalidStateError, StateMismatchError


class Shown(NamedTuple):
    """A Loader state to report on, and where it came from."""

    path: str  # where it was found ("file:path" when several checkpoints were given)
    state: dict[str, Any]
    merged_from: list[str]  # the paths of the states merged into it ([]: shown as found)
    problem: str  # why the states of its job that were given could not be merged ("": none)


# ----- finding and merging --------------------------------------------------------------------


def gather(checkpoints: list[tuple[str, Any]]) -> list[Shown]:
    """The Loader states in ``checkpoints`` (``(name, loaded object)`` each), by job.

    States of one job (same fingerprint, steps, seed and topology) found in
    several places are merged with :func:`datapipes.merge_states` (one
    ``torch.save`` file per rank, in any order); when that is refused (a rank
    twice with different positions, states of different steps) each is shown
    as found, with the reason. A state alone is shown as found.
    """
    several = len(checkpoints) > 1
    found: list[tuple[str, dict[str, Any]]] = []
    for name, checkpoint in checkpoints:
        for path, state in find_loader_states(checkpoint):
            where = (f"{name}:{path}" if path else name) if several else path
            found.append((where, state))
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path, state in found:
        groups.setdefault(_job_key(state), []).append((path, state))
    shown: list[Shown] = []
    for group in groups.values():
        if len(group) == 1:
            shown.append(Shown(group[0][0], group[0][1], [], ""))
            continue
        try:
            merged = merge_states([state for _, state in group])
        except (StateMismatchError, ValueError) as error:
            why = f"the {len(group)} states of this job given were not merged: {error}"
            together = _together(group)
            if together is not None:  # some ranks of the job, each once: shown as one
                shown.append(Shown(f"{len(group)} states", together, [p for p, _ in group], why))
            else:
                shown += [Shown(path, state, [], why) for path, state in group]
            continue
        paths = [path for path, _ in group]
        shown.append(Shown(f"merged from {len(group)} states", merged, paths, ""))
    return shown


def _together(group: list[tuple[str, dict[str, Any]]]) -> dict[str, Any] | None:
    """States of some ranks of one job as one state (not merged: not every rank is there),
    or ``None`` when two of them hold the same rank."""
    ranks: dict[str, Any] = {}
    for _, state in group:
        saved = state.get("ranks")
        if not isinstance(saved, dict) or any(rank in ranks for rank in saved):
            return None
        try:
            saved = _written_out(parse_state(state))["ranks"]  # idle ranks written out too
        except (StateMismatchError, InvalidStateError):
            return None
        if any(rank in ranks for rank in saved):
            return None
        ranks.update(saved)
    first = {key: value for key, value in group[0][1].items() if key != "idle"}
    return {**first, "ranks": {rank: ranks[rank] for rank in sorted(ranks, key=_rank_order)}}


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), rank) if str(rank).isdigit() else (1 << 62, str(rank))


def _job_key(state: dict[str, Any]) -> str:
    """What the states of one job share (each rank's own state differs in its ranks only)."""
    shared = {key: state.get(key) for key in ("version", "fingerprint", "steps", "seed")}
    return json.dumps({**shared, "topology": state.get("topology")}, sort_keys=True, default=str)


# ----- coverage ------------------------------------------------------------------------------


def ranks_text(ranks: list[int]) -> str:
    """Rank numbers, runs written as ranges.

    >>> ranks_text([0, 1, 2, 5, 7, 8])
    '0-2, 5, 7-8'
    """
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and runs[-1][1] == rank - 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _written_out(state: JobState) -> dict[str, Any]:
    """A parsed state as raw data with every rank's entry written out (idle ranges too)."""
    return job_state(state, idle_as_ranges=False)


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


# ----- pieces of work, counted for people ----------------------------------------------------


def _source_row(place: str, labels: dict[str, str], entry: dict[str, Any]) -> dict[str, Any]:
    """One source's line of the remaining work: its label and what its pieces hold."""
    summary = summarize(entry["kind"], entry["pieces"], entry.get("held"))
    return {"place": place, "label": labels.get(place, place), **summary}


def summarize(kind: str | None, pieces: list[el.Piece], held: int | None = None) -> dict[str, Any]:
    """What a list of pieces of one source holds (``kind`` ``None``: told by the pieces).

    Positions: ``items`` (``None`` for an open-ended stream tail), in ``runs``,
    of which ``partial`` are items a ``flat_map`` had started. Records:
    ``held`` single records (read but not delivered at the checkpoint, first),
    then ``whole`` untouched files or file parts and ``started`` ones (their
    rest from a record); their records are known only by reading the files.
    Files (a file list): ``items``, the files.
    """
    if kind is None:
        kind = el.POSITIONS if pieces and "range" in pieces[0] else el.RECORDS
    out: dict[str, Any] = {"kind": kind, "pieces": len(pieces)}
    if kind in (el.POSITIONS, el.STREAM):
        lengths = [el.piece_length(piece) for piece in pieces]
        out["items"] = None if None in lengths else sum(lengths)  # type: ignore[arg-type]
        # Held positions join the untouched ranges they continue (nodes.elastic.coalesce):
        # the work counts them ("held"); a plan's pieces alone do not tell.
        out["held"] = held
        out["partial"] = sum(1 for p in pieces if "outputs" in p or "from" in p)
        return out
    if kind == el.FILES:
        out["items"] = len(pieces)
        return out
    rests = [piece for piece in pieces if not piece.get("one")]
    whole = sum(1 for p in rests if p.get("cursor") is None and not p.get("index"))
    out.update(held=len(pieces) - len(rests), whole=whole, started=len(rests) - whole)
    return out


def plans_summary(entry: dict[str, Any], epoch: int) -> dict[str, Any] | None:
    """The plans a rank entry holds: for which epoch, and per consumer what they hold."""
    plans = entry.get("plans")
    if not isinstance(plans, dict):
        return None
    try:
        value = json.loads(plans["text"])
        consumers = value["consumers"]
        summaries = [
            {place: summarize(None, pieces) for place, pieces in sorted(plan.items())}
            for plan in consumers
        ]
    except (KeyError, TypeError, ValueError) as error:
        return {"problem": f"unreadable plans ({type(error).__name__}: {error})"}
    pieces = sum(s["pieces"] for plan in summaries for s in plan.values())
    return {
        "epoch": value["epoch"],
        "current": value["epoch"] == epoch,
        "consumers": summaries,
        "pieces": pieces,
    }


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
    remaining work per source (:func:`summarize`); with ``world_size`` or
    ``num_workers``, ``deal``: what each consumer of that topology would get.
    ``problem`` says why something asked for cannot be told (a refusal of an
    elastic resume, :class:`datapipes.ElasticResumeError`, is ``refused``).
    """
    report: dict[str, Any] = {"problem": None, "refused": False}
    try:
        parsed = parse_state(state)
    except StateMismatchError as error:
        report["problem"] = f"this state cannot be read for a resume: {error}"
        return report
    state = _written_out(parsed)  # a merged state keeps the ranks with nothing to say apart
    setup = parsed.setup
    covers, text = coverage(parsed)
    ranks = state["ranks"]
    report.update(
        saved_topology={"world_size": setup.world_size, "num_workers": setup.num_workers},
        ranks=sorted(int(rank) for rank in ranks),
        covers_job=covers,
        coverage=text,
    )
    try:
        epoch = resume_epoch(parsed.ranks)
    except StateMismatchError as error:  # ranks of different checkpoints: no job to resume
        report["covers_job"] = False
        report["coverage"] = (
            f"holds ranks {ranks_text(report['ranks'])} of {setup.world_size}, which do not "
            "make one checkpoint"
        )
        report["problem"] = str(error)
        return report
    report["epoch"] = epoch
    report["rank_status"] = {
        rank: _rank_status(ranks[rank], epoch) for rank in sorted(ranks, key=int)
    }
    same_recipe = pipe is not None and pipe.fingerprint() == state["fingerprint"]
    dispatch = dispatch_ranks(state, pipe if same_recipe else None)
    if dispatch:
        report["dispatch"] = {"ranks": dispatch}
    asked = world_size is not None or num_workers is not None
    target = {
        "world_size": setup.world_size if world_size is None else world_size,
        "num_workers": setup.num_workers if num_workers is None else num_workers,
    }
    report["needs_recipe"] = pipe is None
    if pipe is None:
        if asked:
            report["deal"] = {**target, "consumers": None}
            report["problem"] = (
                "the remaining work and its deal need the recipe (--recipe MODULE:NAME): "
                "the positions point into the data it names"
            )
        return report
    if pipe.fingerprint() != state["fingerprint"]:
        report["problem"] = "the recipe is not the checkpoint's (see the recipe check)"
        return report
    same = target == report["saved_topology"]
    if not covers:  # the ranks not saved here hold the rest of the job's work
        if asked and not same:
            report["deal"] = {**target, "consumers": None}
            report["problem"] = (
                f"cannot be dealt to world size {target['world_size']}, "
                f"{target['num_workers']} workers: only some ranks' states were given; pass "
                "every rank's checkpoint (they are merged) to resume on another topology"
            )
        return report
    try:
        _remaining(report, pipe, state, parsed)
        if asked:
            report["deal"] = {**target, "consumers": None}
            _deal(report, pipe, state, parsed, target, same)
    except StateMismatchError as error:  # ElasticResumeError included: a refusal, with its reason
        report["problem"] = str(error)
        report["refused"] = isinstance(error, el.ElasticResumeError)
    except OSError as error:  # the files the positions point into
        report["problem"] = f"reading the recipe's files failed: {error}"
    except Exception as error:  # noqa: BLE001 - shown as the reason, never as a traceback
        report["problem"] = f"telling the remaining work failed: {type(error).__name__}: {error}"
    return report


def _rank_status(entry: dict[str, Any], epoch: int) -> dict[str, Any]:
    plans = plans_summary(entry, epoch)
    if entry["epoch"] > epoch:
        status = "finished"
    elif entry["node"] is not None:
        status = "mid-epoch"
    elif plans is not None and plans.get("current"):
        status = "dealt, not started"
    else:
        status = "not started"
    return {"epoch": entry["epoch"], "status": status, "plans": plans}


def _remaining(
    report: dict[str, Any], pipe: DataPipe[Any], state: dict[str, Any], parsed: JobState
) -> None:
    """The remaining work of the job's (first unfinished) epoch, per source."""
    replays: list[ReplayDispatch] = []
    try:
        at, work = remaining_work(pipe, parsed, replays=replays)
    except InvalidStateError as error:
        raise StateMismatchError(str(error)) from error
    labels = source_labels(pipe, state, at)
    if replays:  # a dynamic epoch: its units, and those no consumer reached
        records = [r for e in state["ranks"].values() if (r := rank_record(e)) is not None]
        records = [r for r in records if r["epoch"] == at]
        dispatch = report.setdefault("dispatch", {"ranks": {}})
        dispatch.update(epoch=at, sources=job_units(replays[0], records, labels))
    if work is None:
        report["remaining"] = {"epoch": at, "whole_epoch": True, "sources": []}
        return
    report["remaining"] = {
        "epoch": at,
        "whole_epoch": False,
        "sources": [
            _source_row(place, labels, e)
            for place, e in sorted(work.items(), key=lambda kv: labels.get(kv[0], kv[0]))
        ],
    }
    report["work"] = work


def _deal(
    report: dict[str, Any],
    pipe: DataPipe[Any],
    state: dict[str, Any],
    parsed: JobState,
    target: dict[str, int],
    same: bool,
) -> None:
    """Each consumer's share of the remaining work on ``target``.

    On the saved topology nothing is dealt: each rank resumes exactly where it
    stopped, so each rank's share is the remaining work of its own state.
    """
    deal = report["deal"]
    deal["exact_resume"] = same
    labels = source_labels(pipe, state, report["remaining"]["epoch"])
    work = report.get("work")
    consumers = []
    if same:
        for rank in parsed.ranks:
            at, own = remaining_work(pipe, parsed.only(rank))
            sources = _sources(own, labels) if at == report["remaining"]["epoch"] else []
            consumers.append({"rank": rank, "worker": None, "sources": sources})
    elif work is not None:
        plans = el.deal(work, target["world_size"] * max(target["num_workers"], 1))
        per_rank = max(target["num_workers"], 1)
        for index, plan in enumerate(plans):
            rank, worker = divmod(index, per_rank)
            kinds = {place: {"kind": work[place]["kind"], "pieces": p} for place, p in plan.items()}
            consumers.append(
                {
                    "rank": rank,
                    "worker": worker if target["num_workers"] else None,
                    "sources": _sources(kinds, labels),
                }
            )
    deal["consumers"] = consumers


def _sources(work: el.Work | None, labels: dict[str, str]) -> list[dict[str, Any]]:
    if not work:
        return []
    return [
        _source_row(place, labels, e)
        for place, e in sorted(work.items(), key=lambda kv: labels.get(kv[0], kv[0]))
    ]


def dispatch_ranks(state: dict[str, Any], pipe: DataPipe[Any] | None) -> dict[str, Any]:
    """Each rank's dispatch record (dynamic dispatch) as plain data, by rank; with the recipe
    (``pipe``, the state's) also how many units each source had. A damaged record is a
    ``problem``, never an exception."""
    out: dict[str, Any] = {}
    whole: dict[int, Any] = {}  # the whole work of an epoch, worked out once
    named: dict[int, dict[str, str]] = {}  # and its sources' labels
    for rank, entry in sorted(state["ranks"].items(), key=lambda kv: int(kv[0])):
        record = rank_record(entry)
        if record is None:
            continue
        labels: dict[str, str] = {}
        units: dict[str, int] | None = None
        if pipe is not None:
            try:
                epoch = record["epoch"]
                if epoch not in named:
                    named[epoch] = source_labels(pipe, state, epoch)
                labels = named[epoch]
                if record["work"] is None and epoch not in whole:
                    setup = parse_state(state).setup
                    part = worker_part(pipe, setup.num_workers)
                    whole[epoch] = epoch_work(part, Context(epoch=epoch, seed=setup.seed))
                units = unit_counts(record, whole.get(epoch))
            except Exception as error:  # noqa: BLE001 - shown as the record's problem
                out[rank] = {"problem": f"cutting its epoch into units failed: {error}"}
                continue
        out[rank] = record_summary(record, labels, units)
    return out


def source_labels(pipe: DataPipe[Any], state: dict[str, Any], epoch: int) -> dict[str, str]:
    """Each source's place in the recipe, labelled with the recipe's steps that build it."""
    from datapipes.resume.graph import graph_record  # the record names each node's steps

    setup = parse_state(state).setup
    part = worker_part(pipe, setup.num_workers)
    ctx = Context(world_size=setup.world_size, seed=setup.seed, epoch=epoch)
    pipes: dict[int, DataPipe[Any]] = {}
    nodes: dict[int, Any] = {}
    labels: dict[str, str] = {}
    try:
        root = part.build(ctx)
    except Exception:  # noqa: BLE001 - labels are a help: the places stand in for them
        return labels
    try:
        graph_record(root, part, nodes=nodes, pipes=pipes)
        for key, node in nodes.items():
            place = node.place
            if node.elastic == "source" and place is not None and key in pipes:
                labels.setdefault(place, repr(pipes[key]))
    except Exception:  # noqa: BLE001
        pass
    finally:
        root.close()
    return labels
