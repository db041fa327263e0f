"""Reading a checkpoint: where a Loader stopped, and whether a recipe can resume from it.

``python -m datapipes inspect CHECKPOINT [--recipe MODULE:NAME] [--json]`` finds
every :class:`datapipes.Loader` state inside a checkpoint (a ``torch.save``
file, a JSON file or a ``torch.distributed.checkpoint`` directory; the state
may sit anywhere in it, e.g. under ``"data"`` next to the model) and prints
it readably: the recipe's steps, seed and topology, and for every rank its
epoch and position, the nested node states one line per level, each labelled
with its kind and recipe step from the graph recorded with the state (and for
worker processes one tree per worker). Nothing is unpickled beyond what
``torch.load(weights_only=True)`` allows.

With ``--recipe`` the positions are labelled with that recipe's steps, and
the recipe is checked against the checkpoint: the same fingerprint (else the
steps that differ), the same graph, and a Loader per saved rank that accepts
the state.

The modules, from the input to the report (the state's layout itself is
:mod:`datapipes.checkpoint`'s):

- ``load``: a checkpoint on disk (``torch.save``, JSON, DCP folder), read safely;
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
      version      4
      fingerprint  ...
      seed         1
      steps
        range(10)
        shuffle()
        batch(2)
      topology     world size 1, 0 workers, even_batches off
      rank 0: epoch 0
        dp.range(10).shuffle().batch(2) (sequence source): position=2
"""

from __future__ import annotations

from typing import Any

from datapipes.checkpoint import decode_state, explain_difference, find_loader_states, top_level
from datapipes.inspect.cli import check_recipe, load_recipe, main
from datapipes.inspect.load import CheckpointError, load_checkpoint
from datapipes.inspect.render import render
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


__all__ = [
    "CheckpointError",
    "check_recipe",
    "decode_state",
    "describe_checkpoint",
    "explain_difference",
    "find_loader_states",
    "load_checkpoint",
    "load_recipe",
    "main",
]
