"""``repeat``: its input several times (or forever) within one epoch, in rounds."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from nodes import elastic as el
from nodes.base import UPSTREAM, Node, NotReset, State
from nodes.context import ScopedContext
from nodes.errors import InvalidStateError
from nodes.rounds import round_place
from nodes.state_checks import at, expect_bool, expect_int, expect_keys


class RepeatNode(Node):
    """Runs its upstream ``times`` times (forever when ``None``) within one epoch.

    Each round sees its own random stream (shuffles differ round to round)
    through a :class:`ScopedContext`. A round that reads its own share and
    yields nothing ends the repetition, so an empty source never spins forever.
    State: the round number and upstream's position in it.

    Elastic: the sources below name their work per round (``"<place>@<round>"``,
    see :mod:`nodes.rounds`), so a checkpoint whose consumers stand in
    different rounds resumes on another topology with every round's items
    once: the rounds the plan holds first, then fresh rounds on the new topology.
    """

    kind = "repeat"
    elastic = "transparent"  # it holds no item; the rounds are named in its sources' places

    def __init__(self, upstream: Node, scope: ScopedContext, times: int | None) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._scope = scope
        self._times = times
        self._src: Iterator[Any] = NotReset(self)
        self._sources: list[Node] = []
        self._bases: list[str] = []
        if any(isinstance(node, RepeatNode) for node in el.sources_and_nodes(upstream)):
            self.elastic = None  # type: ignore[misc]
            self.elastic_refusal = (
                "has another repeat below it: rounds within rounds have no exact answer on "
                "another topology; repeat once, with times = the product"
            )
        else:  # the sources below have their places: the recipe built them first
            below = el.sources_and_nodes(upstream)
            self._sources = [n for n in below if n.elastic == "source" and n.place is not None]
            self._bases = [n.place for n in self._sources]  # type: ignore[misc]
        self._start()  # a repeat not reset yet (a concat's later input) is at its start

    def _start(self) -> None:
        """Go to the first round: the first dealt after an elastic resume, else round 0."""
        # The rounds dealt after an elastic resume (``[]``: none); it goes from one to the
        # next, over rounds no consumer had left work in, then on to fresh rounds.
        self._dealt = sorted({r for base in self._bases for r in self._scope.rounds_planned(base)})
        self._enter(self._dealt[0] if self._dealt else 0)
        self._yielded = False
        self._done = self._times is not None and self._round >= self._times

    def _enter(self, round_: int) -> None:
        """Make ``round_`` the current round: its random stream and its sources' places."""
        self._round = round_
        self._scope.tag = round_
        for node, base in zip(self._sources, self._bases):
            node.place = round_place(base, round_)

    def _planned(self) -> bool:
        """Whether the current round is one of the rounds dealt after an elastic resume (its
        share may be empty without ending the repetition)."""
        return any(self._scope.plan_for(n.place) is not None for n in self._sources)

    def reset(self, state: State | None = None) -> None:
        self._start()
        if state is not None:
            self._enter(int(state["round"]))
            self._yielded = bool(state["yielded"])
            self._done = self._times is not None and self._round >= self._times
        self._up.reset(None if state is None else state[UPSTREAM])
        self._src = iter(self._up)

    def __next__(self) -> Any:
        while not self._done:
            for item in self._src:
                self._yielded = True
                return item
            following = self._next_round()
            last = self._times is not None and following >= self._times
            if last or not (self._yielded or self._planned()):
                self._done = True
                break
            self._enter(following)
            self._yielded = False
            self._up.reset(None)
            self._src = iter(self._up)
        raise StopIteration

    def _next_round(self) -> int:
        """The round after the current one: the next dealt round; after the last of them,
        the end (``times``: the dealt work held every round left) or, forever, a fresh one."""
        later = [r for r in self._dealt if r > self._round]
        if later:
            return later[0]
        if self._dealt and self._times is not None:
            return self._times
        return self._round + 1

    def rounds_ahead(self, reached: dict[str, int]) -> list[tuple[str, str, list[Any]]]:
        """This consumer's whole share of each round after its current one, as
        ``(place, kind, pieces)``: to the last round of ``times``, or (forever) to the
        furthest round another consumer ``reached`` (by base place), past which the
        rounds are fresh ones of the new topology. Used in conversion only (it moves
        the sources)."""
        if self._done or self._ends_empty():
            return []  # it ended, or will at the end of this round
        if self._times is not None:
            # Every round to the last: a consumer that finished the epoch had reached it,
            # and a finished consumer's state (none) cannot say so.
            last = self._times - 1
        else:  # the furthest round reached by another consumer, or dealt to this one
            last = max([reached.get(base, -1) for base in self._bases] + self._dealt, default=-1)
        out = []
        while self._next_round() <= last:
            self._enter(self._next_round())
            self._up.reset(None)
            for node in self._sources:  # those of a concat's later inputs too
                node.reset(None)
            shares = [(n.place, n.elastic_kind, n.untouched()) for n in self._sources]
            out.extend(shares)  # type: ignore[arg-type]
            if self._ends_empty():
                break  # an empty fresh round: this consumer would have stopped here
        return out

    def _ends_empty(self) -> bool:
        """Whether the current round yields nothing and is not a dealt one (then it ends
        the repetition): nothing yielded, nothing left to read."""
        if self._yielded or self._planned():
            return False
        return all(_empty(node.untouched()) for node in self._sources)

    def validate_rounds(self, places: Iterable[str], path: str) -> None:
        """Refuse a plan's round of a source below that this repeat never reaches."""
        if self._times is None:
            return
        for place in places:
            base, round_ = el.split_round(place)
            if base in self._bases and round_ is not None and round_ >= self._times:
                raise InvalidStateError(
                    f"{path}[{place!r}]", f"a round below {self._times} (repeat times)", round_
                )

    def state_dict(self) -> State:
        return {"round": self._round, "yielded": self._yielded, UPSTREAM: self._up.state_dict()}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {"round", "yielded", UPSTREAM})
        last = None if self._times is None else max(self._times - 1, 0)
        expect_int(state, "round", path, 0, last)
        expect_bool(state, "yielded", path)
        self._enter(state["round"])  # the sources check their position in that round's share
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))


def _empty(pieces: list[Any]) -> bool:
    return all(el.piece_length(piece) == 0 for piece in pieces)
