"""The graph a Loader runs: built once per need, kept from epoch to epoch, closed keeping its place.

One :class:`LoaderGraph` per Loader holds the built graph and the
:class:`nodes.Context` it was built with. It is built at the first epoch, or by
a resume that validated the checkpoint's position on it (the graph the epoch
then runs), and again after :meth:`LoaderGraph.close` or when a trace begins or
ends (the graph is built with or without spans).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datapipes.dispatch.dynamic import placeholder_dispatcher
from datapipes.loader.even_batches import NO_GROUP
from datapipes.loader.options import check_lease_seconds
from datapipes.workers.in_workers import worker_drop_counts
from nodes import Context, Node

if TYPE_CHECKING:
    from datapipes.loader.consumers import RankConsumers
    from datapipes.loader.epoch_stats import LoaderStats
    from datapipes.loader.epochs import EpochCursor
    from datapipes.loader.even_batches import EvenBatchesPolicy
    from datapipes.loader.listings import JobListings
    from datapipes.loader.options import LoaderOptions


class LoaderGraph:
    """The built graph of one Loader and its context (see the module doc)."""

    def __init__(
        self,
        options: LoaderOptions,
        consumers: RankConsumers,
        even: EvenBatchesPolicy,
        listings: JobListings,
        stats: LoaderStats,
    ) -> None:
        self._options = options
        self._consumers, self._even = consumers, even
        self._listings, self._stats = listings, stats
        #: The built graph, kept from epoch to epoch (``None``: built at the next epoch).
        self.root: Node[Any] | None = None
        #: The context the graph is (or will be) built with: rank, epoch, work, trace.
        self.context = self.new_context()
        self._built_trace: Any = None  # the trace recorder the graph was built with, if any
        #: ``(epoch, counts)`` of the graph :meth:`close` let go, so drops still tell them.
        self.closed_drops: tuple[int, dict[str, int]] | None = None

    def new_context(self) -> Context:
        """A context for a graph of this Loader (a running trace's recorder included)."""
        topology = self._options.topology
        ctx = Context(
            rank=topology.rank,
            world_size=topology.world_size,
            seed=self._options.seed,
            stats=self._options.stats,
        )
        if self._options.dispatch is not None and not self._options.num_workers:
            ctx.work = placeholder_dispatcher(topology.rank)  # it claims in this process
        if self.__dict__.get("context") is not None:
            ctx.trace = self.context.trace
        return ctx

    def build(self, ctx: Context) -> Node[Any]:
        """The graph of ``ctx``: the rank's runtime recipe, evened across ranks, under the
        Loader's statistics row (``ctx`` gets the job's listings and its consumer's work)."""
        options = self._options
        if options.dispatch is not None and self._even.value and self._even.group() is NO_GROUP:
            raise ValueError(
                "even_batches with dispatch='dynamic' needs torch.distributed: the ranks' "
                "shares are only known as they are claimed, so they agree on the count as "
                "they go (a gloo all_reduce). Initialize the process group, or pass "
                "even_batches=False"
            )
        if options.takeovers and self._even.value:
            check_lease_seconds(options.dispatch.lease_seconds, True)  # type: ignore[union-attr]
        ctx.listings = self._listings.get(ctx)  # rank 0's, shared with the workers
        self._consumers.prepare(ctx)
        root = self._even.wrap(self._consumers.runtime.build(ctx), lambda: ctx.epoch)
        return self._stats.wrap(root, ctx.trace)

    def install(self, root: Node[Any], ctx: Context) -> None:
        """Run ``root`` (built by :meth:`build` with ``ctx``) from now on."""
        self.root, self.context, self._built_trace = root, ctx, ctx.trace
        self.closed_drops = None
        self._stats.new_graph()

    def current(self) -> Node[Any]:
        """The graph to run: the one kept, else one built now."""
        if self.root is None:
            self.install(self.build(self.context), self.context)
        assert self.root is not None
        return self.root

    @property
    def traced_otherwise(self) -> bool:
        """Whether a trace began or ended since the graph was built."""
        return self.root is not None and self._built_trace is not self.context.trace

    def close(self, cursor: EpochCursor) -> None:
        """Close the graph; the cursor keeps its position, the statistics and drops stay."""
        root = self.root
        if root is None:
            return
        self.closed_drops = (cursor.last, worker_drop_counts(root))
        cursor.suspend(root.state_dict)  # also ends an iterator kept from before
        root.close()
        self._stats.keep(root, cursor.last)  # they outlive the graph
        self.root = None

    def let_go(self, epoch: int) -> None:
        """Close the graph after its rank was fenced in ``epoch`` (the next epoch builds a
        new one); its statistics stay."""
        root = self.root
        if root is not None:
            root.close()
            self._stats.keep(root, epoch)
            self.root = None
