"""Every use of numpy's and Hugging Face ``datasets``' private names, in one place.

Neither library offers a public API for what follows, so this module reads private
names, and nothing else in datapipes or nodes does (torch's are in
:mod:`nodes.adapters.torchdata` and :mod:`nodes.adapters.torch`):

- numpy's ``_read_array_header`` (in ``numpy.lib._format_impl`` since numpy 2, in
  ``numpy.lib.format`` before): the only reader of a version 3.0 ``.npy`` header
  (utf-8 field names) (:func:`read_npy_header_3_0`);
- on a ``datasets.IterableDataset``, ``_ex_iterable``: the chain of example
  iterables it reads through (each internal one wrapping the next as
  ``ex_iterable``; a ``BufferShuffledExamplesIterable`` has ``buffer_size``), for
  the buffer of its ``.shuffle()`` (:func:`hf_example_iterables`,
  :func:`hf_buffer_shuffle_size`);
- on a ``datasets.IterableDataset``, ``_distributed``: the ``rank``,
  ``world_size`` and ``strategy`` of a ``split_dataset_by_node`` already applied
  (:func:`hf_split`); both attributes also tell an HF dataset (:func:`is_hf_like`).

``datasets`` is never imported here: its objects are read as they come.

Checked against numpy 2.4 and datasets 5.2. ``tests/adapters/test_third_party_adapter.py``
uses each against a real ``.npy`` file and a real HF ``IterableDataset``, and fails
naming the name when a release changes it; update this module then.
"""

from __future__ import annotations

import builtins
from typing import Any, NamedTuple

from numpy.lib import format as npformat

_read_array_header = getattr(npformat, "_read_array_header", None)
if _read_array_header is None:  # numpy >= 2 moved it
    from numpy.lib import _format_impl

    _read_array_header = getattr(_format_impl, "_read_array_header", None)


def read_npy_header_3_0(f: Any) -> tuple[tuple[int, ...], bool, Any]:
    """``(shape, fortran order, dtype)`` of a version 3.0 ``.npy`` header, ``f`` just past
    its magic string. Raises ``ValueError`` when this numpy cannot read one."""
    if _read_array_header is None:
        raise ValueError("unsupported .npy format version 3.0 (this numpy has no reader for it)")
    return _read_array_header(f, (3, 0))


def is_hf_like(source: Any) -> bool:
    """Whether ``source`` has the private attributes read here off an HF ``IterableDataset``."""
    return hasattr(source, "_ex_iterable") and hasattr(source, "_distributed")


def hf_example_iterables(source: Any) -> list[Any]:
    """The example iterables an HF ``IterableDataset`` reads through, outermost first."""
    chain = []
    node = getattr(source, "_ex_iterable", None)
    for _ in builtins.range(64):  # a chain, never a cycle; bounded all the same
        if node is None:
            break
        chain.append(node)
        node = getattr(node, "ex_iterable", None)
    return chain


def hf_buffer_shuffle_size(example_iterable: Any) -> int | None:
    """The buffer size of an HF example iterable that shuffles by a buffer, else ``None``."""
    if type(example_iterable).__name__ != "BufferShuffledExamplesIterable":
        return None
    return int(getattr(example_iterable, "buffer_size", 0)) or None


class HFSplit(NamedTuple):
    """A ``split_dataset_by_node(ds, rank, world_size)`` applied to an HF dataset."""

    rank: int
    world_size: int
    strategy: str


def hf_split(source: Any) -> HFSplit | None:
    """How ``split_dataset_by_node`` split HF ``IterableDataset`` ``source`` (``None``: not)."""
    split = source._distributed
    if split is None:
        return None
    return HFSplit(split.rank, split.world_size, split.strategy)
