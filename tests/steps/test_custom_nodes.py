"""A user's own node in a recipe: pipe.apply_node(MyNode, ...) runs it like a built-in step,
in the main process and in DataLoader workers, passes the conformance kit, resumes exactly
from Loader checkpoints, and is named in reprs, fingerprints, statistics and errors."""

from __future__ import annotations

import json
import random
import warnings
from typing import Any

import numpy as np
import pytest

import datapipes as dp
from nodes import Context, Node
from nodes.testing import check_node

warnings.filterwarnings("ignore", message="This DataLoader will create")


class RunningSum(Node):
    """Running total of the items: its state is its own total plus upstream's position."""

    def __init__(self, upstream: Node, start: int = 0) -> None:
        super().__init__(upstream)
        self.upstream = upstream
        self.start = start

    def reset(self, state=None):
        self.upstream.reset(None if state is None else state["up"])
        self.total = self.start if state is None else state["total"]

    def __next__(self):
        self.total += next(self.upstream)
        return self.total

    def state_dict(self):
        return {"up": self.upstream.state_dict(), "total": self.total}


class RandomTag(Node):
    """Tags each item with a random number from an RNG seeded by the node's Context."""

    def __init__(self, upstream: Node, ctx: Context) -> None:
        super().__init__(upstream)
        self.upstream = upstream
        self.ctx = ctx

    def reset(self, state=None):
        self.upstream.reset(None if state is None else state["up"])
        self.drawn = 0 if state is None else state["drawn"]
        # the epoch is read at reset, so every epoch draws anew
        self.rng = random.Random(str(self.ctx.random_key(self.ctx.consumer_index)))
        for _ in range(self.drawn):
            self.rng.random()

    def __next__(self):
        item = next(self.upstream)
        self.drawn += 1
        return (item, self.rng.random())

    def state_dict(self):
        return {"up": self.upstream.state_dict(), "drawn": self.drawn}


def running_sum_from_10(upstream: Node) -> Node:
    """A factory function instead of a class."""
    return RunningSum(upstream, start=10)


def test_apply_node_runs_the_users_node():
    assert list(dp.Loader(dp.range(1, 6).apply_node(RunningSum))) == [1, 3, 6, 10, 15]
    assert list(dp.Loader(dp.range(3).apply_node(RunningSum, 100))) == [100, 101, 103]
    assert list(dp.Loader(dp.range(3).apply_node(running_sum_from_10))) == [10, 11, 13]


def test_a_recipe_with_a_users_node_passes_the_conformance_kit():
    pipe = dp.range(60).shuffle().apply_node(RunningSum).filter(lambda x: x % 3 != 0).batch(4)

    def make(ctx: Context) -> Node:
        return pipe.build(ctx)

    report = check_node(make)
    assert report.items_per_epoch[0] > 0


def test_a_context_taking_node_passes_the_kit_and_draws_per_epoch():
    pipe = dp.range(40).apply_node(RandomTag)
    check_node(lambda ctx: pipe.build(ctx))
    loader = dp.Loader(pipe, seed=3)
    epoch0, epoch1 = list(loader), list(loader)
    assert [i for i, _ in epoch0] == list(range(40))
    assert [t for _, t in epoch0] != [t for _, t in epoch1]
    assert list(dp.Loader(pipe, seed=3)) == epoch0  # same seed, same draws
    assert list(dp.Loader(pipe, seed=4)) != epoch0


def test_two_context_taking_steps_draw_different_streams():
    pipe = dp.range(20).apply_node(RandomTag).apply_node(RandomTag)
    items = list(dp.Loader(pipe))
    inner = [tag for (_, tag), _ in items]
    outer = [tag for _, tag in items]
    assert inner != outer


def test_consumers_draw_their_own_streams():
    pipe = dp.range(20).apply_node(RandomTag)
    tags = [[t for _, t in dp.Loader(pipe, rank=r, world_size=2)] for r in range(2)]
    assert tags[0] != tags[1]


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_loader_resume_is_exact_at_random_positions(workers: int):
    pipe = dp.range(300).shuffle().apply_node(RunningSum).apply_node(RandomTag).batch(7)
    reference = [b for b in dp.Loader(pipe, seed=5, num_workers=workers)]
    rng = np.random.default_rng(workers)
    for stop in sorted(rng.choice(len(reference), size=3, replace=False)):
        loader = dp.Loader(pipe, seed=5, num_workers=workers)
        it = iter(loader)
        head = [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        resumed = dp.Loader(pipe, seed=5, num_workers=workers)
        resumed.load_state_dict(state)
        tail = list(resumed)
        assert len(head) + len(tail) == len(reference)
        for got, want in zip(head + tail, reference):
            assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


@pytest.mark.slow
def test_spawned_workers_run_a_node_class_from_an_importable_module():
    pipe = dp.range(1, 9).apply_node(RunningSum)
    loader = dp.Loader(pipe, num_workers=1, multiprocessing_context="spawn")
    assert list(loader) == [1, 3, 6, 10, 15, 21, 28, 36]


def test_repr_fingerprint_and_checkpoint_name_the_node_and_its_arguments():
    pipe = dp.range(5).apply_node(RunningSum, 2)
    assert repr(pipe) == "dp.range(5).apply_node(RunningSum, 2)"
    other = dp.range(5).apply_node(RunningSum, 3)
    assert pipe.fingerprint() != other.fingerprint()
    loader = dp.Loader(pipe)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(dp.StateMismatchError, match=r"apply_node\(RunningSum, 3\)"):
        dp.Loader(other).load_state_dict(state)


def test_statistics_name_the_users_step():
    loader = dp.Loader(dp.range(50).apply_node(RunningSum).batch(5), stats=True)
    list(loader)
    rows = {row.step: row for row in loader.stats().steps}
    assert rows["apply_node(RunningSum)"].items == 50


def test_an_unordered_parallel_map_before_a_users_node_is_refused():
    pipe = dp.range(10).map(abs, num_workers=2, ordered=False).apply_node(RunningSum)
    with pytest.raises(ValueError, match=r"apply_node\(RunningSum\) may re-read"):
        dp.Loader(pipe)


class NotANode:
    def __init__(self, upstream: Node) -> None:
        self.upstream = upstream


class ForgetsItsInput(Node):
    def __init__(self, upstream: Node) -> None:
        super().__init__()  # the input is not passed on
        self.upstream = upstream

    def reset(self, state=None):
        self.upstream.reset(state)

    def __next__(self):
        return next(self.upstream)

    def state_dict(self):
        return self.upstream.state_dict()


def test_mistakes_are_explained():
    with pytest.raises(TypeError, match="Node class or a function"):
        dp.range(3).apply_node(42)
    with pytest.raises(TypeError, match="passes ctx itself"):
        dp.range(3).apply_node(RandomTag, ctx=None)
    with pytest.raises(TypeError, match=r"apply_node\(NotANode\) built a NotANode, not a nodes"):
        list(dp.Loader(dp.range(3).apply_node(NotANode)))
    with pytest.raises(TypeError, match=r"super\(\).__init__\(upstream\)"):
        list(dp.Loader(dp.range(3).apply_node(ForgetsItsInput)))


# ----- keyword arguments; branches, repeat rounds and shard ------------------------------------


class Scaled(Node):
    """Multiplies items by ``args``; takes a ``factory`` too (ordinary parameter names)."""

    def __init__(self, upstream: Node, args: int = 1, factory: Any = None) -> None:
        super().__init__(upstream)
        self.upstream = upstream
        self.k = args

    def reset(self, state=None):
        self.upstream.reset(state)

    def __next__(self):
        return next(self.upstream) * self.k

    def state_dict(self):
        return self.upstream.state_dict()


def test_a_users_node_may_take_keyword_arguments_named_args_or_factory():
    """apply_node(MyNode, args=2): user kwargs must not collide with the recipe's own names."""
    assert list(dp.Loader(dp.range(3).apply_node(Scaled, args=2))) == [0, 2, 4]
    assert list(dp.Loader(dp.range(3).apply_node(Scaled, 3, factory=len))) == [0, 3, 6]


def test_a_users_node_in_branches_repeats_and_after_shard_resumes_exactly():
    """Checked, holds: apply_node inside zip/mix/concat, under repeat, before shard."""
    tagged = dp.range(12).apply_node(RandomTag)
    pipes = [
        dp.zip(tagged, dp.range(12).apply_node(RandomTag)),
        dp.mix([tagged, dp.range(50, 60).apply_node(RandomTag)], [1, 2]),
        dp.concat(dp.range(5).apply_node(Scaled, 2), tagged),
        dp.range(6).shuffle().apply_node(RandomTag).repeat(3),
        dp.from_iterable(lambda: range(20)).apply_node(RandomTag).shard(),
    ]
    for pipe in pipes:
        check_node(lambda ctx, pipe=pipe: pipe.build(ctx), max_positions=8)
    a, b = zip(*dp.Loader(pipes[0]))
    assert [t for _, t in a] != [t for _, t in b]  # zip branches draw their own streams
    rounds = [t for _, t in dp.Loader(pipes[3])]
    assert rounds[:6] != rounds[6:12]  # so do repeat rounds
