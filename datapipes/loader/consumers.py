"""This rank's consumers, and handing them what they read: a resume plan's shares, or units.

Without DataLoader workers the Loader's own graph is the rank's one consumer
(its :class:`nodes.Context`); with workers each worker is one, and each start
of them receives what they read in one frozen
:class:`~datapipes.workers.torch_dataset.WorkerJob`. This is the one place
that knows both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datapipes.resume import JobSetup, ResumePlan
from datapipes.workers.in_workers import runtime_recipe
from datapipes.workers.torch_dataset import WorkerJob
from nodes import Context

if TYPE_CHECKING:
    from datapipes.loader.options import LoaderOptions
    from datapipes.pipe import DataPipe
    from datapipes.placement import RecipePlan
    from nodes.dispatch import DispatchSpec
    from nodes.sources.files import Listings


class RankConsumers:
    """This rank's consumers, the recipe they run, and what they read (see the module doc)."""

    def __init__(self, recipe: RecipePlan, options: LoaderOptions) -> None:
        self._in_workers = options.num_workers > 0
        self._dynamic = options.dispatch is not None
        # What the consumer in this process reads (no workers): (plan, setup, rank).
        self._own: tuple[ResumePlan, JobSetup, int] | None = None
        self._items_per_transfer = options.items_per_transfer
        # What the next start of the workers reads (see WorkerJob).
        self._plans: tuple[int, list[Any]] | None = None
        self._units: DispatchSpec | None = None
        self._trace_folder: str | None = None
        #: The recipe this rank builds (its worker part moved into DataLoader workers).
        self.runtime: DataPipe[Any] = runtime_recipe(recipe, options, self)

    def job(self, listings: Listings | None, epoch: int) -> WorkerJob:
        """What the workers that start now for ``epoch`` read besides the recipe."""
        return WorkerJob(
            items_per_transfer=self._items_per_transfer,
            dispatched=self._dynamic,
            listings=listings,
            plans=self._plans,
            dispatch=self._units,
            trace_folder=self._trace_folder,
        )

    def hand_plan(self, plan: ResumePlan | None, setup: JobSetup, rank: int) -> None:
        """Give the consumers their share of a dealt epoch (``None``: their own shares);
        under dynamic dispatch the units they claim are their work, and this does nothing."""
        if self._dynamic:
            return
        deal = None if plan is None else plan.deal
        if self._in_workers:
            mine = setup.consumers_of(rank)
            self._plans = None if deal is None else (deal[0], deal[1][mine.start : mine.stop])
        else:
            self._own = None if plan is None else (plan, setup, rank)

    def prepare(self, ctx: Context) -> None:
        """Set the work of the consumer in this process on ``ctx``, the context of a graph
        about to be built (with workers, they receive theirs as they start)."""
        if not self._dynamic and not self._in_workers:
            own = self._own
            ctx.work = None if own is None else own[0].consumer_work(own[1], own[2], 0)

    def hand_units(self, spec: DispatchSpec, ctx: Context) -> None:
        """Under dynamic dispatch: the epoch's units, which each consumer claims (``ctx``:
        the context of the graph in this process)."""
        if self._in_workers:
            self._units = spec
        else:
            ctx.work.use(spec)

    def trace_to(self, folder: str | None) -> None:
        """Where the spans of the workers started from now on go (``None``: no spans)."""
        self._trace_folder = folder
