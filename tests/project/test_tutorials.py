"""The tutorials: every one runs to completion as a script and, cell by cell, as a notebook
(each asserts what it teaches), and is linked from the README."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_RUNNER = ROOT / "tests" / "notebook_runner.py"
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))

#: The curriculum, in reading order; a tutorial that goes missing fails here, not silently.
EXPECTED = [
    "01_quickstart",
    "02_files_and_formats",
    "03_shuffling",
    "04_worker_processes",
    "05_checkpoint_and_resume",
    "06_distributed_training",
    "07_feeding_the_gpu",
    "08_reuse_across_projects",
    "09_preprocess_and_write",
    "10_text_pretraining",
    "11_inside_your_trainer",
]


def cells(script: Path) -> list[tuple[str, str]]:
    """``(kind, source)`` of each ``# %%`` cell, kind ``"code"`` or ``"markdown"``."""
    found: list[tuple[str, list[str]]] = []
    for line in script.read_text().splitlines():
        if line.startswith("# %%"):
            found.append(("markdown" if "[markdown]" in line else "code", []))
        elif found:
            found[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"{script.name}: code before the first # %% cell: {line!r}")
    return [(kind, "\n".join(lines)) for kind, lines in found]


def test_the_curriculum_is_complete():
    assert [p.stem for p in TUTORIALS] == EXPECTED


@pytest.mark.parametrize("script", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_is_a_notebook_of_cells_that_each_compile(script: Path):
    parsed = cells(script)
    kind, first = parsed[0]
    assert kind == "markdown" and first.startswith("# # "), "open with a title cell"
    assert f"python tutorials/{script.name}" in first, "say how to run it"
    for number, (kind, source) in enumerate(parsed):
        if kind == "markdown":
            assert all(not line or line.startswith("#") for line in source.splitlines()), (
                f"cell {number}: a markdown cell holds only comment lines"
            )
        else:
            compile(source, f"{script.name} cell {number}", "exec")
    code = "\n".join(source for kind, source in parsed if kind == "code")
    assert re.search(r"^\s*assert ", code, re.MULTILINE), "a tutorial asserts what it teaches"


def test_the_readme_links_every_tutorial():
    readme = (ROOT / "README.md").read_text()
    linked = re.findall(r"\]\((tutorials/[^)]+\.py)\)", readme)
    assert sorted(set(linked)) == [f"tutorials/{p.name}" for p in TUTORIALS]


@pytest.mark.slow
@pytest.mark.parametrize("script", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(script: Path, tmp_path: Path):
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout[-3000:]}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("script", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_as_a_notebook(script: Path, tmp_path: Path):
    """Cell by cell in one namespace without ``__file__``, as a Jupyter kernel runs it."""
    done = subprocess.run(
        [sys.executable, str(NOTEBOOK_RUNNER), str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout[-3000:]}\n{done.stderr}"
