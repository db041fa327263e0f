"""Writes the Architecture page's module map from each module's first docstring line.

Run ``python docs/module_map.py`` after adding, moving or removing a module;
``tests/project/test_docs.py`` fails when the page and the code differ.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "concepts" / "architecture.md"
START = "## Module map\n"
END = "## Layout of the repository\n"


def first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else "(no docstring)"
    for special in "|[]":  # table cells, and no link or cross-reference is meant
        line = line.replace(special, "\\" + special)
    return line


def may_import(package: Path) -> str:
    """The package's rule of imports, as its docstring's ``May import:`` paragraph says."""
    doc = ast.get_docstring(ast.parse(package.read_text())) or ""
    for paragraph in doc.split("\n\n"):
        if paragraph.startswith("May import:"):
            return " ".join(paragraph.split())
    return "(no rule of imports)"


def module_map() -> str:
    """The module map section, as the page holds it."""
    out = [START, "\n", "Each module's first docstring line, as it says what the module owns.\n"]
    folders = sorted(
        {p.parent for top in ("datapipes", "nodes") for p in (ROOT / top).rglob("*.py")},
        key=lambda folder: (folder.relative_to(ROOT).parts[0], len(folder.parts), str(folder)),
    )
    for folder in folders:
        out += ["\n", f"### `{folder.relative_to(ROOT).as_posix()}/`\n", "\n"]
        package = folder / "__init__.py"
        out += [f"{first_line(package)} {may_import(package)}\n", "\n"]
        out += ["| module | what it owns |\n", "| --- | --- |\n"]
        for path in sorted(folder.glob("*.py")):
            out.append(f"| `{path.name}` | {first_line(path)} |\n")
    out.append("\n")
    return "".join(out)


def page_with_map(text: str) -> str:
    """``text`` (the Architecture page) with its module map section made anew."""
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + module_map() + END + tail


if __name__ == "__main__":
    PAGE.write_text(page_with_map(PAGE.read_text()))
    sys.exit(0)
