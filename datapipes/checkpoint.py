"""The Loader's checkpoint: its version, its envelope, its validation, and reading it back.

A Loader state is plain data (json and ``torch.load(weights_only=True)`` safe)::

    {"version": 4, "fingerprint": "...", "steps": [...], "seed": 0,
     "topology": {"world_size": 2, "num_workers": 4, "even_batches": True},
     "ranks": {"1": {"epoch": 3, "node": "<this rank's node states, as JSON>"}}}

What all ranks share sits at the top; each rank's position sits under its own
key in ``ranks``, with the node states as one JSON string. So the layout is the
same before and after a checkpoint is loaded, and in a
``torch.distributed.checkpoint`` save every rank writes its own position under
its own key (the shared keys are identical on all ranks). States of several
ranks can be merged into one ``ranks`` dict.

This module is the one place that knows that layout: the
:class:`datapipes.Loader` gathers its position and calls :func:`make_state`
and :func:`check_recipe_of` / :func:`check_setup` / :func:`rank_position`;
``python -m datapipes inspect`` reads states back with
:func:`find_loader_states`, :func:`decode_state` and :func:`saved_setup`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import Any

#: 4: every node keeps its input's state under ``nodes.UPSTREAM`` (``"upstream"``; version
#: 3 used ``"up"``, ``"anchor"``, ``"inputs"``, ``"current"``), and random streams derive
#: from the recipe's structure, not its display string, so shuffle orders moved.
#: 3: shuffles of up to 65,536 items draw uniform permutations, unlike version 2's.
STATE_VERSION = 4

#: Why a state of an older version cannot resume exactly, by version.
_WHY_REFUSED = {
    2: "whose shuffles ordered items differently",
    3: (
        "whose node states were laid out differently and whose shuffle orders derived "
        "from the recipe's display string, not its structure"
    ),
}


class StateMismatchError(ValueError):
    """A checkpoint does not belong to this Loader's recipe or topology."""


# ----- writing ----------------------------------------------------------------------------


def topology_record(world_size: int, num_workers: int, even_batches: bool) -> dict[str, Any]:
    """The ``"topology"`` of a Loader state: what every rank must share to resume it.

    >>> topology_record(2, 4, True)
    {'world_size': 2, 'num_workers': 4, 'even_batches': True}
    """
    return {"world_size": world_size, "num_workers": num_workers, "even_batches": even_batches}


def make_state(
    *,
    fingerprint: str,
    steps: Sequence[str],
    seed: int,
    topology: dict[str, Any],
    rank: int,
    epoch: int,
    node: Any,
) -> dict[str, Any]:
    """A Loader state (the layout in the module doc) for ``rank`` at ``epoch``.

    ``node`` is the rank's node state (``None``: at the start of ``epoch``).
    """
    return {
        "version": STATE_VERSION,
        "fingerprint": fingerprint,
        "steps": list(steps),
        "seed": seed,
        "topology": topology,
        "ranks": {
            str(rank): {
                "epoch": epoch,
                "node": None if node is None else json.dumps(node, separators=(",", ":")),
            }
        },
    }


# ----- validating -------------------------------------------------------------------------


def check_recipe_of(state: Any, fingerprint: str, steps: Sequence[str]) -> None:
    """Raise :class:`StateMismatchError` unless ``state`` is a Loader state of this version
    taken with the recipe of ``fingerprint`` (the message then shows the steps that differ).
    """
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        found = state.get("version") if isinstance(state, dict) else type(state).__name__
        hint = ""
        if isinstance(found, int) and found < STATE_VERSION:
            why = _WHY_REFUSED.get(found, "whose positions meant something else")
            hint = (
                f": it was saved by an older datapipes, {why}, so it cannot resume "
                "exactly; restart the epoch (set_epoch) or resume with the version that saved it"
            )
        raise StateMismatchError(
            f"not a datapipes Loader state of version {STATE_VERSION} (found {found!r})" + hint
        )
    if state["fingerprint"] != fingerprint:
        raise StateMismatchError(
            "this checkpoint was taken with a different recipe:\n"
            + explain_difference(list(state["steps"]), list(steps))
        )


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


def rank_position(state: dict[str, Any], rank: int) -> tuple[int, Any]:
    """``(epoch, node state or None)`` of ``rank`` in a checked ``state``."""
    mine = state["ranks"][str(rank)]
    return int(mine["epoch"]), None if mine["node"] is None else json.loads(mine["node"])


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
