"""Several items per DataLoader transfer ("bundles"), made in a worker, dealt out in the main.

Every item that crosses from a DataLoader worker costs about 0.5 ms of CPU in
the DataLoader's protocol (index queue, pickling, the main process waking up),
whatever its size. With ``Loader(..., items_per_transfer=K)`` a worker sends
lists of up to ``K`` consecutive items of its share instead, and the main
process's :class:`nodes.WorkerStreamNode` hands them out one by one: the
DataLoader's steps count bundles, the node's state adds how many items of the
current bundle were handed out (see ``WorkerStreamNode``).

A bundle is never empty. A worker whose share ends mid-bundle sends the short
bundle; one whose pipeline raises mid-bundle sends the items before the error
followed by a :class:`FailedInBundle` holding it, so the main process hands
those items out and then raises the error, as it would with one item per
transfer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from nodes.worker_errors import carry


class FailedInBundle:
    """The last entry of a bundle whose worker raised after the items before it.

    Holds the worker's exception as :func:`nodes.worker_errors.carry` makes it,
    so unpickling it in the main process gives back the original exception.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return (FailedInBundle, (self.error,))


def bundles(items: Iterator[Any], size: int, worker_id: int) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last one shorter), as a worker sends them.

    An exception after some items of a bundle ends it: the bundle so far, then a
    :class:`FailedInBundle`; with no item yet it propagates as it is.
    """
    bundle: list[Any] = []
    try:
        for item in items:
            bundle.append(item)
            if len(bundle) == size:
                yield bundle
                bundle = []
    except Exception as error:
        if not bundle:
            raise
        # The worker's position is never taken from here: the main process resumes a
        # bundle from the state before it (see WorkerStreamNode), so the error recurs.
        yield [*bundle, FailedInBundle(carry(error, worker_id))]
        return
    if bundle:
        yield bundle


def check_items_per_transfer(value: Any, num_workers: int) -> int:
    """``value`` as a bundle size, or a ``ValueError``/``TypeError`` saying what to pass."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"items_per_transfer must be an int >= 1 (items each DataLoader worker sends "
            f"at once), got {value!r}"
        )
    if value < 1:
        raise ValueError(f"items_per_transfer must be an int >= 1, got {value}")
    if value > 1 and num_workers == 0:
        raise ValueError(
            f"items_per_transfer={value} groups what DataLoader workers send: set "
            "num_workers > 0, or leave it at 1"
        )
    return value
