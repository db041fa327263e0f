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

import random
from collections.abc import Iterable, Iterator
from itertools import chain, count, islice
from operator import itemgetter
from time import perf_counter
from typing import Any

from nodes.adapters.torch import profiler_running
from nodes.base import Node, NotReset, State, walk_graph
from nodes.errors import ErrorPolicy, add_losses
from nodes.observe.trace import (
    LONG_SPAN,
    SPAN_GAP,
    SPAN_PREFIX,
    SPANS_ALL_FIRST,
    ProfilerSpan,
    SpanRecorder,
)

#: After the first ``TIME_ALL_FIRST`` items of a pass, one item in ``SAMPLE_EVERY``
#: (on average) is timed and the others pass through C iterators (counted by
#: ``itertools.count``): measured 0.06 us per item per step, against 0.4 us for
#: timing every item.
SAMPLE_EVERY = 16
#: With a trace but no statistics (``counts=False``): one item in 256 is timed, the cost of
#: a timed item (about 1 us: clocks, a generator resumed) spread over more items.
TRACE_SAMPLE_EVERY = 256
TIME_ALL_FIRST = 256

_END = object()
_first = itemgetter(0)


def _count_of(counter: count) -> int:
    """The next number of an ``itertools.count`` (how many it has given), read in O(1)."""
    return int(repr(counter)[6:-1])


class StatsNode(Node):
    """Wraps a step's node, counting its items and the time spent in its ``next()``.

    Transparent otherwise: its state is the wrapped node's, so a checkpoint
    is the same with statistics on or off. The counters add up over resets
    (the rounds of a ``repeat()``) until :meth:`clear` (a new epoch, a
    resume: the Loader calls :func:`clear_stats`). ``key`` identifies the
    step across processes (the same recipe gives the same key in every
    worker); ``step`` is its label in the table.

    ``items`` is exact. ``seconds`` times every one of the first
    ``TIME_ALL_FIRST`` items of a pass and then one in ``sample_every``,
    scaled to all items: an estimate that keeps the per-item cost low.

    Each timed ``next()`` is also a span: shown by a running
    ``torch.profiler``, named ``span`` (default ``datapipes: <step>``), and
    noted by ``recorder`` (a :class:`nodes.observe.trace.SpanRecorder`, while a trace
    runs): all of a pass's first ``SPANS_ALL_FIRST``, then every one of at
    least ``LONG_SPAN`` seconds and one every ``SPAN_GAP`` seconds of the
    others (see :mod:`nodes.observe.trace`). ``counts=False`` (a trace without
    statistics) keeps no counts: an item then passes through C iterators only, for a lower cost.
    """

    kind = "stats"
    elastic = "transparent"

    def __init__(
        self,
        inner: Node,
        key: str,
        step: str,
        *,
        sample_every: int = SAMPLE_EVERY,
        recorder: SpanRecorder | None = None,
        span: str | None = None,
        counts: bool = True,
    ):
        super().__init__(inner)
        self.inner = inner
        self.key = key
        self.step = step
        self.recorder = recorder
        self.span = SPAN_PREFIX + step if span is None else span
        self.counts = counts
        self._sample_every = sample_every
        self._counter = count()
        self._timed_items = 0
        self._timed_seconds = 0.0
        self._earlier = (0, 0, 0.0)  # (items, timed items, timed seconds) of earlier passes
        self._it: Iterator[Any] = NotReset(inner)

    def clear(self) -> None:
        """Start counting afresh (a new epoch or a resume; see :func:`clear_stats`)."""
        # The running pass keeps its counters: offset them so that the totals read zero now.
        self._earlier = (-self._pass_items(), -self._timed_items, -self._timed_seconds)

    def reset(self, state: State | None = None) -> None:
        # A reset may be one of several passes in an epoch (each round of a repeat()):
        # the counts go on; the owner of the graph clears them per epoch.
        items, timed, seconds = self._earlier
        self._earlier = (
            items + self._pass_items(),
            timed + self._timed_items,
            seconds + self._timed_seconds,
        )
        self._counter, self._timed_items, self._timed_seconds = count(), 0, 0.0
        self.inner.reset(state)
        segments = chain.from_iterable(self._segments(iter(self.inner)))
        # zip asks `segments` first, so the counter only advances for an item that came.
        self._it = map(_first, zip(segments, self._counter)) if self.counts else segments

    def _segments(self, items: Iterator[Any]) -> Iterator[Iterable[Any]]:
        """The items, as one-item tuples (timed) and runs of untimed ones (C ``islice``).

        After ``TIME_ALL_FIRST`` items, one item in ``sample_every`` (on
        average) is timed; the untimed runs between them have pseudo-random
        lengths, so a cost that falls on every 2nd, 4th, ... item is sampled
        fairly rather than always or never.
        """
        clock, every, span = perf_counter, self._sample_every, self.span
        record = None if self.recorder is None else self.recorder.record
        rng = random.Random(every)  # its own RNG: the global ones stay untouched
        # 61 run lengths averaging every - 1, cycled: a prime period lines up with no cost
        gaps = [rng.randint(0, 2 * (every - 1)) for _ in range(61)]
        timed, next_span = 0, 0.0
        # Statistics time all of a pass's first items; a trace alone only those it keeps.
        all_first = TIME_ALL_FIRST if self.counts else SPANS_ALL_FIRST
        while True:
            if timed >= all_first and every > 1:
                yield islice(items, gaps[timed % 61])
            if profiler_running():
                item, start, end = _profiled_next(items, span)
            else:
                start = clock()
                item = next(items, _END)
                end = clock()
            if item is _END:
                return
            self._timed_seconds += end - start
            self._timed_items = timed = timed + 1
            if record is not None and (
                timed <= SPANS_ALL_FIRST or end - start >= LONG_SPAN or start >= next_span
            ):
                record(span, start, end)
                next_span = end + SPAN_GAP
            yield (item,)

    def _pass_items(self) -> int:
        return _count_of(self._counter)

    @property
    def items(self) -> int:
        """Items this step yielded since the counters were cleared (exact)."""
        return self._earlier[0] + self._pass_items()

    @property
    def seconds(self) -> float:
        """Time spent in this step's ``next()``, inputs included (estimated from samples)."""
        _, timed, seconds = self._earlier
        timed += self._timed_items
        return (seconds + self._timed_seconds) * self.items / timed if timed else 0.0

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        return self.inner.state_dict()

    @classmethod
    def upstream_states(cls, state: State) -> list[tuple[int, State]]:
        return [(0, state)]  # its state is its input's

    def validate_state(self, state: Any, path: str = "node") -> None:
        self.inner.validate_state(state, path)  # its state is the wrapped node's


def _profiled_next(items: Iterator[Any], name: str) -> tuple[Any, float, float]:
    """The next item (or ``_END``) and its start and end, inside a torch profiler span."""
    span = ProfilerSpan(name)
    try:
        start = perf_counter()
        item = next(items, _END)
        return item, start, perf_counter()
    finally:
        span.end()


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
    waited on its input; ``skipped`` its skips and ``lost`` what they lost
    (see :meth:`nodes.errors.ErrorPolicy.losses`).
    """
    rows = []
    for node in walk_graph(root):
        if not isinstance(node, StatsNode):
            continue
        inputs = [n for n in _inside(node) if isinstance(n, StatsNode)]
        mine = [n for n in _inside(node) if not isinstance(n, StatsNode)]
        if any(n.upstream_in_background for n in mine):
            wait = node.seconds  # its input works elsewhere; here it only waits for it
        else:
            wait = min(node.seconds, sum(n.seconds for n in inputs))
        policies = [n.errors for n in mine if isinstance(n.errors, ErrorPolicy)]
        skipped = sum(policy.count for policy in policies)
        lost: dict[str, int] = {}
        for policy in policies:
            add_losses(lost, policy.losses())
        row = {
            "key": node.key,
            "step": node.step,
            "items": node.items,
            "seconds": node.seconds,
            "self_seconds": node.seconds - wait,
            "wait_seconds": wait,
            "skipped": skipped,
            "lost": lost,
        }
        for inner in mine:  # a source under dynamic dispatch: its claims and store time
            if hasattr(inner, "dispatch_stats"):
                row["dispatch"] = inner.dispatch_stats()
        weights = getattr(node.inner, "mix_weights", None)
        if weights is not None and all(isinstance(n, StatsNode) for n in node.inner.inputs):
            # A mix's inputs are steps with rows of their own: their items are its draws.
            row["mix"] = {"weights": list(weights), "drawn": [n.items for n in node.inner.inputs]}
        rows.append(row)
    rows.reverse()
    return rows


def clear_stats(root: Node | None) -> None:
    """Clear the counters of every :class:`StatsNode` in a built graph (at an epoch's start)."""
    for node in walk_graph(root):
        if isinstance(node, StatsNode):
            node.clear()
