"""Per-item steps: map, filter, flat_map, take, repeat."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any

from nodes import elastic as el
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

    elastic = "transparent"

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
    elastic = "buffer"

    def __init__(self, upstream: Node, fn: Callable[[Any], Iterable[Any]]) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._fn = fn
        self._it: Iterator[Any] = NotReset(self)
        self._noting = False  # converting for another topology: note where parents came from
        self._current: Iterator[Any] | None = None

    def reset(self, state: State | None = None) -> None:
        before = None if state is None else state[UPSTREAM]
        offset = 0 if state is None else int(state["offset"])
        self._up.reset(before)
        self._before = self._up.state_dict() if before is None else before
        self._current = None
        self._current_len = 0
        self._indices: list[int] | None = None  # which of the parent's outputs are kept
        self._selecting = _reads_selections(self._up)
        children = self._children(offset)
        self._it = chain.from_iterable(children)
        if self._noting and offset:
            # Read the parent now, so that its source's position moves past it: the rest of
            # its outputs are then held here (in_flight), not left in the untouched data.
            first = next(children, None)
            self._it = chain.from_iterable(children if first is None else chain([first], children))

    def _children(self, offset: int) -> Iterator[Iterator[Any]]:
        up, fn = self._up, self._fn
        src = iter(up)
        noting, selecting = self._noting, self._selecting
        while True:
            before = self._before if offset else up.state_dict()
            parent = next(src, _END)
            if parent is _END:
                self._before, self._current = before, None
                return
            outputs = list(fn(parent))
            if noting or selecting:
                self._origin = up.last_origin()
            if selecting:  # after a topology change: only the outputs not yet delivered
                self._indices = el.selected(self._origin[1], len(outputs))
                outputs = [outputs[i] for i in self._indices]
            if offset and offset >= len(outputs):  # only a resumed first parent has an offset
                raise InvalidStateError(
                    "offset", f"an offset below {len(outputs)} (the parent's outputs)", offset
                )
            current = positioned_iterator(outputs, offset)
            offset = 0
            self._before, self._current, self._current_len = before, current, len(outputs)
            yield current

    # ----- elastic resume (nodes.elastic) ---------------------------------------------------
    def begin_conversion(self) -> None:
        self._noting = True

    def _original(self, index: int) -> int:
        return index if self._indices is None else self._indices[index]

    def last_origin(self) -> Any:
        _check_synchronous(self, self._up)
        done = list_iterator_position(self._current, self._current_len)
        place, piece = self._origin
        return place, el.select(piece, [self._original(done - 1)])

    def in_flight(self) -> list[Any]:
        """The outputs of the current parent that were not returned yet."""
        if self._current is None:
            return []
        done = list_iterator_position(self._current, self._current_len)
        if done >= self._current_len:
            return []
        _check_synchronous(self, self._up)
        place, piece = self._origin
        rest = [self._original(i) for i in range(done, self._current_len)]
        return [(place, el.select(piece, rest))]

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


def _reads_selections(node: Node) -> bool:
    """Whether the source under ``node`` (through transparent steps) hands out items of
    which only some outputs remain: a share dealt after a topology change."""
    while node.elastic == "transparent" and len(node.inputs) == 1:
        node = node.inputs[0]
    plan = getattr(node, "_plan", None) if node.elastic == "source" else None
    return bool(plan) and any("outputs" in p or "from" in p for p in plan)


def _check_synchronous(flat_map: Node, node: Node) -> None:
    """Refuse selections that would reach the flat_map through a thread or a pool."""
    while node.elastic == "transparent" and len(node.inputs) == 1:
        if node.upstream_in_background:
            raise el.refuse(
                flat_map,
                f"reads through a background step ('{node.kind}'), so a "
                "part of one of its items cannot be handed to another consumer",
            )
        node = node.inputs[0]


class TakeNode(Node):
    """Stops after ``count`` items. State: upstream's and how many were taken."""

    kind = "take"
    elastic_refusal = (
        "stops after a count of items per consumer, which means other items on another "
        "number of consumers"
    )

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
    elastic_refusal = "runs its input several times per epoch, in rounds tied to each consumer"

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
