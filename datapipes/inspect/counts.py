"""Pieces of work counted for people: what a source's remaining pieces and a rank's plans hold.

The remaining work of an epoch, a consumer's share of it and the plans a rank
holds after an elastic resume are lists of pieces (:mod:`nodes.elastic`) per
source; :func:`summarize` says what one list holds (items, records, files),
as plain data that :mod:`datapipes.inspect.job` reports and
:mod:`datapipes.inspect.render` writes as text.
"""

from __future__ import annotations

from typing import Any

from datapipes.resume import Plans
from nodes import elastic as el


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


def source_rows(work: el.Work | None, labels: dict[str, str]) -> list[dict[str, Any]]:
    """One row per source of ``work``: its label and what its pieces hold."""
    rows = [
        {
            "place": place,
            "label": labels.get(place, place),
            **summarize(entry["kind"], entry["pieces"], entry.get("held")),
        }
        for place, entry in (work or {}).items()
    ]
    return sorted(rows, key=lambda row: row["label"])


def plans_summary(plans: Plans | None, epoch: int) -> dict[str, Any] | None:
    """The plans a rank entry holds: for which epoch (``current``: ``epoch``), and per
    consumer what they hold."""
    if plans is None:
        return None
    try:  # pieces are checked by the sources that read them: these may not be pieces
        summaries = [
            {place: summarize(None, pieces) for place, pieces in sorted(plan.items())}
            for plan in plans.consumers
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return {"problem": f"unreadable plans ({type(error).__name__}: {error})"}
    return {
        "epoch": plans.epoch,
        "current": plans.epoch == epoch,
        "consumers": summaries,
        "pieces": sum(s["pieces"] for plan in summaries for s in plan.values()),
    }
