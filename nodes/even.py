"""Even epochs across ranks: every rank yields the same number of items, so DDP cannot hang."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from nodes.base import Node, State


class UnevenDataWarning(UserWarning):
    """Items were dropped at the end of an epoch so that every rank yields as many."""


class RankAgreement:
    """How ranks agree that all of them still have an item. Subclasses decide how."""

    def start_epoch(self, epoch: int) -> None:
        """Called when an epoch starts or resumes."""

    def all_have(self, have: bool, yielded: int) -> bool:
        """Whether every rank has item number ``yielded`` (this one: ``have``)."""
        raise NotImplementedError


class CountedAgreement(RankAgreement):
    """Agreement from known per-rank item counts: no communication at all.

    ``counts(epoch)`` returns every rank's number of items in that epoch; each
    rank stops after the smallest. A rank that runs out before its own count
    is an error, since the other ranks would wait for it.
    """

    def __init__(self, counts: Callable[[int], list[int]], rank: int) -> None:
        self._counts = counts
        self._rank = rank
        self.limit = 0
        self.expected = 0

    def start_epoch(self, epoch: int) -> None:
        counts = self._counts(epoch)
        self.limit, self.expected = min(counts), counts[self._rank]

    def all_have(self, have: bool, yielded: int) -> bool:
        if not have and yielded < self.limit:
            raise RuntimeError(
                f"even_batches: rank {self._rank} was counted {self.expected} items for this "
                f"epoch but produced only {yielded}; the pipeline must yield the same items "
                "every time it runs (skipped bad records and nondeterministic filters break "
                "the count). Initialize torch.distributed so that ranks agree as they go."
            )
        return yielded < self.limit


class CollectiveAgreement(RankAgreement):
    """Agreement through one ``all_reduce(MIN)`` of a flag per item, over a gloo group.

    Works for any pipeline (filters, skipped records, files of any size); it
    costs one small collective per item on every rank, in the same order on
    all of them.
    """

    def __init__(self, group: Any) -> None:
        import torch

        self._group = group
        self._flag = torch.zeros(1, dtype=torch.int32)

    def all_have(self, have: bool, yielded: int) -> bool:
        import torch.distributed as dist

        self._flag.fill_(1 if have else 0)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MIN, group=self._group)
        return bool(self._flag.item())


class EvenBatchesNode(Node):
    """Ends the epoch on every rank after as many items as the rank with the fewest has.

    The items a rank has beyond that are dropped; an :class:`UnevenDataWarning`
    says on each rank how many. State: upstream's state, the items yielded and
    whether the epoch has ended.
    """

    def __init__(
        self, upstream: Node, agreement: RankAgreement, *, rank: int, epoch: Callable[[], int]
    ) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._agreement = agreement
        self._rank = rank
        self._epoch = epoch
        self._yielded = 0
        self._ended = False

    def reset(self, state: State | None = None) -> None:
        self._up.reset(None if state is None else state["upstream"])
        self._yielded = 0 if state is None else int(state["yielded"])
        self._ended = False if state is None else bool(state["ended"])
        self._agreement.start_epoch(self._epoch())

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        try:
            item, have = next(self._up), True
        except StopIteration:
            item, have = None, False
        if self._agreement.all_have(have, self._yielded):
            self._yielded += 1
            return item
        self._ended = True
        if have:
            dropped = 1 + sum(1 for _ in self._up)
            warnings.warn(
                f"even_batches: rank {self._rank} dropped its last {dropped} item(s) of epoch "
                f"{self._epoch()} so that every rank yields {self._yielded}. Balance the data "
                "across ranks (more, evenly sized files) to drop less.",
                UnevenDataWarning,
                stacklevel=3,  # the training loop, through the Loader's iterator
            )
        raise StopIteration

    def state_dict(self) -> State:
        return {"upstream": self._up.state_dict(), "yielded": self._yielded, "ended": self._ended}
