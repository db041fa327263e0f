"""Dynamic dispatch at scale: 8 to 256 ranks on one TCPStore, every item exactly once.

Each rank is a thread of this process with its own ``TCPStore`` client (the store is
hosted here, as rank 0 hosts it in a job) and a Loader of ``dp.range(ranks * items)
.map(cheap)``, ``num_workers=0``, ``dispatch="dynamic"``, ``dispatch_unit_items=8``,
``even_batches=False``, with leases (``dispatch_lease_seconds=60``: none goes stale, but
every rank writes its lease ahead of each item and waits for the others at each epoch's
end, polling their leases). Per size it runs ``--epochs`` epochs (the ranks start each
one together) and reports:

* store requests per item: every call the ranks make to the store (claims, claim
  records, lease writes, published states, the end-of-epoch polls), over the items;
* claim latency p50 / p99: the time one unit's claim takes, as a consumer sees it;
* end-of-epoch wait: per epoch, the longest a rank waited at the end for the others
  (the takeover loop's own wait), median over the epochs;
* store keys after 1, 10 and all epochs: bounded (each epoch's keys go once every rank
  has ended the next one), not growing with the epochs.

Every epoch is checked: each item delivered once over the ranks. Usage::

    python benchmarks/dispatch_scale.py                       # 8, 32, 128, 256 ranks
    python benchmarks/dispatch_scale.py --ranks 8,32 --epochs 10 --no-leases
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import torch.distributed as dist

import datapipes as dp
from nodes.dispatch import dispatcher as dispatcher_module
from nodes.dispatch.store import StoreClient

UNIT_ITEMS = 8


def cheap(x: int) -> int:
    return x * 2


class Meter:
    """Store requests and claim times of every rank of this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.claims: list[float] = []
        self._call = StoreClient._call
        self._claim = dispatcher_module.Dispatcher.claim

    def install(self) -> None:
        meter = self

        def counted_call(client: StoreClient, what: str, op: Any) -> Any:
            with meter.lock:
                meter.requests += 1
            return meter._call(client, what, op)

        def timed_claim(dispatcher: Any, place: str, claimed_before: int) -> Any:
            started = time.perf_counter()
            try:
                return meter._claim(dispatcher, place, claimed_before)
            finally:
                took = time.perf_counter() - started
                with meter.lock:
                    meter.claims.append(took)

        StoreClient._call = counted_call  # type: ignore[method-assign]
        dispatcher_module.Dispatcher.claim = timed_claim  # type: ignore[method-assign]

    def reset(self) -> None:
        with self.lock:
            self.requests, self.claims = 0, []


def run_size(ranks: int, epochs: int, items: int, leases: bool, meter: Meter) -> dict[str, Any]:
    host = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=120)
    count = ranks * items
    options: dict[str, Any] = {"dispatch_lease_seconds": 60.0} if leases else {}
    loaders = []
    for rank in range(ranks):
        client = dist.TCPStore("127.0.0.1", host.port, is_master=False, timeout=timeout)
        loaders.append(
            dp.Loader(
                dp.range(count).map(cheap),
                rank=rank,
                world_size=ranks,
                dispatch="dynamic",
                store=client,
                dispatch_unit_items=UNIT_ITEMS,
                even_batches=False,
                **options,
            )  # fmt: skip
        )
    meter.reset()
    keys: dict[int, int] = {}
    waits: list[float] = []
    started = time.perf_counter()
    for epoch in range(epochs):
        got: list[list[int]] = [[] for _ in range(ranks)]
        errors: list[BaseException] = []
        barrier = threading.Barrier(ranks)

        def rank_epoch(
            rank: int, got: list[list[int]] = got, errors: list = errors, barrier: Any = barrier
        ) -> None:
            try:
                barrier.wait()
                got[rank].extend(loaders[rank])
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=rank_epoch, args=(r,)) for r in range(ranks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        if errors or any(thread.is_alive() for thread in threads):
            raise RuntimeError(f"{ranks} ranks, epoch {epoch}: {errors[:1] or 'a rank hung'}")
        seen = Counter(item for items_of_rank in got for item in items_of_rank)
        if sorted(seen) != [cheap(i) for i in range(count)] or set(seen.values()) != {1}:
            raise AssertionError(f"{ranks} ranks, epoch {epoch}: not every item exactly once")
        if leases:
            waits.append(max(loader._takeovers.report()["wait_seconds"] for loader in loaders))
        if epoch + 1 in (1, 10, epochs):
            keys[epoch + 1] = int(host.num_keys())
    seconds = time.perf_counter() - started
    claims = sorted(meter.claims)
    return {
        "ranks": ranks,
        "items": count * epochs,
        "seconds": seconds,
        "requests_per_item": meter.requests / (count * epochs),
        "claim_p50_ms": 1000 * claims[len(claims) // 2],
        "claim_p99_ms": 1000 * claims[min(len(claims) - 1, int(len(claims) * 0.99))],
        "wait_ms": 1000 * statistics.median(waits) if waits else None,
        "keys": keys,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,32,128,256", help="comma-separated sizes")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--items-per-rank", type=int, default=16)
    parser.add_argument("--no-leases", action="store_true", help="dynamic dispatch alone")
    args = parser.parse_args()
    meter = Meter()
    meter.install()
    leases = not args.no_leases
    print(
        f"dynamic dispatch{' with leases' if leases else ''}, {args.epochs} epochs, "
        f"{args.items_per_rank} items per rank per epoch, units of {UNIT_ITEMS}; "
        "every epoch checked: every item exactly once"
    )
    print(
        "| ranks | items | seconds | store requests / item | claim p50 | claim p99 "
        "| end-of-epoch wait (median) | keys after 1 / 10 / last epoch |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for ranks in (int(r) for r in args.ranks.split(",")):
        row = run_size(ranks, args.epochs, args.items_per_rank, leases, meter)
        wait = "-" if row["wait_ms"] is None else f"{row['wait_ms']:.0f} ms"
        keys = " / ".join(str(row["keys"][e]) for e in sorted(row["keys"]))
        print(
            f"| {ranks} | {row['items']:,} | {row['seconds']:.1f} | "
            f"{row['requests_per_item']:.2f} | {row['claim_p50_ms']:.2f} ms | "
            f"{row['claim_p99_ms']:.2f} ms | {wait} | {keys} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
