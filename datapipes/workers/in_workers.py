"""The worker plan: which steps of a recipe run in DataLoader workers, which in this process.

Also reads back what the workers report (their states, skip counts).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from datapipes.pipe import DataPipe
from datapipes.placement import RecipePlan, rebuild_on
from datapipes.workers.shipping import pickled
from datapipes.workers.torch_dataset import TorchDataset, WorkerJob
from nodes import Context, Node
from nodes.base import walk_graph
from nodes.errors import add_losses, loss_counts, skip_counts
from nodes.steps.batch import drop_counts
from nodes.workers.bundles import AUTO
from nodes.workers.dataloader import start_method
from nodes.workers.stream import WorkerStreamNode

if TYPE_CHECKING:
    from datapipes.loader.options import LoaderOptions
    from nodes.sources.files import Listings


class WorkerJobs(Protocol):
    """Where a Loader's workers get what they read besides the recipe, at each start."""

    def job(self, listings: Listings | None, epoch: int) -> WorkerJob:
        """The job of the workers that start for ``epoch`` with the Loader's ``listings``."""


class InWorkers(DataPipe[Any]):
    """The part of a recipe that runs in DataLoader worker processes (built by a Loader)."""

    name = "in_workers"

    def __init__(
        self,
        dataset: TorchDataset,
        num_workers: int,
        options: dict[str, Any],
        jobs: WorkerJobs,
    ) -> None:
        super().__init__(args=(dataset.pipe, num_workers))
        object.__setattr__(self, "_dataset", dataset)
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "_jobs", jobs)

    def stats_label(self) -> str:
        per = self._dataset.items_per_transfer  # type: ignore[attr-defined]
        sent = f", {per} items per transfer" if per not in (1, AUTO) else ""
        return f"DataLoader workers ({self.args[1]} processes{sent})"

    def _build(self, ctx: Context) -> Node[Any]:
        dataset: TorchDataset = self._dataset  # type: ignore[attr-defined]
        # Each start of the workers gets a dataset of its own with what they read then (the
        # Loader's listings, so they never list again; an epoch's shares or units).
        starts = partial(_dataset_for, dataset, self._jobs, ctx.listings)  # type: ignore[attr-defined]
        return WorkerStreamNode(
            dataset,
            self.args[1],
            lambda: ctx.epoch,
            items_per_transfer=dataset.items_per_transfer,
            dataset_for_epoch=starts,
            **self._options,  # type: ignore[attr-defined]
        )


def _dataset_for(
    dataset: TorchDataset, jobs: WorkerJobs, listings: Listings | None, epoch: int
) -> TorchDataset:
    return dataset.for_job(jobs.job(listings, epoch))


def runtime_recipe(recipe: RecipePlan, options: LoaderOptions, jobs: WorkerJobs) -> DataPipe[Any]:
    """The recipe a Loader builds: the recipe itself without workers, else the recipe with
    everything before its main-process steps moved into worker processes.

    The worker part is built once here (as worker 0 would build it; building
    opens nothing), so a recipe that cannot run fails now, not at the first
    item or inside a worker: a main-process step where workers would run it,
    a source that would hand every consumer the same data (``from_iterable``
    without ``shard()``), a recipe that spawned workers could not receive.
    """
    topology, num_workers = options.topology, options.num_workers
    ctx = Context(
        rank=topology.rank,
        world_size=topology.world_size,
        num_workers=max(num_workers, 1),
        seed=options.seed,
    )
    recipe.worker_part.build(ctx).close()
    if not num_workers:
        return recipe.recipe
    dataloader_options = dict(options.dataloader_options)
    check_picklable(recipe.worker_part, dataloader_options.get("multiprocessing_context"))
    dataset = TorchDataset(
        recipe.worker_part,
        topology,
        options.seed,
        stats=options.stats,
        inline_tensors=True,
        job=WorkerJob(
            items_per_transfer=options.items_per_transfer,
            dispatched=options.dispatch is not None,
        ),
    )
    workers = InWorkers(dataset, num_workers, dataloader_options, jobs)
    return rebuild_on(workers, recipe.main_steps)


def check_picklable(pipe: DataPipe[Any], context: Any) -> None:
    """Refuse, naming the step and the fix, a recipe that a ``spawn``/``forkserver`` worker
    could not receive (lambdas and closures travel: see :mod:`datapipes.workers.shipping`)."""
    method = start_method(context)
    if method != "fork":
        pickled(pipe, method)


def worker_states(root: Node[Any] | None) -> list[dict[str, Any]]:
    """The latest state each DataLoader worker of ``root``'s graph sent (see ``TorchDataset``)."""
    return [
        state or {}
        for node in walk_graph(root)
        if isinstance(node, WorkerStreamNode)
        for state in node.worker_states()
    ]


def worker_loss_counts(root: Node[Any] | None) -> dict[str, dict[str, int]]:
    """What the skips lost per step, in this process's graph and in the worker processes."""
    counts = loss_counts(root)
    for state in worker_states(root):
        lost = state.get("losses", {})
        for step, skipped in state.get("skipped", {}).items():
            # A step without lost files or ranges lost its bad records only.
            losses = lost.get(step) or {"records": skipped, "files": 0, "ranges": 0, "bytes": 0}
            add_losses(counts.setdefault(step, {}), losses)
    return counts


def worker_drop_counts(root: Node[Any] | None) -> dict[str, int]:
    """Items dropped at the end of the epoch per step, here and in the worker processes."""
    return _with_workers(drop_counts(root), root, "dropped")


def worker_skip_counts(root: Node[Any] | None) -> dict[str, int]:
    """Bad records skipped per step, in this process's graph and in the worker processes."""
    return _with_workers(skip_counts(root), root, "skipped")


def _with_workers(counts: dict[str, int], root: Node[Any] | None, key: str) -> dict[str, int]:
    """``counts`` (this process's, per step) plus those the workers report under ``key``."""
    for state in worker_states(root):
        for step, count in state.get(key, {}).items():
            counts[step] = counts.get(step, 0) + count
    return counts
