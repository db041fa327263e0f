"""The Loader's checkpoint: its version, its envelope, its validation, and reading it back.

A Loader state is plain data (json and ``torch.load(weights_only=True)`` safe)::

    {"version": 5, "fingerprint": "...", "steps": [...], "seed": 0,
     "topology": {"world_size": 2, "num_workers": 4, "even_batches": True},
     "ranks": {"1": {"epoch": 3, "node": "<this rank's node states, as JSON>",
                     "digest": "<16 hex digits of the node JSON's sha256>",
                     "graph": "<the shape of this rank's built graph, as JSON>"}}}

What all ranks share sits at the top; each rank's position sits under its own
key in ``ranks``, with the node states as one JSON string. So the layout is the
same before and after a checkpoint is loaded, and in a
``torch.distributed.checkpoint`` save every rank writes its own position under
its own key (the shared keys are identical on all ranks). States of several
ranks can be merged into one ``ranks`` dict.

``"digest"`` (:func:`node_digest`) guards the node states against damage
after the save: a flipped bit, an edit, a truncated or spliced string. A
position moved to another valid position cannot be told from a real one by
looking at it, so without the digest such damage would resume quietly at the
wrong place; with it the state is refused. (It is a checksum, not a
signature: whoever edits a state on purpose can recompute it, and then the
node states' own checks, ``Node.validate_state``, are what stands.)

``"graph"`` (:func:`graph_record`, recorded once per Loader, ``None`` before
its graph was first built) says which node took each level of the node states:
per node its ``kind`` (:attr:`nodes.Node.kind`), its ``type``, the recipe
``step`` that built it and its ``inputs``; a worker-process node holds the
graph its workers run under ``workers``. Resuming never reads it; it is there
so that ``python -m datapipes inspect`` labels every level without the recipe
(and, for the coming elastic resume, so a state can be read without guessing).
Statistics nodes are left out: a checkpoint is the same with statistics on or off.

This module is the one place that knows that layout: the
:class:`datapipes.Loader` gathers its position and calls :func:`make_state`
and :func:`check_recipe_of` / :func:`check_setup` / :func:`rank_position`;
``python -m datapipes inspect`` reads states back with
:func:`find_loader_states`, :func:`decode_state`, :func:`saved_setup` and
:func:`upstream_states`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from datapipes.checkpoint_schema import check_envelope, node_digest, node_state, rank_path
from nodes import Context, Node
from nodes.dispatch import Dispatcher, DispatchSpec
from nodes.errors import InvalidStateError, StateMismatchError  # noqa: F401 - re-exported
from nodes.even import EvenBatchesNode
from nodes.stats import StatsNode
from nodes.workers import WorkerStreamNode

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe

#: 5: a shard's state records its stream position (``"read"``), and a rank's entry may
#: hold its consumers' plans after a resume on another topology (``"plans"``), or the
#: units they claimed under dynamic dispatch (``"dispatch"``, added within version 5:
#: states without it read as before).
#: 4: every node keeps its input's state under ``nodes.UPSTREAM`` (``"upstream"``; version
#: 3 used ``"up"``, ``"anchor"``, ``"inputs"``, ``"current"``), and random streams derive
#: from the recipe's structure, not its display string, so shuffle orders moved.
#: 3: shuffles of up to 65,536 items draw uniform permutations, unlike version 2's.
STATE_VERSION = 5

#: Why a state of an older version cannot resume exactly, by version.
_WHY_REFUSED = {
    2: "whose shuffles ordered items differently",
    3: (
        "whose node states were laid out differently and whose shuffle orders derived "
        "from the recipe's display string, not its structure"
    ),
    4: "whose shard states did not record the stream position",
}


# ----- writing ----------------------------------------------------------------------------


def topology_record(
    world_size: int, num_workers: int, even_batches: bool, items_per_transfer: int = 1
) -> dict[str, Any]:
    """The ``"topology"`` of a Loader state: what every rank must share to resume it.

    ``items_per_transfer`` (items a DataLoader worker sends at once) is recorded
    only when it is not 1, so states made without it stay as they were.

    >>> topology_record(2, 4, True)
    {'world_size': 2, 'num_workers': 4, 'even_batches': True}
    >>> topology_record(1, 2, False, 8)["items_per_transfer"]
    8
    """
    record = {"world_size": world_size, "num_workers": num_workers, "even_batches": even_batches}
    if items_per_transfer != 1:
        record["items_per_transfer"] = items_per_transfer
    return record


def make_state(
    *,
    fingerprint: str,
    steps: Sequence[str],
    seed: int,
    topology: dict[str, Any],
    rank: int,
    epoch: int,
    node: Any,
    graph: str | None = None,
    plans: str | None = None,
    dispatch: dict[str, Any] | None = None,
    dropped: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Loader state (the layout in the module doc) for ``rank`` at ``epoch``.

    ``node`` is the rank's node state (``None``: at the start of ``epoch``);
    ``graph`` the JSON text of its :func:`graph_record` (``None``: not built yet);
    ``plans`` the JSON text of its consumers' shares of ``epoch`` after a resume on
    another topology (see :mod:`datapipes.elastic`); ``dispatch`` the units its
    consumers claimed under dynamic dispatch (see :mod:`datapipes.dispatch`).
    """
    text = None if node is None else json.dumps(node, separators=(",", ":"))
    entry: dict[str, Any] = {
        "epoch": epoch,
        "node": text,
        "digest": None if text is None else node_digest(text),
        "graph": graph,
    }
    if plans is not None:
        entry["plans"] = {"text": plans, "digest": node_digest(plans)}
    if dispatch is not None:
        entry["dispatch"] = dispatch
    if dropped:  # {"epoch", "counts"}: what was dropped so far, which a resume reports on
        entry["dropped"] = dropped
    return {
        "version": STATE_VERSION,
        "fingerprint": fingerprint,
        "steps": list(steps),
        "seed": seed,
        "topology": topology,
        "ranks": {str(rank): entry},
    }


# ----- the shape of the graph -------------------------------------------------------------


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
    ctx = Context(
        rank=topology.rank,
        world_size=topology.world_size,
        worker_id=0,
        num_workers=node.num_workers,
        seed=dataset.seed,
        stats=dataset.stats,
    )
    if getattr(dataset, "dispatch_spec", None) is not None:  # dynamic dispatch: as the workers
        ctx.dispatch = Dispatcher(DispatchSpec(None, "", -1, 1, 1), 0)
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


# ----- validating -------------------------------------------------------------------------


def check_recipe_of(state: Any, fingerprint: str, steps: Sequence[str]) -> None:
    """Raise :class:`StateMismatchError` unless ``state`` is a Loader state of this version
    taken with the recipe of ``fingerprint`` (the message then shows the steps that differ).
    A malformed state raises :class:`InvalidStateError` (naming the path) first.
    """
    check_shape(state)
    if state["fingerprint"] != fingerprint:
        raise StateMismatchError(
            "this checkpoint was taken with a different recipe:\n"
            + explain_difference(list(state["steps"]), list(steps))
        )


def check_shape(state: Any) -> None:
    """Raise :class:`StateMismatchError` unless ``state`` is a Loader state of this version,
    and :class:`InvalidStateError` (naming the path) unless its envelope is well formed."""
    version = state.get("version") if isinstance(state, dict) else None
    if not isinstance(state, dict) or type(version) is not int or version != STATE_VERSION:
        found = version if isinstance(state, dict) else type(state).__name__
        hint = ""
        if isinstance(found, int) and found < STATE_VERSION:
            why = _WHY_REFUSED.get(found, "whose positions meant something else")
            hint = (
                f": it was saved by an older datapipes, {why}, so it cannot resume "
                "exactly; restart the epoch (set_epoch) or resume with the version that saved it"
            )
        if not hint and isinstance(state, dict) and version is None:
            inner = find_loader_states(state)
            if inner:  # a whole training checkpoint: say which entry is the Loader's
                path = inner[0][0]
                hint = (
                    f": this looks like a whole checkpoint; pass the Loader's own entry, "
                    f"at {path!r} in it (e.g. load_state_dict(checkpoint[{path!r}]))"
                    if path.isidentifier()
                    else f": this looks like a whole checkpoint; pass its entry at {path!r}"
                )
            else:
                hint = f": no Loader state in it ({top_level(state)})"
        raise StateMismatchError(
            f"not a datapipes Loader state of version {STATE_VERSION} (found {found!r})" + hint
        )
    check_envelope(state)  # shapes and types first: what follows compares them


def check_setup(state: dict[str, Any], topology: dict[str, Any], seed: int, rank: int) -> None:
    """Raise :class:`StateMismatchError` unless ``state`` (of this recipe) was taken with
    ``topology`` and ``seed`` and holds ``rank``'s position; the message says what to pass.
    """
    saved = state["topology"]
    if saved != topology or str(rank) not in state["ranks"]:
        saved_ranks = sorted(int(r) for r in state["ranks"])
        raise StateMismatchError(
            f"this checkpoint was taken with topology {saved} and holds rank(s) "
            f"{saved_ranks}, but this Loader is rank {rank} with {topology}; resume "
            "with the same world size, number of workers and even_batches, each rank from "
            "its own state"
        )
    if state["seed"] != seed:
        raise StateMismatchError(
            f"this checkpoint was taken with seed={state['seed']}, this Loader has "
            f"seed={seed}; the resumed order would differ. Pass seed={state['seed']}."
        )


def saved_even_batches(state: dict[str, Any]) -> Any:
    """The ``even_batches`` value recorded in a state's topology, as found (unchecked).

    >>> saved_even_batches({"topology": {"even_batches": True}}), saved_even_batches({})
    (True, None)
    """
    topology = state.get("topology")
    return topology.get("even_batches") if isinstance(topology, dict) else None


def rank_position(state: dict[str, Any], rank: int) -> tuple[int, Any]:
    """``(epoch, node state or None)`` of ``rank`` in a checked ``state``."""
    mine = state["ranks"][str(rank)]
    return mine["epoch"], node_state(mine["node"], f"{rank_path(str(rank))}.node")


def with_idle_ranks(state: dict[str, Any]) -> dict[str, Any]:
    """A (checked) state with the ranks a merged state keeps as ranges (``"idle"``: at an
    epoch's start, nothing read) written out as entries, like every other rank's."""
    idle = state.get("idle")
    if not idle:
        return state
    ranks = dict(state["ranks"])
    for group in idle:
        for first, last in group["ranks"]:
            for rank in range(first, last + 1):
                ranks[str(rank)] = {"epoch": group["epoch"], "node": None, "digest": None}
    out = {key: value for key, value in state.items() if key != "idle"}
    out["ranks"] = {rank: ranks[rank] for rank in sorted(ranks, key=int)}
    return out


def without_idle_ranks(state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`with_idle_ranks`: ranks at an epoch's start with nothing else
    to say (the ranks that finished their share, typically) kept as ranges, so a merged
    state's size does not grow with them."""
    kept: dict[str, Any] = {}
    groups: dict[int, list[int]] = {}
    for rank, entry in state["ranks"].items():
        if (
            set(entry) <= {"epoch", "node", "digest", "graph"}
            and entry["node"] is None
            and (entry.get("graph") is None)
        ):
            groups.setdefault(entry["epoch"], []).append(int(rank))
        else:
            kept[rank] = entry
    if not kept:  # one entry at least, as every state has
        epoch = min(groups)
        first = min(groups[epoch])
        groups[epoch].remove(first)
        kept[str(first)] = {"epoch": epoch, "node": None, "digest": None}
    idle = []
    for epoch in sorted(groups):
        spans: list[list[int]] = []
        for rank in sorted(groups[epoch]):
            if spans and spans[-1][1] == rank - 1:
                spans[-1][1] = rank
            else:
                spans.append([rank, rank])
        if spans:
            idle.append({"epoch": epoch, "ranks": spans})
    out = {key: value for key, value in state.items() if key not in ("ranks", "idle")}
    out["ranks"] = kept
    if idle:
        out["idle"] = idle
    return out


def remaining_record(epoch: int, work: Any, dropped: dict[str, int]) -> dict[str, Any]:
    """A merged state's ``"remaining"``: the interrupted epoch's remaining work (see
    :mod:`datapipes.elastic`) as JSON text, with its digest."""
    text = json.dumps({"epoch": epoch, "work": work, "dropped": dropped}, separators=(",", ":"))
    return {"text": text, "digest": node_digest(text)}


def saved_remaining(state: dict[str, Any], epoch: int) -> tuple[int, Any, dict[str, int]]:
    """``(epoch, work, dropped)`` of a (checked) merged state's ``"remaining"``, refused
    unless it is the work of the epoch its ranks resume (``epoch``)."""
    value = json.loads(state["remaining"]["text"])
    if value["epoch"] != epoch:
        raise InvalidStateError(
            "remaining.text.epoch", f"{epoch} (the epoch the ranks resume)", value["epoch"]
        )
    return value["epoch"], value["work"], value["dropped"]


def entry_drops(entry: dict[str, Any], epoch: int, key: str = "counts") -> dict[str, int]:
    """The drop counts a (checked) rank entry holds for ``epoch`` (``{}``: none): all of
    them (``"counts"``), or those made before a resume on another topology (``"carried"``)."""
    dropped = entry.get("dropped")
    return dict(dropped.get(key, {})) if dropped and dropped["epoch"] == epoch else {}


def was_dispatched(state: dict[str, Any]) -> bool:
    """Whether a (checked) state's epoch was handed out by dynamic dispatch on some rank."""
    return any(entry.get("dispatch") is not None for entry in state["ranks"].values())


def entry_plans(entry: dict[str, Any], epoch: int) -> list[Any] | None:
    """The consumers' plans a (checked) rank entry holds for ``epoch``, or ``None``."""
    plans = entry.get("plans")
    if plans is None:
        return None
    value = json.loads(plans["text"])
    return value["consumers"] if value["epoch"] == epoch else None


def node_path(rank: int) -> str:
    """Where ``rank``'s node states sit in a Loader state, as validation errors name it.

    >>> node_path(0)
    'ranks["0"].node'
    """
    return f"{rank_path(str(rank))}.node"


def rank_graph(state: dict[str, Any], rank: int) -> str | None:
    """The JSON text of ``rank``'s graph record in a checked ``state`` (``None``: none)."""
    graph = state["ranks"][str(rank)].get("graph")
    return graph if isinstance(graph, str) else None


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


# ----- reading back (for ``python -m datapipes inspect``) ---------------------------------


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


def saved_setup(state: dict[str, Any]) -> dict[str, Any]:
    """The ``Loader`` arguments ``state`` was saved with (but the rank).

    >>> saved_setup({"seed": 3, "topology": {"world_size": 2, "num_workers": 1}})
    {'seed': 3, 'world_size': 2, 'num_workers': 1, 'even_batches': False}
    """
    topology = state.get("topology") or {}
    setup = {
        "seed": int(state.get("seed", 0)),
        "world_size": int(topology.get("world_size", 1)),
        "num_workers": int(topology.get("num_workers", 0)),
        "even_batches": bool(topology.get("even_batches", False)),
    }
    if topology.get("items_per_transfer", 1) != 1:  # recorded only when not 1
        setup["items_per_transfer"] = int(topology["items_per_transfer"])
    return setup


def node_type(name: Any) -> type[Node[Any]]:
    """The node class a graph record names (``"nodes.shuffle.BufferShuffleNode"``), among
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

    >>> upstream_states({"type": "nodes.combine.ConcatNode"}, {"index": 1, "upstream": {"a": 1}})
    [(1, {'a': 1})]
    """
    if not isinstance(state, dict):
        return []
    cls = node_type(entry.get("type") if isinstance(entry, dict) else None)
    try:
        return list(cls.upstream_states(state))
    except Exception:  # noqa: BLE001 - a custom node's hook that does not fit: one level
        return []
