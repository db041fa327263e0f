"""One rank of a chaos trial (tests/dispatch/test_chaos.py): dispatch with leases, no collectives.

``python tests/chaos_job.py CONFIG.json``. The config names the ``rank``, ``world_size``,
``workers`` (DataLoader workers), the ``port`` of the trial's TCPStore on 127.0.0.1 (the
driver hosts it), the JSONL ``data`` glob, ``seed``, ``epochs``, ``lease`` seconds,
``batch``, ``buffer`` (a stream shuffle after the reader, 0: none), ``step_seconds`` (the
training step, slept after each batch), ``every`` (a checkpoint every so many batches),
``ckpt`` (this rank's checkpoint folder), ``out`` (the ledger file) and ``resume`` (a merged
Loader state saved with ``dp.save_checkpoint``, or null: a fresh job).

The ledger, written and flushed as the rank goes (one ``write`` per batch, so a SIGKILL
leaves whole lines): ``<epoch> <id>`` for every delivered record, ``done <rank> <warning
kinds> saved=<n> refused=<n>`` at the end, or ``error <rank> <type>: <message>`` when the
rank fails (its traceback goes to stderr, and it exits 3).

A ``+`` line marks each item the rank got from its pipeline, just before its lease is
written ahead of it (see :func:`mark_write_ahead`): a SIGKILLed rank whose ledger ends with
a ``+`` died with an item in flight, which its lease may already count as delivered.

A checkpoint (``ckpt/e<epoch>-<n>.pt``) holds the Loader state, its epoch and the ids this
process delivered in that epoch before it: the deliveries the checkpoint keeps. A checkpoint
asked while the rank reads a taken-over rank's units is refused
(``TakeoverCheckpointError``, by design): the rank counts it and goes on.

SIGUSR1 dumps every thread's stack to stderr (the driver asks before it kills a hung rank).
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import torch.distributed as dist

import datapipes as dp
from datapipes.dispatch.takeover import TakeoverCheckpointError

#: How long a rank waits for the others to come before it starts anyway (a rank killed
#: before it came is then taken over as one that never started its epoch).
READY_SECONDS = 20.0
STORE_SECONDS = 30.0


def recipe(config: dict[str, Any]) -> dp.DataPipe[Any]:
    pipe = dp.files(config["data"]).shuffle().read_jsonl()
    if config["buffer"]:
        pipe = pipe.shuffle(buffer_size=config["buffer"])
    return pipe.batch(config["batch"])


def make_loader(config: dict[str, Any], store: Any) -> dp.Loader:
    return dp.Loader(
        recipe(config), seed=config["seed"], rank=config["rank"],
        world_size=config["world_size"], num_workers=config["workers"], dispatch="dynamic",
        store=store, dispatch_lease_seconds=config["lease"], even_batches=False,
    )  # fmt: skip


def start_together(store: Any, world_size: int) -> None:
    """Every rank begins its first epoch at about the same time (their startups differ by
    seconds on a loaded machine, longer than a lease), or after ``READY_SECONDS``."""
    store.add("chaos/ready", 1)
    deadline = time.monotonic() + READY_SECONDS
    while store.add("chaos/ready", 0) < world_size and time.monotonic() < deadline:
        time.sleep(0.01)


def mark_write_ahead(out: TextIO) -> None:
    """Write ``+`` to the ledger for each item a lease is about to be written ahead of
    (between the pipeline and ``Takeovers._written_ahead``, a private method: when it is
    gone, nothing is marked and the driver cannot tell an item in flight)."""
    from datapipes.dispatch.takeover import Takeovers

    original = getattr(Takeovers, "_written_ahead", None)
    if original is None:
        return

    def marked(items: Any) -> Any:
        for item in items:
            out.write("+\n")
            out.flush()
            yield item

    def written_ahead(self: Any, items: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, marked(items), *args, **kwargs)

    Takeovers._written_ahead = written_ahead  # type: ignore[method-assign]


def run(config: dict[str, Any], out: TextIO) -> None:
    rank = config["rank"]
    store = dist.TCPStore(
        "127.0.0.1", config["port"], is_master=False, wait_for_workers=False,
        timeout=timedelta(seconds=STORE_SECONDS),
    )  # fmt: skip
    mark_write_ahead(out)
    loader = make_loader(config, store)
    if config["resume"]:
        loader.load_state_dict(dp.load_checkpoint(config["resume"]))
    start_together(store, config["world_size"])
    folder = Path(config["ckpt"])
    folder.mkdir(parents=True, exist_ok=True)
    saved = refused = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in loader.epochs(config["epochs"]):
            delivered: list[int] = []
            for step, batch in enumerate(loader, 1):
                ids = batch["id"].tolist()
                out.write("".join(f"{epoch} {i}\n" for i in ids))
                out.flush()
                delivered += ids
                time.sleep(config["step_seconds"])  # the training step
                if step % config["every"]:
                    continue
                try:
                    state = loader.state_dict()
                except TakeoverCheckpointError:
                    refused += 1
                    continue
                at = state["ranks"][str(rank)]["epoch"]
                saved += 1
                saving = {"loader": state, "epoch": at, "ids": list(delivered)}
                dp.save_checkpoint(saving, folder / f"e{at}-{saved:05d}.pt")
        kinds = sorted({type(w.message).__name__ for w in caught})
    loader.close()
    out.write(f"done {rank} {','.join(kinds) or '-'} saved={saved} refused={refused}\n")
    out.flush()


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    config = json.loads(Path(sys.argv[1]).read_text())
    with open(config["out"], "a") as out:
        try:
            run(config, out)
        except BaseException as error:  # noqa: BLE001 - told to the driver, then exit 3
            message = str(error).splitlines()[0][:300] if str(error) else ""
            out.write(f"error {config['rank']} {type(error).__name__}: {message}\n")
            out.flush()
            traceback.print_exc()
            sys.stderr.flush()
            sys.exit(3)


if __name__ == "__main__":
    main()
