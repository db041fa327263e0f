"""Cost of an elastic resume: time from ``load_state_dict`` to the first batch, 4 -> 3 ranks.

Two epochs, each read by ``--before`` ranks (default 4) simulated in this process
(``num_workers=0``):

* ``jsonl``: ``dp.files(shards).read_jsonl().batch(256)`` over ``--shards`` JSONL
  shards of ~``--size-mb`` MB in all (default 1 GB; generated once into
  ``--workdir`` with ``jsonl_pipeline.generate_shards``, records ``{"id", "text",
  "label", "values"}``);
* ``range``: ``dp.range(--range-size).shuffle().batch(256)`` (default 10**8), a
  global shuffle.

Every rank stops at 10% and at 90% of its share (one untimed pass; ``state_dict()``
of every rank, round-tripped through JSON as a checkpoint would be). Then, best of
``--repeats``:

* same topology: a new ``Loader`` on each of the ``--before`` ranks loads its own
  state (the path of an ordinary resume) and reads its first batch;
* elastic: the states are merged (``dp.merge_states``, timed on its own) and a new
  ``Loader`` on each of ``--after`` ranks (default 3) loads the merged state and reads
  its first batch.

A resume is as slow as its slowest rank: each rank's time from ``load_state_dict``
to its first batch (the Loader is made before the clock starts) is its best of the
repeats, and a row shows the slowest rank's. The goal: an elastic resume within
1.5x of a same-topology one.
Prints a markdown table (``--markdown FILE`` writes it too). Usage::

    python benchmarks/elastic_resume.py [--size-mb 1024] [--range-size 100000000]
    python benchmarks/elastic_resume.py --quick    # 64 MB, range(10**6), 3 repeats
    python benchmarks/elastic_resume.py --quick --size-mb 4 --range-size 100000 --repeats 1
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from jsonl_pipeline import default_workdir, generate_shards

import datapipes as dp

BATCH = 256
POSITIONS = (0.1, 0.9)
GOAL = 1.5  # elastic / same-topology, at most

State = dict[str, Any]
Recipe = Callable[[], dp.DataPipe[Any]]


# ----- the two epochs --------------------------------------------------------------------
def jsonl_recipe(paths: list[str]) -> Recipe:
    return lambda: dp.files(paths).read_jsonl().batch(BATCH)


def range_recipe(size: int) -> Recipe:
    return lambda: dp.range(size).shuffle().batch(BATCH)


def loader(recipe: Recipe, rank: int, world_size: int) -> dp.Loader:
    return dp.Loader(recipe(), seed=0, rank=rank, world_size=world_size, even_batches=False)


def batch_size(batch: Any) -> int:
    """Items in a collated batch (a tensor, or a dict of columns)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    return len(batch)


# ----- states ----------------------------------------------------------------------------
def collect_states(
    recipe: Recipe, world_size: int, batches_per_rank: int
) -> tuple[dict[float, list[State]], float]:
    """Every rank's state after 10% and 90% of ``batches_per_rank`` batches; and the seconds."""
    states: dict[float, list[State]] = {f: [] for f in POSITIONS}
    start = time.perf_counter()
    for rank in range(world_size):
        with loader(recipe, rank, world_size) as ld:
            stream, done = iter(ld), 0
            for fraction in POSITIONS:
                k = int(fraction * batches_per_rank)
                deque(islice(stream, k - done), maxlen=0)
                done = k
                states[fraction].append(json.loads(json.dumps(ld.state_dict())))
    return states, time.perf_counter() - start


# ----- measurement -----------------------------------------------------------------------
def first_batch_seconds(recipe: Recipe, rank: int, world_size: int, state: State) -> float:
    """Seconds from ``load_state_dict(state)`` to the first batch on a new Loader."""
    ld = loader(recipe, rank, world_size)
    gc.collect()
    start = time.perf_counter()
    ld.load_state_dict(state)
    batch = next(iter(ld))
    seconds = time.perf_counter() - start
    ld.close()
    assert 0 < batch_size(batch) <= BATCH, batch_size(batch)
    return seconds


def measure(
    recipe: Recipe, states: list[State], before: int, after: int, repeats: int
) -> dict[str, float]:
    """Seconds: same topology, elastic (each the slowest rank's best of ``repeats``), and
    merging the states (best of ``repeats``); the repeats interleave the two resumes."""
    same = [float("inf")] * before
    elastic = [float("inf")] * after
    merge = float("inf")
    for _ in range(repeats):
        for r in range(before):
            same[r] = min(same[r], first_batch_seconds(recipe, r, before, states[r]))
        start = time.perf_counter()
        merged = json.loads(json.dumps(dp.merge_states(states)))
        merge = min(merge, time.perf_counter() - start)
        for r in range(after):
            elastic[r] = min(elastic[r], first_batch_seconds(recipe, r, after, merged))
    return {"same": max(same), "elastic": max(elastic), "merge": merge}


def markdown(rows: list[tuple[str, float, dict[str, float]]], before: int, after: int) -> str:
    lines = [
        f"| epoch | position | same topology ({before} ranks) | elastic ({before} -> {after}"
        " ranks) | elastic / same | merge_states | goal (<= 1.5x) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for epoch, fraction, best in rows:
        ratio = best["elastic"] / best["same"]
        lines.append(
            f"| {epoch} | {fraction:.0%} | {best['same'] * 1e3:.1f} ms "
            f"| {best['elastic'] * 1e3:.1f} ms | {ratio:.2f}x | {best['merge'] * 1e3:.1f} ms "
            f"| {'PASS' if ratio <= GOAL else 'MISS'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=None, help="JSONL MB (1024; quick: 64)")
    parser.add_argument("--shards", type=int, default=16, help="JSONL files")
    parser.add_argument(
        "--range-size", type=int, default=None, help="range items (10**8; quick: 10**6)"
    )
    parser.add_argument("--before", type=int, default=4, help="ranks that save")
    parser.add_argument("--after", type=int, default=3, help="ranks that resume elastically")
    parser.add_argument("--repeats", type=int, default=None, help="best of (5; quick: 3)")
    parser.add_argument("--seed", type=int, default=0, help="data generation seed")
    parser.add_argument("--workdir", type=Path, default=None, help="where the JSONL is cached")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    parser.add_argument("--quick", action="store_true", help="smaller defaults (see above)")
    args = parser.parse_args()
    # an explicit size wins over --quick's (a smoke test may shrink it further)
    defaults = (64, 10**6, 3) if args.quick else (1024, 10**8, 5)
    for name, default in zip(("size_mb", "range_size", "repeats"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, default)

    name = f"elastic-{args.size_mb}mb-{args.shards}shards-seed{args.seed}"
    directory = args.workdir / name if args.workdir else default_workdir(name)
    directory.mkdir(parents=True, exist_ok=True)
    manifest = generate_shards(directory, args.size_mb, args.shards, args.seed)
    paths = [str(directory / f) for f in manifest["files"]]
    epochs = [
        (jsonl_recipe(paths), manifest["records"], f"{args.size_mb} MB JSONL"),
        (range_recipe(args.range_size), args.range_size, f"range({args.range_size:,}).shuffle()"),
    ]

    print(
        f"Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}. "
        f"{args.before} -> {args.after} ranks in one process, num_workers=0, batch {BATCH}."
    )
    rows = []
    for recipe, items, label in epochs:
        per_rank = items // args.before // BATCH
        states, seconds = collect_states(recipe, args.before, per_rank)
        print(
            f"{label}: {items:,} items, {per_rank:,} batches a rank; collecting the states "
            f"took {seconds:.1f} s",
            flush=True,
        )
        for fraction in POSITIONS:
            best = measure(recipe, states[fraction], args.before, args.after, args.repeats)
            rows.append((label, fraction, best))
    text = (
        f"Time from load_state_dict to the first batch (slowest rank's best of {args.repeats}); "
        f"goal: elastic within {GOAL}x of a same-topology resume.\n\n"
        + markdown(rows, args.before, args.after)
    )
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
