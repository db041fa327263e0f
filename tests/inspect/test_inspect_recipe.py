"""``inspect --recipe``: the forms it accepts, from any directory, and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest

import datapipes as dp
from datapipes.inspect import CheckpointError, load_recipe
from tests.subprocess_helpers import ROOT

RECIPE = """
import datapipes as dp

pipe = dp.range(40).shuffle().batch(4)


def make_pipe():
    return dp.range(40).shuffle().batch(4)


def make_loader():
    return dp.Loader(make_pipe(), seed=5)


def needs_an_argument(size):
    return dp.range(size)


NUMBER = 3
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path/proj`` with ``recipes_<id>.py`` and ``pkg_<id>/jobs.py`` (names unique to
    the test: imported modules stay in ``sys.modules``); the cwd is ``tmp_path/elsewhere``."""
    proj = tmp_path / "proj"
    package = proj / f"pkg_{tmp_path.name}"
    package.mkdir(parents=True)
    (proj / f"recipes_{tmp_path.name}.py").write_text(RECIPE)
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(RECIPE)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    before = set(sys.modules)
    yield proj
    for name in set(sys.modules) - before:
        if tmp_path.name in name:
            del sys.modules[name]


def forms_named(message: str) -> bool:
    return "MODULE:NAME" in message and "path/to/file.py:NAME" in message


def test_a_file_path_relative_to_the_cwd_and_a_factory(project: Path) -> None:
    name = f"recipes_{project.parent.name}.py"
    pipe, loader = load_recipe(f"../proj/{name}:pipe")
    assert loader is None and pipe.fingerprint() == dp.range(40).shuffle().batch(4).fingerprint()
    made, loader = load_recipe(f"{project / name}:make_pipe")  # absolute, called
    assert loader is None and made.fingerprint() == pipe.fingerprint()
    made, loader = load_recipe(f"../proj/{name}:make_loader")
    assert loader is not None and loader.seed == 5 and made.fingerprint() == pipe.fingerprint()


def test_a_module_of_the_current_directory_and_a_dotted_one(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    suffix = project.parent.name
    pipe, _ = load_recipe(f"recipes_{suffix}:make_pipe")
    assert pipe.fingerprint() == dp.range(40).shuffle().batch(4).fingerprint()
    assert load_recipe(f"pkg_{suffix}.jobs:pipe")[0].fingerprint() == pipe.fingerprint()
    assert str(project) not in sys.path  # the cwd is on the path only while importing


def test_a_module_not_found_from_another_directory_names_what_was_tried(project: Path) -> None:
    with pytest.raises(CheckpointError) as raised:
        load_recipe(f"recipes_{project.parent.name}:pipe")
    message = str(raised.value)
    assert f"no module 'recipes_{project.parent.name}'" in message
    assert os.getcwd() in message and "PYTHONPATH" in message and forms_named(message)
    with pytest.raises(CheckpointError, match=r"no module 'pkg_\w+'") as raised:
        load_recipe(f"pkg_{project.parent.name}.jobs:pipe")
    assert forms_named(str(raised.value))


def test_a_missing_file_names_its_full_path_and_the_forms(project: Path) -> None:
    with pytest.raises(CheckpointError) as raised:
        load_recipe("proj/recipes.py:pipe")  # relative to the cwd, which is elsewhere
    message = str(raised.value)
    assert repr(str(project.parent / "elsewhere" / "proj" / "recipes.py")) in message
    assert forms_named(message)


def test_a_missing_name_lists_what_the_module_has(project: Path) -> None:
    with pytest.raises(CheckpointError) as raised:
        load_recipe(f"../proj/recipes_{project.parent.name}.py:pipes")
    message = str(raised.value)
    assert "has no 'pipes'" in message and forms_named(message)
    assert "make_loader, make_pipe, needs_an_argument, pipe" in message  # not NUMBER, dp


def test_what_is_not_a_recipe_is_named(project: Path) -> None:
    file = f"../proj/recipes_{project.parent.name}.py"
    with pytest.raises(CheckpointError, match="NUMBER is of type int; expected a DataPipe"):
        load_recipe(f"{file}:NUMBER")
    with pytest.raises(CheckpointError, match=r"calling needs_an_argument\(\) failed \(TypeError"):
        load_recipe(f"{file}:needs_an_argument")
    with pytest.raises(CheckpointError, match="no ':NAME' in it") as raised:
        load_recipe(file)
    assert forms_named(str(raised.value))


def test_a_recipe_whose_own_import_fails_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    name = f"broken_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text("import not_installed_anywhere_xyz\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('the recipe broke')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="it imports 'not_installed_anywhere_xyz'"):
        load_recipe(f"{name}:pipe")
    with pytest.raises(CheckpointError, match="running .*raises.py' failed: RuntimeError: the"):
        load_recipe("raises.py:pipe")
    sys.modules.pop(name, None)


# ----- the command, in a process run from another directory ---------------------------------


def run_inspect(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "datapipes", "inspect", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.slow
def test_the_command_from_other_directories(tmp_path: Path) -> None:
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir()
    elsewhere.mkdir()
    (proj / "recipes.py").write_text(RECIPE)
    loader = dp.Loader(dp.range(40).shuffle().batch(4), seed=5)
    list(islice(loader, 3))
    (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
    state = str(tmp_path / "state.json")

    for cwd, recipe in [
        (proj, "recipes:make_pipe"),  # a module of the current directory, a factory
        (elsewhere, "../proj/recipes.py:make_loader"),  # a relative file path
    ]:
        done = run_inspect(cwd, state, "--recipe", recipe)
        assert done.returncode == 0, done.stderr
        assert f"recipe check ({recipe}): OK" in done.stdout

    done = run_inspect(elsewhere, state, "--recipe", "recipes:make_pipe")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "no module 'recipes'" in done.stderr
    assert str(elsewhere) in done.stderr and forms_named(done.stderr)
