"""The Loader's statistics: its own row, the epoch's clock, and the table ``stats()`` returns."""

from __future__ import annotations

from collections.abc import Iterator
from time import monotonic
from typing import Any

from datapipes.loader.progress import EpochClock
from datapipes.observe.stats import PipelineStats, merge_rows
from datapipes.workers.in_workers import worker_states
from nodes import Node
from nodes.observe.stats import StatsNode, clear_stats, graph_stats
from nodes.observe.trace import SpanRecorder

#: The statistics key of the Loader's own row: what the training loop waited for.
LOADER_KEY = "loader"

#: The name of the Loader's row's spans in a trace: the training loop in ``next(loader)``.
LOOP_WAIT = "datapipes: training loop waits for the next batch"

#: Seconds between two points of an epoch's timeline (``PipelineStats.timeline``) at first;
#: when it holds TIMELINE_POINTS, every other point goes and the interval doubles.
TIMELINE_SECONDS = 0.05
TIMELINE_POINTS = 1000


class LoaderStats:
    """What ``Loader.stats()`` reports about the current (or last) epoch.

    It puts the Loader's own row on top of the built graph (:meth:`wrap`),
    times the epoch (:attr:`clock`), clears the counters when an epoch starts,
    and reads the rows of this process and of the DataLoader workers into a
    :class:`datapipes.PipelineStats`. The last epoch's table outlives the
    graph: after :meth:`keep` (at ``close()``) it is reported until a new
    graph is built.
    """

    __slots__ = ("enabled", "clock", "_kept", "_timeline")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.clock = EpochClock()
        self._kept: PipelineStats | None = None
        self._timeline: list[dict[str, Any]] = []

    def wrap(self, root: Node[Any], recorder: SpanRecorder | None = None) -> Node[Any]:
        """``root`` with the Loader's row on top when statistics are on (or a trace runs:
        its spans are the training loop's waits)."""
        if not self.enabled and recorder is None:
            return root
        # What the training loop waits for: everything above. Few outputs, so time them all.
        return StatsNode(
            root,
            LOADER_KEY,
            "Loader",
            sample_every=1,
            recorder=recorder,
            span=LOOP_WAIT,
            counts=self.enabled,
        )

    def new_graph(self) -> None:
        """A graph was built: report it, not the table kept from the one before."""
        self._kept = None

    def new_epoch(self, root: Node[Any]) -> None:
        """Statistics are per epoch (and start again at a resume)."""
        clear_stats(root)
        self._timeline = []

    def timed(self, items: Iterator[Any], root: Node[Any], epoch: int) -> Iterator[Any]:
        """``items``, noting a point of the epoch's timeline every :data:`TIMELINE_SECONDS`
        (a clock read per output; statistics on only). A long epoch keeps at most
        :data:`TIMELINE_POINTS`: the interval doubles each time they are reached."""
        every = TIMELINE_SECONDS
        due = monotonic() + every
        timeline = self._timeline
        for item in items:
            yield item
            if monotonic() >= due:
                timeline.append(point(self.report(root, epoch)))
                if len(timeline) >= TIMELINE_POINTS:
                    del timeline[::2]
                    every *= 2
                due = monotonic() + every

    def report(self, root: Node[Any] | None, epoch: int) -> PipelineStats:
        """The table of ``epoch``, read from ``root``'s graph (or kept from a closed one)."""
        if root is None and self._kept is not None:
            return self._kept
        rows = graph_stats(root)
        loader = [row for row in rows if row["key"] == LOADER_KEY]
        steps = merge_rows("workers", [s.get("stats") for s in worker_states(root)])
        steps += merge_rows("main", [[row for row in rows if row["key"] != LOADER_KEY]])
        stats = PipelineStats(
            steps=steps,
            epoch=epoch,
            delivered=loader[0]["items"] if loader else 0,
            elapsed_seconds=self.clock.seconds(),
            loader_wait_seconds=loader[0]["seconds"] if loader else 0.0,
        )
        stats.timeline = [*self._timeline, point(stats)]
        return stats

    def keep(self, root: Node[Any], epoch: int) -> None:
        """``root`` is closing: its last epoch's table outlives it (when statistics are on)."""
        if self.enabled:
            self._kept = self.report(root, epoch)


def point(stats: PipelineStats) -> dict[str, Any]:
    """One point of a timeline: the epoch's totals so far (see ``PipelineStats.timeline``)."""
    return {
        "seconds": stats.elapsed_seconds,
        "delivered": stats.delivered,
        "waited": stats.loader_wait_seconds,
        "steps": {step.step: step.self_seconds for step in stats.steps},
    }
