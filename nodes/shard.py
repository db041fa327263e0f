"""Explicit sharding: each consumer keeps every n-th item of a stream that all consumers read."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

from nodes.base import UPSTREAM, Context, Node, NotReset, State
from nodes.state_checks import at, expect_int, expect_keys


class WholeDataContext(Context):
    """A view of a context in which this consumer is the only one.

    Steps upstream of an explicit shard are built with it, so sources read all
    of their data instead of dealing it out, and every random stream that would
    differ per consumer is the same for all of them (so they all read one
    identical stream, which the shard then splits). Epoch and seed still come
    from the parent.
    """

    def __init__(self, parent: Context) -> None:
        self._parent = parent
        self.rank, self.world_size, self.worker_id, self.num_workers = 0, 1, 0, 1

    epoch = property(lambda self: self._parent.epoch)
    seed = property(lambda self: self._parent.seed)
    stats = property(lambda self: self._parent.stats)
    listings = property(lambda self: self._parent.listings)

    def random_key(self, *parts: int, seed: int | None = None) -> list[int]:
        return self._parent.random_key(*parts, seed=seed)


class ShardNode(Node):
    """Keeps items ``c, c + C, c + 2C, ...`` of its upstream for consumer ``c`` of ``C``.

    Every consumer reads the whole upstream and drops the items that belong to
    the others, so this costs ``C`` times the reading of a source that shards
    itself; it is for sources that cannot (a plain iterable) or for choosing
    where the split happens.

    State: upstream's state after the last kept item plus how many items to
    skip before the next kept one (``c`` at the start, ``C - 1`` after).
    """

    kind = "shard"

    def __init__(self, upstream: Node, ctx: Context) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._ctx = ctx
        self._it: Iterator[Any] = NotReset(self)
        self._skip = 0

    def reset(self, state: State | None = None) -> None:
        self._up.reset(None if state is None else state[UPSTREAM])
        index, count = self._ctx.consumer_index, self._ctx.num_consumers
        self._skip = index if state is None else int(state["skip"])
        # islice consumes the skipped items only when asked for the next kept one, so
        # upstream's position is always right after the item returned last.
        self._it = islice(iter(self._up), self._skip, None, count)
        self._started = False
        self._count = count

    def __next__(self) -> Any:
        item = next(self._it)
        self._started = True
        return item

    def state_dict(self) -> State:
        skip = self._count - 1 if self._started else self._skip
        return {UPSTREAM: self._up.state_dict(), "skip": skip}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {UPSTREAM, "skip"})
        expect_int(state, "skip", path, 0, self._ctx.num_consumers - 1)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))
