"""The fluent API of a recipe: one method per step, each returning a new recipe.

:class:`datapipes.DataPipe` inherits these from :class:`FluentSteps`; they
only build the step (its class lives in :mod:`datapipes.steps.transforms`,
:mod:`datapipes.steps.random_map` or :mod:`datapipes.steps.custom`; those that know a
format are in :mod:`datapipes.fluent_formats`), so the recipe's repr, identity and random streams
are the steps', not this module's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from datapipes.fluent_formats import FormatSteps
from datapipes.topology import resolve_topology
from datapipes.workers.torch_dataset import TorchDataset
from nodes import Node

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe

T = TypeVar("T")


class FluentSteps(FormatSteps, Generic[T]):
    """The step methods of :class:`datapipes.DataPipe`, grouped by family (those that know a
    format in :class:`~datapipes.fluent_formats.FormatSteps`)."""

    # ----- items one by one ---------------------------------------------------------------
    def map(
        self,
        fn: Callable[[T], Any],
        num_workers: int | None = None,
        *,
        method: str = "thread",
        ordered: bool = True,
    ) -> DataPipe[Any]:
        """Apply ``fn`` to every item: ``dp.range(3).map(str)`` yields ``'0', '1', '2'``.

        With ``num_workers=k`` the calls run on a pool of ``k`` threads
        (``method="thread"``, for work that releases the GIL: numpy, Pillow,
        torch ops, I/O) or processes (``method="process"``, for pure-Python
        work; ``fn`` must pickle). At most ``2 * k`` tasks are in flight,
        each holding as many items as take about 2 ms (threads) or 10 ms
        (processes) of work, up to 256.
        ``ordered=True`` keeps the upstream order and exact resume;
        ``ordered=False`` yields results as they finish, and a resume then
        neither loses nor repeats items but may change their order; so no
        later step may resume by re-reading its input (a buffer shuffle,
        ``flat_map``, ``unbatch``, ``shard``, another parallel map, DataLoader
        workers), and the Loader refuses such recipes. See
        :class:`nodes.ParallelMapNode`.

        >>> import datapipes as dp
        >>> list(dp.Loader(dp.range(4).map(str, num_workers=2)))
        ['0', '1', '2', '3']
        """
        return _steps().Map(self, fn, num_workers, method=method, ordered=ordered)

    def random_map(
        self,
        fn: Callable[..., Any],
        *,
        global_rng: bool | str | Sequence[str] = False,
        seed: int | None = None,
    ) -> DataPipe[Any]:
        """Random transforms that resume exactly: ``fn(item, rng)`` for every item.

        ``rng`` is a fresh ``numpy.random.Generator`` whose stream is a pure
        function of (seed, epoch, this step's place in the recipe, the item's
        place in the epoch's data): the same item gets the same draws at any
        ``num_workers`` and world size, after a resume and in a new process,
        and new draws every epoch. ``global_rng=True`` calls ``fn(item)`` with
        torch's CPU RNG, ``random`` and ``np.random`` seeded that way per item and
        restored after it, so unmodified torchvision-style transforms become
        reproducible (``global_rng="torch"``, or some of ``"torch,random,numpy"``:
        only those; numpy's costs the most). ``seed`` overrides the Loader's
        seed for this step. Put it before ``prefetch()`` and
        ``map(..., num_workers=...)``, which read ahead (the Loader refuses it
        after them, saying so). See
        :class:`nodes.steps.random_map.RandomMapNode`.

        >>> import datapipes as dp
        >>> pipe = dp.range(3).random_map(lambda x, rng: x + rng.random())
        >>> [int(x) for x in dp.Loader(pipe)], list(dp.Loader(pipe)) == list(dp.Loader(pipe))
        ([0, 1, 2], True)
        """
        from datapipes.steps.random_map import RandomMap  # it imports this module

        return RandomMap(self, fn, global_rng=global_rng, seed=seed)

    def filter(self, predicate: Callable[[T], bool]) -> DataPipe[T]:
        """Keep the items for which ``predicate(item)`` is true."""
        return _steps().Filter(self, predicate)

    def flat_map(self, fn: Callable[[T], Iterable[Any]]) -> DataPipe[Any]:
        """Replace every item by the items of ``fn(item)`` (a deterministic function)."""
        return _steps().FlatMap(self, fn)

    # ----- order, grouping and length -----------------------------------------------------
    def shuffle(self, buffer_size: int | None = None, *, seed: int | None = None) -> DataPipe[T]:
        """Shuffle, with a new order every epoch.

        Without ``buffer_size`` on random-access data (``range``,
        ``from_sequence`` and maps of them) this is a global shuffle: a fresh
        permutation of all items every epoch, computed on the fly with O(1)
        memory and state. On a stream, ``buffer_size`` is required and the
        shuffle mixes items within a buffer of that size (see
        :class:`nodes.BufferShuffleNode` for its state and resume cost).
        ``seed`` overrides the Loader's seed for this step.
        """
        return _steps().Shuffle(self, buffer_size=buffer_size, seed=seed)

    def batch(
        self,
        size: int,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> DataPipe[Any]:
        """Group ``size`` items and collate them (``dp.default_collate`` unless ``collate_fn``)."""
        return _steps().Batch(self, size, drop_last=drop_last, collate_fn=collate_fn)

    def unbatch(self) -> DataPipe[Any]:
        """Split batches (lists, tensors, arrays, dicts of columns) back into items."""
        return _steps().Unbatch(self)

    def take(self, count: int) -> DataPipe[T]:
        """Stop after ``count`` items (per consumer)."""
        return _steps().Take(self, count)

    def repeat(self, times: int | None = None) -> DataPipe[T]:
        """Run the pipeline ``times`` times within one epoch (forever if ``None``).

        Each round gets a fresh random stream, so shuffles differ between rounds.
        """
        return _steps().Repeat(self, times)

    def shard(self) -> DataPipe[T]:
        """Split a stream across consumers here: each keeps every n-th item.

        Sources normally shard themselves (files are dealt, sequences split by
        index). ``shard()`` is for sources that cannot, such as
        ``dp.from_iterable``, or to choose where the split happens: the steps
        before it read all the data in every consumer (identically, shuffles
        included), so they cost ``world_size * num_workers`` times as much, and
        consumer ``c`` of ``C`` keeps items ``c, c + C, ...``. Sources before an
        explicit ``shard()`` do not shard again.

        >>> import datapipes as dp
        >>> gen = dp.from_iterable(lambda: iter("abcde")).shard()
        >>> list(dp.Loader(gen, rank=1, world_size=2))
        ['b', 'd']
        """
        return _steps().Shard(self)

    # ----- where items go: a thread ahead, pinned memory, a device, a DataLoader ----------
    def prefetch(self, depth: int = 2) -> DataPipe[T]:
        """Compute up to ``depth`` items ahead on a background thread."""
        return _steps().Prefetch(self, depth)

    def pin_memory(self) -> DataPipe[T]:
        """Put the tensors of every item in page-locked memory (a no-op without CUDA).

        Runs in the main process, after the worker processes; pinned batches
        copy to the GPU faster and asynchronously (see :meth:`to_device`).
        """
        return _steps().PinMemory(self)

    def to_device(self, device: str | None = None) -> DataPipe[Any]:
        """Move the tensors of every item (nested dicts, lists, tuples) to ``device``.

        Runs in the main process. On CUDA the copy is asynchronous, on a side
        stream, so it overlaps the training step on the previous batch. With
        ``device=None`` it copies to the current CUDA device when there is one
        and does nothing otherwise, so one recipe runs on GPU and CPU machines.
        """
        return _steps().ToDevice(self, device)

    def as_torch_dataset(
        self,
        seed: int = 0,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        mesh: Any = None,
        mesh_dims: Sequence[str] | str | None = None,
    ) -> TorchDataset:
        """This recipe as a torch ``IterableDataset`` for your own ``DataLoader``.

        It shards itself across DataLoader workers and ranks (``rank`` and
        ``world_size``, or a ``mesh`` with its data-parallel ``mesh_dims``, else
        ``torch.distributed``, else ``RANK``/``WORLD_SIZE``), and under torchdata's
        ``StatefulDataLoader`` resumes exactly. Use ``batch_size=None`` in the
        DataLoader when the recipe batches. See :class:`datapipes.TorchDataset`.
        """
        topology = resolve_topology(rank, world_size, mesh=mesh, mesh_dims=mesh_dims)
        return TorchDataset(self, topology, seed)

    # ----- a node of your own -------------------------------------------------------------
    def apply_node(
        self, factory: Callable[..., Node[Any]], /, *args: Any, **kwargs: Any
    ) -> DataPipe[Any]:
        """Run a node of your own on the items: ``factory(upstream_node, *args, **kwargs)``.

        ``factory`` is a :class:`nodes.Node` subclass (or a function returning
        a node) whose ``__init__`` takes the upstream node first and passes it
        to ``super().__init__(upstream)``. If it has a ``ctx`` parameter it also
        gets the :class:`nodes.Context` of the consumer it runs for (rank,
        worker, epoch; ``ctx.random_key(...)`` seeds an RNG, scoped to this
        step; add ``ctx.consumer_index`` to the key where workers and ranks
        must draw differently), passed by keyword. The node runs wherever
        the recipe runs (DataLoader workers included), and its
        ``state_dict()`` becomes part of the Loader's checkpoints, so it must
        keep the node contract: check it with :func:`nodes.testing.check_node`.
        ``args`` and ``kwargs`` are part of the recipe's fingerprint and must
        pickle for spawned workers.

        >>> import datapipes as dp
        >>> from nodes import Node
        >>> class RunningSum(Node):
        ...     def __init__(self, upstream):
        ...         super().__init__(upstream)
        ...         self.upstream = upstream
        ...     def reset(self, state=None):
        ...         self.upstream.reset(None if state is None else state["up"])
        ...         self.total = 0 if state is None else state["total"]
        ...     def __next__(self):
        ...         self.total += next(self.upstream)
        ...         return self.total
        ...     def state_dict(self):
        ...         return {"up": self.upstream.state_dict(), "total": self.total}
        >>> list(dp.Loader(dp.range(1, 5).apply_node(RunningSum)))
        [1, 3, 6, 10]
        """
        return _custom().ApplyNode(self, factory, *args, **kwargs)


# The step classes subclass DataPipe, so their modules import datapipes.pipe, which imports
# this one; the methods above reach them through these functions (or a local import), at
# call time, which is what lets every module exist.
def _steps() -> ModuleType:
    from datapipes.steps import transforms as steps

    return steps


def _custom() -> ModuleType:
    from datapipes.steps import custom

    return custom
