"""Turning a list of samples into a batch: tensors where the data allows, lists elsewhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from nodes.workers.handover import shared_batch, wants_shared_batch

_NUMBER_TYPES = (bool, int, float)


def default_collate(samples: list[Any]) -> Any:
    """Collate a list of samples into a batch.

    * Python numbers become one tensor (ints: int64, floats: float64, bools: bool).
    * Same-shaped numpy arrays and numpy scalars are stacked by numpy in one C
      call and wrapped without a copy; same-shaped tensors go through ``torch.stack``.
    * Dicts, tuples, lists and namedtuples are collated field by field.
    * Strings, bytes, ``None`` and unknown objects stay a list.

    In a DataLoader worker, same-shaped tensors or arrays over 512 KiB in all
    (``nodes.workers.handover.INLINE_TENSOR_BYTES``) are stacked straight into shared
    memory, so the batch reaches the main process without another copy
    (see :func:`nodes.workers.handover.shared_batch`); the values are the same.

    Arrays or tensors of different shapes raise an error naming the field;
    pass ``collate_fn`` to ``batch`` to pad them or keep them as a list. A field
    named ``cu_seqlens`` (the segment bounds of packed sequences, see
    :mod:`nodes.steps.pack`) becomes the bounds of the sequences end to end (int32),
    the form variable-length attention takes for the whole batch.

    >>> default_collate([{"x": 1, "y": "a"}, {"x": 2, "y": "b"}])
    {'x': tensor([1, 2]), 'y': ['a', 'b']}
    """
    return _collate(samples, "")


def no_collate(samples: list[Any]) -> list[Any]:
    """Leave the batch as the list of samples."""
    return samples


def _collate(samples: list[Any], path: str) -> Any:
    first = samples[0]
    if type(first) in _NUMBER_TYPES:
        array = np.array(samples)
        if array.dtype == object:
            return torch.tensor(samples)
        return torch.from_numpy(array)
    if isinstance(first, torch.Tensor):
        _check_same_shape(samples, path)
        out = _shared_out_for_tensors(samples)
        return torch.stack(samples) if out is None else torch.stack(samples, out=out)
    if isinstance(first, np.ndarray | np.generic):
        if first.dtype.kind in "OUSV":
            return list(samples)
        _check_same_shape(samples, path)
        if isinstance(first, np.generic):
            return torch.from_numpy(np.array(samples))
        out = _shared_out_for_arrays(samples)
        if out is not None:
            np.stack(samples, out=out.numpy())
            return out
        return torch.from_numpy(np.stack(samples))
    if isinstance(first, str | bytes) or first is None:
        return list(samples)
    if isinstance(first, Mapping):
        return {
            key: _collate_cu_seqlens([s[key] for s in samples])
            if key == "cu_seqlens"
            else _collate([s[key] for s in samples], f"{path}[{key!r}]")
            for key in first
        }
    if isinstance(first, tuple | list):
        width = len(first)
        if any(len(s) != width for s in samples):
            raise ValueError(
                f"default_collate: samples{path} have different lengths "
                f"({sorted({len(s) for s in samples})}); pass collate_fn= to batch() "
                "to handle variable-length sequences."
            )
        columns = [_collate(list(column), f"{path}[{i}]") for i, column in enumerate(zip(*samples))]
        if hasattr(first, "_fields"):
            return type(first)(*columns)
        return tuple(columns) if isinstance(first, tuple) else columns
    if type(first).__module__.startswith("PIL."):  # torch's default_collate refuses them too
        raise TypeError(
            f"default_collate: samples{path} are PIL images, which do not stack into a "
            "tensor. Decode them to arrays first (.decode(image='chw' or 'hwc'), or for a "
            "Hugging Face Dataset .with_format('torch')), map a transform that returns "
            "tensors (torchvision's to_tensor), or keep the list: batch(..., "
            "collate_fn=dp.no_collate)."
        )
    return list(samples)


def _collate_cu_seqlens(samples: list[Any]) -> torch.Tensor:
    """Packed sequences' segment bounds as one batch's: the sequences end to end, as
    variable-length attention takes them (``flash_attn_varlen_func``'s ``cu_seqlens``)."""
    bounds = [np.asarray(s, dtype=np.int64).reshape(-1) for s in samples]
    shift = 0
    parts = [np.zeros(1, dtype=np.int64)]
    for b in bounds:
        if len(b) < 2 or b[0] != 0 or np.any(np.diff(b) < 0):
            raise ValueError(
                "default_collate: a 'cu_seqlens' field must hold segment bounds [0, ..., n] "
                f"(increasing from 0), got {b.tolist()[:8]}"
            )
        parts.append(b[1:] + shift)
        shift += int(b[-1])
    return torch.from_numpy(np.concatenate(parts).astype(np.int32))


def _check_same_shape(samples: list[Any], path: str) -> None:
    shape = samples[0].shape
    for sample in samples:
        if sample.shape != shape:
            shapes = sorted({tuple(s.shape) for s in samples})
            where = f" in field samples{path}" if path else ""
            raise ValueError(
                f"default_collate cannot stack arrays of different shapes {shapes}{where}. "
                "Pass collate_fn= to batch() to pad them (or dp.no_collate to keep a list)."
            )


def _shared_out_for_tensors(samples: list[Any]) -> torch.Tensor | None:
    """Where to stack ``samples`` in a worker: shared memory, when all are plain CPU tensors
    of one dtype that torch.stack would stack as they are (else ordinary memory)."""
    first = samples[0]
    if (
        type(first) is not torch.Tensor  # a subclass keeps its own stack
        or first.device.type != "cpu"
        or first.layout != torch.strided
        or first.requires_grad  # stack(out=...) does not record gradients
        or not wants_shared_batch(first.nbytes * len(samples))  # checked before the loop
    ):
        return None
    dtype = first.dtype
    if any(type(s) is not torch.Tensor or s.dtype != dtype or s.requires_grad for s in samples):
        return None  # mixed: stack promotes the dtype, grad, or device checks as it always did
    return shared_batch((len(samples), *first.shape), dtype)


def _shared_out_for_arrays(samples: list[Any]) -> torch.Tensor | None:
    """Where to stack same-shaped arrays of one native dtype in a worker: shared memory."""
    first = samples[0]
    if not wants_shared_batch(first.nbytes * len(samples)):
        return None
    dtype = first.dtype
    if any(not isinstance(s, np.ndarray) or s.dtype != dtype for s in samples):
        return None  # mixed: np.stack promotes as it always did
    try:
        torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:  # a dtype torch has no match for: the ordinary path reports it
        return None
    return shared_batch((len(samples), *first.shape), torch_dtype)
