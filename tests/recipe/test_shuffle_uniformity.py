"""Shuffles are uniform: every order of a small list equally likely (file orders, small
datasets), and a checkpoint from the older, biased shuffle is refused rather than resumed
into another order. The seeds are fixed, so these statistical checks are deterministic."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import datapipes as dp
from nodes.rng import EXPLICIT_PERMUTATION_LIMIT, IndexPermutation


def parity(order: list[int]) -> int:
    """0 for an even permutation, 1 for an odd one (by counting cycles)."""
    seen, swaps = set(), 0
    for start in range(len(order)):
        length, i = 0, start
        while i not in seen:
            seen.add(i)
            i = order[i]
            length += 1
        swaps += max(length - 1, 0)
    return swaps % 2


def orders(n: int, seeds: int) -> list[list[int]]:
    return [IndexPermutation(n, key=[seed, 0, 7]).apply(np.arange(n)).tolist() for seed in seeds]


@pytest.mark.parametrize("n", [4, 16, 64])
def test_odd_and_even_orders_both_occur(n: int):
    # a Feistel network over a power-of-4 domain only ever made even permutations
    odd = sum(parity(order) for order in orders(n, range(600)))
    assert 240 < odd < 360, odd  # binomial(600, 1/2): 300 +- 12.2


@pytest.mark.parametrize("n", [3, 5, 8, 13])
def test_every_item_is_equally_likely_at_every_position(n: int):
    counts = np.zeros((n, n))
    for order in orders(n, range(4000 * n)):
        counts[np.arange(n), order] += 1
    expected = counts.sum() / n**2
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    degrees = (n - 1) ** 2
    # far below what the old shuffle gave (n=5: item 4 came last 8% too often)
    assert chi_square < degrees + 5 * (2 * degrees) ** 0.5, chi_square


def test_all_orders_of_four_items_occur_about_equally():
    counts = {order: 0 for order in itertools.permutations(range(4))}
    for order in orders(4, range(4800)):
        counts[tuple(order)] += 1
    assert min(counts.values()) > 140 and max(counts.values()) < 260, counts  # 200 each


@pytest.mark.parametrize("n", [EXPLICIT_PERMUTATION_LIMIT, EXPLICIT_PERMUTATION_LIMIT + 1])
def test_permutations_on_both_sides_of_the_limit(n: int):
    permutation = IndexPermutation(n, key=[1, 2])
    values = permutation.apply(np.arange(n))
    assert np.array_equal(np.sort(values), np.arange(n))
    assert not np.array_equal(values, np.arange(n))
    again = IndexPermutation(n, key=[1, 2]).apply(np.arange(n - 5, n))
    assert np.array_equal(again, values[-5:])  # a block of positions maps the same way


@pytest.mark.parametrize("n", [0, 1, 2, EXPLICIT_PERMUTATION_LIMIT, EXPLICIT_PERMUTATION_LIMIT + 1])
def test_permutations_at_the_edges_are_permutations(n: int):
    """Checked, holds: n = 0 and 1 (explicit draw), and both sides of the limit."""
    values = IndexPermutation(n, key=[3, 4]).apply(np.arange(n, dtype=np.int64))
    assert values.dtype == np.int64 and np.array_equal(np.sort(values), np.arange(n))
    small = min(n, 3)
    orders = [list(p) for p in itertools.permutations(range(small))]
    assert list(dp.Loader(dp.range(small).shuffle())) in orders


def test_file_order_shuffles_are_uniform_too(tmp_path):
    for name in "abc":
        (tmp_path / f"{name}.txt").write_text(name + "\n")
    pipe = dp.files(str(tmp_path / "*.txt")).shuffle().read_lines()
    counts: dict[tuple[str, ...], int] = {}
    for seed in range(600):
        order = tuple(dp.Loader(pipe, seed=seed))
        counts[order] = counts.get(order, 0) + 1
    assert len(counts) == 6 and min(counts.values()) > 60, counts  # 100 each


def test_a_checkpoint_from_the_older_shuffle_is_refused():
    loader = dp.Loader(dp.range(10).shuffle())
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(dp.StateMismatchError, match="older datapipes.*shuffles ordered"):
        dp.Loader(dp.range(10).shuffle()).load_state_dict({**state, "version": 2})
    # version 3: node states nested under other keys, and shuffle keys came from repr
    with pytest.raises(dp.StateMismatchError, match="version 5 .found 3.: .*laid out") as info:
        dp.Loader(dp.range(10).shuffle()).load_state_dict({**state, "version": 3})
    assert "set_epoch" in str(info.value) and "the version that saved it" in str(info.value)
