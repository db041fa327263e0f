"""Random transforms that resume exactly: ``fn(item, rng)`` with a per-item seeded RNG.

Each item's randomness is a pure function of (seed, epoch, the step's place in
the recipe, the item's *origin*: where in the epoch's data it came from, the
same on every topology). So an item gets the same draws at any number of
DataLoader workers and ranks, after a resume and in a new process, and new
ones in a new epoch. Nothing is kept between items, so the node is
transparent: its state is its input's.

The origin is asked of the input after each item, through the call its
:meth:`nodes.Node.origin_reader` returns (see :mod:`nodes.origins`): sources
know it (:meth:`nodes.Node.last_origin`), steps that hand items on one for one
pass it through, a buffer shuffle and a ``flat_map`` note it beside the items
they hold (``track_origins``), a batch has its last item's. Steps that read
ahead on a thread or in processes (``prefetch``, a parallel map, DataLoader
workers) cannot say which item they returned: a ``random_map`` above them is
refused when the graph is built, saying where to put it.
"""

from __future__ import annotations

import hashlib
import random
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nodes.base import Node, State
from nodes.context import Context
from nodes.origins import OriginReader
from nodes.origins import RandomMapError as RandomMapError  # its error, where users look
from nodes.rng import stable_hash
from nodes.steps.transforms import StatelessStep

_MASK64 = (1 << 64) - 1
_TOP_BIT = 1 << 63


#: The global RNGs ``global_rng=True`` seeds per item and restores after it.
GLOBAL_RNGS = ("torch", "random", "numpy")


def global_rngs(value: bool | str | Sequence[str]) -> tuple[str, ...]:
    """The global RNGs a ``global_rng`` argument names: ``True`` all, ``False`` none.

    >>> global_rngs(True), global_rngs("torch"), global_rngs(["numpy", "torch"])
    (('torch', 'random', 'numpy'), ('torch',), ('torch', 'numpy'))
    >>> global_rngs("torch,numpy")
    ('torch', 'numpy')
    """
    if value is True or value is False:
        return GLOBAL_RNGS if value else ()
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, Sequence) or not names or not set(names) <= set(GLOBAL_RNGS):
        raise ValueError(
            f"random_map global_rng must be True, False, or some of {list(GLOBAL_RNGS)} "
            f"(the global RNGs to seed per item), got {value!r}"
        )
    return tuple(name for name in GLOBAL_RNGS if name in names)


class RandomMapNode(StatelessStep):
    """``fn(item, rng)`` (or ``fn(item)`` under seeded global RNGs) for every item.

    ``rng`` is a ``numpy.random.Generator`` over a Philox counter-based bit
    generator: its key comes from (seed, epoch, ``key``: the step's place),
    the upper two words of its counter from the item's origin and the lower
    two count the draws, so every item has its own stream (2**128 draws before
    it could meet another's). One bit generator is re-keyed per item (a state
    assignment, where making a new one costs 10-20 us); an ``fn`` that keeps
    ``rng`` (or its bit generator) after returning keeps that stream to
    itself: the node then makes a new bit generator for the next items.
    Measured on 2 busy cores: about 4.5 us per item over a plain ``map``.

    With ``global_rng=True``, ``fn(item)`` runs with torch's CPU RNG, Python's
    ``random`` and numpy's legacy global RNG seeded from the item's stream, and
    all three are restored afterwards: unmodified transforms that draw from
    ``torch.rand``, ``random.random`` or ``np.random.rand`` become reproducible,
    and the caller's global RNG states are as they were (CUDA's RNG is not
    touched: draw on the CPU). ``global_rng="torch"`` (or some of
    ``"torch,random,numpy"``) manages only those. Measured per item: about
    160 us for all three, most of it saving and restoring numpy's legacy state;
    8 us for ``"torch"``, 30 us for ``"torch,random"``. The swap is
    process-wide, so run the step on the thread that owns the RNGs (a warning
    says when it runs on another thread outside a DataLoader worker).

    State: its input's (it holds nothing between items).
    """

    kind = "random_map"
    elastic = "transparent"

    def __init__(
        self,
        upstream: Node,
        fn: Callable[..., Any],
        ctx: Context,
        key: int,
        *,
        seed: int | None = None,
        global_rng: bool | str | Sequence[str] = False,
    ) -> None:
        super().__init__(upstream, fn)
        self._ctx = ctx
        self._key = key
        self._seed = seed
        names = global_rngs(global_rng)
        self._global = bool(names)
        self._globals = tuple(name in names for name in GLOBAL_RNGS)
        # Refused here, when the graph is built, rather than at the first item.
        self._origin = upstream.origin_reader()
        self._places: dict[Any, int] = {}
        self._bg = np.random.Philox(key=[0, 0])
        self._counter = np.zeros(4, dtype=np.uint64)
        self._rng_refs, self._bg_refs = self._count_references()
        self._warned_thread = False

    def origin_reader(self) -> OriginReader:
        return self._origin  # the same item, so the same origin: a random_map above asks it

    def reset(self, state: State | None = None) -> None:
        self._up.reset(state)
        # The epoch (and a repeat round's scope) is read here: every epoch draws anew.
        entropy = self._ctx.random_key(self._key, seed=self._seed)
        words = np.random.SeedSequence([int(k) & _MASK64 for k in entropy]).generate_state(
            2, np.uint64
        )
        self._philox_key = words
        call = self._call_global if self._global else self._call
        self._it = map(call, iter(self._up))

    # ----- the per-item RNG -----------------------------------------------------------------
    def _seeded(self) -> np.random.BitGenerator:
        """The bit generator, keyed for the item just read from the input."""
        origin = self._origin()
        counter = self._counter
        if len(origin) == 2 and type(origin[1]) is int and 0 <= origin[1] <= _MASK64:
            place = self._places.get(origin[0])
            if place is None:
                place = self._places[origin[0]] = stable_hash(repr(origin[0]))
            counter[2], counter[3] = origin[1], place  # a position: no hash, no collision
        else:
            digest = hashlib.blake2b(repr(origin).encode(), digest_size=16).digest()
            counter[2] = int.from_bytes(digest[:8], "little")
            counter[3] = int.from_bytes(digest[8:], "little") | _TOP_BIT  # never a position's
        bg = self._bg
        bg.state = {
            "bit_generator": "Philox",
            "state": {"counter": counter, "key": self._philox_key},
            "buffer": counter,  # ignored: buffer_pos 4 says the buffer is empty
            "buffer_pos": 4,
            "has_uint32": 0,
            "uinteger": 0,
        }
        return bg

    def _call(self, item: Any) -> Any:
        bg = self._seeded()
        rng = np.random.Generator(bg)
        out = self._fn(item, rng)
        if sys.getrefcount(rng) > self._rng_refs or sys.getrefcount(bg) > self._bg_refs:
            self._bg = np.random.Philox(key=[0, 0])  # fn kept it: leave that stream alone
        return out

    def _count_references(self) -> tuple[int, int]:
        """The reference counts ``_call`` sees when ``fn`` keeps nothing (measured, as
        interpreters count references to locals differently): rng's, and its bit
        generator's (this node, the local, the rng, the call's argument)."""
        bg = self._bg
        rng = np.random.Generator(bg)
        _keep_nothing(None, rng)
        return sys.getrefcount(rng), sys.getrefcount(bg)

    def _call_global(self, item: Any) -> Any:
        import torch  # only this mode needs it

        if threading.current_thread() is not threading.main_thread():
            self._warn_thread()
        seeds = self._seeded().random_raw(3)
        use_torch, use_random, use_numpy = self._globals
        # numpy's legacy state is the dear one (about 50 us to read, as much to write).
        torch_state = torch.get_rng_state() if use_torch else None
        python_state = random.getstate() if use_random else None
        numpy_state = np.random.get_state(legacy=False) if use_numpy else None
        try:
            if use_torch:
                torch.default_generator.manual_seed(int(seeds[0]))  # the CPU generator only
            if use_random:
                random.seed(int(seeds[1]))
            if use_numpy:
                np.random.seed(seeds[2:3].view(np.uint32))
            return self._fn(item)
        finally:
            if use_torch:
                torch.set_rng_state(torch_state)
            if use_random:
                random.setstate(python_state)
            if use_numpy:
                np.random.set_state(numpy_state)

    def _warn_thread(self) -> None:
        if self._warned_thread:
            return
        from torch.utils.data import get_worker_info

        if get_worker_info() is None:  # a DataLoader worker's threads draw nothing else
            self._warned_thread = True
            warnings.warn(
                "random_map(global_rng=True) runs on a background thread (a .prefetch() or "
                "a thread pool after it?) of a process whose other threads may draw from the "
                "same global RNGs (dropout in the training loop): their draws can then "
                "interleave with the item's. Use fn(item, rng) (global_rng=False), "
                "num_workers >= 1, or no background thread after the step.",
                RuntimeWarning,
                stacklevel=2,
            )


def _keep_nothing(item: Any, rng: np.random.Generator) -> Any:
    return item
