"""Dynamic dispatch in a checkpoint: each rank's dispatch record, and the job's units.

A state taken under ``dp.Loader(..., dispatch="dynamic")`` holds, per rank, a
record of the epoch, the unit size and the units each consumer claimed
(:class:`datapipes.resume.DispatchRecord`). :func:`dispatch_ranks` gives each
record as plain data (with the recipe, also how many units each source had),
and :func:`job_units` says, after the remaining work replayed the records,
how many units of each source no consumer reached. :mod:`datapipes.inspect.job`
puts them in the report under ``dispatch``.
"""

from __future__ import annotations

from typing import Any

from datapipes.inspect.tree import source_labels
from datapipes.pipe import DataPipe
from datapipes.resume import DispatchRecord, JobState
from datapipes.resume.claims import ReplayDispatch, whole_epoch
from nodes import elastic as el
from nodes.dispatch import DispatchSpec


def dispatch_ranks(state: JobState, pipe: DataPipe[Any] | None) -> dict[str, Any]:
    """Each rank's dispatch record (dynamic dispatch) as plain data, by rank; with the recipe
    (``pipe``, the state's) also how many units each source had. A record whose units
    cannot be cut is a ``problem``, never an exception."""
    out: dict[str, Any] = {}
    whole: dict[int, el.Work] = {}  # the whole work of an epoch, worked out once
    named: dict[int, dict[str, str]] = {}  # and its sources' labels
    for rank, entry in state.ranks.items():
        record = entry.dispatch
        if record is None:
            continue
        if pipe is None:
            out[str(rank)] = record_summary(record)
            continue
        try:
            if record.epoch not in named:
                named[record.epoch] = source_labels(pipe, state.setup, record.epoch)
            work = record.work
            if work is None:
                if record.epoch not in whole:
                    whole[record.epoch] = whole_epoch(pipe, state.setup, record.epoch)
                work = whole[record.epoch]
            spec = DispatchSpec(
                None, record.key, record.epoch, record.consumers, record.unit_items, work
            )
            units = {place: len(spec.units(place)) for place in work}
        except Exception as error:  # noqa: BLE001 - shown as the record's problem
            out[str(rank)] = {"problem": f"cutting its epoch into units failed: {error}"}
            continue
        out[str(rank)] = record_summary(record, named[record.epoch], units)
    return out


def record_summary(
    record: DispatchRecord,
    labels: dict[str, str] | None = None,
    units: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A rank's dispatch record as plain data: epoch, unit size, consumers, and per
    consumer the units it claimed per source (``labels``: the sources' recipe labels;
    ``units``: each source's number of units, when known)."""
    labels = labels or {}
    rows = []
    for consumer, places in sorted(record.claims.items()):
        per_source = [
            {"place": place, "label": labels.get(place, place), "units": list(places[place])}
            for place in sorted(places, key=lambda p: labels.get(p, p))
        ]
        count = sum(len(s["units"]) for s in per_source)
        rows.append({"consumer": consumer, "sources": per_source, "claimed": count})
    out = {
        "epoch": record.epoch,
        "unit_items": record.unit_items,
        "consumers": record.consumers,
        "resumed": record.work is not None,
        "claims": rows,
    }
    if units:
        out["units"] = dict(units)  # by place: two sources may have the same label
        out["labels"] = {place: labels.get(place, place) for place in units}
    return out


def job_units(
    replay: ReplayDispatch, records: list[DispatchRecord], labels: dict[str, str]
) -> list[dict[str, Any]]:
    """Per source of the job's dynamic epoch (after ``replay`` ran in the remaining work):
    its units, how many some consumer claimed, and how many no consumer reached (handed
    out whole by a resume)."""
    unreached = replay.unreached_units()
    claimed: dict[str, set[int]] = {}
    for record in records:
        for places in record.claims.values():
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
