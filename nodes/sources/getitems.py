"""Fetching many items of a random-access source in one call (``__getitems__``).

A torch map-style ``Dataset`` may define ``__getitems__(indices)`` returning the list of
samples at ``indices`` (``torch.utils.data.DataLoader`` calls it for a whole batch), and a
Hugging Face ``datasets.Dataset`` has one that reads all the rows in one Arrow gather.
:class:`nodes.sources.sequence.SequenceNode` uses these helpers to fetch its items in chunks, and
:class:`nodes.sources.batched_fetch.FetchBatchNode` fetches a batch of such a source in one call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from nodes.steps.collate import _collate

#: Items a Hugging Face ``Dataset`` source fetches per call when no batch sets the size.
#: Measured on an HF Dataset in torch format (benchmarks/hf_batched_fetch.py
#: --fetch-sizes): per item, 16 costs about 60% more than 64 and 32 about 25% more,
#: 128 or 256 no less (one by one: 12x more); 64 keeps what a chunk holds in memory
#: (and what a resume may fetch again) to what a common batch holds.
FETCH_CHUNK = 64

Getter = Callable[[list[int]], Any]


def batched_getter(seq: Any) -> Getter | None:
    """``seq.__getitems__`` if ``seq`` has a callable one (the check DataLoader makes)."""
    getitems = getattr(seq, "__getitems__", None)
    return getitems if callable(getitems) else None


def fetch_items(getitems: Getter, keys: list[int], seq: Any) -> list[Any]:
    """``getitems(keys)``, checked: one item per index, as a list."""
    items = getitems(keys)
    if not isinstance(items, list | tuple):
        raise TypeError(
            f"{type(seq).__name__}.__getitems__ returned a {type(items).__name__}, but it must "
            f"return a list with the sample at each index (torch's Dataset.__getitems__ "
            "contract). Return a list, or remove __getitems__ to fetch items one by one."
        )
    if len(items) != len(keys):
        raise ValueError(
            f"{type(seq).__name__}.__getitems__ returned {len(items)} items for {len(keys)} "
            f"indices (the first: {keys[:5]}); it must return exactly one sample per index, "
            "in order. Fix __getitems__, or remove it to fetch items one by one."
        )
    return items if isinstance(items, list) else list(items)


def column_getter(seq: Any) -> Getter | None:
    """``seq.__getitem__`` for a Hugging Face ``datasets.Dataset`` (not a subclass that
    changes how items are read): given a list of indices it returns the batch as columns,
    which is what its own ``__getitems__`` reads before splitting it into rows."""
    datasets = sys.modules.get("datasets")  # loaded if seq is one of its datasets
    hf_dataset = getattr(datasets, "Dataset", None)
    if hf_dataset is None or not isinstance(seq, hf_dataset):
        return None
    kind = type(seq)
    if kind.__getitem__ is not hf_dataset.__getitem__:
        return None
    if kind.__getitems__ is not hf_dataset.__getitems__:
        return None
    return seq.__getitem__


#: Hugging Face formats whose rows ``ds[i]`` are the rows of a batch ``ds[keys]`` (dicts);
#: pandas, arrow, polars, ... rows are tables of one row.
_ROW_FORMATS = frozenset({None, "python", "numpy", "np", "torch", "pt", "custom"})


def rows_are_split_columns(seq: Any) -> bool:
    """Whether a Hugging Face ``Dataset``'s row ``seq[i]`` is row ``i`` of the dict of
    columns ``seq[keys]`` (its format gives dicts), so rows may be read many at a time."""
    fmt = getattr(seq, "format", None)
    return isinstance(fmt, Mapping) and fmt.get("type") in _ROW_FORMATS


def _are_columns(columns: Any, count: int) -> bool:
    """Whether ``columns`` is a dict of columns of ``count`` rows each."""
    if not isinstance(columns, Mapping) or not columns:
        return False
    try:
        return all(len(column) == count for column in columns.values())
    except TypeError:  # an unsized value (a number, a 0-d tensor or array)
        return False


def rows_of(columns: Any, count: int) -> list[dict[str, Any]] | None:
    """The rows ``{name: column[i]}`` of a dict of columns of ``count`` rows (``None`` when
    ``columns`` is not one), as the Hugging Face ``Dataset.__getitems__`` splits them, except
    that a tensor column's rows are copies: each owns its memory, as ``ds[i]`` gives it,
    rather than a view that would keep the whole chunk alive and cross from a worker
    process through shared memory (a file descriptor per tensor) instead of inline."""
    if not _are_columns(columns, count):
        return None
    names = list(columns)
    split = [
        [row.clone() for row in column] if isinstance(column, torch.Tensor) else column
        for column in columns.values()
    ]
    return [dict(zip(names, values)) for values in zip(*split)]


def collate_columns(columns: Any, count: int) -> Any:
    """``default_collate`` of the rows of ``columns`` (a dict of columns of ``count`` rows),
    computed from the columns; ``None`` when they are not such a dict.

    The rows would be ``{name: column[i]}``; collating them stacks each column back, so a
    tensor column is already its own collated form. Other columns go through the same
    collation as rows would (lists of numbers become tensors, strings stay lists, ...).
    """
    if not _are_columns(columns, count):
        return None
    batch = {}
    for name, column in columns.items():
        if isinstance(column, torch.Tensor) and column.dim() > 0:
            batch[name] = column.contiguous()  # torch.stack of its rows, without the split
        else:
            rows = column if isinstance(column, list) else list(column)
            batch[name] = _collate(rows, f"[{name!r}]")
    return batch
