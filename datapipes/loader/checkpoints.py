"""A Loader's checkpoints: its state taken, and a state loaded through one resume plan.

A mixin of :class:`datapipes.Loader` (which owns the attributes it reads):
``load_state_dict`` parses the state once (:func:`datapipes.resume.parse_state`),
asks :func:`datapipes.resume.resume_plan` what each consumer reads, checks the
rank's position against the graph it will run, and only then carries it out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from datapipes.resume import JobSetup, ResumePlan, parse_state, rank_state, resume_plan
from datapipes.resume.graph import node_path
from datapipes.resume.remaining import check_recipe
from nodes import Context


class LoaderCheckpoints:
    """``state_dict()`` and ``load_state_dict()`` of a Loader (see the module doc)."""

    # The Loader's own attributes, read here.
    pipe: Any
    rank: int
    world_size: int
    num_workers: int
    seed: int
    items_per_transfer: int | str
    even_batches: bool
    _fingerprint: str
    _steps: list[str]
    _root: Any
    _cursor: Any
    _fresh: Any
    _plan: ResumePlan | None
    _dispatch: Any
    _takeovers: Any
    _graph: Any
    _drops: Any
    _even: Any
    _listings: Any
    _context: Context
    _consumers: Any
    _runtime_pipe: Any
    dropped: Callable[[], dict[str, int]]  # from LoaderReports

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
        if self._takeovers is not None:
            self._takeovers.check_checkpoint()
        return self._position()

    def _position(self) -> dict[str, Any]:
        """:meth:`state_dict` without the takeover checks (what takeovers publish)."""
        root = self._root
        epoch, node = self._cursor.position(None if root is None else root.state_dict)
        if self._fresh is not None and node is not None and self._fresh == (epoch, node):
            node = None  # nothing delivered yet: the start of the epoch
        plans = None
        deal = None if self._plan is None else self._plan.deal
        if deal is not None and deal[0] in (epoch, epoch - 1):
            # Kept one epoch on: a rank that finished its share still tells what it was.
            mine = self.setup.consumers_of(self.rank)
            plans = (deal[0], deal[1][mine.start : mine.stop])
        dispatch = None
        if self._dispatch is not None:
            dispatch = self._dispatch.record(epoch, self.setup.consumers_of(self.rank))
        return rank_state(
            fingerprint=self._fingerprint,
            steps=self._steps,
            setup=self.setup,
            rank=self.rank,
            epoch=epoch,
            node=node,
            graph=self._graph.text(root),
            plans=plans,
            dispatch=dispatch,
            dropped=self._drops.record(
                epoch, node, self._cursor.last, self._root is not None, self.dropped
            ),
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
        check_recipe(parsed, self._fingerprint, self._steps)
        if parsed.setup.same_topology(self.setup):
            self._even.adopt(parsed.setup.even_batches)  # before it is compared
        plan = resume_plan(
            self.pipe,
            parsed,
            self.setup,
            self.rank,
            self._listings.get(self._context),
            dynamic=self._dispatch is not None,
        )
        if plan.node is not None:
            self._validate_position(plan)
        if self._dispatch is not None:  # every resume hands out what the checkpoint left
            self._dispatch.set_base(plan.epoch, plan.dispatch_work)
        self._cursor.restore(plan.epoch, plan.node)
        self._plan = plan
        self._even.set_deal(plan.deal)
        self._apply_plan(self._context)
        self._drops.take(*plan.carried_drops)
        self._graph.load(plan.graph)

    @property
    def setup(self) -> JobSetup:
        """This Loader's job setup, as its checkpoints record it."""
        return JobSetup(
            self.world_size,
            self.num_workers,
            self.seed,
            self.even_batches,
            self.items_per_transfer,
        )

    def _apply_plan(self, ctx: Context) -> None:
        if self._dispatch is None:  # under dynamic dispatch the units claimed are the work
            self._consumers.hand_plan(self._plan, self.setup, self.rank, ctx)

    def _validate_position(self, plan: ResumePlan) -> None:
        # Against the graph the epoch will run, built for the saved epoch (building opens
        # nothing) apart from the Loader's own, which may be running (a prefetch thread
        # reads its context) and must stay as it is if the state is refused.
        ctx = Context(rank=self.rank, world_size=self.world_size, epoch=plan.epoch, seed=self.seed)
        ctx.listings = self._listings.get(ctx)  # the Loader's listing: the files it reads
        saved_plan, self._plan = self._plan, plan
        try:
            self._apply_plan(ctx)
            root = self._even.wrap(self._runtime_pipe.build(ctx), lambda: ctx.epoch)
        finally:
            self._plan = saved_plan
            self._apply_plan(self._context)
        try:
            root.validate_state(plan.node, node_path(self.rank))
        finally:
            root.close()
