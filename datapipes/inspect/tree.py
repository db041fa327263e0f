"""The node tree of a saved position: every level of a rank's node state, with what took it.

A Loader state records the shape of each rank's built graph
(:func:`datapipes.resume.graph_record.graph_record`): per node its kind, the recipe step
that built it, its inputs, and the graph the worker processes run. The levels
of a node state follow that record, and each node type says where its inputs'
states sit (:meth:`nodes.Node.upstream_states`); nothing is told by a state's keys.

With a recipe (``--recipe``) the graph is built again as the consumer ran it
(building opens nothing, starts nothing): its steps label the levels, it is
compared with the recorded one, and its nodes give a reader's file URL and let
the file positions be checked. With worker processes, a rank's main-process
graph ends in a placeholder for the workers, and each worker's graph is built
on demand from its saved epoch. Under dynamic dispatch each source is wrapped
as the Loader wrapped it, replaying the rank's dispatch record
(:class:`datapipes.resume.claims.ReplayDispatch`), so nothing is claimed.

:mod:`datapipes.inspect.position` writes the levels as lines.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from datapipes.pipe import DataPipe
from datapipes.placement import rebuild_on, split_main_steps, worker_part
from datapipes.resume import JobSetup, JobState
from datapipes.resume.claims import ReplayDispatch, whole_epoch
from datapipes.resume.graph_record import graph_record, upstream_states
from nodes import Context, Node
from nodes.consumer_work import ConsumerWork
from nodes.dispatch import Dispatcher, DispatchSpec

Record = dict[str, Any]


class Level(NamedTuple):
    """One nesting level of a node state, with the node that took it."""

    depth: int
    key: str  # where it is nested in the level above ("" at the top)
    state: dict[str, Any]
    kind: str | None  # the node's kind (None: no record says)
    steps: str  # the node's steps and those above it whose state is its own
    nested: frozenset[str]  # the keys of ``state`` that hold its inputs' states
    entry: Record | None  # the graph record's entry of the node
    saved: Record | None  # with a recipe: the checkpoint's own record of the node here


class RecipeGraph:
    """A graph record to walk node states by; built from a recipe, also its nodes.

    ``RecipeGraph(record)`` walks by a checkpoint's own record (``None``: none,
    so each state shows as far as the :data:`nodes.UPSTREAM` key nests it).
    """

    def __init__(self, record: Record | None = None, *, saved: Record | None = None) -> None:
        self.record = record if isinstance(record, dict) else None
        self._saved = saved if isinstance(saved, dict) else None  # the checkpoint's, to compare
        self._nodes: dict[int, Node[Any]] = {}
        self._pipes: dict[int, DataPipe[Any]] = {}
        self._ctx: Context | None = None
        self._workers: Callable[[int, dict[str, Any], Record | None], RecipeGraph] | None = None
        self._urls: dict[int, list[str]] = {}
        self.root: Node[Any] | None = None

    @classmethod
    def built(
        cls,
        pipe: DataPipe[Any],
        ctx: Context,
        saved: Record | None = None,
        workers: Callable[[int, dict[str, Any], Record | None], RecipeGraph] | None = None,
    ) -> RecipeGraph:
        """``pipe`` built for ``ctx``, to be compared with the ``saved`` record."""
        graph = cls(saved=saved)
        graph.root = pipe.build(ctx)
        graph.record = graph_record(graph.root, pipe, nodes=graph._nodes, pipes=graph._pipes)
        if isinstance(saved, dict) and saved.get("kind") == "even_batches":
            if graph.record.get("kind") != "even_batches":  # the Loader's, above the recipe
                graph.record = {**saved, "inputs": [graph.record]}
        graph._ctx, graph._workers = ctx, workers
        return graph

    def node(self, level: Level) -> Node[Any] | None:
        """The recipe's node that took ``level``'s state (``None`` without a recipe)."""
        return self._nodes.get(id(level.entry))

    def worker(self, worker_id: int, dataset: dict[str, Any], level: Level) -> RecipeGraph:
        """The graph of worker ``worker_id`` under the workers ``level`` (the dataset state
        gives its epoch)."""
        source = level.saved if self._workers is not None else level.entry
        saved = source.get("workers") if isinstance(source, dict) else None
        if self._workers is not None:
            return self._workers(worker_id, dataset, saved)
        return RecipeGraph(saved)

    def url(self, level: Level, file: Any) -> str | None:
        """The URL of file ``file`` of the listing a reader level reads, if it can be told."""
        pipe = self._pipes.get(id(level.entry))
        files = pipe.inputs[0] if pipe is not None and pipe.inputs else None
        if not hasattr(files, "file_set") and hasattr(pipe, "file_set"):
            files = pipe  # the listing itself labels a reader below a dispatched source
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

        Levels of worker processes are not entered (see :meth:`worker`).
        """
        return self._levels(state, self.record, self._saved, "", 0)

    def _levels(
        self, state: Any, entry: Record | None, saved: Record | None, key: str, depth: int
    ) -> Iterator[Level]:
        if not isinstance(state, dict):
            return
        above: list[str] = []
        children = upstream_states(entry, state)
        # A node whose state is its input's has no level of its own: it labels the one below.
        while entry is not None and len(children) == 1 and children[0][1] is state:
            inputs = entry.get("inputs") or []
            if not inputs:
                break
            above.insert(0, entry.get("step", ""))
            entry, saved = inputs[0], _input(saved, 0)
            children = upstream_states(entry, state)
        kind = entry.get("kind") if entry is not None else None
        steps = (entry.get("step", "") if entry is not None else "") + "".join(above)
        names = _child_keys(state, children)
        nested = frozenset(name.split("[")[0] for name in names)
        yield Level(depth, key, state, kind, steps, nested, entry, saved)
        for (index, child), name in zip(children, names):
            below = _input(entry, index), _input(saved, index)
            yield from self._levels(child, *below, name, depth + 1)


def _input(entry: Record | None, index: int) -> Record | None:
    inputs = entry.get("inputs") if isinstance(entry, dict) else None
    return inputs[index] if isinstance(inputs, list) and index < len(inputs) else None


def _child_keys(state: dict[str, Any], children: list[tuple[int, Any]]) -> list[str]:
    """Where each child state sits in ``state``: ``"upstream"`` or ``"upstream[1]"``."""
    found = []
    for _, child in children:
        name = "?"
        for key, value in state.items():
            if value is child:
                name = key
            elif isinstance(value, list):
                name = next((f"{key}[{i}]" for i, v in enumerate(value) if v is child), name)
        found.append(name)
    return found


class _WorkersPlaceholder(DataPipe[Any]):
    """Stands in for the worker processes under a recipe's main-process steps."""

    name = "workers"

    def __repr__(self) -> str:
        return ""  # its worker graphs label what runs there

    def _build(self, ctx: Context) -> Node[Any]:
        return _PlaceholderNode()


class _PlaceholderNode(Node[Any]):
    """The worker processes, in a main-process graph built for labelling."""

    kind = "workers"


def saved_graph(state: JobState, rank: int) -> Record | None:
    """The graph record ``state`` holds for ``rank``; a merged state keeps one for all
    ranks (they built the same shape: :func:`datapipes.merge_states`)."""
    entries = [state.ranks[rank]] if rank in state.ranks else []
    for entry in [*entries, *state.ranks.values()]:
        if entry.graph is not None:
            try:
                return json.loads(entry.graph)
            except (ValueError, RecursionError):
                continue  # a damaged record (the levels nest by UPSTREAM alone without one)
    return None


def recipe_graph(
    pipe: DataPipe[Any], state: JobState, rank: int, saved: Record | None = None
) -> RecipeGraph:
    """``rank``'s graph built from ``pipe`` as ``state`` ran it (with workers: its main part),
    to be compared with ``saved``, the graph record ``state`` holds for the rank."""
    setup, entry = state.setup, state.ranks[rank]
    # Under dynamic dispatch the Loader wrapped each source to read the units it claimed:
    # built the same way (replaying the rank's record), the levels match the saved ones.
    record = entry.dispatch
    replays: list[ReplayDispatch] = []

    def work(worker: int, epoch: int) -> ConsumerWork | None:
        if record is None:
            return None
        consumer = setup.consumers_of(rank)[worker]
        if epoch != record.epoch:  # a record of another epoch: the graph's shape only
            spec = DispatchSpec(None, record.key, epoch, record.consumers, record.unit_items, {})
            return Dispatcher(spec, consumer, recorded={})
        if not replays:  # replayed once for all of the rank's consumers
            whole = None if record.work is not None else whole_epoch(pipe, setup, epoch)
            replays.append(ReplayDispatch([record], whole))
        return replays[0].for_consumer(consumer)

    if not setup.num_workers:
        ctx = setup.context(rank, 0, entry.epoch, work=work(0, entry.epoch))
        return RecipeGraph.built(pipe, ctx, saved)
    worker_part, main_steps = split_main_steps(pipe)

    def worker(worker_id: int, dataset: dict[str, Any], saved: Record | None) -> RecipeGraph:
        epoch = int(dataset.get("epoch") or 0)
        ctx = setup.context(rank, worker_id, epoch, work=work(worker_id, epoch))
        return RecipeGraph.built(worker_part, ctx, saved)

    main = rebuild_on(_WorkersPlaceholder(), main_steps)
    return RecipeGraph.built(main, setup.context(rank, 0, entry.epoch), saved, worker)


def source_labels(pipe: DataPipe[Any], setup: JobSetup, epoch: int) -> dict[str, str]:
    """Each source's place in the recipe, labelled with the recipe's steps that build it."""
    part = worker_part(pipe, setup.num_workers)
    pipes: dict[int, DataPipe[Any]] = {}
    nodes: dict[int, Any] = {}
    labels: dict[str, str] = {}
    try:
        root = part.build(setup.context(0, 0, epoch))
    except Exception:  # noqa: BLE001 - labels are a help: the places stand in for them
        return labels
    try:
        graph_record(root, part, nodes=nodes, pipes=pipes)  # the record names each node's steps
        for key, node in nodes.items():
            place = node.place
            if node.elastic == "source" and place is not None and key in pipes:
                labels.setdefault(place, repr(pipes[key]))
    except Exception:  # noqa: BLE001
        pass
    finally:
        root.close()
    return labels
