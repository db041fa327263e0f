"""A Loader's checkpoints: its state taken, and a state loaded through one resume plan.

``load_state_dict`` parses the state once (:func:`datapipes.resume.parse_state`),
asks :func:`datapipes.resume.resume_plan` what each consumer reads, builds the
graph the resumed epoch will run and checks the rank's position on it, and only
then carries the plan out (that graph is the one the epoch then runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datapipes.resume import JobSetup, ResumePlan, parse_state, rank_state, resume_plan
from datapipes.resume.graph_record import GraphRecord, node_path
from datapipes.resume.merge import check_recipe

if TYPE_CHECKING:
    from datapipes.dispatch.dynamic import DynamicDispatch
    from datapipes.loader.consumers import RankConsumers
    from datapipes.loader.drops import LoaderDrops
    from datapipes.loader.epochs import EpochCursor
    from datapipes.loader.even_batches import EvenBatchesPolicy
    from datapipes.loader.graph import LoaderGraph
    from datapipes.loader.listings import JobListings
    from datapipes.loader.options import LoaderOptions
    from datapipes.placement import RecipePlan
    from nodes.sources.files import Listings


class LoaderCheckpoints:
    """``state_dict()`` and ``load_state_dict()`` of a Loader (see the module doc).

    Also what the takeovers read of their Loader
    (:class:`datapipes.dispatch.takeover.RankPosition`).
    """

    def __init__(
        self,
        options: LoaderOptions,
        recipe: RecipePlan,
        *,
        graph: LoaderGraph,
        cursor: EpochCursor,
        even: EvenBatchesPolicy,
        listings: JobListings,
        consumers: RankConsumers,
        dispatch: DynamicDispatch | None,
        drops: LoaderDrops,
    ) -> None:
        self._options, self._recipe = options, recipe
        self._rank = options.topology.rank
        self._graph, self._cursor, self._even = graph, cursor, even
        self._listings, self._consumers = listings, consumers
        self._dispatch, self._drops = dispatch, drops
        self._record = GraphRecord(consumers.runtime)  # the graph's shape, for checkpoints
        # The plan of the last resume (datapipes.resume): a dealt epoch's shares live here.
        self._plan: ResumePlan | None = None
        # (epoch, the graph's state at the start of a fresh run): a state taken before the
        # run delivered anything is the epoch's start (node None), which merges as such.
        self._fresh: tuple[int, Any] | None = None

    @property
    def epoch(self) -> int:
        """The epoch that runs (or runs next)."""
        return self._cursor.epoch

    @property
    def setup(self) -> JobSetup:
        """This Loader's job setup, as its checkpoints record it."""
        return self._options.setup(self._even.value)

    def listings(self) -> Listings:
        """The job's file listings (listed at the first need, once)."""
        return self._listings.get(self._graph.context)

    def started(self, epoch: int, fresh_state: Any) -> None:
        """A run of ``epoch`` began: from its start with the graph at ``fresh_state``, or
        resumed (``fresh_state`` ``None``)."""
        self._fresh = None if fresh_state is None else (epoch, fresh_state)

    def state_dict(self) -> dict[str, Any]:
        """The position of the whole pipeline: plain data (json / ``weights_only`` safe).

        What all ranks share (version, fingerprint, steps, seed, topology) sits
        at the top; this rank's epoch and node states sit under its own key in
        ``state["ranks"]``, so in a ``torch.distributed.checkpoint`` save every
        rank writes its own position. The layout is :mod:`datapipes.resume.records`'s.
        Taking it runs no collective: any subset of ranks may call it.
        To resume on another world size or number of workers, merge every
        rank's state with :func:`datapipes.merge_states`.
        """
        return self.position()

    def position(self) -> dict[str, Any]:
        """:meth:`state_dict` without the takeover checks (what takeovers publish)."""
        root = self._graph.root
        epoch, node = self._cursor.position(None if root is None else root.state_dict)
        if self._fresh is not None and node is not None and self._fresh == (epoch, node):
            node = None  # nothing delivered yet: the start of the epoch
        plans = None
        deal = None if self._plan is None else self._plan.deal
        if deal is not None and deal[0] in (epoch, epoch - 1):
            # Kept one epoch on: a rank that finished its share still tells what it was.
            mine = self.setup.consumers_of(self._rank)
            plans = (deal[0], deal[1][mine.start : mine.stop])
        dispatch = None
        if self._dispatch is not None:
            dispatch = self._dispatch.record(epoch, self.setup.consumers_of(self._rank))
        return rank_state(
            fingerprint=self._recipe.fingerprint,
            steps=list(self._recipe.steps),
            setup=self.setup,
            rank=self._rank,
            epoch=epoch,
            node=node,
            graph=self._record.text(root),
            plans=plans,
            dispatch=dispatch,
            dropped=self._drops.record(epoch, node),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration resumes the saved epoch where it stopped.

        The state is validated first (its shape, then the recipe, topology and
        seed, then every node's position against the data it will read): an
        invalid one raises :class:`datapipes.InvalidStateError` naming the path
        inside it, a foreign one :class:`datapipes.StateMismatchError`, and
        the Loader keeps its position.

        **Another topology.** A state that covers every rank of its job (one
        from :func:`datapipes.merge_states`, or any state of a one-rank job)
        also loads into a Loader of another ``world_size`` or ``num_workers``:
        the interrupted epoch's remaining items (those read but not delivered
        included) are dealt to the new consumers, each exactly once, in an
        order that may differ from the uninterrupted run's; the next epoch is
        a fresh epoch of the new topology. A step with no exact answer (see
        :class:`datapipes.ElasticResumeError`) is refused, naming it.
        """
        parsed = parse_state(state)
        check_recipe(parsed, self._recipe.fingerprint, list(self._recipe.steps))
        setup = self.setup
        if parsed.setup.same_topology(setup):
            self._even.adopt(parsed.setup.even_batches)  # before it is compared
            setup = self.setup
        plan = resume_plan(
            self._recipe,
            parsed,
            setup,
            self._rank,
            self.listings(),
            dynamic=self._dispatch is not None,
        )
        self._consumers.hand_plan(plan, setup, self._rank)
        if plan.node is not None:
            self._resume_on_its_graph(plan, setup)
        else:
            self._consumers.prepare(self._graph.context)
        if self._dispatch is not None:  # every resume hands out what the checkpoint left
            self._dispatch.set_base(plan.epoch, plan.dispatch_work)
        self._cursor.restore(plan.epoch, plan.node)
        self._plan = plan
        self._even.set_deal(plan.deal)
        self._drops.carry(*plan.carried_drops)
        self._record.load(plan.graph)

    def _resume_on_its_graph(self, plan: ResumePlan, setup: JobSetup) -> None:
        """Check the rank's position on the graph the resumed epoch will run, built now
        (building opens nothing), and run that graph from now on. The Loader's graph, which
        may be running (a prefetch thread reads its context), stays if the state is refused."""
        graph = self._graph
        ctx = graph.new_context()
        ctx.epoch = plan.epoch
        try:
            root = graph.build(ctx)
        except BaseException:
            self._consumers.hand_plan(self._plan, setup, self._rank)
            raise
        try:
            root.validate_state(plan.node, node_path(self._rank))
        except BaseException:
            root.close()
            self._consumers.hand_plan(self._plan, setup, self._rank)
            raise
        graph.close(self._cursor)
        graph.install(root, ctx)
