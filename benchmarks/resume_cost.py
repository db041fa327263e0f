"""Cost of resuming a JSONL read mid-file: time to the first records after ``load_state_dict``.

Generates (once, cached in ``--workdir``) one JSONL file of about ``--size-mb`` MB,
records ``{"id": i, "text": ..., "label": ..., "values": [...]}`` with ``id`` equal
to the line number. For resume positions at 0%, 10%, 50% and 90% of the records it
measures, best of ``--repeats``:

* datapipes: ``dp.Loader(dp.files(path).read_jsonl(), seed=0)``, a new Loader,
  ``load_state_dict(state)``, then the first ``--records`` records. The states are
  collected beforehand in one untimed pass (``state_dict()`` after the first k
  records, round-tripped through JSON like a checkpoint). Resuming seeks to a byte
  offset, so the time should not grow with the position (goal: ~1.0x the 0% time);
* plain Python that must re-read from the start
  (``for i, line in enumerate(f): if i >= k: json.loads(line) ...``), for contrast.

Every resumed stream is checked: its records must be ids k, k+1, ... Usage::

    python benchmarks/resume_cost.py [--size-mb 1024] [--records 1000] [--repeats 10]
    python benchmarks/resume_cost.py --size-mb 64        # quick mode
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

from jsonl_pipeline import FORMAT_VERSION, default_workdir, generate_shards, read_manifest

import datapipes as dp

POSITIONS = (0.0, 0.1, 0.5, 0.9)
PARTS = 16  # the file is written as parts in parallel, then concatenated

Record = dict[str, Any]
State = dict[str, Any]


# ----- data ------------------------------------------------------------------------------
def generate_file(directory: Path, size_mb: int, seed: int) -> tuple[Path, int]:
    """One JSONL file of ~``size_mb`` MB with ids 0, 1, 2, ... (cached); its path and count."""
    wanted = {"version": FORMAT_VERSION, "size_mb": size_mb, "shards": 1, "seed": seed}
    manifest = read_manifest(directory, wanted)
    if manifest is None:
        parts_dir = directory / "parts"
        parts = generate_shards(parts_dir, size_mb, PARTS, seed, prefix="part")
        path = directory / "data.jsonl"
        with open(path, "wb") as out:
            for name in parts["files"]:
                with open(parts_dir / name, "rb") as part:
                    shutil.copyfileobj(part, out, 16 * 2**20)
        shutil.rmtree(parts_dir)
        size = path.stat().st_size
        manifest = {**wanted, "records": parts["records"], "files": [path.name], "sizes": [size]}
        (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory / manifest["files"][0], manifest["records"]


# ----- the two ways to resume ------------------------------------------------------------
def pipeline(path: Path) -> dp.DataPipe[Record]:
    return dp.files(str(path)).read_jsonl()


def collect_states(loader: Any, positions: list[int]) -> tuple[dict[int, State], float]:
    """``loader.state_dict()`` after its first k items, for each k (one pass); and its seconds.

    ``loader`` is anything iterable with ``state_dict()`` (a ``dp.Loader``, a
    ``torchdata.nodes.Loader``, a ``StatefulDataLoader``); it is closed if it can be.
    """
    stream = iter(loader)
    states: dict[int, State] = {}
    done = 0
    start = time.perf_counter()
    for k in sorted(positions):
        deque(islice(stream, k - done), maxlen=0)
        done = k
        states[k] = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint would
    seconds = time.perf_counter() - start
    if hasattr(loader, "close"):
        loader.close()
    return states, seconds


def datapipes_resume(path: Path, state: State, count: int) -> list[Record]:
    loader = dp.Loader(pipeline(path), seed=0)
    loader.load_state_dict(state)
    records = list(islice(loader, count))
    loader.close()
    return records


def plain_resume(path: Path, k: int, count: int) -> list[Record]:
    records: list[Record] = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= k:
                records.append(json.loads(line))
                if len(records) == count:
                    break
    return records


# ----- measurement -----------------------------------------------------------------------
def timed(resume: Callable[[], list[Record]], k: int, count: int) -> float:
    """Seconds for one resume; checks it returned ids k, k+1, ..."""
    gc.collect()
    start = time.perf_counter()
    records = resume()
    seconds = time.perf_counter() - start
    ids = [r["id"] for r in records]
    assert ids == list(range(k, k + count)), f"resume at {k} returned ids {ids[:3]}..."
    return seconds


def measure(
    path: Path, states: dict[int, State], count: int, repeats: int
) -> dict[int, tuple[float, float]]:
    """Best-of-``repeats`` (datapipes, plain) seconds per position, interleaved."""
    best = {k: (float("inf"), float("inf")) for k in states}
    for _ in range(repeats):
        for k, state in states.items():
            ours = timed(lambda: datapipes_resume(path, state, count), k, count)  # noqa: B023
            plain = timed(lambda: plain_resume(path, k, count), k, count)  # noqa: B023
            best[k] = (min(best[k][0], ours), min(best[k][1], plain))
    return best


def report(best: dict[int, tuple[float, float]], fractions: list[float]) -> None:
    base_ours, base_plain = best[min(best)]
    header = ("position", 8), ("record", 12), ("datapipes", 12), ("vs 0%", 8)
    header += ("plain re-read", 15), ("vs 0%", 9)
    print("".join(f"{title:>{width}}" for title, width in header))
    for fraction, (k, (ours, plain)) in zip(fractions, sorted(best.items())):
        print(
            f"{fraction:>8.0%}{k:>12,}{ours * 1e3:>9.1f} ms{ours / base_ours:>7.2f}x"
            f"{plain * 1e3:>12.1f} ms{plain / base_plain:>8.1f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the JSONL file")
    parser.add_argument("--records", type=int, default=1_000, help="records read after resume")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="data generation seed")
    parser.add_argument("--workdir", type=Path, default=None, help="where the file is cached")
    args = parser.parse_args()

    directory = args.workdir or default_workdir(f"resume-{args.size_mb}mb-seed{args.seed}")
    path, total = generate_file(directory, args.size_mb, args.seed)
    fractions = list(POSITIONS)
    positions = [min(int(f * total), total - args.records) for f in fractions]
    states, seconds = collect_states(dp.Loader(pipeline(path), seed=0), positions)
    size_mb = path.stat().st_size / 2**20
    print(
        f"{size_mb:.0f} MB JSONL file, {total:,} records. Collecting the states took "
        f"{seconds:.1f} s ({positions[-1] / seconds:,.0f} records/s through read_jsonl)."
    )
    best = measure(path, states, args.records, args.repeats)
    print(
        f"Time to the first {args.records:,} records after a resume "
        f"(new Loader + load_state_dict + read), best of {args.repeats}:"
    )
    report(best, fractions)


if __name__ == "__main__":
    main()
