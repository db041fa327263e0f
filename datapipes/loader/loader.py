"""The Loader: runs a recipe epoch by epoch; its checkpoints resume through one plan.

The Loader is one class composed of parts, each with one job and built once from
the Loader's options (:class:`~datapipes.loader.options.LoaderOptions`) and its
recipe, split once (:class:`~datapipes.placement.RecipePlan`): its consumers
(:mod:`~datapipes.loader.consumers`), its graph (:mod:`~datapipes.loader.graph`), the
epoch cursor (:mod:`~datapipes.loader.epochs`), the ``even_batches`` policy
(:mod:`~datapipes.loader.even_batches`), its checkpoints
(:mod:`~datapipes.loader.checkpoints`), its reports (:mod:`~datapipes.loader.reports`)
and, under dynamic dispatch, its dispatch and takeovers (:mod:`datapipes.dispatch`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from datapipes.dispatch.dynamic import DynamicDispatch
from datapipes.dispatch.takeover import Takeovers
from datapipes.loader.checkpoints import LoaderCheckpoints
from datapipes.loader.consumers import RankConsumers
from datapipes.loader.drops import LoaderDrops
from datapipes.loader.epoch_stats import LoaderStats
from datapipes.loader.epochs import EpochCursor
from datapipes.loader.even_batches import EvenBatchesPolicy
from datapipes.loader.graph import LoaderGraph
from datapipes.loader.listings import JobListings, default_store_comparison
from datapipes.loader.options import DEFAULT_UNIT_ITEMS, InexactResumeWarning, LoaderOptions
from datapipes.loader.parts import by_part
from datapipes.loader.reports import LoaderReports
from datapipes.loader.runs import EpochRuns
from datapipes.observe.trace import PipelineTrace
from datapipes.pipe import DataPipe
from datapipes.placement import RecipePlan
from datapipes.resume import JobSetup
from nodes.errors import InvalidStateError, StateMismatchError  # noqa: F401 - re-exported
from nodes.workers.bundles import AUTO


class Loader:
    """Runs a recipe epoch by epoch, with checkpoints that resume exactly.

    Iterating the Loader runs one epoch; iterating it again runs the next,
    with a new shuffle. ``state_dict()`` may be taken at any point;
    ``load_state_dict()`` on a fresh Loader over the same recipe (in this or
    another process) continues the interrupted epoch item for item, and the
    epochs after it follow as they would have. The Loader satisfies the
    ``torch.distributed.checkpoint`` ``Stateful`` protocol.

    >>> import datapipes as dp
    >>> loader = dp.Loader(dp.range(6).shuffle().batch(2), seed=0)
    >>> first = [b.tolist() for b in loader]     # epoch 0
    >>> second = [b.tolist() for b in loader]    # epoch 1: another order
    >>> sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(6))
    True

    **Arguments** (the guides in ``docs/guides/`` say more of each):
    ``rank``/``world_size`` (a data-parallel rank; else ``mesh`` with its
    data-parallel ``mesh_dims``, else ``torch.distributed``, else ``RANK`` and
    ``WORLD_SIZE``); ``num_workers`` DataLoader worker processes (torchdata's
    ``StatefulDataLoader``; ``prefetch_factor``, ``timeout``,
    ``multiprocessing_context``, ``worker_init_fn``, ``persistent_workers`` and
    ``snapshot_every_n_steps`` go to it), with ``pin_memory()``, ``to_device()``
    and what follows them in this process; ``items_per_transfer``: items per
    DataLoader transfer, ``"auto"`` (default: up to 16, an item of 256 KiB or
    more alone, decided by the items, never a clock) or ``K`` (order: runs of a
    transfer's items per worker in turn);
    ``even_batches`` (default: on under ``torch.distributed`` with several
    ranks): every rank yields as many items, the surplus dropped with a
    :class:`datapipes.UnevenDataWarning`, so a DDP job never hangs in a
    collective; ``pin_memory``/``device`` append those steps; ``stats`` and
    ``progress`` (and :meth:`trace`); ``dispatch="dynamic"`` hands out units of
    ``dispatch_unit_items`` on demand through ``store`` (:mod:`datapipes.dispatch.dynamic`), and
    ``dispatch_lease_seconds`` lets finished ranks take over a stalled rank's
    units (:mod:`datapipes.dispatch.takeover`).
    """

    def __init__(
        self,
        pipe: DataPipe[Any],
        seed: int = 0,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        mesh: Any = None,
        mesh_dims: Sequence[str] | str | None = None,
        num_workers: int = 0,
        even_batches: bool | None = None,
        pin_memory: bool = False,
        device: str | Any = None,
        stats: bool = False,
        progress: bool = False,
        dispatch: str = "static",
        store: Any = None,
        dispatch_unit_items: int = DEFAULT_UNIT_ITEMS,
        dispatch_lease_seconds: float | None = None,
        items_per_transfer: int | str = AUTO,
        **dataloader_options: Any,
    ) -> None:
        options = LoaderOptions.check(
            pipe, seed, rank=rank, world_size=world_size, mesh=mesh, mesh_dims=mesh_dims,
            num_workers=num_workers, even_batches=even_batches, pin_memory=pin_memory,
            device=device, stats=stats, progress=progress, dispatch=dispatch, store=store,
            dispatch_unit_items=dispatch_unit_items,
            dispatch_lease_seconds=dispatch_lease_seconds,
            items_per_transfer=items_per_transfer, dataloader_options=dataloader_options,
        )  # fmt: skip
        recipe = RecipePlan.of(options.recipe(pipe), num_workers)
        for caveat in recipe.recipe.resume_caveats():  # said once, where the Loader is made
            warnings.warn(caveat, InexactResumeWarning, stacklevel=2)
        #: The Loader's options, checked (see :class:`~datapipes.loader.options.LoaderOptions`).
        self.options = options
        self.pipe, self.topology, self.seed = recipe.recipe, options.topology, options.seed
        self.rank, self.world_size = options.topology.rank, options.topology.world_size
        self.num_workers, self.items_per_transfer = num_workers, options.items_per_transfer
        self.collects_stats, self.progress = options.stats, options.progress
        self._recipe = recipe
        self._consumers = RankConsumers(recipe, options)
        self._even = EvenBatchesPolicy(options, recipe)
        self._dispatch = DynamicDispatch(recipe, options) if options.dispatch else None
        # Listed once, at the first build; by rank 0 for all when the ranks iterate together.
        compare = None  # under dynamic dispatch the store compares them
        if self._dispatch is None:
            compare = default_store_comparison(self.rank, self.world_size, recipe.fingerprint)
        self._listings = JobListings(recipe.recipe, self._even.group, compare)
        self._cursor = EpochCursor()
        self._stats = LoaderStats(options.stats)
        self._graph = LoaderGraph(options, self._consumers, self._even, self._listings, self._stats)
        self._drops = LoaderDrops(self._graph, self._cursor)
        self._checkpoints = LoaderCheckpoints(
            options, recipe, graph=self._graph, cursor=self._cursor, even=self._even,
            listings=self._listings, consumers=self._consumers, dispatch=self._dispatch,
            drops=self._drops,
        )  # fmt: skip
        self._takeovers: Takeovers | None = None
        if self._dispatch is not None and options.takeovers:
            self._takeovers = Takeovers(options, recipe, self._dispatch, self._checkpoints)
        self._reports = LoaderReports(
            self._graph, self._cursor, self._stats, self._drops, self._takeovers
        )
        self._runs = EpochRuns(
            options, recipe, graph=self._graph, cursor=self._cursor, stats=self._stats,
            consumers=self._consumers, listings=self._listings, dispatch=self._dispatch,
            takeovers=self._takeovers, checkpoints=self._checkpoints,
        )  # fmt: skip

    # ----- iteration -----------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch that is running, or the one the next iteration will run."""
        return self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its start."""
        self._cursor.set_epoch(epoch)

    def epochs(self, total: int) -> Iterator[int]:
        """The epochs still to run before ``total``, for a training loop that needs no arithmetic.

        Starts at the epoch the next iteration runs: after ``load_state_dict()``
        that is the checkpoint's epoch, which resumes where it stopped, so the
        same loop serves a fresh run and a resumed one. Iterate the Loader once
        in the body.

        >>> import datapipes as dp
        >>> loader = dp.Loader(dp.range(4).batch(2))
        >>> for epoch in loader.epochs(2):
        ...     print(epoch, [b.tolist() for b in loader])
        0 [[0, 1], [2, 3]]
        1 [[0, 1], [2, 3]]
        """
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise ValueError(
                f"epochs() takes the total number of epochs (an int >= 0), got {total!r}"
            )
        while True:
            upcoming = self._cursor.next_run()
            if upcoming.epoch >= total:
                return
            yield upcoming.epoch
            if self._cursor.next_run().id == upcoming.id:  # the body never started the epoch
                raise RuntimeError(
                    "the body of `for epoch in loader.epochs(n):` must iterate the Loader "
                    "(`for batch in loader: ...`) once per epoch"
                )

    def __iter__(self) -> Iterator[Any]:
        return self._runs.start()

    @property
    def even_batches(self) -> bool:
        """Whether every rank yields the same number of items per epoch (see the class doc).

        With the default ``even_batches=None`` on several ranks this is decided
        once ``torch.distributed`` is initialized, or at the first epoch.
        """
        return self._even.value

    def close(self) -> None:
        """Stop background threads and release resources; the Loader can be iterated again.

        A mid-epoch position survives: ``state_dict()`` after ``close()`` is the
        state before it, and the next iteration continues the interrupted epoch.
        """
        self._graph.close(self._cursor)

    # ----- checkpoints -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._takeovers is not None:
            self._takeovers.check_checkpoint()
        return self._checkpoints.state_dict()

    state_dict.__doc__ = LoaderCheckpoints.state_dict.__doc__
    load_state_dict = by_part("_checkpoints", LoaderCheckpoints.load_state_dict)

    @property
    def setup(self) -> JobSetup:
        """This Loader's job setup, as its checkpoints record it."""
        return self._checkpoints.setup

    # ----- reports ---------------------------------------------------------------
    stats = by_part("_reports", LoaderReports.stats)
    stats_by_rank = by_part("_reports", LoaderReports.stats_by_rank)
    skipped = by_part("_reports", LoaderReports.skipped)
    losses = by_part("_reports", LoaderReports.losses)
    dropped = by_part("_reports", LoaderReports.dropped)

    # ----- tracing ---------------------------------------------------------------
    def trace(self, path: str | os.PathLike[str]) -> PipelineTrace:
        """A trace of the steps while the ``with`` block runs, written to ``path`` at its end.

        Every step's work appears as spans named ``datapipes: <step>``, in
        this process and in each DataLoader worker (a process of its own in
        the trace, on the same clock), nested in the span of the step that
        asked for the item; the training loop's waits on the Loader are spans
        too. Open the file in https://ui.perfetto.dev or ``chrome://tracing``;
        :func:`datapipes.merge_traces` puts it into a ``torch.profiler``
        trace. Each step keeps all of a pass's first 32 ``next()`` calls as
        spans, then every one of at least 100 us and one every 5 ms of the
        others, which bounds what a trace costs (the JSONL benchmark has rows
        with a trace on).

        Enter it before the loop: an epoch being read when it is entered is
        refused (its graph was built without spans). A graph kept from an
        earlier epoch, or from an abandoned one, is closed (its position kept,
        as by :meth:`close`) and built again with spans by the next
        iteration; the first iteration after the block builds it without.

        >>> import datapipes as dp, tempfile, os, json
        >>> loader = dp.Loader(dp.range(8).map(abs).batch(4))
        >>> path = os.path.join(tempfile.mkdtemp(), "trace.json")
        >>> with loader.trace(path):
        ...     batches = list(loader)
        >>> for name in sorted({e["name"] for e in json.load(open(path))["traceEvents"]}):
        ...     print(name)
        datapipes: batch(4)
        datapipes: map(abs)
        datapipes: range(8)
        datapipes: training loop waits for the next batch
        process_name
        process_sort_index
        thread_name
        """
        return PipelineTrace(self, path)

    def _start_trace(self, recorder: Any, folder: str) -> None:
        if self._graph.context.trace is not None:
            raise RuntimeError("a trace of this Loader is running already: end it first")
        if self._cursor.in_use:
            raise RuntimeError(
                f"epoch {self._cursor.epoch} is being read, by a graph built without spans: "
                "enter loader.trace() before the loop (`with loader.trace(path): for batch "
                "in loader: ...`), between epochs, or after loader.close() (which keeps the "
                "position)"
            )
        self.close()  # built again with spans at the next iteration, where it stopped
        self._graph.context.trace = recorder
        self._consumers.trace_to(folder)  # the workers started for the next graph write theirs

    def _stop_trace(self) -> None:
        self._graph.context.trace = None
        self._consumers.trace_to(None)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
