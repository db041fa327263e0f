"""One rank of a real ``torch.distributed`` job that reads with ``dispatch="dynamic"``.

Started by ``torchrun`` from test_dispatch_distributed.py: ``python -m torch.distributed.run
--standalone --nproc_per_node=N tests/dispatch_job.py CONFIG.json``. Joining the gloo group
is distributed_job.py's ``run_rank``; the Loaders use the default process group's store
(no ``store=``). The config (JSON) holds ``data`` (a glob of JSONL files with records
``{"id", ...}``), ``seed``, ``buffer`` (a stream shuffle after the reader: at a checkpoint
items wait in it, read but not delivered), ``out`` and ``phases``, run one after the other,
each with a fresh Loader (``workers`` DataLoader workers, ``dispatch``, ``even``: the
``even_batches`` argument, ``None`` = the default, on under torch.distributed):

* ``epoch``: read one whole epoch. ``slow``: rank 1 sleeps ``SLOW_S`` per item (every
  rank sleeps ``FAST_S`` in every other case): rank 1 is a slow consumer.
* ``stop``: read ``stop_step`` items, save this rank's Loader state with
  ``dp.save_checkpoint`` in ``ckpt/rank<R>.pt`` (and the ids delivered so far), then stop.
* ``kill``: as ``stop``, then read ``kill_after`` items more, and rank ``kill_rank``
  SIGKILLs itself there: the job dies (its other ranks wait in even_batches' collective
  until torchrun ends them). Must be the last phase.
* ``resume``: merge every rank's file of ``ckpt`` (``dp.merge_states``), load it and
  read the rest of that epoch.

Each rank writes ``<phase>/rank<R>.json`` when its phase ends (a killed job keeps what
its earlier phases wrote): the ids it delivered, in order, ``dropped()``, the seconds the
phase took, the units its consumers claimed (from its own state's dispatch record).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from distributed_job import run_rank, tag_warnings

import datapipes as dp

SLOW_RANK = 1
SLOW_S = 0.02  # per item on the slow rank, in a phase with "slow"
FAST_S = 0.001  # per item otherwise: an epoch lasts longer than the ranks' start skew
SLOW_PHASE = "DISPATCH_JOB_SLOW"  # set while a phase with "slow" runs (workers inherit it)


def record_id(record: dict[str, Any]) -> int:
    """The record's id, at a pace: rank 1 (its DataLoader workers included: torchrun's RANK
    is inherited) is slow while a slow phase runs. One function for every phase, so that
    every phase's recipe is the same one (a checkpoint of one resumes in another)."""
    slow = os.environ.get(SLOW_PHASE) and int(os.environ.get("RANK", "0")) == SLOW_RANK
    time.sleep(SLOW_S if slow else FAST_S)
    return int(record["id"])


def recipe(config: dict[str, Any]) -> dp.DataPipe[Any]:
    pipe = dp.files(config["data"]).shuffle().read_jsonl().shuffle(buffer_size=config["buffer"])
    return pipe.map(record_id)


def make_loader(config: dict[str, Any], phase: dict[str, Any]) -> dp.Loader:
    return dp.Loader(
        recipe(config),
        seed=config["seed"],
        num_workers=phase["workers"],
        dispatch=phase.get("dispatch", "dynamic"),
        even_batches=phase.get("even"),
    )


def claimed_units(state: dict[str, Any], rank: int) -> int:
    """How many units this rank's consumers claimed, as its checkpoint records them."""
    record = state["ranks"][str(rank)].get("dispatch")
    if not record:
        return 0
    return sum(len(units) for places in record["claims"].values() for units in places.values())


def write(out: Path, phase: str, rank: int, result: dict[str, Any]) -> None:
    folder = out / phase
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{rank}.json").write_text(json.dumps(result))


def run_phase(config: dict[str, Any], phase: dict[str, Any]) -> None:
    rank, mode, out = dist.get_rank(), phase["mode"], Path(config["out"])
    tag_warnings(phase["name"])
    os.environ[SLOW_PHASE] = "1" if phase.get("slow") else ""
    dist.barrier()  # every rank starts the phase together: the slow rank is slow, not late
    started = time.perf_counter()
    loader = make_loader(config, phase)
    if mode == "resume":
        files = sorted(Path(phase["ckpt"]).glob("rank*.pt"))
        loader.load_state_dict(dp.merge_states(dp.load_checkpoint(f) for f in files))
    result: dict[str, Any] = {"topology": [loader.rank, loader.world_size]}
    result["even_batches"] = loader.even_batches
    ids: list[int] = []
    stop = phase.get("stop_step") if mode in ("stop", "kill") else None
    for item in loader:
        ids.append(int(item))
        if stop is not None and len(ids) == stop:
            state = loader.state_dict()
            folder = Path(phase["ckpt"])
            folder.mkdir(parents=True, exist_ok=True)
            dp.save_checkpoint(state, folder / f"rank{rank}.pt")
            result["claimed_at_stop"] = claimed_units(state, rank)
            write(out, phase["name"], rank, {**result, "ids": ids})
            if mode == "stop":
                break
            dist.barrier()  # every rank's checkpoint is on disk before one of them dies
        if mode == "kill" and len(ids) == stop + phase["kill_after"]:
            if rank == phase["kill_rank"]:
                os.kill(os.getpid(), signal.SIGKILL)
    seconds = time.perf_counter() - started
    state, dropped = loader.state_dict(), loader.dropped()
    loader.close()
    if mode != "stop":
        result.update(ids=ids, claimed=claimed_units(state, rank))
        result.update(dropped=dropped, seconds=seconds)
        write(out, phase["name"], rank, result)


def run_phases(config: dict[str, Any]) -> dict[str, Any]:
    for phase in config["phases"]:
        run_phase(config, phase)
    return {}


def main() -> None:
    run_rank(run_phases)


if __name__ == "__main__":
    main()
