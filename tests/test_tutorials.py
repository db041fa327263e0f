"""Every tutorial runs to completion (each asserts what it teaches)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).parent.parent / "tutorials").glob("*.py"))


def test_there_are_tutorials() -> None:
    assert TUTORIALS, "tutorials/ holds no scripts"


@pytest.mark.parametrize("script", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout}\n{done.stderr}"
