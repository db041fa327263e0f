"""Running Python code in a fresh interpreter, for tests that cross a process boundary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, *args: str, hash_seed: str = "123") -> str:
    """Run ``python -c code args...`` in a new process; return its stdout, fail on error.

    ``hash_seed`` sets PYTHONHASHSEED, so tests can show that nothing depends on ``hash()``.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
