"""What a Loader reports about its epochs: statistics, skips, losses, drops.

The part of :class:`datapipes.Loader` behind ``stats()``, ``stats_by_rank()``,
``skipped()``, ``losses()`` and ``dropped()``: it reads the Loader's graph, its
statistics, its drops and its takeovers, and changes none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from datapipes.observe.rank_stats import RankStats, gather
from datapipes.observe.stats import PipelineStats
from datapipes.workers.in_workers import worker_loss_counts, worker_skip_counts

if TYPE_CHECKING:
    from datapipes.dispatch.takeover import Takeovers
    from datapipes.loader.drops import LoaderDrops
    from datapipes.loader.epoch_stats import LoaderStats
    from datapipes.loader.epochs import EpochCursor
    from datapipes.loader.graph import LoaderGraph


class LoaderReports:
    """``stats()``, ``stats_by_rank()``, ``skipped()``, ``losses()`` and ``dropped()`` of a
    Loader."""

    def __init__(
        self,
        graph: LoaderGraph,
        cursor: EpochCursor,
        stats: LoaderStats,
        drops: LoaderDrops,
        takeovers: Takeovers | None,
    ) -> None:
        self._graph, self._cursor, self._stats = graph, cursor, stats
        self._drops, self._takeovers = drops, takeovers

    def stats(self) -> PipelineStats:
        """Per-step statistics of the current (or last) epoch; ``print()`` it for a table.

        Needs ``Loader(..., stats=True)``. For every step: items, time in its
        own work, time waiting on its input, bad records skipped; steps in the
        DataLoader workers report the workers' sums (with their time divided
        by the number of workers), as of their last snapshot mid-epoch and in
        full after the epoch. The table names the slowest step and how long
        the training loop waited for data. Counts are exact; times are exact
        for the first 256 items of an epoch and then estimated from one item
        in 16, which keeps the cost at about 0.06-0.1 us per item per step
        (``benchmarks/compare.py`` has a row with statistics on).
        """
        if not self._stats.enabled:
            raise RuntimeError(
                "statistics are off for this Loader: make it with dp.Loader(..., stats=True)"
            )
        report = self._stats.report(self._graph.root, self._cursor.last)
        if self._takeovers is not None:
            report.leases = self._takeovers.report()
        return report

    def stats_by_rank(self) -> RankStats:
        """Every rank's :meth:`stats`, gathered, naming the slowest rank and its slowest step.

        A collective through ``torch.distributed``: call it on every rank at the same
        point (after an epoch, or every N steps), never per batch; it costs one
        ``all_gather_object`` of each rank's table. ``print()`` it for a table.
        """
        return gather(self.stats())

    def skipped(self) -> dict[str, int]:
        """Skips so far in this epoch, per step with ``on_error="skip"``.

        A skip is a bad record, or a file (or the rest of one) that could not
        be read: each counts one here, whatever the file held; :meth:`losses`
        says what the lost files and ranges held. Keys are the steps (as in
        the recipe's ``repr``); counts survive a checkpoint and resume, and
        start again at 0 with each epoch.

        >>> import datapipes as dp
        >>> loader = dp.Loader(dp.from_sequence([{"cls": b"1"}, {"cls": b"x"}])
        ...                    .decode(on_error="skip"))
        >>> import warnings; warnings.simplefilter("ignore")
        >>> list(loader), loader.skipped()
        ([{'cls': 1}], {"dp.from_sequence(<list of 2>).decode(on_error='skip')": 1})
        """
        return worker_skip_counts(self._graph.root)

    def losses(self) -> dict[str, dict[str, int]]:
        """What the skips of this epoch lost, per step with ``on_error="skip"``.

        ``{"records": n, "files": n, "ranges": n, "bytes": n}``: ``records``
        the bad records plus the records a lost file or range is known to
        have held (the rows of a ``.npy``, from its header), a lower bound
        where ``files`` or ``ranges`` is not 0; ``files`` the files that could
        not be read at all (missing, failing after retries); ``ranges`` the
        files lost from an offset to their end (truncated, damaged, corrupt
        compressed data); ``bytes`` the stored bytes of those files and ranges
        that were not read, where known. Survives a checkpoint and resume.

        >>> import datapipes as dp, warnings; warnings.simplefilter("ignore")
        >>> loader = dp.Loader(dp.files(["missing.jsonl"]).read_jsonl(on_error="skip"))
        >>> list(loader), loader.skipped(), loader.losses()  # doctest: +ELLIPSIS
        ([], {...: 1}, {...: {'records': 0, 'files': 1, 'ranges': 0, 'bytes': 0}})
        """
        return worker_loss_counts(self._graph.root)

    def dropped(self) -> dict[str, int]:
        """Items dropped at the end of the current (or last) epoch, per step that drops.

        ``batch(..., drop_last=True)`` drops each consumer's short last batch
        (after a resume on another topology, each new consumer's), and
        ``even_batches`` drops what a rank has beyond the others (it also warns,
        :class:`datapipes.UnevenDataWarning`). Counted here so that nothing is
        left out silently; keys are ``"batch(32, drop_last=True)"`` and
        ``"even_batches (Loader)"``. A checkpoint carries the counts that are
        final (a rank's, once its epoch ended; a DataLoader worker's that had
        ended its share): after a resume on another topology, rank 0 reports
        what the saved job dropped of the epoch, so the new ranks' counts add
        up to every item the epoch left out.

        >>> import datapipes as dp
        >>> loader = dp.Loader(dp.range(10).batch(4, drop_last=True))
        >>> len(list(loader)), loader.dropped()
        (2, {'batch(4, drop_last=True)': 2})
        """
        return self._drops.report()
