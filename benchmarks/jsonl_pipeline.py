"""JSONL training pipeline: read -> JSON decode -> map -> shuffle -> batch -> collate.

Generates (once, cached in ``--workdir``) a set of JSONL shards of about
``--size-mb`` MB in all, one record a line::

    {"id": 17, "text": "<~100 chars of random words>", "label": 3, "values": [8 floats]}

then runs the same work with three implementations, interleaved, and prints
records per second for each and the ratios:

* a hand-written Python generator (open each file, ``json.loads`` every line,
  map, a reservoir-style buffer shuffle with ``random.Random``, batch, collate);
* Hugging Face ``datasets`` streaming the same files (skipped if not installed);
* datapipes: ``dp.files(...).read_jsonl().map(f).shuffle(10_000).batch(256)``
  through ``dp.Loader``.

All three call the same map function (``features``) and the same collate
function (``collate``), use a 10,000-record shuffle buffer and batches of 256,
and must produce the same number of records with the same sum of ids. Usage::

    python benchmarks/jsonl_pipeline.py [--size-mb 256] [--shards 16] [--repeats 3]
    python benchmarks/jsonl_pipeline.py --size-mb 8      # quick mode

The data set is regenerated when the workdir lacks it (it is deterministic:
same ``--seed``, same bytes). ``resume_cost.py`` reuses the generator below.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import random
import shutil
import string
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

import torch

import datapipes as dp

BATCH = 256
BUFFER = 10_000
WORDS_PER_TEXT = 14  # ~7 chars a word with its space: ~100 chars of text
CHUNK = 10_000  # records per write
FORMAT_VERSION = 1

Record = dict[str, Any]
Batch = dict[str, torch.Tensor]


# ----- data generation -------------------------------------------------------------------
def vocabulary(seed: int, size: int = 2_000) -> list[str]:
    """``size`` random lowercase words of 2 to 10 letters."""
    rng = random.Random(seed)
    letters = string.ascii_lowercase
    return ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(size)]


def make_record(rng: random.Random, vocab: list[str], record_id: int) -> Record:
    return {
        "id": record_id,
        "text": " ".join(rng.choices(vocab, k=WORDS_PER_TEXT)),
        "label": rng.randrange(10),
        "values": [round(rng.uniform(-10.0, 10.0), 4) for _ in range(8)],
    }


def records_per_shard(shard_bytes: int, seed: int) -> int:
    """How many records make about ``shard_bytes`` bytes, from a seeded sample of lines."""
    rng, vocab = random.Random(seed - 1), vocabulary(seed)
    sample = [json.dumps(make_record(rng, vocab, 10**6)) for _ in range(2_000)]
    mean_line = sum(len(line) + 1 for line in sample) / len(sample)
    return max(1, round(shard_bytes / mean_line))


def write_shard(path: str, first_id: int, count: int, seed: int) -> int:
    """Write records ``first_id .. first_id + count - 1`` to ``path``; return its size."""
    rng, vocab = random.Random(seed * 1_000_003 + first_id), vocabulary(seed)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for start in range(first_id, first_id + count, CHUNK):
            stop = min(start + CHUNK, first_id + count)
            lines = [json.dumps(make_record(rng, vocab, i)) for i in range(start, stop)]
            f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return os.path.getsize(path)


def read_manifest(directory: Path, wanted: dict[str, int]) -> dict[str, Any] | None:
    """The manifest of a complete, matching data set in ``directory``, else ``None``."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if any(manifest.get(key) != value for key, value in wanted.items()):
        return None
    for name, size in zip(manifest["files"], manifest["sizes"]):
        path = directory / name
        if not path.is_file() or path.stat().st_size != size:
            return None
    return manifest


def cached_data_set(
    directory: Path, wanted: dict[str, int], what: str, build: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """The manifest of the data set in ``directory`` if it matches ``wanted``, else a new one.

    A new data set is made in an emptied ``directory`` by ``build()``, which
    returns the manifest's other entries (with ``files`` and their ``sizes``).
    """
    manifest = read_manifest(directory, wanted)
    if manifest is not None:
        return manifest
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    print(f"generating {what} under {directory} ...", flush=True)
    start = time.perf_counter()
    manifest = {**wanted, **build()}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    print(f"  done in {time.perf_counter() - start:.1f} s", flush=True)
    return manifest


def generate_shards(
    directory: Path, size_mb: int, shards: int, seed: int, prefix: str = "train"
) -> dict[str, Any]:
    """Shards ``{prefix}-00000-of-000NN.jsonl`` of ~``size_mb`` MB in all; cached by manifest.

    Record ids run 0, 1, 2, ... through the shards in order. Each shard has
    its own seeded RNG, so the bytes do not depend on how many processes write.
    """

    def build() -> dict[str, Any]:
        per_shard = records_per_shard(size_mb * 2**20 // shards, seed)
        names = [f"{prefix}-{i:05d}-of-{shards:05d}.jsonl" for i in range(shards)]
        with ProcessPoolExecutor(max_workers=min(shards, os.cpu_count() or 1)) as pool:
            sizes = list(
                pool.map(
                    write_shard,
                    [str(directory / name) for name in names],
                    [i * per_shard for i in range(shards)],
                    [per_shard] * shards,
                    [seed] * shards,
                )
            )
        return {"records": per_shard * shards, "files": names, "sizes": sizes}

    wanted = {"version": FORMAT_VERSION, "size_mb": size_mb, "shards": shards, "seed": seed}
    return cached_data_set(directory, wanted, f"{size_mb} MB in {shards} shard(s)", build)


def default_workdir(name: str) -> Path:
    return Path(tempfile.gettempdir()) / "datapipes-bench" / name


# ----- the work every implementation does -----------------------------------------------
def features(record: Record) -> dict[str, int | float]:
    """The map step: a few numbers per record."""
    return {
        "id": record["id"],
        "label": record["label"],
        "chars": len(record["text"]),
        "total": sum(record["values"]),
    }


def collate(batch: list[dict[str, int | float]]) -> Batch:
    """The collate step: one tensor per field."""
    return {
        "id": torch.tensor([r["id"] for r in batch]),
        "label": torch.tensor([r["label"] for r in batch]),
        "chars": torch.tensor([r["chars"] for r in batch]),
        "total": torch.tensor([r["total"] for r in batch], dtype=torch.float32),
    }


def batches(
    items: Iterable[Any], size: int = BATCH, collate_fn: Callable[[list[Any]], Any] = collate
) -> Iterator[Any]:
    """Collated batches of ``size`` items (the last one may be short)."""
    items = iter(items)
    while batch := list(islice(items, size)):
        yield collate_fn(batch)


# ----- the contenders --------------------------------------------------------------------
def buffer_shuffle(items: Iterable[Any], size: int, seed: int) -> Iterator[Any]:
    """Reservoir-style shuffle: emit a random buffered item, put the new one in its place."""
    rng = random.Random(seed)
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        yield buffer[j]
        buffer[j] = item
    rng.shuffle(buffer)
    yield from buffer


def read_jsonl(paths: list[str]) -> Iterator[Record]:
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)


def hand_written(paths: list[str], pattern: str) -> Iterator[Batch]:
    return batches(buffer_shuffle(map(features, read_jsonl(paths)), BUFFER, seed=0))


def hf_datasets(paths: list[str], pattern: str) -> Iterator[Batch]:
    from datasets import load_dataset

    ds = load_dataset("json", data_files=paths, split="train", streaming=True)
    # The fastest idiomatic arrangement we found: shuffle the raw Arrow-backed stream, then
    # the per-record map (map and shuffle commute, so the work is the same). Mapping first
    # makes the shuffle pull each of its interleaved shards a row at a time through a thread
    # future, 1.5-3x slower. ``remove_columns`` keeps only the fields ``features`` returns.
    # Rows are batched by hand with the shared ``collate``: ``ds.batch(256)`` yields dicts
    # of lists (another collate) and measured no faster.
    ds = ds.shuffle(buffer_size=BUFFER, seed=0)
    ds = ds.map(features, remove_columns=["text", "values"])
    return batches(ds)


def datapipes_loader(
    paths: list[str], pattern: str, stats: bool = False, trace: bool = False
) -> Iterator[Batch]:
    pipe = dp.files(pattern).read_jsonl().map(features).shuffle(BUFFER)
    loader = dp.Loader(pipe.batch(BATCH, collate_fn=collate), seed=0, stats=stats)
    return traced(loader) if trace else iter(loader)


def traced(loader: dp.Loader) -> Iterator[Batch]:
    """One epoch of ``loader`` inside ``loader.trace()``, the trace's file written (and
    removed) within the pass: what a trace costs, all of it."""
    folder = tempfile.mkdtemp(prefix="dp-trace-")
    try:
        with loader.trace(os.path.join(folder, "trace.json")):
            yield from loader
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def hf_available() -> bool:
    try:
        import datasets  # noqa: F401
    except ImportError:
        return False
    return True


# ----- measurement -----------------------------------------------------------------------
Contender = Callable[[list[str], str], Iterator[Batch]]


def run_once(make: Contender, paths: list[str], pattern: str) -> tuple[float, int, int]:
    """Seconds, record count and sum of ids for one full pass."""
    gc.collect()
    count = id_sum = 0
    start = time.perf_counter()
    for batch in make(paths, pattern):
        count += len(batch["id"])
        id_sum += int(batch["id"].sum())
    return time.perf_counter() - start, count, id_sum


def measure(
    contenders: dict[str, Contender], paths: list[str], pattern: str, repeats: int
) -> dict[str, float]:
    """Best-of-``repeats`` seconds per contender, taking turns within every repeat.

    Every pass must see every record exactly once: same count, same sum of ids.
    """
    best = dict.fromkeys(contenders, float("inf"))
    seen: dict[str, tuple[int, int]] = {}
    for _ in range(repeats):
        for name, make in contenders.items():
            seconds, count, id_sum = run_once(make, paths, pattern)
            best[name] = min(best[name], seconds)
            seen[name] = (count, id_sum)
    assert len(set(seen.values())) == 1, f"implementations disagree (count, sum of ids): {seen}"
    return best


def report(best: dict[str, float], records: int, skipped: list[str]) -> None:
    print(f"{'implementation':<28}{'records/s':>12}{'seconds':>10}")
    for name, seconds in best.items():
        print(f"{name:<28}{records / seconds:>12,.0f}{seconds:>10.2f}")
    for name in skipped:
        print(f"{name:<28}{'skipped':>12}")
    ours = best["datapipes"]
    for name, seconds in best.items():
        if name != "datapipes":
            print(f"datapipes speed vs {name:<24} = {seconds / ours:.2f}x  (>1: datapipes faster)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256, help="total size of the shards")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="passes per implementation")
    parser.add_argument("--seed", type=int, default=0, help="data generation seed")
    parser.add_argument("--workdir", type=Path, default=None, help="where the data is cached")
    args = parser.parse_args()

    name = f"jsonl-{args.size_mb}mb-{args.shards}shards-seed{args.seed}"
    directory = args.workdir or default_workdir(name)
    manifest = generate_shards(directory, args.size_mb, args.shards, args.seed)
    paths = sorted(glob.glob(str(directory / "train-*.jsonl")))
    pattern = str(directory / "train-*.jsonl")

    contenders: dict[str, Contender] = {"hand-written generator": hand_written}
    skipped = []
    if hf_available():
        contenders["HF datasets (streaming)"] = hf_datasets
    else:
        skipped.append("HF datasets (streaming)")
    contenders["datapipes"] = datapipes_loader

    best = measure(contenders, paths, pattern, args.repeats)
    records, mb = manifest["records"], sum(manifest["sizes"]) / 2**20
    print(
        f"{mb:.0f} MB, {len(paths)} JSONL shards, {records:,} records: read -> json -> map -> "
        f"shuffle({BUFFER:,}) -> batch({BATCH}) -> collate, best of {args.repeats}"
    )
    report(best, records, skipped)


if __name__ == "__main__":
    main()
