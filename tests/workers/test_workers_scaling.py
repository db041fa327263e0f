"""The worker-scaling measurement scripts run end to end on small data (no timings checked).

``benchmarks/main_process_profile.py`` splits a pass's CPU time between the
main process and the workers; ``benchmarks/collate_shared.py`` measures a
large uint8 batch collated in a worker. Both check their own outputs (record
counts, batches equal to the in-process ones) and exit non-zero otherwise.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each runs DataLoader workers in a new Python process

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_main_process_profile_splits_cpu_between_main_and_workers(tmp_path: Path) -> None:
    out = run(
        "main_process_profile.py",
        *("--size-mb", "1", "--shards", "4", "--repeats", "1", "--items-per-transfer", "4"),
        *("--workdir", str(tmp_path)),
    )
    rows = re.findall(r"^\| ([^|]+) \| ([\d,]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", out, re.M)
    names = [row[0] for row in rows]
    assert names == [
        "plain process (hand-written)",
        "datapipes 0 workers",
        "torch DataLoader 2 workers",
        "datapipes 2 workers",
        "datapipes 2 workers, items_per_transfer=4",
    ]
    for name, _rate, main, workers, total in rows:
        assert abs(float(main) + float(workers) - float(total)) < 0.02, name
        assert (float(workers) > 0) == ("workers" in name and not name.endswith(" 0 workers"))
    bound = r"^(.+) vs (.+): bound on \d+ cores from CPU per record [\d,]+ records/s"
    singles = [single for _, single in re.findall(bound, out, re.M)]
    assert singles == ["plain process (hand-written)"] * 2 + ["datapipes 0 workers"] * 2


def test_collate_shared_benchmark_checks_its_batches() -> None:
    out = run("collate_shared.py", *("--batch", "16", "--batches", "3", "--size", "128"))
    out += run("collate_shared.py", *("--batch", "16", "--batches", "2", "--repeats", "1"))
    names = re.findall(r"^\| (torch\.stack[^|]*|dp\.default_collate[^|]*)\|", out, re.M)
    assert [name.strip() for name in names] == [
        "torch.stack (ordinary memory)",
        "dp.default_collate (shared memory)",
    ] * 2
