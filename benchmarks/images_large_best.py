"""images_large's best settings only, interleaved for more rounds than ``compare.py``.

``compare.py --only images_large`` tries every library at 0-3 workers or 1-4
threads (21 rows, about 20 minutes on 2 cores); on a machine shared with other
work its few turns per row are noisy. This runs the settings that were best
there (the same functions, ``images_large_peers``), each once per round, the
order reversed every other round, for ``--rounds`` rounds, and prints every
pass, then the best and median images/s and the least CPU ms/image per row, the
ratio of datapipes' best to the best peer's, and both limits
(``images_large.measure_limit``, before the rows and after each round: the best)
with datapipes' share of the region-decode limit, by images/s and by CPU time
per image. Usage::

    python benchmarks/images_large_best.py [--rounds 4] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import images_large as data  # noqa: E402
import images_large_bench as bench  # noqa: E402
import images_large_peers as peers  # noqa: E402

ROWS = {
    "hand-written IterableDataset in DataLoader (2 workers)": (peers.hand_written, 2),
    "webdataset (2 workers)": (peers.webdataset, 2),
    "Grain (4 threads)": (peers.grain_threads, 4),
    "datapipes (2 workers)": (peers.datapipes, 2),
    "datapipes (3 workers)": (peers.datapipes, 3),
    "datapipes, threads (2 threads)": (peers.datapipes_threads, 2),
}


def cpu_seconds() -> float:
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=None, help="data cache (default: temp)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="images-large-"))
    made = data.generate_shards(workdir / "photos-4x800", 4, 800, 0)
    paths = [str(workdir / "photos-4x800" / name) for name in made["files"]]
    limit = data.measure_limit(paths, 300, 2)
    rates: dict[str, list[float]] = {name: [] for name in ROWS}
    cpu: dict[str, list[float]] = {name: [] for name in ROWS}
    names = list(ROWS)
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            make, setting = ROWS[name]
            gc.collect()
            start, start_cpu, count = time.perf_counter(), cpu_seconds(), 0
            for batch in make(paths, setting, 256):
                count += bench.keep(batch)[0]
            seconds = time.perf_counter() - start
            assert count == made["samples"], (name, count)
            rates[name].append(count / seconds)
            cpu[name].append((cpu_seconds() - start_cpu) / count * 1e3)
            print(
                f"round {round_ + 1}: {name:56s} {count / seconds:6.0f} images/s "
                f"{cpu[name][-1]:5.2f} CPU ms/image (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
        # The limit once per round too, merged into the best of all: it gets as many chances
        # at a quiet moment as each row (one measurement at a busy moment would make every
        # row's share look larger than it is).
        measured = data.measure_limit(paths, 300, 2)
        limit = data.best_limit(limit, measured)
        if measured["region"] is not None:
            print(
                f"round {round_ + 1}: {'region-decode limit':56s} "
                f"{measured['region']['limit']:6.0f} images/s",
                flush=True,
            )
    print("\n| row | best images/s | median | least CPU ms/image |\n| --- | ---: | ---: | ---: |")
    for name in names:
        print(
            f"| {name} | {max(rates[name]):,.0f} | {statistics.median(rates[name]):,.0f} "
            f"| {min(cpu[name]):.2f} |"
        )
    ours = [n for n in names if n.startswith("datapipes")]
    theirs = [n for n in names if n not in ours]
    for label, pick in (("best", max), ("median", statistics.median)):
        mine = max(ours, key=lambda n: pick(rates[n]))
        peer = max(theirs, key=lambda n: pick(rates[n]))
        print(
            f"{label}: {mine} {pick(rates[mine]):,.0f} / {peer} {pick(rates[peer]):,.0f} = "
            f"{pick(rates[mine]) / pick(rates[peer]):.2f}x the best peer"
        )
    region = limit["region"]
    text = "not measured" if region is None else f"{region['limit']:,.0f} images/s"
    print(f"today's limit {limit['limit']:,.0f} images/s; region-decode limit {text}")
    best = max(max(rates[n]) for n in ours)
    if region is not None:
        print(f"datapipes' best: {best / region['limit']:.0%} of the region-decode limit")
        # The view load disturbs least: the region decode + crop's CPU time per image on one
        # thread over the row's CPU time per image (every process's, the training loop's too).
        region_ms = 1e3 / max(region["rates"].values())
        least = min(min(cpu[n]) for n in ours)
        print(
            f"in CPU time: region decode + crop {region_ms:.2f} ms/image, datapipes' least "
            f"{least:.2f} ms/image: {region_ms / least:.0%}"
        )


if __name__ == "__main__":
    main()
