"""The chainable steps of a recipe: map, filter, shuffle, batch, take, repeat, ..., to_device.

Each builds one runtime node; decoding samples' bytes is :mod:`datapipes.steps.decode`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from datapipes.pipe import DataPipe
from nodes import (
    BatchNode,
    BufferShuffleNode,
    Context,
    FilterNode,
    FlatMapNode,
    MapNode,
    Node,
    PrefetchNode,
    RepeatNode,
    ScopedContext,
    SequenceNode,
    TakeNode,
    default_collate,
    unbatch_items,
)
from nodes.sources.batched_fetch import FetchBatchNode, fetching_source
from nodes.steps.device import PinMemoryNode, ToDeviceNode
from nodes.steps.parallel_map import ParallelMapNode, check_parallel_map
from nodes.steps.shard import ShardNode, WholeDataContext


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _callable(step: str, fn: Any) -> Any:
    if not callable(fn):
        raise TypeError(f"{step}() takes a function, got {type(fn).__name__}")
    return fn


class Map(DataPipe[Any]):
    """``fn(item)`` for every item."""

    name = "map"
    consumer_length = DataPipe._upstream_length

    def __init__(
        self,
        upstream: DataPipe[Any],
        fn: Callable[[Any], Any],
        num_workers: int | None = None,
        *,
        method: str = "thread",
        ordered: bool = True,
    ) -> None:
        kwargs: dict[str, Any] = {}
        if num_workers is not None:
            check_parallel_map(_callable("map", fn), num_workers, method)
            kwargs = {"num_workers": num_workers, "method": method}
            if not ordered:
                kwargs["ordered"] = False
        elif method != "thread" or not ordered:
            raise ValueError("map's method and ordered apply to a parallel map: set num_workers")
        super().__init__(upstream, args=(_callable("map", fn),), **kwargs)

    @property
    def parallel(self) -> bool:
        """Whether the calls run on a pool (``num_workers`` was given)."""
        return "num_workers" in self.kwargs

    @property
    def replays_input(self) -> bool:
        """A parallel map resumes by re-reading up to 64 upstream items."""
        return self.parallel

    @property
    def unordered(self) -> bool:
        """Whether results come out as they finish (a replay may reorder them)."""
        return self.kwargs.get("ordered", True) is False

    def random_access(self) -> tuple[Sequence[Any], tuple[Callable[[Any], Any], ...]] | None:
        inner = None if self.parallel else self.inputs[0].random_access()
        return None if inner is None else (inner[0], (*inner[1], self.args[0]))

    def _build(self, ctx: Context) -> Node[Any]:
        upstream = self.inputs[0].build(ctx)
        if not self.parallel:
            return MapNode(upstream, self.args[0])
        return ParallelMapNode(
            upstream,
            self.args[0],
            self.kwargs["num_workers"],
            method=self.kwargs["method"],
            ordered=self.kwargs.get("ordered", True),
        )


class Filter(DataPipe[Any]):
    """Items for which ``predicate(item)`` is true."""

    name = "filter"

    def __init__(self, upstream: DataPipe[Any], predicate: Callable[[Any], bool]) -> None:
        super().__init__(upstream, args=(_callable("filter", predicate),))

    def _build(self, ctx: Context) -> Node[Any]:
        return FilterNode(self.inputs[0].build(ctx), self.args[0])


class FlatMap(DataPipe[Any]):
    """Every item of ``fn(item)``."""

    name = "flat_map"
    replays_input = True  # resumes by re-reading upstream items (see check_replay_order)

    def __init__(self, upstream: DataPipe[Any], fn: Callable[[Any], Any]) -> None:
        super().__init__(upstream, args=(_callable("flat_map", fn),))

    def _build(self, ctx: Context) -> Node[Any]:
        return FlatMapNode(self.inputs[0].build(ctx), self.args[0])


class Unbatch(DataPipe[Any]):
    """The samples of every batch."""

    name = "unbatch"
    replays_input = True  # resumes by re-reading upstream items (see check_replay_order)

    def _build(self, ctx: Context) -> Node[Any]:
        return FlatMapNode(self.inputs[0].build(ctx), unbatch_items)


class Shuffle(DataPipe[Any]):
    """A global shuffle of random-access data, or a buffer shuffle of a stream."""

    name = "shuffle"
    consumer_length = DataPipe._upstream_length

    def __init__(
        self, upstream: DataPipe[Any], *, buffer_size: int | None, seed: int | None
    ) -> None:
        if buffer_size is None and isinstance(upstream, Map) and upstream.parallel:
            raise ValueError(
                "a global shuffle() reorders indices, so put it before map(..., num_workers=...)"
                ": the parallel map then works on the shuffled stream"
            )
        if buffer_size is None and upstream.random_access() is None:
            raise ValueError(
                f"shuffle() without buffer_size needs random-access data, but {upstream!r} is "
                "a stream (a filter, flat_map, batch, iterable source, ... changes the item "
                "count). Pass buffer_size=N for a buffer shuffle, or shuffle before those steps."
            )
        if buffer_size is not None:
            _positive("shuffle buffer_size", buffer_size)
        kwargs = {} if buffer_size is None else {"buffer_size": buffer_size}
        if seed is not None:
            kwargs["seed"] = seed
        super().__init__(upstream, **kwargs)

    @property
    def replays_input(self) -> bool:
        """A buffer shuffle resumes by re-reading a window of upstream items."""
        return "buffer_size" in self.kwargs

    def stats_label(self) -> str:
        if "buffer_size" in self.kwargs:
            return self.describe_step()
        # A global shuffle runs its source and the maps before it as one node.
        return repr(self).removeprefix("dp.")

    def _build(self, ctx: Context) -> Node[Any]:
        seed = self.kwargs.get("seed")
        buffer_size = self.kwargs.get("buffer_size")
        if buffer_size is None:
            seq, fns = self.inputs[0].random_access()  # type: ignore[misc]
            return SequenceNode(seq, ctx, shuffle_key=[self._key()], shuffle_seed=seed, fns=fns)
        upstream = self.inputs[0].build(ctx)
        return BufferShuffleNode(upstream, buffer_size, ctx, self._key(), seed=seed)


class Batch(DataPipe[Any]):
    """Lists of ``size`` items, collated."""

    name = "batch"

    def __init__(
        self,
        upstream: DataPipe[Any],
        size: int,
        *,
        drop_last: bool,
        collate_fn: Callable[[list[Any]], Any] | None,
    ) -> None:
        kwargs: dict[str, Any] = {}
        if drop_last:
            kwargs["drop_last"] = True
        if collate_fn is not None:
            kwargs["collate_fn"] = _callable("batch collate_fn", collate_fn)
        super().__init__(upstream, args=(_positive("batch size", size),), **kwargs)

    def consumer_length(self, ctx: Context) -> int | None:
        n = self._upstream_length(ctx)
        if n is None:
            return None
        size = self.args[0]
        return n // size if self.kwargs.get("drop_last") else -(-n // size)

    def _build(self, ctx: Context) -> Node[Any]:
        upstream = self.inputs[0].build(ctx)
        size, drop_last = self.args[0], self.kwargs.get("drop_last", False)
        collate_fn = self.kwargs.get("collate_fn", default_collate)
        source = fetching_source(upstream)
        if source is None:
            return BatchNode(upstream, size, drop_last=drop_last, collate_fn=collate_fn)
        source.fetch_for_batches(size)  # one __getitems__ call per batch
        if source is not upstream:  # maps in between: they still see the items one by one
            return BatchNode(upstream, size, drop_last=drop_last, collate_fn=collate_fn)
        return FetchBatchNode(source, size, drop_last=drop_last, collate_fn=collate_fn)


class Take(DataPipe[Any]):
    """The first ``count`` items."""

    name = "take"

    def __init__(self, upstream: DataPipe[Any], count: int) -> None:
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"take count must be an int >= 0, got {count!r}")
        super().__init__(upstream, args=(count,))

    def consumer_length(self, ctx: Context) -> int | None:
        n = self._upstream_length(ctx)
        return None if n is None else min(n, self.args[0])

    def _build(self, ctx: Context) -> Node[Any]:
        return TakeNode(self.inputs[0].build(ctx), self.args[0])


class Repeat(DataPipe[Any]):
    """The upstream, ``times`` times over (forever if ``None``)."""

    name = "repeat"

    def __init__(self, upstream: DataPipe[Any], times: int | None) -> None:
        if times is not None:
            _positive("repeat times", times)
        super().__init__(upstream, args=() if times is None else (times,))

    def consumer_length(self, ctx: Context) -> int | None:
        n = self._upstream_length(ctx)
        return None if n is None or not self.args else n * self.args[0]

    def _build(self, ctx: Context) -> Node[Any]:
        scope = ScopedContext(ctx)
        times = self.args[0] if self.args else None
        return RepeatNode(self.inputs[0].build(scope), scope, times)


class Prefetch(DataPipe[Any]):
    """The upstream, computed ``depth`` items ahead on a background thread."""

    name = "prefetch"
    consumer_length = DataPipe._upstream_length

    def __init__(self, upstream: DataPipe[Any], depth: int) -> None:
        super().__init__(upstream, args=(_positive("prefetch depth", depth),))

    def _build(self, ctx: Context) -> Node[Any]:
        return PrefetchNode(self.inputs[0].build(ctx), self.args[0])


class Shard(DataPipe[Any]):
    """Every consumer's share of a stream that all consumers read in full."""

    name = "shard"
    replays_input = True  # resumes by re-reading upstream items (see check_replay_order)

    def consumer_length(self, ctx: Context) -> int | None:
        n = self.inputs[0].consumer_length(WholeDataContext(ctx))
        return None if n is None else len(range(ctx.consumer_index, n, ctx.num_consumers))

    def _build(self, ctx: Context) -> Node[Any]:
        return ShardNode(self.inputs[0].build(WholeDataContext(ctx)), ctx)


class PinMemory(DataPipe[Any]):
    """Items with their tensors in page-locked memory (main process)."""

    name = "pin_memory"
    consumer_length = DataPipe._upstream_length
    main_process_only = True

    def _build(self, ctx: Context) -> Node[Any]:
        return PinMemoryNode(self.inputs[0].build(ctx))


class ToDevice(DataPipe[Any]):
    """Items with their tensors on a device (main process)."""

    name = "to_device"
    consumer_length = DataPipe._upstream_length
    main_process_only = True

    def __init__(self, upstream: DataPipe[Any], device: str | torch.device | None) -> None:
        if device is not None:
            device = str(torch.device(device))  # validates the name, keeps the recipe plain
        super().__init__(upstream, args=() if device is None else (device,))

    def _build(self, ctx: Context) -> Node[Any]:
        return ToDeviceNode(self.inputs[0].build(ctx), self.args[0] if self.args else None)
