"""Dynamic dispatch, property-based: random recipes, random interleavings of 1-3 ranks.

The recipes are tests/resume/test_elastic_properties.py's (every item carries a unique id). A case
runs one epoch through a random chain of stages: the first dynamic (1-3 ranks sharing one
TCPStore, iterated in a random interleaving: each turn a random rank, with random weights,
takes one output), each stopped at a random point (nothing, a few outputs, mid-epoch, past
the end), every rank's ``state_dict()`` merged with ``dp.merge_states`` and resumed on a
random topology, dynamic (1-3 ranks) or static (1-4 ranks); the last stage runs to the end.
Over all stages:

* no id is delivered twice, none outside the epoch, and every id is delivered except those
  the last Loaders report dropped (a final ``batch(drop_last=True)``: at most ``size - 1``
  per consumer of each stage);
* a stage is a pure function of (state, interleaving) for recipes without read-ahead
  threads: a second job replaying the same interleaving delivers the same outputs, rank by
  rank (with a ``prefetch``, a threaded ``map`` or DataLoader workers, which read ahead,
  units are claimed when the threads or workers run);
* merged states survive json and ``torch.load(weights_only=True)``.

Recipes with a ``shard()`` stream must be refused by a dynamic Loader (ElasticResumeError),
and the known refusals of elastic resume may refuse a resume on another topology. A flat_map
mid-item resumed dynamically repeats outputs (a known bug: tests/dispatch/test_dispatch.py's strict
xfail); recipes with one resume statically only after their first stage.

``DISPATCH_CASES=300 python -m pytest tests/dispatch/test_dispatch_properties.py``: a deeper run.
A failure names the seed, the recipe and the stages; ``-k "[<case>]"`` replays it.
"""

from __future__ import annotations

import os
import random
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from helpers import file_store
from random_recipes import Recipe, RecipeMaker, plain_copy

import datapipes as dp

STORE: list[dist.TCPStore] = []


def store() -> dist.TCPStore:
    """One TCPStore for the module: every job's ranks agree on their own keys in it."""
    if not STORE:
        STORE.append(dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False))
    return STORE[0]


def job(recipe: Recipe, mode: str, world: int, seed: int, workers: int = 0) -> list[dp.Loader]:
    extra: dict[str, Any] = {"timeout": 60} if workers else {}  # a hang fails the case
    if mode == "dynamic":
        # Forked workers reach a file store without a server thread in this process.
        shared = file_store() if workers else store()
        extra |= {"dispatch": "dynamic", "store": shared, "dispatch_unit_items": 3}
    return [
        dp.Loader(
            recipe.pipe,
            seed=seed,
            rank=r,
            world_size=world,
            num_workers=workers,
            even_batches=False,
            **extra,
        )
        for r in range(world)
    ]


def run_interleaved(
    jobs: list[dp.Loader], total: int | None, turns: random.Random, weights: list[float]
) -> list[list[Any]]:
    """Each rank's outputs: each turn a rank drawn from ``turns`` (by ``weights``) takes
    one, until every rank's epoch ended or ``total`` outputs were taken."""
    its = [iter(loader) if loader.epoch == 0 else iter(()) for loader in jobs]
    got: list[list[Any]] = [[] for _ in jobs]
    live = list(range(len(jobs)))
    taken = 0
    while live and (total is None or taken < total):
        r = turns.choices(live, [weights[i] for i in live])[0]
        try:
            got[r].append(next(its[r]))
            taken += 1
        except StopIteration:
            live.remove(r)
    return got


def deterministic(recipe: Recipe) -> bool:
    text = "".join(recipe.text)
    return recipe.ordered and "prefetch" not in text and "num_workers" not in text


def run_dispatch_case(seed: int, root: Path, workers: tuple[int, ...] = (0,)) -> str:
    """One random case (see the module doc); returns what it did, for the deep-run tally."""
    rng = random.Random(seed)
    recipe = RecipeMaker(rng, root, unordered=workers == (0,), repeat=False).make()
    loader_seed = rng.randrange(1000)
    where = [f"seed={seed} recipe={''.join(recipe.text)} loader seed={loader_seed}"]
    if "shard()" in "".join(recipe.text):
        with pytest.raises(dp.ElasticResumeError, match="shard"):
            job(recipe, "dynamic", 1, loader_seed)
        return "refused (shard)"
    chain = [("dynamic", rng.randint(1, 3), rng.choice(workers))]
    for _ in range(rng.randint(1, 3)):
        mode = "static" if rng.random() < 0.35 else "dynamic"
        chain.append((mode, rng.randint(1, 4 if mode == "static" else 3), rng.choice(workers)))
    reference = len(list(dp.Loader(recipe.pipe, seed=loader_seed)))
    delivered: list[int] = []
    drops: Counter = Counter()
    consumers = 0
    state: dict[str, Any] | None = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dp.UnevenDataWarning)
            for stage, (mode, world, nw) in enumerate(chain):
                last = stage == len(chain) - 1
                consumers += world * max(nw, 1)
                kind = "end" if last else rng.choice(["zero", "few", "mid", "mid", "mid", "all"])
                total = {
                    "zero": 0,
                    "few": rng.randint(1, 3),
                    "mid": rng.randint(0, reference),
                    "all": None,
                    "end": None,
                }[kind]
                weights = [rng.choice([1.0, 1.0, 3.0]) for _ in range(world)]
                turns_seed = rng.randrange(10**9)
                where.append(f"{mode} {world}x{nw} stop {kind}:{total} weights {weights}")
                jobs = job(recipe, mode, world, loader_seed, nw)
                # DataLoader workers read ahead, claiming units as they run: not replayable
                replayable = deterministic(recipe) and nw == 0
                twin = job(recipe, mode, world, loader_seed, nw) if replayable else []
                try:
                    for loader in jobs + twin:
                        if state is not None:
                            try:
                                loader.load_state_dict(state)
                            except dp.ElasticResumeError as error:
                                assert recipe.may_refuse, f"refused: {error}\n{where}"
                                check(recipe, delivered, drops, consumers, where, partial=True)
                                return "refused (known elastic refusal)"
                    got = run_interleaved(jobs, total, random.Random(turns_seed), weights)
                    if twin:
                        again = run_interleaved(twin, total, random.Random(turns_seed), weights)
                        assert [[recipe.outputs(o) for o in g] for g in again] == [
                            [recipe.outputs(o) for o in g] for g in got
                        ], f"the same interleaving delivered other outputs\n{where}"
                    where[-1] += f" -> {[len(g) for g in got]}"
                    delivered += [i for g in got for o in g for i in recipe.outputs(o)]
                    if last:
                        for loader in jobs:
                            drops.update(loader.dropped())
                    else:
                        states = [loader.state_dict() for loader in jobs]
                        state = plain_copy(dp.merge_states(rng.sample(states, len(states))))
                finally:
                    for loader in jobs + twin:
                        loader.close()
    except AssertionError:
        raise
    except Exception as error:  # name the case: an error inside the core does not
        raise AssertionError(f"{type(error).__name__}: {error}\n{where}") from error
    check(recipe, delivered, drops, consumers, where)
    return "exactly once"


def check(
    recipe: Recipe,
    delivered: list[int],
    drops: Counter,
    consumers: int,
    where: list[str],
    partial: bool = False,
) -> None:
    got = Counter(delivered)
    twice = sorted(i for i, n in got.items() if n > 1)
    assert not twice, f"delivered twice: {twice[:20]}\n{where}"
    extra = sorted((got - recipe.ids).elements())
    assert not extra, f"not in the epoch: {extra[:20]}\n{where}"
    if partial:
        return
    missing = sorted((recipe.ids - got).elements())
    dropped = sum(n for step, n in drops.items() if step.startswith("batch("))
    assert set(drops) <= {s for s in drops if s.startswith("batch(")}, f"{drops}\n{where}"
    assert not dropped or recipe.drop_last, f"{drops}\n{where}"
    assert dropped <= ((recipe.batch_size or 1) - 1) * consumers, f"{drops}\n{where}"
    assert len(missing) == dropped, (
        f"{len(missing)} never delivered ({missing[:20]}), {dropped} reported dropped\n{where}"
    )


CASES = int(os.environ.get("DISPATCH_CASES", "24"))
SEED = 20261217


@pytest.mark.parametrize("case", range(CASES))
def test_dynamic_dispatch_delivers_every_item_once(case: int, tmp_path: Path) -> None:
    run_dispatch_case(SEED + case, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(3))
def test_dynamic_dispatch_with_dataloader_workers(case: int, tmp_path: Path) -> None:
    run_dispatch_case(SEED + 5000 + case, tmp_path, workers=(0, 1, 2))


def test_the_generator_reaches_the_shapes(tmp_path: Path) -> None:
    """The fast cases cover what they claim to: several recipe kinds, both outcomes."""
    kinds = Counter()
    for case in range(CASES):
        rng = random.Random(SEED + case)
        recipe = RecipeMaker(rng, tmp_path / str(case), unordered=True, repeat=False).make()
        text = "".join(recipe.text)
        kinds.update(
            k for k in ("files", "range", "sequence", "batch", "mix", "concat") if k in text
        )
    assert len(kinds) >= 5, kinds


if __name__ == "__main__":  # DISPATCH_CASES=300 python tests/dispatch/test_dispatch_properties.py
    import tempfile
    import time

    started, tally = time.perf_counter(), Counter()
    for case in range(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            tally[run_dispatch_case(SEED + case, Path(tmp))] += 1
    print(dict(tally), f"{time.perf_counter() - started:.1f} s")
