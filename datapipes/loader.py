"""The Loader: epochs, seeds, and checkpoints of a whole pipeline.

The Loader composes parts that each have one job: the worker plan
(:mod:`datapipes.workers`: which steps run in DataLoader workers), the epoch
cursor (:mod:`datapipes.epochs`: which epoch runs, where it resumes), the
``even_batches`` policy (:mod:`datapipes.even_batches`) and the checkpoint
format (:mod:`datapipes.checkpoint`). What stays here is building the graph
once, running it epoch by epoch, and its statistics.
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
from datapipes.loader_stats import LoaderStats
from datapipes.pipe import DataPipe
from datapipes.progress import ProgressBar, progress_bar_class
from datapipes.resume import JobSetup, ResumePlan, parse_state, rank_state, resume_plan
from datapipes.resume.graph import GraphRecord, node_path
from datapipes.resume.remaining import check_recipe
from datapipes.stats import PipelineStats
from datapipes.takeover import TakeoverHost, Takeovers, check_lease_seconds
from datapipes.topology import resolve_topology
from datapipes.workers import (
    runtime_recipe,
    worker_drop_counts,
    worker_loss_counts,
    worker_skip_counts,
)
from nodes import Context, Node
from nodes.dispatch import Dispatcher, DispatchSpec
from nodes.errors import InvalidStateError, StateMismatchError  # noqa: F401 - re-exported
from nodes.worker_bundles import check_items_per_transfer

_DATALOADER_OPTIONS = frozenset(
    {
        "prefetch_factor",
        "timeout",
        "multiprocessing_context",
        "worker_init_fn",
        "snapshot_every_n_steps",
        "persistent_workers",
    }
)


def _check_arguments(pipe: Any, num_workers: Any, dataloader_options: dict[str, Any]) -> None:
    """Refuse, saying what to pass instead, arguments a Loader cannot run with."""
    if not isinstance(pipe, DataPipe):
        raise TypeError(
            f"Loader takes a DataPipe recipe, got {type(pipe).__name__}; build one with "
            "dp.from_sequence(...), dp.range(...) or dp.from_iterable(...)"
        )
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
    unknown = set(dataloader_options) - _DATALOADER_OPTIONS
    if unknown:
        raise TypeError(
            f"Loader got unexpected arguments {sorted(unknown)}; DataLoader options it "
            f"passes on are {sorted(_DATALOADER_OPTIONS)}"
        )
    if dataloader_options and num_workers == 0:
        raise ValueError(
            f"{sorted(dataloader_options)} configure worker processes: set num_workers > 0"
        )
    prefetch_factor = dataloader_options.get("prefetch_factor", 2)
    if not isinstance(prefetch_factor, int) or prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be an int >= 1, got {prefetch_factor!r}")


class InexactResumeWarning(UserWarning):
    """A step of the recipe cannot resume exactly (said when the Loader is made, with the fix)."""


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

    **Ranks.** ``rank``/``world_size`` (a data-parallel rank), else ``mesh``
    with its data-parallel ``mesh_dims`` (ranks of one tensor-parallel group
    read the same data), else ``torch.distributed`` when it is initialized,
    else the ``RANK``/``WORLD_SIZE`` environment variables. Each rank reads its
    own share of the data.

    **Workers.** With ``num_workers=N > 0`` the pipeline runs in ``N``
    DataLoader worker processes (torchdata's ``StatefulDataLoader``), each
    reading its own share; ``pin_memory()``, ``to_device()`` and the steps
    after them run in this process. ``state_dict()`` then covers every worker,
    items computed ahead included. ``prefetch_factor``, ``timeout``,
    ``multiprocessing_context``, ``worker_init_fn``, ``persistent_workers``
    and ``snapshot_every_n_steps`` (default 32: a resume replays fewer items
    than that, see :class:`nodes.WorkerStreamNode`) go to the DataLoader.
    Workers start afresh each epoch unless ``persistent_workers=True``, which
    keeps them from one epoch to the next (a resume, or ``set_epoch`` to any
    other epoch, starts fresh ones). A worker's error is raised here with its
    traceback.

    ``items_per_transfer=K`` (default 1) makes each worker send ``K``
    consecutive items of its share per DataLoader transfer, which this process
    hands out one by one: for small items (JSONL records, batches of a few
    small tensors) where the DataLoader's ~0.5 ms of CPU per transfer is a
    large share of the work. The order becomes runs of ``K`` items per worker
    in turn (still the same every run); checkpoints stay exact, also mid-run,
    and resume on another topology or ``K``. Up to ``K x prefetch_factor``
    items per worker are in flight: leave it at 1 for large items (image
    batches), where the transfer cost is small beside the item's.

    **Even epochs.** With ``even_batches`` every rank yields the same number of
    items per epoch (the extra items of the fuller ranks are dropped, with an
    :class:`datapipes.UnevenDataWarning` saying how many), so a DDP job never
    hangs in a collective because one rank ran out first. The default
    (``None``) turns it on when ``torch.distributed`` runs more than one rank;
    ranks then agree through one tiny gloo ``all_reduce`` per 8 items (read
    ahead), so every
    rank must iterate the Loader (for rank-0-only evaluation make that Loader
    with ``rank=0, world_size=1``). Without
    ``torch.distributed`` (``even_batches=True`` with explicit ranks), the
    counts are computed: from lengths for sequences, else by a counting pass.

    ``pin_memory=True`` and ``device=...`` are shorthands for appending
    ``.pin_memory()`` and ``.to_device(device)`` to the recipe.

    **Dynamic dispatch.** ``dispatch="dynamic"`` cuts each epoch into units
    (``dispatch_unit_items`` positions of a random-access source, or a file or
    file part) that each consumer claims when it runs dry, through ``store`` (a
    ``torch.distributed`` store; default: the process group's, or one of its own
    for a single rank), so a slow rank reads less; checkpoints stay exact and
    resume on any topology, dynamic or static (see :mod:`datapipes.dispatch`).
    ``dispatch_lease_seconds=s`` (several ranks that run no collectives) lets the
    ranks that finished take over, within the epoch, the units of a rank that
    stopped renewing its lease for ``s`` seconds; a stalled rank that wakes up
    has its late items dropped (see :mod:`datapipes.takeover`).
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
        _check_arguments(pipe, num_workers, dataloader_options)
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
        # Dynamic dispatch (datapipes.dispatch): each epoch's units claimed through a store.
        self._dispatch: DynamicDispatch | None = None
        if dispatch == "dynamic":
            self._dispatch = DynamicDispatch(
                pipe, self.topology, num_workers, self.seed,
                store=store, unit_items=dispatch_unit_items,
            )  # fmt: skip
            if not num_workers:  # this process is the rank's one consumer: it claims here
                placeholder = DispatchSpec(None, "", -1, 1, 1)
                self._context.work = Dispatcher(placeholder, self.topology.rank)
        elif store is not None or dispatch_lease_seconds is not None:
            which = "store=" if store is not None else "dispatch_lease_seconds="
            raise ValueError(f"{which} is for dispatch='dynamic'; static dealing has no claims")
        self._takeovers: Takeovers | None = None
        if dispatch_lease_seconds is not None:
            check_lease_seconds(dispatch_lease_seconds, even_batches)
            if self.world_size > 1:  # with one rank there is nobody to take over
                self._takeovers = Takeovers(self._takeover_host(), float(dispatch_lease_seconds))
                assert self._dispatch is not None
                self._dispatch.fenced = True
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
        if not self.collects_stats:
            raise RuntimeError(
                "statistics are off for this Loader: make it with dp.Loader(..., stats=True)"
            )
        report = self._stats.report(self._root, self._cursor.last)
        if self._takeovers is not None:
            report.leases = self._takeovers.report()
        return report

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
        return worker_skip_counts(self._root)

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
        return worker_loss_counts(self._root)

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
        if self._root is None and self._closed_drops is not None:  # closed since: as it was
            epoch, counts = self._closed_drops
            if epoch == self._cursor.last:
                return self._drops.report(dict(counts), epoch, True)
        built = self._root is not None
        return self._drops.report(worker_drop_counts(self._root), self._cursor.last, built)

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

    def _takeover_host(self) -> TakeoverHost:
        assert self._dispatch is not None
        dispatch = self._dispatch
        return TakeoverHost(
            pipe=self.pipe,
            fingerprint=self._fingerprint,
            steps=self._steps,
            setup=lambda: self.setup,
            rank=self.rank,
            client=lambda: dispatch.client,
            state=self.state_dict,
            start_state=self._state_for,
            listings=lambda: self._listings.get(self._context),
        )

    def _state_for(self, rank: int) -> dict[str, Any]:
        """A state of this job at the start of the running epoch, with ``rank``'s entry (a
        rank taken over before it published its own, see datapipes.takeover)."""
        assert self._dispatch is not None
        epoch = self._cursor.epoch
        return rank_state(
            fingerprint=self._fingerprint,
            steps=self._steps,
            setup=self.setup,
            rank=rank,
            epoch=epoch,
            node=None,
            dispatch=self._dispatch.record(epoch, self.setup.consumers_of(rank)),
        )
