"""Loading the recipe a ``--recipe MODULE:NAME`` (or ``FILE.py:NAME``) names."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from datapipes.inspect.errors import CheckpointError
from datapipes.loader import Loader
from datapipes.pipe import DataPipe


def load_recipe(spec: str) -> tuple[DataPipe[Any], Loader | None]:
    """``(pipe, loader)`` from ``"package.module:NAME"`` or ``"path/to/file.py:NAME"``.

    ``NAME`` is a DataPipe, a Loader (its ``.pipe``; the Loader is returned
    too, so its seed and workers can be checked), or a zero-argument callable
    returning either. Raises :class:`CheckpointError` otherwise.
    """
    module_part, sep, name = spec.rpartition(":")
    if not sep or not module_part or not name:
        raise CheckpointError(f"--recipe takes MODULE:NAME or FILE.py:NAME, got {spec!r}")
    module = _import(module_part)
    if not hasattr(module, name):
        raise CheckpointError(f"--recipe: {module_part!r} has no {name!r}")
    value = getattr(module, name)
    if callable(value) and not isinstance(value, DataPipe | Loader):
        try:
            value = value()
        except Exception as error:  # noqa: BLE001
            raise CheckpointError(f"--recipe: calling {name}() failed: {error!r}") from error
    if isinstance(value, Loader):
        return value.pipe, value
    if isinstance(value, DataPipe):
        return value, None
    raise CheckpointError(
        f"--recipe: {spec} is of type {type(value).__name__}; expected a DataPipe, a Loader, or a "
        "function of no arguments returning one"
    )


def _import(module_part: str) -> ModuleType:
    """The module a file path (``.py`` or with a slash) or a module name names."""
    try:
        if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
            return _import_file(module_part)
        with _first_on_path(os.getcwd()):  # as `python -m` does: modules of this folder
            return importlib.import_module(module_part)
    except CheckpointError:
        raise
    except Exception as error:  # noqa: BLE001
        raise CheckpointError(f"--recipe: importing {module_part!r} failed: {error!r}") from error


def _import_file(module_part: str) -> ModuleType:
    file = Path(module_part)
    if not file.is_file():
        raise CheckpointError(f"--recipe: no such file: {module_part!r}")
    module_name = f"_datapipes_recipe_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise CheckpointError(f"--recipe: cannot import {module_part!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up
    with _first_on_path(str(file.resolve().parent)):  # its own folder, as for `python FILE`
        spec.loader.exec_module(module)
    return module


@contextmanager
def _first_on_path(folder: str) -> Iterator[None]:
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)
