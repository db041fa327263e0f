"""The README's demo command checkpoints, resumes in a new process and verifies the stream."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test runs the demo in a new Python process


def test_demo_verifies_exact_resume(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "datapipes", "demo", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "interrupted + resumed == uninterrupted: True" in done.stdout
    assert "RESULT: exact resume verified" in done.stdout
    assert (tmp_path / "loader.pt").exists()


def test_unknown_command_is_explained() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "datapipes", "train"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "unknown command 'train'" in done.stderr
