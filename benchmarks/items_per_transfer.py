"""The JSONL benchmark with DataLoader workers sending K items per transfer.

Contenders (interleaved, the order reversed every other repeat, each measure's
best of ``--repeats`` on its own): the hand-written plain process, datapipes
in one process, and ``dp.Loader(..., num_workers=N, items_per_transfer=K)`` for
each ``K`` of ``--k``. Prints the machine's load before and after, wall time,
records/s, the main process's and the workers' CPU per record, and each worker
contender's speed-up over both one-process contenders. The data is
``compare.py --only jsonl``'s (32 MB in 16 shards by default). Usage::

    python benchmarks/items_per_transfer.py [--k 1,4,16] [--workers 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jsonl_pipeline  # noqa: E402
from main_process_profile import one_pass  # noqa: E402

import datapipes as dp  # noqa: E402


def with_workers(paths: list[str], pattern: str, workers: int, k: int) -> Iterator[Any]:
    """The datapipes JSONL recipe in ``workers`` processes sending ``k`` batches at once."""
    pipe = dp.files(pattern).read_jsonl().map(jsonl_pipeline.features)
    pipe = pipe.shuffle(jsonl_pipeline.BUFFER)
    pipe = pipe.batch(jsonl_pipeline.BATCH, collate_fn=jsonl_pipeline.collate)
    return iter(dp.Loader(pipe, seed=0, num_workers=workers, items_per_transfer=k))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=32)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--k", default="1,4,16", help="comma-separated items_per_transfer")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    directory = args.workdir or jsonl_pipeline.default_workdir(
        f"jsonl-{args.size_mb}mb-{args.shards}shards"
    )
    manifest = jsonl_pipeline.generate_shards(directory, args.size_mb, args.shards, 0)
    paths = sorted(glob.glob(str(directory / "train-*.jsonl")))
    pattern = str(directory / "train-*.jsonl")
    records = manifest["records"]
    runs: dict[str, Any] = {
        "plain process (hand-written)": jsonl_pipeline.hand_written,
        "datapipes 0 workers": jsonl_pipeline.datapipes_loader,
    }
    for k in (int(k) for k in args.k.split(",")):
        name = f"datapipes {args.workers} workers, K={k}"
        runs[name] = partial(with_workers, workers=args.workers, k=k)
    warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")
    print(f"{records:,} records, load {os.getloadavg()}", flush=True)
    best: dict[str, tuple[float, float, float]] = {}
    for repeat in range(args.repeats):
        order = list(runs.items()) if repeat % 2 == 0 else list(runs.items())[::-1]
        for name, make in order:
            wall, main_cpu, kids_cpu, count = one_pass(make, paths, pattern)
            assert count == records, f"{name}: {count} records, expected {records}"
            old = best.get(name, (math.inf,) * 3)
            best[name] = (min(old[0], wall), min(old[1], main_cpu), min(old[2], kids_cpu))
            print(
                f"  {name:<32} {wall:6.2f} s {records / wall:>9,.0f} rec/s  main "
                f"{main_cpu:5.2f} s  workers {kids_cpu:5.2f} s",
                flush=True,
            )
    print(f"\nbest of {args.repeats}, load {os.getloadavg()}; CPU in us per record")
    print("| contender | records/s | main CPU/rec | workers CPU/rec | total CPU/rec "
          "| x plain | x datapipes 0 workers |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    plain, single = best["plain process (hand-written)"][0], best["datapipes 0 workers"][0]
    for name, (wall, main_cpu, kids_cpu) in best.items():
        m, w = main_cpu / records * 1e6, kids_cpu / records * 1e6
        print(
            f"| {name} | {records / wall:,.0f} | {m:.2f} | {w:.2f} | {m + w:.2f} "
            f"| {plain / wall:.2f} | {single / wall:.2f} |"
        )


if __name__ == "__main__":
    main()
