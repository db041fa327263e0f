"""The inspect command and ``describe_checkpoint``: where a Loader stopped, where it can resume.

``python -m datapipes inspect CHECKPOINT [CHECKPOINT ...] [--recipe MODULE:NAME]
[--world-size N] [--num-workers K] [--json]`` finds every
:class:`datapipes.Loader` state inside the checkpoints (``torch.save`` files,
JSON files or ``torch.distributed.checkpoint`` directories; the state may sit
anywhere in them, e.g. under ``"data"`` next to the model) and prints it
readably: the recipe's steps, seed and topology, and for every rank its
epoch and position, the nested node states one line per level, each labelled
with its kind and recipe step from the graph recorded with the state (and for
worker processes one tree per worker). Nothing is unpickled beyond what
``torch.load(weights_only=True)`` allows.

The states of one job found in several checkpoints (one ``torch.save`` file
per rank) are merged (:func:`datapipes.merge_states`) and shown as one. The
report says whether a state covers every rank of its job (it can resume on
any topology) or some ranks only (it resumes on the saved topology), each
rank's epoch, and the plans a rank holds after a resume on another topology.

With ``--recipe`` the positions are labelled with that recipe's steps, and
the recipe is checked against the checkpoint: the same fingerprint (else the
steps that differ), the same graph, and a Loader per saved rank that accepts
the state. For a state that covers its job, the report then tells how much
of the interrupted epoch remains per source (items of a random-access source;
records read but not delivered and the rests of files of a file source), and
with ``--world-size``/``--num-workers`` how it would be dealt to the consumers
of that topology, or why a resume there is refused.

A state taken under ``dp.Loader(..., dispatch="dynamic")`` shows, per rank, its
dispatch record (the epoch, the unit size, the units each consumer claimed), and
its graphs are built as that Loader built them (each source reading the units
it claimed); with ``--recipe`` the job's part also says how many units each
source had and how many no consumer reached (a resume hands those out whole).

Exit status: 0 ok; 1 a recipe that cannot resume, no Loader state, states of one
job that do not merge, or a deal asked for (``--world-size``/``--num-workers``)
that cannot be told; 2 a usage error.

From the input to the report: the files are read by
:mod:`datapipes.checkpoint.reading` (nothing unpickled but plain data); each
Loader state found is parsed once into :mod:`datapipes.resume`'s model, and
the states of one job are merged (:func:`gather`, here); a state that does not
parse is shown as found. Then:

- ``recipe``: ``--recipe`` loaded, and whether it can resume each state;
- ``job``: what a state covers, what remains of its epoch and how it is dealt
  (``pieces``: what a list of pieces of work holds; ``dispatch``: the dynamic
  dispatch records and the job's units);
- ``tree``: the levels of a node state, by the recorded graph or a recipe built again;
- ``position``: those levels as lines of text;
- ``render``: the text and JSON report.

In-process, for tutorials and notebooks::

    >>> import datapipes as dp
    >>> from datapipes.inspect import describe_checkpoint
    >>> loader = dp.Loader(dp.range(10).shuffle().batch(2), seed=1)
    >>> _ = next(iter(loader))
    >>> print(describe_checkpoint({"data": loader.state_dict()}))  # doctest: +ELLIPSIS
    Loader state at 'data'
      version      5
      fingerprint  ...
      seed         1
      steps
        range(10)
        shuffle()
        batch(2)
      topology     world size 1, 0 workers, even_batches off
      rank 0: epoch 0
        dp.range(10).shuffle().batch(2) (sequence source): position=2
      job          covers rank 0 of 1: can resume on any topology
        epoch 0: rank 0 mid-epoch
      remaining    the remaining work and its deal need the recipe (--recipe MODULE:NAME): ...
    >>> pipe = loader.pipe
    >>> text = describe_checkpoint(loader.state_dict(), pipe, world_size=2)
    >>> print(text[text.index("remaining"):])  # doctest: +ELLIPSIS
    remaining    of epoch 0
        dp.range(10).shuffle() (positions): 8 items
      dealt to world size 2, 0 workers per rank
        rank 0: dp.range(10).shuffle(): 4 items
        rank 1: dp.range(10).shuffle(): 4 items

May import: nodes, datapipes.pipe, datapipes.placement, datapipes.resume,
datapipes.checkpoint, datapipes.loader.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from datapipes.checkpoint.reading import CheckpointError
from datapipes.checkpoint.reading import read_checkpoint as load_checkpoint
from datapipes.inspect.job import Shown, elastic_report, job_report
from datapipes.inspect.recipe import check, check_recipe, load_recipe
from datapipes.inspect.render import as_json, render
from datapipes.pipe import DataPipe
from datapipes.resume import JobState, RankEntry, job_state, merge_states
from datapipes.resume.graph_record import (
    decode_state,
    explain_difference,
    find_loader_states,
    top_level,
)


def describe_checkpoint(
    checkpoint: Any,
    pipe: DataPipe[Any] | None = None,
    *,
    world_size: int | None = None,
    num_workers: int | None = None,
) -> str:
    """A readable account of every Loader state in ``checkpoint`` (a loaded object).

    ``checkpoint`` is a Loader state, or anything holding some (``{"model": ...,
    "data": loader.state_dict()}``). Each state shows its version, fingerprint,
    seed, steps and topology, and per rank the epoch and position: the node
    states one line per nesting level with their scalar fields (long lists
    summarised), and for worker processes the snapshot, the next worker and one
    tree per worker; then what it covers of its job. With ``pipe`` (the recipe)
    the levels are labelled with its steps, the result of :func:`check_recipe`
    is appended, and so is the remaining work of the epoch, and with
    ``world_size``/``num_workers`` how it would be dealt to that topology.
    States of one job are merged, as the command does with several files.

    Raises ``ValueError`` when ``checkpoint`` holds no Loader state.
    """
    shown = gather([("", checkpoint)])
    if not shown:
        raise ValueError(f"no datapipes Loader state found; {top_level(checkpoint)}")
    checks = None if pipe is None else [check(item, pipe) for item in shown]
    reports = [job_report(item, pipe, world_size, num_workers) for item in shown]
    return render(shown, pipe, checks, reports=reports)


# ----- finding and merging --------------------------------------------------------------------


def gather(checkpoints: list[tuple[str, Any]]) -> list[Shown]:
    """The Loader states in ``checkpoints`` (``(name, loaded object)`` each), by job.

    States of one job (same fingerprint, steps, seed and topology) found in
    several places are merged with :func:`datapipes.merge_states` (one
    ``torch.save`` file per rank, in any order); when that is refused (a rank
    twice with different positions, ranks missing) they are shown together when
    each rank is there once, else each as found, with the reason. A state alone,
    or one that does not parse, is shown as found.
    """
    several = len(checkpoints) > 1
    groups: dict[Any, list[Shown]] = {}
    for name, checkpoint in checkpoints:
        for path, state in find_loader_states(checkpoint):
            item = Shown.found((f"{name}:{path}" if path else name) if several else path, state)
            parsed = item.parsed
            key = object() if parsed is None else (parsed.fingerprint, parsed.steps, parsed.setup)
            groups.setdefault(key, []).append(item)
    shown: list[Shown] = []
    for group in groups.values():
        if len(group) == 1:
            shown += group
            continue
        paths = [item.path for item in group]
        try:
            merged = merge_states([item.state for item in group])
        except ValueError as error:  # StateMismatchError included
            why = f"the {len(group)} states of this job given were not merged: {error}"
            together = _together([item.parsed for item in group if item.parsed is not None])
            if together is None:
                shown += [item._replace(problem=why) for item in group]
            else:  # some ranks of the job, each once: shown as one
                raw = job_state(together, idle_as_ranges=False)
                shown.append(Shown(f"{len(group)} states", raw, paths, why, together, ""))
            continue
        item = Shown.found(f"merged from {len(group)} states", merged)
        shown.append(item._replace(merged_from=paths))
    return shown


def _together(states: list[JobState]) -> JobState | None:
    """States of some ranks of one job as one state (not merged: not every rank is there),
    or ``None`` when two of them hold the same rank."""
    ranks: dict[int, RankEntry] = {}
    for state in states:
        if any(rank in ranks for rank in state.ranks):
            return None
        ranks.update(state.ranks)
    return dataclasses.replace(states[0], ranks=dict(sorted(ranks.items())), remaining=None)


# ----- the command ---------------------------------------------------------------------


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
    own = {} if loader is None else {"seed": loader.seed, "num_workers": loader.num_workers}
    # Without the recipe, the shape only: positions need the data the recipe names.
    checks = [check(item, pipe, **own) for item in shown]
    reports = [job_report(item, pipe, args.world_size, args.num_workers) for item in shown]
    if args.json:
        names = args.checkpoint[0] if len(args.checkpoint) == 1 else list(args.checkpoint)
        out = as_json(names, shown, checks, reports)
        print(json.dumps(out, indent=2, default=str))
    else:
        print(render(shown, pipe, checks, args.recipe or "", reports))
    asked = args.world_size is not None or args.num_workers is not None
    failed = any(checks) or any(item.problem for item in shown)
    failed = failed or (asked and any(report.get("problem") for report in reports))
    return 1 if failed else 0


__all__ = [
    "CheckpointError",
    "Shown",
    "as_json",
    "check_recipe",
    "decode_state",
    "describe_checkpoint",
    "elastic_report",
    "explain_difference",
    "find_loader_states",
    "gather",
    "load_checkpoint",
    "load_recipe",
    "main",
    "render",
]
