"""The kinds of node state: which node type took a state, and where it nests its upstream's.

Each node type nests its upstream's state differently (see ``nodes/*.py``);
a state's keys say which type took it, and so where to look for the states
below it.
"""

from __future__ import annotations

from typing import Any

from nodes import (
    BatchNode,
    BufferShuffleNode,
    ConcatNode,
    DecodeNode,
    FileListNode,
    FileReaderNode,
    FilterNode,
    FlatMapNode,
    IterableNode,
    MapNode,
    MixNode,
    Node,
    PrefetchNode,
    RepeatNode,
    SequenceNode,
    ShardNode,
    TakeNode,
    ZipNode,
)

#: ``(kind, keys, exact)``: a state of that kind has these keys (``exact``: only these).
#: Tried in order, the most specific first.
_SHAPES: list[tuple[str, set[str], bool]] = [
    ("reader", {"unit", "cursor", "index", "skipped", "listing"}, False),
    ("file list", {"position", "listing"}, False),
    ("buffer shuffle", {"upstream", "anchor_seq", "seq", "slots", "draws"}, False),
    ("mix", {"draws", "exhausted", "upstream"}, False),
    ("zip", {"upstream"}, True),
    ("concat", {"index", "upstream"}, False),
    ("even_batches", {"upstream", "yielded", "ended"}, False),
    ("parallel map", {"upstream", "skip", "done"}, False),
    ("shard", {"upstream", "skip"}, False),
    ("repeat", {"round", "yielded", "upstream"}, False),
    ("take", {"upstream", "taken"}, False),
    ("flat_map", {"upstream", "offset"}, False),
    ("decode", {"upstream", "skipped"}, False),
    ("workers", {"dataloader"}, False),
    ("workers", {"ended"}, True),
    ("sequence source", {"position"}, True),
    ("iterable source", {"count"}, True),
    ("iterable source", {"inner"}, True),
]

#: The library node type that takes each kind of state, and the prefixes of the saved
#: steps (as in ``state["steps"]``) that build it.
_TAKEN_BY: dict[str, tuple[type, tuple[str, ...]]] = {
    "reader": (FileReaderNode, ("read_",)),
    "file list": (FileListNode, ("files(",)),
    "buffer shuffle": (BufferShuffleNode, ("shuffle(buffer_size",)),
    "mix": (MixNode, ("mix(",)),
    "zip": (ZipNode, ("zip(",)),
    "concat": (ConcatNode, ("concat(",)),
    "shard": (ShardNode, ("shard(",)),
    "repeat": (RepeatNode, ("repeat(",)),
    "take": (TakeNode, ("take(",)),
    "flat_map": (FlatMapNode, ("flat_map(", "unbatch(")),
    "decode": (DecodeNode, ("decode(",)),
    "sequence source": (SequenceNode, ("range(", "from_sequence(")),
    "iterable source": (IterableNode, ("from_iterable(",)),
}
_KIND_OF_TYPE = {node_type: kind for kind, (node_type, _) in _TAKEN_BY.items()}

#: Node types whose state is their upstream's (no level of their own).
_PASS_THROUGH: tuple[type, ...] = (MapNode, FilterNode, BatchNode, PrefetchNode)

_NESTING_KEYS = ("upstream",)


def kind_of(state: Any) -> str | None:
    """The kind of node state ``state`` is, told by its keys (``None``: unknown).

    >>> kind_of({"upstream": {"position": 3}, "taken": 2}), kind_of({"position": 3})
    ('take', 'sequence source')
    """
    if not isinstance(state, dict):
        return None
    keys = set(state)
    for kind, needed, exact in _SHAPES:
        if keys == needed if exact else needed <= keys:
            return kind
    return None


def kind_taken_by(node: Node[Any] | None) -> str | None:
    """The kind of state a library node type takes (``None``: not known here)."""
    return _KIND_OF_TYPE.get(type(node))


def step_prefixes(kind: str | None) -> tuple[str, ...]:
    """How the saved steps that build a node taking ``kind`` states begin."""
    return _TAKEN_BY[kind][1] if kind in _TAKEN_BY else ()


def children(state: dict[str, Any], kind: str | None) -> list[tuple[str, Any, int]]:
    """``(key, child state, input index)`` of the upstream states nested in ``state``.

    >>> children({"draws": 4, "exhausted": [], "upstream": [{"position": 1}]}, "mix")
    [('upstream[0]', {'position': 1}, 0)]
    """
    if kind == "concat":
        current = state.get("upstream")
        return [] if current is None else [("upstream", current, int(state["index"]))]
    if kind in ("zip", "mix"):
        return [(f"upstream[{i}]", child, i) for i, child in enumerate(state.get("upstream", []))]
    if kind == "workers":
        return []
    for key in _NESTING_KEYS:
        if isinstance(state.get(key), dict):
            return [(key, state[key], 0)]
    return []


def passes_through(node: Node[Any], kind: str | None, state: dict[str, Any]) -> bool:
    """Whether ``node``'s state is its upstream's (so it has no level of its own)."""
    if len(node.inputs) != 1:
        return False
    if isinstance(node, _PASS_THROUGH):
        return True
    if type(node) in _KIND_OF_TYPE:
        return False
    # A node type this module does not know: its state is its upstream's unless it nests
    # one under a key of its own.
    return not children(state, kind)


def worker_states(state: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """``(worker id, dataset state)`` of each worker in a workers state, by worker id."""
    snapshot = (state.get("dataloader") or {}).get("_snapshot") or {}
    found = []
    for name, worker in (snapshot.get("_worker_snapshots") or {}).items():
        worker = worker or {}
        try:
            worker_id = int(worker.get("worker_id", str(name).rsplit("_", 1)[-1]))
        except ValueError:
            continue
        found.append((worker_id, worker.get("dataset_state") or {}))
    return sorted(found, key=lambda pair: pair[0])
