"""Reading a checkpoint: where a Loader stopped, and whether a recipe can resume from it.

``python -m datapipes inspect CHECKPOINT [--recipe MODULE:NAME] [--json]`` finds
every :class:`datapipes.Loader` state inside a checkpoint (a ``torch.save``
file, a JSON file or a ``torch.distributed.checkpoint`` directory; the state
may sit anywhere in it, e.g. under ``"data"`` next to the model) and prints
it readably: the recipe's steps, seed and topology, and for every rank its
epoch and position, the nested node states one line per level (and for
worker processes one tree per worker). Nothing is unpickled beyond what
``torch.load(weights_only=True)`` allows.

With ``--recipe`` the positions are labelled with that recipe's steps, and
the recipe is checked against the checkpoint: the same fingerprint (else the
steps that differ), and a Loader per saved rank that accepts the state.

The modules, from the input to the report:

- ``load`` (and ``dcp`` for DCP folders): a checkpoint on disk, read safely;
- ``states``: the Loader states in it and what each was saved with;
- ``shapes``: the kinds of node state and how they nest;
- ``graph``: a recipe built as one consumer ran it, to label each level;
- ``tree`` and ``render``: the text view; ``recipe_check``: can a recipe resume;
- ``recipe_spec``: the ``--recipe`` it names; ``cli``: the command.

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
        range(10) (sequence source): position=2
"""

from __future__ import annotations

from datapipes.inspect.cli import main
from datapipes.inspect.errors import CheckpointError
from datapipes.inspect.load import load_checkpoint
from datapipes.inspect.recipe_check import check_recipe, explain_difference
from datapipes.inspect.recipe_spec import load_recipe
from datapipes.inspect.render import describe_checkpoint
from datapipes.inspect.states import decode_state, find_loader_states

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
