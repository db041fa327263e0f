"""Several items per DataLoader transfer ("bundles"), made in a worker, dealt out in the main.

Every item that crosses from a DataLoader worker costs about 0.2-0.5 ms of CPU
in the DataLoader's protocol (index queue, pickling, the main process waking
up, on both sides), whatever its size. A worker sends lists of consecutive
items of its share instead, and the main process's
:class:`nodes.WorkerStreamNode` hands them out one by one: the DataLoader's
steps count bundles, the node's state adds how many items of the current
bundle were handed out (see ``WorkerStreamNode``).

How many items a bundle holds is the Loader's ``items_per_transfer``: ``K``
(up to ``K``), or ``"auto"`` (the default with workers): up to
:data:`AUTO_ITEMS`, a bundle closing early once its items hold
:data:`AUTO_BYTES` of tensors, arrays, bytes and text (:func:`item_bytes`).
Small items then travel 16 at a time; an item of 256 KiB or more (a batch of
images) travels alone, as with ``1``. The rule reads the items only, never a
clock, so the bundles (and the order: runs of a bundle per worker in turn) are
the same in every run, and a resume forms them again as they were.

A bundle is never empty. A worker whose share ends mid-bundle sends the short
bundle; one whose pipeline raises mid-bundle sends the items before the error
followed by a :class:`FailedInBundle` holding it, so the main process hands
those items out and then raises the error, as it would with one item per
transfer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from nodes.tensor_tree import PLAIN_VALUES
from nodes.workers.carry import carry

#: ``items_per_transfer="auto"``: at most this many items a transfer ...
AUTO_ITEMS = 16
#: ... and no more once its items hold this many bytes (a bigger item travels alone).
AUTO_BYTES = 256 * 1024
AUTO = "auto"


def max_items(per_transfer: int | str) -> int:
    """The most items one transfer carries under ``items_per_transfer``."""
    return AUTO_ITEMS if per_transfer == AUTO else int(per_transfer)


def bundled(per_transfer: int | str) -> bool:
    """Whether workers send bundles (lists of items) under ``items_per_transfer``."""
    return max_items(per_transfer) > 1


#: Plain values :func:`item_bytes` counts as holding no bytes (numbers, None).
_NO_BYTES = PLAIN_VALUES - {str, bytes}


def item_bytes(item: Any, depth: int = 4) -> int:
    """The bytes an item's tensors, arrays, bytes and text hold, in containers up to
    ``depth`` deep (at most 1,024 entries of each): a size that depends on the item only.

    >>> item_bytes({"x": torch.zeros(4, dtype=torch.int64), "text": "abc", "id": 7})
    35
    """
    if isinstance(item, torch.Tensor):
        return item.nbytes
    if isinstance(item, np.ndarray):
        return item.nbytes
    if isinstance(item, bytes | bytearray | str | memoryview):
        return len(item)
    if depth <= 0:
        return 0
    if isinstance(item, dict):
        values: Any = item.values()
    elif isinstance(item, list | tuple):
        values = item if len(item) <= 1024 else item[:1024]
        kinds = set(map(type, values))  # a batch's texts or ids: summed at C speed
        if kinds == {str} or kinds == {bytes}:
            return sum(map(len, values))
        if kinds <= _NO_BYTES:
            return 0
    else:
        return 0
    total = 0
    for index, value in enumerate(values):
        if index >= 1024:
            break
        total += item_bytes(value, depth - 1)
    return total


class TransferRule:
    """Where a bundle closes: after ``items`` items, or (``max_bytes``) once its items hold
    that many bytes (see :func:`item_bytes`)."""

    __slots__ = ("items", "max_bytes")

    def __init__(self, per_transfer: int | str) -> None:
        self.items = max_items(per_transfer)
        self.max_bytes = AUTO_BYTES if per_transfer == AUTO else None

    def full(self, count: int, size: int) -> bool:
        """Whether a bundle of ``count`` items holding ``size`` bytes is closed."""
        return count >= self.items or (self.max_bytes is not None and size >= self.max_bytes)

    def measures(self) -> bool:
        """Whether :meth:`full` needs the items' bytes."""
        return self.max_bytes is not None


class FailedInBundle:
    """The last entry of a bundle whose worker raised after the items before it.

    Holds the worker's exception as :func:`nodes.workers.carry.carry` makes it,
    so unpickling it in the main process gives back the original exception.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return (FailedInBundle, (self.error,))


def bundles(items: Iterator[Any], rule: TransferRule, worker_id: int) -> Iterator[list[Any]]:
    """``items`` in lists that ``rule`` closes (the last one maybe shorter), as a worker
    sends them.

    An exception after some items of a bundle ends it: the bundle so far, then a
    :class:`FailedInBundle`; with no item yet it propagates as it is.
    """
    bundle: list[Any] = []
    size = 0
    measures = rule.measures()
    try:
        for item in items:
            bundle.append(item)
            if measures:
                size += item_bytes(item)
            if rule.full(len(bundle), size):
                yield bundle
                bundle, size = [], 0
    except Exception as error:
        if not bundle:
            raise
        # The worker's position is never taken from here: the main process resumes a
        # bundle from the state before it (see WorkerStreamNode), so the error recurs.
        yield [*bundle, FailedInBundle(carry(error, worker_id))]
        return
    if bundle:
        yield bundle


def check_items_per_transfer(value: Any, num_workers: int) -> int | str:
    """``value`` as a bundle size (``"auto"`` is 1 without workers), or a
    ``ValueError``/``TypeError`` saying what to pass."""
    if value == AUTO and isinstance(value, str):
        return AUTO if num_workers else 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"items_per_transfer must be 'auto' or an int >= 1 (items each DataLoader "
            f"worker sends at once), got {value!r}"
        )
    if value < 1:
        raise ValueError(f"items_per_transfer must be an int >= 1, got {value}")
    if value > 1 and num_workers == 0:
        raise ValueError(
            f"items_per_transfer={value} groups what DataLoader workers send: set "
            "num_workers > 0, or leave it at 1"
        )
    return value
