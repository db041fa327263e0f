"""The Loader: runs a recipe epoch by epoch; its checkpoints resume through one plan.

A resume parses the state once and carries out a :class:`datapipes.resume.ResumePlan`
(:mod:`datapipes.resume`); the worker plan (:mod:`datapipes.workers.in_workers`), the epoch
cursor (:mod:`datapipes.loader.epochs`), the ``even_batches`` policy
(:mod:`datapipes.loader.even_batches`) and the reports (:mod:`datapipes.loader.reports`)
are parts with one job each.
"""

from __future__ import annotations

import atexit
import os
import warnings
import weakref
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

from datapipes.dispatch.dynamic import DEFAULT_UNIT_ITEMS, DynamicDispatch, check_dispatch
from datapipes.dispatch.setup import check_lease_seconds, make_dispatch, placeholder_dispatcher
from datapipes.dispatch.takeover import TakeoverHost
from datapipes.loader.checkpoints import LoaderCheckpoints
from datapipes.loader.consumers import RankConsumers
from datapipes.loader.drops import CarriedDrops
from datapipes.loader.epoch_stats import LoaderStats
from datapipes.loader.epochs import EpochCursor, EpochRun
from datapipes.loader.even_batches import NO_GROUP, EvenBatchesPolicy
from datapipes.loader.listings import JobListings, default_store_comparison
from datapipes.loader.options import InexactResumeWarning, check_arguments
from datapipes.loader.progress import ProgressBar, progress_bar_class
from datapipes.loader.reports import LoaderReports
from datapipes.observe.trace import PipelineTrace
from datapipes.pipe import DataPipe
from datapipes.resume import ResumePlan
from datapipes.resume.graph import GraphRecord, node_path
from datapipes.topology import resolve_topology
from datapipes.workers.in_workers import (
    runtime_recipe,
    worker_dataset,
    worker_drop_counts,
)
from nodes import Context, Node
from nodes.errors import InvalidStateError, StateMismatchError  # noqa: F401 - re-exported
from nodes.workers.bundles import AUTO, bundled, check_items_per_transfer


class Loader(LoaderCheckpoints, LoaderReports):
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
        check_arguments(pipe, num_workers, dataloader_options)
        if items_per_transfer == AUTO and dispatch_lease_seconds is not None:
            items_per_transfer = 1  # leases count a rank's items in transfers (see below)
        self.items_per_transfer = check_items_per_transfer(items_per_transfer, num_workers)
        if bundled(self.items_per_transfer) and dispatch_lease_seconds is not None:
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
        self._consumers = RankConsumers(self._runtime_pipe, self._context, num_workers)
        self._even = EvenBatchesPolicy(even_batches, pipe, self.topology, num_workers, self.seed)
        # Dynamic dispatch and its leases (datapipes.dispatch: dynamic, takeover).
        self._dispatch, self._takeovers = make_dispatch(
            pipe, self.topology, num_workers, self.seed,
            dispatch=dispatch, store=store, unit_items=dispatch_unit_items,
            lease_seconds=dispatch_lease_seconds, even_batches=even_batches,
            host=self._takeover_host,
        )  # fmt: skip
        if self._dispatch is not None and not num_workers:
            self._context.work = placeholder_dispatcher(self.rank)  # it claims in this process
        # Listed once, at the first build; by rank 0 for all when the ranks iterate together.
        compare = None  # under dynamic dispatch the store compares them
        if self._dispatch is None:
            compare = default_store_comparison(self.rank, self.world_size, self._fingerprint)
        self._listings = JobListings(pipe, self._even.group, compare)
        self._cursor = EpochCursor()
        self._root: Node[Any] | None = None  # the built graph, kept from epoch to epoch
        self._graph = GraphRecord(self._runtime_pipe)  # its shape, for checkpoints
        self._stats = LoaderStats(self.collects_stats)
        self._built_trace: Any = None  # the trace recorder the graph was built with, if any
        # The plan of the last resume (datapipes.resume): a dealt epoch's shares live here.
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
        if self._root is not None and self._built_trace is not self._context.trace:
            self.close()  # a trace began or ended: build the graph with (or without) spans
        root = self._root
        if root is None:
            root = self._root = self._build()
            self._closed_drops = None
            self._stats.new_graph()
        run = self._cursor.next_run()
        self._context.epoch = run.epoch
        if self._dispatch is not None:  # this epoch's units, for the rank's consumers
            listings = self._listings.get(self._context)
            continuing = run.resume_from is not None
            self._consumers.hand_units(
                self._dispatch.begin_epoch(run.epoch, listings, continuing=continuing)
            )
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
        body = self._run(root, run)
        _OPEN_RUNS.add(body)
        return self._cursor.watch(body)

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
        self._built_trace = context.trace
        return self._stats.wrap(root, context.trace)

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
        if self._stats.enabled:
            items = self._stats.timed(items, root, run.epoch)
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
        if self._dispatch is not None and self._cursor.is_current(run):
            self._dispatch.end_epoch(run.epoch)
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
        if self._context.trace is not None:
            raise RuntimeError("a trace of this Loader is running already: end it first")
        if self._cursor.in_use:
            raise RuntimeError(
                f"epoch {self._cursor.epoch} is being read, by a graph built without spans: "
                "enter loader.trace() before the loop (`with loader.trace(path): for batch "
                "in loader: ...`), between epochs, or after loader.close() (which keeps the "
                "position)"
            )
        self.close()  # built again with spans at the next iteration, where it stopped
        self._context.trace = recorder
        dataset = worker_dataset(self._runtime_pipe)
        if dataset is not None:  # the workers started for the next graph write their own
            dataset.trace_folder = folder

    def _stop_trace(self) -> None:
        self._context.trace = None
        dataset = worker_dataset(self._runtime_pipe)
        if dataset is not None:
            dataset.trace_folder = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _takeover_host(self, dispatch: DynamicDispatch) -> TakeoverHost:
        return TakeoverHost(
            pipe=self.pipe,
            fingerprint=self._fingerprint,
            steps=self._steps,
            setup=lambda: self.setup,
            rank=self.rank,
            client=lambda: dispatch.client,
            state=self._position,
            epoch=lambda: self._cursor.epoch,
            record=dispatch.record,
            listings=lambda: self._listings.get(self._context),
        )


#: Epoch runs (``Loader._run`` generators) not finished. One abandoned mid-epoch and held
#: by a module global would be finalized only as the interpreter clears module globals,
#: when closing its graph calls functions already gone ("Exception ignored in: <generator
#: object Loader._run>"); they are closed at exit instead, with everything in place.
_OPEN_RUNS: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _close_open_runs() -> None:
    for body in list(_OPEN_RUNS):
        try:
            body.close()
        except ValueError:  # running in another thread: left to the interpreter
            pass
