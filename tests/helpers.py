"""Helpers that several test modules share: comparing items and records, and one recipe with
every kind of step. (Module level, so DataLoader workers and process pools can pickle them.)"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import datapipes as dp
from datapipes.dispatch.dynamic import private_file_store
from nodes import Node, UniformStream
from nodes.testing import same

# ----- a store for dynamic dispatch with worker processes -------------------------------------


def file_store() -> dist.FileStore:
    """A store that in-process ranks share and their DataLoader workers reach by its path
    (the one-rank Loader's own kind, see ``datapipes.dispatch.dynamic.private_file_store``). Not a
    ``TCPStore`` hosted in this process: a worker forked while its server thread resolves a
    client's name inherits glibc's lookup lock held and can hang connecting."""
    store = private_file_store()
    _KEPT.append(store)  # the folder goes with the store: keep it for the session
    return store


_KEPT: list[dist.FileStore] = []


def dynamic_ranks(pipe: Any, world_size: int, store: Any, **options: Any) -> list[dp.Loader]:
    """The ranks of one ``dispatch="dynamic"`` job in this process, sharing ``store``."""
    return [
        dp.Loader(pipe, rank=r, world_size=world_size, dispatch="dynamic", store=store, **options)
        for r in range(world_size)
    ]


# ----- comparing items ------------------------------------------------------------------------


def assert_same(expected: list[Any], got: list[Any], what: str = "") -> None:
    """``got`` holds the same items as ``expected`` (``nodes.testing.same``), in the same order.

    The first differing item is named before a difference in length, so a lost or extra
    item shows where the streams part. ``what`` starts the message (e.g. the case's name).
    """
    prefix = f"{what}: " if what else ""
    for i, (a, b) in enumerate(zip(expected, got)):
        assert same(a, b), f"{prefix}item {i}: expected {a!r:.300}, got {b!r:.300}"
    assert len(got) == len(expected), f"{prefix}{len(expected)} items expected, got {len(got)}"


def canon(value: Any) -> Any:
    """A hashable canonical form of a record, to compare records as multisets.

    Tensors count as the lists they hold (a record is the same whether a worker collated it
    or not) and numpy scalars as Python numbers; arrays keep their dtype and shape; numbers
    keep their type (1, 1.0 and True differ, as they do in JSON); dicts ignore key order.
    """
    if isinstance(value, torch.Tensor):
        return canon(value.tolist())
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, canon(value.tolist()))
    if isinstance(value, np.generic):
        return canon(value.item())
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, canon(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return ("seq", tuple(canon(v) for v in value))
    if isinstance(value, bool | int | float):
        return (type(value).__name__, value)
    return value


def multiset(records: list[Any]) -> Counter:
    """The records as a multiset (of their canonical forms): order does not count, copies do."""
    return Counter(canon(r) for r in records)


# ----- one recipe with every kind of step ------------------------------------------------------


def is_odd(x: int) -> bool:
    return x % 2 == 1


def tenfold(x: int) -> int:
    return 10 * x


def rich_pipe() -> dp.DataPipe[Any]:
    """Global shuffle, filter, buffer shuffle, parallel map, mix, repeat, batch, unbatch and
    prefetch in one recipe."""
    left = dp.range(60).shuffle().filter(is_odd).shuffle(buffer_size=7)
    right = dp.range(100, 140).map(tenfold, num_workers=2).repeat(2)
    return dp.mix([left, right], [2, 1]).batch(3).unbatch().prefetch(2).batch(4)


# ----- processes left behind ------------------------------------------------------------------


def new_children(before: set[Any], wait_s: float = 10.0) -> list[Any]:
    """Child processes started since ``before`` that are still alive after up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in multiprocessing.active_children() if p not in before]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


# ----- the slow marker -----------------------------------------------------------------------


def worker_counts(*counts: int) -> list[Any]:
    """``num_workers`` values for ``parametrize``: 0 stays in the fast loop (``-m "not slow"``);
    more start DataLoader worker processes, so those cases are marked slow."""
    return [n if n == 0 else pytest.param(n, marks=pytest.mark.slow) for n in counts]


# ----- a custom node that draws through its ctx -------------------------------------------


class SeededDraws(Node):
    """Pairs each item with a draw from ``ctx.random_key()``: a custom node's random stream."""

    def __init__(self, upstream: Node, ctx: Any) -> None:
        super().__init__(upstream)
        self.upstream, self.ctx = upstream, ctx

    def reset(self, state: dict[str, Any] | None = None) -> None:
        self.upstream.reset(None if state is None else state["up"])
        self.stream = UniformStream(self.ctx.random_key())
        self.stream.seek(0 if state is None else state["draws"])

    def __next__(self) -> tuple[Any, float]:
        return (next(self.upstream), round(self.stream.next(), 6))

    def state_dict(self) -> dict[str, Any]:
        return {"up": self.upstream.state_dict(), "draws": self.stream.position()}


def run_gloo_ranks(target: Any, world: int, folder: Any, timeout: float = 180) -> None:
    """Run ``target(rank, store_url, folder)`` in ``world`` spawned processes (each starts
    a gloo group through the file store in ``folder``); every one must exit 0 in time."""
    ctx = torch.multiprocessing.get_context("spawn")
    store = f"file://{folder}/store"
    procs = [ctx.Process(target=target, args=(r, store, str(folder))) for r in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout)
        assert proc.exitcode == 0, f"rank {procs.index(proc)} exited with {proc.exitcode}"
