"""Where pipelines start: ranges and random-access sequences (iterables: steps.iterables)."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

from datapipes.identity import described_data
from datapipes.pipe import DataPipe
from nodes import Context, Node, SequenceNode


class SequenceSource(DataPipe[Any]):
    """Items ``seq[0], seq[1], ...`` of anything with ``__len__`` and ``__getitem__``."""

    name = "from_sequence"

    def __init__(self, seq: Sequence[Any]) -> None:
        if not (hasattr(seq, "__len__") and hasattr(seq, "__getitem__")):
            raise TypeError(
                f"from_sequence needs __len__ and __getitem__; {type(seq).__name__} lacks them. "
                "For a stream use dp.from_iterable(...)."
            )
        super().__init__(args=(seq,))

    def identity_params(self, names: bool) -> tuple[list[Any], dict[str, Any]]:
        return [described_data(self.args[0])], {}  # by type and length, not by contents

    def random_access(self) -> tuple[Sequence[Any], tuple[Callable[[Any], Any], ...]]:
        return self.args[0], ()

    def consumer_length(self, ctx: Context) -> int:
        return len(builtins.range(ctx.consumer_index, len(self.args[0]), ctx.num_consumers))

    def _build(self, ctx: Context) -> Node[Any]:
        return SequenceNode(self.args[0], ctx)


class RangeSource(SequenceSource):
    """Integers of a Python ``range``."""

    name = "range"

    def _own_args(self) -> str:
        values = self.args[0]
        if values.start == 0 and values.step == 1:
            return str(values.stop)
        step = f", {values.step}" if values.step != 1 else ""
        return f"{values.start}, {values.stop}{step}"


def range(start: int, stop: int | None = None, step: int = 1) -> DataPipe[int]:  # noqa: A001
    """Integers like Python's ``range``, dealt across consumers, O(1) to resume.

    >>> import datapipes as dp
    >>> list(dp.Loader(dp.range(2, 8, 2)))
    [2, 4, 6]
    """
    values = builtins.range(start) if stop is None else builtins.range(start, stop, step)
    return RangeSource(values)


def from_sequence(seq: Sequence[Any]) -> DataPipe[Any]:
    """Items of a list, numpy array, torch map-style ``Dataset`` or Hugging Face ``Dataset``.

    Random access makes it shardable by index, globally shuffleable and O(1)
    to resume. An object with ``__getitems__`` (a Hugging Face ``Dataset``, a torch
    ``Dataset`` that defines it) is read many items per call where ``DataLoader`` would:
    a ``batch`` right after it (or after plain maps) fetches each batch in one call; a
    Hugging Face ``Dataset`` is read 64 rows per call without a batch too. The items and
    their order are those of ``seq[i]``. ``__getitems__(indices)`` must return the list
    of the samples at ``indices``.

    >>> import datapipes as dp
    >>> list(dp.Loader(dp.from_sequence(["a", "b"])))
    ['a', 'b']
    """
    return SequenceSource(seq)
