"""A step that runs a node of the user's own: ``pipe.apply_node(MyNode, ...)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from datapipes.pipe import DataPipe
from nodes import Context, Node, ScopedContext
from nodes.base import walk_graph


def takes_context(factory: Callable[..., Any]) -> bool:
    """Whether ``factory`` has a parameter named ``ctx`` (then it gets the node's Context)."""
    try:
        return "ctx" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


class ApplyNode(DataPipe[Any]):
    """``factory(upstream_node, *args, **kwargs)``: a user's node on this pipe's items."""

    name = "apply_node"
    # A custom node's resume is its own: it may re-read its input, so an unordered
    # parallel map before it is refused (see datapipes.placement.check_replay_order).
    replays_input = True
    replay_note = "may re-read them when it resumes (a custom node's resume is its own)"

    def __init__(
        self,
        upstream: DataPipe[Any],
        factory: Callable[..., Node[Any]],
        /,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if not callable(factory):
            raise TypeError(
                f"apply_node() takes a Node class or a function that returns a Node, got "
                f"{type(factory).__name__}"
            )
        if "ctx" in kwargs:
            raise TypeError(
                "apply_node() passes ctx itself when the factory has a ctx parameter; "
                "do not give it as an argument"
            )
        super().__init__(upstream, args=(factory, *args))
        object.__setattr__(self, "kwargs", dict(kwargs))  # any names, "args" included

    def _build(self, ctx: Context) -> Node[Any]:
        upstream = self.inputs[0].build(ctx)
        factory, *args = self.args
        kwargs = dict(self.kwargs)
        if takes_context(factory):
            # Scoped by the step's place, so two such steps draw different random streams.
            kwargs["ctx"] = ScopedContext(ctx, self._key())
        node = factory(upstream, *args, **kwargs)
        name = getattr(factory, "__qualname__", repr(factory))
        if not isinstance(node, Node):
            raise TypeError(
                f"apply_node({name}) built a {type(node).__name__}, not a nodes.Node: subclass "
                "nodes.Node (reset, __next__, state_dict) or return one from the function"
            )
        if not any(found is upstream for found in walk_graph(node)):
            raise TypeError(
                f"apply_node({name}): the node does not list its input. Call "
                "super().__init__(upstream) in its __init__, so that close() and the "
                "statistics reach the steps before it"
            )
        return node
