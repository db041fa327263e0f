"""The report on a checkpoint's Loader states: as text, one line per level, or as JSON.

Per state: its version, fingerprint, seed, steps and topology; per rank its
epoch and position, the node states one line per level with their kinds, steps
and scalar fields (long lists summarised, never printed), and for worker
processes the snapshot, the next worker and one tree per worker.
"""

from __future__ import annotations

import reprlib
from typing import Any

from datapipes.inspect.dispatch import record_summary, record_text
from datapipes.inspect.job import plans_summary, ranks_text
from datapipes.inspect.tree import Level, RecipeGraph, recipe_graph
from datapipes.pipe import DataPipe
from datapipes.resume.graph import decode_state
from datapipes.resume.parse import STATE_VERSION
from nodes import torchdata_adapter as torchdata

#: Lists of scalars longer than this are summarised ("16 positions"), never printed.
_LIST_INLINE = 6


def scalar(value: Any) -> str:
    """A field's value in one short piece.

    >>> scalar(list(range(16))), scalar([1, "a"]), scalar({"files": 3})
    ('16 positions', "[1, 'a']", '{files: 3}')
    """
    if isinstance(value, str):  # a long one (a node state that does not parse) is cut
        return repr(value) if len(value) <= 200 else f"{value[:120]!r}... ({len(value)} chars)"
    if isinstance(value, list | tuple):
        if len(value) > _LIST_INLINE or any(isinstance(v, dict | list) for v in value):
            noun = "positions" if all(isinstance(v, int) for v in value) else "items"
            return f"{len(value)} {noun}"
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {scalar(v)}" for k, v in value.items()) + "}"
        return text if len(text) <= 100 else f"{{{len(value)} keys}}"
    return repr(value)


class Writer:
    """Collects the indented lines of the text view of one Loader state."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def position(self, depth: int, state: Any, graph: RecipeGraph) -> None:
        """One line per level of a node state, and a block per worker process."""
        if state is None:  # nothing read yet
            self.line(depth, "at the start of the epoch")
            return
        if not isinstance(state, dict):
            self.line(depth, scalar(state))
            return
        for level in graph.levels(state):
            if level.kind == "workers":
                self._workers(depth + level.depth, level, graph)
            else:
                self._level(depth + level.depth, level, graph)

    def _level(self, depth: int, level: Level, graph: RecipeGraph) -> None:
        kind, label = level.kind, level.steps
        if label and kind and not label.startswith(kind + " "):
            name = f"{label} ({kind})"
        else:
            name = label or kind or "?"
        head = (f"{level.key}: " if level.key else "") + name
        state = level.state
        fields = ", ".join(f"{k}={scalar(v)}" for k, v in state.items() if k not in level.nested)
        self.line(depth, f"{head}: {fields}{_note(level, graph)}" if fields else head)
        saved_kind = level.saved.get("kind") if level.saved is not None else None
        if level.saved is not None and saved_kind != kind:
            node = graph.node(level)
            self.line(
                depth + 1,
                f"! the recipe has a {type(node).__name__ if node else kind} ({kind}) here, "
                f"but the checkpoint's state here was taken by a {saved_kind} node",
            )

    def _workers(self, depth: int, level: Level, graph: RecipeGraph) -> None:
        """The StatefulDataLoader state: snapshot, next worker, and a tree per worker."""
        label = level.steps
        head = (f"{level.key}: " if level.key else "") + (
            f"{label.lstrip('.')} over " if label else ""
        )
        loader = level.state.get("dataloader")
        if not isinstance(loader, dict):
            self.line(depth, f"{head}worker processes: the epoch has ended")
            return
        workers = torchdata.worker_dataset_states(loader)
        where = torchdata.snapshot_summary(loader)
        count, since, step = where["num_workers"], where["steps_since"], where["snapshot_step"]
        self.line(depth, f"{head}{count} worker processes")
        self.line(
            depth + 1,
            f"snapshot after item {step} of the epoch; {since} items returned since, "
            "which a resume replays",
        )
        if where["last_worker"] is not None and count:
            following = (where["last_worker"] + 1 + since) % count
            self.line(
                depth + 1,
                f"next: item {step + since}, from worker {following} "
                "(workers take turns while all of them have data)",
            )
        if where["finished"]:
            self.line(depth + 1, "the DataLoader iterator has finished")
        for worker_id, dataset in workers:
            if not dataset:
                self.line(depth + 1, f"worker {worker_id}: no position yet (starts at the start)")
                continue
            consumer = dataset.get("consumer") or []
            at = "consumer ?"
            if len(consumer) == 4:
                rank, world, wid, num = consumer
                at = f"consumer {rank * num + wid} of {world * num}"
            skipped = dataset.get("skipped") or {}
            skip_text = ", ".join(f"{n} by {s}" for s, n in skipped.items()) or "none"
            self.line(
                depth + 1,
                f"worker {worker_id} ({at}): epoch {dataset.get('epoch')}, skipped: {skip_text}",
            )
            try:
                worker_graph = graph.worker(worker_id, dataset, level)
            except Exception:  # noqa: BLE001 - the recipe is a help; the recorded graph still works
                worker_graph = RecipeGraph(level.entry.get("workers") if level.entry else None)
            self.position(depth + 2, dataset.get("node"), worker_graph)


def _note(level: Level, graph: RecipeGraph) -> str:
    """What a level's fields mean for a resume, where that is not plain."""
    state = level.state
    if level.kind == "buffer shuffle":
        try:
            replay = int(state["seq"]) - int(state["anchor_seq"])
        except (KeyError, TypeError, ValueError):
            return ""
        return f"; a resume re-reads {replay} items from the anchor"
    if level.kind == "dispatched source":
        claims = state.get("claims")
        if not isinstance(claims, list):
            return ""
        if not claims:
            return "; no unit claimed before this position"
        noun = "unit" if len(claims) == 1 else "units"
        return f"; {len(claims)} {noun} claimed, inside unit {claims[-1]!r}"
    if level.kind == "reader":
        if state.get("file") is None:
            return "; this consumer's files are done"
        url = graph.url(level, state["file"])
        if url is not None:
            return f"; file {state['file']} is {url}"
    return ""


def render(
    found: list[tuple[str, dict[str, Any]]],
    pipe: DataPipe[Any] | None,
    checks: list[list[str]] | None,
    recipe_name: str = "recipe",
    reports: list[dict[str, Any] | None] | None = None,
) -> str:
    """The report on the Loader states ``found`` (and on ``checks``, one per state, if given).

    ``reports`` (one per state, see :func:`datapipes.inspect.job.elastic_report`,
    with ``merged_from`` and ``merge_problem`` when several states were given)
    add what the job's checkpoint covers, what remains of its epoch and how it
    would be dealt to another topology.
    """
    lines: list[str] = []
    # Without the recipe only the shape is checked: the positions point into data it names.
    check = f"recipe check ({recipe_name})" if pipe is not None else "state check (shape only)"
    passed = (
        "OK, same fingerprint and every saved rank loads"
        if pipe is not None
        else "OK; positions not checked against the data: pass --recipe MODULE:NAME for that"
    )
    for index, (path, state) in enumerate(found):
        writer = Writer()
        report = reports[index] if reports is not None else None
        try:
            _render_state(writer, path, state, pipe, report)
        except Exception as error:  # noqa: BLE001 - a malformed state is shown as it is
            writer.line(1, f"! cannot be shown level by level ({type(error).__name__}: {error})")
            writer.line(1, f"{reprlib.repr(state)}")
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


def _render_state(
    writer: Writer,
    path: str,
    state: dict[str, Any],
    pipe: DataPipe[Any] | None,
    report: dict[str, Any] | None = None,
) -> None:
    merged_from = (report or {}).get("merged_from") or []
    if merged_from and (report or {}).get("merge_problem"):
        writer.line(0, f"Loader states from {len(merged_from)} places, shown together (not merged)")
    elif merged_from:
        writer.line(0, f"Loader state merged from {len(merged_from)} states (dp.merge_states)")
        for source in merged_from:
            writer.line(1, f"from {source!r}" if source else "from the top level")
    else:
        writer.line(0, f"Loader state at {path!r}" if path else "Loader state at the top level")
    if (report or {}).get("merge_problem"):
        writer.line(1, f"! {report['merge_problem']}")  # type: ignore[index]
    version = state.get("version")
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
    writer.line(1, f"fingerprint  {state.get('fingerprint')}")
    writer.line(1, f"seed         {state.get('seed')}")
    writer.line(1, "steps")
    for step in state.get("steps", []):
        writer.line(2, str(step))
    topology = state.get("topology") or {}
    even = "on" if topology.get("even_batches") else "off"
    writer.line(
        1,
        f"topology     world size {topology.get('world_size')}, "
        f"{topology.get('num_workers')} workers, even_batches {even}",
    )
    same_recipe = pipe is not None and pipe.fingerprint() == state.get("fingerprint")
    ranks = decode_state(state)["ranks"]
    for rank in sorted(ranks, key=lambda r: (len(r), r)):
        mine = ranks[rank]
        if not isinstance(mine, dict):
            writer.line(1, f"rank {rank}: {scalar(mine)}")
            continue
        epoch = mine.get("epoch")
        writer.line(1, f"rank {rank}: epoch {epoch}")
        if mine.get("plans") is not None:
            writer.line(2, plans_text(mine, epoch))
        if mine.get("dispatch") is not None:
            told = ((report or {}).get("dispatch") or {}).get("ranks", {}).get(rank)
            writer.line(2, record_text(told or record_summary(mine["dispatch"])))
        if mine.get("node") is None:
            plans = plans_summary(mine, epoch if isinstance(epoch, int) else -1)
            if plans is not None and plans.get("current"):
                writer.line(2, f"no position: the next iteration reads its plan for epoch {epoch}")
            else:
                writer.line(2, f"no position: the next iteration runs epoch {epoch} from its start")
            continue
        saved = shared_graph(ranks, rank)
        graph = RecipeGraph(saved)
        if same_recipe and rank.isdigit():
            try:
                graph = recipe_graph(pipe, state, int(rank), int(epoch or 0), saved)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - the recipe is a help; the recorded graph still works
                pass
        writer.position(2, mine["node"], graph)
    for group in state.get("idle") or []:  # a merged state's ranks with nothing to say
        try:
            spans = [range(first, last + 1) for first, last in group["ranks"]]
            listed = ranks_text([rank for span in spans for rank in span])
        except (KeyError, TypeError, ValueError):
            writer.line(1, f"idle ranks: {scalar(group)}")
            continue
        noun = "rank" if len(listed.split(",")) == 1 and "-" not in listed else "ranks"
        writer.line(
            1,
            f"{noun} {listed}: epoch {group.get('epoch')}, no position (at the epoch's start; "
            "kept as ranges by merge_states)",
        )


def shared_graph(ranks: dict[str, Any], rank: str) -> dict[str, Any] | None:
    """``rank``'s graph record from decoded ``ranks``; a merged state keeps one for all
    ranks (they built the same shape: :func:`datapipes.merge_states`)."""
    mine = ranks.get(rank)
    if isinstance(mine, dict) and isinstance(mine.get("graph"), dict):
        return mine["graph"]
    for entry in ranks.values():
        if isinstance(entry, dict) and isinstance(entry.get("graph"), dict):
            return entry["graph"]
    return None


def as_json(
    checkpoint: str | list[str],
    found: list[tuple[str, dict[str, Any]]],
    checks: list[list[str]] | None,
    reports: list[dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """The report as JSON data: each Loader state decoded, the recipe checks if made, and
    per state (``reports``) what it covers, what remains of its epoch and how it is dealt
    (under ``"job"``; see :func:`datapipes.inspect.job.elastic_report`)."""
    states = []
    for index, (path, state) in enumerate(found):
        entry = {"path": path, "state": decode_state(state)}
        if reports is not None and reports[index] is not None:
            entry["job"] = reports[index]
        states.append(entry)
    out: dict[str, Any] = {"checkpoint": checkpoint, "loader_states": states}
    if checks is not None:
        out["recipe_check"] = [
            {"path": path, "ok": not problems, "problems": problems}
            for (path, _), problems in zip(found, checks)
        ]
    return out


# ----- the job: what the checkpoint covers, what remains, how it is dealt ---------------------

#: Consumers listed one per line in a deal; the rest are counted (``--json`` has them all).
_CONSUMERS_SHOWN = 16


def plans_text(entry: dict[str, Any], epoch: Any) -> str:
    """The line saying what plans a rank entry holds (a resume on another topology)."""
    summary = plans_summary(entry, epoch if isinstance(epoch, int) else -1)
    if summary is None:
        return f"plans: {scalar(entry.get('plans'))}"
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
