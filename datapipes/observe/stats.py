"""What ``Loader.stats()`` returns: per-step counts and times, and a table naming the slowest."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from datapipes.observe.stats_figure import draw
from nodes.errors import add_losses


@dataclass
class StepStats:
    """One step of the pipeline over the current (or last) epoch.

    ``self_seconds`` and ``wait_seconds`` are wall-clock equivalents: for a
    step that runs in ``processes`` DataLoader workers they are the workers'
    sum divided by their number. ``us_per_item`` is the step's own time per
    item in one process (its cost, however many processes share the work).
    """

    step: str
    where: str  # "main" or "workers"
    processes: int
    items: int
    self_seconds: float
    wait_seconds: float
    skipped: int
    #: What the skips lost: records, files, ranges, bytes (see ``Loader.losses()``).
    lost: dict[str, int] = field(default_factory=dict)
    #: Under dynamic dispatch (a source): ``{"units": {consumer: units claimed},
    #: "store_seconds": time spent on the store's claims}``; empty otherwise.
    dispatch: dict[str, Any] = field(default_factory=dict)
    #: A ``mix``: ``{"weights": [...], "drawn": [items drawn from each input]}`` (the
    #: realised proportions are ``shares``); empty otherwise.
    mix: dict[str, Any] = field(default_factory=dict)

    @property
    def shares(self) -> list[float]:
        """A ``mix``'s realised proportions: the share of its items drawn from each input
        (the weights, normalized, are what was asked for); empty for other steps."""
        drawn = self.mix.get("drawn", [])
        total = sum(drawn)
        return [n / total if total else 0.0 for n in drawn]

    @property
    def us_per_item(self) -> float:
        """Microseconds of the step's own work per item it yielded."""
        return self.self_seconds * self.processes / self.items * 1e6 if self.items else 0.0


@dataclass
class PipelineStats:
    """Per-step statistics of a Loader, with a readable table (``str(stats)``).

    >>> import datapipes as dp, time
    >>> loader = dp.Loader(dp.range(20).map(lambda x: time.sleep(0.001) or x), stats=True)
    >>> _ = list(loader)
    >>> stats = loader.stats()
    >>> stats.slowest().step
    'map(<lambda>)'
    >>> [s.items for s in stats.steps]
    [20, 20]
    """

    steps: list[StepStats]
    epoch: int
    delivered: int  # items the Loader yielded to the training loop
    elapsed_seconds: float  # since the first item of the epoch was asked for
    loader_wait_seconds: float  # of which the training loop waited in next(loader)
    #: With dispatch leases (``dispatch_lease_seconds``): ``{"wait_seconds": waiting for the
    #: other ranks at the epoch's end, "took_over": [ranks this one took over],
    #: "items_taken_over": items read of taken-over ranks, "fenced": whether this rank's
    #: lease was taken}``; empty otherwise.
    leases: dict[str, Any] = field(default_factory=dict)
    #: The epoch over time: a point every 0.05 s (at most 1,000: the interval doubles as
    #: they fill), and one now; each the totals so far,
    #: ``{"seconds", "delivered", "waited", "steps": {step: own seconds}}``.
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def own_seconds(self) -> float:
        """The steps' own time, summed (wall-clock equivalents)."""
        return sum(step.self_seconds for step in self.steps)

    def slowest(self) -> StepStats | None:
        """The step with the most own time (wall-clock equivalent), or ``None`` if none ran."""
        ran = [step for step in self.steps if step.items or step.self_seconds]
        return max(ran, key=lambda step: step.self_seconds, default=None)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (json-friendly), e.g. for a metrics logger."""
        out = asdict(self)
        for row, step in zip(out["steps"], self.steps):
            row["us_per_item"] = step.us_per_item
            if step.mix:
                row["shares"] = step.shares
        return out

    def figure(self, path: str | None = None) -> Any:
        """A matplotlib figure of the epoch over time (the ``plots`` extra): outputs per
        second and the training loop's wait, then each step's share of the work, the
        slowest step marked. Saved to ``path`` when given (``.png``, ``.svg``, ``.pdf``).
        """
        slowest = self.slowest()
        return draw(
            timeline=self.timeline,
            steps=[step.step for step in self.steps],
            slowest=None if slowest is None else slowest.step,
            epoch=self.epoch,
            delivered=self.delivered,
            elapsed_seconds=self.elapsed_seconds,
            path=path,
        )

    def log_to(self, writer: Any, global_step: int) -> None:
        """Scalars for TensorBoard through a ``SummaryWriter`` (anything with
        ``add_scalar(tag, value, global_step)``): outputs per second, the share of the
        time the loop waited, and each step's microseconds per item, under ``datapipes/``.
        """
        elapsed = self.elapsed_seconds
        writer.add_scalar(
            "datapipes/outputs_per_second", self.delivered / elapsed if elapsed else 0.0,
            global_step,
        )  # fmt: skip
        writer.add_scalar(
            "datapipes/wait_share", self.loader_wait_seconds / elapsed if elapsed else 0.0,
            global_step,
        )  # fmt: skip
        for step in self.steps:
            writer.add_scalar(f"datapipes/us_per_item/{step.step}", step.us_per_item, global_step)

    def table(self) -> str:
        """The statistics as a text table, followed by the slowest step and the loader's wait."""
        total = self.own_seconds or 1.0
        header = ("step", "where", "items", "self s", "us/item", "wait s", "skipped", "share")
        rows = [
            (
                step.step,
                step.where if step.processes == 1 else f"{step.where} x{step.processes}",
                f"{step.items:,}",
                f"{step.self_seconds:.3f}",
                f"{step.us_per_item:.1f}",
                f"{step.wait_seconds:.3f}",
                f"{step.skipped:,}",
                f"{100 * step.self_seconds / total:.0f}%",
            )
            for step in self.steps
        ]
        if any(_loss_text(step.lost) for step in self.steps):  # only then: the column is wide
            header += ("lost",)
            rows = [(*row, _loss_text(step.lost)) for row, step in zip(rows, self.steps)]
        lines = aligned([header, *rows])
        for step in self.steps:
            if step.dispatch:
                units = ", ".join(
                    f"{consumer}: {n}"
                    for consumer, n in sorted(step.dispatch["units"].items(), key=_by_int)
                )
                lines.append(
                    f"dynamic dispatch ({step.step}): units claimed by consumer {{{units}}}; "
                    f"{step.dispatch['store_seconds']:.3f} s claiming them from the store"
                )
        for step in self.steps:
            if step.mix:
                weights = sum(step.mix["weights"]) or 1.0
                shares = ", ".join(
                    f"{100 * share:.1f}% (asked {100 * weight / weights:.1f}%)"
                    for share, weight in zip(step.shares, step.mix["weights"])
                )
                lines.append(
                    f"{step.step}: drawn {step.mix['drawn']} items per input; shares {shares}"
                )
        if self.leases:
            lease = self.leases
            lines.append(
                f"dispatch leases: {lease['wait_seconds']:.3f} s waiting for the other ranks at "
                f"the epoch's end; took over ranks {lease['took_over']} "
                f"({lease['items_taken_over']:,} items of theirs)"
                + ("; this rank's lease was taken over" if lease["fenced"] else "")
            )
        slowest = self.slowest()
        if slowest is not None:
            share = 100 * slowest.self_seconds / total
            lines.append(f"slowest step: {slowest.step} ({share:.0f}% of the steps' own time)")
        waited = self.loader_wait_seconds
        elapsed = self.elapsed_seconds
        rate = self.delivered / elapsed if elapsed else 0.0
        lines.append(
            f"epoch {self.epoch}: {self.delivered:,} outputs in {elapsed:.2f} s "
            f"({rate:,.1f}/s); the training loop waited {waited:.2f} s "
            f"({100 * waited / elapsed if elapsed else 0:.0f}%) for data"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _by_int(pair: tuple[str, Any]) -> int:
    return int(pair[0])


def _loss_text(lost: dict[str, int]) -> str:
    """What lost files and ranges held, for the table ("" when nothing beyond bad records)."""
    if not (lost.get("files") or lost.get("ranges")):
        return ""
    parts = [f"{lost['files']:,} files"] if lost["files"] else []
    if lost["ranges"]:
        parts.append(f"{lost['ranges']:,} ranges of files")
    parts.append(f"{lost['bytes']:,} bytes known" if lost["bytes"] else "bytes unknown")
    return ", ".join(parts) + f", >= {lost['records']:,} records"


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Text table lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return lines


def merge_rows(
    where: str, rows_per_process: Iterable[list[dict[str, Any]] | None]
) -> list[StepStats]:
    """Sum the rows of several processes running the same recipe (merged by step key)."""
    merged: dict[str, dict[str, Any]] = {}
    processes: dict[str, int] = {}
    for rows in rows_per_process:
        seen = set()
        for row in rows or ():
            key = row["key"]
            into = merged.setdefault(
                key,
                {
                    **row,
                    "items": 0,
                    "self_seconds": 0.0,
                    "wait_seconds": 0.0,
                    "skipped": 0,
                    "lost": {},
                },
            )
            for name in ("items", "self_seconds", "wait_seconds", "skipped"):
                into[name] += row[name]
            add_losses(into["lost"], row.get("lost", {}))
            if "mix" in row:
                weights, drawn = row["mix"]["weights"], row["mix"]["drawn"]
                mix = into.setdefault("merged_mix", {"weights": weights, "drawn": [0] * len(drawn)})
                mix["drawn"] = [a + b for a, b in zip(mix["drawn"], drawn)]
            if "dispatch" in row:
                mine = into.setdefault("merged_dispatch", {"units": {}, "store_seconds": 0.0})
                mine["units"].update(row["dispatch"]["units"])
                mine["store_seconds"] += row["dispatch"]["store_seconds"]
            if key not in seen:
                processes[key] = processes.get(key, 0) + 1
                seen.add(key)
    return [
        StepStats(
            step=row["step"],
            where=where,
            processes=processes[key],
            items=row["items"],
            self_seconds=row["self_seconds"] / processes[key],
            wait_seconds=row["wait_seconds"] / processes[key],
            skipped=row["skipped"],
            lost=row["lost"],
            dispatch=row.get("merged_dispatch", {}),
            mix=row.get("merged_mix", {}),
        )
        for key, row in merged.items()
    ]
