"""The random-access source node: a sequence, with an optional global shuffle."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np

from nodes import elastic as el
from nodes.base import (
    Context,
    Node,
    NotReset,
    State,
    list_iterator_position,
    positioned_iterator,
)
from nodes.elastic import POSITIONS
from nodes.rng import IndexPermutation
from nodes.state_checks import expect_int, expect_keys

_SHUFFLE_BLOCK = 4096


class SequenceNode(Node):
    """Yields ``seq[i]`` for this consumer's share of ``range(len(seq))``.

    Sharding: the indices are dealt round-robin, consumer ``c`` of ``C`` gets
    positions ``c, c + C, c + 2C, ...``; every index reaches exactly one consumer.

    With ``shuffle_key`` set, the positions go through a fresh pseudo-random
    permutation every epoch (a global shuffle shared by all consumers, keyed by
    seed, epoch and ``shuffle_key``, never materialized). ``fns`` are applied in order to each
    item (maps fused into the source at build time).

    State: ``{"position": k}``, the number of items this consumer has yielded.
    Resume costs O(1) whatever ``k`` is.
    """

    kind = "sequence source"
    elastic = "source"
    elastic_kind = POSITIONS
    place: str | None = None

    def __init__(
        self,
        seq: Sequence[Any],
        ctx: Context,
        *,
        shuffle_key: list[int] | None = None,
        shuffle_seed: int | None = None,
        fns: Sequence[Callable[[Any], Any]] = (),
    ) -> None:
        super().__init__()
        self._seq = seq
        self._ctx = ctx
        self._shuffle_key = shuffle_key
        self._shuffle_seed = shuffle_seed
        self._fns = tuple(fns)
        self._it: Iterator[Any] = NotReset(self)
        self._start = 0
        self._plan: list[el.Piece] | None = None
        self._was_reset = False

    def _local_length(self) -> int:
        plan = self._ctx.plan_for(self.place)
        if plan is not None:  # a share of an interrupted epoch, dealt after a topology change
            return el.plan_starts(plan)[1]
        n, c, total = len(self._seq), self._ctx.consumer_index, self._ctx.num_consumers
        return max(0, (n - c + total - 1) // total)

    def _positions(self, lo: int, hi: int) -> np.ndarray:
        """Positions in the epoch's permutation of this consumer's items ``lo`` to ``hi``."""
        if self._plan is None:
            c, total = self._ctx.consumer_index, self._ctx.num_consumers
            return c + total * np.arange(lo, hi, dtype=np.int64)
        parts = []
        i = max(0, bisect_right(self._plan_starts, lo) - 1)  # the first piece in [lo, hi)
        while i < len(self._plan) and self._plan_starts[i] < hi:
            piece, first = self._plan[i], self._plan_starts[i]
            length = el.piece_length(piece) or 0
            a, b = max(lo, first), min(hi, first + length)
            if a < b:
                start, _, step = piece["range"]
                parts.append(start + step * np.arange(a - first, b - first, dtype=np.int64))
            i += 1
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def reset(self, state: State | None = None) -> None:
        self._was_reset = True
        self._plan = self._ctx.plan_for(self.place)
        if self._plan is not None:
            self._plan_starts = el.plan_starts(self._plan)[0]
        self._length = self._local_length()
        self._start = min(0 if state is None else int(state["position"]), self._length)
        c, total = self._ctx.consumer_index, self._ctx.num_consumers
        is_range = isinstance(self._seq, range)
        if self._shuffle_key is None and self._plan is None:
            # The counter we read the position from is a built-in range iterator.
            counted = self._seq[c::total] if is_range else range(c, len(self._seq), total)
            self._counter = iter(counted)
            self._counter.__setstate__(self._start)
            it = self._counter if is_range else map(self._seq.__getitem__, self._counter)
        else:
            self._permutation = None
            if self._shuffle_key is not None:
                key = self._ctx.random_key(*self._shuffle_key, seed=self._shuffle_seed)
                self._permutation = IndexPermutation(len(self._seq), key)
            self._block_it = None
            it = chain.from_iterable(self._shuffled_blocks(self._start))
            if not is_range:
                it = map(self._seq.__getitem__, it)
        for fn in self._fns:
            it = map(fn, it)
        self._it = it

    def _shuffled_blocks(self, start: int) -> Iterator[Iterator[Any]]:
        block = start // _SHUFFLE_BLOCK
        offset = start % _SHUFFLE_BLOCK
        while block * _SHUFFLE_BLOCK < self._length:
            lo = block * _SHUFFLE_BLOCK
            hi = min(lo + _SHUFFLE_BLOCK, self._length)
            indices = self._positions(lo, hi)
            if self._permutation is not None:
                indices = self._permutation.apply(indices)
            if isinstance(self._seq, range):
                indices = self._seq.start + indices * self._seq.step
            values = indices.tolist()
            it = positioned_iterator(values, offset)
            offset = 0
            self._block_index, self._block_it, self._block_len = block, it, len(values)
            yield it
            block += 1

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def position(self) -> int:
        """How many items this consumer has yielded in the current epoch."""
        if self._shuffle_key is None and self._plan is None:
            return list_iterator_position(self._counter, self._length)
        if self._block_it is None:
            return self._start
        return self._block_index * _SHUFFLE_BLOCK + list_iterator_position(
            self._block_it, self._block_len
        )

    def state_dict(self) -> State:
        return {"position": self.position()}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {"position"})
        expect_int(state, "position", path, 0, self._local_length())

    # ----- elastic resume (nodes.elastic) ---------------------------------------------------
    def validate_plan(self, plan: Any, path: str) -> None:
        el.check_positions(plan, path, len(self._seq))

    def last_origin(self) -> el.Origin:
        k = self.position() - 1
        if self._plan is not None:
            position, piece = el.position_at(self._plan, self._plan_starts, k)
            return self.place, el.single(position, piece)
        position = self._ctx.consumer_index + self._ctx.num_consumers * k
        return self.place, {"range": [position, position + 1, 1]}  # el.single, inlined: hot

    def untouched(self) -> list[el.Piece]:
        """The positions this consumer has not read yet (all of its share before a reset)."""
        plan = self._ctx.plan_for(self.place)
        k = self.position() if self._was_reset else 0
        if plan is not None:
            return el.rest_of_plan(plan, k)
        c, total = self._ctx.consumer_index, self._ctx.num_consumers
        return [el.positions(c + total * k, len(self._seq), total)]
