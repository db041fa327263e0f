"""Cost of resuming a tar read mid-file: time to the first sample after ``load_state_dict``.

Writes one local tar of ``--samples`` samples of two members each (a ~1 KB
``.txt`` and a ``.cls``), takes states (round-tripped through JSON) after 0%,
10%, 50% and 90% of the samples in one untimed pass, then measures, best of
``--repeats``, a new Loader's ``load_state_dict(state)`` and its first sample.
A resume reads the header at the cursor and one block from there, so the time
should not grow with the position. Usage::

    python benchmarks/tar_resume.py [--samples 1000] [--repeats 20] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
import tempfile
import time
from itertools import islice
from pathlib import Path

import datapipes as dp

POSITIONS = (0.0, 0.1, 0.5, 0.9)


def write_tar(path: Path, samples: int) -> None:
    """``samples`` samples ``s000000.txt`` + ``s000000.cls``: 2 members each."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for j in range(samples):
            for field, data in (("txt", b"t" * (900 + j % 200)), ("cls", str(j).encode())):
                info = tarfile.TarInfo(f"s{j:06d}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        path = Path(tmp) / "data.tar"
        write_tar(path, args.samples)
        pipe = dp.files(str(path)).read_tar()
        positions = [int(p * args.samples) for p in POSITIONS]
        states = {}
        for k in positions:
            loader = dp.Loader(pipe)
            list(islice(iter(loader), k))
            states[k] = json.loads(json.dumps(loader.state_dict()))
        print(f"{args.samples} samples, {2 * args.samples} members, {path.stat().st_size:,} bytes")
        for k, p in zip(positions, POSITIONS):
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                loader = dp.Loader(pipe)
                loader.load_state_dict(states[k])
                first = next(iter(loader))
                best = min(best, time.perf_counter() - start)
                assert first["__key__"] == f"s{k:06d}", first["__key__"]
            print(f"resume at {p:4.0%} (sample {k:5d}): first sample after {best * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
