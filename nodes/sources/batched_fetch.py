"""A ``batch`` right after a source that fetches with ``__getitems__``: one call a batch.

The fetching itself is in :mod:`nodes.sources.getitems`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodes.base import Node, State
from nodes.observe.stats import StatsNode
from nodes.sources.sequence import SequenceNode
from nodes.steps.batch import BatchNode
from nodes.steps.collate import default_collate
from nodes.steps.transforms import MapNode


def fetching_source(node: Node) -> SequenceNode | None:
    """The source below ``node`` and the plain maps (or statistics) between them, if it is a
    sequence that fetches with ``__getitems__``: a batch there can set its chunk size."""
    while type(node) in (MapNode, StatsNode):
        node = node.inputs[0]
    if isinstance(node, SequenceNode) and node.can_fetch_in_chunks:
        return node
    return None


class FetchBatchNode(BatchNode):
    """A ``batch`` right after a source that fetches with ``__getitems__``: each batch is
    one ``__getitems__`` call (or, for a Hugging Face ``Dataset`` batched with the default
    collate, one read of its columns, collated without splitting them into rows).

    It yields what :class:`BatchNode` would, and its state is the source's, as there.
    Converting for another topology (elastic resume) goes item by item, as there.
    """

    kind = "batch"

    def __init__(
        self,
        source: SequenceNode,
        size: int,
        *,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = default_collate,
    ) -> None:
        super().__init__(source, size, drop_last=drop_last, collate_fn=collate_fn)
        self._source = source
        self._columns = collate_fn is default_collate
        self._direct = False

    def reset(self, state: State | None = None) -> None:
        super().reset(state)
        self._direct = not self._noting

    def __next__(self) -> Any:
        if not self._direct:
            return super().__next__()
        keys = self._source.take_keys(self._size)
        if not keys or (self._drop_last and len(keys) < self._size):
            self.dropped += len(keys)  # a dropped batch is not even fetched
            raise StopIteration
        if self._columns:
            batch = self._source.fetch_columns(keys)
            if batch is not None:
                return batch
        items = self._source.fetch(keys)
        return items if self._collate is None else self._collate(items)
