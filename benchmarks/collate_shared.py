"""What a large uint8 batch costs to make in a DataLoader worker and to receive in the main process.

A Loader with ``--workers`` worker processes collates ``--batches`` batches of
``--batch`` uint8 CHW images (3x224x224 by default: 38.5 MB a batch), two
ways, taking turns: ``dp.default_collate`` (stacked into shared memory in the
worker) and a plain ``torch.stack`` into ordinary memory (which torch copies
into shared memory when it sends the batch). Each sample is a fresh copy of
one random image (the copy stands for a decode). Prints, per batch, best of
``--repeats``: wall time and the main process's CPU time from the second
batch on (receiving: unpickling, mapping the shared memory, freeing it; the
workers' start and this script's checks left out), the workers' CPU time
(start, collating and sending), and checks that every batch equals the one
collated in this process::

    python benchmarks/collate_shared.py [--batches 12] [--repeats 5] [--workers 1]
"""

from __future__ import annotations

import argparse
import gc
import resource
import time
from typing import Any

import torch

import datapipes as dp


class Images:
    """``index -> a copy of one of a few random CHW uint8 images`` (picklable, cheap)."""

    def __init__(self, shape: tuple[int, ...], seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.images = [
            torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator) for _ in range(4)
        ]

    def __call__(self, index: int) -> torch.Tensor:
        return self.images[index % len(self.images)].clone()


def plain_stack(samples: list[torch.Tensor]) -> torch.Tensor:
    """The collate before shared memory: ``torch.stack`` into ordinary memory."""
    return torch.stack(samples)


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def one_pass(pipe: dp.DataPipe[Any], workers: int) -> tuple[float, float, float, list[Any]]:
    """Wall and main CPU seconds per batch after the first (the workers' start left out),
    workers' CPU seconds per batch, and a digest of each batch, for one epoch."""
    gc.collect()
    kids0 = _cpu(resource.RUSAGE_CHILDREN)
    loader = iter(dp.Loader(pipe, num_workers=workers))
    seen = []
    checking = 0.0  # the main's CPU spent on the digests, not on receiving
    for batch in loader:
        if not seen:  # the steady state starts at the second batch
            start, main0 = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
        before = _cpu(resource.RUSAGE_SELF)
        seen.append((tuple(batch.shape), int(batch.view(-1)[:4096].sum()), int(batch[-1].sum())))
        checking += _cpu(resource.RUSAGE_SELF) - before if len(seen) > 1 else 0.0
    steady = max(len(seen) - 1, 1)
    wall, main = time.perf_counter() - start, _cpu(resource.RUSAGE_SELF) - main0 - checking
    del loader, batch
    gc.collect()
    kids = _cpu(resource.RUSAGE_CHILDREN) - kids0
    return wall / steady, main / steady, kids / len(seen), seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    images = Images((3, args.size, args.size))
    items = dp.range(args.batch * args.batches).map(images)
    pipes = {
        "torch.stack (ordinary memory)": items.batch(args.batch, collate_fn=plain_stack),
        "dp.default_collate (shared memory)": items.batch(args.batch),
    }
    expected = one_pass(pipes["torch.stack (ordinary memory)"], 0)[3]
    best = dict.fromkeys(pipes, (float("inf"),) * 3)
    for repeat in range(args.repeats):
        for name in list(pipes)[:: 1 if repeat % 2 == 0 else -1]:
            wall, main_cpu, kids_cpu, seen = one_pass(pipes[name], args.workers)
            assert seen == expected, f"{name}: the batches differ from the in-process ones"
            best[name] = tuple(min(a, b) for a, b in zip(best[name], (wall, main_cpu, kids_cpu)))
    mb = args.batch * 3 * args.size**2 / 2**20
    print(
        f"{args.batches} batches of {args.batch}x3x{args.size}x{args.size} uint8 ({mb:.1f} MiB), "
        f"{args.workers} worker(s), best of {args.repeats}, torch {torch.__version__}; per batch:"
    )
    print("| collate | wall (ms) | main CPU (ms) | workers' CPU (ms) |")
    print("|---|---:|---:|---:|")
    for name, (wall, main_cpu, kids_cpu) in best.items():
        print(f"| {name} | {wall * 1e3:.1f} | {main_cpu * 1e3:.2f} | {kids_cpu * 1e3:.1f} |")


if __name__ == "__main__":
    main()
