"""A recipe's structural identity: what its fingerprint and its random streams derive from.

``repr`` is for people and may change its wording at will; the identity is
plain data built from the recipe's structure, and it is what makes a
recipe *the same recipe* in another process, run or project:

* every step's kind (``"map"``, ``"shuffle"``, ``"read_jsonl"``, ...), in
  order, with the nesting of combinator branches;
* every plain parameter (sizes, buffer sizes, ``drop_last``, weights,
  ``on_error``, explicit seeds, ``stop`` rules, device names, file patterns
  with HTTP query strings masked, storage options with credentials masked);
* data sources by type and length (a list, an array's shape and dtype, a
  ``range``'s bounds), never by their contents;
* functions and classes (``map(fn)``, ``collate_fn``, decoders,
  ``apply_node`` factories) by their qualified name, or not at all.

Two digests come out of it:

* :meth:`DataPipe.fingerprint` sees function names. A checkpoint is refused
  by a recipe that differs in any of the above, a renamed function included.
* the random key of every step (``DataPipe._key``: what global, buffer and
  file shuffles, ``mix`` and a custom node's ``ctx.random_key`` are seeded
  with, next to the seed, the epoch and the consumer) does not see function
  names, so renaming a mapped function, or rewording ``repr``, leaves every
  shuffle order as it was.

Neither sees what a function computes (an edited body with the same name
matches), the contents of a data source (another list of the same length
matches), or the bytes of the files a pattern names.

>>> import datapipes as dp
>>> identity(dp.range(4).map(abs))
{'step': 'map', 'args': [{'fn': 'abs'}], 'inputs': [{'step': 'range', 'args': [[0, 4, 1]]}]}
>>> identity(dp.range(4).map(abs), names=False)["args"]
['fn']
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe

#: Longer lists and tuples are data (described by type and length), shorter ones parameters.
MAX_LISTED = 64

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def identity(pipe: DataPipe[Any], *, names: bool = True) -> dict[str, Any]:
    """The structure of ``pipe`` and everything upstream of it, as plain data.

    ``names=False`` leaves out the names of functions and classes (the form
    random streams are keyed by).
    """
    node: dict[str, Any] = {"step": pipe.name}
    args, kwargs = pipe.identity_params(names)
    if args:
        node["args"] = args
    if kwargs:
        node["kwargs"] = kwargs
    if pipe.inputs:
        node["inputs"] = [identity(upstream, names=names) for upstream in pipe.inputs]
    return node


def digest(value: Any) -> str:
    """A sha256 hex digest of plain data, the same in every process (sorted keys)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def plain(value: Any, names: bool) -> Any:
    """A recipe argument as plain, process-independent data (see the module docstring)."""
    from datapipes.pipe import DataPipe  # pipe.py imports this module for its methods

    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, DataPipe):
        return identity(value, names=names)
    if isinstance(value, range):
        return [value.start, value.stop, value.step]
    if isinstance(value, np.ndarray | torch.Tensor):
        return {
            "array": type(value).__name__,
            "shape": list(value.shape),
            "dtype": str(value.dtype),
        }
    if isinstance(value, functools.partial):
        return {
            "partial": plain(value.func, names),
            "args": [plain(arg, names) for arg in value.args],
            "kwargs": {str(k): plain(v, names) for k, v in value.keywords.items()},
        }
    if isinstance(value, list | tuple) and len(value) <= MAX_LISTED:
        return [plain(item, names) for item in value]
    if isinstance(value, dict) and len(value) <= MAX_LISTED:
        return {str(k): plain(v, names) for k, v in value.items()}
    if callable(value):
        return {"fn": getattr(value, "__qualname__", type(value).__qualname__)} if names else "fn"
    return described_data(value)


def described_data(value: Any) -> Any:
    """A data object by type and length (never its contents), else a stable short repr.

    >>> described_data(["a", "b"]), described_data(range(3))
    ({'data': 'list', 'len': 2}, [0, 3, 1])
    """
    if isinstance(value, range):
        return [value.start, value.stop, value.step]
    if isinstance(value, np.ndarray | torch.Tensor):
        return plain(value, names=True)
    try:
        return {"data": type(value).__qualname__, "len": len(value)}
    except TypeError:
        pass
    text = repr(value)
    if _ADDRESS.search(text) or len(text) > 200:
        return {"object": type(value).__qualname__}
    return {"object": type(value).__qualname__, "repr": text}
