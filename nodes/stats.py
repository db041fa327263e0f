"""Per-step statistics: items, time in the step's own work, time waiting on its input.

With statistics switched on, every step of a built graph is wrapped in a
:class:`StatsNode` that counts the items the step yields and the time its
consumer spent in ``next()`` on it (the step's work *and* its upstream's).
A step's own time is that total minus what its direct inputs' totals are;
the difference is the time it waited on its input. Steps whose input runs on
another thread or in other processes (``prefetch``, the DataLoader workers)
spend their whole time waiting on that input.
"""

from __future__ import annotations

from collections.abc import Iterator
from time import perf_counter
from typing import Any

from nodes.base import Node, NotReset, State, walk_graph
from nodes.errors import ErrorPolicy

#: The keys of one row of statistics (:func:`graph_stats`), all plain data.
ROW_FIELDS = ("key", "step", "items", "seconds", "self_seconds", "wait_seconds", "skipped")


class StatsNode(Node):
    """Wraps a step's node, counting its items and the time spent in its ``next()``.

    Transparent otherwise: its state is the wrapped node's, so a checkpoint
    is the same with statistics on or off. The counters start again at each
    ``reset`` (each epoch, each resume). ``key`` identifies the step across
    processes (the same recipe gives the same key in every worker); ``step``
    is its label in the table.
    """

    def __init__(self, inner: Node, key: str, step: str) -> None:
        super().__init__(inner)
        self.inner = inner
        self.key = key
        self.step = step
        self.items = 0
        self.seconds = 0.0
        self._it: Iterator[Any] = NotReset(inner)

    def reset(self, state: State | None = None) -> None:
        self.inner.reset(state)
        self.items, self.seconds = 0, 0.0
        self._it = _timed(iter(self.inner), self)

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        return self.inner.state_dict()


def _timed(items: Iterator[Any], counters: StatsNode) -> Iterator[Any]:
    clock = perf_counter
    while True:
        start = clock()
        try:
            item = next(items)
        except StopIteration:
            counters.seconds += clock() - start
            return
        counters.seconds += clock() - start
        counters.items += 1
        yield item


def _inside(node: StatsNode) -> Iterator[Node]:
    """The nodes of ``node``'s own step, down to (not into) the next ``StatsNode``s."""
    stack = list(node.inner.inputs)
    yield node.inner
    while stack:
        current = stack.pop()
        yield current
        if not isinstance(current, StatsNode):
            stack.extend(current.inputs)


def graph_stats(root: Node | None) -> list[dict[str, Any]]:
    """One row per step of a built graph (sources first), as plain data.

    ``seconds`` is the time spent in the step's ``next()`` including its
    inputs; ``self_seconds`` the step's own part; ``wait_seconds`` the time it
    waited on its input; ``skipped`` the bad records it skipped.
    """
    rows = []
    for node in walk_graph(root):
        if not isinstance(node, StatsNode):
            continue
        inputs = [n for n in _inside(node) if isinstance(n, StatsNode)]
        mine = [n for n in _inside(node) if not isinstance(n, StatsNode)]
        if any(getattr(n, "upstream_in_background", False) for n in mine):
            wait = node.seconds  # its input works elsewhere; here it only waits for it
        else:
            wait = min(node.seconds, sum(n.seconds for n in inputs))
        skipped = sum(
            n.errors.count for n in mine if isinstance(getattr(n, "errors", None), ErrorPolicy)
        )
        rows.append(
            {
                "key": node.key,
                "step": node.step,
                "items": node.items,
                "seconds": node.seconds,
                "self_seconds": node.seconds - wait,
                "wait_seconds": wait,
                "skipped": skipped,
            }
        )
    rows.reverse()
    return rows
