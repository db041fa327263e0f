"""Ranks of a dynamically dispatched job as Loaders in this process: a store they share,
interleaved iteration, and chains of stages checked for every item exactly once."""

from __future__ import annotations

import io
import json
import random
from collections import Counter
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from helpers import dynamic_ranks, file_store

import datapipes as dp

SEED = 11


# ----- helpers ----------------------------------------------------------------------------


def new_store() -> dist.TCPStore:
    """A store on 127.0.0.1 that this process hosts: the job's, shared by its ranks."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


_SHARED: list[dist.TCPStore] = []


def shared_store() -> dist.TCPStore:
    """One store for the module's jobs (each job's ranks agree on keys of their own in it, as
    the Loaders of one training script do); made once: a TCPStore's shutdown can take
    seconds."""
    if not _SHARED:
        _SHARED.append(new_store())
    return _SHARED[0]


def ids(out: Any) -> list[int]:
    """The ids of one Loader output: an int, a dict with an "id", a batch of them."""
    if isinstance(out, dict):
        return ids(out["id"])
    if isinstance(out, torch.Tensor | np.ndarray):
        return [int(v) for v in np.asarray(out.tolist()).reshape(-1)]
    if isinstance(out, list | tuple):
        return [i for item in out for i in ids(item)]
    return [int(out)]


def loaders(
    pipe: dp.DataPipe[Any],
    mode: str,
    world: int,
    *,
    store: Any = None,
    seed: int = SEED,
    unit_items: int = 4,
    num_workers: int = 0,
) -> list[dp.Loader]:
    """The ``world`` ranks of one job (a dynamic one's ranks share ``store``, else the
    module's)."""
    workers: dict[str, Any] = {"num_workers": num_workers}
    if num_workers:  # forked workers: a store they reach without a server thread here
        workers["timeout"] = 60  # a hang fails the test
        store = file_store() if store is None else store
    if mode == "static":
        return [
            dp.Loader(pipe, seed=seed, rank=r, world_size=world, **workers) for r in range(world)
        ]
    store = shared_store() if store is None else store
    return dynamic_ranks(pipe, world, store, seed=seed, dispatch_unit_items=unit_items, **workers)


def interleave(
    jobs: list[dp.Loader], total: int | None = None, speeds: list[int] | None = None
) -> list[list[Any]]:
    """Each rank's outputs, the ranks taking turns (``speeds[r]`` outputs a turn; default:
    rank 0 three, the others one) until the epoch ends or ``total`` outputs were taken."""
    speeds = speeds or [3] + [1] * (len(jobs) - 1)
    its = [iter(loader) for loader in jobs]
    got: list[list[Any]] = [[] for _ in jobs]
    live = list(range(len(jobs)))
    while live:
        for r in list(live):
            for _ in range(speeds[r]):
                if total is not None and sum(map(len, got)) >= total:
                    return got
                try:
                    got[r].append(next(its[r]))
                except StopIteration:
                    live.remove(r)
                    break
    return got


def close(jobs: list[dp.Loader]) -> None:
    for loader in jobs:
        loader.close()


def plain(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` through json and torch.save/torch.load(weights_only=True): both keep it."""
    via_json = json.loads(json.dumps(state))
    assert via_json == state
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == state
    return via_json


Stop = int | float | str | None  # outputs taken (all ranks), a fraction of the epoch, "start"


def run_chain(
    pipe: dp.DataPipe[Any],
    expected: list[int],
    chain: list[tuple[str, int, Stop]],
    *,
    first: dict[str, Any] | None = None,
    unit_items: int = 4,
) -> tuple[list[int], Counter]:
    """Run one epoch through ``chain`` (mode, world size, where the stage stops; the last
    stage runs to the end); check every id of ``expected`` is delivered once, less what the
    last stage's Loaders report dropped. A float stop is a fraction of the epoch's outputs
    delivered by the end of the stage; a state at the epoch's end leaves nothing. Returns
    (delivered ids, drops)."""
    reference = sum(1 for _ in dp.Loader(pipe, seed=SEED))
    delivered: list[int] = []
    where: list[str] = []
    state = first
    drops: Counter = Counter()
    taken = 0  # outputs delivered so far
    for i, (mode, world, stop) in enumerate(chain):
        jobs = loaders(pipe, mode, world, unit_items=unit_items)
        try:
            for loader in jobs:
                if state is not None:
                    loader.load_state_dict(state)
            last = i == len(chain) - 1
            if any(loader.epoch != 0 for loader in jobs):  # the state was at the epoch's end
                got = [[] for _ in jobs]
            elif last:
                got = interleave(jobs)
            elif stop == "start":
                got = [[] for _ in jobs]
                for loader in jobs:
                    iter(loader)
            else:
                # a fraction of the epoch counts from its start, over all stages
                total = int(stop * reference) - taken if isinstance(stop, float) else stop
                got = interleave(jobs, max(total, 0))
            taken += sum(map(len, got))
            where.append(f"{mode} x{world}: {[len(g) for g in got]} outputs")
            delivered += [i for g in got for o in g for i in ids(o)]
            if last:
                for loader in jobs:
                    drops.update(loader.dropped())
            else:
                states = [loader.state_dict() for loader in jobs]
                state = plain(dp.merge_states(random.Random(i).sample(states, len(states))))
        finally:
            close(jobs)
    counts = Counter(delivered)
    twice = sorted(i for i, n in counts.items() if n > 1)
    assert not twice, f"delivered twice: {twice[:20]}; {where}"
    assert not set(counts) - set(expected), f"not in the epoch: {set(counts) - set(expected)}"
    missing = set(expected) - set(counts)
    dropped = sum(n for step, n in drops.items() if step.startswith("batch("))
    assert len(missing) == dropped, f"{len(missing)} never delivered, {dropped} dropped; {where}"
    return delivered, drops
