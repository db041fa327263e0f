"""Even epochs across ranks: every rank yields the same number of items, so DDP cannot hang."""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

from nodes.base import UPSTREAM, Node, State
from nodes.errors import InvalidStateError
from nodes.state_checks import at, expect_bool, expect_int, expect_keys


class UnevenDataWarning(UserWarning):
    """Items were dropped at the end of an epoch so that every rank yields as many."""


class RankAgreement:
    """How ranks agree on how many more items all of them can yield. Subclasses decide how.

    ``lookahead`` is how many items a rank reads ahead before asking.
    """

    lookahead = 1

    def start_epoch(self, epoch: int) -> None:
        """Called when an epoch starts or resumes."""

    def grant(self, have: int, yielded: int) -> int:
        """How many of the ``have`` items read ahead may be yielded after ``yielded`` items."""
        raise NotImplementedError

    def check_position(self, yielded: int, ended: bool) -> None:
        """Refuse a resumed position this agreement knows to be impossible (nothing here)."""


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

    def grant(self, have: int, yielded: int) -> int:
        # Fewer than asked for means this rank has run out: it must have reached the limit.
        if have < self.lookahead and yielded + have < self.limit:
            raise RuntimeError(
                f"even_batches: rank {self._rank} was counted {self.expected} items for this "
                f"epoch but produced only {yielded + have}; the pipeline must yield the same items "
                "every time it runs (skipped bad records and nondeterministic filters break "
                "the count). Initialize torch.distributed so that ranks agree as they go."
            )
        return min(have, self.limit - yielded)

    def check_position(self, yielded: int, ended: bool) -> None:
        # The counts are known: a rank yields exactly the smallest of them per epoch.
        if yielded > self.limit or (ended and yielded != self.limit):
            expected = f"{self.limit} (every rank's items this epoch)"
            bound = expected if ended else f"at most {expected}"
            raise InvalidStateError("yielded", bound, yielded)


class CollectiveAgreement(RankAgreement):
    """Agreement through one ``all_reduce(MIN)`` of an int over a gloo group.

    Works for any pipeline (filters, skipped records, files of any size). Each
    rank reads up to ``lookahead`` items ahead and the ranks agree on the
    smallest count, so there is one small collective per ``lookahead`` items,
    in the same order on every rank. Measured on 2 local ranks of a 2-core
    machine: 371 us per item when asking for every item, 78 us with 8 ahead
    (the rest is the upstream state recorded per item read ahead). The items
    read ahead wait in memory in the main process.
    """

    lookahead = 8

    def __init__(self, group: Any) -> None:
        import torch

        self._group = group
        self._count = torch.zeros(1, dtype=torch.int64)

    def grant(self, have: int, yielded: int) -> int:
        import torch.distributed as dist

        self._count.fill_(have)
        dist.all_reduce(self._count, op=dist.ReduceOp.MIN, group=self._group)
        return int(self._count.item())


class EvenBatchesNode(Node):
    """Ends the epoch on every rank after as many items as the rank with the fewest has.

    The node reads up to ``agreement.lookahead`` items ahead, asks the
    agreement how many of them every rank can match, and yields those before
    asking again. When the grant is smaller than what it holds, the epoch ends
    there: the items a rank has beyond that are dropped, and an
    :class:`UnevenDataWarning` says on each rank how many.

    State: upstream's state after the last item *returned* (items read ahead
    are read again after a resume), the items yielded, and whether the epoch
    has ended. Ranks checkpoint at the same step, so after a resume they ask
    again in step.
    """

    kind = "even_batches"
    drop_label = "even_batches (Loader)"  # it counts the items it drops in ``dropped``

    def __init__(
        self, upstream: Node, agreement: RankAgreement, *, rank: int, epoch: Callable[[], int]
    ) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._agreement = agreement
        self._rank = rank
        self._epoch = epoch
        self._yielded = 0
        self._final = False
        self._ahead: deque[tuple[Any, State]] = deque()
        self._granted = 0
        self._position: State | None = None

    def reset(self, state: State | None = None) -> None:
        self._up.reset(None if state is None else state[UPSTREAM])
        self._keep_states = self._agreement.lookahead > 1
        # With one item ahead at most, upstream's own position is the one after the last item
        # returned whenever a state can be taken; further ahead, each item keeps its own.
        self._position = self._up.state_dict() if self._keep_states else None
        self._yielded = 0 if state is None else int(state["yielded"])
        self.dropped = 0
        self._final = False if state is None else bool(state["ended"])
        self._ahead.clear()
        self._granted = 0
        self._agreement.start_epoch(self._epoch())
        if state is not None:
            self._agreement.check_position(self._yielded, self._final)

    def __next__(self) -> Any:
        if not self._granted:
            if self._final:
                raise StopIteration
            self._ask()
            if not self._granted:
                raise StopIteration
        self._granted -= 1
        item, self._position = self._ahead.popleft()
        self._yielded += 1
        return item

    def _ask(self) -> None:
        up, ahead, lookahead = self._up, self._ahead, self._agreement.lookahead
        for item in up:
            ahead.append((item, up.state_dict() if self._keep_states else None))
            if len(ahead) == lookahead:
                break
        self._granted = self._agreement.grant(len(ahead), self._yielded)
        if self._granted == lookahead:
            return
        # Fewer than asked for: some rank has run out, so this is the epoch's last grant.
        self._final = True
        dropped = len(ahead) - self._granted + sum(1 for _ in up)
        self.dropped += dropped
        if dropped:
            warnings.warn(
                f"even_batches: rank {self._rank} dropped its last {dropped} item(s) of epoch "
                f"{self._epoch()} so that every rank yields {self._yielded + self._granted}. "
                "Balance the data across ranks (more, evenly sized files) to drop less.",
                UnevenDataWarning,
                stacklevel=4,  # the training loop, through the Loader's iterator
            )

    def state_dict(self) -> State:
        position = self._position if self._keep_states else self._up.state_dict()
        ended = self._final and not self._granted
        return {UPSTREAM: position, "yielded": self._yielded, "ended": ended}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {UPSTREAM, "yielded", "ended"})
        expect_int(state, "yielded", path)
        expect_bool(state, "ended", path)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))
