"""Dynamic dispatch keeps the store bounded: an epoch's keys go once every rank has ended the
next one, so the key count stays flat over any number of epochs (with and without leases)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import datapipes as dp
from tests.helpers import dynamic_ranks, file_store

EPOCHS = 10


def _count_keys(store: Any) -> int:
    return int(store.num_keys())


def _every_item_once(per_rank: list[list[int]], count: int) -> None:
    seen = Counter(item for items in per_rank for item in items)
    assert sorted(seen) == list(range(count)) and set(seen.values()) == {1}


def test_the_store_key_count_stays_flat_over_epochs() -> None:
    store = file_store()
    pipe = dp.range(120).shuffle(buffer_size=4)
    ranks = dynamic_ranks(pipe, 3, store, dispatch_unit_items=7)
    counts = []
    for _ in range(EPOCHS):
        per_rank = [[int(x) for x in loader] for loader in ranks]  # one after the other
        _every_item_once(per_rank, 120)
        counts.append(_count_keys(store))
    assert counts[2:] == [counts[2]] * (EPOCHS - 2), counts  # bounded: two epochs' keys


def test_with_leases_the_store_key_count_stays_flat_over_epochs() -> None:
    store = file_store()
    pipe = dp.range(90).map(abs)
    ranks = dynamic_ranks(
        pipe, 3, store, dispatch_unit_items=5, dispatch_lease_seconds=60.0, even_batches=False
    )
    counts = []
    for _ in range(EPOCHS):
        per_rank: list[list[int]] = [[] for _ in ranks]
        errors: list[BaseException] = []

        def run(rank: int, per_rank: list[list[int]] = per_rank, errors: list = errors) -> None:
            try:
                per_rank[rank].extend(int(x) for x in ranks[rank])
            except BaseException as error:  # noqa: BLE001 - raised in the test below
                errors.append(error)

        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads) and not errors, errors
        _every_item_once(per_rank, 90)
        counts.append(_count_keys(store))
    # Bounded, not growing (without the removal: +14 keys an epoch). A consumer that claimed
    # nothing in an epoch (the ranks are threads racing for units) has no claims key, and
    # two epochs' keys are in the store at a time: up to 2 x 3 keys of difference.
    assert max(counts[2:]) - min(counts[2:]) <= 6, counts
    assert counts[-1] < counts[2] + 14, counts  # not one epoch's worth more
