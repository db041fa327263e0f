"""Source nodes: random-access sequences (with an optional global shuffle) and iterables."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice
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
from nodes.errors import InvalidStateError
from nodes.rng import IndexPermutation
from nodes.state_checks import expect_dict, expect_int, expect_keys

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


def is_factory(source: Any) -> bool:
    """Whether ``source`` is a zero-argument function that returns the iterable."""
    return callable(source) and not hasattr(source, "__iter__")


def check_restartable(source: Any) -> None:
    """Reject a one-shot iterator: it cannot restart for a new epoch or a resume."""
    if hasattr(source, "__next__") and not hasattr(source, "load_state_dict"):
        raise TypeError(
            f"from_iterable got a one-shot iterator ({type(source).__name__}): it cannot "
            "restart for a new epoch or a resume. Pass a re-iterable object (a list, a "
            "dataset) or a function returning a fresh iterable, e.g. "
            "dp.from_iterable(lambda: my_generator())."
        )


class IterableNode(Node):
    """Yields the items of a re-iterable object, resuming as well as it allows.

    * If the object has ``state_dict()``/``load_state_dict()`` (a torchdata
      ``Stateful``, a Hugging Face ``IterableDataset``, a ``StatefulDataLoader``),
      the state is the object's own state and resume is whatever it provides.
      Its state must be plain data for the checkpoint to be plain.
    * Otherwise resume is a *replay*: the state is the number of items yielded,
      and ``reset(state)`` iterates the object afresh and skips that many
      items. That costs O(position) and needs the object to yield the same
      sequence every time it is iterated.

    ``source`` may also be a zero-argument callable returning the iterable.
    A one-shot iterator (a generator object) cannot restart and is rejected.
    An object with ``set_epoch(epoch)`` (a Hugging Face ``IterableDataset``, a
    sampler) is told the epoch at every reset, before it is iterated.
    """

    kind = "iterable source"
    elastic_refusal = (
        "(from_iterable) has no positions of its own to deal to other consumers; "
        "dp.from_sequence (random access) or dp.files can be re-dealt"
    )

    def __init__(self, source: Iterable[Any] | Callable[[], Iterable[Any]], ctx: Context) -> None:
        super().__init__()
        if ctx.num_consumers > 1:
            raise ValueError(
                f"from_iterable(...) cannot split its items across {ctx.num_consumers} "
                "consumers: every consumer would read every item (the classic IterableDataset "
                "+ num_workers duplication). Add .shard() after it (each consumer keeps every "
                "n-th item), or use a source that shards itself (dp.from_sequence, dp.files)."
            )
        self._is_factory = is_factory(source)
        if not self._is_factory:
            check_restartable(source)
        self._source = source
        self._ctx = ctx
        self._obj: Any = None
        self._initial_state: Any = None
        self._it: Iterator[Any] = NotReset(self)
        self._count = 0

    def _open(self) -> Any:
        """The object to iterate for this pass: the source, or a new one from its factory."""
        obj = self._source() if self._is_factory else self._source
        if self._obj is None:
            self.stateful = hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")
            if self.stateful:
                self._initial_state = obj.state_dict()
        self._obj = obj
        return obj

    def reset(self, state: State | None = None) -> None:
        # A stateful object keeps its own position, so it is opened once; anything else
        # is iterated afresh (a factory called again) and replayed up to the position.
        obj = self._obj if self._obj is not None and self.stateful else self._open()
        set_epoch = getattr(obj, "set_epoch", None)
        if callable(set_epoch):  # an object that reshuffles per epoch (HF, a sampler) learns it
            set_epoch(self._ctx.epoch)
        if self.stateful:
            obj.load_state_dict(self._initial_state if state is None else state["inner"])
            self._it = iter(obj)
            return
        self._count = 0 if state is None else int(state["count"])
        self._it = iter(obj)
        if self._count:
            wanted, self._count = self._count, sum(1 for _ in islice(self._it, self._count))
            if self._count < wanted:  # a position the source never reached: no silent end
                raise InvalidStateError(
                    "count", f"at most {self._count} (the items the source has)", wanted
                )

    def __next__(self) -> Any:
        item = next(self._it)
        self._count += 1
        return item

    def __iter__(self) -> Iterator[Any]:
        return self._it if self.stateful else self

    def state_dict(self) -> State:
        if self.stateful:
            return {"inner": self._obj.state_dict()}
        return {"count": self._count}

    def validate_state(self, state: Any, path: str = "node") -> None:
        # The object's own state ("inner") is opaque; a replay count is ours.
        expect_dict(state, path)
        source = self._source if not self._is_factory else self._obj
        stateful = (
            None
            if source is None
            else hasattr(source, "load_state_dict") and hasattr(source, "state_dict")
        )
        if stateful or (stateful is None and "inner" in state):
            expect_keys(state, path, {"inner"})
            return
        expect_keys(state, path, {"count"})
        expect_int(state, "count", path)
        if source is not None and hasattr(source, "__len__"):
            expect_int(state, "count", path, 0, len(source))
