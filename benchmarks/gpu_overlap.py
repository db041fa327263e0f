"""Host-to-device copy / compute overlap of ``pipe.pin_memory().to_device()`` (needs CUDA).

A loop over ``--batches`` float32 batches of ``--mb`` MB each (page-locked CPU
tensors, or pageable ones with ``--pageable``), each copied to the GPU and fed to
a compute step: matmuls of the batch (viewed as ``rows x 1024``) by a
``1024 x C`` weight, ``C`` calibrated at start-up so that one compute step takes
about as long as one copy. Per batch, best of ``--repeats`` timed passes
(``torch.cuda.synchronize()`` before the clock starts and before it stops):

* blocking: ``x = src.to("cuda")`` (a synchronous copy), then compute;
* datapipes: ``for x in dp.Loader(dp.from_sequence(srcs).pin_memory().to_device("cuda"))``
  then compute (``to_device`` copies with ``non_blocking=True`` on a side stream);
* reference: a hand-written side-stream prefetcher (the copy of batch i+1 issued
  on a side stream before the compute of batch i, the compute stream waiting on
  an event, ``record_stream``): what plain PyTorch overlap reaches on this machine;
* ideal: copy and compute timed separately (copies only; compute only, on a
  batch already on the GPU); a perfect overlap takes ``max(copy, compute)``.

``overlap = (t_blocking - t_x) / min(t_copy, t_compute)``: 0 means no overlap
(copy + compute), 1 means the shorter of the two is fully hidden.

Correctness, checked before timing, for datapipes and the reference: every batch
that reaches the loop is on the GPU and equals its CPU source. Each batch is
checksummed on the compute stream *after* a compute step on it (a bit-exact
int64 sum of its bits), so a copy that the compute stream did not wait for, or
GPU memory recycled for a later copy while the compute still reads it, shows as
a wrong checksum; the first and last batches are also compared in full.

Without CUDA the script says so and exits with status 0. Usage::

    python benchmarks/gpu_overlap.py [--batches 32] [--mb 64] [--repeats 5] [--pageable]
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

import datapipes as dp

COLS = 1024  # a batch is viewed as (rows, COLS) float32

Tensor = torch.Tensor


# ----- the compute step ------------------------------------------------------------------
class Compute:
    """``out = x @ w`` with ``w`` of ``COLS x width`` (``out`` reused: no allocation)."""

    def __init__(self, like: Tensor, width: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.w = (torch.randn(COLS, width, generator=gen) / math.sqrt(COLS)).to(like.device)
        self.out = like.new_empty((like.numel() // COLS, width))

    def __call__(self, x: Tensor) -> Tensor:
        return torch.mm(x.view(-1, COLS), self.w, out=self.out)


def gpu_seconds(fn: Callable[[], Any], times: int) -> float:
    """Mean GPU seconds of ``fn()`` by CUDA events (after one warm-up call)."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(times):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / times


def calibrate(x: Tensor, target: float) -> tuple[Compute, float]:
    """A compute step of about ``target`` GPU seconds on ``x`` (time linear in the width)."""
    width = 256
    for _ in range(4):
        step = Compute(x, width)
        seconds = gpu_seconds(lambda step=step: step(x), 10)
        wanted = max(64, min(16_384, round(width * target / seconds / 64) * 64))
        if wanted == width:
            break
        width = wanted
    step = Compute(x, width)
    return step, gpu_seconds(lambda: step(x), 10)


# ----- the loops -------------------------------------------------------------------------
def blocking_batches(sources: list[Tensor], device: torch.device) -> Iterator[Tensor]:
    for src in sources:
        yield src.to(device)  # synchronous: the host waits for the copy (and prior work)


def datapipes_batches(loader: dp.Loader) -> Iterator[Tensor]:
    return iter(loader)


def reference_batches(sources: list[Tensor], device: torch.device) -> Iterator[Tensor]:
    """The usual side-stream prefetcher: copy i+1 is issued before batch i is handed out."""
    side = torch.cuda.Stream(device=device)

    def issue(src: Tensor) -> tuple[Tensor, torch.cuda.Event, Tensor]:
        with torch.cuda.stream(side):
            moved = src.to(device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
        return moved, done, src

    pending = issue(sources[0]) if sources else None
    for i in range(len(sources)):
        assert pending is not None
        moved, done, _src = pending  # _src: the source stays alive until the copy is done
        compute = torch.cuda.current_stream(device)
        compute.wait_event(done)
        moved.record_stream(compute)
        pending = issue(sources[i + 1]) if i + 1 < len(sources) else None
        yield moved


def timed(batches: Iterable[Tensor], step: Compute) -> tuple[float, int]:
    """Wall seconds for the whole loop, GPU work included, and the batch count."""
    gc.collect()
    torch.cuda.synchronize()
    start = time.perf_counter()
    count = 0
    for x in batches:
        step(x)
        count += 1
    torch.cuda.synchronize()
    return time.perf_counter() - start, count


def copy_only(sources: list[Tensor], device: torch.device) -> tuple[float, int]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for src in sources:
        src.to(device, non_blocking=True)  # pinned: async on the current stream, in order
    torch.cuda.synchronize()
    return time.perf_counter() - start, len(sources)


def compute_only(x: Tensor, step: Compute, n: int) -> tuple[float, int]:
    return timed((x for _ in range(n)), step)


# ----- correctness -----------------------------------------------------------------------
def bits_sum(t: Tensor) -> Tensor:
    """A bit-exact, order-independent checksum of a float32 tensor (on its own device)."""
    return t.view(torch.int32).sum(dtype=torch.int64)


def check(name: str, batches: Iterable[Tensor], sources: list[Tensor], step: Compute) -> None:
    """Every batch is on CUDA and bit-equal to its source, read after a compute step on it."""
    expected = [int(bits_sum(src)) for src in sources]
    sums: list[Tensor] = []
    first = last = None
    for i, x in enumerate(batches):
        assert x.is_cuda, f"{name}: batch {i} is on {x.device}, not on CUDA"
        assert x.shape == sources[i].shape and x.dtype == sources[i].dtype, f"{name}: batch {i}"
        step(x)  # keeps the compute stream busy while the next copies are issued
        sums.append(bits_sum(x))  # read on the compute stream, after the compute
        if i == 0:
            first = x.cpu()
        last = x
        del x
    torch.cuda.synchronize()
    assert len(sums) == len(sources), f"{name}: {len(sums)} batches, expected {len(sources)}"
    wrong = [i for i, (got, want) in enumerate(zip(sums, expected)) if int(got) != want]
    assert not wrong, f"{name}: batches {wrong} differ from their CPU sources on the GPU"
    assert first is not None and last is not None
    assert torch.equal(first, sources[0]), f"{name}: first batch differs from its source"
    assert torch.equal(last.cpu(), sources[-1]), f"{name}: last batch differs from its source"
    print(f"  {name}: {len(sums)} batches on {last.device}, all equal to their CPU sources")


# ----- main ------------------------------------------------------------------------------
def make_sources(n: int, mb: int, pinned: bool) -> list[Tensor]:
    numel = mb * 2**20 // 4 // COLS * COLS
    gen = torch.Generator().manual_seed(0)
    sources = []
    for _ in range(n):
        src = torch.randn(numel, generator=gen)
        sources.append(src.pin_memory() if pinned else src)
    return sources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=32, help="batches per timed pass")
    parser.add_argument("--mb", type=int, default=64, help="size of one batch in MB")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per loop")
    parser.add_argument(
        "--pageable", action="store_true", help="pageable sources (pin_memory() then pins)"
    )
    args = parser.parse_args()
    if args.batches < 2 or args.mb < 1 or args.repeats < 1:
        parser.error("need --batches >= 2, --mb >= 1, --repeats >= 1")

    if not torch.cuda.is_available():
        print("gpu_overlap.py: CUDA is not available on this machine; nothing to measure.")
        sys.exit(0)

    device = torch.device("cuda", torch.cuda.current_device())
    name = torch.cuda.get_device_name(device)
    sources = make_sources(args.batches, args.mb, pinned=not args.pageable)
    n, nbytes = len(sources), sources[0].numel() * 4
    kind = "pageable" if args.pageable else "pinned"
    print(f"{name}, torch {torch.__version__}: {n} x {nbytes / 2**20:.0f} MB {kind} batches")

    # Calibrate the compute step to about one copy.
    copy_only(sources, device)  # warm-up
    t_copy = copy_only(sources, device)[0] / n
    resident = sources[0].to(device)
    step, t_mm = calibrate(resident, t_copy)
    print(
        f"copy {t_copy * 1e3:.2f} ms ({nbytes / t_copy / 1e9:.1f} GB/s); compute: "
        f"({resident.numel() // COLS} x {COLS}) @ ({COLS} x {step.w.shape[1]}), "
        f"{t_mm * 1e3:.2f} ms by CUDA events"
    )

    loader = dp.Loader(dp.from_sequence(sources).pin_memory().to_device("cuda"))
    loops: dict[str, Callable[[], tuple[float, int]]] = {
        "blocking .to(cuda)": lambda: timed(blocking_batches(sources, device), step),
        "datapipes to_device": lambda: timed(datapipes_batches(loader), step),
        "reference side stream": lambda: timed(reference_batches(sources, device), step),
        "copy only": lambda: copy_only(sources, device),
        "compute only": lambda: compute_only(resident, step, n),
    }

    print("correctness:")
    check("datapipes to_device", datapipes_batches(loader), sources, step)
    check("reference side stream", reference_batches(sources, device), sources, step)

    for run in loops.values():  # warm-up: cuBLAS, streams, caching allocators
        run()
    best = dict.fromkeys(loops, math.inf)
    for repeat in range(args.repeats):
        for key, run in loops.items() if repeat % 2 == 0 else reversed(loops.items()):
            seconds, count = run()
            assert count == n, f"{key}: {count} batches, expected {n}"
            best[key] = min(best[key], seconds / n)
    loader.close()

    t_block, t_dp = best["blocking .to(cuda)"], best["datapipes to_device"]
    t_ref, t_c, t_k = best["reference side stream"], best["copy only"], best["compute only"]
    hideable = min(t_c, t_k)
    print(f"\nms per batch, best of {args.repeats} passes of {n} batches:")
    print(f"{'loop':<26}{'ms/batch':>10}{'overlap':>10}")
    for key, seconds in best.items():
        overlap = ""
        if key in ("datapipes to_device", "reference side stream"):
            overlap = f"{(t_block - seconds) / hideable:.2f}"
        print(f"{key:<26}{seconds * 1e3:>10.3f}{overlap:>10}")
    print(f"{'ideal max(copy, compute)':<26}{max(t_c, t_k) * 1e3:>10.3f}{'1.00':>10}")
    print(f"{'no overlap copy + compute':<26}{(t_c + t_k) * 1e3:>10.3f}{'0.00':>10}")
    print(
        f"\noverlap fraction = (t_blocking - t) / min(t_copy, t_compute): datapipes "
        f"{(t_block - t_dp) / hideable:.2f}, reference {(t_block - t_ref) / hideable:.2f} "
        "(1: the shorter of copy and compute fully hidden; 0: none)"
    )
    if (t_block - t_ref) - (t_block - t_dp) > 0.3 * hideable:
        print(
            "note: the reference overlaps and datapipes does not: a copy that waits for the "
            "compute already queued (e.g. side_stream.wait_stream(current_stream) before each "
            "copy) runs after the previous batch's compute, never beside it"
        )


if __name__ == "__main__":
    main()
