"""Reading a checkpoint (``torch.save`` file, JSON file or DCP folder) without unsafe unpickling.

``torch.save`` files are read with ``torch.load(weights_only=True)``; a
``torch.distributed.checkpoint`` folder is read by :mod:`datapipes.inspect.dcp`.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import torch

from datapipes.inspect.errors import CheckpointError


def load_checkpoint(path: str | os.PathLike[str]) -> Any:
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
        from datapipes.inspect.dcp import read_dcp  # imports torch.distributed: only when needed

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
