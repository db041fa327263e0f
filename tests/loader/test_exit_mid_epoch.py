"""A process that exits while a Loader with workers (or a map pool) is mid-epoch exits quietly.

The Loader's iterator, still held by a module global, is finalized only as
the interpreter clears module globals; closing the workers then called
functions already set to None and printed ``Exception ignored in:
<generator object Loader._run> ... TypeError: 'NoneType' object is not
callable``. Each case runs a real interpreter to its normal exit.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from subprocess_helpers import ROOT

CODE = """
import sys
import datapipes as dp

shape = sys.argv[1]
pipe = dp.range(10**6).map(abs)
options = {"num_workers": 2}
if shape == "persistent":
    options["persistent_workers"] = True
if shape == "bundles":
    options["items_per_transfer"] = 4
if shape == "prefetch":
    pipe = pipe.prefetch(4)
if shape == "thread-map":  # a thread pool in this process, no worker processes
    pipe = dp.range(10**6).map(abs, num_workers=2, method="thread")
    options = {}
loader = dp.Loader(pipe, **options)
it = iter(loader)
got = [next(it) for _ in range(10)]
print(len(set(got)) == 10, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["plain", "persistent", "bundles", "prefetch", "thread-map"])
def test_exiting_mid_epoch_prints_nothing(shape: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CODE, shape],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
