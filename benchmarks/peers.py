"""Peer implementations for ``compare.py`` that the single-workload scripts do not have.

Each function runs the work of ``overhead.py`` or ``jsonl_pipeline.py`` with
another library, calling the same step functions (``triple``, ``is_even``,
``features``, ``collate``, ...) imported from those scripts, so that only the
frameworks differ. Peers are imported inside the functions: a peer that is not
installed fails its own row only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jsonl_pipeline import BATCH, BUFFER, buffer_shuffle, collate, features, read_jsonl
from overhead import BATCH as INT_BATCH
from overhead import is_even, triple
from torch.utils.data import DataLoader, IterableDataset

import datapipes as dp
from nodes import default_collate


class Reiterable:
    """An iterable that calls ``fn(*args)`` for every new pass (a generator function's twin)."""

    def __init__(self, fn: Callable[..., Iterator[Any]], *args: Any) -> None:
        self.fn, self.args = fn, args

    def __iter__(self) -> Iterator[Any]:
        return self.fn(*self.args)


# ----- per-item overhead: map -> filter -> batch(256) -> collate over n ints ---------------
class Numbers(IterableDataset):
    """The mapped and filtered ints; the DataLoader batches and collates them."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return filter(is_even, map(triple, range(self.n)))


def torch_dataloader_ints(n: int) -> Iterator[Any]:
    # The natural use: the dataset yields items, the DataLoader's batch_size batches them.
    return iter(DataLoader(Numbers(n), batch_size=INT_BATCH, collate_fn=default_collate))


def grain_ints(n: int) -> Iterator[Any]:
    import grain

    # ReadOptions(num_threads=0) reads in the calling thread like every other contender;
    # grain's default (16 prefetch threads) measured ~500 us per item on 2 cores here.
    ds = grain.MapDataset.range(n).map(triple).filter(is_even)
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0))
    return iter(ds.batch(INT_BATCH, batch_fn=default_collate))


def hf_triple(row: dict[str, int]) -> dict[str, int]:
    return {"x": triple(row["x"])}


def hf_is_even(row: dict[str, int]) -> bool:
    return is_even(row["x"])


def hf_datasets_ints(n: int) -> Iterator[Any]:
    from datasets import Dataset

    # An in-memory Arrow table streamed as an IterableDataset: per-example map and filter
    # without the cache files a map-style Dataset.map writes; ds.batch gives {"x": [...]}.
    ds = Dataset.from_dict({"x": range(n)}).to_iterable_dataset()
    ds = ds.map(hf_triple).filter(hf_is_even).batch(INT_BATCH)
    return (default_collate(batch["x"]) for batch in ds)


# ----- JSONL: read -> json -> map -> shuffle -> batch -> collate --------------------------
def torchdata_nodes_jsonl_root(paths: list[str], shuffle: bool) -> Any:
    """IterableWrapper(file-reading generator) -> Mapper -> [shuffle] -> Batcher -> Mapper."""
    from torchdata.nodes import BaseNode, Batcher, IterableWrapper, Mapper

    class BufferShuffle(BaseNode):
        # torchdata.nodes 0.11 has no buffer shuffle; this custom node runs the same
        # reservoir shuffle as the other contenders. Its state is the source's only.
        def __init__(self, source: BaseNode, size: int, seed: int) -> None:
            super().__init__()
            self.source, self.size, self.seed = source, size, seed

        def reset(self, initial_state: dict | None = None) -> None:
            super().reset(initial_state)
            self.source.reset(initial_state["source"] if initial_state else None)
            self.items = buffer_shuffle(self.source, self.size, self.seed)

        def next(self) -> Any:
            return next(self.items)

        def get_state(self) -> dict:
            return {"source": self.source.state_dict()}

    node = Mapper(IterableWrapper(Reiterable(read_jsonl, paths)), features)
    if shuffle:
        node = BufferShuffle(node, BUFFER, seed=0)
    return Mapper(Batcher(node, batch_size=BATCH, drop_last=False), collate)


def torchdata_nodes_jsonl(paths: list[str], pattern: str) -> Iterator[Any]:
    from torchdata.nodes import Loader

    return iter(Loader(torchdata_nodes_jsonl_root(paths, shuffle=True)))


# ----- resume: read -> json -> map -> batch -> collate on one JSONL file -------------------
# Each returns a fresh loader with state_dict() / load_state_dict(); one item = one batch.
def datapipes_resumable(path: Path) -> Any:
    pipe = dp.files(str(path)).read_jsonl().map(features).batch(BATCH, collate_fn=collate)
    return dp.Loader(pipe, seed=0)


def torchdata_nodes_resumable(path: Path) -> Any:
    from torchdata.nodes import Loader

    # IterableWrapper over a plain generator restores by replaying the items it had read.
    return Loader(torchdata_nodes_jsonl_root([str(path)], shuffle=False))


def hf_datasets_resumable(path: Path) -> Any:
    from datasets import load_dataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = load_dataset("json", data_files=[str(path)], split="train", streaming=True)
    ds = ds.map(features, remove_columns=["text", "values"])
    return StatefulDataLoader(ds, batch_size=BATCH, collate_fn=collate)
