"""What the trainer jobs share: the data, its recipe, and their command line.

``python <job>.py OUT_DIR --workers 0|2 [--stop STEP] [--resume CHECKPOINT]``; each
process writes the batches it trained on to ``OUT_DIR/rank<R>.json``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import datapipes as dp

ITEMS, BATCH, EPOCHS, SEED = 48, 4, 2, 3


def numbered(x: int) -> torch.Tensor:
    return torch.tensor([float(x)])


def recipe(item: Callable[[int], Any] = numbered) -> dp.DataPipe[Any]:
    """48 numbers, shuffled each epoch, made items by ``item``, in batches of 4."""
    return dp.range(ITEMS).shuffle().map(item).batch(BATCH)


def arguments(*, devices: bool = False) -> tuple[argparse.Namespace, Path]:
    """The job's arguments, and its output folder (made)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    if devices:
        parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--stop", type=int)
    parser.add_argument("--resume")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return args, out


def write_seen(out: Path, rank: int, seen: list[list[float]]) -> None:
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
