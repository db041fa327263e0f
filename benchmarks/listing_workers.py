"""What a large listing costs each DataLoader worker: time and memory to its first item.

Writes (once, cached in ``--workdir``) ``--files`` empty files, then runs
``dp.Loader(dp.files(<dir>/*.bin).map(report), num_workers=W)`` and takes one item
from each worker. ``report`` runs in the worker and returns its seconds from worker
start to its first item and its peak memory above its memory at start (``VmHWM``
minus ``VmRSS`` at ``worker_init_fn``): a worker that lists the files itself pays
the listing there; one that receives the Loader's listing should pay almost nothing.
It also prints how long the main process took to its first item (it lists once, or
not at all when the workers list). Usage::

    python benchmarks/listing_workers.py [--files 100000] [--workers 2] [--start fork|spawn]

Run it with ``PYTHONPATH=<an older checkout>`` to compare with a version whose
workers list for themselves.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import datapipes as dp

_STARTED: dict[str, float] = {}


def _memory_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def on_worker_start(worker_id: int) -> None:
    """``worker_init_fn``: remember when the worker started and its memory then."""
    _STARTED["time"] = time.monotonic()
    _STARTED["rss_kb"] = _memory_kb("VmRSS")


def report(url: str) -> dict[str, Any]:
    """This worker's cost to its first item (the map runs in the worker)."""
    return {
        "pid": os.getpid(),
        "seconds": time.monotonic() - _STARTED["time"],
        "peak_mb": (_memory_kb("VmHWM") - _STARTED["rss_kb"]) / 1024,
    }


def make_files(folder: Path, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if len(os.listdir(folder)) == count:
        return
    for i in range(count):
        (folder / f"f-{i:07d}.bin").touch()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--start", choices=("fork", "spawn"), default="fork")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "dp-listing"))
    args = parser.parse_args()
    folder = Path(args.workdir) / f"files-{args.files}"
    make_files(folder, args.files)
    pipe = dp.files(str(folder / "*.bin")).map(report)
    started = time.monotonic()
    loader = dp.Loader(
        pipe,
        num_workers=args.workers,
        worker_init_fn=on_worker_start,
        multiprocessing_context=args.start,
    )
    firsts: dict[int, dict[str, Any]] = {}
    main_first = None
    for item in loader:
        main_first = main_first or time.monotonic() - started
        firsts.setdefault(item["pid"], item)
        if len(firsts) == args.workers:
            break
    loader.close()
    print(f"{args.files} files, {args.workers} {args.start} workers ({dp.__file__})")
    print(f"main process: first item after {main_first:.2f} s")
    for i, item in enumerate(firsts.values()):
        seconds, peak = item["seconds"], item["peak_mb"]
        print(f"worker {i}: first item after {seconds:.2f} s, peak +{peak:.0f} MB")


if __name__ == "__main__":
    main()
