"""A recipe built the way one consumer ran it, to label the levels of a saved node state.

Building opens nothing (no file, thread or process). With worker processes,
a rank's main-process graph ends in a placeholder for the workers, and each
worker's graph is built on demand from its saved epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from datapipes.inspect.shapes import children, kind_of, passes_through
from datapipes.inspect.states import saved_setup
from datapipes.pipe import DataPipe
from datapipes.placement import rebuild_on, split_main_steps
from nodes import Context, Node


class _WorkersPlaceholder(DataPipe[Any]):
    """Stands in for the worker processes under a recipe's main-process steps."""

    name = "workers"

    def _build(self, ctx: Context) -> Node[Any]:
        return _PlaceholderNode()


class _PlaceholderNode(Node[Any]):
    """The worker processes, in a main-process graph built for labelling."""


class Level(NamedTuple):
    """One nesting level of a node state, with the recipe's node that took it."""

    depth: int
    key: str  # where it is nested in the level above ("" at the top)
    state: dict[str, Any]
    kind: str | None  # see datapipes.inspect.shapes
    node: Node[Any] | None  # None without a recipe
    steps: str  # the node's steps and those above it whose state is its own


class RecipeGraph:
    """A recipe built for one consumer (or a rank's main process), with each node's steps.

    ``RecipeGraph()`` is the empty graph: levels are told by their keys alone.
    """

    def __init__(
        self,
        pipe: DataPipe[Any] | None = None,
        ctx: Context | None = None,
        workers: Callable[[int, dict[str, Any]], RecipeGraph] | None = None,
    ) -> None:
        self._labels: dict[int, str] = {}
        self._pipes: dict[int, DataPipe[Any]] = {}
        self._ctx = ctx
        self._workers = workers
        self._urls: dict[int, list[str]] = {}
        self.root: Node[Any] | None = None
        if pipe is not None and ctx is not None:
            self.root = pipe.build(ctx)
            self._label(pipe, self.root)

    def _label(self, pipe: DataPipe[Any], node: Node[Any]) -> None:
        self._pipes[id(node)] = pipe  # the nodes stay alive (and their ids unique) under root
        if not node.inputs or len(node.inputs) != len(pipe.inputs):
            # One node for a chain of steps (files().shuffle().read_jsonl(), a global
            # shuffle of a sequence and its maps): label it with all of them.
            self._labels[id(node)] = repr(pipe)
            return
        prefix = "dp." if len(pipe.inputs) > 1 else "."
        self._labels[id(node)] = prefix + pipe.describe_step()
        for upstream_pipe, upstream_node in zip(pipe.inputs, node.inputs):
            self._label(upstream_pipe, upstream_node)

    def worker(self, worker_id: int, dataset: dict[str, Any]) -> RecipeGraph:
        """The graph of worker ``worker_id`` (its dataset state gives the epoch)."""
        return RecipeGraph() if self._workers is None else self._workers(worker_id, dataset)

    def url(self, node: Node[Any] | None, file: Any) -> str | None:
        """The URL of file ``file`` of the listing a reader node reads, if it can be told."""
        pipe = self._pipes.get(id(node))
        files = pipe.inputs[0] if pipe is not None and pipe.inputs else None
        if not isinstance(file, int) or not hasattr(files, "file_set"):
            return None
        try:
            if id(files) not in self._urls:  # listed once per graph
                self._urls[id(files)] = files.file_set(self._ctx).urls  # type: ignore[union-attr]
            return self._urls[id(files)][file]
        except Exception:  # noqa: BLE001 - the URL is a help, not a check
            return None

    def levels(self, state: Any) -> Iterator[Level]:
        """Every level of the node state ``state``, top down.

        Levels of worker processes are not entered (see ``shapes.worker_states``
        and :meth:`worker`).
        """
        return self._levels(state, self.root, "", 0)

    def _levels(self, state: Any, node: Node[Any] | None, key: str, depth: int) -> Iterator[Level]:
        if not isinstance(state, dict):
            return
        kind = kind_of(state)
        if kind == "even_batches":  # the Loader's, above the recipe's root
            yield Level(depth, key, state, kind, None, "even_batches (Loader)")
            yield from self._levels(state.get("upstream"), node, "upstream", depth + 1)
            return
        node, steps = self._taker(node, kind, state)
        yield Level(depth, key, state, kind, node, steps)
        for child_key, child, index in children(state, kind):
            upstream = node.inputs[index] if node is not None and index < len(node.inputs) else None
            yield from self._levels(child, upstream, child_key, depth + 1)

    def _taker(
        self, node: Node[Any] | None, kind: str | None, state: dict[str, Any]
    ) -> tuple[Node[Any] | None, str]:
        """The node at or below ``node`` that took ``state``, and the steps that label it."""
        if node is None or id(node) not in self._labels:
            return None, ""
        above: list[str] = []
        while passes_through(node, kind, state):
            above.insert(0, self._labels.get(id(node), ""))
            node = node.inputs[0]
        if isinstance(node, _PlaceholderNode):
            return node, "".join(above)
        return node, self._labels.get(id(node), type(node).__name__) + "".join(above)


def recipe_graph(pipe: DataPipe[Any], state: dict[str, Any], rank: int, epoch: int) -> RecipeGraph:
    """``rank``'s graph built from ``pipe`` as ``state`` ran it (with workers: its main part)."""
    setup = saved_setup(state)
    where = {"rank": rank, "world_size": setup["world_size"], "seed": setup["seed"]}
    num_workers = setup["num_workers"]
    if not num_workers:
        return RecipeGraph(pipe, Context(epoch=epoch, **where))
    worker_part, main_steps = split_main_steps(pipe)

    def worker(worker_id: int, dataset: dict[str, Any]) -> RecipeGraph:
        epoch = int(dataset.get("epoch") or 0)
        ctx = Context(worker_id=worker_id, num_workers=num_workers, epoch=epoch, **where)
        return RecipeGraph(worker_part, ctx)

    main = rebuild_on(_WorkersPlaceholder(), main_steps)
    return RecipeGraph(main, Context(epoch=epoch, **where), worker)
