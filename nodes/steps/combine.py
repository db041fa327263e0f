"""Combining several upstreams: concat, zip, and weighted mixing."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain
from typing import Any

from nodes.base import UPSTREAM, Node, NotReset, State
from nodes.context import Context
from nodes.errors import InvalidStateError
from nodes.origins import OriginReader, refuse_random_map, source_origin
from nodes.rng import UniformStream
from nodes.state_checks import (
    at,
    expect_bool,
    expect_int,
    expect_keys,
    expect_list,
    expect_none,
)

STOP_RULES = ("all_exhausted", "first_exhausted")
_GONE = object()


def check_mix_args(count: int, weights: Sequence[float], stop: str) -> list[float]:
    """Validate mix arguments; return the weights as floats."""
    weights = [float(w) for w in weights]
    if len(weights) != count:
        raise ValueError(f"mix() got {count} pipes but {len(weights)} weights")
    if any(w < 0 for w in weights) or not any(w > 0 for w in weights):
        raise ValueError(f"mix() weights must be >= 0 with at least one > 0, got {weights}")
    if stop not in STOP_RULES:
        raise ValueError(f"mix() stop must be one of {STOP_RULES}, got {stop!r}")
    return weights


class ConcatNode(Node):
    """Yields every item of the first upstream, then the second, and so on.

    Upstreams are reset lazily, when their turn comes. State: which upstream
    is running and its position, ``{"index": i, UPSTREAM: its state}``.
    """

    kind = "concat"
    elastic = "buffer"

    def __init__(self, upstreams: Sequence[Node]) -> None:
        super().__init__(*upstreams)
        self._it: Iterator[Any] = NotReset(self)

    def reset(self, state: State | None = None) -> None:
        index = 0 if state is None else int(state["index"])
        first_state = None if state is None else state[UPSTREAM]
        self._index = index
        if index < len(self.inputs):
            self.inputs[index].reset(first_state)
        self._it = chain.from_iterable(self._parts(index))

    def _parts(self, index: int) -> Iterator[Iterator[Any]]:
        for i in range(index, len(self.inputs)):
            if i > index:
                self.inputs[i].reset(None)
            self._index = i
            yield iter(self.inputs[i])
        self._index = len(self.inputs)

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        index = self._index
        current = self.inputs[index].state_dict() if index < len(self.inputs) else None
        return {"index": index, UPSTREAM: current}

    def last_origin(self) -> Any:
        return self.inputs[self._index].last_origin()

    def origin_reader(self) -> OriginReader:
        return _combined_origins(self)

    def plain_origins(self) -> bool:
        return all(branch.plain_origins() for branch in self.inputs)

    def live_inputs(self) -> tuple[Node, ...]:
        return self.inputs[self._index :]  # the ones before are done

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {"index", UPSTREAM})
        index = expect_int(state, "index", path, 0, len(self.inputs))
        if index == len(self.inputs):
            expect_none(state, UPSTREAM, path, "every input is done")
        else:
            self.inputs[index].validate_state(state[UPSTREAM], at(path, UPSTREAM))

    @classmethod
    def upstream_states(cls, state: State) -> list[tuple[int, State]]:
        current = state.get(UPSTREAM)
        return [] if current is None else [(int(state["index"]), current)]


class ZipNode(Node):
    """Yields tuples of one item from each upstream; stops with the shortest.

    State: every upstream's position, ``{UPSTREAM: [one per upstream]}``.
    """

    kind = "zip"
    elastic_refusal = (
        "pairs items of its inputs by their position in each consumer's share, which "
        "another dealing would pair differently; dp.mix or dp.concat can be re-dealt"
    )

    def __init__(self, upstreams: Sequence[Node]) -> None:
        super().__init__(*upstreams)
        self._it: Iterator[Any] = NotReset(self)

    def reset(self, state: State | None = None) -> None:
        states = [None] * len(self.inputs) if state is None else state[UPSTREAM]
        for node, node_state in zip(self.inputs, states):
            node.reset(node_state)
        # chain() lets go of the zip once it has ended: a zip asked again would read its
        # first inputs once more before finding the shortest empty, moving their positions.
        self._it = chain(zip(*(iter(node) for node in self.inputs)))

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        return {UPSTREAM: [node.state_dict() for node in self.inputs]}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {UPSTREAM})
        _validate_inputs(self.inputs, state, path)


class MixNode(Node):
    """Draws each item from one upstream chosen at random with the given weights.

    Stop rules:

    * ``"all_exhausted"`` (default): an exhausted upstream leaves the draw and
      the weights of the others are renormalized; the mix ends when all are
      exhausted, so every item of every upstream is yielded exactly once.
    * ``"first_exhausted"``: the mix ends the first time the chosen upstream
      is exhausted, keeping the proportions exact to the end.

    Draws come from a seekable stream keyed by (seed, epoch, node, consumer).
    State: the draw counter, which upstreams are exhausted, and each one's position
    (``UPSTREAM``: one per upstream).
    """

    kind = "mix"
    elastic: str | None = "buffer"  # type: ignore[misc] - but "first_exhausted": see __init__

    def __init__(
        self,
        upstreams: Sequence[Node],
        weights: Sequence[float],
        ctx: Context,
        key: int,
        *,
        seed: int | None = None,
        stop: str = "all_exhausted",
    ) -> None:
        super().__init__(*upstreams)
        self._weights = check_mix_args(len(upstreams), weights, stop)
        #: The weights, for the statistics' realised shares (``Loader.stats()``).
        self.mix_weights = tuple(self._weights)
        self._ctx = ctx
        self._key = key
        self._seed = seed
        self._stop_rule = stop
        self._sources: list[Iterator[Any]] = []
        self._last = 0
        if stop == "first_exhausted":
            self.elastic = None
            self.elastic_refusal = (
                '(stop="first_exhausted") ends when one input runs out on each consumer, '
                'which is another point on another number of consumers; stop="all_exhausted" '
                "can be re-dealt"
            )

    def reset(self, state: State | None = None) -> None:
        key = self._ctx.random_key(self._key, self._ctx.consumer_index, seed=self._seed)
        self._draws = UniformStream(key)
        states = [None] * len(self.inputs) if state is None else state[UPSTREAM]
        for node, node_state in zip(self.inputs, states):
            node.reset(node_state)
        self._sources = [iter(node) for node in self.inputs]
        self._exhausted = [False] * len(self.inputs) if state is None else list(state["exhausted"])
        if state is not None:
            self._draws.seek(int(state["draws"]))
        self._ended = bool(state and state.get("ended"))
        if state is not None:
            self._check_exhausted()
        self._reweigh()

    def _check_exhausted(self) -> None:
        """A resumed input said to be exhausted must be: else its items would be lost."""
        for index, flag in enumerate(self._exhausted):
            if flag and next(self._sources[index], _GONE) is not _GONE:
                raise InvalidStateError(
                    f"exhausted[{index}]", f"false (input {index} has items left)", flag
                )

    def _reweigh(self) -> None:
        self._active = [i for i, w in enumerate(self._weights) if w > 0 and not self._exhausted[i]]
        self._cumulative = list(accumulate(self._weights[i] for i in self._active))

    def __next__(self) -> Any:
        while self._active and not self._ended:
            total = self._cumulative[-1]
            pick = bisect_right(self._cumulative, self._draws.next() * total)
            index = self._active[min(pick, len(self._active) - 1)]
            for item in self._sources[index]:
                self._last = index
                return item
            self._exhausted[index] = True
            if self._stop_rule == "first_exhausted":
                self._ended = True
            self._reweigh()
        raise StopIteration

    def last_origin(self) -> Any:
        return self.inputs[self._last].last_origin()

    def origin_reader(self) -> OriginReader:
        return _combined_origins(self)

    def plain_origins(self) -> bool:
        return all(branch.plain_origins() for branch in self.inputs)

    def state_dict(self) -> State:
        return {
            "draws": self._draws.position(),
            "exhausted": list(self._exhausted),
            "ended": self._ended,
            UPSTREAM: [node.state_dict() for node in self.inputs],
        }

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {"draws", "exhausted", "ended", UPSTREAM})
        expect_int(state, "draws", path)
        flags = expect_list(state, "exhausted", path, len(self.inputs))
        for i, flag in enumerate(flags):
            if not isinstance(flag, bool):
                raise InvalidStateError(at(at(path, "exhausted"), i), "true or false", flag)
        ended = expect_bool(state, "ended", path)
        # "all_exhausted" never ends early; "first_exhausted" ends at the first exhausted input.
        should_end = self._stop_rule == "first_exhausted" and any(flags)
        if ended != should_end:
            what = f"{should_end} (stop={self._stop_rule!r}, exhausted={flags})"
            raise InvalidStateError(at(path, "ended"), what, ended)
        _validate_inputs(self.inputs, state, path)


def _validate_inputs(inputs: Sequence[Node], state: dict[str, Any], path: str) -> None:
    """Check one state per input under ``UPSTREAM`` (zip, mix)."""
    states = expect_list(state, UPSTREAM, path, len(inputs))
    for i, (node, node_state) in enumerate(zip(inputs, states)):
        node.validate_state(node_state, at(at(path, UPSTREAM), i))


def _combined_origins(node: Node) -> OriginReader:
    """A concat's or a mix's origin reader: the origin its current input's source gives,
    where every input answers without notes (see :meth:`nodes.Node.plain_origins`)."""
    if not all(branch.plain_origins() for branch in node.inputs):
        raise refuse_random_map(
            node,
            "has an input with a step that holds items (a buffer shuffle, flat_map, "
            "batch), whose origins it does not pass on",
            f"on each input of the {node.kind} (after its buffers)",
        )
    last = node.last_origin
    return lambda: source_origin(*last())
