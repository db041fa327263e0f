"""A source that reads the units it claims: the node of dynamic dispatch."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Any

from nodes import elastic as el
from nodes.base import Node, NotReset, State
from nodes.dispatch.dispatcher import Dispatcher
from nodes.errors import InvalidStateError
from nodes.state_checks import expect_keys


class DispatchedSourceNode(Node):
    """Reads the units of its source's work that it claims, one after another.

    ``inner`` is a source node (``elastic = "source"``) built with a context whose
    ``plans`` is ``dispatcher``: pointed at a unit, a reset of ``inner`` reads
    that unit, as a source reads its plan after an elastic resume. The first unit
    is claimed at ``reset`` (a flat_map above reads the rest of a partly delivered
    item from it then: see :attr:`_plan`); when a unit runs dry the node claims
    the next one; when none is left the epoch ends here.

    State: ``{"claims": [unit, ...], "inner": the source's state in the last
    unit}``: the units this consumer claimed, in order (all of them but the
    last were read to their end), so a checkpoint names every item delivered.
    The per-item path is the source's own iterator, chained.
    """

    kind = "dispatched source"
    elastic = "source"

    def __init__(self, inner: Node[Any], dispatcher: Dispatcher) -> None:
        super().__init__(inner)
        self._inner = inner
        self._dispatcher = dispatcher
        self.place = inner.place
        self.elastic_kind = inner.elastic_kind
        self._claims: list[int] = []
        self._it: Iterator[Any] = NotReset(self)
        self._was_reset = False

    def reset(self, state: State | None = None) -> None:
        self._was_reset = True
        self._claims = [] if state is None else list(state["claims"])
        self._dispatcher.note_reached(self.place, self._claims)  # the live list: it grows
        first: Iterator[Any] | None = None
        if self._claims:  # inside the last unit claimed
            self._dispatcher.point_at(self.place, self._claims[-1])
            self._inner.reset(state["inner"])  # type: ignore[index]
            first = iter(self._inner)
        else:
            # The first unit is claimed now, not at the first item: a flat_map above reads
            # the rest of a partly delivered item (its leading selections, which units_of
            # keeps in unit 0) from the first unit's plan when it resets (see _plan).
            first = self._next_unit()
        self._it = chain.from_iterable(self._units(first))

    @property
    def _plan(self) -> list[el.Piece] | None:
        """The pieces of the first unit this consumer claimed (a flat_map's leading
        selections: ``nodes.steps.transforms.leading_selections``)."""
        if not self._claims:
            return None
        return self._dispatcher.units(self.place)[self._claims[0]]

    def _next_unit(self) -> Iterator[Any] | None:
        """Claim the next unit and read it, or ``None`` when none is left."""
        unit = self._dispatcher.claim(self.place, len(self._claims))
        if unit is None:
            return None
        self._claims.append(unit)
        self._dispatcher.point_at(self.place, unit)
        self._inner.reset(None)
        return iter(self._inner)

    def _units(self, first: Iterator[Any] | None) -> Iterator[Iterator[Any]]:
        current = first
        while current is not None:
            yield current
            current = self._next_unit()

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        inner = self._inner.state_dict() if self._claims else None
        return {"claims": list(self._claims), "inner": inner}

    @classmethod
    def upstream_states(cls, state: State) -> list[tuple[int, State]]:
        """The source's state in its last unit (``"inner"``), nested as its input's."""
        inner = state.get("inner") if isinstance(state, dict) else None
        return [(0, inner)] if isinstance(inner, dict) else []

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {"claims", "inner"})
        claims = state["claims"]
        count = len(self._dispatcher.units(self.place))
        if not isinstance(claims, list) or not all(
            type(u) is int and 0 <= u < count for u in claims
        ):
            raise InvalidStateError(
                f"{path}.claims", f"a list of unit indices in [0, {count})", claims
            )
        if len(set(claims)) != len(claims):
            raise InvalidStateError(f"{path}.claims", "units claimed once each", claims)
        if claims and state["inner"] is not None:
            self._dispatcher.point_at(self.place, claims[-1])
            self._inner.validate_state(state["inner"], f"{path}.inner")
        elif claims:
            raise InvalidStateError(f"{path}.inner", "the source's state in its last unit", None)

    def dispatch_stats(self) -> dict[str, Any]:
        """For the statistics table: this consumer's units claimed and seconds on the store."""
        d = self._dispatcher
        units, seconds = d.claimed.get(self.place, 0), d.wait_seconds.get(self.place, 0.0)
        return {"units": {str(d.consumer): units}, "store_seconds": seconds}

    # ----- elastic resume: a checkpoint's remaining work ---------------------------------
    def last_origin(self) -> el.Origin:
        return self._inner.last_origin()

    def untouched(self) -> list[el.Piece]:
        """The rest of the unit being read; the units nobody reached are counted apart."""
        self._dispatcher.note_live(self.place)
        if not self._was_reset:
            return []
        return self._inner.untouched() if self._claims else []

    def begin_conversion(self) -> None:
        self._inner.begin_conversion()
