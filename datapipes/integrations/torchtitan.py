"""A Loader as torchtitan's data loader: its checkpoints resume the data on any dp degree.

torchtitan asks a data loader for three things (its ``BaseDataLoader``): batches as
``(input_dict, labels)``, and ``state_dict()`` / ``load_state_dict()``, which its
checkpointer saves with ``torch.distributed.checkpoint`` (DCP) from every rank at
the same step. Its own loader keeps each data-parallel rank's state under a key of
its own and refuses another dp degree at a resume. :class:`TorchTitanLoader`
gathers every rank's state (a :class:`datapipes.TrainerLoader`) into one entry
that is the same on every rank, which DCP writes once; every rank reads it back,
on the same or another number of ranks, and resumes its share exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from datapipes.integrations.trainers import TrainerLoader
from datapipes.loader.loader import InvalidStateError, Loader

#: The one entry of a :class:`TorchTitanLoader`'s state: the gathered Loader state, as JSON
#: (one string: DCP keeps a value's structure, which changes as a position moves on).
STATE_KEY = "datapipes_loader"


def titan_batch(batch: Any) -> tuple[dict[str, Any], Any]:
    """A batch as torchtitan's trainer takes it: ``({"input": ..., "positions": ...}, labels)``.

    A ``pack()`` batch (``input_ids``, ``labels``, optional ``position_ids``) is
    split so; an ``(inputs, labels)`` pair passes through.
    """
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], Mapping):
        return dict(batch[0]), batch[1]
    if isinstance(batch, Mapping) and "input_ids" in batch and "labels" in batch:
        inputs = {"input": batch["input_ids"]}
        if "position_ids" in batch:
            inputs["positions"] = batch["position_ids"]
        return inputs, batch["labels"]
    raise TypeError(
        "torchtitan's trainer takes (input_dict, labels) batches; this batch is a "
        f"{type(batch).__name__} without input_ids and labels. End the recipe with "
        "pack(...).batch(...), or pass split=... to TorchTitanLoader"
    )


class TorchTitanLoader:
    """``loader`` as torchtitan's data loader (see the module doc).

    ``split`` makes each batch ``(input_dict, labels)`` (default
    :func:`titan_batch`). Build it in your ``dataloader.build(...)``, with the
    Loader's ``rank``/``world_size`` from torchtitan's ``dp_rank`` and
    ``dp_world_size``. Its ``state_dict()`` gathers every rank's position (a
    collective, as torchtitan's checkpoint is).

    >>> import datapipes as dp, torch
    >>> row = lambda i: {"input_ids": torch.tensor([i, i]), "labels": torch.tensor([i, 0])}
    >>> rows = [row(i) for i in range(4)]
    >>> recipe = dp.from_sequence(rows)
    >>> data = TorchTitanLoader(dp.Loader(recipe.batch(2)))
    >>> inputs, labels = next(iter(data))
    >>> inputs["input"].tolist(), labels.tolist()
    ([[0, 0], [1, 1]], [[0, 0], [1, 0]])
    """

    def __init__(self, loader: Loader, *, split: Callable[[Any], Any] = titan_batch) -> None:
        self.data = TrainerLoader(loader)
        self.split = split

    @property
    def loader(self) -> Loader:
        """The Loader it reads."""
        return self.data.loader

    def __iter__(self) -> Iterator[tuple[dict[str, Any], Any]]:
        return map(self.split, iter(self.data))

    def state_dict(self) -> dict[str, Any]:
        """``{STATE_KEY: JSON}``: every rank's position, the same on every rank."""
        return {STATE_KEY: json.dumps(self.data.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state :meth:`state_dict` made, on this or another number of ranks.

        An empty state (torchtitan's first run) changes nothing; anything else
        that is not such a state is an :class:`datapipes.InvalidStateError`.
        """
        if not state:
            return
        if not isinstance(state, Mapping) or not isinstance(state.get(STATE_KEY), str):
            raise InvalidStateError(
                "dataloader", f"{{{STATE_KEY!r}: the JSON text TorchTitanLoader saved}}", state
            )
        try:
            loaded = json.loads(state[STATE_KEY])
        except ValueError as error:
            raise InvalidStateError(
                f"dataloader.{STATE_KEY}", "JSON text", state[STATE_KEY][:80]
            ) from error
        self.data.load_state_dict(loaded)

    def close(self) -> None:
        """Close the Loader (its workers, files and threads)."""
        self.data.close()
