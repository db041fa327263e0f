"""Time to read one JSONL record that is a single line of 6, 12, 25 and 50 MB.

A line longer than a read block used to be re-scanned from its start at
every 64 KiB read (quadratic); it is now scanned once. The reference is
``json.loads`` of the same bytes. Usage::

    python benchmarks/long_lines.py [--sizes-mb 6 12 25 50] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import datapipes as dp


def make_line(path: Path, size_mb: float) -> None:
    """A JSONL file with one record of about ``size_mb`` MB: a list of short strings."""
    words = ["alpha", "beta", "gamma", "delta"]
    count = int(size_mb * 1e6 / 9)
    path.write_text(json.dumps({"words": [words[i % 4] for i in range(count)]}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[6, 12, 25, 50])
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for size in args.sizes_mb:
            path = Path(tmp) / f"line_{size:g}mb.jsonl"
            make_line(path, size)
            data = path.read_bytes()
            start = time.perf_counter()
            json.loads(data)
            reference = time.perf_counter() - start
            start = time.perf_counter()
            records = list(dp.Loader(dp.files(str(path)).read_jsonl()))
            took = time.perf_counter() - start
            assert len(records) == 1
            print(
                f"{len(data) / 1e6:6.1f} MB line: read_jsonl {took:6.2f} s, "
                f"json.loads {reference:5.2f} s"
            )


if __name__ == "__main__":
    main()
