"""Where the CPU time of the JSONL pipeline goes with and without DataLoader workers.

For each contender it runs full passes over the JSONL benchmark data (the one of
``compare.py --only jsonl``: 32 MB in 16 shards by default) and prints wall time,
records/s, the main process's CPU seconds and the worker processes' CPU seconds
(``RUSAGE_CHILDREN`` once the workers are joined), each per record and each
the best of ``--repeats`` on its own (other work on the machine inflates CPU
time as well as wall time). With those:

* the plain process's CPU per record ``s`` (the hand-written generator);
* with ``N`` workers, the main's CPU per record ``m`` and the workers' ``w``:
  on ``C`` cores the best rate is ``min(C / (m + w), N / w, 1 / m)`` records/s,
  and the speed-up over the plain process ``s`` times that.

The ``datapipes N workers`` row runs the Loader's defaults
(``items_per_transfer="auto"``: up to 16 batches a transfer here).
``--items-per-transfer 1,4`` adds rows with ``Loader(items_per_transfer=K)``:
the same workers sending ``K`` batches per DataLoader transfer (``1``: the
default before ``"auto"``), which shows what the DataLoader's per-item round
trip costs (the order of the batches is runs of a transfer per worker; the
records are the same).

``--profile`` runs one more pass of the datapipes worker contender under
cProfile (main process only) and prints its top functions by own time.
Usage::

    python benchmarks/main_process_profile.py [--size-mb 32] [--repeats 3] [--workers 2]
    python benchmarks/main_process_profile.py --items-per-transfer 1,4 --repeats 5
    python benchmarks/main_process_profile.py --profile
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import glob
import io
import math
import os
import pstats
import resource
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jsonl_pipeline  # noqa: E402
import workers_pipeline  # noqa: E402

import datapipes as dp  # noqa: E402

Contender = Callable[[list[str], str], Iterator[Any]]


def transferred(paths: list[str], pattern: str, workers: int, k: int) -> Iterator[Any]:
    """The datapipes worker pipeline with ``Loader(items_per_transfer=k)``: each worker
    sends ``k`` batches per DataLoader transfer (runs of ``k`` per worker)."""
    pipe = dp.files(pattern).read_jsonl().map(jsonl_pipeline.features)
    pipe = pipe.shuffle(jsonl_pipeline.BUFFER)
    pipe = pipe.batch(jsonl_pipeline.BATCH, collate_fn=jsonl_pipeline.collate)
    return iter(dp.Loader(pipe, seed=0, num_workers=workers, items_per_transfer=k))


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def one_pass(make: Contender, paths: list[str], pattern: str) -> tuple[float, float, float, int]:
    """Wall seconds, main-process CPU seconds, children's CPU seconds, records, for a pass.

    The children's time counts once they are joined: the iterator is dropped and
    collected (a DataLoader joins its workers) before it is read.
    """
    gc.collect()
    start, main0, kids0 = (
        time.perf_counter(),
        _cpu(resource.RUSAGE_SELF),
        _cpu(resource.RUSAGE_CHILDREN),
    )
    count = 0
    stream = make(paths, pattern)
    for batch in stream:
        count += len(batch["id"])
    wall, main = time.perf_counter() - start, _cpu(resource.RUSAGE_SELF) - main0
    del stream
    gc.collect()
    return wall, main, _cpu(resource.RUSAGE_CHILDREN) - kids0, count


def contenders(workers: int, transfers: list[int]) -> dict[str, Contender]:
    runs = {
        "plain process (hand-written)": jsonl_pipeline.hand_written,
        "datapipes 0 workers": jsonl_pipeline.datapipes_loader,
        f"torch DataLoader {workers} workers": partial(
            workers_pipeline.torch_dataloader, workers=workers
        ),
        f"datapipes {workers} workers": partial(workers_pipeline.datapipes_loader, workers=workers),
    }
    for k in transfers:
        name = f"datapipes {workers} workers, items_per_transfer={k}"
        runs[name] = partial(transferred, workers=workers, k=k)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=32)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--items-per-transfer",
        default="",
        help="comma-separated K: rows with Loader(items_per_transfer=K)",
    )
    parser.add_argument("--only", default="", help="comma-separated contender name parts")
    parser.add_argument("--profile", action="store_true", help="cProfile the main process")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()

    directory = args.workdir or jsonl_pipeline.default_workdir(
        f"jsonl-{args.size_mb}mb-{args.shards}shards"
    )
    manifest = jsonl_pipeline.generate_shards(directory, args.size_mb, args.shards, 0)
    paths = sorted(glob.glob(str(directory / "train-*.jsonl")))
    pattern = str(directory / "train-*.jsonl")
    records = manifest["records"]
    transfers = [int(k) for k in args.items_per_transfer.split(",") if k]
    runs = contenders(args.workers, transfers)
    if args.only:
        wanted = args.only.split(",")
        runs = {k: v for k, v in runs.items() if any(w in k for w in wanted)}

    best: dict[str, tuple[float, float, float]] = {}
    warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")
    print(f"{records:,} records, load {os.getloadavg()[0]:.2f}", flush=True)
    for repeat in range(args.repeats):
        order = list(runs.items()) if repeat % 2 == 0 else list(runs.items())[::-1]
        for name, make in order:
            wall, main_cpu, kids_cpu, count = one_pass(make, paths, pattern)
            assert count == records, f"{name}: {count} records, expected {records}"
            # each measure's best on its own: a busy machine inflates CPU time too
            old = best.get(name, (math.inf,) * 3)
            best[name] = (min(old[0], wall), min(old[1], main_cpu), min(old[2], kids_cpu))
            print(
                f"  {name:<32} {wall:6.2f} s {records / wall:>9,.0f} rec/s  main "
                f"{main_cpu:5.2f} s  workers {kids_cpu:5.2f} s",
                flush=True,
            )
    print(f"\nbest of {args.repeats}, load {os.getloadavg()[0]:.2f}; CPU in us per record")
    print("| contender | records/s | main CPU/rec | workers CPU/rec | total CPU/rec |")
    print("|---|---:|---:|---:|---:|")
    for name, (wall, main_cpu, kids_cpu) in best.items():
        m, w = main_cpu / records * 1e6, kids_cpu / records * 1e6
        print(f"| {name} | {records / wall:,.0f} | {m:.2f} | {w:.2f} | {m + w:.2f} |")
    cores = os.cpu_count() or 1
    workers = [name for name in best if name.startswith(f"datapipes {args.workers} workers")]
    for single in ("plain process (hand-written)", "datapipes 0 workers"):
        if single not in best:
            continue
        s = best[single][1] / records  # one process: all its CPU is the main's
        for name in workers:
            m, w = best[name][1] / records, best[name][2] / records
            bound = min(cores / (m + w), args.workers / w, 1 / m)
            print(
                f"{name} vs {single}: bound on {cores} cores from CPU per record "
                f"{bound:,.0f} records/s = {bound * s:.2f}x; measured wall "
                f"{best[single][0] / best[name][0]:.2f}x"
            )
    if args.profile:
        make = partial(workers_pipeline.datapipes_loader, workers=args.workers)
        profiler = cProfile.Profile()
        profiler.enable()
        one_pass(make, paths, pattern)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())


if __name__ == "__main__":
    main()
