"""Hugging Face ``IterableDataset``: each consumer's part, split the way HF splits it.

Found by duck typing (HF's module name and the private attributes that
:mod:`nodes.adapters.third_party` reads), so ``datasets`` is never imported by
datapipes itself.

Consumer ``c`` of ``C`` reads ``split_dataset_by_node(ds, rank=c, world_size=C)``:
with at least ``C`` shards, whole shards (shard ``i`` goes to consumer ``i % C``,
as HF deals shards to DataLoader workers); with fewer, every consumer reads the
stream and keeps every ``C``-th example (HF's example-level fallback). The part
is a new dataset object (with HF's fresh state), and runs with the worker info
hidden, so HF does not split it a second time inside a DataLoader worker.
"""

from __future__ import annotations

from typing import Any

from nodes.adapters.third_party import (
    hf_buffer_shuffle_size,
    hf_example_iterables,
    hf_split,
    is_hf_like,
)
from nodes.context import Context


def is_hf_iterable(source: Any) -> bool:
    """Whether ``source`` is a Hugging Face ``datasets.IterableDataset``."""
    return (
        type(source).__module__.startswith("datasets.")
        and hasattr(source, "n_shards")
        and is_hf_like(source)
    )


def hf_shuffle_buffer(source: Any) -> int | None:
    """The buffer size of a Hugging Face ``IterableDataset``'s ``.shuffle()``, else ``None``.

    Read off the chain of example iterables HF keeps, without importing ``datasets``.
    """
    for node in hf_example_iterables(source):
        size = hf_buffer_shuffle_size(node)
        if size is not None:
            return size
    return None


def hf_part(source: Any, ctx: Context) -> Any:
    """The part of HF ``IterableDataset`` ``source`` that ``ctx``'s consumer reads.

    A dataset the user already split with ``split_dataset_by_node(rank=r,
    world_size=w)`` is taken as this rank's data when the Loader is rank ``r``
    of ``w`` (or knows of no ranks), and split across the rank's workers only.
    """
    from datasets.distributed import split_dataset_by_node  # the source is HF's: installed

    consumer, consumers = ctx.consumer_index, ctx.num_consumers
    split = hf_split(source)
    if split is not None:
        parent = ctx.shard_ctx  # set when a .shard() splits the stream later
        ranks = ctx.world_size if parent is None else parent.world_size
        mine = parent is None and (split.rank, split.world_size) == (ctx.rank, ranks)
        if ranks > 1 and not mine:
            where = "before a .shard() on" if parent is not None else "as"
            raise ValueError(
                f"dp.from_iterable got a Hugging Face IterableDataset already split with "
                f"split_dataset_by_node(rank={split.rank}, world_size={split.world_size}), "
                f"but it runs {where} rank {(parent or ctx).rank} of {ranks}: some records "
                "would reach no rank. Pass the dataset before split_dataset_by_node, without "
                ".shard(): dp.from_iterable splits it across ranks and workers by its shards."
            )
        consumer, consumers = ctx.worker_id, ctx.num_workers  # the rank's data, by workers
    # Always a new dataset, even for one consumer: HF builds it with a fresh state, which
    # the source (perhaps iterated already) no longer has.
    if split is None:
        strategy = "shards" if source.n_shards >= consumers else "examples"
        return split_dataset_by_node(source, consumer, consumers, strategy=strategy)
    try:
        return split_dataset_by_node(source, consumer, consumers)
    except ValueError as error:  # its strategy was fixed by the user's split
        raise ValueError(
            f"dp.from_iterable cannot split a Hugging Face IterableDataset already split with "
            f"split_dataset_by_node(..., strategy={split.strategy!r}) across {consumers} "
            f"workers ({error}). Pass the dataset before split_dataset_by_node: "
            "dp.from_iterable splits it across ranks and workers itself."
        ) from error
