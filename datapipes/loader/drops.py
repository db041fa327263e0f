"""What a Loader reports as dropped: its own consumers' counts, and those a checkpoint carries.

``batch(..., drop_last=True)`` and ``even_batches`` drop items at the end of a
consumer's share. The live counts come from the graph (and the DataLoader
workers' reports); a checkpoint keeps only counts that are *final* (a rank's
once its epoch ended, a worker's that had ended its share), never a count made
mid-epoch, which may come from items read ahead that a resume reads and counts
again. After a resume on another topology, the saved job's final counts are
carried by the new rank 0, so the new ranks' reports add up to every item the
epoch left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from datapipes.workers.in_workers import worker_drop_counts

if TYPE_CHECKING:
    from datapipes.loader.epochs import EpochCursor
    from datapipes.loader.graph import LoaderGraph

Counts = dict[str, int]


def _add(total: Counts, counts: Counts) -> Counts:
    for step, count in counts.items():
        total[step] = total.get(step, 0) + count
    return total


class CarriedDrops:
    """Drop counts a Loader took over from the checkpoint it resumed, for one epoch."""

    __slots__ = ("epoch", "counts")

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.counts: Counts = {}

    def report(self, live: Counts, last_epoch: int, built: bool) -> Counts:
        """``live`` (the graph's counts of ``last_epoch``) plus what is carried for it."""
        if self.epoch is not None and (self.epoch == last_epoch or not built):
            _add(live, self.counts)
        return live

    def record(
        self, epoch: int, node: Any, last_epoch: int, built: bool, report: Callable[[], Counts]
    ) -> dict[str, Any] | None:
        """The ``"dropped"`` a state at ``(epoch, node)`` keeps (see the module doc).

        ``report()`` gives :meth:`report` of the live graph; it is asked only once the
        epoch ended (a mid-epoch state keeps only what is carried).
        """
        if self.epoch == epoch and self.counts:
            # Mid-epoch, or at the start of a share dealt after a topology change.
            return {"epoch": epoch, "counts": dict(self.counts), "carried": dict(self.counts)}
        if node is not None:
            return None
        ended = epoch - 1  # between epochs: the counts of the one that ended are final
        if built and last_epoch == ended:
            counts = report()
        elif self.epoch == ended:
            counts = dict(self.counts)  # loaded, not run since
        else:
            return None
        return {"epoch": ended, "counts": counts} if counts else None

    def take(self, epoch: int | None, counts: Counts) -> None:
        """Carry ``counts`` for ``epoch`` (a resume plan's: see
        :class:`datapipes.resume.ResumePlan`)."""
        self.epoch, self.counts = epoch, dict(counts)


class LoaderDrops:
    """A Loader's drop counts: its graph's (and workers'), plus those a checkpoint carried."""

    def __init__(self, graph: LoaderGraph, cursor: EpochCursor) -> None:
        self._graph, self._cursor = graph, cursor
        self._carried = CarriedDrops()  # dropped before the checkpoint it resumed

    def report(self) -> Counts:
        """What :meth:`datapipes.Loader.dropped` returns (see there)."""
        graph, last = self._graph, self._cursor.last
        if graph.root is None and graph.closed_drops is not None:  # closed since: as it was
            epoch, counts = graph.closed_drops
            if epoch == last:
                return self._carried.report(dict(counts), epoch, True)
        built = graph.root is not None
        return self._carried.report(worker_drop_counts(graph.root), last, built)

    def record(self, epoch: int, node: Any) -> dict[str, Any] | None:
        """The ``"dropped"`` a state at ``(epoch, node)`` keeps (see the module doc)."""
        built = self._graph.root is not None
        return self._carried.record(epoch, node, self._cursor.last, built, self.report)

    def carry(self, epoch: int | None, counts: Counts) -> None:
        """Carry a resume plan's ``counts`` for ``epoch``."""
        self._carried.take(epoch, counts)
