"""Per-item steps: map, filter, flat_map, take."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any

from nodes import elastic as el
from nodes.base import UPSTREAM, Node, NotReset, State
from nodes.errors import InvalidStateError
from nodes.iterators import list_iterator_position, positioned_iterator
from nodes.origins import Origin, OriginReader
from nodes.state_checks import at, expect_int, expect_keys
from nodes.steps.batch import BatchNode, unbatch_items
from nodes.steps.parallel_map import ParallelMapNode

_END = object()


class StatelessStep(Node):
    """A step with no position of its own, run by a built-in (C) iterator; state is upstream's.

    Subclasses give ``_chain`` (or their own ``reset``) and keep ``self._it`` the chain.
    """

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


class MapNode(StatelessStep):
    """Applies ``fn`` to every item."""

    kind = "map"

    _chain = staticmethod(map)  # type: ignore[assignment]


class FilterNode(StatelessStep):
    """Keeps the items for which the predicate ``fn`` is true."""

    kind = "filter"

    _chain = staticmethod(filter)  # type: ignore[assignment]


class FlatMapNode(Node):
    """Yields every item of ``fn(item)`` for each upstream item.

    State: the upstream position *before* the current parent item and the
    offset inside its outputs. Resume re-reads that one parent and calls ``fn``
    on it again (so ``fn`` must be deterministic), then skips ``offset`` outputs.
    In an epoch resumed on another topology, the first parents may be items of
    which only some outputs remain (another consumer had delivered the
    others): the state then also counts the parents read (``"parents"``).
    """

    kind = "flat_map"
    elastic = "buffer"

    def __init__(self, upstream: Node, fn: Callable[[Any], Iterable[Any]]) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._fn = fn
        self._it: Iterator[Any] = NotReset(self)
        self._noting = False  # converting for another topology: note where parents came from
        self._origin_of: Callable[[], Any] = upstream.last_origin  # what is noted per parent
        self._current: Iterator[Any] | None = None
        self._pending = 0
        self._selections: list[el.Piece] = []

    def reset(self, state: State | None = None) -> None:
        before = None if state is None else state[UPSTREAM]
        offset = 0 if state is None else int(state["offset"])
        self._up.reset(before)
        self._before = self._up.state_dict() if before is None else before
        self._current = None
        self._current_len = 0
        self._pending = offset  # not applied yet: a state taken now keeps it
        self._indices: list[int] | None = None  # which of the parent's outputs are kept
        self._selections = leading_selections(self._up)
        self._parents = 0 if state is None else int(state.get("parents", 0))
        self._parents_before = self._parents
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
        noting, selections = self._noting, self._selections
        while True:
            before = self._before if offset else up.state_dict()
            parent = next(src, _END)
            if parent is _END:
                self._before, self._current, self._pending = before, None, 0
                return
            outputs = list(fn(parent))
            if noting:
                self._origin = self._origin_of()
            if selections:  # after a topology change: the first parents may be partly done
                self._parents_before, self._parents = self._parents, self._parents + 1
                self._indices = None
                if self._parents_before < len(selections):
                    self._indices = el.selected(selections[self._parents_before], len(outputs))
                    outputs = [outputs[i] for i in self._indices]
            if offset and offset >= len(outputs):  # only a resumed first parent has an offset
                raise InvalidStateError(
                    "offset", f"an offset below {len(outputs)} (the parent's outputs)", offset
                )
            current = positioned_iterator(outputs, offset)
            offset = 0
            self._before, self._current, self._current_len = before, current, len(outputs)
            self._pending = 0
            yield current

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        current = self._current
        state: State = {UPSTREAM: self._up.state_dict(), "offset": 0}
        if current is None and self._pending:  # reset mid-item, nothing read since
            state = {UPSTREAM: self._before, "offset": self._pending}
        elif current is not None:
            offset = list_iterator_position(current, self._current_len)
            if offset < self._current_len:
                state = {UPSTREAM: self._before, "offset": offset}
        if self._selections:
            mid_item = state["offset"] > 0
            state["parents"] = self._parents_before if mid_item else self._parents
        return state

    def validate_state(self, state: Any, path: str = "node") -> None:
        # The offset is checked against the parent's outputs when it is read again.
        expect_keys(state, path, {UPSTREAM, "offset"}, optional={"parents"})
        expect_int(state, "offset", path)
        if "parents" in state:
            expect_int(state, "parents", path)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))

    # ----- elastic resume (nodes.elastic) ---------------------------------------------------
    def begin_conversion(self) -> None:
        self._noting = True
        self._origin_of = self._up.last_origin  # pieces of work, whatever track_origins set

    def track_origins(self, origin: Callable[[], Any]) -> None:
        """Note ``origin()`` for every parent, before ``reset``, so that
        :meth:`last_output` answers while the data is read (``random_map`` above asks per
        item). The outputs and the states stay the same; it costs a call per parent."""
        self._noting = True
        self._origin_of = origin

    def last_output(self) -> tuple[Any, int]:
        """(what ``track_origins`` noted for the last output's parent, the output's index
        among the parent's outputs)."""
        done = list_iterator_position(self._current, self._current_len)
        return self._origin, self._original(done - 1)

    def _original(self, index: int) -> int:
        return index if self._indices is None else self._indices[index]

    def _outputs_origin(self, outputs: list[int]) -> list[Any]:
        """Where the given outputs of the current parent came from."""
        if self._origin[0] == el.BATCH:  # a batch: only unbatch knows which item is which
            if self._fn is not unbatch_items:
                raise el.refuse(
                    self,
                    "splits whole batches with a function of its own; use "
                    ".unbatch(), whose outputs are the batch's items",
                )
            items = self._origin[1]
            return [items[i] for i in outputs]
        check_order_kept(self, self._up)
        place, piece = self._origin
        return [(place, el.select(piece, outputs))]

    def last_origin(self) -> Any:
        done = list_iterator_position(self._current, self._current_len)
        return self._outputs_origin([self._original(done - 1)])[0]

    def origin_reader(self) -> OriginReader:
        self.track_origins(self._up.origin_reader())

        def flat_map_origin() -> Origin:
            parent, output = self.last_output()
            return (*parent, output)

        return flat_map_origin

    def in_flight(self) -> list[Any]:
        """The outputs of the current parent that were not returned yet."""
        if self._current is None:
            return []
        done = list_iterator_position(self._current, self._current_len)
        if done >= self._current_len:
            return []
        return self._outputs_origin([self._original(i) for i in range(done, self._current_len)])


def leading_selections(node: Node) -> list[el.Piece]:
    """The partly delivered items a dealt share starts with (their remaining outputs), when
    the source under ``node`` reads one: they reach this flat_map as its first parents."""
    while node.elastic != "source":
        if not _keeps_order(node) or isinstance(node, BatchNode):
            return []  # the selections belong to a flat_map below, or parents are batches
        node = node.inputs[0]
    plan = getattr(node, "_plan", None)  # a source's dealt pieces (a dispatched one's too)
    selections = []
    for piece in plan or ():
        if not el.has_selection(piece):
            break
        selections.append(piece)
    return selections


def check_order_kept(flat_map: Node, node: Node) -> None:
    """Refuse partly delivered items where the steps below the flat_map could reorder them
    (they must reach it first, in the order its source hands them out)."""
    while node.elastic != "source":
        if not _keeps_order(node):
            raise el.refuse(
                flat_map,
                f"was in the middle of an item's outputs, and the step '{node.kind}' "
                "below it could reorder items, so the rest of that item cannot be handed to "
                f"another consumer; put the {flat_map.kind} right after the source and its maps",
            )
        node = node.inputs[0]
    if node.elastic_kind == el.STREAM:
        raise el.refuse(
            flat_map,
            "was in the middle of an item's outputs of a .shard() stream, which "
            "hands its items out in stream order only",
        )


def _keeps_order(node: Node) -> bool:
    """Whether ``node`` hands on its input's items in their order (it may drop some)."""
    if len(node.inputs) != 1 or hasattr(node, "rounds_ahead"):
        # a repeat: a flat_map's partly delivered parents are dealt per round, and counting
        # its parents from the start cannot tell which round's parent is which
        return False
    return (
        node.elastic == "transparent"
        or getattr(node, "keeps_order", False)  # a step that says so (tokenize)
        or (isinstance(node, ParallelMapNode) and bool(getattr(node, "_ordered", False)))
    )


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

    def origin_reader(self) -> OriginReader:
        return self._up.origin_reader()  # one item out per item in, nothing held

    def state_dict(self) -> State:
        return {UPSTREAM: self._up.state_dict(), "taken": self._taken}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {UPSTREAM, "taken"})
        expect_int(state, "taken", path, 0, self._limit)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))
