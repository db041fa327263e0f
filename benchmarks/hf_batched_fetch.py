"""Map-style datasets with ``__getitems__``: datapipes against torch's ``DataLoader``.

One shuffled epoch in batches of ``B``, for

* a Hugging Face ``datasets.Dataset`` built in memory (``--rows`` rows: an int ``label``
  and a 32-float ``vec``) with ``with_format("torch")`` (``--only hf-plain``: the same
  without a format, rows of Python lists);
* a torch map-style ``Dataset`` over numpy arrays that defines ``__getitems__`` (one
  fancy-indexing gather per call) next to its ``__getitem__``; samples are
  ``(tensor of 32 floats, int label)``;

read by ``DataLoader(ds, batch_size=B, shuffle=True, num_workers=W)`` and by
``dp.Loader(dp.from_sequence(ds).shuffle().batch(B), num_workers=W)``, for B = 64 and
256 and W = 0 and 2. The two take turns in every repeat (the order reversed every other
repeat) and the best of ``--repeats`` counts; the ratio is ours / theirs (< 1.00x means
datapipes is faster). Every pass is checked: every row once (the count and the sum of
the labels). torch runs with 1 intra-op thread (``--torch-threads``), as in workers.
Usage::

    python benchmarks/hf_batched_fetch.py                 # about 4 minutes on 2 cores
    python benchmarks/hf_batched_fetch.py --quick         # 5,000 rows, 1 repeat (smoke test)
    python benchmarks/hf_batched_fetch.py --only hf --workers 0 --repeats 9

``--fetch-sizes 16,64,256`` instead times ``dp.from_sequence(ds).shuffle()`` item by
item (no batch), for the chunk size a source fetches when no batch follows it.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import time
from collections.abc import Callable, Iterable
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # built in memory: never ask the Hub
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import datapipes as dp  # noqa: E402

DIM = 32
SIZES = (64, 256)
WORKERS = (0, 2)
DATASETS = ("hf", "torch")


# ----- the data --------------------------------------------------------------------------
def columns(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1000, rows), rng.random((rows, DIM), dtype=np.float32)


def hf_dataset(rows: int, seed: int, fmt: str | None = "torch") -> Any:
    from datasets import Dataset as HFDataset

    labels, vectors = columns(rows, seed)
    return HFDataset.from_dict({"label": labels, "vec": vectors}).with_format(fmt)


class ArrayDataset(Dataset):
    """A torch map-style dataset over arrays: ``__getitems__`` gathers a batch in one call."""

    def __init__(self, rows: int, seed: int) -> None:
        self.labels, self.vectors = columns(rows, seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.vectors[i]), int(self.labels[i])

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        vectors = torch.from_numpy(self.vectors[indices])  # one gather, a fresh array
        return list(zip(vectors, self.labels[indices].tolist()))


def make_dataset(name: str, rows: int, seed: int) -> Any:
    if name == "torch":
        return ArrayDataset(rows, seed)
    return hf_dataset(rows, seed, "torch" if name == "hf" else None)


# ----- one pass --------------------------------------------------------------------------
def labels_of(batch: Any) -> torch.Tensor:
    return batch["label"] if isinstance(batch, dict) else batch[1]


def timed_pass(batches: Iterable[Any]) -> tuple[float, int, int]:
    """Seconds for one epoch, its row count and the sum of its labels."""
    gc.collect()
    start = time.perf_counter()
    count = total = 0
    for batch in batches:
        labels = labels_of(batch)
        count += len(labels)
        total += int(labels.sum())
    return time.perf_counter() - start, count, total


def theirs(ds: Any, size: int, workers: int) -> Iterable[Any]:
    return DataLoader(ds, batch_size=size, shuffle=True, num_workers=workers)


def ours(ds: Any, size: int, workers: int) -> Iterable[Any]:
    return dp.Loader(dp.from_sequence(ds).shuffle().batch(size), num_workers=workers)


def measure(
    ds: Any, size: int, workers: int, repeats: int, expected: tuple[int, int]
) -> tuple[float, float]:
    """Best seconds of (DataLoader, datapipes) over interleaved repeats, every pass checked."""
    best = {theirs: float("inf"), ours: float("inf")}
    for repeat in range(repeats):
        order: list[Callable[..., Iterable[Any]]] = [theirs, ours]
        for make in order if repeat % 2 == 0 else order[::-1]:
            seconds, count, total = timed_pass(make(ds, size, workers))
            if (count, total) != expected:
                raise AssertionError(
                    f"{make.__name__}: {count} rows, label sum {total}; expected {expected}"
                )
            best[make] = min(best[make], seconds)
    return best[theirs], best[ours]


def fetch_sizes(ds: Any, sizes: list[int], repeats: int) -> None:
    """Per-item cost of ``from_sequence(ds).shuffle()`` with each chunk size (no batch)."""
    from nodes import Context

    pipe = dp.from_sequence(ds).shuffle()
    print("| chunk | us per item |\n|---:|---:|")
    for size in sizes:
        best = float("inf")
        for _ in range(repeats):
            node = pipe.build(Context())
            node.fetch_size = size
            node.reset()
            start = time.perf_counter()
            count = sum(1 for _ in node)
            best = min(best, (time.perf_counter() - start) / count)
        print(f"| {size} | {best * 1e6:.1f} |")


# ----- report ----------------------------------------------------------------------------
def header(rows: int, repeats: int) -> str:
    import datasets

    return (
        f"Machine: {os.cpu_count()} cores, {platform.system()}; Python "
        f"{platform.python_version()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} intra-op threads), datasets {datasets.__version__}. "
        f"{rows:,} rows, best of {repeats}."
    )


def table(results: list[tuple[str, int, int, float, float]]) -> str:
    lines = [
        "| dataset | workers | batch | DataLoader | datapipes | datapipes / DataLoader |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    names = {
        "hf": "HF Dataset (torch format)",
        "hf-plain": "HF Dataset (no format)",
        "torch": "torch Dataset + __getitems__",
    }
    for name, workers, size, them, us in results:
        lines.append(
            f"| {names[name]} | {workers} | {size} | {them:.3f} s | {us:.3f} s | {us / them:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="rows (100,000; quick: 5,000)")
    parser.add_argument("--repeats", type=int, default=None, help="best of (5; quick: 1)")
    parser.add_argument("--only", default=",".join(DATASETS), help="hf,torch (or hf-plain)")
    parser.add_argument("--workers", default=",".join(map(str, WORKERS)), help="0,2")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="batch sizes")
    parser.add_argument("--fetch-sizes", default=None, help="time chunk sizes instead")
    parser.add_argument("--seed", type=int, default=0, help="data generation seed")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--markdown", default=None, help="also write the report here")
    parser.add_argument("--quick", action="store_true", help="small defaults (see above)")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    rows = args.rows or (5_000 if args.quick else 100_000)
    repeats = args.repeats or (1 if args.quick else 5)

    if args.fetch_sizes:
        sizes = [int(size) for size in args.fetch_sizes.split(",")]
        fetch_sizes(hf_dataset(rows, args.seed), sizes, repeats)
        return
    results = []
    for name in args.only.split(","):
        ds = make_dataset(name, rows, args.seed)
        expected = (rows, int(columns(rows, args.seed)[0].sum()))
        for workers in map(int, args.workers.split(",")):
            for size in map(int, args.sizes.split(",")):
                them, us = measure(ds, size, workers, repeats, expected)
                results.append((name, workers, size, them, us))
                print(f"{name} workers={workers} B={size}: {them:.3f} s vs {us:.3f} s", flush=True)
    report = f"{header(rows, repeats)}\n\n{table(results)}\n"
    print(report)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as out:
            out.write(report)


if __name__ == "__main__":
    main()
