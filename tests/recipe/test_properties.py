"""Property-based tests: random recipes, random checkpoint positions, exact resume.

A random pipeline is built from the recipe API; the uninterrupted Loader run
(three epochs) is the reference. A state taken anywhere (mid-batch, mid-buffer,
mid-prefetch, mid-mix, mid-epoch 0 or mid-epoch 1), sent through json and
torch.save/torch.load(weights_only=True), must make a fresh Loader yield exactly
the rest of that epoch and then the following epochs.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from helpers import assert_same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import datapipes as dp
from nodes.testing import roundtrip_state

EPOCHS = 3
MAX_ITEMS = 200
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ----- deterministic module-level functions (recipes must stay picklable) ---------------


def add_seven(x: int) -> int:
    return x + 7


def double(x: int) -> int:
    return 2 * x


def keep_most(x: int) -> bool:
    return x % 5 != 2


def copies(x: int) -> list[int]:
    return [x] * (x % 3)  # 0, 1 or 2 outputs


def pair_up(x: int) -> list[int]:
    return [x, -x]


def as_int(x: Any) -> int:
    return int(x)


def total(items: tuple[Any, ...]) -> int:
    return sum(int(v) for v in items)


def to_record(x: int) -> dict[str, Any]:
    return {"x": x, "name": f"item{x}"}


def from_record(record: dict[str, Any]) -> int:
    assert record["name"] == f"item{int(record['x'])}"
    return int(record["x"])


def stream_factory() -> Any:
    return (3 * i for i in range(41))


# ----- random recipes -------------------------------------------------------------------


@st.composite
def sources(draw, allow_streams: bool):
    kinds = ["range", "range_step", "sequence"] + (["iterable", "factory"] if allow_streams else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "range":
        n = draw(st.integers(0, 60))
        return dp.range(n), n
    if kind == "range_step":
        start, step = draw(st.integers(-20, 20)), draw(st.integers(1, 4))
        n = draw(st.integers(0, 50))
        return dp.range(start, start + n * step, step), n
    if kind == "sequence":
        values = draw(st.lists(st.integers(-1000, 1000), max_size=60))
        return dp.from_sequence(values), len(values)
    if kind == "iterable":
        values = draw(st.lists(st.integers(-1000, 1000), max_size=60))
        return dp.from_iterable(values), len(values)
    return dp.from_iterable(stream_factory), 41


STEPS = [
    "map",
    "filter",
    "flat_map",
    "global_shuffle",
    "buffer_shuffle",
    "rebatch",
    "rebatch_dicts",
    "take",
    "repeat",
    "prefetch",
]


@st.composite
def int_pipes(draw, allow_streams: bool, depth: int = 0):
    """A recipe whose items are ints, and an upper bound on its item count."""
    if depth < 2 and draw(st.integers(0, 3)) == 0:
        how = draw(st.sampled_from(["concat", "zip", "mix", "mix_first"]))
        count = draw(st.integers(2, 3))
        parts = [draw(int_pipes(allow_streams, depth + 1)) for _ in range(count)]
        pipes = [p for p, _ in parts]
        bounds = [b for _, b in parts]
        if how == "concat":
            pipe, bound = dp.concat(*pipes), sum(bounds)
        elif how == "zip":
            pipe, bound = dp.zip(*pipes).map(total), min(bounds)
        else:
            weights = draw(st.lists(st.floats(0.1, 3.0), min_size=count, max_size=count))
            seed = draw(st.none() | st.integers(0, 100))
            stop = "first_exhausted" if how == "mix_first" else "all_exhausted"
            pipe, bound = dp.mix(pipes, weights, seed=seed, stop=stop), sum(bounds)
    else:
        pipe, bound = draw(sources(allow_streams))

    for step in draw(st.lists(st.sampled_from(STEPS), max_size=5)):
        if step == "map":
            pipe = pipe.map(draw(st.sampled_from([add_seven, double])))
        elif step == "filter":
            pipe = pipe.filter(keep_most)
        elif step == "flat_map":
            fn = draw(st.sampled_from([copies, pair_up]))
            if bound * 2 > MAX_ITEMS:
                continue
            pipe, bound = pipe.flat_map(fn), bound * 2
        elif step == "global_shuffle":
            if pipe.random_access() is None:
                continue
            pipe = pipe.shuffle(seed=draw(st.none() | st.integers(0, 100)))
        elif step == "buffer_shuffle":
            pipe = pipe.shuffle(buffer_size=draw(st.integers(1, 70)))
        elif step == "rebatch":
            size, drop_last = draw(st.integers(1, 9)), draw(st.booleans())
            pipe = pipe.batch(size, drop_last=drop_last).unbatch().map(as_int)
        elif step == "rebatch_dicts":
            size = draw(st.integers(1, 9))
            pipe = pipe.map(to_record).batch(size).unbatch().map(from_record)
        elif step == "take":
            count = draw(st.integers(0, 60))
            pipe, bound = pipe.take(count), min(bound, count)
        elif step == "repeat":
            times = draw(st.integers(1, 3))
            if bound * times > MAX_ITEMS:
                continue
            pipe, bound = pipe.repeat(times), bound * times
        elif step == "prefetch":
            pipe = pipe.prefetch(draw(st.integers(1, 4)))
    return pipe, bound


@st.composite
def pipelines(draw, allow_streams: bool = True):
    """A full recipe: ints, maybe batched (collated or not) at the end, maybe prefetched."""
    pipe, _ = draw(int_pipes(allow_streams))
    end = draw(st.sampled_from(["items", "batch", "batch_lists", "batch_prefetch"]))
    if end != "items":
        size, drop_last = draw(st.integers(1, 8)), draw(st.booleans())
        collate_fn = dp.no_collate if end == "batch_lists" else None
        pipe = pipe.batch(size, drop_last=drop_last, collate_fn=collate_fn)
        if end == "batch_prefetch":
            pipe = pipe.prefetch(2)
    return pipe


# ----- helpers --------------------------------------------------------------------------


def uninterrupted(pipe, **loader_args) -> list[list[Any]]:
    with dp.Loader(pipe, **loader_args) as loader:
        return [list(loader) for _ in range(EPOCHS)]


def check_resume(pipe, epoch: int, where: int, **loader_args) -> None:
    reference = uninterrupted(pipe, **loader_args)
    k = where % (len(reference[epoch]) + 1)

    with dp.Loader(pipe, **loader_args) as first:
        for e in range(epoch):
            assert_same(reference[e], list(first), f"epoch {e} of a second run")
        head = list(islice(iter(first), k))
        state = first.state_dict()
    assert_same(reference[epoch][:k], head, f"first {k} items of epoch {epoch}")

    with dp.Loader(pipe, **loader_args) as resumed:
        resumed.load_state_dict(roundtrip_state(state))
        assert_same(reference[epoch][k:], list(resumed), f"epoch {epoch} resumed after {k}")
        for e in range(epoch + 1, EPOCHS):
            assert_same(reference[e], list(resumed), f"epoch {e} after the resume")


# ----- properties -----------------------------------------------------------------------


@SETTINGS
@given(pipe=pipelines(), seed=st.integers(0, 2**32 - 1), where=st.integers(0, 10**6))
def test_resume_mid_epoch_0(pipe, seed, where):
    check_resume(pipe, 0, where, seed=seed)


@SETTINGS
@given(pipe=pipelines(), seed=st.integers(0, 2**32 - 1), where=st.integers(0, 10**6))
def test_resume_mid_epoch_1_then_epoch_2(pipe, seed, where):
    check_resume(pipe, 1, where, seed=seed)


@SETTINGS
@given(data=st.data(), where=st.integers(0, 10**6), epoch=st.integers(0, 1))
def test_resume_on_one_rank_of_several(data, where, epoch):
    world_size = data.draw(st.integers(2, 3), label="world_size")
    rank = data.draw(st.integers(0, world_size - 1), label="rank")
    pipe = data.draw(pipelines(allow_streams=False), label="pipe")
    check_resume(pipe, epoch, where, seed=5, rank=rank, world_size=world_size)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipe=pipelines(), depth=st.integers(1, 5), seed=st.integers(0, 1000))
def test_prefetch_at_the_end_changes_nothing(pipe, depth, seed):
    plain = uninterrupted(pipe, seed=seed)
    prefetched = uninterrupted(pipe.prefetch(depth), seed=seed)
    for e in range(EPOCHS):
        assert_same(plain[e], prefetched[e], f"epoch {e}")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.integers(-50, 50), max_size=150),
    buffer_size=st.one_of(st.none(), st.integers(1, 200)),
    seed=st.integers(0, 2**32 - 1),
)
def test_shuffles_are_permutations(values, buffer_size, seed):
    pipe = dp.from_sequence(values).shuffle(buffer_size)
    for epoch in uninterrupted(pipe, seed=seed):
        assert sorted(epoch) == sorted(values)
