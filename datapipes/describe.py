"""Stable, readable descriptions of recipe arguments (for repr and fingerprints).

A description must be the same in every process and every run, so it never
contains memory addresses or ``hash()`` values, and it never reads a whole
dataset: data objects are described by type and length.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np
import torch

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def describe(value: Any) -> str:
    """A short description of a recipe argument that is stable across processes."""
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    if isinstance(value, functools.partial):
        args = [describe(value.func), *(describe(a) for a in value.args)]
        args += [f"{k}={describe(v)}" for k, v in value.keywords.items()]
        return f"partial({', '.join(args)})"
    if isinstance(value, range):
        return repr(value)
    if isinstance(value, np.ndarray | torch.Tensor):
        return f"<{type(value).__name__} shape={tuple(value.shape)} dtype={value.dtype}>"
    if isinstance(value, list | tuple) and all(isinstance(v, int | float) for v in value[:8]):
        if len(value) <= 8:
            return repr(list(value)) if isinstance(value, list) else repr(tuple(value))
    qualname = getattr(value, "__qualname__", None)
    if qualname is not None and callable(value):
        return qualname
    if hasattr(value, "__len__") and not callable(value):
        try:
            return f"<{type(value).__name__} of {len(value)}>"
        except TypeError:
            pass
    text = repr(value)
    if _ADDRESS.search(text) or len(text) > 200:
        return f"<{type(value).__name__}>"
    return text
