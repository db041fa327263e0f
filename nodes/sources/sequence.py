"""The random-access source node: a sequence, with an optional global shuffle."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, islice
from typing import Any

import numpy as np

from nodes import elastic as el
from nodes.base import Node, NotReset, State
from nodes.context import Context
from nodes.elastic import POSITIONS
from nodes.iterators import list_iterator_position, positioned_iterator
from nodes.rng import IndexPermutation
from nodes.sources.getitems import (
    FETCH_CHUNK,
    batched_getter,
    collate_columns,
    column_getter,
    fetch_items,
    rows_are_split_columns,
    rows_of,
)
from nodes.state_checks import expect_int, expect_keys

_SHUFFLE_BLOCK = 4096
#: Indices permuted at a time when fetching with ``__getitems__``: the permutation's
#: per-call cost shows next to a batched fetch (over 65,536 items, 4096 at a time cost
#: 0.7 us per index, 16384 at a time 0.4 us), and the list is made once per block.
_FETCH_KEY_BLOCK = 16384


class SequenceNode(Node):
    """Yields ``seq[i]`` for this consumer's share of ``range(len(seq))``.

    Sharding: the indices are dealt round-robin, consumer ``c`` of ``C`` gets
    positions ``c, c + C, c + 2C, ...``; every index reaches exactly one consumer.

    With ``shuffle_key`` set, the positions go through a fresh pseudo-random
    permutation every epoch (a global shuffle shared by all consumers, keyed by
    seed, epoch and ``shuffle_key``, never materialized). ``fns`` are applied in order to each
    item (maps fused into the source at build time).

    A sequence with a ``__getitems__`` (a torch ``Dataset`` that defines it) is read in
    chunks of ``fetch_size`` items, one ``__getitems__`` call each, when a ``batch`` follows
    (:meth:`fetch_for_batches`; as ``DataLoader`` calls it for batches only: its samples
    may be views that only a batch's collation copies). A Hugging Face ``Dataset`` is read
    in chunks always, its rows copied out of each chunk's columns. The items and their
    order are the same as ``seq[i]`` one by one would give.

    State: ``{"position": k}``, the number of items this consumer has yielded.
    Resume costs O(1) whatever ``k`` is.
    """

    kind = "sequence source"
    elastic = "source"
    elastic_kind = POSITIONS

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
        self._permutation_cache: tuple[list[int], IndexPermutation] | None = None
        self._was_reset = False
        self._getitems = batched_getter(seq)
        self._get_columns = column_getter(seq) if self._getitems else None
        #: Items per ``__getitems__`` call, and whether it is made (set at build time).
        self.fetch_size = FETCH_CHUNK
        self._chunked = self._get_columns is not None and rows_are_split_columns(seq)

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
        if self._chunked:
            self._reset_fetching(c, total)
            return
        if self._shuffle_key is None and self._plan is None:
            # The counter we read the position from is a built-in range iterator.
            counted = self._seq[c::total] if is_range else range(c, len(self._seq), total)
            self._counter = iter(counted)
            self._counter.__setstate__(self._start)
            it = self._counter if is_range else map(self._seq.__getitem__, self._counter)
        else:
            self._permutation = self._epoch_permutation()
            self._block_it = None
            it = chain.from_iterable(self._shuffled_blocks(self._start))
            if not is_range:
                it = map(self._seq.__getitem__, it)
        for fn in self._fns:
            it = map(fn, it)
        self._it = it

    def _epoch_permutation(self) -> IndexPermutation | None:
        """The epoch's global shuffle (``None``: none), kept while its key stays the same:
        dynamic dispatch resets the node once per unit, and a permutation of up to 65,536
        items is drawn whole."""
        if self._shuffle_key is None:
            return None
        key = self._ctx.random_key(*self._shuffle_key, seed=self._shuffle_seed)
        cached = self._permutation_cache
        if cached is None or cached[0] != key:
            cached = self._permutation_cache = (key, IndexPermutation(len(self._seq), key))
        return cached[1]

    @property
    def can_fetch_in_chunks(self) -> bool:
        """Whether the sequence has a ``__getitems__`` to fetch many items in one call."""
        return self._getitems is not None

    def fetch_for_batches(self, size: int) -> None:
        """A batch of ``size`` follows: fetch its items in one ``__getitems__`` call (before
        the first :meth:`reset`; a sequence without ``__getitems__`` ignores it)."""
        if self._getitems is not None:
            self.fetch_size = size
            self._chunked = True

    def _reset_fetching(self, c: int, total: int) -> None:
        """Items through ``__getitems__``: the indices as :meth:`reset` computes them, taken
        ``fetch_size`` at a time from the resume position on."""
        if self._shuffle_key is None and self._plan is None:
            self._keys = iter(range(c, len(self._seq), total))
            self._keys.__setstate__(self._start)  # type: ignore[attr-defined]
        else:
            self._permutation = self._epoch_permutation()
            blocks = self._shuffled_blocks(self._start, _FETCH_KEY_BLOCK)
            self._keys = chain.from_iterable(blocks)
        # position() = keys taken - keys of the current chunk not handed out yet
        self._taken = self._start
        self._chunk_it: Iterator[Any] = iter(())
        self._chunk_len = 0
        it = chain.from_iterable(self._chunks())
        for fn in self._fns:
            it = map(fn, it)
        self._it = it

    def _chunks(self) -> Iterator[Iterator[Any]]:
        while keys := list(islice(self._keys, self.fetch_size)):
            items = self._fetch_rows(keys)
            self._taken += len(keys)
            self._chunk_it, self._chunk_len = iter(items), len(items)
            yield self._chunk_it

    def take_keys(self, count: int) -> list[int]:
        """The indices of the next ``count`` items (fewer at the end of the epoch), counted as
        handed out: the caller fetches them with :meth:`fetch` or :meth:`fetch_columns`
        instead of iterating this node."""
        if list_iterator_position(self._chunk_it, self._chunk_len) != self._chunk_len:
            raise RuntimeError("take_keys: items of the last chunk were not handed out yet")
        keys = list(islice(self._keys, count))
        self._taken += len(keys)
        self._chunk_len = 0
        return keys

    def fetch(self, keys: list[int]) -> list[Any]:
        """The items at ``keys``, in one ``__getitems__`` call, with the fused maps applied."""
        items = self._fetch_rows(keys)
        for fn in self._fns:
            items = list(map(fn, items))
        return items

    def fetch_columns(self, keys: list[int]) -> Any:
        """``default_collate(self.fetch(keys))`` read as columns in one call, for a Hugging
        Face ``Dataset`` without fused maps; ``None`` where that does not apply."""
        if self._get_columns is None or self._fns:
            return None
        batch = collate_columns(self._get_columns(keys), len(keys))
        if batch is None:  # not a dict of columns (a pandas or arrow format): not again
            self._get_columns = None
        return batch

    def _fetch_rows(self, keys: list[int]) -> list[Any]:
        """The items at ``keys`` in one call: a Hugging Face ``Dataset``'s columns split into
        rows that own their tensors (as ``ds[i]`` gives them), else ``__getitems__``'s."""
        if self._get_columns is not None:
            rows = rows_of(self._get_columns(keys), len(keys))
            if rows is not None:
                return rows
            self._get_columns = None  # not a dict of columns (a pandas or arrow format)
        return fetch_items(self._getitems, keys, self._seq)  # type: ignore[arg-type]

    def _shuffled_blocks(self, start: int, size: int = _SHUFFLE_BLOCK) -> Iterator[Iterator[Any]]:
        block = start // size
        offset = start % size
        while block * size < self._length:
            lo = block * size
            hi = min(lo + size, self._length)
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
        if self._chunked:
            return (
                self._taken
                - self._chunk_len
                + list_iterator_position(self._chunk_it, self._chunk_len)
            )
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
