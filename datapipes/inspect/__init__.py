"""Reading a checkpoint: where a Loader stopped, and whether and where a recipe can resume from it.

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

The modules, from the input to the report (the state's layout itself is
:mod:`datapipes.checkpoint`'s):

- ``load``: a checkpoint on disk (``torch.save``, JSON, DCP folder), read safely;
- ``job``: the states of one job merged, and what remains of its epoch and how it is dealt;
- ``tree``: the levels of a node state, by the recorded graph or a recipe built again;
- ``render``: the text and JSON report;
- ``cli``: the command, loading ``--recipe`` and checking that it can resume.

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
"""

from __future__ import annotations

from typing import Any

from datapipes.inspect.cli import check_recipe, load_recipe, main
from datapipes.inspect.job import elastic_report, gather
from datapipes.inspect.load import CheckpointError, load_checkpoint
from datapipes.inspect.render import render
from datapipes.pipe import DataPipe
from datapipes.resume.graph import (
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
    found = [(item.path, item.state) for item in shown]
    checks = None if pipe is None else [check_recipe(state, pipe) for _, state in found]
    reports: list[dict[str, Any] | None] = []
    for item in shown:
        report = elastic_report(item.state, pipe, world_size, num_workers)
        report.update(merged_from=item.merged_from, merge_problem=item.problem or None)
        reports.append(report)
    return render(found, pipe, checks, reports=reports)


__all__ = [
    "CheckpointError",
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
]
