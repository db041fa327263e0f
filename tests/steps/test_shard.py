"""Explicit sharding with .shard(): every item reaches exactly one consumer, consumer c of C
keeps items c, c + C, ..., shuffles before it agree across consumers, it keeps the node
contract, and DataPipe.consumer_length agrees with what a consumer really reads.

A consumer is one (rank, worker) pair. Tests either build the recipe for a
``Context(rank=r, world_size=R, worker_id=w, num_workers=W)`` directly, or run real Loaders
(one per rank) with real DataLoader worker processes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from helpers import is_odd, tenfold, worker_counts

import datapipes as dp
from nodes import Context, IterableNode, ShardNode, WholeDataContext
from nodes.context import every_consumer
from nodes.testing import check_node, read_epoch

# ----- data and helpers (module level, so DataLoader workers could pickle them) ---------------

N = 29  # not a multiple of any number of consumers used here: shares differ in length


def records(n: int = N) -> Iterator[str]:
    """A plain stream: it cannot shard itself."""
    return (f"r{i:02d}" for i in range(n))


STREAM = partial(records, N)
EXPECTED = [f"r{i:02d}" for i in range(N)]


def read_as(pipe: dp.DataPipe[Any], ctx: Context) -> list[Any]:
    return read_epoch(pipe.build(ctx))


def round_robin(shares: list[list[Any]]) -> list[Any]:
    """The Loader's merge of its workers: one item from each in turn, exhausted ones drop out."""
    out = []
    for i in range(max((len(s) for s in shares), default=0)):
        out += [share[i] for share in shares if i < len(share)]
    return out


def loader_outputs(pipe, world_size: int, num_workers: int, seed: int = 0, epochs: int = 1):
    """``out[epoch][rank]``: what each rank's Loader yields, epoch by epoch."""
    per_rank = []
    for rank in range(world_size):
        with dp.Loader(
            pipe,
            seed=seed,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            items_per_transfer=1,  # the workers' order is then round_robin's
        ) as loader:
            per_rank.append([list(loader) for _ in range(epochs)])
    return [[per_rank[r][e] for r in range(world_size)] for e in range(epochs)]


# ----- from_iterable(...).shard() through real Loaders ------------------------------------


@pytest.mark.parametrize("num_workers", worker_counts(0, 1, 2, 3))
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shard_deals_a_stream_to_every_consumer_exactly_once(world_size, num_workers):
    pipe = dp.from_iterable(STREAM).shard()
    (outputs,) = loader_outputs(pipe, world_size, num_workers)
    union = [item for out in outputs for item in out]
    assert Counter(union) == Counter(EXPECTED)  # exactly once, nothing lost or doubled
    workers = max(num_workers, 1)
    total = world_size * workers
    for rank, out in enumerate(outputs):
        # consumer c = rank * workers + worker keeps items c, c + C, c + 2C, ...
        shares = [EXPECTED[rank * workers + w :: total] for w in range(workers)]
        assert out == round_robin(shares), (rank, out)


@pytest.mark.parametrize(("world_size", "num_workers"), [(1, 1), (2, 2), (1, 3), (3, 2)])
def test_consumer_c_keeps_items_c_c_plus_C_and_so_on(world_size, num_workers):
    pipe = dp.from_iterable(STREAM).shard()
    total = world_size * num_workers
    for index, ctx in enumerate(every_consumer(world_size, num_workers)):
        assert ctx.consumer_index == index
        assert read_as(pipe, ctx) == EXPECTED[index::total]


def test_shard_of_an_empty_or_short_stream_leaves_some_consumers_empty():
    pipe = dp.from_iterable(partial(records, 2)).shard()
    shares = [read_as(pipe, ctx) for ctx in every_consumer(2, 2)]
    assert shares == [["r00"], ["r01"], [], []]
    empty = dp.from_iterable(partial(records, 0)).shard()
    assert [read_as(empty, ctx) for ctx in every_consumer(3, 1)] == [[], [], []]


# ----- a buffer shuffle before shard() ----------------------------------------------------


def test_shard_after_a_buffer_shuffle_every_consumer_sees_one_shuffled_order():
    shuffled = dp.from_iterable(STREAM).shuffle(buffer_size=6)
    pipe = shuffled.shard()
    orders = []
    for epoch in range(3):
        # the whole stream as one consumer reads it: what every consumer reads before the split
        whole = read_as(shuffled, Context(epoch=epoch, seed=5))
        assert sorted(whole) == EXPECTED
        orders.append(whole)
        for world_size, num_workers in [(2, 1), (1, 3), (2, 2)]:
            total = world_size * num_workers
            shares = [
                read_as(pipe, ctx)
                for ctx in every_consumer(world_size, num_workers, epoch=epoch, seed=5)
            ]
            for index, share in enumerate(shares):
                assert share == whole[index::total], (epoch, world_size, num_workers, index)
            assert Counter(x for s in shares for x in s) == Counter(EXPECTED)
    assert orders[0] != EXPECTED  # it did shuffle
    assert orders[0] != orders[1] != orders[2] != orders[0]  # a new order every epoch


@pytest.mark.slow
def test_shard_after_a_buffer_shuffle_in_workers_and_ranks():
    shuffled = dp.from_iterable(STREAM).shuffle(buffer_size=6)
    world_size, num_workers, seed = 2, 2, 3
    epochs = loader_outputs(shuffled.shard(), world_size, num_workers, seed=seed, epochs=2)
    with dp.Loader(shuffled, seed=seed) as single:
        whole = [list(single), list(single)]
    for epoch, outputs in enumerate(epochs):
        union = [item for out in outputs for item in out]
        assert Counter(union) == Counter(EXPECTED), epoch
        for rank, out in enumerate(outputs):
            shares = [whole[epoch][rank * num_workers + w :: 4] for w in range(num_workers)]
            assert out == round_robin(shares), (epoch, rank)
    assert epochs[0][0] != epochs[1][0]  # epochs differ


# ----- sources before shard() do not shard again ----------------------------------------------


def test_a_range_before_shard_is_read_whole_by_every_rank():
    shares = [list(dp.Loader(dp.range(10).shard(), rank=r, world_size=2)) for r in range(2)]
    assert shares == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_a_shuffled_sequence_before_shard_is_split_once(num_workers):
    pipe = dp.from_sequence([f"x{i}" for i in range(23)]).shuffle().map(str.upper).shard()
    (outputs,) = loader_outputs(pipe, 2, num_workers, seed=1)
    union = [item for out in outputs for item in out]
    assert sorted(union) == sorted(f"X{i}" for i in range(23))
    assert len(union) == 23
    whole = list(
        dp.Loader(dp.from_sequence([f"x{i}" for i in range(23)]).shuffle().map(str.upper), seed=1)
    )
    workers = max(num_workers, 1)
    total = 2 * workers
    for rank, out in enumerate(outputs):
        shares = [whole[rank * workers + w :: total] for w in range(workers)]
        assert out == round_robin(shares)


def test_steps_before_shard_run_on_the_whole_stream_in_every_consumer():
    # batch before shard: every consumer batches the whole stream, then keeps every C-th batch
    pipe = dp.range(20).batch(3).shard()
    shares = [[b.tolist() for b in read_as(pipe, ctx)] for ctx in every_consumer(2, 1)]
    batches = [list(range(i, min(i + 3, 20))) for i in range(0, 20, 3)]
    assert shares == [batches[0::2], batches[1::2]]


# ----- the node contract --------------------------------------------------------------------


def slot(rank: int, world_size: int, worker: int, num_workers: int):
    def make(epoch: int) -> Context:
        return Context(
            rank=rank,
            world_size=world_size,
            worker_id=worker,
            num_workers=num_workers,
            epoch=epoch,
            seed=2,
        )

    return make


SLOTS = [(0, 1, 0, 1), (0, 2, 1, 3), (1, 2, 2, 3), (2, 3, 0, 1)]


@pytest.mark.parametrize("consumer", SLOTS, ids=lambda s: f"r{s[0]}of{s[1]}-w{s[2]}of{s[3]}")
def test_shard_of_from_iterable_keeps_the_node_contract(consumer):
    context = slot(*consumer)
    c, total = context(0).consumer_index, context(0).num_consumers
    report = check_node(lambda ctx: dp.from_iterable(STREAM).shard().build(ctx), context=context)
    assert report.items_per_epoch == [len(range(c, N, total))] * 2


@pytest.mark.parametrize("consumer", SLOTS, ids=lambda s: f"r{s[0]}of{s[1]}-w{s[2]}of{s[3]}")
def test_shard_after_buffer_shuffle_and_map_keeps_the_node_contract(consumer):
    context = slot(*consumer)
    c, total = context(0).consumer_index, context(0).num_consumers
    recipe = dp.range(60).filter(is_odd).shuffle(buffer_size=7).shard().map(tenfold)
    report = check_node(lambda ctx: recipe.build(ctx), context=context, max_positions=30)
    assert report.items_per_epoch == [len(range(c, 30, total))] * 2


def test_shard_node_built_by_hand_keeps_the_node_contract():
    def make(ctx: Context) -> ShardNode:
        return ShardNode(IterableNode(STREAM, WholeDataContext(ctx)), ctx)

    report = check_node(make, context=slot(1, 2, 0, 2))
    assert report.items_per_epoch == [len(range(2, N, 4))] * 2


# ----- consumer_length ----------------------------------------------------------------------


def known_length_recipes() -> dict[str, dp.DataPipe[Any]]:
    letters = dp.from_sequence([f"s{i}" for i in range(29)])
    return {
        "range": dp.range(37),
        "range-step": dp.range(3, 50, 4),
        "from_sequence": letters,
        "empty": dp.from_sequence([]),
        "map": dp.range(37).map(tenfold),
        "global-shuffle": dp.range(37).shuffle(),
        "buffer-shuffle": dp.range(37).map(tenfold).shuffle(buffer_size=5),
        "batch": dp.range(37).batch(4),
        "batch-drop-last": dp.range(37).batch(4, drop_last=True),
        "take": dp.range(37).take(5),
        "take-more": dp.range(37).take(500),
        "repeat": dp.range(10).shuffle().repeat(3),
        "concat": dp.concat(dp.range(7), letters, dp.range(3).map(tenfold)),
        "zip": dp.zip(dp.range(20), letters.map(str.upper)),
        "prefetch": dp.range(23).prefetch(2),
        "shard": dp.range(37).shard(),
        "shuffle-shard-batch": dp.range(37).shuffle().shard().batch(3),
        "shard-take-repeat": dp.range(37).shard().take(4).repeat(2),
        "batch-shard": dp.range(37).batch(5).shard(),
        "concat-of-shards": dp.concat(dp.range(11).shard(), dp.range(6)).batch(2),
        "repeat-batch-take": dp.from_sequence(list("abcdefg")).repeat(2).batch(3).take(2),
    }


TOPOLOGIES = [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)]


@pytest.mark.parametrize("name", list(known_length_recipes()))
def test_consumer_length_agrees_with_what_every_consumer_reads(name):
    pipe = known_length_recipes()[name]
    for world_size, num_workers in TOPOLOGIES:
        for ctx in every_consumer(world_size, num_workers, seed=1):
            predicted = pipe.consumer_length(ctx)
            assert predicted is not None, (name, ctx)
            actual = len(read_as(pipe, ctx))
            assert predicted == actual, (name, ctx, predicted, actual)


def test_consumer_length_of_shard_counts_the_whole_upstream():
    pipe = dp.range(10).shard()
    lengths = [pipe.consumer_length(ctx) for ctx in every_consumer(2, 2)]
    assert lengths == [3, 3, 2, 2]
    assert dp.range(10).consumer_length(Context(rank=1, world_size=2)) == 5


@pytest.mark.parametrize(
    "pipe",
    [
        dp.range(20).filter(is_odd),
        dp.range(20).filter(is_odd).batch(2),
        dp.range(20).map(tenfold).filter(is_odd).take(3),
        dp.from_iterable(STREAM),
        dp.from_iterable(STREAM).shard(),
        dp.from_iterable(STREAM).batch(4).repeat(2),
        dp.range(20).flat_map(lambda x: [x] * (x % 3)),
        dp.concat(dp.range(5), dp.range(5).filter(is_odd)),
        dp.zip(dp.range(5), dp.from_iterable(STREAM)),
    ],
    ids=[
        "filter",
        "filter-batch",
        "filter-take",
        "from_iterable",
        "from_iterable-shard",
        "from_iterable-batch-repeat",
        "flat_map",
        "concat-with-filter",
        "zip-with-iterable",
    ],
)
def test_consumer_length_is_unknown_for_filters_and_iterables(pipe):
    assert pipe.consumer_length(Context()) is None
    assert pipe.consumer_length(Context(rank=1, world_size=2)) is None
