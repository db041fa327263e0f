"""Pipelines that start from an iterable: generators' factories, torch and HF iterable datasets."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from typing import Any

from datapipes.identity import described_data, plain
from datapipes.pipe import DataPipe
from nodes import Context, IterableNode, Node
from nodes.iterable import check_restartable, is_factory


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
