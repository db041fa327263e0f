"""Reading checkpoint files (``torch.save``, JSON, DCP folders) without unsafe unpickling.

``torch.save`` files are read with ``torch.load(weights_only=True)``. In a
``torch.distributed.checkpoint`` folder the ``.metadata`` pickle is read by an
unpickler that refuses every global but DCP's metadata classes (and the few
they hold); then only the entries saved as bytes (what is not a tensor) are
loaded, with ``torch.load(weights_only=True)``, and no collective runs. This is
what ``python -m datapipes inspect`` and :func:`datapipes.load_dcp_states` read
checkpoints with.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from nodes.adapters import torch as torch_adapter


class CheckpointError(ValueError):
    """A checkpoint (or the recipe named with it) cannot be read; ``inspect`` exits with
    ``exit_code`` (a usage error)."""

    exit_code = 2


def read_checkpoint(path: str | os.PathLike[str]) -> Any:
    """The object saved at ``path``: a ``torch.save`` file, a JSON file or a DCP directory.

    ``torch.save`` files are read with ``torch.load(weights_only=True)`` (tensors
    memory-mapped, not read). A ``torch.distributed.checkpoint`` directory is
    read without unpickling anything but its metadata classes, and only its
    non-tensor entries are loaded (tensors appear as ``"<tensor ...>"`` strings).
    Raises :class:`CheckpointError` when the path is missing or unreadable.
    """
    path = Path(path)
    name = repr(str(path))
    if not path.exists():
        raise CheckpointError(f"no such file or directory: {name}")
    if path.is_dir():
        return read_dcp(path)
    if zipfile.is_zipfile(path):
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as error:  # noqa: BLE001 - reported, with the reason
            raise CheckpointError(
                f"cannot read {name} with torch.load(weights_only=True): {_first_reason(error)}"
            ) from error
    with open(path, "rb") as file:
        looks_like_json = file.read(64).lstrip()[:1] in (b"{", b"[")
    if looks_like_json:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:  # UnicodeDecodeError included
            raise CheckpointError(f"{name} is not valid JSON: {error}") from error
    try:  # the legacy (non-zip) torch.save format
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001
        raise CheckpointError(
            f"cannot read {name}: it is not JSON, and torch.load(weights_only=True) "
            f"refuses it ({_first_reason(error)})"
        ) from error


def _first_reason(error: Exception) -> str:
    """The informative line of a (long, multi-line) ``torch.load`` error.

    >>> _first_reason(ValueError("Weights only load failed.\\nWeightsUnpickler error:\\nbad op"))
    'WeightsUnpickler error: bad op'
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if "WeightsUnpickler error" in line:
            rest = line.split("WeightsUnpickler error", 1)[1].strip(" :")
            if not rest and index + 1 < len(lines):
                rest = lines[index + 1]
            return f"WeightsUnpickler error: {rest}"
    return lines[0] if lines else type(error).__name__


# ----- torch.distributed.checkpoint folders ---------------------------------------------

#: Globals a ``.metadata`` pickle may name besides the classes of its metadata module and
#: torch dtypes; anything else is refused rather than unpickled.
_METADATA_MODULE = torch_adapter.DCP_METADATA_MODULE
_ALLOWED = {
    ("torch", "Size"),
    *torch_adapter.DCP_METADATA_GLOBALS,
    ("collections", "OrderedDict"),
}

#: The path classes a ``.metadata`` may hold (a DCP checkpoint's storage paths), named by
#: what they are: each under its public name (``pathlib.PosixPath``, what Python 3.12 and
#: older write), the module that defines it since 3.13 (``pathlib._local``) and the one
#: that defines it on this Python, so a checkpoint written on any supported Python reads on
#: any other. The class is returned as it is: nothing the pickle names is imported.
_PATHS = (pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath, pathlib.PureWindowsPath)
_PATH_CLASSES = {
    (module, cls.__name__): cls
    for cls in _PATHS
    for module in ("pathlib", "pathlib._local", cls.__module__)
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` file, refusing every global that is not metadata."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _PATH_CLASSES:
            return _PATH_CLASSES[module, name]
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == _METADATA_MODULE:
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise pickle.UnpicklingError(
            f"refusing to unpickle {module}.{name} from a checkpoint's .metadata"
        )


def read_dcp_metadata(folder: Path) -> Any:
    """The metadata of the DCP folder ``folder``, unpickling nothing but DCP's metadata
    classes. Raises :class:`CheckpointError` naming the file when it cannot be read."""
    try:
        with open(folder / ".metadata", "rb") as file:
            return _MetadataUnpickler(file).load()
    except Exception as error:  # noqa: BLE001 - reported with the file
        raise CheckpointError(f"cannot read {str(folder / '.metadata')!r}: {error}") from error


def read_dcp_entries(folder: Path, metadata: Any, keys: set[str] | None = None) -> dict[str, Any]:
    """The entries saved as bytes (not tensors) of the DCP folder ``folder``, nested as
    saved; only ``keys`` (flattened names) when given.

    ``metadata`` is the folder's (:func:`read_dcp_metadata`). Each entry is read with
    ``torch.load(weights_only=True)``, and no collective runs, even when a process group
    is up. Raises :class:`CheckpointError` naming the folder when it cannot be read.
    """
    try:
        return torch_adapter.load_dcp_entries(
            folder,
            metadata,
            include=lambda key: keys is None or key in keys,
            load=lambda value: torch.load(value, weights_only=True),
        )
    except Exception as error:  # noqa: BLE001 - reported with the folder
        raise CheckpointError(f"cannot read the DCP checkpoint {str(folder)!r}: {error}") from error


def read_dcp(path: Path) -> dict[str, Any]:
    """The state saved in the DCP folder ``path``, tensors as placeholder strings.

    Raises :class:`CheckpointError` when ``path`` is not a DCP folder or cannot be read.
    """
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    if not (path / ".metadata").is_file():
        raise CheckpointError(
            f"{str(path)!r} is a directory but not a torch.distributed.checkpoint "
            "(it has no .metadata file)"
        )
    metadata = read_dcp_metadata(path)
    state = read_dcp_entries(path, metadata)
    planner_data = getattr(metadata, "planner_data", None) or {}
    for key, item in metadata.state_dict_metadata.items():
        if not isinstance(item, BytesStorageMetadata):
            shape = list(getattr(item, "size", ()))
            dtype = getattr(getattr(item, "properties", None), "dtype", "?")
            text = f"<tensor {shape} {dtype}, not loaded>"
            torch_adapter.set_nested(state, planner_data.get(key, (key,)), text)
    return state
