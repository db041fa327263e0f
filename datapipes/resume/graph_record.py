"""The shape of a Loader's built graph (recorded in its states) and raw states read for display.

``"graph"`` in a rank's entry (:func:`graph_record`, recorded once per Loader,
``None`` before its graph was first built) says which node took each level of
the node states: per node its ``kind`` (:attr:`nodes.Node.kind`), its ``type``,
the recipe ``step`` that built it and its ``inputs``; a worker-process node
holds the graph its workers run under ``workers``. Resuming never reads it; it
is there so that ``python -m datapipes inspect`` labels every level without the
recipe. Statistics nodes are left out: a checkpoint is the same with statistics
on or off. The readers below take raw (possibly damaged) states as found, for
``inspect``, which shows what it can of anything.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from datapipes.resume.model import JobSetup
from datapipes.resume.schema import rank_path
from nodes import Node
from nodes.dispatch import Dispatcher, DispatchSpec
from nodes.observe.stats import StatsNode
from nodes.steps.even import EvenBatchesNode
from nodes.workers.stream import WorkerStreamNode

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe


def graph_record(
    root: Node[Any],
    pipe: DataPipe[Any] | None = None,
    *,
    nodes: dict[int, Node[Any]] | None = None,
    pipes: dict[int, DataPipe[Any]] | None = None,
) -> dict[str, Any]:
    """The shape of the built graph under ``root`` as plain data (see the module doc).

    ``pipe`` is the recipe ``root`` was built from (its steps label the nodes);
    the Loader's own nodes above it (even batches, its statistics) are told by
    their type. ``nodes`` and ``pipes``, when given, receive for each entry
    (by ``id``) the node it describes and the recipe step that built it.
    Building a worker-process node's graph opens nothing (no process, no file).
    """
    labels: dict[int, str] = {}
    top = root
    while isinstance(top, StatsNode | EvenBatchesNode):  # the Loader's, above the recipe
        top = top.inputs[0]
    step_of: dict[int, DataPipe[Any]] = {}
    if pipe is not None:
        _label(pipe, top, labels, step_of)
    return _entry(root, labels, step_of, nodes, pipes)


def _label(
    pipe: DataPipe[Any], node: Node[Any], labels: dict[int, str], step_of: dict[int, Any]
) -> None:
    while isinstance(node, StatsNode):  # a step's statistics wrap the node that does its work
        node = node.inputs[0]
    step_of[id(node)] = pipe  # the nodes stay alive (and their ids unique) under the root
    if isinstance(node, WorkerStreamNode):
        labels[id(node)] = ""  # its workers' graph says what they run
        return
    if not node.inputs or len(node.inputs) != len(pipe.inputs):
        # One node for a chain of steps (files().shuffle().read_jsonl(), a global
        # shuffle of a sequence and its maps): label it with all of them.
        labels[id(node)] = repr(pipe)
        return
    labels[id(node)] = ("dp." if len(pipe.inputs) > 1 else ".") + pipe.describe_step()
    for upstream_pipe, upstream_node in zip(pipe.inputs, node.inputs):
        _label(upstream_pipe, upstream_node, labels, step_of)


def _entry(
    node: Node[Any],
    labels: dict[int, str],
    step_of: dict[int, Any],
    nodes: dict[int, Node[Any]] | None,
    pipes: dict[int, Any] | None,
) -> dict[str, Any]:
    while isinstance(node, StatsNode):  # statistics: no state of their own, not recorded
        node = node.inputs[0]
    kind = type(node)
    entry: dict[str, Any] = {"kind": node.kind, "type": f"{kind.__module__}.{kind.__qualname__}"}
    step = "even_batches (Loader)" if isinstance(node, EvenBatchesNode) else labels.get(id(node))
    if step:
        entry["step"] = step
    if node.inputs:
        entry["inputs"] = [_entry(n, labels, step_of, nodes, pipes) for n in node.inputs]
    if isinstance(node, WorkerStreamNode):
        entry["workers"] = _worker_record(node)
    if nodes is not None:
        nodes[id(entry)] = node
    if pipes is not None and id(node) in step_of:
        pipes[id(entry)] = step_of[id(node)]
    return entry


def _worker_record(node: WorkerStreamNode) -> dict[str, Any]:
    """The graph a worker-process node's workers run, built here as worker 0 would."""
    dataset = node.dataset
    topology = dataset.topology
    work = None
    if dataset.job.dispatched:  # dynamic dispatch: wrapped as the workers' are
        work = Dispatcher(DispatchSpec(None, "", -1, 1, 1), 0)
    setup = JobSetup(topology.world_size, node.num_workers, dataset.seed)
    ctx = setup.context(topology.rank, 0, work=work, stats=dataset.stats)
    root = dataset.pipe.build(ctx)
    try:
        return graph_record(root, dataset.pipe)
    finally:
        root.close()


class GraphRecord:
    """A Loader's :func:`graph_record`, as JSON text: made once, at the first state taken
    after the graph was built (the shape is the same in every epoch), or loaded."""

    def __init__(self, pipe: DataPipe[Any]) -> None:
        self._pipe = pipe
        self._text: str | None = None
        self._made = False

    def text(self, root: Node[Any] | None) -> str | None:
        """The record of ``root`` (the Loader's built graph), or the one loaded or made before."""
        if root is not None and not self._made:
            self._made = True
            try:
                record = graph_record(root, self._pipe)
            except Exception:  # noqa: BLE001 - a label must never stop a checkpoint
                return self._text
            self._text = json.dumps(record, separators=(",", ":"))
        return self._text

    def load(self, text: str | None) -> None:
        """Take the record of a loaded state (the same recipe) until this Loader makes its own."""
        if not self._made and isinstance(text, str):
            self._text = text


def node_path(rank: int) -> str:
    """Where ``rank``'s node states sit in a Loader state, as validation errors name it.

    >>> node_path(0)
    'ranks["0"].node'
    """
    return f"{rank_path(str(rank))}.node"


def explain_difference(saved_steps: Sequence[str], current_steps: Sequence[str]) -> str:
    """A diff of two recipes' steps, as a refused checkpoint shows it.

    >>> print(explain_difference(["range(4)", "batch(2)"], ["range(4)", "batch(3)"]))
      --- checkpoint recipe
      +++ this recipe
       range(4)
      -batch(2)
      +batch(3)
    """
    lines = []
    diff = difflib.unified_diff(
        list(saved_steps), list(current_steps), "checkpoint recipe", "this recipe", n=1
    )
    for line in diff:
        if not line.startswith("@@"):
            lines.append("  " + line.rstrip("\n"))
    return "\n".join(lines)


def find_loader_states(obj: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every Loader state inside ``obj``, as ``(path, state)``, depth first.

    A Loader state is a dict with ``"version"``, ``"fingerprint"`` and
    ``"ranks"``; the path reads like ``"data"`` or ``"extra.loaders[1]"``
    (``""`` when ``obj`` itself is one).

    >>> find_loader_states({"model": {}, "data": {"version": 4, "fingerprint": "f", "ranks": {}}})
    [('data', {'version': 4, 'fingerprint': 'f', 'ranks': {}})]
    """
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict) and {"version", "fingerprint", "ranks"} <= value.keys():
            found.append((path, value))
        elif isinstance(value, dict):
            for key, child in value.items():
                walk(child, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list | tuple):
            for index, child in enumerate(value):
                walk(child, f"{path}[{index}]")

    walk(obj, "")
    return found


def top_level(obj: Any) -> str:
    """What ``obj`` holds at its top level (said when it holds no Loader state).

    >>> top_level({"model": {}, "step": 3})
    "top-level keys: ['model', 'step']"
    """
    if isinstance(obj, dict):
        return f"top-level keys: {sorted(map(str, obj))}"
    if isinstance(obj, list | tuple):
        return f"the top level is a {type(obj).__name__} of {len(obj)}"
    return f"the top level is a {type(obj).__name__}"


def decode_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a Loader state with every rank's node (and graph) JSON string parsed.

    >>> decode_state({"ranks": {0: {"epoch": 1, "node": '{"position": 4}'}}})["ranks"]
    {'0': {'epoch': 1, 'node': {'position': 4}}}
    """
    ranks = {}
    saved = state.get("ranks")
    for rank, mine in (saved if isinstance(saved, dict) else {}).items():
        if isinstance(mine, dict):
            mine = dict(mine)
            for key in ("node", "graph"):
                if isinstance(mine.get(key), str):
                    try:
                        mine[key] = json.loads(mine[key])
                    except (ValueError, RecursionError):
                        pass  # shown as the string it is (not JSON, or nested too deeply)
        ranks[str(rank)] = mine
    return {**state, "ranks": ranks}


def node_type(name: Any) -> type[Node[Any]]:
    """The node class a graph record names (``"nodes.steps.shuffle.BufferShuffleNode"``), among
    those this process has imported; :class:`nodes.Node` for any other (nothing is imported).
    """
    if isinstance(name, str):
        pending = [Node]
        while pending:
            cls = pending.pop()
            if f"{cls.__module__}.{cls.__qualname__}" == name:
                return cls
            pending.extend(cls.__subclasses__())
    return Node


def upstream_states(entry: dict[str, Any] | None, state: Any) -> list[tuple[int, Any]]:
    """``(input index, that input's state)`` nested in ``state``, taken by the node that
    ``entry`` (a graph record) describes: that node type's :meth:`nodes.Node.upstream_states`.

    >>> concat = {"type": "nodes.steps.combine.ConcatNode"}
    >>> upstream_states(concat, {"index": 1, "upstream": {"a": 1}})
    [(1, {'a': 1})]
    """
    if not isinstance(state, dict):
        return []
    cls = node_type(entry.get("type") if isinstance(entry, dict) else None)
    try:
        return list(cls.upstream_states(state))
    except Exception:  # noqa: BLE001 - a custom node's hook that does not fit: one level
        return []
