"""The report on a checkpoint's Loader states: as text, or as JSON.

Per state: its version, fingerprint, seed, steps and topology; per rank its
epoch, plans, dispatch record and position (level by level, see
:class:`datapipes.inspect.position.Writer`); then the recipe check and the job's
part (:func:`datapipes.inspect.job.job_report`). A parsed state is shown from
its model; one that does not parse is shown as found, as far as it goes
(:func:`_as_found`, the one place that reads a state's raw fields).
"""

from __future__ import annotations

import reprlib
from typing import Any

from datapipes.inspect.counts import plans_summary
from datapipes.inspect.dispatch import record_summary
from datapipes.inspect.job import Shown, ranks_text
from datapipes.inspect.position import Writer, scalar
from datapipes.inspect.tree import RecipeGraph, recipe_graph, saved_graph
from datapipes.pipe import DataPipe
from datapipes.resume import JobState, Plans
from datapipes.resume.graph_record import decode_state
from datapipes.resume.parse import STATE_VERSION


def render(
    shown: list[Shown],
    pipe: DataPipe[Any] | None,
    checks: list[list[str]] | None,
    recipe_name: str = "recipe",
    reports: list[dict[str, Any] | None] | None = None,
) -> str:
    """The report on the Loader states ``shown`` (and on ``checks``, one per state, if given).

    ``reports`` (one per state, see :func:`datapipes.inspect.job.job_report`) add
    what the job's checkpoint covers, what remains of its epoch and how it would
    be dealt to another topology.
    """
    lines: list[str] = []
    # Without the recipe only the shape is checked: the positions point into data it names.
    check = f"recipe check ({recipe_name})" if pipe is not None else "state check (shape only)"
    passed = (
        "OK, same fingerprint and every saved rank loads"
        if pipe is not None
        else "OK; positions not checked against the data: pass --recipe MODULE:NAME for that"
    )
    for index, item in enumerate(shown):
        writer = Writer()
        report = reports[index] if reports is not None else None
        _heading(writer, item)
        try:
            if item.parsed is None:
                _as_found(writer, item.state)
            else:
                _ranks(writer, item.parsed, pipe, report)
        except Exception as error:  # noqa: BLE001 - a malformed state is shown as it is
            writer.line(1, f"! cannot be shown level by level ({type(error).__name__}: {error})")
            writer.line(1, f"{reprlib.repr(item.state)}")
        if checks is not None and checks[index]:
            writer.line(1, f"{check}: FAILED")
            for problem in checks[index]:
                for text in problem.splitlines():
                    writer.line(2, text)
        elif checks is not None:
            writer.line(1, f"{check}: {passed}")
        if report is not None:
            render_job(writer, report)
        lines += ([""] if index else []) + writer.lines
    return "\n".join(lines)


def _heading(writer: Writer, item: Shown) -> None:
    if item.merged_from and item.problem:
        writer.line(
            0, f"Loader states from {len(item.merged_from)} places, shown together (not merged)"
        )
    elif item.merged_from:
        writer.line(0, f"Loader state merged from {len(item.merged_from)} states (dp.merge_states)")
        for source in item.merged_from:
            writer.line(1, f"from {source!r}" if source else "from the top level")
    else:
        at = f"at {item.path!r}" if item.path else "at the top level"
        writer.line(0, f"Loader state {at}")
    if item.problem:
        writer.line(1, f"! {item.problem}")


def _envelope(
    writer: Writer, version: Any, fingerprint: Any, seed: Any, steps: Any, topology: Any
) -> None:
    """What every rank of the job shares: version, fingerprint, seed, steps, topology."""
    writer.line(1, f"version      {version}")
    if isinstance(version, int) and version < STATE_VERSION:
        writer.line(
            2,
            f"! saved by an older datapipes; a version {STATE_VERSION} Loader refuses it, and "
            "its nested node states are not told apart here",
        )
    elif version != STATE_VERSION:
        writer.line(
            2, f"! this datapipes reads version {STATE_VERSION}; what follows may be incomplete"
        )
    writer.line(1, f"fingerprint  {fingerprint}")
    writer.line(1, f"seed         {seed}")
    writer.line(1, "steps")
    for step in steps:
        writer.line(2, str(step))
    even = "on" if topology.get("even_batches") else "off"
    writer.line(
        1,
        f"topology     world size {topology.get('world_size')}, "
        f"{topology.get('num_workers')} workers, even_batches {even}",
    )


#: What a rank at an epoch's start with nothing else to say is, in one line.
_AT_START = "no position (at the epoch's start)"


def _ranks(
    writer: Writer, state: JobState, pipe: DataPipe[Any] | None, report: dict[str, Any] | None
) -> None:
    """A parsed state: what its ranks share, then each rank's position, level by level."""
    setup = state.setup
    _envelope(writer, STATE_VERSION, state.fingerprint, setup.seed, state.steps, setup.topology())
    same_recipe = pipe is not None and pipe.fingerprint() == state.fingerprint
    told = ((report or {}).get("dispatch") or {}).get("ranks", {})
    # In a state of several ranks, those at an epoch's start with nothing else to say are
    # written as ranges (as merge_states keeps them).
    idle = {r: e.epoch for r, e in state.ranks.items() if e.is_idle and len(state.ranks) > 1}
    for rank, entry in state.ranks.items():
        if rank in idle:
            continue
        writer.line(1, f"rank {rank}: epoch {entry.epoch}")
        if entry.plans is not None:
            writer.line(2, plans_text(entry.plans, entry.epoch))
        if entry.dispatch is not None:
            writer.line(2, record_text(told.get(str(rank)) or record_summary(entry.dispatch)))
        if entry.node is None:
            e = entry.epoch
            plan = entry.plans_of(e) is not None
            then = f"reads its plan for epoch {e}" if plan else f"runs epoch {e} from its start"
            writer.line(2, f"no position: the next iteration {then}")
            continue
        saved = saved_graph(state, rank)
        graph = RecipeGraph(saved)
        if same_recipe:
            try:
                graph = recipe_graph(pipe, state, rank, saved)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - the recipe is a help; the recorded graph still works
                pass
        writer.position(2, entry.node, graph)
    for epoch in sorted(set(idle.values())):
        listed = ranks_text([rank for rank, at in idle.items() if at == epoch])
        noun = "rank" if listed.isdigit() else "ranks"
        writer.line(1, f"{noun} {listed}: epoch {epoch}, {_AT_START}")


def _as_found(writer: Writer, state: dict[str, Any]) -> None:
    """A state that does not parse, shown as far as it goes: the one place that reads a
    state's raw fields (the reason it does not parse is the state check's)."""
    topology = state.get("topology")
    shared = [state.get(key) for key in ("version", "fingerprint", "seed")]
    steps = state.get("steps", [])
    _envelope(writer, *shared, steps, topology if isinstance(topology, dict) else {})
    ranks = decode_state(state)["ranks"]
    recorded = [e.get("graph") for e in ranks.values() if isinstance(e, dict)]
    recorded = [graph for graph in recorded if isinstance(graph, dict)]
    for rank in sorted(ranks, key=lambda r: (len(r), r)):
        mine = ranks[rank]
        if not isinstance(mine, dict):
            writer.line(1, f"rank {rank}: {scalar(mine)}")
        elif mine.get("node") is None:
            writer.line(1, f"rank {rank}: epoch {mine.get('epoch')}, {_AT_START}")
        else:
            writer.line(1, f"rank {rank}: epoch {mine.get('epoch')}")
            graph = mine.get("graph", next(iter(recorded), None))  # a merged state keeps one
            writer.position(2, mine["node"], RecipeGraph(graph))
    for group in state.get("idle") or []:
        writer.line(1, f"idle ranks: {reprlib.repr(group)}")


def as_json(
    checkpoint: str | list[str],
    shown: list[Shown],
    checks: list[list[str]] | None,
    reports: list[dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """The report as JSON data: each Loader state decoded, the recipe checks if made, and
    per state (``reports``) what it covers, what remains of its epoch and how it is dealt
    (under ``"job"``; see :func:`datapipes.inspect.job.job_report`)."""
    states = []
    for index, item in enumerate(shown):
        # The state as found (or merged), its JSON strings decoded: what --json is for.
        entry = {"path": item.path, "state": decode_state(item.state)}
        if reports is not None and reports[index] is not None:
            entry["job"] = reports[index]
        states.append(entry)
    out: dict[str, Any] = {"checkpoint": checkpoint, "loader_states": states}
    if checks is not None:
        out["recipe_check"] = [
            {"path": item.path, "ok": not problems, "problems": problems}
            for item, problems in zip(shown, checks)
        ]
    return out


# ----- the job: what the checkpoint covers, what remains, how it is dealt ---------------------

#: Consumers listed one per line in a deal; the rest are counted (``--json`` has them all).
_CONSUMERS_SHOWN = 16


def plans_text(plans: Plans, epoch: int) -> str:
    """The line saying what plans a rank entry of ``epoch`` holds (a resume on another
    topology)."""
    summary = plans_summary(plans, epoch)
    assert summary is not None  # there are plans
    if "problem" in summary:
        return f"! plans: {summary['problem']}"
    consumers = summary["consumers"]
    noun = (
        "consumer's plan holds"
        if len(consumers) == 1
        else f"{len(consumers)} consumers' plans hold"
    )
    held = f"its {noun} {summary['pieces']} pieces"
    totals = _added([source for plan in consumers for source in plan.values()])
    what = "; ".join(source_text(t, held="single records") for t in totals)
    if summary["current"]:
        return f"dealt by a resume from another topology: {held} of epoch {summary['epoch']}" + (
            f" ({what})" if what else ""
        )
    return f"plans of epoch {summary['epoch']} (done; no longer read): {held}"


def record_text(summary: dict[str, Any]) -> str:
    """The line of a rank's dispatch record (see :func:`datapipes.inspect.dispatch.record_summary`).

    >>> record_text({"epoch": 0, "unit_items": 64, "consumers": 2, "units": {"7": 16},
    ...     "claims": [{"consumer": 1, "claimed": 2,
    ...                 "sources": [{"label": "r", "units": [2, 3]}]}]}).split(": ")[1]
    'consumer 1 claimed [2-3] (2 units)'
    """
    if "problem" in summary:
        return f"! dynamic dispatch: {summary['problem']}"
    head = f"dynamic dispatch, epoch {summary['epoch']}, unit size {summary['unit_items']}"
    units = summary.get("units") or {}
    several = len(units) > 1 or any(len(row["sources"]) > 1 for row in summary["claims"])
    if len(units) == 1:
        head += f", {next(iter(units.values()))} units per source"
    elif units:
        named = summary.get("labels") or {}
        counts = sorted((named.get(place, place), count) for place, count in units.items())
        head += ", units per source: " + ", ".join(f"{name} {count}" for name, count in counts)
    if summary.get("resumed"):
        head += " (a resumed epoch's rest)"
    parts = []
    for row in summary["claims"]:
        noun = "unit" if row["claimed"] == 1 else "units"
        if several:  # the sources it claimed units of
            what = ", ".join(
                f"{s['label']} [{ranks_text(s['units'])}]" for s in row["sources"] if s["units"]
            )
            what = what or "[]"
        else:
            what = f"[{ranks_text([u for s in row['sources'] for u in s['units']])}]"
        parts.append(f"consumer {row['consumer']} claimed {what} ({row['claimed']} {noun})")
    return head + ": " + ("; ".join(parts) or "no consumer of this rank claimed a unit")


def _added(sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Summaries of one kind added up (the plans of several consumers)."""
    out: dict[str, dict[str, Any]] = {}
    for source in sources:
        total = out.setdefault(source["kind"], {"kind": source["kind"]})
        for key, value in source.items():
            if key == "kind":
                continue
            if value is None or total.get(key, 0) is None:
                total[key] = None
            elif isinstance(value, int):
                total[key] = total.get(key, 0) + value
    return list(out.values())


def source_text(summary: dict[str, Any], held: str = "records read but not delivered") -> str:
    """What one source's remaining work holds, in words (``held``: what single records are).

    >>> source_text({"kind": "positions", "pieces": 3, "items": 38, "partial": 0})
    '38 items'
    >>> source_text({"kind": "records", "pieces": 5, "held": 3, "whole": 1, "started": 1})
    '3 records read but not delivered, then the rest of 2 files/parts (1 untouched, 1 started)'
    """
    kind = summary["kind"]
    if kind in ("positions", "stream"):
        items = summary.get("items")
        text = f"{items} items" if items is not None else f"an open stream tail ({kind})"
        if summary.get("partial"):
            text += f", {summary['partial']} of them partly expanded by a flat_map"
        return text
    if kind == "files":
        return f"{summary.get('items')} files"
    parts = []
    if summary.get("held"):
        parts.append(f"{summary['held']} {held}")
    whole, started = summary.get("whole") or 0, summary.get("started") or 0
    if whole or started:
        noun = "file/part" if whole + started == 1 else "files/parts"
        rests = f"the rest of {whole + started} {noun} ({whole} untouched, {started} started)"
        parts.append(("then " if parts else "") + rests)
    return ", ".join(parts) or "nothing"


def _status_text(status: dict[str, dict[str, Any]], epoch: int) -> str:
    groups: dict[str, list[int]] = {}
    for rank, entry in status.items():
        groups.setdefault(entry["status"], []).append(int(rank))
    parts = []
    for name, ranks in groups.items():
        noun = "rank" if len(ranks) == 1 else "ranks"
        what = f"finished it (at epoch {epoch + 1})" if name == "finished" else name
        parts.append(f"{noun} {ranks_text(ranks)} {what}")
    return f"epoch {epoch}: " + ", ".join(parts)


def _topology_text(world_size: int, num_workers: int) -> str:
    return f"world size {world_size}, {num_workers} workers per rank"


def render_job(writer: Writer, report: dict[str, Any]) -> None:
    """The job part of a state's report (see :func:`datapipes.inspect.job.elastic_report`)."""
    if "coverage" not in report:
        if report.get("problem"):
            writer.line(1, f"job: ! {report['problem']}")
        return
    writer.line(1, f"job          {report['coverage']}")
    if "rank_status" in report:
        writer.line(2, _status_text(report["rank_status"], report["epoch"]))
        planned = [int(r) for r, s in report["rank_status"].items() if s.get("plans")]
        if planned:
            noun = "rank {} holds" if len(planned) == 1 else "ranks {} hold"
            writer.line(2, f"{noun.format(ranks_text(planned))} plans dealt by an elastic resume")
    remaining = report.get("remaining")
    if report.get("needs_recipe") and not report.get("problem"):
        writer.line(
            1,
            "remaining    the remaining work and its deal need the recipe (--recipe MODULE:NAME): "
            "the positions point into the data it names",
        )
    elif remaining is not None:
        if remaining["whole_epoch"]:
            writer.line(
                1,
                f"remaining    the whole of epoch {remaining['epoch']} (no rank had started it): "
                "a fresh epoch of any topology deals it",
            )
        else:
            writer.line(1, f"remaining    of epoch {remaining['epoch']}")
            for source in remaining["sources"]:
                writer.line(2, f"{source['label']} ({source['kind']}): {source_text(source)}")
    dispatched = (report.get("dispatch") or {}).get("sources")
    if dispatched is not None:
        writer.line(
            1, f"dispatch     epoch {report['dispatch'].get('epoch')} was dispatched dynamically"
        )
        for source in dispatched:
            writer.line(
                2,
                f"{source['label']}: {source['units']} units, {source['claimed']} claimed; "
                f"{source['unreached']} no consumer reached (a resume hands them out whole)",
            )
    deal = report.get("deal")
    if deal is not None and deal.get("consumers") is not None:
        topology = _topology_text(deal["world_size"], deal["num_workers"])
        if deal.get("exact_resume"):
            writer.line(
                1,
                f"on {topology} (the saved topology): each rank resumes exactly where it "
                "stopped, nothing is dealt again",
            )
        else:
            writer.line(1, f"dealt to {topology}")
        consumers = deal["consumers"]
        for consumer in consumers[:_CONSUMERS_SHOWN]:
            name = f"rank {consumer['rank']}"
            if consumer.get("worker") is not None:
                name += f" worker {consumer['worker']}"
            what = (
                "; ".join(f"{s['label']}: {source_text(s)}" for s in consumer["sources"])
                or "nothing"
            )
            writer.line(2, f"{name}: {what}")
        if len(consumers) > _CONSUMERS_SHOWN:
            more = len(consumers) - _CONSUMERS_SHOWN
            writer.line(2, f"... and {more} more consumers (--json lists every one)")
    if report.get("problem"):
        label = "cannot resume elsewhere" if report.get("refused") else "not told"
        writer.line(1, f"! {label}: {report['problem']}")
