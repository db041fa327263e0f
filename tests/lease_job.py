"""One rank of a job whose ranks share a store and run no collectives (dispatch leases).

Under torchrun (``RANK`` set) it checks instead that leases are refused where the ranks
run collectives (see :func:`under_torchrun`).

``python tests/lease_job.py CONFIG_JSON``: the config names the ``rank``, ``world_size``,
the FileStore ``store`` path, the JSONL ``data`` glob, ``workers``, ``lease`` seconds and
``out`` (a file: every delivered record's id, one per line, flushed as it arrives). The
``stall_rank`` stops itself (SIGSTOP) after ``after`` items, until the test continues it;
the ``kill_rank`` SIGKILLs itself after ``after`` items; the ``stall_worker_rank`` stops
one of its DataLoader workers (SIGSTOP) after ``after`` items and writes its pid to
``out`` + ``.worker`` (its main process then waits for that worker's items, its heartbeat
thread alive). With ``taker_fault`` (``{"step": "won" | "working_out" | "reading",
"signal": "KILL" | "STOP", "items": n}``) the first rank that takes another rank over
(the job's first, counted in the store) kills or stops itself at that step: right
after it won the lease, after it worked out (and sealed) the work but before publishing
it, or (any rank that reads a takeover phase: the units it claims there are taken over
too) after ``items`` items of a takeover phase. At the end a rank
writes ``done <rank> <warnings>`` to ``out`` (the warnings it got: a fenced rank's says so).
The ranks start iterating together (a counter in the store) and spend ``delay`` seconds
per item, so that their epochs overlap.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from subprocess_helpers import children_of

import datapipes as dp


def under_torchrun(config: dict[str, Any]) -> None:
    """Under torchrun (a process group): leases with the default even_batches (on) must be
    refused at the first epoch, naming why; prints ``refused: <message>``."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        pipe = dp.range(40)
        loader = dp.Loader(pipe, dispatch="dynamic", dispatch_lease_seconds=config["lease"])
        try:
            next(iter(loader))
        except ValueError as error:
            print(f"refused: {error}")
    finally:
        dist.destroy_process_group()


def fault_the_taker(fault: dict[str, Any], store: Any) -> None:
    """Make this rank kill or stop itself at ``fault["step"]`` of a takeover it wins, if no
    rank of the job faulted before."""
    from datapipes.dispatch import owed, takeover
    from nodes.dispatch import lease

    def fault_now() -> None:
        if store.add("taker_faulted", 1) == 1:
            os.kill(os.getpid(), getattr(signal, f"SIG{fault['signal']}"))

    step = fault["step"]
    if step == "won":
        take = lease.LeaseWatch.take

        def take_then_fault(self: Any, rank: int, raw: bytes) -> Any:
            was = take(self, rank, raw)
            if was is not None:
                fault_now()
            return was

        lease.LeaseWatch.take = take_then_fault  # type: ignore[method-assign]
    elif step == "working_out":
        work_of = owed.taken_work

        def work_then_fault(*args: Any) -> Any:
            work = work_of(*args)
            fault_now()
            return work

        owed.taken_work = work_then_fault  # type: ignore[assignment]
    elif step == "reading":
        phase = takeover.Takeovers._phase

        def phase_then_fault(self: Any, *args: Any) -> Any:
            for count, item in enumerate(phase(self, *args), 1):
                yield item  # the loop writes it out before it asks for the next
                if count == fault["items"]:
                    fault_now()

        takeover.Takeovers._phase = phase_then_fault  # type: ignore[method-assign]
    else:
        raise ValueError(f"unknown taker_fault step {step!r}")


def main() -> None:
    argument = sys.argv[1]
    config = json.loads(argument if argument.startswith("{") else open(argument).read())
    if "RANK" in os.environ:
        under_torchrun(config)
        return
    rank = config["rank"]
    store = dist.FileStore(config["store"], -1)
    store.set_timeout(timedelta(seconds=60))
    if "taker_fault" in config and rank != config.get("stall_rank"):
        fault_the_taker(config["taker_fault"], store)
    pipe = dp.files(config["data"]).shuffle().read_jsonl().shuffle(buffer_size=8)
    loader = dp.Loader(
        pipe, seed=3, rank=rank, world_size=config["world_size"], num_workers=config["workers"],
        dispatch="dynamic", store=store, dispatch_unit_items=config.get("unit", 8),
        dispatch_lease_seconds=config["lease"], even_batches=False,
    )  # fmt: skip
    store.add("ready", 1)  # start together: no rank reads the epoch before the others came
    while store.add("ready", 0) < config["world_size"]:
        time.sleep(0.01)
    with open(config["out"], "a") as out, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for count, record in enumerate(loader, 1):
            out.write(f"{record['id']}\n")
            out.flush()
            time.sleep(config.get("delay", 0.005))  # the training step
            if count == config.get("after"):
                if rank == config.get("stall_rank"):
                    os.kill(os.getpid(), signal.SIGSTOP)
                if rank == config.get("kill_rank"):
                    os.kill(os.getpid(), signal.SIGKILL)
                if rank == config.get("stall_worker_rank"):
                    worker = min(children_of(os.getpid()))
                    os.kill(worker, signal.SIGSTOP)
                    with open(config["out"] + ".worker", "w") as told:
                        told.write(str(worker))
        kinds = sorted({type(w.message).__name__ for w in caught})
        out.write(f"done {rank} {','.join(kinds) or '-'}\n")


if __name__ == "__main__":
    main()
