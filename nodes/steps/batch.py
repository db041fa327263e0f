"""Grouping items into batches, and splitting batches back into items."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from nodes.base import Node, NotReset, State, walk_graph
from nodes.elastic import BATCH
from nodes.steps.collate import default_collate


class BatchNode(Node):
    """Groups ``size`` consecutive items and collates them.

    A batch is assembled inside one ``__next__`` call, so between calls the
    node holds no partial batch: its state is upstream's. A short final batch
    is yielded, or dropped with ``drop_last=True``.
    """

    kind = "batch"
    elastic = "transparent"

    def __init__(
        self,
        upstream: Node,
        size: int,
        *,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = default_collate,
    ) -> None:
        super().__init__(upstream)
        if size < 1:
            raise ValueError(f"batch size must be at least 1, got {size}")
        self._up = upstream
        self._size = size
        self._drop_last = drop_last
        self._collate = collate_fn
        self._src: Iterator[Any] = NotReset(self)
        #: Items of a short last batch dropped this epoch (``drop_last=True``), reported by
        #: ``Loader.dropped()``: nothing is left out without a count.
        self.dropped = 0
        self.drop_label = f"batch({size}, drop_last=True)"
        self._noting = False  # converting for another topology: note where items came from
        self._noted: list[Any] = []

    def reset(self, state: State | None = None) -> None:
        self._up.reset(state)
        self._src = iter(self._up)
        self.dropped = 0
        if self._noting:
            self._noted = []
            self._src = self._noting_items(self._src)

    def _noting_items(self, items: Iterator[Any]) -> Iterator[Any]:
        for item in items:
            self._noted.append(self._up.last_origin())
            yield item

    def __next__(self) -> Any:
        batch = list(islice(self._src, self._size))
        if not batch or (self._drop_last and len(batch) < self._size):
            self.dropped += len(batch)
            raise StopIteration
        return batch if self._collate is None else self._collate(batch)

    def state_dict(self) -> State:
        return self._up.state_dict()

    def begin_conversion(self) -> None:
        self._noting = True

    def plain_origins(self) -> bool:
        return False  # its last_origin needs the notes of begin_conversion

    def last_origin(self) -> Any:
        """The origins of the last batch's items (batches start where the reset put it)."""
        count = len(self._noted)
        return BATCH, self._noted[(count - 1) // self._size * self._size : count]

    @classmethod
    def upstream_states(cls, state: State) -> list[tuple[int, State]]:
        return [(0, state)]  # its state is its input's

    def validate_state(self, state: Any, path: str = "node") -> None:
        self._up.validate_state(state, path)  # its state is its input's, whatever it holds


def drop_counts(root: Any) -> dict[str, int]:
    """Items dropped at the end of this epoch by each step of a built graph that drops
    (``batch(..., drop_last=True)``, ``even_batches``), keyed by the step."""
    counts: dict[str, int] = {}
    for node in walk_graph(root):
        dropped = node.dropped
        if dropped:
            label = node.drop_label
            counts[label] = counts.get(label, 0) + dropped
    return counts


def unbatch_items(batch: Any) -> list[Any]:
    """Split a batch into its samples: a list, a tensor/array (by rows), or a dict of columns."""
    if isinstance(batch, dict):
        columns = {key: unbatch_items(value) for key, value in batch.items()}
        lengths = {len(column) for column in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"unbatch: the fields of a dict batch differ in length: {lengths}")
        count = lengths.pop() if lengths else 0
        return [{key: column[i] for key, column in columns.items()} for i in range(count)]
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        return list(zip(*(unbatch_items(column) for column in batch)))
    return list(batch)
