"""The documentation: the site builds strictly, and its Python blocks run as they stand.

Every ```python block of README.md and of the pages in docs/ runs, page by
page in order in one namespace, in an empty folder as the working directory.
A block that cannot run here by nature (a torchrun job, a remote bucket) says
so on its first line, visibly to readers: ``# not run in the tests: <why>``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import datapipes as dp

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NOT_RUN = "# not run in the tests:"
FENCE = re.compile(r"^( *)```python\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md"))]
# Pages whose blocks start processes (DataLoader workers): slow, like the other such tests.
SLOW_PAGES = {"docs/guides/workers-and-ranks.md"}


def python_blocks(markdown: str) -> list[str]:
    """The ```python blocks of a Markdown text, dedented to their fence, in order."""
    blocks = []
    for match in FENCE.finditer(markdown):
        indent = len(match.group(1))
        blocks.append("".join(line[indent:] for line in match.group(2).splitlines(True)))
    return blocks


def runnable(blocks: list[str]) -> list[str]:
    return [b for b in blocks if not b.lstrip().startswith(NOT_RUN)]


def test_python_blocks_are_found_and_the_skip_marker_is_rare() -> None:
    readme = python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(runnable(readme)) >= 4, "README.md lost its runnable tour"
    assert all("import datapipes as dp" in block for block in readme), "each block stands alone"
    blocks = [b for page in PAGES for b in python_blocks((ROOT / page).read_text("utf-8"))]
    skipped = len(blocks) - len(runnable(blocks))
    # The marker is for what cannot run by nature; most examples must run.
    assert skipped <= len(blocks) // 4, f"{skipped} of {len(blocks)} blocks are not run"


def test_python_blocks_keep_indented_fences() -> None:
    text = "a\n\n  ```python\n  x = 1\n  ```\n\n```python\n# not run in the tests: why\n```\n"
    assert python_blocks(text) == ["x = 1\n", "# not run in the tests: why\n"]
    assert runnable(python_blocks(text)) == ["x = 1\n"]


def pages_with_blocks() -> list:
    pages = [p for p in PAGES if runnable(python_blocks((ROOT / p).read_text("utf-8")))]
    return [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p for p in pages]


@pytest.mark.parametrize("page", pages_with_blocks())
# The files guide shows a skipped bad record, which warns once by design.
@pytest.mark.filterwarnings("ignore::nodes.errors.BadRecordWarning")
def test_python_blocks_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = runnable(python_blocks((ROOT / page).read_text(encoding="utf-8")))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for number, block in enumerate(blocks, 1):
        code = compile(block, f"{page}, python block {number}", "exec")
        exec(code, namespace)


def test_version_is_the_installed_one_or_the_pyproject_one(tmp_path: Path) -> None:
    from importlib import metadata

    from datapipes.version import package_version

    try:
        installed = metadata.version("datapipes-torch")
    except metadata.PackageNotFoundError:
        installed = None
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    assert dp.__version__ == (installed or declared)
    assert "__version__" in dp.__all__
    # Not installed: the pyproject's version; no pyproject either: an explicit unknown.
    missing = "datapipes-torch-not-installed"
    assert package_version(missing, ROOT / "pyproject.toml") == declared
    other = tmp_path / "pyproject.toml"
    other.write_text('[project]\nname = "x"\nversion = "9.8.7"\n', encoding="utf-8")
    assert package_version(missing, other) == "9.8.7"
    assert package_version(missing, tmp_path / "absent.toml") == "0+unknown"


def test_license_is_the_declared_one() -> None:
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "BSD 3-Clause License" in license_text
    assert "the datapipes authors" in license_text
    assert 'license = { text = "BSD-3-Clause" }' in (ROOT / "pyproject.toml").read_text("utf-8")


def test_readme_is_short_and_links_pages_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\(((?:docs|tutorials)/[^)#]+)", readme):
        assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"


@pytest.mark.slow
def test_site_builds_strictly(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' (the test extra has it)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-4000:]}"
    assert (tmp_path / "reference" / "datapipes" / "index.html").is_file()
    assert "Loader" in (tmp_path / "reference" / "datapipes" / "index.html").read_text("utf-8")


def test_api_reference_lists_every_public_name() -> None:
    import nodes

    reference = (DOCS / "reference").glob("*.md")
    documented = set(
        re.findall(r"^::: ([\w.]+)", "\n".join(p.read_text("utf-8") for p in reference), re.M)
    )
    public = {f"datapipes.{n}" for n in dp.__all__ if n != "__version__"}
    public |= {f"nodes.{n}" for n in nodes.__all__} | {"nodes.testing"}
    assert not public - documented, f"add to docs/reference/: {sorted(public - documented)}"


def test_the_architecture_page_maps_every_module_as_its_docstring_says() -> None:
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from module_map import PAGE, page_with_map
    finally:
        sys.path.remove(str(ROOT / "docs"))
    text = PAGE.read_text()
    assert text == page_with_map(text), (
        "the module map of docs/concepts/architecture.md is out of date: run "
        "`python docs/module_map.py`"
    )
