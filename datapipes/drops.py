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
from typing import Any

from datapipes import checkpoint

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

    def take_own(self, entry: dict[str, Any], epoch: int, node: Any) -> None:
        """On the saved topology: carry on what the rank's entry carried (its consumers
        count their own drops again as they resume: a drop is at a consumer's end, which
        the resume replays), or, when it had ended the epoch before, that epoch's counts."""
        self.epoch, self.counts = epoch, checkpoint.entry_drops(entry, epoch, "carried")
        if node is None and epoch > 0:
            self.epoch, self.counts = epoch - 1, checkpoint.entry_drops(entry, epoch - 1)

    def take_job(
        self, state: dict[str, Any], epoch: int, ended: Counts, rank: int, whole_epoch: bool
    ) -> None:
        """On another topology: rank 0 carries what the saved job dropped of ``epoch`` (its
        ranks' final counts and ``ended``, its ended workers'); of the epoch before when
        every rank had ended it (``whole_epoch``: nothing of ``epoch`` was read)."""
        self.epoch = epoch - 1 if whole_epoch else epoch
        self.counts = {}
        if rank == 0:
            for entry in checkpoint.with_idle_ranks(state)["ranks"].values():
                _add(self.counts, checkpoint.entry_drops(entry, self.epoch))
            _add(self.counts, ended)
