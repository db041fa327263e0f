"""Explicit sharding: each consumer keeps every n-th item of a stream that all consumers read."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

from nodes import elastic as el
from nodes.base import UPSTREAM, Node, NotReset, State
from nodes.context import Context
from nodes.state_checks import at, expect_int, expect_keys

_END = object()


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

    shard_ctx = property(lambda self: self._parent)
    epoch = property(lambda self: self._parent.epoch)
    seed = property(lambda self: self._parent.seed)
    stats = property(lambda self: self._parent.stats)
    trace = property(lambda self: self._parent.trace)
    listings = property(lambda self: self._parent.listings)
    work = None  # the stream a shard splits is read whole, on any topology, never dispatched

    def random_key(self, *parts: int, seed: int | None = None) -> list[int]:
        return self._parent.random_key(*parts, seed=seed)


class ShardNode(Node):
    """Keeps items ``c, c + C, c + 2C, ...`` of its upstream for consumer ``c`` of ``C``.

    Every consumer reads the whole upstream and drops the items that belong to
    the others, so this costs ``C`` times the reading of a source that shards
    itself; it is for sources that cannot (a plain iterable) or for choosing
    where the split happens.

    State: upstream's state after the last kept item, how many items to skip
    before the next kept one (``c`` at the start, ``C - 1`` after) and how many
    upstream items were read (``"read"``: the stream position, which a resume
    on another topology deals from).
    """

    kind = "shard"
    elastic = "source"
    elastic_kind = el.STREAM

    def __init__(self, upstream: Node, ctx: Context) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._ctx = ctx
        self._it: Iterator[Any] = NotReset(self)
        self._skip = 0
        self._read = 0
        self._kept = 0
        self._plan: list[el.Piece] | None = None
        self._selections: dict[int, el.Piece] = {}
        self._was_reset = False

    def reset(self, state: State | None = None) -> None:
        self._up.reset(None if state is None else state[UPSTREAM])
        index, count = self._ctx.consumer_index, self._ctx.num_consumers
        self._skip = index if state is None else int(state["skip"])
        self._read = 0 if state is None else int(state["read"])
        self._plan = self._ctx.plan_for(self.place)
        self._was_reset = True
        self._selections = {
            p["range"][0]: p for p in self._plan or () if "outputs" in p or "from" in p
        }
        if self._plan is not None:  # a dealt share of the stream's positions, in order
            self._it = self._planned(iter(self._up))
        else:
            # islice consumes the skipped items only when asked for the next kept one, so
            # upstream's position is always right after the item returned last.
            self._it = islice(iter(self._up), self._skip, None, count)
        self._kept = 0
        self._count = count

    def _planned(self, items: Iterator[Any]) -> Iterator[Any]:
        for target in el.stream_targets(self._plan or []):
            if target < self._read:
                continue
            self._skip = target - self._read
            for _ in islice(items, self._skip):
                pass
            item = next(items, _END)
            if item is _END:
                return
            self._read, self._skip = target + 1, 0
            yield item

    def __next__(self) -> Any:
        item = next(self._it)
        self._kept += 1
        return item

    def _position(self) -> tuple[int, int]:
        """``(items to skip before the next kept one, upstream items read)``."""
        if self._plan is not None:
            return 0, self._read  # the targets after it say what to skip
        if not self._kept:
            return self._skip, self._read
        last = self._read + self._skip + (self._kept - 1) * self._count
        return self._count - 1, last + 1

    def state_dict(self) -> State:
        skip, read = self._position()
        return {UPSTREAM: self._up.state_dict(), "skip": skip, "read": read}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {UPSTREAM, "skip", "read"})
        expect_int(state, "read", path)  # checked against the data by the replay
        if self._ctx.plan_for(self.place) is None:
            expect_int(state, "skip", path, 0, self._ctx.num_consumers - 1)
        else:
            expect_int(state, "skip", path, 0, 0)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))

    # ----- elastic resume (nodes.elastic) ---------------------------------------------------
    def validate_plan(self, plan: Any, path: str) -> None:
        el.check_positions(plan, path, None)

    def last_origin(self) -> el.Origin:
        position = self._position()[1] - 1
        piece = el.single(position, self._selections.get(position))
        return self.place, piece  # type: ignore[return-value]

    def untouched(self) -> list[el.Piece]:
        """The stream positions this consumer has not reached (open-ended)."""
        plan = self._ctx.plan_for(self.place)
        skip, read = self._position() if self._was_reset else (self._ctx.consumer_index, 0)
        if plan is not None:
            return _from_position(plan, read)
        return [el.positions(read + skip, None, self._ctx.num_consumers)]


def _from_position(plan: list[el.Piece], read: int) -> list[el.Piece]:
    """The pieces of a stream plan at positions from ``read`` on."""
    out = []
    for piece in plan:
        start, stop, step = piece["range"]
        if stop is not None and stop <= read:
            continue
        if start < read:
            start += -(-(read - start) // step) * step
        if stop is None or start < stop:
            out.append(el.reranged(piece, start, stop, step))
    return out
