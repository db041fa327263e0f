"""The house by concern: each package says what it may import and keeps to it; named modules exist.

Every package's ``__init__`` docstring has a ``May import:`` paragraph naming the
packages and modules its modules import from (besides the package itself). Module
names and file paths written in docstrings, comments and the documentation name
modules and files that exist.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(
    p.parent for top in ("datapipes", "nodes") for p in (ROOT / top).rglob("__init__.py")
)
DOTTED = re.compile(r"(?<![\w./-])((?:datapipes|nodes|tests)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
PATH = re.compile(r"(?<![\w./-])((?:datapipes|nodes|tests|benchmarks|tutorials|docs)/[\w/.-]*\w)")


def dotted(folder: Path) -> str:
    return ".".join(folder.relative_to(ROOT).parts)


def allowed_imports(package: Path) -> list[str]:
    """The names of a package's ``May import:`` paragraph (parenthesised remarks left out)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    rules = [p for p in doc.split("\n\n") if p.startswith("May import:")]
    assert rules, f"{dotted(package)}/__init__.py: its docstring has no 'May import:' paragraph"
    text = re.sub(r"\([^)]*\)", "", rules[0][len("May import:") :])
    return re.findall(r"(?:datapipes|nodes)(?:\.\w+)*", text)


def imports_of(path: Path) -> set[str]:
    """Every project module ``path`` imports, at its top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # ``from nodes import elastic`` imports nodes.elastic
                module = f"{node.module}.{alias.name}"
                found.add(module if is_module(module) else node.module)
    return {name for name in found if name.split(".")[0] in ("datapipes", "nodes")}


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("package", PACKAGES, ids=dotted)
def test_a_package_imports_only_what_its_docstring_allows(package: Path) -> None:
    own = dotted(package)
    allowed = allowed_imports(package)
    stray = sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in package.glob("*.py")
        for name in imports_of(path)
        if not within(name, own) and not any(within(name, rule) for rule in allowed)
    )
    assert not stray, f"{own} may import {allowed} only:\n" + "\n".join(stray)


def test_the_import_rule_is_read_and_enforced() -> None:
    rules = allowed_imports(ROOT / "nodes" / "storage")
    assert rules == ["nodes.errors", "nodes.credentials"]
    assert within("nodes.errors", rules[0]) and not within("nodes.errorsx", rules[0])
    assert not any(within("nodes.base", rule) for rule in rules)


def names_module(name: str) -> bool:
    """Whether a dotted name is a project module, or an attribute path inside one."""
    parts = name.split(".")
    if parts[0] == "tests":  # a test module is named, not imported: importing it runs its setup
        return any(is_module(".".join(parts[:cut])) for cut in range(len(parts), 1, -1))
    for cut in range(len(parts), 0, -1):
        if is_module(".".join(parts[:cut])):
            obj: object = importlib.import_module(".".join(parts[:cut]))
            for attr in parts[cut:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def written_text() -> list[tuple[str, str]]:
    """(where, text) of every project source file's docstrings and comments, and every page."""
    texts = []
    for top in ("datapipes", "nodes", "tests", "benchmarks", "tutorials", "docs"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == Path(__file__).resolve():  # its examples of stale names are meant
                continue
            source = path.read_text()
            pieces = [line.split("#", 1)[1] for line in source.splitlines() if "#" in line]
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    pieces.append(node.value)
            texts.append((str(path.relative_to(ROOT)), "\n".join(pieces)))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        texts.append((str(path.relative_to(ROOT)), path.read_text()))
    return texts


def test_module_names_and_paths_written_anywhere_exist() -> None:
    stale = set()
    for where, text in written_text():
        for name in DOTTED.findall(text):
            if name.endswith(".py"):  # a file name (a user's nodes.py), not a module path
                continue
            if not names_module(name):
                stale.add(f"{where}: {name}")
        for path in PATH.findall(text):
            if "*" in path or "{" in path:
                continue
            if not (ROOT / path).exists() and path.endswith((".py", ".md", "/")):
                stale.add(f"{where}: {path}")
    assert not stale, "names of modules or files that do not exist:\n" + "\n".join(sorted(stale))


def test_a_stale_module_name_is_found() -> None:
    assert names_module("nodes.steps.combine.ConcatNode")
    assert names_module("datapipes.resume")
    assert not names_module("datapipes.elastic")
    assert not names_module("nodes.steps.combine.NoSuchNode")
    assert names_module("tests.steps.test_random_map.shuffled")
    assert not names_module("tests.test_random_map")


def test_no_test_folder_shadows_a_project_package() -> None:
    """A script in ``tests/`` run as ``python tests/x.py`` has ``tests/`` first on its path.

    A folder there named like a project package (``tests/nodes``, no ``__init__``) is a
    namespace package that wins over an editable install, so ``from nodes import Context``
    fails in every subprocess the suite starts from another directory.
    """
    tops = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert {"datapipes", "nodes"} <= tops
    clashes = sorted(folder.name for folder in (ROOT / "tests").iterdir() if folder.name in tops)
    assert not clashes, f"tests/ folders named like project packages: {clashes}; rename them"


@pytest.mark.parametrize("top", ["datapipes", "nodes"])
def test_no_two_modules_of_one_layer_share_a_name(top: str) -> None:
    """A name shared by ``datapipes/`` and ``nodes/`` is one concern's recipe and runtime
    (``steps/combine.py`` and ``nodes/steps/combine.py``); inside one layer it is two jobs."""
    by_name: dict[str, list[str]] = {}
    for path in sorted((ROOT / top).rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert len(by_name) > 20
    assert not shared, f"modules of {top}/ that share a name: {shared}"
