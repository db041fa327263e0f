"""Resume costs what the docstrings promise: O(1) for seekable sources, bounded replay else."""

from __future__ import annotations

import json
from itertools import islice

import datapipes as dp
from nodes.testing import roundtrip_state


class CountingList:
    """A random-access dataset that counts how often it is read."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reads = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        self.reads += 1
        return index


def _resume_reads(pipe_of, data: CountingList, position: int) -> tuple[int, list[int], list[int]]:
    """Reads the dataset needs to resume at ``position``, and the resumed vs reference tails."""
    reference = list(dp.Loader(pipe_of(CountingList(data.n)), seed=3))
    first = dp.Loader(pipe_of(CountingList(data.n)), seed=3)
    it = iter(first)
    list(islice(it, position))
    state = roundtrip_state(first.state_dict())

    resumed = dp.Loader(pipe_of(data), seed=3)
    resumed.load_state_dict(state)
    it = iter(resumed)
    head = next(it)
    reads = data.reads - 1  # the one item just produced
    return reads, [head, *it], reference[position:]


def test_sequence_resume_reads_nothing_twice() -> None:
    data = CountingList(50_000)
    reads, tail, reference = _resume_reads(lambda d: dp.from_sequence(d).shuffle(), data, 40_000)
    assert tail == reference
    assert reads == 0


def test_buffer_shuffle_replay_is_bounded_by_the_buffer_not_the_position() -> None:
    buffer = 100
    costs = []
    for position in (2_000, 40_000):
        data = CountingList(50_000)
        reads, tail, reference = _resume_reads(
            lambda d: dp.from_sequence(d).filter(bool).shuffle(buffer_size=buffer), data, position
        )
        assert tail == reference
        costs.append(reads)
    # The replay re-reads the window from the oldest buffered item, a few
    # buffers' worth; it does not grow with the position.
    assert max(costs) < 30 * buffer, costs
    assert costs[1] < 3 * costs[0] + 10 * buffer, costs


def test_global_shuffle_state_is_small_for_a_billion_items() -> None:
    loader = dp.Loader(dp.range(10**9).shuffle(), seed=1)
    it = iter(loader)
    first = list(islice(it, 5_000))
    state = loader.state_dict()
    assert len(set(first)) == len(first)
    assert all(0 <= x < 10**9 for x in first)
    assert json.loads(state["ranks"]["0"]["node"]) == {"position": 5_000}
    resumed = dp.Loader(dp.range(10**9).shuffle(), seed=1)
    resumed.load_state_dict(roundtrip_state(state))
    assert list(islice(iter(resumed), 100)) == list(islice(it, 100))
