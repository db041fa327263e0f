"""Parquet read: every row of a set of Parquet shards, as a dict per row or as record batches.

Generates (once, cached in the workdir) Parquet shards of the JSONL workload's records
(``jsonl_pipeline.make_record``: ``{"id", "text" (~100 chars), "label", "values" (8
floats)}``) in row groups of ``ROW_GROUP`` rows, then reads them with:

* a hand-written loop: ``pyarrow.parquet.ParquetFile(path).iter_batches()`` and
  ``RecordBatch.to_pylist()`` per batch (the baseline for dicts per row);
* the same loop yielding the record batches (the baseline for batches);
* Hugging Face ``datasets`` streaming the same files
  (``load_dataset("parquet", data_files=..., streaming=True)``), a dict per row;
* datapipes: ``dp.files(...).read_parquet()`` (dicts) and
  ``read_parquet(batches=True)`` through ``dp.Loader``.

Every implementation must deliver the same rows (count and sum of ids). Run it through
``compare.py`` (``python benchmarks/compare.py --only parquet``), or on its own::

    python benchmarks/parquet_read.py [--quick] [--repeats 5]
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonl_pipeline

import datapipes as dp

ROW_GROUP = 10_000
FORMAT_VERSION = 1


def write_shard(path: str, first_id: int, rows: int, seed: int) -> int:
    """One shard of ``rows`` records with ids from ``first_id``; returns its size in bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed * 1_000_003 + first_id)
    vocab = jsonl_pipeline.vocabulary(seed)
    records = [jsonl_pipeline.make_record(rng, vocab, first_id + i) for i in range(rows)]
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=ROW_GROUP)
    return Path(path).stat().st_size


def generate_shards(directory: Path, rows: int, shards: int, seed: int = 0) -> dict[str, Any]:
    """Shards ``train-00000-of-000NN.parquet`` of ``rows`` records in all; cached by manifest."""

    def build() -> dict[str, Any]:
        per_shard = rows // shards
        names = [f"train-{i:05d}-of-{shards:05d}.parquet" for i in range(shards)]
        sizes = [
            write_shard(str(directory / name), i * per_shard, per_shard, seed)
            for i, name in enumerate(names)
        ]
        return {"records": per_shard * shards, "files": names, "sizes": sizes}

    wanted = {"version": FORMAT_VERSION, "rows": rows, "shards": shards, "seed": seed}
    return jsonl_pipeline.cached_data_set(
        directory, wanted, f"{rows:,} rows in {shards} Parquet shard(s)", build
    )


# ----- the contenders: (paths, glob pattern) -> an iterator of rows or record batches ----------
def hand_written_rows(paths: list[str], pattern: str) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches():
            yield from batch.to_pylist()


def hand_written_batches(paths: list[str], pattern: str) -> Iterator[Any]:
    import pyarrow.parquet as pq

    for path in paths:
        yield from pq.ParquetFile(path).iter_batches()


def hf_datasets(paths: list[str], pattern: str) -> Iterator[dict[str, Any]]:
    from datasets import load_dataset

    return iter(load_dataset("parquet", data_files=paths, split="train", streaming=True))


def datapipes_rows(paths: list[str], pattern: str) -> Iterator[dict[str, Any]]:
    return iter(dp.Loader(dp.files(pattern).read_parquet()))


def datapipes_batches(paths: list[str], pattern: str) -> Iterator[Any]:
    return iter(dp.Loader(dp.files(pattern).read_parquet(batches=True)))


HAND_ROWS = "hand-written pyarrow iter_batches + to_pylist (dicts)"
HAND_BATCHES = "hand-written pyarrow iter_batches (batches)"
HF = "HF datasets (streaming, dicts)"
DP_ROWS = "datapipes read_parquet (dicts)"
DP_BATCHES = "datapipes read_parquet(batches=True)"

#: (name, contender, the row it is compared with; None: the workload's baseline)
CONTENDERS = [
    (HAND_ROWS, hand_written_rows, None),
    (HF, hf_datasets, HAND_ROWS),
    (DP_ROWS, datapipes_rows, HAND_ROWS),
    (HAND_BATCHES, hand_written_batches, HAND_ROWS),
    (DP_BATCHES, datapipes_batches, HAND_BATCHES),
]


def keep(item: Any) -> tuple[int, int]:
    """(rows, sum of ids) of a row (a dict) or of a record batch."""
    if isinstance(item, dict):
        return 1, item["id"]
    ids = item.column("id")
    return len(ids), sum(ids.to_pylist())


def digest(kept: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(k[0] for k in kept), sum(k[1] for k in kept)


if __name__ == "__main__":  # python benchmarks/parquet_read.py: compare.py's parquet workload
    import subprocess

    here = Path(__file__).resolve().parent
    sys.exit(
        subprocess.call(
            [sys.executable, str(here / "compare.py"), "--only", "parquet"] + sys.argv[1:]
        )
    )
