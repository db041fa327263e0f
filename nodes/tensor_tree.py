"""A function applied to every tensor of a nested item, the item's containers kept.

Used where tensors move (``to_device``, ``pin_memory``) and where batches are
handed from the workers (:mod:`nodes.workers.handover`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch


def _tuple_like(item: tuple[Any, ...], values: list[Any]) -> tuple[Any, ...]:
    """A tuple subclass instance holding ``values``, whatever its constructor takes."""
    try:
        out = tuple.__new__(type(item), values)
    except TypeError:  # a struct sequence (torch.return_types.max, os.stat_result, ...)
        return type(item)(values)
    if getattr(item, "__dict__", None):
        out.__dict__.update(item.__dict__)
    return out


#: Values that hold no tensor: returned as they are without a look inside. A list or tuple of
#: only these (a batch's texts or ids) is skipped whole at C speed: a worker prepares every
#: item it sends with this walk, and one Python call per string cost a JSONL batch of 256
#: records as much as reading them. (``nodes.workers.bundles.item_bytes`` weighs them alike.)
PLAIN_VALUES = frozenset({str, bytes, int, float, bool, complex, type(None)})


def apply_to_tensors(item: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``item`` with ``fn`` applied to every tensor in it (dicts, lists, tuples, dataclasses).

    Containers keep their type (dict and list subclasses are copied, named
    tuples and dataclasses rebuilt); a container in which nothing changed is
    returned as it is, and anything else is returned as is.

    >>> apply_to_tensors({"x": torch.zeros(2), "id": 3}, lambda t: t + 1)
    {'x': tensor([1., 1.]), 'id': 3}
    """
    if type(item) in PLAIN_VALUES:
        return item
    if isinstance(item, torch.Tensor):
        return fn(item)
    if isinstance(item, dict):
        values = {k: apply_to_tensors(v, fn) for k, v in item.items()}
        if all(values[k] is v for k, v in item.items()):
            return item
        if type(item) is dict:
            return values
        out = copy.copy(item)  # OrderedDict, defaultdict, ...: a copy keeps type and extras
        out.update(values)
        return out
    if isinstance(item, list | tuple):
        if set(map(type, item)) <= PLAIN_VALUES:
            return item
        new = [apply_to_tensors(v, fn) for v in item]
        if all(a is b for a, b in zip(new, item)):
            return item
        if type(item) is list:
            return new
        if isinstance(item, list):
            out = copy.copy(item)
            out[:] = new
            return out
        if type(item) is tuple:
            return tuple(new)
        if hasattr(item, "_fields"):  # a named tuple
            return type(item)(*new)
        return _tuple_like(item, new)
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        changed = {
            f.name: apply_to_tensors(getattr(item, f.name), fn) for f in dataclasses.fields(item)
        }
        if all(value is getattr(item, name) for name, value in changed.items()):
            return item
        # A copy with its fields set directly: works for frozen and init=False fields too.
        out = copy.copy(item)
        for name, value in changed.items():
            object.__setattr__(out, name, value)
        return out
    return item
