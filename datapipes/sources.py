"""Where pipelines start: ranges, random-access sequences and iterables."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from datapipes.identity import described_data, plain
from datapipes.pipe import DataPipe
from nodes import Context, IterableNode, Node, SequenceNode
from nodes.sources import check_restartable, is_factory


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
    to resume.

    >>> import datapipes as dp
    >>> list(dp.Loader(dp.from_sequence(["a", "b"])))
    ['a', 'b']
    """
    return SequenceSource(seq)


class IterableSource(DataPipe[Any]):
    """Items of a re-iterable object (see :class:`nodes.IterableNode` for resume)."""

    name = "from_iterable"

    def __init__(self, source: Iterable[Any] | Callable[[], Iterable[Any]]) -> None:
        if not is_factory(source):
            check_restartable(source)
        super().__init__(args=(source,))

    def identity_params(self, names: bool) -> tuple[list[Any], dict[str, Any]]:
        source = self.args[0]
        return [plain(source, names) if callable(source) else described_data(source)], {}

    def _build(self, ctx: Context) -> Node[Any]:
        return IterableNode(self.args[0], ctx)

    def resume_caveat(self) -> str | None:
        size = hf_shuffle_buffer(self.args[0])
        if size is None:
            return None
        return (
            f"dp.from_iterable over a Hugging Face IterableDataset shuffled with a buffer of "
            f"{size} items: its resume is not exact (the dataset's state_dict does not hold "
            "its shuffle buffer, so a resume loses or repeats up to that many records). For "
            "an exact resume, shuffle in the recipe instead: dp.files(the same files)"
            f".shuffle().read_jsonl().shuffle(buffer_size={size}) (file order and records)."
        )


def hf_shuffle_buffer(source: Any) -> int | None:
    """The buffer size of a Hugging Face ``IterableDataset``'s ``.shuffle()``, else ``None``.

    Read off the chain of example iterables HF keeps (``_ex_iterable``, each wrapping the next
    as ``ex_iterable``), without importing ``datasets``.
    """
    node = getattr(source, "_ex_iterable", None)
    for _ in builtins.range(64):  # a chain, never a cycle; bounded all the same
        if node is None:
            return None
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return int(getattr(node, "buffer_size", 0)) or None
        node = getattr(node, "ex_iterable", None)
    return None


def from_iterable(source: Iterable[Any] | Callable[[], Iterable[Any]]) -> DataPipe[Any]:
    """Items of an iterable, or of the iterable a zero-argument function returns.

    Resume uses the object's own ``state_dict``/``load_state_dict`` when it
    has them; otherwise it replays: the object is iterated afresh and the
    items already seen are skipped (O(position); the object must yield the
    same items every time). It cannot be split across several consumers.

    >>> import datapipes as dp
    >>> list(dp.Loader(dp.from_iterable(lambda: (c for c in "ab"))))
    ['a', 'b']
    """
    return IterableSource(source)
