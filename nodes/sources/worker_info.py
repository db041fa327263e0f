"""What ``torch.utils.data.get_worker_info()`` says while an iterable dataset starts.

A torch ``IterableDataset`` that splits itself asks ``get_worker_info()`` for its
worker id and the number of workers, and an HF ``IterableDataset`` does so too.
Inside a DataLoader worker that answer is torch's (this process among the
DataLoader's workers), which is not the consumer a datapipes graph runs for
(one of ``world_size * num_workers``, or the only one when a ``shard()`` splits
the stream later). So :class:`IterableNode` sets the answer itself while the
dataset starts: the consumer it runs for (``presented``), or none at all
(``hidden``: "you are the only reader", torch's answer in the main process).

torch keeps the answer in a private module global, set through
:func:`nodes.adapters.torchdata.set_worker_info` (where it is checked against torch).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from nodes.adapters.torchdata import WorkerInfo, set_worker_info
from nodes.context import Context


class PresentedWorkerInfo(WorkerInfo):
    """torch's ``WorkerInfo`` for one consumer, noting whether the dataset read it."""

    def __getattribute__(self, name: str) -> Any:
        if name in ("id", "num_workers"):
            object.__getattribute__(self, "reads").append(name)
        return object.__getattribute__(self, name)

    def __init__(self, *, reads: list[str], **fields: Any) -> None:
        super().__init__(**fields)
        object.__setattr__(self, "reads", reads)


def consumer_worker_info(ctx: Context, dataset: Any) -> PresentedWorkerInfo:
    """The worker info of ``ctx``'s consumer: id ``consumer_index`` of ``num_consumers``.

    ``seed`` is derived from the Loader's seed, the epoch and the consumer, so a
    dataset that seeds its own RNG from it draws the same in every run.
    """
    key = ctx.random_key(ctx.consumer_index)
    seed = int(np.random.SeedSequence([abs(k) for k in key]).generate_state(1, np.uint64)[0])
    return PresentedWorkerInfo(
        reads=[],
        id=ctx.consumer_index,
        num_workers=ctx.num_consumers,
        seed=seed >> 1,
        dataset=dataset,
    )


@contextmanager
def worker_info_as(info: WorkerInfo | None) -> Iterator[None]:
    """Within the block, ``get_worker_info()`` answers ``info`` (``None``: the main process)."""
    saved = get_worker_info()
    set_worker_info(info)
    try:
        yield
    finally:
        set_worker_info(saved)


def started_with(
    source: Iterable[Any], info: WorkerInfo | None, *, refusal: str | None = None
) -> Iterator[Any]:
    """Iterate ``source``, with ``get_worker_info()`` answering ``info`` while it starts.

    A dataset reads the worker info when it starts: in ``__iter__``, or in the
    first step of a generator ``__iter__``. Both run under ``info``, lazily (at
    the first ``next``), so nothing is read before the consumer asks for it.
    The rest of the items pass through the generator's C-level delegation.
    With ``refusal``, a dataset that never read ``info`` (a
    :class:`PresentedWorkerInfo`) is refused with that ``ValueError``.
    """
    with worker_info_as(info):
        it = iter(source)
        first = next(it, _END)
    if refusal is not None and isinstance(info, PresentedWorkerInfo) and not info.reads:
        raise ValueError(refusal)
    if first is _END:
        return
    yield first
    yield from it


_END = object()
