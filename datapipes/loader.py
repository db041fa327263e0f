"""The Loader: runs a recipe epoch by epoch; its checkpoints resume through one plan.

A resume parses the state once and carries out a :class:`datapipes.resume.ResumePlan`
(:mod:`datapipes.resume`); the worker plan (:mod:`datapipes.workers`), the epoch
cursor (:mod:`datapipes.epochs`), the ``even_batches`` policy
(:mod:`datapipes.even_batches`) and the reports (:mod:`datapipes.loader_reports`)
are parts with one job each.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

from datapipes.dispatch import DEFAULT_UNIT_ITEMS, DynamicDispatch, check_dispatch
from datapipes.drops import CarriedDrops
from datapipes.epochs import EpochCursor, EpochRun
from datapipes.even_batches import NO_GROUP, EvenBatchesPolicy
from datapipes.listings import JobListings
from datapipes.loader_arguments import InexactResumeWarning, check_arguments
from datapipes.loader_dispatch import make_dispatch, placeholder_dispatcher
from datapipes.loader_reports import LoaderReports
from datapipes.loader_stats import LoaderStats
from datapipes.pipe import DataPipe
from datapipes.progress import ProgressBar, progress_bar_class
from datapipes.resume import JobSetup, ResumePlan, parse_state, rank_state, resume_plan
from datapipes.resume.graph import GraphRecord, node_path
from datapipes.resume.remaining import check_recipe
from datapipes.takeover import TakeoverHost, check_lease_seconds
from datapipes.topology import resolve_topology
from datapipes.workers import (
    runtime_recipe,
    worker_drop_counts,
)
from nodes import Context, Node
from nodes.errors import InvalidStateError, StateMismatchError  # noqa: F401 - re-exported
from nodes.worker_bundles import check_items_per_transfer


class Loader(LoaderReports):
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
    and what follows them in this process; ``items_per_transfer=K`` items per
    DataLoader transfer (for small items; order: runs of ``K`` per worker);
    ``even_batches`` (default: on under ``torch.distributed`` with several
    ranks): every rank yields as many items, the surplus dropped with a
    :class:`datapipes.UnevenDataWarning`, so a DDP job never hangs in a
    collective; ``pin_memory``/``device`` append those steps; ``stats`` and
    ``progress``; ``dispatch="dynamic"`` hands out units of ``dispatch_unit_items``
    on demand through ``store`` (:mod:`datapipes.dispatch`), and
    ``dispatch_lease_seconds`` lets finished ranks take over a stalled rank's
    units (:mod:`datapipes.takeover`).
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
        items_per_transfer: int = 1,
        **dataloader_options: Any,
    ) -> None:
        check_arguments(pipe, num_workers, dataloader_options)
        self.items_per_transfer = check_items_per_transfer(items_per_transfer, num_workers)
        if items_per_transfer > 1 and dispatch_lease_seconds is not None:
            raise ValueError(
                "dispatch_lease_seconds counts a taken-over rank's delivered items in "
                "DataLoader transfers, which items_per_transfer > 1 groups: use one or the other"
            )
        check_dispatch(dispatch, dataloader_options)
        if pin_memory:
            pipe = pipe.pin_memory()
        if device is not None:
            pipe = pipe.to_device(device)
        self.pipe = pipe
        self._fingerprint = pipe.fingerprint()
        self._steps = pipe.steps()
        self.seed = int(seed)
        self.topology = resolve_topology(rank, world_size, mesh=mesh, mesh_dims=mesh_dims)
        self.topology.check_against_torch_distributed()
        self.rank, self.world_size = self.topology.rank, self.topology.world_size
        self.num_workers = num_workers
        self.collects_stats = bool(stats)
        self.progress = bool(progress)
        if self.progress:
            progress_bar_class()  # a missing tqdm is an error now, not at the first epoch
        self._context = Context(
            rank=self.rank, world_size=self.world_size, seed=self.seed, stats=self.collects_stats
        )
        for caveat in pipe.resume_caveats():  # said once, where the Loader is made
            warnings.warn(caveat, InexactResumeWarning, stacklevel=2)
        self._runtime_pipe = runtime_recipe(
            pipe,
            self.topology,
            self.seed,
            num_workers,
            dataloader_options,
            stats=stats,
            items_per_transfer=self.items_per_transfer,
        )
        self._even = EvenBatchesPolicy(even_batches, pipe, self.topology, num_workers, self.seed)
        # Dynamic dispatch (datapipes.dispatch) and its leases (datapipes.takeover).
        self._dispatch, self._takeovers = make_dispatch(
            pipe, self.topology, num_workers, self.seed,
            dispatch=dispatch, store=store, unit_items=dispatch_unit_items,
            lease_seconds=dispatch_lease_seconds, even_batches=even_batches,
            host=self._takeover_host,
        )  # fmt: skip
        if self._dispatch is not None and not num_workers:
            self._context.work = placeholder_dispatcher(self.rank)  # it claims in this process
        # Listed once, at the first build; by rank 0 for all when the ranks iterate together.
        self._listings = JobListings(pipe, self._even.group)
        self._cursor = EpochCursor()
        self._root: Node[Any] | None = None  # the built graph, kept from epoch to epoch
        self._graph = GraphRecord(self._runtime_pipe)  # its shape, for checkpoints
        self._stats = LoaderStats(self.collects_stats)
        # After a resume on another topology: (epoch, every new consumer's plan), see
        # datapipes.elastic; this rank's consumers read theirs during that epoch only.
        self._plan: ResumePlan | None = None
        # (epoch, the graph's state at the start of a fresh run): a state taken before the
        # run delivered anything is the epoch's start (node None), which merges as such.
        self._fresh: tuple[int, Any] | None = None
        self._drops = CarriedDrops()  # dropped before the checkpoint it resumed
        # (epoch, counts) of the graph close() let go, so dropped() still tells them.
        self._closed_drops: tuple[int, dict[str, int]] | None = None

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
        self.topology.check_against_torch_distributed()  # set up before init_process_group?
        root = self._root
        if root is None:
            root = self._root = self._build()
            self._closed_drops = None
            self._stats.new_graph()
        run = self._cursor.next_run()
        self._context.epoch = run.epoch
        if self._dispatch is not None:
            self._begin_dispatch(run.epoch, continuing=run.resume_from is not None)
        self._stats.new_epoch(root)
        try:
            root.reset(run.resume_from)
        except StopIteration as error:  # a resume replaying past the data (never raw)
            raise InvalidStateError(
                node_path(self.rank),
                "a position within the epoch's data",
                "?",
                note="resuming it ran out of items",
            ) from error
        self._cursor.begin(run)  # only now: a position the graph refused stays pending
        self._fresh = None if run.resume_from is not None else (run.epoch, root.state_dict())
        return self._cursor.watch(self._run(root, run))

    def _begin_dispatch(self, epoch: int, *, continuing: bool) -> None:
        """Give this epoch's units to the rank's consumers (this process, or its workers)."""
        assert self._dispatch is not None
        listings = self._listings.get(self._context)
        spec = self._dispatch.begin_epoch(epoch, listings, continuing=continuing)
        if self.num_workers:
            self._worker_dataset().dispatch_spec = spec
        else:
            self._context.work.use(spec)

    @property
    def even_batches(self) -> bool:
        """Whether every rank yields the same number of items per epoch (see the class doc).

        With the default ``even_batches=None`` on several ranks this is decided
        once ``torch.distributed`` is initialized, or at the first epoch.
        """
        return self._even.value

    def _build(self) -> Node[Any]:
        # The worker plan's graph, evened across ranks, under the Loader's statistics row.
        if self._dispatch is not None and self.even_batches and self._even.group() is NO_GROUP:
            raise ValueError(
                "even_batches with dispatch='dynamic' needs torch.distributed: the ranks' "
                "shares are only known as they are claimed, so they agree on the count as "
                "they go (a gloo all_reduce). Initialize the process group, or pass "
                "even_batches=False"
            )
        if self._takeovers is not None and self.even_batches:
            check_lease_seconds(self._takeovers.lease_seconds, True)  # decided only now
        context = self._context
        context.listings = self._listings.get(context)  # rank 0's, shared with the workers
        self._apply_plan(context)
        root = self._even.wrap(self._runtime_pipe.build(context), lambda: context.epoch)
        return self._stats.wrap(root)

    def _run(self, root: Node[Any], run: EpochRun) -> Iterator[Any]:
        items = iter(root)
        if hasattr(items, "close"):
            # `yield from` forwards close() to an iterator that has one. When an abandoned
            # iterator of an earlier epoch is collected, that would close the graph the
            # current epoch is reading; so only this run's own exit closes it, below.
            items = chain(items)  # the same items, through an iterator that has no close()
        if self._takeovers is not None:
            assert self._dispatch is not None and self._dispatch.spec is not None
            items = self._takeovers.deliver(items, self._dispatch.spec)
        self._stats.clock.start()
        bar = None
        if self.progress:
            bar = ProgressBar(run.epoch, self.pipe, progress_bar_class())
            items = bar.wrap(items)
        try:
            yield from items
        except GeneratorExit:
            if self._cursor.is_current(run):  # abandoned mid-epoch: free threads and files now
                root.close()
            raise
        finally:
            if self._cursor.is_current(run):  # not an abandoned iterator of an earlier epoch
                self._stats.clock.stop()
            if bar is not None:
                bar.close()
        if self._takeovers is not None and self._takeovers.fenced and root is self._root:
            root.close()  # another rank delivers the rest: free its workers and files now
            self._stats.keep(root, run.epoch)
            self._root = None  # the next epoch builds a new graph
        self._cursor.finish(run)

    def close(self) -> None:
        """Stop background threads and release resources; the Loader can be iterated again.

        A mid-epoch position survives: ``state_dict()`` after ``close()`` is the
        state before it, and the next iteration continues the interrupted epoch.
        """
        if self._root is not None:
            self._closed_drops = (self._cursor.last, worker_drop_counts(self._root))
            self._cursor.suspend(self._root.state_dict)  # also ends an iterator kept from before
            self._root.close()
            self._stats.keep(self._root, self._cursor.last)  # they outlive the graph
            self._root = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- checkpoints ---------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position of the whole pipeline: plain data (json / ``weights_only`` safe).

        What all ranks share (version, fingerprint, steps, seed, topology) sits
        at the top; this rank's epoch and node states sit under its own key in
        ``state["ranks"]``, so in a ``torch.distributed.checkpoint`` save every
        rank writes its own position. The layout is :mod:`datapipes.checkpoint`'s.
        Taking it runs no collective: any subset of ranks may call it.
        To resume on another world size or number of workers, merge every
        rank's state with :func:`datapipes.merge_states`.
        """
        if self._takeovers is not None:
            self._takeovers.check_checkpoint()
        root = self._root
        epoch, node = self._cursor.position(None if root is None else root.state_dict)
        if self._fresh is not None and node is not None and self._fresh == (epoch, node):
            node = None  # nothing delivered yet: the start of the epoch
        plans = None
        deal = None if self._plan is None else self._plan.deal
        if deal is not None and deal[0] in (epoch, epoch - 1):
            # Kept one epoch on: a rank that finished its share still tells what it was.
            plans = (deal[0], deal[1][self._consumers.start : self._consumers.stop])
        dispatch = None
        if self._dispatch is not None:
            dispatch = self._dispatch.record(epoch, self._consumers)
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

    @property
    def _consumers(self) -> range:
        return range(
            self.rank * max(self.num_workers, 1), (self.rank + 1) * max(self.num_workers, 1)
        )

    def _apply_plan(self, ctx: Context) -> None:
        """Hand this rank's consumers their share of a dealt epoch (the Loader's context, or
        its workers'); under dynamic dispatch the units claimed are the work."""
        if self._dispatch is not None:
            return
        plan = self._plan
        if self.num_workers:
            dataset = self._worker_dataset()
            deal = None if plan is None else plan.deal
            dataset.worker_plans = (
                None if deal is None else deal[1][self._consumers.start : self._consumers.stop]
            )
            dataset.plans_epoch = None if deal is None else deal[0]
        else:
            ctx.work = None if plan is None else plan.consumer_work(self.setup, self.rank, 0)

    def _worker_dataset(self) -> Any:
        step = self._runtime_pipe
        while not hasattr(step, "_dataset"):
            step = step.inputs[0]
        return step._dataset

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

    def _takeover_host(self, dispatch: DynamicDispatch) -> TakeoverHost:
        return TakeoverHost(
            pipe=self.pipe,
            fingerprint=self._fingerprint,
            steps=self._steps,
            setup=lambda: self.setup,
            rank=self.rank,
            client=lambda: dispatch.client,
            state=self.state_dict,
            epoch=lambda: self._cursor.epoch,
            record=dispatch.record,
            listings=lambda: self._listings.get(self._context),
        )
