"""Per-item framework overhead: map -> filter -> batch(256) -> collate over 1,000,000 ints.

Runs three implementations of the same work side by side in one process and
prints ns per input item and ratios:

* a plain Python generator chain (the floor: no framework at all);
* ``torchdata.nodes`` (IterableWrapper -> Mapper -> a Filter node -> Batcher -> Mapper);
* datapipes (``dp.range(n).map(f).filter(p).batch(256)`` through ``dp.Loader``).

All three call the same ``f``, ``p`` and collate function, so the differences
are the frameworks' own cost. Usage::

    python benchmarks/overhead.py [--items 1000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import datapipes as dp
from nodes import default_collate

BATCH = 256


def triple(x: int) -> int:
    return x * 3


def is_even(x: int) -> bool:
    return x % 2 == 0


def plain_chain(n: int) -> Iterator[Any]:
    mapped = (triple(x) for x in range(n))
    kept = (x for x in mapped if is_even(x))
    while True:
        batch = list(islice(kept, BATCH))
        if not batch:
            return
        yield default_collate(batch)


def datapipes_loader(n: int, stats: bool = False) -> Iterator[Any]:
    pipe = dp.range(n).map(triple).filter(is_even).batch(BATCH)
    return iter(dp.Loader(pipe, stats=stats))


def torchdata_nodes(n: int) -> Iterator[Any]:
    from torchdata.nodes import BaseNode, Batcher, IterableWrapper, Loader, Mapper

    class Filter(BaseNode):
        # torchdata.nodes has no filter step; this is the idiomatic custom node.
        def __init__(self, source: BaseNode, predicate: Callable[[Any], bool]) -> None:
            super().__init__()
            self.source, self.predicate = source, predicate

        def reset(self, initial_state: dict | None = None) -> None:
            super().reset(initial_state)
            self.source.reset(initial_state["source"] if initial_state else None)

        def next(self) -> Any:
            while True:
                item = next(self.source)
                if self.predicate(item):
                    return item

        def get_state(self) -> dict:
            return {"source": self.source.state_dict()}

    node = Mapper(IterableWrapper(range(n)), triple)
    node = Batcher(Filter(node, is_even), batch_size=BATCH, drop_last=False)
    return iter(Loader(Mapper(node, default_collate)))


def measure(
    contenders: dict[str, Callable[[int], Iterator[Any]]], n: int, repeats: int
) -> dict[str, tuple[float, int]]:
    """Best-of-``repeats`` ns per input item and the output count, for each contender.

    The contenders take turns within every repeat, so a noisy neighbour on the
    machine slows all of them alike instead of skewing one.
    """
    best = dict.fromkeys(contenders, float("inf"))
    counts = dict.fromkeys(contenders, 0)
    for _ in range(repeats):
        for name, make in contenders.items():
            gc.collect()
            start = time.perf_counter()
            counts[name] = sum(len(batch) for batch in make(n))
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: (best[name] * 1e9 / n, counts[name]) for name in contenders}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    contenders = {
        "plain generator chain": plain_chain,
        "torchdata.nodes": torchdata_nodes,
        "datapipes": datapipes_loader,
    }
    results = measure(contenders, args.items, args.repeats)
    counts = {count for _, count in results.values()}
    assert len(counts) == 1, f"implementations disagree on the output: {results}"

    floor = results["plain generator chain"][0]
    ours = results["datapipes"][0]
    print(
        f"{args.items:,} ints: map -> filter -> batch({BATCH}) -> collate, best of {args.repeats}"
    )
    print(f"{'implementation':<24}{'ns/item':>10}{'vs plain':>10}")
    for name, (ns, _) in results.items():
        print(f"{name:<24}{ns:>10.1f}{ns / floor:>9.2f}x")
    print(f"datapipes / plain chain      = {ours / floor:.2f}x  (goal <= 1.3x)")
    speedup = results["torchdata.nodes"][0] / ours
    print(f"torchdata.nodes / datapipes  = {speedup:.2f}x  (goal >= 2x)")


if __name__ == "__main__":
    main()
