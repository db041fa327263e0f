"""Per-item steps: map, filter, flat_map, take, repeat."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any

from nodes.base import (
    UPSTREAM,
    Node,
    NotReset,
    ScopedContext,
    State,
    list_iterator_position,
    positioned_iterator,
)
from nodes.errors import InvalidStateError
from nodes.state_checks import at, expect_bool, expect_int, expect_keys

_END = object()


class _StatelessStep(Node):
    """A step with no position of its own, run by a built-in (C) iterator; state is upstream's."""

    def __init__(self, upstream: Node, fn: Callable[[Any], Any]) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._fn = fn
        self._it: Iterator[Any] = NotReset(self)

    def _chain(self, fn: Callable[[Any], Any], items: Iterator[Any]) -> Iterator[Any]:
        raise NotImplementedError

    def reset(self, state: State | None = None) -> None:
        self._up.reset(state)
        self._it = self._chain(self._fn, iter(self._up))

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        return self._up.state_dict()

    @classmethod
    def upstream_states(cls, state: State) -> list[tuple[int, State]]:
        return [(0, state)]  # its state is its input's

    def validate_state(self, state: Any, path: str = "node") -> None:
        self._up.validate_state(state, path)  # its state is its input's, whatever it holds


class MapNode(_StatelessStep):
    """Applies ``fn`` to every item."""

    kind = "map"

    _chain = staticmethod(map)  # type: ignore[assignment]


class FilterNode(_StatelessStep):
    """Keeps the items for which the predicate ``fn`` is true."""

    kind = "filter"

    _chain = staticmethod(filter)  # type: ignore[assignment]


class FlatMapNode(Node):
    """Yields every item of ``fn(item)`` for each upstream item.

    State: the upstream position *before* the current parent item and the
    offset inside its outputs. Resume re-reads that one parent and calls ``fn``
    on it again (so ``fn`` must be deterministic), then skips ``offset`` outputs.
    """

    kind = "flat_map"

    def __init__(self, upstream: Node, fn: Callable[[Any], Iterable[Any]]) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._fn = fn
        self._it: Iterator[Any] = NotReset(self)

    def reset(self, state: State | None = None) -> None:
        before = None if state is None else state[UPSTREAM]
        offset = 0 if state is None else int(state["offset"])
        self._up.reset(before)
        self._before = self._up.state_dict() if before is None else before
        self._current: Iterator[Any] | None = None
        self._current_len = 0
        self._it = chain.from_iterable(self._children(offset))

    def _children(self, offset: int) -> Iterator[Iterator[Any]]:
        up, fn = self._up, self._fn
        src = iter(up)
        while True:
            before = self._before if offset else up.state_dict()
            parent = next(src, _END)
            if parent is _END:
                self._before, self._current = before, None
                return
            outputs = list(fn(parent))
            if offset and offset >= len(outputs):  # only a resumed first parent has an offset
                raise InvalidStateError(
                    "offset", f"an offset below {len(outputs)} (the parent's outputs)", offset
                )
            current = positioned_iterator(outputs, offset)
            offset = 0
            self._before, self._current, self._current_len = before, current, len(outputs)
            yield current

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        current = self._current
        if current is not None:
            offset = list_iterator_position(current, self._current_len)
            if offset < self._current_len:
                return {UPSTREAM: self._before, "offset": offset}
        return {UPSTREAM: self._up.state_dict(), "offset": 0}

    def validate_state(self, state: Any, path: str = "node") -> None:
        # The offset is checked against the parent's outputs when it is read again.
        expect_keys(state, path, {UPSTREAM, "offset"})
        expect_int(state, "offset", path)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))


class TakeNode(Node):
    """Stops after ``count`` items. State: upstream's and how many were taken."""

    kind = "take"

    def __init__(self, upstream: Node, count: int) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._limit = count
        self._src: Iterator[Any] = NotReset(self)

    def reset(self, state: State | None = None) -> None:
        self._up.reset(None if state is None else state[UPSTREAM])
        self._taken = 0 if state is None else int(state["taken"])
        self._src = iter(self._up)

    def __next__(self) -> Any:
        if self._taken >= self._limit:
            raise StopIteration
        item = next(self._src)
        self._taken += 1
        return item

    def state_dict(self) -> State:
        return {UPSTREAM: self._up.state_dict(), "taken": self._taken}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {UPSTREAM, "taken"})
        expect_int(state, "taken", path, 0, self._limit)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))


class RepeatNode(Node):
    """Runs its upstream ``times`` times (forever when ``None``) within one epoch.

    Each round sees its own random stream (shuffles differ round to round)
    through a :class:`ScopedContext`. A round that yields nothing ends the
    repetition, so an empty source never spins forever.
    State: the round number and upstream's position in it.
    """

    kind = "repeat"

    def __init__(self, upstream: Node, scope: ScopedContext, times: int | None) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._scope = scope
        self._times = times
        self._src: Iterator[Any] = NotReset(self)

    def reset(self, state: State | None = None) -> None:
        self._round = 0 if state is None else int(state["round"])
        self._yielded = False if state is None else bool(state["yielded"])
        self._scope.tag = self._round
        self._done = self._times is not None and self._round >= self._times
        self._up.reset(None if state is None else state[UPSTREAM])
        self._src = iter(self._up)

    def __next__(self) -> Any:
        while not self._done:
            for item in self._src:
                self._yielded = True
                return item
            if not self._yielded or (self._times is not None and self._round + 1 >= self._times):
                self._done = True
                break
            self._round += 1
            self._yielded = False
            self._scope.tag = self._round
            self._up.reset(None)
            self._src = iter(self._up)
        raise StopIteration

    def state_dict(self) -> State:
        return {"round": self._round, "yielded": self._yielded, UPSTREAM: self._up.state_dict()}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {"round", "yielded", UPSTREAM})
        last = None if self._times is None else max(self._times - 1, 0)
        expect_int(state, "round", path, 0, last)
        expect_bool(state, "yielded", path)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))
