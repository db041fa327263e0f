"""The command ``python -m datapipes inspect CHECKPOINT [CHECKPOINT ...] [--recipe MODULE:NAME]
[--world-size N] [--num-workers K] [--json]``.

Several checkpoints (one ``torch.save`` file per rank, say) are read together:
the Loader states of one job found in them are merged (:func:`datapipes.merge_states`)
and reported as one. For each state the report says whether it covers every
rank of its job (then it can resume on any topology) or some ranks only.

``--recipe`` names a recipe in one of these forms:

- ``MODULE:NAME``: ``NAME`` in a module importable from here, or from the current
  directory (``myproject.recipes:pipe``, ``recipes:pipe`` for ``./recipes.py``);
- ``path/to/file.py:NAME``: ``NAME`` in that file (relative to the current
  directory), run as ``python path/to/file.py`` would run it, its folder first
  on the import path;

where ``NAME`` is a DataPipe, a Loader (its seed and workers are checked too), or
a function (a factory, ``recipes.py:make_pipe``) that is called with no arguments
and returns one. A name that cannot be resolved is an error naming what was
tried and these forms (exit status 2).

With ``--recipe`` the recipe it names is loaded and checked against each Loader
state: the same fingerprint (else the steps that differ), a Loader per saved
rank that accepts the state, and file readers that accept their saved positions. For a
state that covers its job, the report then says how much of the interrupted
epoch remains, per source, and with ``--world-size``/``--num-workers`` how it
would be dealt to the consumers of that topology.

A state taken under ``dp.Loader(..., dispatch="dynamic")`` shows, per rank, its
dispatch record (the epoch, the unit size, the units each consumer claimed), and
its graphs are built as that Loader built them (each source reading the units
it claimed); with ``--recipe`` the job's part also says how many units each
source had and how many no consumer reached (a resume hands those out whole).

Exit status: 0 ok; 1 a recipe that cannot resume, no Loader state, states of one
job that do not merge, or a deal asked for (``--world-size``/``--num-workers``)
that cannot be told; 2 a usage error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from datapipes.inspect.dispatch import record_problems
from datapipes.inspect.job import elastic_report, gather
from datapipes.inspect.load import CheckpointError, load_checkpoint
from datapipes.inspect.render import as_json, render, shared_graph
from datapipes.inspect.tree import RecipeGraph, recipe_graph
from datapipes.loader import Loader, StateMismatchError
from datapipes.pipe import DataPipe
from datapipes.resume import job_state, parse_state
from datapipes.resume.graph import decode_state, explain_difference, top_level
from nodes import FileListNode, FileReaderNode, Node
from nodes import torchdata_adapter as torchdata
from nodes.dispatch import DispatchedSourceNode


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m datapipes inspect",
        description=(
            "Show the datapipes Loader state(s) in checkpoints (torch.save files, JSON files or "
            "torch.distributed.checkpoint directories; several files of one job, e.g. one per "
            "rank, are merged), optionally check a recipe against them, and tell how much of "
            "the epoch remains and how it would be dealt to another topology. Exit status: 0 "
            "ok, 1 mismatch, no Loader state, states that do not merge or a deal that cannot "
            "be told, 2 usage error."
        ),
    )
    parser.add_argument(
        "checkpoint", nargs="+", help="checkpoint files or DCP directories (e.g. one per rank)"
    )
    parser.add_argument(
        "--recipe",
        metavar="MODULE:NAME",
        help=(
            "the recipe to check: MODULE:NAME (a module importable from here or from the "
            "current directory, e.g. myproject.recipes:pipe) or path/to/file.py:NAME; NAME "
            "is a DataPipe, a Loader, or a function called with no arguments that returns "
            "one (e.g. recipes.py:make_pipe)"
        ),
    )
    parser.add_argument(
        "--world-size",
        type=_count(1),
        metavar="N",
        help="show how the remaining work would be dealt to N ranks (needs --recipe)",
    )
    parser.add_argument(
        "--num-workers",
        type=_count(0),
        metavar="K",
        help="... with K DataLoader workers per rank (default: the saved number)",
    )
    parser.add_argument("--json", action="store_true", help="print the decoded state as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m datapipes inspect CHECKPOINT [CHECKPOINT ...] [--recipe MODULE:NAME]
    [--world-size N] [--num-workers K] [--json]``; the exit code."""
    args = _parser().parse_args(argv)
    try:
        loaded = [(name, load_checkpoint(name)) for name in args.checkpoint]
        pipe, loader = load_recipe(args.recipe) if args.recipe else (None, None)
    except CheckpointError as error:
        print(f"datapipes inspect: {error}", file=sys.stderr)
        return error.exit_code
    shown = gather(loaded)
    if not shown:
        where = ", ".join(f"{name!r} ({top_level(checkpoint)})" for name, checkpoint in loaded)
        print(
            f"datapipes inspect: no datapipes Loader state in {where} (looked for a dict with "
            "'version', 'fingerprint' and 'ranks')",
            file=sys.stderr,
        )
        return 1
    found = [(item.path, item.state) for item in shown]
    if pipe is not None:
        own = {} if loader is None else {"seed": loader.seed, "num_workers": loader.num_workers}
        checks = [check_recipe(state, pipe, **own) for _, state in found]
    else:  # the shape only: positions need the recipe (the data they point into)
        checks = [check_state(state) for _, state in found]
    reports: list[dict[str, Any] | None] = []
    for item in shown:
        report = elastic_report(item.state, pipe, args.world_size, args.num_workers)
        report.update(merged_from=item.merged_from, merge_problem=item.problem or None)
        reports.append(report)
    if args.json:
        names = args.checkpoint[0] if len(args.checkpoint) == 1 else list(args.checkpoint)
        out = as_json(names, found, checks, reports)
        print(json.dumps(out, indent=2, default=str))
    else:
        print(render(found, pipe, checks, args.recipe or "", reports))
    asked = args.world_size is not None or args.num_workers is not None
    failed = any(checks) or any(item.problem for item in shown)
    failed = failed or (asked and any(r is not None and r.get("problem") for r in reports))
    return 1 if failed else 0


def check_state(state: dict[str, Any]) -> list[str]:
    """What is wrong with the shape of ``state`` (a Loader state), without a recipe: its
    version, fields and their types, each rank's epoch and node JSON. Empty when nothing is;
    the node positions are checked only against a recipe (:func:`check_recipe`)."""
    try:
        parsed = parse_state(state)
    except StateMismatchError as error:
        return [str(error)]
    return record_problems(job_state(parsed, idle_as_ranges=False)["ranks"])


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

    The fingerprints must be equal (else the message shows the steps that
    differ); then for every saved rank a ``Loader(pipe, seed, rank=r,
    world_size=W, num_workers=N, even_batches=...)`` must accept the state.
    ``seed`` and ``num_workers`` default to the saved ones; pass a Loader's own
    to check that Loader's configuration.
    """
    problems = check_state(state)  # shapes first: what follows reads them
    if problems:
        return problems
    if state.get("fingerprint") != pipe.fingerprint():
        return [
            f"the recipe's fingerprint {pipe.fingerprint()} differs from the checkpoint's "
            f"{state.get('fingerprint')}; the steps that differ:\n"
            + explain_difference(list(state.get("steps", [])), pipe.steps())
        ]
    own = {"seed": seed, "num_workers": num_workers}
    own = {key: value for key, value in own.items() if value is not None}
    for rank in sorted(state.get("ranks", {}), key=str):
        try:
            arguments = parse_state(state).setup.loader_arguments()
            loader = Loader(pipe, rank=int(rank), **{**arguments, **own})
        except Exception as error:  # noqa: BLE001 - reported as what stops the resume
            problems.append(f"rank {rank}: cannot make the Loader: {error}")
            continue
        try:
            loader.load_state_dict(state)
            if not loader.num_workers:  # resume it for one item: what only the data can tell
                next(iter(loader), None)
        except Exception as error:  # noqa: BLE001 - what a resume would raise
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
    saved = shared_graph(decode_state(state)["ranks"], rank)
    try:
        graph = recipe_graph(pipe, state, int(rank), int(mine.get("epoch") or 0), saved)
    except Exception as error:  # noqa: BLE001 - a recipe that cannot be built cannot resume
        return [f"rank {rank}: building the recipe failed: {error}"]
    return _check_tree(f"rank {rank}", mine["node"], graph)


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
