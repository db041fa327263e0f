"""The recipe a checkpoint is read with (``--recipe``): loading it, and whether it can resume.

``--recipe`` names a recipe in one of these forms:

- ``MODULE:NAME``: ``NAME`` in a module importable from here, or from the current
  directory (``myproject.recipes:pipe``, ``recipes:pipe`` for ``./recipes.py``);
- ``path/to/file.py:NAME``: ``NAME`` in that file (relative to the current
  directory), run as ``python path/to/file.py`` would run it, its folder first
  on the import path;

where ``NAME`` is a DataPipe, a Loader (its seed and workers are checked too), or
a function (a factory, ``recipes.py:make_pipe``) that is called with no arguments
and returns one. A name that cannot be resolved is a :class:`CheckpointError`
naming what was tried and these forms (exit status 2).

:func:`check_recipe` tells what stops a recipe from resuming a state: another
fingerprint (the steps that differ), a rank whose Loader refuses the state, a
file reader whose saved position is in another file than this recipe reads.
Without a recipe, :func:`check` checks the state's shape only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from datapipes.checkpoint.reading import CheckpointError
from datapipes.inspect.job import Shown
from datapipes.inspect.tree import RecipeGraph, recipe_graph, saved_graph
from datapipes.loader.loader import Loader
from datapipes.pipe import DataPipe
from datapipes.resume import JobState
from datapipes.resume.graph_record import explain_difference
from nodes import FileListNode, FileReaderNode, Node
from nodes.adapters import torchdata
from nodes.dispatch import DispatchedSourceNode

# ----- --recipe: loading it -------------------------------------------------------------

#: What ``--recipe`` accepts, for its help and its errors.
RECIPE_FORMS = (
    "--recipe takes MODULE:NAME (a module importable from here or from the current "
    "directory, e.g. myproject.recipes:pipe) or path/to/file.py:NAME; NAME is a DataPipe, "
    "a Loader, or a function called with no arguments that returns one (e.g. "
    "recipes.py:make_pipe)"
)


def load_recipe(spec: str) -> tuple[DataPipe[Any], Loader | None]:
    """``(pipe, loader)`` from ``"package.module:NAME"`` or ``"path/to/file.py:NAME"``.

    ``NAME`` is a DataPipe, a Loader (its ``.pipe``; the Loader is returned
    too, so its seed and workers can be checked), or a zero-argument callable
    returning either (a factory). A module is looked for on the Python path and
    in the current directory; a file path is relative to the current directory.
    Raises :class:`CheckpointError` naming what was tried and the accepted forms.
    """
    module_part, sep, name = spec.rpartition(":")
    if not sep or not module_part or not name:
        raise CheckpointError(f"--recipe {spec!r}: no ':NAME' in it. {RECIPE_FORMS}")
    module, where = _import(module_part, spec)
    if not hasattr(module, name):
        found = sorted(
            key
            for key, value in vars(module).items()
            if not key.startswith("_")
            and (
                isinstance(value, DataPipe | Loader)
                or getattr(value, "__module__", None) == module.__name__
                and callable(value)
            )
        )
        raise CheckpointError(
            f"--recipe {spec!r}: {where} has no {name!r} (its DataPipes, Loaders and "
            f"functions: {', '.join(found) or 'none'}). {RECIPE_FORMS}"
        )
    value = getattr(module, name)
    if callable(value) and not isinstance(value, DataPipe | Loader):
        try:
            value = value()
        except Exception as error:  # noqa: BLE001
            raise CheckpointError(
                f"--recipe {spec!r}: calling {name}() failed ({type(error).__name__}: {error}); "
                "a function NAME is called with no arguments"
            ) from error
    if isinstance(value, Loader):
        return value.pipe, value
    if isinstance(value, DataPipe):
        return value, None
    raise CheckpointError(
        f"--recipe {spec!r}: {name} is of type {type(value).__name__}; expected a DataPipe, a "
        "Loader, or a function of no arguments returning one"
    )


def _import(module_part: str, spec: str) -> tuple[ModuleType, str]:
    """The module a file path (``.py`` or with a slash) or a module name names, and how
    to name it in an error."""
    cwd = os.getcwd()
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        file = Path(cwd, module_part).resolve()
        if not file.is_file():
            raise CheckpointError(
                f"--recipe {spec!r}: no file {str(file)!r} (a path is relative to the current "
                f"directory, {cwd}). {RECIPE_FORMS}"
            )
        return _import_file(file, spec), f"file {str(file)!r}"
    try:
        with _first_on_path(cwd):  # as `python -m` does: modules of this folder
            module = importlib.import_module(module_part)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_part == missing or module_part.startswith(missing + "."):
            raise CheckpointError(
                f"--recipe {spec!r}: no module {missing!r} on the Python path or in the "
                f"current directory ({cwd}); run from the folder that holds it, add that "
                f"folder to PYTHONPATH, or give the file's path. {RECIPE_FORMS}"
            ) from None
        raise CheckpointError(  # the recipe's own imports: its environment lacks a package
            f"--recipe {spec!r}: importing module {module_part!r} failed: it imports "
            f"{missing!r}, which is not installed here ({error})"
        ) from error
    except Exception as error:  # noqa: BLE001 - the recipe module's own code failed
        raise CheckpointError(
            f"--recipe {spec!r}: importing module {module_part!r} failed: "
            f"{type(error).__name__}: {error}"
        ) from error
    return module, f"module {module_part!r} ({getattr(module, '__file__', None) or 'built in'})"


def _import_file(file: Path, spec: str) -> ModuleType:
    module_name = f"_datapipes_recipe_{abs(hash(str(file)))}"
    import_spec = importlib.util.spec_from_file_location(module_name, file)
    if import_spec is None or import_spec.loader is None:
        raise CheckpointError(
            f"--recipe {spec!r}: {str(file)!r} cannot be imported (not a .py file?). {RECIPE_FORMS}"
        )
    module = importlib.util.module_from_spec(import_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up
    try:
        with _first_on_path(str(file.parent)):  # its own folder, as for `python FILE`
            import_spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - the recipe file's own code failed
        del sys.modules[module_name]
        raise CheckpointError(
            f"--recipe {spec!r}: running {str(file)!r} failed: {type(error).__name__}: {error}"
        ) from error
    return module


@contextmanager
def _first_on_path(folder: str) -> Iterator[None]:
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


# ----- --recipe: can it resume the state? ------------------------------------------------


def check_recipe(
    state: dict[str, Any],
    pipe: DataPipe[Any],
    *,
    seed: int | None = None,
    num_workers: int | None = None,
) -> list[str]:
    """What stops ``pipe`` from resuming ``state`` (a Loader state); empty when nothing does.

    The state must parse, and its dispatch records hand each unit out once
    (:func:`check`); the fingerprints must be equal (else the message shows the
    steps that differ); then for every saved rank a ``Loader(pipe, seed, rank=r,
    world_size=W, num_workers=N, even_batches=...)`` must accept the state.
    ``seed`` and ``num_workers`` default to the saved ones; pass a Loader's own
    to check that Loader's configuration.
    """
    return check(Shown.found("", state), pipe, seed=seed, num_workers=num_workers)


def check(
    item: Shown,
    pipe: DataPipe[Any] | None,
    *,
    seed: int | None = None,
    num_workers: int | None = None,
) -> list[str]:
    """What is wrong with a state found (:func:`check_recipe`); without ``pipe`` the shape
    only: it parses, and no unit is claimed twice (positions need the data the recipe names).
    """
    state = item.parsed
    if state is None:
        return [item.unreadable]
    problems = record_problems(state)  # shapes first: what follows reads them
    if problems or pipe is None:
        return problems
    if state.fingerprint != pipe.fingerprint():
        return [
            f"the recipe's fingerprint {pipe.fingerprint()} differs from the checkpoint's "
            f"{state.fingerprint}; the steps that differ:\n"
            + explain_difference(state.steps, pipe.steps())
        ]
    own = {"seed": seed, "num_workers": num_workers}
    arguments = state.setup.loader_arguments()
    arguments.update({key: value for key, value in own.items() if value is not None})
    # Ranks at an epoch's start with nothing else to say load as the others do (a merged
    # state keeps them as ranges): one Loader per rank with something to say.
    ranks = [rank for rank, entry in state.ranks.items() if not entry.is_idle]
    for rank in ranks or [min(state.ranks)]:
        try:
            loader = Loader(pipe, rank=rank, **arguments)
        except Exception as error:  # noqa: BLE001 - reported as what stops the resume
            problems.append(f"rank {rank}: cannot make the Loader: {error}")
            continue
        try:
            loader.load_state_dict(item.state)
            if not loader.num_workers:  # resume it for one item: what only the data can tell
                next(iter(loader), None)
        except Exception as error:  # noqa: BLE001 - what a resume would raise
            problems.append(f"rank {rank}: {error}")
            continue
        finally:
            loader.close()
        problems += _check_positions(pipe, state, rank)
    return problems


def record_problems(state: JobState) -> list[str]:
    """What the dispatch records of ``state`` tell wrong without the recipe: a unit claimed
    twice in one epoch, by one consumer or two (a resume would deliver its items twice or
    never)."""
    owner: dict[tuple[int, str, int], int] = {}
    problems: list[str] = []
    for rank, entry in state.ranks.items():
        record = entry.dispatch
        if record is None:
            continue
        for consumer, places in sorted(record.claims.items()):
            for place, units in places.items():
                for unit in units:
                    key = (record.epoch, place, unit)
                    if key not in owner:
                        owner[key] = consumer
                        continue
                    problems.append(
                        f'ranks["{rank}"].dispatch.claims[{str(consumer)!r}][{place!r}]: unit '
                        f"{unit} of epoch {key[0]} was claimed by consumer {owner[key]} too: a "
                        "unit is handed out once; the checkpoint is damaged"
                    )
    return problems


def _check_positions(pipe: DataPipe[Any], state: JobState, rank: int) -> list[str]:
    """Whether the recipe's file readers accept the saved positions of ``rank``.

    ``Loader.load_state_dict`` checks the recipe, topology and seed; the files
    are checked when the epoch resumes. This resets each file reader (and file
    list) of the rank's graph to its saved position, which lists the files and
    plans this consumer's share without reading a record, so a changed listing
    or a position in another file than this recipe would read is found now.
    """
    node = state.ranks[rank].node
    if node is None:
        return []
    try:
        graph = recipe_graph(pipe, state, rank, saved_graph(state, rank))
    except Exception as error:  # noqa: BLE001 - a recipe that cannot be built cannot resume
        return [f"rank {rank}: building the recipe failed: {error}"]
    return _check_tree(f"rank {rank}", node, graph)


def _check_tree(where: str, node_state: Any, graph: RecipeGraph) -> list[str]:
    problems: list[str] = []
    for level in graph.levels(node_state):
        if level.kind == "workers":
            workers = torchdata.worker_dataset_states(level.state.get("dataloader"))
            for worker_id, dataset in workers:
                if not dataset:
                    continue
                worker = f"{where} worker {worker_id}"
                try:
                    worker_graph = graph.worker(worker_id, dataset, level)
                except Exception as error:  # noqa: BLE001
                    problems.append(f"{worker}: building failed: {error}")
                    continue
                problems += _check_tree(worker, dataset.get("node"), worker_graph)
                problem = _check_resume(worker_graph.root, dataset.get("node"))
                if problem:
                    problems.append(f"{worker}: {problem}")
        elif isinstance(node := graph.node(level), DispatchedSourceNode):
            try:  # its claims; this also points the source below at its last unit
                node.validate_state(level.state, "node")
            except Exception as error:  # noqa: BLE001 - a damaged record or state: a problem
                problems.append(f"{where}, {level.steps}: {error}")
        elif isinstance(node, FileReaderNode | FileListNode):
            problem = _check_files(node, level.state)
            if problem:
                problems.append(f"{where}, {level.steps}: {problem}")
    return problems


def _check_resume(root: Node[Any] | None, saved: Any) -> str:
    """What resuming a worker's graph from ``saved`` raises at its first item ("": nothing)."""
    if root is None or saved is None:
        return ""
    try:
        root.reset(saved)
        next(iter(root), None)
    except Exception as error:  # noqa: BLE001 - what a resume would raise
        return str(error)
    finally:
        root.close()
    return ""


def _check_files(node: Node[Any], saved: dict[str, Any]) -> str:
    """What a resume of ``node`` from ``saved`` would raise, or where it would be elsewhere."""
    try:
        node.reset(saved)
        now = node.state_dict()
        next(iter(node), None)  # opens the file at the cursor: what a resume finds there
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
