"""Other libraries' private names are read in the adapter modules only, each listed there.

torch, torchdata, numpy and HF ``datasets`` change their private names without notice;
the adapters (:data:`ADAPTERS`) are where datapipes reads them, each name tested
against the installed library. These tests read the source of ``datapipes/`` and
``nodes/`` and fail, naming the file and line, when a private name of these
libraries is read anywhere else, or when an adapter reads one its docstring does not list.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = (
    "nodes/adapters/torchdata.py",
    "nodes/adapters/torch.py",
    "nodes/adapters/third_party.py",
)
LIBRARIES = frozenset({"torch", "torchdata", "numpy", "datasets"})
ACCESSORS = frozenset({"getattr", "hasattr", "setattr", "delattr"})


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name.strip("_") != ""


def sources() -> list[Path]:
    return sorted(p for folder in ("datapipes", "nodes") for p in (ROOT / folder).rglob("*.py"))


def root_name(node: ast.AST) -> str | None:
    """The name an attribute chain starts from (``torch`` in ``torch.a.b``), if any."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def library_names(tree: ast.AST) -> set[str]:
    """The names a module binds to the libraries' modules and objects (``np``, ``dist``, ...)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in LIBRARIES:
                bound.update(alias.asname or alias.name for alias in node.names)
    return bound


def private_reads(tree: ast.AST) -> Iterator[tuple[ast.AST, str, str | None]]:
    """Each private name a module reads off something not its own: ``(node, name, root)``,
    ``root`` the name the read starts from (``None`` for an import or a string)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                for part in alias.name.split("."):
                    if is_private(part):
                        yield node, part, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            for part in node.module.split(".") + [alias.name for alias in node.names]:
                if is_private(part):
                    yield node, part, top
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            root = root_name(node.value)
            if root not in ("self", "cls"):
                yield node, node.attr, root
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ACCESSORS
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
        ):
            root = root_name(node.args[0])
            if root not in ("self", "cls"):
                yield node, node.args[1].value, root
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and is_private(node.value)
            and node.value.isidentifier()
        ):
            yield node, node.value, None


def adapter_names(path: Path) -> set[str]:
    """The private names an adapter reads off the libraries (and the methods it overrides)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {name for _, name, _ in private_reads(tree)}
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        names.update(
            item.name
            for item in cls.body
            if isinstance(item, ast.FunctionDef) and is_private(item.name)
        )
    return names


def project_names(paths: list[Path]) -> set[str]:
    """The private names datapipes and nodes define themselves: attributes they set on their
    own objects, slots, functions, classes, module globals, keyword arguments."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            names.add(leaf.id)
                        elif isinstance(leaf, ast.Attribute) and root_name(leaf.value) in (
                            "self",
                            "cls",
                        ):
                            names.add(leaf.attr)
                        elif isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
                            names.add(leaf.value)  # __slots__ and dict keys of our own
    return {name for name in names if is_private(name)}


def outside_adapters() -> list[Path]:
    adapters = {ROOT / name for name in ADAPTERS}
    return [path for path in sources() if path not in adapters]


def test_no_module_but_an_adapter_reads_a_private_name_of_torch_torchdata_numpy_datasets():
    paths = outside_adapters()
    listed = set().union(*(adapter_names(ROOT / name) for name in ADAPTERS))
    # The names an adapter reads off library objects (a DataLoader iterator, an HF dataset)
    # are found wherever they are read, unless datapipes uses the same name for its own.
    known = listed - project_names(paths)
    found: set[tuple[str, int, str]] = set()
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound = library_names(tree)
        for node, name, root in private_reads(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and root not in LIBRARIES:
                continue  # the project's own modules
            if root in bound or root in LIBRARIES or name in known:
                found.add((str(path.relative_to(ROOT)), getattr(node, "lineno", 0), name))
    assert not found, (
        "private names of torch, torchdata, numpy or datasets read outside the adapters "
        f"({', '.join(ADAPTERS)}); read them through a function of an adapter, listed in "
        "its docstring and tested against the library:\n"
        + "\n".join(f"{file}:{line}: {name}" for file, line, name in sorted(found))
    )


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_each_private_name_an_adapter_reads_is_listed_in_its_docstring(adapter: str) -> None:
    path = ROOT / adapter
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    missing = sorted(
        name for name in adapter_names(path) if not re.search(rf"\b{re.escape(name)}\b", docstring)
    )
    assert not missing, (
        f"{adapter} reads private names its docstring does not list: {', '.join(missing)}; "
        "list each at the top, with what it is used for"
    )
