"""Pipelines that start from an iterable: generators' factories, torch and HF iterable datasets."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from datapipes.identity import described_data, plain
from datapipes.pipe import DataPipe
from nodes import Context, IterableNode, Node
from nodes.sources.hf_iterable import hf_shuffle_buffer
from nodes.sources.iterable import check_restartable, is_factory


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


def from_iterable(source: Iterable[Any] | Callable[[], Iterable[Any]]) -> DataPipe[Any]:
    """Items of an iterable, or of the iterable a zero-argument function returns.

    Resume uses the object's own ``state_dict``/``load_state_dict`` when it
    has them; otherwise it replays: the object is iterated afresh and the
    items already seen are skipped (O(position); the object must yield the
    same items every time). An object with ``set_epoch`` is told the epoch.

    Across several consumers (ranks x DataLoader workers), only datasets that
    split themselves are split here: a Hugging Face ``IterableDataset`` by its
    shards (``n_shards``; with fewer shards than consumers, every consumer keeps
    every n-th example, as HF's ``split_dataset_by_node`` does), and a torch
    ``IterableDataset`` that reads ``torch.utils.data.get_worker_info()``, which
    is shown consumer ``c`` of ``C`` as worker ``c`` of ``C``. Anything else is
    refused there: add ``.shard()`` after it (every consumer reads the whole
    stream, which the datasets above then also do, and keeps its n-th items).

    >>> import datapipes as dp
    >>> list(dp.Loader(dp.from_iterable(lambda: (c for c in "ab"))))
    ['a', 'b']
    """
    return IterableSource(source)
