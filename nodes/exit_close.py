"""Nodes with threads or processes (and epoch runs), closed at exit while modules are intact.

A Loader's iterator abandoned mid-epoch and held by a module global is
finalized only as the interpreter clears module globals; closing a pool or
worker processes then calls functions already set to None, and Python prints
``Exception ignored in: <generator object Loader._run> ... TypeError:
'NoneType' object is not callable``. A node registers here while it holds
such resources; an ``atexit`` hook closes those still open, before the
teardown. Their ``close()`` is then a no-op that touches no module global.
A Loader's epoch runs (generators) register the same way.
"""

from __future__ import annotations

import atexit
import inspect
import weakref
from typing import Any

_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()


def close_at_exit(node: Any) -> None:
    """Have ``node.close()`` called at interpreter exit unless :func:`closed` is called first
    (or ``node`` is collected first: only a weak reference is kept)."""
    _OPEN.add(node)


def closed(node: Any) -> None:
    """``node`` released its threads or processes: nothing to do at exit."""
    _OPEN.discard(node)


@atexit.register
def _close_open_nodes() -> None:
    for node in list(_OPEN):
        try:
            node.close()
        except ValueError:  # a generator running in another thread: left to the interpreter
            if not inspect.isgenerator(node):
                raise
