"""The JSONL pipeline with worker processes: datapipes ``Loader`` vs torch ``DataLoader``.

The work is the one of ``jsonl_pipeline.py``: read JSONL shards -> JSON decode ->
map (``features``) -> reservoir-style shuffle (10,000 records) -> batch(256) ->
collate to tensors, over 16 shards (generated once, cached in ``--workdir``). For
every worker count (``--workers``, default ``0,1,2``) two implementations run it:

* torch: ``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=N)`` over a
  hand-written ``IterableDataset`` that deals the files to its workers by
  ``get_worker_info()`` (worker ``k`` of ``N`` reads files ``k, k + N, ...``) and
  then runs the same map, shuffle buffer, batching and collate functions as
  ``jsonl_pipeline.py`` (the same code, imported from it);
* datapipes: ``dp.Loader(dp.files(...).read_jsonl().map(features).shuffle(10_000)
  .batch(256, collate_fn=collate), num_workers=N)``, which deals whole files to its
  workers the same way.

Each worker shuffles and batches its own share on both sides, so with N workers
the last batch of every worker may be short, alike. Runs are interleaved (every
repeat runs every contender once, the order reversed on every other repeat) and
the best of ``--repeats`` passes counts; every pass must yield each record of the
data set exactly once (record count and sum of ids checked against the data set).
Prints records/s and the ratio datapipes/torch per worker count, as a markdown
table at the end, with the load average (the machine's other work is noise). The
defaults take about 2-4 minutes on 2 cores. Usage::

    python benchmarks/workers_pipeline.py [--size-mb 64] [--repeats 3] [--workers 0,1,2]
    python benchmarks/workers_pipeline.py --size-mb 16 --repeats 2   # quick mode
    python benchmarks/workers_pipeline.py --records 200000          # ~41 MB of data
"""

from __future__ import annotations

import argparse
import gc
import glob
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from jsonl_pipeline import (
    BATCH,
    BUFFER,
    Batch,
    batches,
    buffer_shuffle,
    collate,
    default_workdir,
    features,
    generate_shards,
    read_jsonl,
    records_per_shard,
    traced,
)
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import datapipes as dp


# ----- the contenders --------------------------------------------------------------------
class JsonlBatches(IterableDataset):
    """Collated batches of shuffled ``features`` records, files dealt to DataLoader workers.

    Worker ``k`` of ``N`` reads files ``k, k + N, ...`` (all of them without
    workers) and shuffles its records in its own 10,000-record buffer.
    """

    def __init__(self, paths: list[str], seed: int = 0) -> None:
        super().__init__()
        self.paths = paths
        self.seed = seed

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = self.paths[worker::workers]
        records = map(features, read_jsonl(mine))
        return batches(buffer_shuffle(records, BUFFER, seed=self.seed * 1_000 + worker))


def torch_dataloader(paths: list[str], pattern: str, workers: int) -> Iterator[Batch]:
    loader = DataLoader(JsonlBatches(paths), batch_size=None, num_workers=workers)
    return iter(loader)


def datapipes_loader(
    paths: list[str], pattern: str, workers: int, trace: bool = False
) -> Iterator[Batch]:
    pipe = dp.files(pattern).read_jsonl().map(features).shuffle(BUFFER)
    loader = dp.Loader(pipe.batch(BATCH, collate_fn=collate), seed=0, num_workers=workers)
    return traced(loader) if trace else iter(loader)


Contender = Callable[[list[str], str, int], Iterator[Batch]]
CONTENDERS: dict[str, Contender] = {"torch": torch_dataloader, "datapipes": datapipes_loader}


# ----- measurement -----------------------------------------------------------------------
def run_once(
    make: Contender, paths: list[str], pattern: str, workers: int
) -> tuple[float, int, int]:
    """Seconds (worker start-up included), record count and sum of ids for one full pass."""
    gc.collect()
    count = id_sum = 0
    start = time.perf_counter()
    batches_seen = make(paths, pattern, workers)
    for batch in batches_seen:
        count += len(batch["id"])
        id_sum += int(batch["id"].sum())
    seconds = time.perf_counter() - start
    del batches_seen  # shuts the worker processes down before the next contender starts
    gc.collect()
    return seconds, count, id_sum


def measure(
    paths: list[str], pattern: str, worker_counts: list[int], repeats: int, records: int
) -> dict[tuple[str, int], float]:
    """Best-of-``repeats`` seconds per (implementation, workers), runs interleaved.

    Every pass must yield every record exactly once: ``records`` of them, ids
    summing to ``0 + 1 + ... + records - 1``.
    """
    runs = [(name, workers) for workers in worker_counts for name in CONTENDERS]
    best = dict.fromkeys(runs, math.inf)
    expected = (records, records * (records - 1) // 2)
    for repeat in range(repeats):
        order = runs if repeat % 2 == 0 else runs[::-1]
        for name, workers in order:
            seconds, count, id_sum = run_once(CONTENDERS[name], paths, pattern, workers)
            assert (count, id_sum) == expected, (
                f"{name} with num_workers={workers} yielded {count:,} records with id sum "
                f"{id_sum:,}; the data set has {expected[0]:,} with id sum {expected[1]:,}"
            )
            best[name, workers] = min(best[name, workers], seconds)
            print(
                f"  repeat {repeat + 1}/{repeats}  {name:<9} num_workers={workers}  "
                f"{seconds:6.2f} s  {records / seconds:>10,.0f} records/s",
                flush=True,
            )
    return best


def markdown_table(
    best: dict[tuple[str, int], float], worker_counts: list[int], records: int
) -> str:
    lines = [
        "| num_workers | torch DataLoader (records/s) | datapipes Loader (records/s) "
        "| datapipes / torch |",
        "|---:|---:|---:|---:|",
    ]
    for workers in worker_counts:
        theirs, ours = best["torch", workers], best["datapipes", workers]
        lines.append(
            f"| {workers} | {records / theirs:,.0f} | {records / ours:,.0f} "
            f"| {theirs / ours:.2f}x |"
        )
    return "\n".join(lines)


def size_for_records(records: int, seed: int) -> int:
    """The ``--size-mb`` whose data set has about ``records`` records."""
    per_mb = records_per_shard(2**20, seed)
    return max(1, round(records / per_mb))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--size-mb", "--size", type=int, default=None, help="total size of the shards (64)"
    )
    size.add_argument(
        "--records", type=int, default=None, help="pick the data set size by record count"
    )
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="passes per implementation")
    parser.add_argument(
        "--workers", default="0,1,2", help="comma-separated worker counts (default 0,1,2)"
    )
    parser.add_argument("--seed", type=int, default=0, help="data generation seed")
    parser.add_argument("--workdir", type=Path, default=None, help="where the data is cached")
    args = parser.parse_args()

    worker_counts = [int(w) for w in args.workers.split(",")]
    if args.records is not None:
        size_mb = size_for_records(args.records, args.seed)
    else:
        size_mb = args.size_mb if args.size_mb is not None else 64
    name = f"jsonl-{size_mb}mb-{args.shards}shards-seed{args.seed}"
    directory = args.workdir or default_workdir(name)
    manifest = generate_shards(directory, size_mb, args.shards, args.seed)
    paths = sorted(glob.glob(str(directory / "train-*.jsonl")))
    pattern = str(directory / "train-*.jsonl")
    records, mb = manifest["records"], sum(manifest["sizes"]) / 2**20

    title = (
        f"{mb:.0f} MB, {len(paths)} JSONL shards, {records:,} records: read -> json -> map -> "
        f"shuffle({BUFFER:,}) -> batch({BATCH}) -> collate, best of {args.repeats}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads"
    )
    print(title, flush=True)
    load_before = os.getloadavg()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")
        best = measure(paths, pattern, worker_counts, args.repeats, records)

    load_after = os.getloadavg()
    print()
    print(title)
    print(
        "records/s per implementation (each pass checked: every record exactly once); "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"(1-min; {os.cpu_count()} CPUs)"
    )
    print()
    print(markdown_table(best, worker_counts, records))
    print()
    print("datapipes / torch > 1: datapipes faster")


if __name__ == "__main__":
    main()
