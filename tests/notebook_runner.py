"""Run a percent-format script the way a notebook kernel runs it: cell by cell, in one
``__main__`` namespace that has no ``__file__``, each cell's source registered in
``linecache`` under a name of its own (as IPython does, so ``inspect`` finds functions).

Usage: ``python tests/notebook_runner.py tutorials/01_quickstart.py``; exits non-zero
with the cell number and traceback when a cell fails.
"""

from __future__ import annotations

import linecache
import sys
import traceback
import types
from pathlib import Path


def code_cells(script: Path) -> list[str]:
    """The source of every ``# %%`` code cell (markdown cells skipped)."""
    cells: list[tuple[bool, list[str]]] = []
    for line in script.read_text().splitlines(keepends=True):
        if line.startswith("# %%"):
            cells.append(("[markdown]" not in line, []))
        elif cells:
            cells[-1][1].append(line)
    return ["".join(lines) for is_code, lines in cells if is_code]


def run_as_notebook(script: Path) -> None:
    """Execute ``script``'s code cells in order in a fresh ``__main__`` without ``__file__``."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = [str(script)]
    for number, source in enumerate(code_cells(script)):
        name = f"<notebook cell {number}>"
        linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
        try:
            exec(compile(source, name, "exec"), main.__dict__)
        except Exception:
            traceback.print_exc()
            failed = f"{script.name}: code cell {number} failed as a notebook cell"
            raise SystemExit(failed) from None


if __name__ == "__main__":
    run_as_notebook(Path(sys.argv[1]))
