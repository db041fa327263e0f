"""Turning a list of samples into a batch: tensors where the data allows, lists elsewhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

_NUMBER_TYPES = (bool, int, float)


def default_collate(samples: list[Any]) -> Any:
    """Collate a list of samples into a batch.

    * Python numbers become one tensor (ints: int64, floats: float64, bools: bool).
    * Same-shaped numpy arrays and numpy scalars are stacked by numpy in one C
      call and wrapped without a copy; same-shaped tensors go through ``torch.stack``.
    * Dicts, tuples, lists and namedtuples are collated field by field.
    * Strings, bytes, ``None`` and unknown objects stay a list.

    Arrays or tensors of different shapes raise an error naming the field;
    pass ``collate_fn`` to ``batch`` to pad them or keep them as a list.

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
        return torch.stack(samples)
    if isinstance(first, np.ndarray | np.generic):
        if first.dtype.kind in "OUSV":
            return list(samples)
        _check_same_shape(samples, path)
        stacked = np.stack(samples) if isinstance(first, np.ndarray) else np.array(samples)
        return torch.from_numpy(stacked)
    if isinstance(first, str | bytes) or first is None:
        return list(samples)
    if isinstance(first, Mapping):
        return {key: _collate([s[key] for s in samples], f"{path}[{key!r}]") for key in first}
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
