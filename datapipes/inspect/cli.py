"""The command ``python -m datapipes inspect CHECKPOINT [--recipe MODULE:NAME] [--json]``.

Exit status: 0 ok, 1 a recipe that cannot resume or no Loader state, 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from datapipes.inspect.errors import CheckpointError
from datapipes.inspect.load import load_checkpoint
from datapipes.inspect.recipe_check import check_recipe
from datapipes.inspect.recipe_spec import load_recipe
from datapipes.inspect.render import render
from datapipes.inspect.states import decode_state, find_loader_states, top_level


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m datapipes inspect",
        description=(
            "Show the datapipes Loader state(s) in a checkpoint (torch.save file, JSON file or "
            "torch.distributed.checkpoint directory) and optionally check a recipe against it. "
            "Exit status: 0 ok, 1 mismatch or no Loader state, 2 usage error."
        ),
    )
    parser.add_argument("checkpoint", help="the checkpoint file or DCP directory")
    parser.add_argument(
        "--recipe",
        metavar="MODULE:NAME",
        help="a DataPipe, Loader or zero-argument function returning one (module or file.py)",
    )
    parser.add_argument("--json", action="store_true", help="print the decoded state as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m datapipes inspect CHECKPOINT [--recipe MODULE:NAME] [--json]``; the exit code."""
    args = _parser().parse_args(argv)
    try:
        checkpoint = load_checkpoint(args.checkpoint)
        pipe, loader = load_recipe(args.recipe) if args.recipe else (None, None)
    except CheckpointError as error:
        print(f"datapipes inspect: {error}", file=sys.stderr)
        return error.exit_code
    found = find_loader_states(checkpoint)
    if not found:
        print(
            f"datapipes inspect: no datapipes Loader state in {args.checkpoint!r} (looked for a "
            f"dict with 'version', 'fingerprint' and 'ranks'); {top_level(checkpoint)}",
            file=sys.stderr,
        )
        return 1
    checks = None
    if pipe is not None:
        own = {} if loader is None else {"seed": loader.seed, "num_workers": loader.num_workers}
        checks = [check_recipe(state, pipe, **own) for _, state in found]
    if args.json:
        print(json.dumps(_as_json(args.checkpoint, found, checks), indent=2, default=str))
    else:
        print(render(found, pipe, checks, args.recipe or ""))
    return 1 if any(checks or []) else 0


def _as_json(
    checkpoint: str, found: list[tuple[str, dict[str, Any]]], checks: list[list[str]] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "checkpoint": checkpoint,
        "loader_states": [{"path": path, "state": decode_state(state)} for path, state in found],
    }
    if checks is not None:
        out["recipe_check"] = [
            {"path": path, "ok": not problems, "problems": problems}
            for (path, _), problems in zip(found, checks)
        ]
    return out
