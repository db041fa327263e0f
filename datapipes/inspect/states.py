"""Finding the Loader states in a checkpoint, and reading what each was saved with.

A Loader state (``Loader.state_dict()``, layout version 2 or 3) may sit anywhere
in a checkpoint, e.g. under ``"data"`` next to the model; each rank's node
state in it is a JSON string.
"""

from __future__ import annotations

import json
from typing import Any


def find_loader_states(obj: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every Loader state inside ``obj``, as ``(path, state)``, depth first.

    A Loader state is a dict with ``"version"``, ``"fingerprint"`` and
    ``"ranks"``; the path reads like ``"data"`` or ``"extra.loaders[1]"``
    (``""`` when ``obj`` itself is one).

    >>> find_loader_states({"model": {}, "data": {"version": 3, "fingerprint": "f", "ranks": {}}})
    [('data', {'version': 3, 'fingerprint': 'f', 'ranks': {}})]
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
    """A copy of a Loader state with every rank's node JSON string parsed into data.

    >>> decode_state({"ranks": {0: {"epoch": 1, "node": '{"position": 4}'}}})["ranks"]
    {'0': {'epoch': 1, 'node': {'position': 4}}}
    """
    ranks = {}
    for rank, mine in (state.get("ranks") or {}).items():
        if isinstance(mine, dict):
            mine = dict(mine)
            if isinstance(mine.get("node"), str):
                try:
                    mine["node"] = json.loads(mine["node"])
                except ValueError:
                    pass  # shown as the string it is
        ranks[str(rank)] = mine
    return {**state, "ranks": ranks}


def saved_setup(state: dict[str, Any]) -> dict[str, Any]:
    """The ``Loader`` arguments ``state`` was saved with (but the rank).

    >>> saved_setup({"seed": 3, "topology": {"world_size": 2, "num_workers": 1}})
    {'seed': 3, 'world_size': 2, 'num_workers': 1, 'even_batches': False}
    """
    topology = state.get("topology") or {}
    return {
        "seed": int(state.get("seed", 0)),
        "world_size": int(topology.get("world_size", 1)),
        "num_workers": int(topology.get("num_workers", 0)),
        "even_batches": bool(topology.get("even_batches", False)),
    }
