"""Golden shuffle orders: any change to a random order must be deliberate and visible.

Every random choice derives from (seed, epoch, the step's structural identity,
the consumer); these tests pin the orders that come out for a handful of
recipes, epochs 0 and 1. If one fails, an order moved: that breaks every
checkpoint taken before the change (their positions would land in another
order), so bump ``STATE_VERSION`` with the reason, and only then update the
values here. The identity itself (what moves an order and what must not)
is tested in ``tests/recipe/test_identity.py``.
"""

from __future__ import annotations

import fsspec
import pytest
from helpers import SeededDraws

import datapipes as dp


def is_even(x):
    return x % 2 == 0


def file_number(record):
    return record["file"]


def memory_files():
    """Eight one-record files at a fixed memory:// path (the pattern is part of the identity)."""
    fs = fsspec.filesystem("memory")
    for i in range(8):
        with fs.open(f"/golden/part-{i}.jsonl", "w") as f:
            f.write(f'{{"file": {i}}}\n')
    return dp.files("memory://golden/part-*.jsonl").shuffle().read_jsonl().map(file_number)


RECIPES = {
    "global shuffle": lambda: dp.range(20).shuffle(),
    "global shuffle, explicit seed": lambda: dp.range(12).shuffle(seed=7),
    "global shuffle above 65,536 (Feistel)": lambda: dp.range(100_000).shuffle().take(12),
    "buffer shuffle": lambda: dp.range(40).filter(is_even).shuffle(buffer_size=6),
    "file shuffle": memory_files,
    "mix": lambda: dp.mix([dp.range(10), dp.range(100, 105)], [0.7, 0.3]),
    "shuffles in zip branches": lambda: dp.zip(dp.range(8).shuffle(), dp.range(8).shuffle()),
    "shuffles in repeat rounds": lambda: dp.range(5).shuffle().repeat(3),
    "custom node's random key": lambda: dp.range(4).apply_node(SeededDraws),
}

GOLDEN = {
    "global shuffle": [
        [6, 13, 11, 7, 3, 4, 14, 9, 8, 0, 5, 10, 15, 12, 1, 17, 18, 2, 16, 19],
        [18, 10, 11, 15, 6, 12, 0, 13, 7, 4, 1, 8, 3, 9, 5, 19, 17, 16, 14, 2],
    ],
    "global shuffle, explicit seed": [
        [9, 4, 6, 8, 2, 1, 10, 0, 3, 5, 11, 7],
        [8, 7, 11, 5, 2, 10, 9, 1, 6, 0, 3, 4],
    ],
    "global shuffle above 65,536 (Feistel)": [
        [12859, 40056, 80014, 21379, 96856, 58188, 70658, 83199, 60187, 6580, 73191, 28876],
        [1031, 67267, 46138, 61122, 55546, 20874, 38909, 31087, 29693, 38001, 14754, 60365],
    ],
    "buffer shuffle": [
        [10, 8, 14, 0, 6, 2, 16, 18, 20, 28, 26, 30, 4, 32, 36, 24, 12, 22, 38, 34],
        [2, 8, 4, 14, 18, 0, 10, 20, 22, 28, 30, 16, 32, 24, 6, 38, 26, 36, 12, 34],
    ],
    "file shuffle": [[0, 5, 2, 6, 1, 4, 7, 3], [1, 7, 5, 6, 2, 4, 0, 3]],
    "mix": [
        [0, 1, 2, 3, 4, 5, 100, 6, 7, 101, 8, 9, 102, 103, 104],
        [0, 1, 2, 3, 100, 4, 5, 101, 6, 7, 102, 8, 103, 9, 104],
    ],
    "shuffles in zip branches": [
        [(2, 1), (4, 5), (7, 0), (6, 2), (5, 7), (0, 3), (1, 6), (3, 4)],
        [(7, 1), (1, 3), (4, 7), (0, 5), (5, 2), (3, 0), (2, 6), (6, 4)],
    ],
    "shuffles in repeat rounds": [
        [0, 2, 3, 4, 1, 2, 3, 0, 4, 1, 0, 1, 2, 4, 3],
        [4, 3, 1, 2, 0, 2, 3, 0, 1, 4, 4, 1, 0, 3, 2],
    ],
    "custom node's random key": [
        [(0, 0.993935), (1, 0.731834), (2, 0.082636), (3, 0.052801)],
        [(0, 0.469009), (1, 0.791277), (2, 0.800582), (3, 0.464535)],
    ],
}


def two_epochs(pipe, **loader_args):
    loader = dp.Loader(pipe, seed=0, **loader_args)
    return [list(loader), list(loader)]


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_order_is_the_pinned_one(name):
    assert two_epochs(RECIPES[name]()) == GOLDEN[name]


def test_the_global_shuffle_deals_pinned_shares_to_two_ranks():
    shares = [two_epochs(dp.range(20).shuffle(), rank=r, world_size=2) for r in range(2)]
    assert shares == [
        [[6, 11, 3, 14, 8, 5, 15, 1, 18, 16], [18, 11, 6, 0, 7, 1, 3, 5, 17, 14]],
        [[13, 7, 4, 9, 0, 10, 12, 17, 2, 19], [10, 15, 12, 13, 4, 8, 9, 19, 16, 2]],
    ]


def test_every_pinned_order_is_a_permutation_and_the_epochs_differ():
    """The goldens themselves are sane: nothing lost or repeated, a new order each epoch."""
    for name, (first, second) in GOLDEN.items():
        assert first != second, name
        whole_epochs = "take" not in repr(RECIPES[name]())
        if whole_epochs and all(isinstance(item, int) for item in first):
            assert sorted(first) == sorted(second), name
