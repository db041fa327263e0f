"""The worker plan: which steps of a recipe run in DataLoader workers, which in this process.

Also reads back what the workers report (their states, skip counts).
"""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

from datapipes.pipe import DataPipe
from datapipes.placement import check_replay_order, rebuild_on, split_main_steps
from datapipes.topology import Topology
from datapipes.workers.torch_dataset import TorchDataset
from nodes import Context, Node
from nodes.base import walk_graph
from nodes.errors import add_losses, loss_counts, skip_counts
from nodes.steps.batch import drop_counts
from nodes.workers.bundles import AUTO
from nodes.workers.stream import WorkerStreamNode


class InWorkers(DataPipe[Any]):
    """The part of a recipe that runs in DataLoader worker processes (built by a Loader)."""

    name = "in_workers"

    def __init__(self, dataset: TorchDataset, num_workers: int, options: dict[str, Any]) -> None:
        super().__init__(args=(dataset.pipe, num_workers))
        object.__setattr__(self, "_dataset", dataset)
        object.__setattr__(self, "_options", options)

    def stats_label(self) -> str:
        per = self._dataset.items_per_transfer  # type: ignore[attr-defined]
        sent = f", {per} items per transfer" if per not in (1, AUTO) else ""
        return f"DataLoader workers ({self.args[1]} processes{sent})"

    def _build(self, ctx: Context) -> Node[Any]:
        # The workers read the Loader's listings (inherited or pickled), never list again.
        self._dataset.listings = ctx.listings  # type: ignore[attr-defined]
        return WorkerStreamNode(
            self._dataset,  # type: ignore[attr-defined]
            self.args[1],
            lambda: ctx.epoch,
            items_per_transfer=self._dataset.items_per_transfer,  # type: ignore[attr-defined]
            **self._options,  # type: ignore[attr-defined]
        )


def runtime_recipe(
    pipe: DataPipe[Any],
    topology: Topology,
    seed: int,
    num_workers: int,
    options: dict[str, Any],
    *,
    stats: bool = False,
    items_per_transfer: int | str = 1,
) -> DataPipe[Any]:
    """The recipe a Loader builds: ``pipe`` itself without workers, else ``pipe`` with
    everything before its main-process steps moved into worker processes.

    The worker part is built once here (as worker 0 would build it; building
    opens nothing), so a recipe that cannot run fails now, not at the first
    item or inside a worker: a main-process step where workers would run it,
    a source that would hand every consumer the same data (``from_iterable``
    without ``shard()``), a recipe that spawned workers could not unpickle.
    """
    check_replay_order(pipe, num_workers)
    worker_part, main_steps = split_main_steps(pipe)
    ctx = Context(
        rank=topology.rank,
        world_size=topology.world_size,
        num_workers=max(num_workers, 1),
        seed=seed,
    )
    worker_part.build(ctx).close()
    if not num_workers:
        return pipe
    check_picklable(worker_part, options.get("multiprocessing_context"))
    dataset = TorchDataset(worker_part, topology, seed, stats=stats, inline_tensors=True)
    dataset.items_per_transfer = items_per_transfer
    return rebuild_on(InWorkers(dataset, num_workers, options), main_steps)


def check_picklable(pipe: DataPipe[Any], context: Any) -> None:
    """Refuse, with the fix, a recipe that a ``spawn``/``forkserver`` worker could not receive."""
    if context is None:
        method = multiprocessing.get_start_method()
    else:
        method = context if isinstance(context, str) else context.get_start_method()
    if method == "fork":
        return
    try:
        pickle.dumps(pipe)
    except Exception as error:
        raise TypeError(
            f"worker processes started with {method!r} receive the recipe pickled, but it does "
            f"not pickle: {error}. Define the functions it uses at module level (lambdas and "
            "local functions do not pickle), or use multiprocessing_context='fork'."
        ) from error


def worker_dataset(pipe: DataPipe[Any]) -> TorchDataset | None:
    """The dataset a Loader's runtime recipe sends to its DataLoader workers, if it has any."""
    stack = [pipe]
    while stack:
        step = stack.pop()
        if isinstance(step, InWorkers):
            return step._dataset  # type: ignore[attr-defined]
        stack.extend(step.inputs)
    return None


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
