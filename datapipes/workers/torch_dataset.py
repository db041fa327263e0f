"""A recipe as a torch ``IterableDataset`` that shards itself and resumes exactly."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.utils.data

from datapipes.placement import check_no_main_steps, check_replay_order
from datapipes.resume.model import JobSetup
from datapipes.topology import Topology
from datapipes.workers.shipping import ByValue
from nodes import Context, Node
from nodes.consumer_work import ConsumerWork, DealtWork
from nodes.credentials import scrub_error
from nodes.dispatch import Dispatcher, DispatchSpec
from nodes.errors import (
    InvalidStateError,
    check_losses,
    loss_counts,
    lost_files_and_ranges,
    skip_counts,
)
from nodes.observe.stats import graph_stats
from nodes.observe.trace import worker_recorder
from nodes.state_checks import expect_equal, expect_int, expect_keys
from nodes.steps.batch import drop_counts
from nodes.workers.bundles import TransferRule, bundled, bundles
from nodes.workers.carry import carry
from nodes.workers.handover import inline_small_tensors

#: What ``next`` returns from a graph that has no item left.
_END = object()

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe
    from nodes.sources.files import Listings


@dataclass(frozen=True)
class WorkerJob:
    """What a Loader's DataLoader workers read besides the recipe, fixed when they start.

    ``items_per_transfer``: items a worker sends at once (> 1 or ``"auto"``: lists, see
    :mod:`nodes.workers.bundles`); ``listings``: the Loader's file listings, so no worker
    lists again; ``plans``: after a resume on another topology, ``(epoch, each worker's
    share)`` (see :mod:`nodes.elastic`); ``dispatch``: under dynamic dispatch, the epoch's
    units, which each worker claims through the store (``dispatched``: the Loader
    dispatches so, its workers' graphs are built to claim); ``trace_folder``: while a
    trace runs, where each worker's spans go (see :mod:`nodes.observe.trace`).
    """

    items_per_transfer: int | str = 1
    dispatched: bool = False
    listings: Listings | None = None
    plans: tuple[int, list[Any]] | None = None
    dispatch: DispatchSpec | None = None
    trace_folder: str | None = None


#: The job of a ``TorchDataset`` under a user's own DataLoader: nothing beyond the recipe.
NO_JOB = WorkerJob()


class TorchDataset(torch.utils.data.IterableDataset):
    """An ``IterableDataset`` over a recipe, for users who keep their own DataLoader.

    In each DataLoader worker it builds the recipe for its consumer slot
    (rank, worker), so the data is dealt across ``world_size * num_workers``
    consumers and every item reaches exactly one of them, under torch's
    ``DataLoader`` and torchdata's ``StatefulDataLoader`` alike. With a
    ``StatefulDataLoader`` its ``state_dict``/``load_state_dict`` give exact
    mid-epoch resume, prefetched items included.

    Epochs: call ``set_epoch(e)`` before each epoch, as with torch's
    ``DistributedSampler``. Without it, each new pass over the same dataset
    object (``num_workers=0`` or ``persistent_workers=True``) runs the next
    epoch, and a fresh copy in new workers runs epoch 0 again. Persistent
    workers keep their own copy, so there ``set_epoch`` only takes effect on
    the first pass: later passes count on from it, one epoch per pass.

    Files: under your own DataLoader each worker lists a recipe's files itself
    (a Loader lists once and hands the listings in its ``job``, which its workers read).

    >>> import datapipes as dp
    >>> from torch.utils.data import DataLoader
    >>> ds = dp.range(8).as_torch_dataset()
    >>> sorted(DataLoader(ds, batch_size=None, num_workers=0))
    [0, 1, 2, 3, 4, 5, 6, 7]
    """

    def __init__(
        self,
        pipe: DataPipe[Any],
        topology: Topology,
        seed: int = 0,
        *,
        stats: bool = False,
        inline_tensors: bool = False,
        job: WorkerJob = NO_JOB,
    ) -> None:
        check_no_main_steps(pipe)
        check_replay_order(pipe, 0, in_torch_dataset=True)
        self.pipe = pipe
        self.topology = topology
        self.seed = int(seed)
        self.stats = stats
        # Only where the DataLoader's collate passes items through unchanged (a Loader's
        # workers): a collating DataLoader would meet the wrappers instead of tensors.
        self.inline_tensors = inline_tensors
        # What a Loader's workers read besides the recipe (see WorkerJob); a user's own
        # DataLoader: nothing, so each worker lists its files and reads its own share.
        self.job = job
        self._epoch = 0
        self._last_epoch: int | None = None
        self._pending: dict[str, Any] | None = None
        self._root: Node[Any] | None = None
        self._ctx: Context | None = None
        self._start: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for spawned workers, which cannot see the process group: check it here.
        self.topology.check_against_torch_distributed()
        # A copy sent to a worker starts clean: the live graph (files, threads) stays here.
        # The recipe goes by value, so its lambdas and closures travel too.
        live = {"_root": None, "_ctx": None, "_start": None}
        return {**self.__dict__, **live, "pipe": ByValue(self.pipe)}

    def for_job(self, job: WorkerJob) -> TorchDataset:
        """A copy of this dataset, at its start, whose workers read ``job``."""
        return TorchDataset(
            self.pipe, self.topology, self.seed,
            stats=self.stats, inline_tensors=self.inline_tensors, job=job,
        )  # fmt: skip

    @property
    def items_per_transfer(self) -> int | str:
        """Items a worker sends per DataLoader transfer (1: one item each)."""
        return self.job.items_per_transfer

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass run ``epoch`` (forgets a loaded but unused state)."""
        self._epoch = int(epoch)
        self._last_epoch = None
        self._pending = None

    def _context(self) -> Context:
        info = torch.utils.data.get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # A forked worker inherits the process group, so the check holds there too.
        self.topology.check_against_torch_distributed()
        return self._consumer_context(worker_id, num_workers)

    def _consumer_context(self, worker_id: int, num_workers: int, epoch: int = 0) -> Context:
        """The context of worker ``worker_id`` of ``num_workers``: its slot, the listings
        and, after a resume on another topology, its share (see nodes.elastic)."""
        work: ConsumerWork | None = None
        spec, plans = self.job.dispatch, self.job.plans
        if spec is not None and spec.epoch == epoch:
            # Under dynamic dispatch the worker's sources claim the epoch's units themselves.
            work = Dispatcher(spec, self.topology.rank * num_workers + worker_id)
        elif plans is not None and worker_id < len(plans[1]):
            work = DealtWork(plans[0], plans[1][worker_id])
        setup = JobSetup(self.topology.world_size, num_workers, self.seed)
        return setup.context(
            self.topology.rank,
            worker_id,
            epoch,
            listings=self.job.listings,
            work=work,
            stats=self.stats,
        )

    def __iter__(self) -> Iterator[Any]:
        ctx = self._context()
        pending, self._pending = self._pending, None
        if pending is not None:
            # Checked before anything reads it, as a Loader checks its states: a hostile or
            # damaged state is an InvalidStateError naming the place, never a raw KeyError.
            keys = {"epoch", "consumer", "node", "skipped"}
            expect_keys(pending, "state", keys, optional={"stats", "losses", "dropped"})
            expect_int(pending, "epoch", "state", 0)
            self._check_consumer(pending, ctx)
            ctx.epoch = pending["epoch"]
            self.validate_state(pending, ctx.worker_id, ctx.num_workers, ctx.epoch, "state")
        elif self._last_epoch is not None:
            ctx.epoch = self._last_epoch + 1
        else:
            ctx.epoch = self._epoch
        self._last_epoch = ctx.epoch
        # Built again for the epoch the pass runs: its share, or its units under dispatch.
        ctx = self._consumer_context(ctx.worker_id, ctx.num_workers, ctx.epoch)
        if self._root is not None:
            self._root.close()
        self._root, self._ctx, self._start = None, ctx, pending
        return self._run(ctx, pending)

    def _run(self, ctx: Context, pending: dict[str, Any] | None) -> Iterator[Any]:
        # Built at the first item, not in __iter__: a DataLoader worker that fails there
        # reports the error with an item, which the main process handles like any other,
        # rather than during its startup handshake, where torchdata cannot stop it.
        in_worker = torch.utils.data.get_worker_info() is not None
        if self.job.trace_folder is not None and in_worker:
            ranked = f"rank {ctx.rank} " if ctx.world_size > 1 else ""
            name = f"{ranked}DataLoader worker {ctx.worker_id}"
            ctx.trace = worker_recorder(self.job.trace_folder, name)
        root = None
        try:
            root = self.pipe.build(ctx)
            root.reset(None if pending is None else pending["node"])
            self._root = root
            items: Iterator[Any] = iter(root)
            if bundled(self.job.items_per_transfer) and in_worker:
                # Formed from the items as the pipeline made them (the rule may weigh
                # them), each item then prepared to travel on its own.
                rule = TransferRule(self.job.items_per_transfer)
                sent: Iterator[Any] = bundles(items, rule, ctx.worker_id)
                if self.inline_tensors:
                    sent = (list(map(inline_small_tensors, bundle)) for bundle in sent)
                yield from sent
                return
            if self.inline_tensors and in_worker:
                items = map(inline_small_tensors, items)
            yield from items
        except Exception as error:
            if not in_worker:  # a user's DataLoader without workers: this is the boundary
                scrub_error(error)
                raise
            # torch would rebuild it in the main process as type(message), which most types
            # with several arguments (BadRecordError among them) do not take: carry it whole.
            raise carry(error, ctx.worker_id) from None
        finally:
            if root is not None:
                root.close()
            if ctx.trace is not None:  # the pass's spans reach the trace before its end
                ctx.trace.flush()

    def state_dict(self) -> dict[str, Any]:
        """This consumer's position: epoch, consumer slot and node state (plain data)."""
        ctx = self._ctx
        if ctx is None:
            return dict(self._pending) if self._pending is not None else {}
        if self._root is None:  # a pass that has not read its first item starts here
            start = self._start or {}
            node, skipped, rows = start.get("node"), start.get("skipped", {}), []
            losses = start.get("losses", {})
        else:
            node, skipped = self._root.state_dict(), skip_counts(self._root)
            rows = graph_stats(self._root) if self.stats else []
            losses = lost_files_and_ranges(loss_counts(self._root))
        state = {
            "epoch": ctx.epoch,
            "consumer": [ctx.rank, ctx.world_size, ctx.worker_id, ctx.num_workers],
            "node": node,
            "skipped": skipped,
        }
        if losses:  # what lost files and ranges held, for Loader.losses() in the main process
            state["losses"] = losses
        dropped = {} if self._root is None else drop_counts(self._root)
        if dropped:  # a short last batch dropped, for Loader.dropped() in the main process
            state["dropped"] = dropped
        if self.stats:  # how per-step statistics reach a Loader's main process
            state["stats"] = rows
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass continue from ``state`` (taken by :meth:`state_dict`)."""
        self._pending = dict(state) if state else None

    @staticmethod
    def _check_consumer(state: dict[str, Any], ctx: Context) -> None:
        ours = [ctx.rank, ctx.world_size, ctx.worker_id, ctx.num_workers]
        if list(state["consumer"]) != ours:
            saved = state["consumer"]
            raise ValueError(
                f"this state belongs to rank {saved[0]} of {saved[1]}, worker {saved[2]} of "
                f"{saved[3]}, but it is loaded into rank {ours[0]} of {ours[1]}, worker "
                f"{ours[2]} of {ours[3]}; resume with the same world size and num_workers"
            )

    def validate_state(
        self,
        state: Any,
        worker_id: int,
        num_workers: int,
        epoch: int,
        path: str,
        *,
        ended: bool = False,
    ) -> None:
        """Refuse (:class:`nodes.errors.InvalidStateError`) a state of worker ``worker_id``
        that it could not resume: checked against the graph that worker builds, here.
        ``ended``: the worker had run out, which its graph, resumed, must confirm."""
        expect_keys(
            state,
            path,
            {"epoch", "consumer", "node", "skipped"},
            optional={"stats", "losses", "dropped"},
        )
        expect_int(state, "epoch", path, epoch, epoch)
        ours = [self.topology.rank, self.topology.world_size, worker_id, num_workers]
        expect_equal(state, "consumer", path, ours, "this worker's rank, world size, id, count")
        skipped = state["skipped"]
        if not isinstance(skipped, dict) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in skipped.values()
        ):
            raise InvalidStateError(f"{path}.skipped", "a dict of counts >= 0 by step", skipped)
        check_losses(state.get("losses", {}), f"{path}.losses")
        if state["node"] is None and not ended:
            return
        root = self.pipe.build(self._consumer_context(worker_id, num_workers, epoch))
        try:
            if state["node"] is not None:
                root.validate_state(state["node"], f"{path}.node")
            if ended:  # else the worker's remaining items would be lost
                root.reset(state["node"])
                if next(iter(root), _END) is not _END:
                    raise InvalidStateError(
                        path.removesuffix(".dataset_state") + ".fetcher_state.fetcher_ended",
                        "false (this worker has items left)",
                        True,
                    )
        finally:
            root.close()

    def __repr__(self) -> str:
        rank, world = self.topology.rank, self.topology.world_size
        return f"TorchDataset({self.pipe!r}, rank={rank}, world_size={world})"
