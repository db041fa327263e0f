"""One consumer's remaining work, found by restoring its graph in conversion mode.

See :mod:`nodes.elastic`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from nodes.base import walk_graph
from nodes.elastic.pieces import Work, item_origins
from nodes.elastic.work import add_work
from nodes.errors import refuse
from nodes.rounds import plans_of_source, round_place, split_round

if TYPE_CHECKING:
    from nodes.base import Node, State


def sources_and_nodes(root: Node[Any]) -> Iterator[Node[Any]]:
    """Every node of ``root``'s graph that takes part, down to the sources (not below them)."""
    yield root
    if root.elastic == "source":
        return
    for node in root.inputs:
        yield from sources_and_nodes(node)


def selections_below(node: Node[Any]) -> bool:
    """Whether a source under ``node`` was dealt partly delivered items (pieces with a
    selection of their outputs: after a resume on another topology). A step that takes
    them (``pack``) then asks each item's origin for its selection while it reads."""
    for part in sources_and_nodes(node):
        if part.elastic == "source":
            if any("outputs" in piece or "from" in piece for piece in _dealt_pieces(part)):
                return True
    return False


def _dealt_pieces(source: Node[Any]) -> Iterator[Any]:
    """The pieces a source was dealt: its plan, and under a ``repeat`` every round's."""
    yield from getattr(source, "_plan", None) or ()
    ctx = getattr(source, "_ctx", None)
    base, round_ = split_round(source.place or "")
    if ctx is not None and round_ is not None:
        for other in ctx.rounds_planned(base):  # the dealt work's rounds, through the Context
            yield from ctx.plan_for(round_place(base, other)) or ()


def dealt_sources(
    root: Node[Any], places: Iterable[str], path: str
) -> tuple[list[tuple[Node[Any], str]], list[str]]:
    """``(source, place)`` for each of ``places`` (a plan's, or a work's) that names work of
    a source of ``root``'s graph (any round of it under a ``repeat``), and the places that
    name none. Refuses (``InvalidStateError`` at ``path``) a round a repeat never reaches."""
    places = list(places)
    in_rounds: set[int] = set()
    for node in sources_and_nodes(root):
        if hasattr(node, "rounds_ahead"):
            node.validate_rounds(places, path)
            in_rounds.update(id(n) for n in sources_and_nodes(node) if n.elastic == "source")
    found, named = [], set()
    for node in walk_graph(root):
        if node.elastic == "source":
            for place in plans_of_source(node.place, places, id(node) in in_rounds):
                found.append((node, place))
                named.add(place)
    return found, [place for place in places if place not in named]


_NO_HOOK = (
    'declares no elastic hook: set the class attribute elastic = "transparent" on a node '
    "that holds no item between two next() calls and whose reset(state) puts its input right "
    "after the last item it returned, or implement in_flight() and last_origin() "
    "(see nodes.Node.elastic)"
)


def check_graph(root: Node[Any]) -> None:
    """Refuse (:class:`ElasticResumeError`) a graph with a step that has no exact answer."""
    for node in sources_and_nodes(root):
        if node.elastic is None:
            raise refuse(node, node.elastic_refusal or _NO_HOOK)


def consumer_work(
    root: Node[Any], state: State | None, rounds_reached: dict[str, int] | None = None
) -> Work:
    """The remaining work of the consumer whose graph is ``root``, at ``state``.

    Resets ``root`` to ``state`` in *conversion* mode (background threads run
    inline, buffers note where their items came from), then asks every
    buffer what it holds and every source what it has not read. Closes the
    graph after. ``rounds_reached``: the furthest round of each source under a
    ``repeat`` that any consumer reached (:func:`nodes.rounds.rounds_reached`
    of every consumer's work; ``{}`` when none is known yet); this consumer's whole
    shares of the rounds after its own are work too
    (:meth:`nodes.steps.repeat.RepeatNode.rounds_ahead`).
    """
    check_graph(root)
    nodes = list(sources_and_nodes(root))
    for node in nodes:
        node.begin_conversion()
    work: Work = {}
    try:
        root.reset(state)
        live = {id(n) for n in live_nodes(root)}
        for node in nodes:
            if node.elastic == "source":
                untouched = node.untouched() if id(node) in live else []
                add_work(work, node.place, node.elastic_kind, untouched)
        # A buffer may hold items of an earlier round of a repeat than its source is in.
        kinds = {split_round(n.place)[0]: n.elastic_kind for n in nodes if n.place is not None}
        for node in nodes:
            if id(node) in live:
                for origin in node.in_flight():
                    for place, piece in item_origins(origin):
                        kind = kinds[split_round(place)[0]]
                        add_work(work, place, kind, [piece], first=True)
        if rounds_reached is not None:  # last: it moves the sources on to later rounds
            for node in nodes:
                if id(node) in live and hasattr(node, "rounds_ahead"):
                    for place, kind, pieces in node.rounds_ahead(rounds_reached):
                        add_work(work, place, kind, pieces)
    finally:
        root.close()
    return work


def live_nodes(root: Node[Any]) -> Iterator[Node[Any]]:
    """The nodes whose work is not done: a concat's finished inputs are left out."""
    yield root
    if root.elastic == "source":
        return
    for node in root.live_inputs():
        yield from live_nodes(node)
