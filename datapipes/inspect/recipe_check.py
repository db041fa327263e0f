"""Whether a recipe can resume a Loader state: the same recipe, and positions it accepts."""

from __future__ import annotations

from typing import Any

from datapipes import checkpoint
from datapipes.inspect.graph import RecipeGraph, recipe_graph
from datapipes.inspect.shapes import worker_states
from datapipes.inspect.states import decode_state, saved_setup
from datapipes.loader import Loader, StateMismatchError
from datapipes.pipe import DataPipe
from nodes import FileListNode, FileReaderNode, Node


def explain_difference(saved_steps: list[str], current_steps: list[str]) -> str:
    """A diff of two recipes' steps, as ``Loader.load_state_dict`` prints it on a mismatch.

    >>> print(explain_difference(["range(4)", "batch(2)"], ["range(4)", "batch(3)"]))
      --- checkpoint recipe
      +++ this recipe
       range(4)
      -batch(2)
      +batch(3)
    """
    return checkpoint.explain_difference(saved_steps, current_steps)


def check_recipe(
    state: dict[str, Any],
    pipe: DataPipe[Any],
    *,
    seed: int | None = None,
    num_workers: int | None = None,
) -> list[str]:
    """What stops ``pipe`` from resuming ``state`` (a Loader state); empty when nothing does.

    The fingerprints must be equal (else the message shows the steps that
    differ); then for every saved rank a ``Loader(pipe, seed, rank=r,
    world_size=W, num_workers=N, even_batches=...)`` must accept the state.
    ``seed`` and ``num_workers`` default to the saved ones; pass a Loader's own
    to check that Loader's configuration.
    """
    if state.get("fingerprint") != pipe.fingerprint():
        return [
            f"the recipe's fingerprint {pipe.fingerprint()} differs from the checkpoint's "
            f"{state.get('fingerprint')}; the steps that differ:\n"
            + explain_difference(list(state.get("steps", [])), pipe.steps())
        ]
    own = {"seed": seed, "num_workers": num_workers}
    own = {key: value for key, value in own.items() if value is not None}
    problems = []
    for rank in sorted(state.get("ranks", {}), key=str):
        try:
            loader = Loader(pipe, rank=int(rank), **{**saved_setup(state), **own})
        except Exception as error:  # noqa: BLE001 - reported as what stops the resume
            problems.append(f"rank {rank}: cannot make the Loader: {error}")
            continue
        try:
            loader.load_state_dict(state)
        except StateMismatchError as error:
            problems.append(f"rank {rank}: {error}")
            continue
        finally:
            loader.close()
        problems += _check_positions(pipe, state, str(rank))
    return problems


def _check_positions(pipe: DataPipe[Any], state: dict[str, Any], rank: str) -> list[str]:
    """Whether the recipe's file readers accept the saved positions of ``rank``.

    ``Loader.load_state_dict`` checks the recipe, topology and seed; the files
    are checked when the epoch resumes. This resets each file reader (and file
    list) of the rank's graph to its saved position, which lists the files and
    plans this consumer's share without reading a record, so a changed listing
    or a position in another file than this recipe would read is found now.
    """
    mine = decode_state(state)["ranks"][rank]
    if not isinstance(mine.get("node"), dict):
        return []
    try:
        graph = recipe_graph(pipe, state, int(rank), int(mine.get("epoch") or 0))
    except Exception as error:  # noqa: BLE001 - a recipe that cannot be built cannot resume
        return [f"rank {rank}: building the recipe failed: {error}"]
    return _check_tree(f"rank {rank}", mine["node"], graph)


def _check_tree(where: str, node_state: Any, graph: RecipeGraph) -> list[str]:
    problems: list[str] = []
    for level in graph.levels(node_state):
        if level.kind == "workers":
            for worker_id, dataset in worker_states(level.state):
                if not dataset:
                    continue
                worker = f"{where} worker {worker_id}"
                try:
                    worker_graph = graph.worker(worker_id, dataset)
                except Exception as error:  # noqa: BLE001
                    problems.append(f"{worker}: building failed: {error}")
                    continue
                problems += _check_tree(worker, dataset.get("node"), worker_graph)
        elif isinstance(level.node, FileReaderNode | FileListNode):
            problem = _check_files(level.node, level.state)
            if problem:
                problems.append(f"{where}, {level.steps}: {problem}")
    return problems


def _check_files(node: Node[Any], saved: dict[str, Any]) -> str:
    """What a resume of ``node`` from ``saved`` would raise, or where it would be elsewhere."""
    try:
        node.reset(saved)
        now = node.state_dict()
    except Exception as error:  # noqa: BLE001 - what a resume would raise
        return str(error)
    finally:
        node.close()
    if isinstance(node, FileReaderNode):
        for key in ("file", "part"):
            if key in saved and now.get(key) != saved[key]:
                return (
                    f"the checkpoint's position is in {key} {saved[key]!r}, but this recipe's "
                    f"plan for the consumer has {key} {now.get(key)!r} there (unit "
                    f"{saved.get('unit')}): the files or their order differ"
                )
    return ""
