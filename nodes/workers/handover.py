"""How items cross from a DataLoader worker to the main process: small tensors inline,
large batches collated straight into shared memory.

torch sends every tensor a worker returns through shared memory: a file
descriptor passed over a socket and a mapping on each side. For small
tensors that costs more than copying their bytes inside the pickled item,
so a Loader's workers pack those (:func:`inline_small_tensors`) and the main
process unpickles ordinary tensors. A large tensor made in ordinary memory is
copied into shared memory when it is pickled; a batch collated in a worker
is therefore stacked into shared memory from the start (:func:`shared_batch`),
so it crosses with no copy at all.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
import torch.utils.data

from nodes.adapters.torchdata import new_shared_storage
from nodes.tensor_tree import apply_to_tensors

#: Tensors up to this size travel from a worker inside the pickled item. Larger ones
#: go through shared memory, as torch sends every tensor: a file descriptor passed over
#: a socket and a mapping on each side, which costs more than copying small data.
#: Measured on 2 cores, per tensor: 16 KiB 0.74 ms shared vs 0.29 ms inline; 128 KiB
#: 0.92 vs 0.43 ms; 1 MiB 3.1 vs 3.2 ms; 4 MiB 4.3 vs 8.4 ms.
INLINE_TENSOR_BYTES = 512 * 1024

_NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)


def _tensor_from_array(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


class _InlineTensor:
    """A small tensor that pickles as its bytes and unpickles as a tensor again."""

    __slots__ = ("array",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.array = tensor.numpy()

    def __reduce__(self) -> tuple[Any, ...]:
        return _tensor_from_array, (self.array,)


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _can_inline(tensor: torch.Tensor) -> bool:
    """A plain, small, contiguous CPU tensor that is the whole of its storage."""
    return (
        type(tensor) is torch.Tensor  # subclasses (Parameter, ...) keep torch's own path
        and tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and tensor.dtype in _NUMPY_DTYPES
        and tensor.nbytes <= INLINE_TENSOR_BYTES
        and not tensor.requires_grad
        and not tensor.is_conj()
        and not tensor.is_neg()
        and tensor.stride() == _contiguous_strides(tensor.shape)  # size-1 dims too
        and tensor.storage_offset() == 0
        and tensor.nbytes == tensor.untyped_storage().nbytes()
    )


def inline_small_tensors(item: Any) -> Any:
    """``item`` prepared to leave a worker: small CPU tensors travel inside its pickle.

    The main process receives ordinary tensors with the same dtype, shape,
    strides and values. Only a contiguous tensor that is the whole of its
    storage, and the only tensor of the item on that storage, is sent inline:
    views, tensors sharing storage (which must still share it on arrival) and
    tensors over ``INLINE_TENSOR_BYTES`` take torch's shared-memory path.
    Containers keep their types (see :func:`nodes.apply_to_tensors`).
    """
    storages: dict[int, int] = {}

    def count(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "cpu" and tensor.layout == torch.strided:
            key = tensor.untyped_storage().data_ptr()
            storages[key] = storages.get(key, 0) + 1
        return tensor

    def inline(tensor: torch.Tensor) -> Any:
        if _can_inline(tensor) and storages.get(tensor.untyped_storage().data_ptr()) == 1:
            return _InlineTensor(tensor)
        return tensor

    apply_to_tensors(item, count)
    try:
        return apply_to_tensors(item, inline)
    except TypeError:  # a container type that cannot be rebuilt: torch's path for all of it
        return item


#: At most this many batches made by :func:`shared_batch` live at once in one worker; more
#: are made in ordinary memory (copied when sent, as before). Each holds a file descriptor
#: until it is freed, and a recipe that keeps many batches in the worker (``batch()`` then
#: ``shuffle()``) would otherwise run into the open-file limit (often 1,024).
MAX_LIVE_SHARED_BATCHES = 64

_live_shared_batches = 0


def _shared_batch_freed() -> None:
    global _live_shared_batches
    _live_shared_batches -= 1


def wants_shared_batch(nbytes: int) -> bool:
    """Whether a batch of ``nbytes`` collated here should be made in shared memory: in a
    DataLoader worker, over ``INLINE_TENSOR_BYTES`` (smaller ones travel inside the pickle),
    while fewer than ``MAX_LIVE_SHARED_BATCHES`` are alive."""
    return (
        nbytes > INLINE_TENSOR_BYTES
        and _live_shared_batches < MAX_LIVE_SHARED_BATCHES
        and torch.utils.data.get_worker_info() is not None
    )


def shared_batch(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """An empty CPU tensor of ``shape`` in shared memory, to collate a batch into, when
    this is a DataLoader worker and the batch is too large to travel inline; else ``None``.

    torch pickles a tensor in ordinary memory by first copying it into shared
    memory; one allocated there is sent as it is (a file descriptor), so the
    batch's bytes are written once, by the collate. The main process receives
    a tensor backed by that shared memory, as before: ordinary in every way
    but ``resize_`` to a larger size (torch's ``DataLoader`` batches are the same).
    """
    count = 1
    for size in shape:
        count *= size
    nbytes = count * dtype.itemsize
    if not wants_shared_batch(nbytes):
        return None  # in the main process nothing crosses: ordinary memory is cheaper
    global _live_shared_batches
    storage = new_shared_storage(nbytes)
    batch = torch.empty(0, dtype=dtype).set_(storage, 0, shape)
    _live_shared_batches += 1
    weakref.finalize(batch, _shared_batch_freed)  # sent or dropped: another may be made
    return batch
