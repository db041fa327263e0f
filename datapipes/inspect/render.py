"""The text report of a checkpoint: per Loader state its recipe, topology, ranks and check."""

from __future__ import annotations

from typing import Any

from datapipes.checkpoint import STATE_VERSION
from datapipes.inspect.graph import RecipeGraph, recipe_graph
from datapipes.inspect.recipe_check import check_recipe
from datapipes.inspect.states import decode_state, find_loader_states, top_level
from datapipes.inspect.tree import Writer, scalar
from datapipes.pipe import DataPipe


def describe_checkpoint(checkpoint: Any, pipe: DataPipe[Any] | None = None) -> str:
    """A readable account of every Loader state in ``checkpoint`` (a loaded object).

    ``checkpoint`` is a Loader state, or anything holding some (``{"model": ...,
    "data": loader.state_dict()}``). Each state shows its version, fingerprint,
    seed, steps and topology, and per rank the epoch and position: the node
    states one line per nesting level with their scalar fields (long lists
    summarised), and for worker processes the snapshot, the next worker and one
    tree per worker. With ``pipe`` (the recipe) the levels are labelled with its
    steps, and the result of :func:`check_recipe` is appended.

    Raises ``ValueError`` when ``checkpoint`` holds no Loader state.
    """
    found = find_loader_states(checkpoint)
    if not found:
        raise ValueError(f"no datapipes Loader state found; {top_level(checkpoint)}")
    checks = None if pipe is None else [check_recipe(state, pipe) for _, state in found]
    return render(found, pipe, checks)


def render(
    found: list[tuple[str, dict[str, Any]]],
    pipe: DataPipe[Any] | None,
    checks: list[list[str]] | None,
    recipe_name: str = "recipe",
) -> str:
    """The report on the Loader states ``found`` (and on ``checks``, one per state, if given)."""
    lines: list[str] = []
    for index, (path, state) in enumerate(found):
        writer = Writer(state.get("steps", []))
        _render_state(writer, path, state, pipe)
        if checks is not None and checks[index]:
            writer.line(1, f"recipe check ({recipe_name}): FAILED")
            for problem in checks[index]:
                for text in problem.splitlines():
                    writer.line(2, text)
        elif checks is not None:
            writer.line(
                1, f"recipe check ({recipe_name}): OK, same fingerprint and every saved rank loads"
            )
        lines += ([""] if index else []) + writer.lines
    return "\n".join(lines)


def _render_state(
    writer: Writer, path: str, state: dict[str, Any], pipe: DataPipe[Any] | None
) -> None:
    writer.line(0, f"Loader state at {path!r}" if path else "Loader state at the top level")
    version = state.get("version")
    writer.line(1, f"version      {version}")
    if version != STATE_VERSION and version not in (2, 3):
        writer.line(2, f"! this datapipes reads versions 2 to {STATE_VERSION}; what follows may be "
                    "incomplete")
    elif version != STATE_VERSION:
        writer.line(2, f"! saved by an older datapipes; a version {STATE_VERSION} Loader refuses")
    writer.line(1, f"fingerprint  {state.get('fingerprint')}")
    writer.line(1, f"seed         {state.get('seed')}")
    writer.line(1, "steps")
    for step in state.get("steps", []):
        writer.line(2, str(step))
    topology = state.get("topology") or {}
    even = "on" if topology.get("even_batches") else "off"
    writer.line(
        1,
        f"topology     world size {topology.get('world_size')}, "
        f"{topology.get('num_workers')} workers, even_batches {even}",
    )
    same_recipe = pipe is not None and pipe.fingerprint() == state.get("fingerprint")
    ranks = decode_state(state)["ranks"]
    for rank in sorted(ranks, key=lambda r: (len(r), r)):
        mine = ranks[rank]
        if not isinstance(mine, dict):
            writer.line(1, f"rank {rank}: {scalar(mine)}")
            continue
        epoch = mine.get("epoch")
        writer.line(1, f"rank {rank}: epoch {epoch}")
        if mine.get("node") is None:
            writer.line(2, f"no position: the next iteration runs epoch {epoch} from its start")
            continue
        graph = RecipeGraph()
        if same_recipe and rank.isdigit():
            try:
                graph = recipe_graph(pipe, state, int(rank), int(epoch or 0))  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - labels are a help; the view by keys still works
                pass
        writer.position(2, mine["node"], graph)
