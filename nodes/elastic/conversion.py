"""One consumer's remaining work, found by restoring its graph in conversion mode.

See :mod:`nodes.elastic`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nodes.elastic.pieces import Work, item_origins
from nodes.elastic.work import add_work
from nodes.errors import refuse

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
            plan = getattr(part, "_plan", None) or ()
            if any("outputs" in piece or "from" in piece for piece in plan):
                return True
    return False


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


def consumer_work(root: Node[Any], state: State | None) -> Work:
    """The remaining work of the consumer whose graph is ``root``, at ``state``.

    Resets ``root`` to ``state`` in *conversion* mode (background threads run
    inline, buffers note where their items came from), then asks every
    buffer what it holds and every source what it has not read. Closes the
    graph after.
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
        for node in nodes:
            if id(node) in live:
                for origin in node.in_flight():
                    for place, piece in item_origins(origin):
                        add_work(work, place, work[place]["kind"], [piece], first=True)
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
