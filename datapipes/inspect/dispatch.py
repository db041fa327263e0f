"""A dynamic checkpoint's dispatch records, for ``inspect``: the graphs and the units.

Under ``dp.Loader(..., dispatch="dynamic")`` each rank entry of a checkpoint
carries a ``"dispatch"`` record (see :mod:`datapipes.dispatch`): the epoch, the
unit size, the number of consumers, the epoch's work when it was a resumed
one's rest, and the units each of the rank's consumers claimed, per source.

This module builds a rank's (or worker's) graph the way the Loader did (each
source wrapped to read the units it claimed, replaying the record's claims, so
nothing is claimed from a store), and turns the records into plain data for
the report: the claims per consumer, and with the recipe the units each
source had and those no consumer reached (what a resume hands out whole).
"""

from __future__ import annotations

from typing import Any

from datapipes.pipe import DataPipe
from datapipes.resume.claims import ReplayDispatch, epoch_work
from nodes import Context
from nodes.dispatch import Dispatcher, DispatchSpec

Record = dict[str, Any]


def rank_record(entry: Any) -> Record | None:
    """The dispatch record of a decoded rank entry (``None``: dealt statically)."""
    record = entry.get("dispatch") if isinstance(entry, dict) else None
    return record if isinstance(record, dict) else None


def attach_replay(ctx: Context, record: Record | None, part: DataPipe[Any]) -> None:
    """Build ``ctx``'s graph as a dynamic Loader did: its sources read the units that
    ``ctx``'s consumer claimed in ``record`` (replayed; nothing is claimed from a store).

    ``part``: the recipe the consumer ran (with workers, its worker part), which
    gives the epoch's whole work when the record does not hold it.
    """
    if record is None:
        return
    if record.get("epoch") == ctx.epoch:
        work = record["work"] if record.get("work") is not None else None
        if work is None:
            work = epoch_work(part, Context(epoch=ctx.epoch, seed=ctx.seed))
        claims = (record.get("claims") or {}).get(str(ctx.consumer_index), {})
    else:  # a record of another epoch: the graph's shape only (its units are not known)
        work, claims = {}, {}
    spec = DispatchSpec(
        None,
        str(record.get("key")),
        ctx.epoch,
        int(record.get("consumers") or 1),
        int(record.get("unit_items") or 1),
        work,
    )
    ctx.work = Dispatcher(spec, ctx.consumer_index, recorded=claims)


def unit_counts(record: Record, whole_epoch: dict[str, Any] | None) -> dict[str, int]:
    """How many units each source of ``record``'s epoch had (``whole_epoch``: the epoch's
    work when the record does not hold it, i.e. the epoch ran from its start)."""
    work = record["work"] if record.get("work") is not None else whole_epoch
    if work is None:
        return {}
    spec = DispatchSpec(None, "", record["epoch"], record["consumers"], record["unit_items"], work)
    return {place: len(spec.units(place)) for place in work}


def runs_text(units: list[int]) -> str:
    """Unit indices, runs written as ranges.

    >>> runs_text([3, 0, 1, 2, 7]), runs_text([])
    ('[0-3, 7]', '[]')
    """
    runs: list[list[int]] = []
    for unit in sorted(set(units)):
        if runs and runs[-1][1] == unit - 1:
            runs[-1][1] = unit
        else:
            runs.append([unit, unit])
    return "[" + ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs) + "]"


def record_summary(
    record: Any, labels: dict[str, str] | None = None, units: dict[str, int] | None = None
) -> dict[str, Any]:
    """A rank's dispatch record as plain data: epoch, unit size, consumers, and per
    consumer the units it claimed per source (``labels``: the sources' recipe labels;
    ``units``: each source's number of units, when known). A damaged record gives
    ``{"problem": why}``; nothing here raises."""
    try:
        epoch, unit_items = record["epoch"], record["unit_items"]
        consumers = record["consumers"]
        claims = record["claims"]
        rows = []
        for consumer in sorted(claims, key=int):
            places = claims[consumer]
            per_source = [
                {
                    "place": place,
                    "label": (labels or {}).get(place, place),
                    "units": [int(u) for u in places[place]],
                }
                for place in sorted(places, key=lambda p: (labels or {}).get(p, p))
            ]
            count = sum(len(s["units"]) for s in per_source)
            rows.append({"consumer": int(consumer), "sources": per_source, "claimed": count})
        if not (isinstance(epoch, int) and isinstance(unit_items, int)):
            raise TypeError("epoch and unit_items must be whole numbers")
        out = {
            "epoch": epoch,
            "unit_items": unit_items,
            "consumers": consumers,
            "resumed": record.get("work") is not None,
            "claims": rows,
        }
        if units:
            out["units"] = dict(units)  # by place: two sources may have the same label
            out["labels"] = {place: (labels or {}).get(place, place) for place in units}
        return out
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return {"problem": f"unreadable dispatch record ({type(error).__name__}: {error})"}


def record_text(summary: dict[str, Any]) -> str:
    """The line of a rank's dispatch record (see :func:`record_summary`).

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
                f"{s['label']} {runs_text(s['units'])}" for s in row["sources"] if s["units"]
            )
            what = what or "[]"
        else:
            what = runs_text([u for s in row["sources"] for u in s["units"]])
        parts.append(f"consumer {row['consumer']} claimed {what} ({row['claimed']} {noun})")
    return head + ": " + ("; ".join(parts) or "no consumer of this rank claimed a unit")


def job_units(
    replay: ReplayDispatch, records: list[Record], labels: dict[str, str]
) -> list[dict[str, Any]]:
    """Per source of the job's dynamic epoch (after ``replay`` ran in the remaining work):
    its units, how many some consumer claimed, and how many no consumer reached (handed
    out whole by a resume)."""
    unreached = replay.unreached_units()
    claimed: dict[str, set[int]] = {}
    for record in records:
        for places in record["claims"].values():
            for place, units in places.items():
                claimed.setdefault(place, set()).update(units)
    rows = [
        {
            "place": place,
            "label": labels.get(place, place),
            "units": len(replay.spec.units(place)),
            "claimed": len(claimed.get(place, set())),
            "unreached": len(unreached.get(place, [])),
        }
        for place in replay.spec.work
    ]
    return sorted(rows, key=lambda row: row["label"])


def record_problems(ranks: dict[str, Any]) -> list[str]:
    """What the dispatch records of a (shape-checked) state's ``ranks`` tell wrong without
    the recipe: a unit claimed twice in one epoch, by one consumer or two (a resume would
    deliver its items twice or never)."""
    owner: dict[tuple[int, str, int], str] = {}
    problems: list[str] = []
    for rank in sorted(ranks, key=int):
        record = rank_record(ranks[rank])
        if record is None:
            continue
        for consumer, places in sorted(record["claims"].items(), key=lambda kv: int(kv[0])):
            for place, units in places.items():
                for unit in units:
                    key = (record["epoch"], place, unit)
                    if key not in owner:
                        owner[key] = consumer
                        continue
                    problems.append(
                        f'ranks["{rank}"].dispatch.claims[{consumer!r}][{place!r}]: unit {unit} '
                        f"of epoch {record['epoch']} was claimed by consumer {owner[key]} too: "
                        "a unit is handed out once; the checkpoint is damaged"
                    )
    return problems
