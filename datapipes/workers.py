"""How a Loader lays a recipe out over worker processes, the main process and the ranks."""

from __future__ import annotations

import multiprocessing
import pickle
from itertools import chain
from typing import Any

from datapipes.pipe import DataPipe
from datapipes.placement import check_replay_order, rebuild_on, split_main_steps
from datapipes.topology import Topology
from datapipes.torch_dataset import TorchDataset
from nodes import Context, Node
from nodes.base import every_consumer, walk_graph
from nodes.errors import skip_counts
from nodes.even import CollectiveAgreement, CountedAgreement, RankAgreement
from nodes.workers import WorkerStreamNode


class InWorkers(DataPipe[Any]):
    """The part of a recipe that runs in DataLoader worker processes (built by a Loader)."""

    name = "in_workers"

    def __init__(self, dataset: TorchDataset, num_workers: int, options: dict[str, Any]) -> None:
        super().__init__(args=(dataset.pipe, num_workers))
        object.__setattr__(self, "_dataset", dataset)
        object.__setattr__(self, "_options", options)

    def stats_label(self) -> str:
        return f"DataLoader workers ({self.args[1]} processes)"

    def _build(self, ctx: Context) -> Node[Any]:
        return WorkerStreamNode(
            self._dataset,  # type: ignore[attr-defined]
            self.args[1],
            lambda: ctx.epoch,
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


def worker_states(root: Node[Any] | None) -> list[dict[str, Any]]:
    """The latest state each DataLoader worker of ``root``'s graph sent (see ``TorchDataset``)."""
    return [
        state or {}
        for node in walk_graph(root)
        if isinstance(node, WorkerStreamNode)
        for state in node.worker_states()
    ]


def worker_skip_counts(root: Node[Any] | None) -> dict[str, int]:
    """Bad records skipped per step, in this process's graph and in the worker processes."""
    counts = skip_counts(root)
    for state in worker_states(root):
        for step, count in state.get("skipped", {}).items():
            counts[step] = counts.get(step, 0) + count
    return counts


_COUNT_PRESERVING = ("map", "shuffle", "prefetch", "pin_memory", "to_device")


def items_per_rank(
    pipe: DataPipe[Any], world_size: int, num_workers: int, seed: int, epoch: int
) -> list[int]:
    """How many items each rank's Loader yields in ``epoch``, computed without communication.

    From :meth:`DataPipe.consumer_length` when the recipe's counts are known
    (sequences and count-keeping steps: no data is read), else by running
    every consumer's part of the pipeline and counting (a full pass over the
    epoch's data). Used by ``even_batches`` when ranks cannot talk through
    ``torch.distributed``.
    """
    worker_part, main_steps = split_main_steps(pipe)
    changing = [step for step in main_steps if step.name not in _COUNT_PRESERVING]
    if changing:
        raise ValueError(
            f"even_batches without torch.distributed counts items in the workers, but "
            f".{changing[0].describe_step()} runs in the main process and changes the count; "
            "move it before pin_memory()/to_device(), or initialize torch.distributed"
        )
    counts = [0] * world_size
    for ctx in every_consumer(world_size, max(num_workers, 1), epoch=epoch, seed=seed):
        known = worker_part.consumer_length(ctx)
        counts[ctx.rank] += _count_by_running(worker_part, ctx) if known is None else known
    return counts


def _count_by_running(pipe: DataPipe[Any], ctx: Context) -> int:
    root = pipe.build(ctx)
    try:
        root.reset(None)
        return sum(1 for _ in chain(root))
    finally:
        root.close()


def even_batches_on(even_batches: bool | None, topology: Topology) -> bool | None:
    """Whether every rank must yield the same number of items; ``None``: not decidable yet.

    The default (``even_batches=None``) is on when ``torch.distributed`` runs
    more than one rank, which may only be known later than the Loader is
    made: under ``torchrun`` a Loader made before ``init_process_group`` has
    its ranks from ``RANK``/``WORLD_SIZE``. Until the process group is up that
    default is ``None``, and the Loader decides at its first epoch (or takes
    the value of a checkpoint it loads). Ranks given as arguments without a
    process group decide now: off.
    """
    import torch.distributed as dist

    if topology.world_size == 1:
        return False
    if even_batches is not None:
        return bool(even_batches)
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    return None if topology.origin == "RANK/WORLD_SIZE" else False


def even_batches_agreement(
    pipe: DataPipe[Any], topology: Topology, num_workers: int, seed: int
) -> RankAgreement:
    """How ranks agree to stop together: through torch.distributed, else by counting.

    Under ``torch.distributed`` this makes a gloo group when the default
    backend is another one, which is collective: every rank calls it at the
    same point (its first epoch).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # A gloo group of its own, so the agreement never queues behind NCCL work on the GPU.
        group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        return CollectiveAgreement(group)
    world = topology.world_size
    return CountedAgreement(
        lambda epoch: items_per_rank(pipe, world, num_workers, seed, epoch), topology.rank
    )
