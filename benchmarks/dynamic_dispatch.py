"""Dynamic dispatch: load balancing with a slow rank, overhead on one rank, the cost of a unit.

Three measures, side by side in one run (``dp.Loader(..., dispatch="static" | "dynamic")``):

* ``balance``: 3 ranks, real OS processes (spawned) sharing one ``TCPStore`` that this
  process starts; each rank is ``dp.Loader(pipe, rank=r, world_size=3, dispatch=...,
  store=..., even_batches=False)``, ``num_workers=0``, the same recipe on every rank.
  Each item costs a calibrated sleep in the rank's loop (its training step): ``--fast-us``
  (200 us) on ranks 0 and 1, ``--slow-us`` (600 us, 3x) on rank 2, slept once per batch
  of ``SLEEP_BATCH`` items (``len(batch) * cost``: one timer wake-up per batch, not per
  item). Three epochs: ``dp.range(N).shuffle()`` (units: runs of positions), 24 JSONL
  files read with ``read_jsonl().map(features).shuffle(1,000)`` (units: whole files), and
  the same records in 6 files (fewer than 4 a rank: each split into 2 parts). The ranks
  start each epoch together (a barrier on the store); the epoch's wall time is the slowest
  rank's. The ideal is the total work over the total speed, each rank's speed (items / s)
  measured in the static runs: ``N / sum(speed)``. Goal: dynamic within 1.2x of the ideal.
  A third column runs dynamic dispatch with leases (``dispatch_lease_seconds``, long
  enough that none goes stale): what writing the position ahead of each batch, the
  heartbeat and the fenced claims cost.
* ``overhead``: one rank, no skew: the JSONL pipeline of ``jsonl_pipeline.py`` (read ->
  json -> map -> shuffle(10,000) -> batch(256) -> collate, its data and step functions),
  static against dynamic at 0 and 2 workers, interleaved, best of 3 x ``--repeats`` short
  passes (32 MB), wall and CPU time. Goal: dynamic within 10% of static.
* ``units``: the cost of one claim (a store ``add`` and an ``append``: two round trips)
  from this process and from another process; the slow-rank ``range`` epoch at
  ``dispatch_unit_items`` in {64, 256, 1024, 4096}; and one rank with no skew,
  ``dp.range(--overhead-items).shuffle().batch(256)``, dynamic against static at each unit
  size (what a unit costs next to reading it when the per-item work is nearly nothing).

Every epoch is checked: each item delivered exactly once over the ranks (count, sum and
sum of squares of the ids). Prints markdown tables of the ratios (``--markdown FILE``
writes them too). Usage::

    python benchmarks/dynamic_dispatch.py                 # ~6 minutes on 2 cores
    python benchmarks/dynamic_dispatch.py --quick         # tiny sizes, 1 repeat (smoke test)
    python benchmarks/dynamic_dispatch.py --only balance --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import jsonl_pipeline as jp
import torch
import torch.distributed as dist
from compare import cpu_seconds

import datapipes as dp
from nodes.dispatch.store import StoreClient

MEASURES = ("balance", "overhead", "units")
MODES = ("static", "dynamic", "leases")
LEASE_SECONDS = 30.0  # long enough that no lease goes stale: what leases cost, not a takeover
WORLD = 3
SLOW_RANK = 2
SLEEP_BATCH = 32  # items per batch in the balance epochs: one sleep per batch
FILE_BUFFER = 1_000
UNIT_SIZES = (64, 256, 1024, 4096)
BALANCE_GOAL = 1.2  # dynamic / ideal, at most
OVERHEAD_GOAL = 1.10  # dynamic / static, at most
CLAIMS = 2_000  # claims timed per claim-cost row


@dataclass(frozen=True)
class Job:
    """One epoch that every rank reads: its source, dispatch mode and unit size."""

    source: str  # "range", "files" or "few files"
    mode: str  # "static", "dynamic" or "leases" (dynamic with dispatch_lease_seconds)
    unit_items: int = 1024


@dataclass
class Plan:
    """What the rank processes run, in order (the same list in each)."""

    host: str
    port: int
    items: int
    paths: dict[str, list[str]]  # the JSONL files of each files source
    costs: list[float]  # seconds of sleep per item, by rank
    jobs: list[Job] = field(default_factory=list)


# ----- the pipelines ---------------------------------------------------------------------
def id_batch(ids: list[int]) -> dict[str, torch.Tensor]:
    return {"id": torch.tensor(ids)}


def balance_pipe(job: Job, plan: Plan) -> dp.DataPipe[Any]:
    """The same recipe on every rank (the slow rank's cost is in its training loop: a
    step in the recipe would change its fingerprint, and with it the store's keys)."""
    if job.source == "range":
        pipe = dp.range(plan.items).shuffle().batch(SLEEP_BATCH, collate_fn=id_batch)
    else:
        pipe = dp.files(plan.paths[job.source]).read_jsonl().map(jp.features).shuffle(FILE_BUFFER)
        pipe = pipe.batch(SLEEP_BATCH, collate_fn=jp.collate)
    return pipe


def tally(batches: Iterator[dict[str, torch.Tensor]], cost: float = 0.0) -> tuple[int, int, int]:
    """Items, sum of ids and sum of squared ids: three numbers that check exactly-once.

    ``cost``: the simulated per-item work, seconds slept for each item of a batch.
    """
    count = total = squares = 0
    for batch in batches:
        ids = batch["id"].to(torch.int64)
        if cost:
            time.sleep(cost * len(ids))
        count += len(ids)
        total += int(ids.sum())
        squares += int((ids * ids).sum())
    return count, total, squares


def expected_tally(ids: range) -> tuple[int, int, int]:
    return len(ids), sum(ids), sum(i * i for i in ids)


# ----- the rank processes ----------------------------------------------------------------
def barrier(store: Any, name: str, world: int) -> None:
    """Return when all ``world`` ranks reached ``name`` (the last one sets a key)."""
    if store.add(f"bench/{name}/arrived", 1) == world:
        store.set(f"bench/{name}/go", "1")
    store.wait([f"bench/{name}/go"])


def time_claims(client: Any, key: str, count: int, rounds: int = 5) -> dict[str, float]:
    """Microseconds per ``add`` alone and per claim (``add`` + ``append``) through ``client``
    (a ``StoreClient``, or the store itself), the best of ``rounds`` rounds of
    ``count // rounds`` (a busy machine delays some rounds)."""
    best = {"add": float("inf"), "claim": float("inf")}
    each = max(1, count // rounds)
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(each):
            client.add(f"{key}/counter-only", 1)
        best["add"] = min(best["add"], (time.perf_counter() - start) / each * 1e6)
        start = time.perf_counter()
        for _ in range(each):
            unit = client.add(f"{key}/next", 1) - 1
            client.append(f"{key}/claims", f"{unit},")
        best["claim"] = min(best["claim"], (time.perf_counter() - start) / each * 1e6)
    return best


def rank_main(rank: int, plan: Plan) -> None:
    """One rank: read every job's epoch in turn, starting each with the others."""
    torch.set_num_threads(1)
    store = dist.TCPStore(plan.host, plan.port, is_master=False, wait_for_workers=False)
    cost = plan.costs[rank]
    for index, job in enumerate(plan.jobs):
        pipe = balance_pipe(job, plan)
        loader = dp.Loader(
            pipe,
            seed=0,
            rank=rank,
            world_size=WORLD,
            even_batches=False,
            dispatch="static" if job.mode == "static" else "dynamic",
            dispatch_unit_items=job.unit_items,
            store=None if job.mode == "static" else store,
            dispatch_lease_seconds=LEASE_SECONDS if job.mode == "leases" else None,
        )
        gc.collect()
        barrier(store, f"job{index}", WORLD)
        start = time.perf_counter()
        count, total, squares = tally(iter(loader), cost)
        seconds = time.perf_counter() - start
        loader.close()
        result = {"seconds": seconds, "count": count, "sum": total, "squares": squares}
        store.set(f"bench/result/{index}/{rank}", json.dumps(result))
    barrier(store, "claims", WORLD)
    if rank == 0:  # the cost of a claim from another process, the others idle
        client = StoreClient(store, 60.0)
        for name, through in (("store", store), ("client", client)):
            cost = time_claims(through, f"bench/c1/{name}", CLAIMS)
            store.set(f"bench/claims/process/{name}", json.dumps(cost))


def run_ranks(plan: Plan, store: Any, timeout: float) -> list[list[dict[str, Any]]]:
    """Start the rank processes, wait for them; each job's results by rank."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, plan), daemon=True) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(1.0, deadline - time.monotonic()))
    failed = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    if failed:
        raise RuntimeError(f"rank processes failed or timed out (rank, exit code): {failed}")
    return [
        [json.loads(store.get(f"bench/result/{i}/{r}")) for r in range(WORLD)]
        for i in range(len(plan.jobs))
    ]


# ----- balance and unit size: the slow-rank epochs ---------------------------------------
def balance_jobs(repeats: int, unit_sizes: tuple[int, ...]) -> list[Job]:
    """Interleaved: every repeat runs static and dynamic of each source, then each unit
    size (the order reversed every other repeat, so neither mode always goes first)."""
    jobs = []
    for repeat in range(repeats):
        turn = [Job(source, mode) for source in ("range", "files", "few files") for mode in MODES]
        turn += [Job("range", "dynamic", u) for u in unit_sizes if u != 1024]
        jobs += turn[::-1] if repeat % 2 else turn
    return jobs


@dataclass
class EpochStats:
    """The best (shortest) epoch of a job over the repeats, and its ranks' numbers."""

    seconds: float = float("inf")
    per_rank_seconds: list[float] = field(default_factory=list)
    per_rank_items: list[int] = field(default_factory=list)


def summarize(
    jobs: list[Job], results: list[list[dict[str, Any]]], expected: dict[str, tuple[int, ...]]
) -> tuple[dict[Job, EpochStats], dict[str, float]]:
    """Best epoch per job; each source's ideal from the ranks' best static speeds."""
    best: dict[Job, EpochStats] = {}
    speeds: dict[str, list[float]] = {}
    for job, ranks in zip(jobs, results):
        got = tuple(sum(r[k] for r in ranks) for k in ("count", "sum", "squares"))
        if got != expected[job.source]:
            raise AssertionError(f"{job}: not exactly once: {got} != {expected[job.source]}")
        seconds = max(r["seconds"] for r in ranks)
        stats = best.setdefault(job, EpochStats())
        if seconds < stats.seconds:
            stats.seconds = seconds
            stats.per_rank_seconds = [r["seconds"] for r in ranks]
            stats.per_rank_items = [r["count"] for r in ranks]
        if job.mode == "static":
            rank_speeds = [r["count"] / r["seconds"] for r in ranks]
            old = speeds.get(job.source, [0.0] * WORLD)
            speeds[job.source] = [max(a, b) for a, b in zip(old, rank_speeds)]
    ideal = {source: expected[source][0] / sum(s) for source, s in speeds.items()}
    return best, ideal


def balance_table(
    best: dict[Job, EpochStats], ideal: dict[str, float], labels: dict[str, str], nominal: float
) -> str:
    lines = [
        "| epoch | ideal | static | dynamic | dynamic + leases | static / ideal "
        "| dynamic / ideal | leases / ideal | dynamic items by rank (rank 2 slow) "
        "| goal (dynamic <= 1.2x ideal) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for source, label in labels.items():
        static, dynamic = best[Job(source, "static")], best[Job(source, "dynamic")]
        leases = best[Job(source, "leases")]
        ratio = dynamic.seconds / ideal[source]
        items = " / ".join(f"{n:,}" for n in dynamic.per_rank_items)
        lines.append(
            f"| {label} | {ideal[source]:.2f} s | {static.seconds:.2f} s "
            f"| {dynamic.seconds:.2f} s | {leases.seconds:.2f} s "
            f"| {static.seconds / ideal[source]:.2f}x | {ratio:.2f}x "
            f"| {leases.seconds / ideal[source]:.2f}x | {items} "
            f"| {'PASS' if ratio <= BALANCE_GOAL else 'MISS'} |"
        )
    lines.append(
        "\nideal = N / (sum of the ranks' speeds), each rank's speed (items / s) measured in "
        f"the static runs (from the nominal per-item costs alone: {nominal:.2f} s for the "
        "range epoch; a sleep overshoots a little)."
    )
    return "\n".join(lines)


def unit_table(
    best: dict[Job, EpochStats],
    ideal: float,
    items: int,
    single: dict[str, dict[Any, float]],
    claim_us: dict[str, dict[str, float]],
) -> str:
    lines = [
        "| unit items | units | slow-rank epoch | dynamic / ideal | finish spread "
        "| slow rank's last unit | one rank: dynamic / static, shuffled | in order |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for unit in UNIT_SIZES:
        stats = best[Job("range", "dynamic", unit)]
        spread = max(stats.per_rank_seconds) - min(stats.per_rank_seconds)
        lines.append(
            f"| {unit:,} | {-(-items // unit):,} | {stats.seconds:.2f} s "
            f"| {stats.seconds / ideal:.2f}x | {spread * 1e3:.0f} ms "
            f"| {unit * SLOW_MULTIPLE * FAST_US / 1e3:.0f} ms | {single['shuffled'][unit]:.2f}x "
            f"| {single['in order'][unit]:.2f}x |"
        )
    lines.append(
        "\nOne rank, seconds = fixed + units x cost of a unit (least squares over the unit "
        "sizes): "
        + "; ".join(
            f"{name}: {fit['us']:.0f} us a unit, fixed {fit['fixed ms']:.1f} ms"
            for name, fit in single.items()
        )
        + "."
    )
    lines += [
        "",
        "| one claim (store add + append) | add alone | add + append |",
        "|---|---:|---:|",
    ]
    for where, us in claim_us.items():
        lines.append(f"| {where} | {us['add']:.0f} us | {us['claim']:.0f} us |")
    return "\n".join(lines)


# Set by main() from the CLI (the unit table names the slow rank's time for one unit).
FAST_US = 200.0
SLOW_MULTIPLE = 3.0


# ----- overhead: one rank, no skew -------------------------------------------------------
def jsonl_loader(mode: str, workers: int, paths: list[str], pattern: str) -> Iterator[Any]:
    pipe = dp.files(pattern).read_jsonl().map(jp.features).shuffle(jp.BUFFER)
    pipe = pipe.batch(jp.BATCH, collate_fn=jp.collate)
    with dp.Loader(pipe, seed=0, dispatch=mode, num_workers=workers) as loader:
        yield from loader  # closed after the pass: its own TCPStore goes too


def store_seconds(workers: int, pattern: str) -> tuple[float, int]:
    """One more dynamic pass with ``stats=True`` (untimed): seconds its consumers spent on
    the store's claims, over all of them, and the units claimed."""
    pipe = dp.files(pattern).read_jsonl().map(jp.features).shuffle(jp.BUFFER)
    pipe = pipe.batch(jp.BATCH, collate_fn=jp.collate)
    with dp.Loader(pipe, seed=0, dispatch="dynamic", num_workers=workers, stats=True) as ld:
        for _ in ld:
            pass
        rows = [step.dispatch for step in ld.stats().steps if step.dispatch]
    seconds = sum(row["store_seconds"] for row in rows)
    return seconds, sum(sum(row["units"].values()) for row in rows)


def overhead_rows(
    paths: list[str], pattern: str, worker_counts: tuple[int, ...], repeats: int
) -> list[tuple[int, dict[str, float]]]:
    """Best wall and CPU seconds of static and dynamic at each worker count: the modes take
    turns (reversed every other repeat); every pass must give the same records."""
    rows = []
    for workers in worker_counts:
        best = {f"{m} {k}": float("inf") for m in ("static", "dynamic") for k in ("wall", "cpu")}
        seen = {}
        for repeat in range(repeats):
            modes = ("static", "dynamic") if repeat % 2 == 0 else ("dynamic", "static")
            for mode in modes:
                gc.collect()
                cpu = cpu_seconds()
                wall, count, id_sum = jp.run_once(
                    partial(jsonl_loader, mode, workers), paths, pattern
                )
                best[f"{mode} cpu"] = min(best[f"{mode} cpu"], cpu_seconds() - cpu)
                best[f"{mode} wall"] = min(best[f"{mode} wall"], wall)
                seen[mode] = (count, id_sum)
        assert seen["static"] == seen["dynamic"], f"the modes read other records: {seen}"
        best["store"], best["units"] = store_seconds(workers, pattern)
        print(f"  jsonl, {workers} workers: {best}", flush=True)
        rows.append((workers, best))
    return rows


def range_pass(mode: str, unit_items: int, items: int, shuffle: bool) -> float:
    pipe = dp.range(items)
    pipe = pipe.shuffle() if shuffle else pipe
    loader = dp.Loader(pipe.batch(jp.BATCH), seed=0, dispatch=mode, dispatch_unit_items=unit_items)
    gc.collect()
    start = time.perf_counter()
    count = sum(len(batch) for batch in loader)
    seconds = time.perf_counter() - start
    loader.close()
    assert count == items, (mode, unit_items, count)
    return seconds


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b * x``: ``(a, b)``."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def single_rank_units(items: int, repeats: int) -> dict[str, dict[Any, float]]:
    """One rank, no per-item work, ``range(items)`` shuffled and in order: dynamic / static
    at each unit size (best of ``repeats``, interleaved), and the cost of a unit: the slope
    of dynamic seconds over the number of units (``"us"``), its intercept less static's
    seconds (``"fixed ms"``: the store, the epoch's units)."""
    out: dict[str, dict[Any, float]] = {}
    for shuffle, name in ((True, "shuffled"), (False, "in order")):
        static = float("inf")
        dynamic = dict.fromkeys(UNIT_SIZES, float("inf"))
        for _ in range(repeats):
            static = min(static, range_pass("static", 1024, items, shuffle))
            for unit in UNIT_SIZES:
                dynamic[unit] = min(dynamic[unit], range_pass("dynamic", unit, items, shuffle))
        fixed, per_unit = fit_line([-(-items // u) for u in UNIT_SIZES], list(dynamic.values()))
        out[name] = {unit: seconds / static for unit, seconds in dynamic.items()}
        out[name].update({"us": per_unit * 1e6, "fixed ms": (fixed - static) * 1e3})
    return out


def overhead_table(rows: list[tuple[int, dict[str, float]]], records: int, mb: float) -> str:
    lines = [
        "| pipeline | workers | static | dynamic | dynamic / static | CPU: static | CPU: dynamic "
        "| CPU: dynamic / static | dynamic: store time (units) | goal (wall <= 1.10x) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for workers, best in rows:
        ratio = best["dynamic wall"] / best["static wall"]
        cpu_ratio = best["dynamic cpu"] / best["static cpu"]
        lines.append(
            f"| JSONL {mb:.0f} MB, {records:,} records | {workers} "
            f"| {best['static wall']:.3f} s | {best['dynamic wall']:.3f} s | {ratio:.2f}x "
            f"| {best['static cpu']:.3f} s | {best['dynamic cpu']:.3f} s | {cpu_ratio:.2f}x "
            f"| {best['store'] * 1e3:.1f} ms ({best['units']:.0f}) "
            f"| {'PASS' if ratio <= OVERHEAD_GOAL else 'MISS'} |"
        )
    return "\n".join(lines)


# ----- main ------------------------------------------------------------------------------
@dataclass
class Sizes:
    items: int = 36_000  # range epoch of the slow-rank runs
    files_mb: int = 8  # JSONL of the slow-rank runs (~40,000 records)
    files: int = 24
    few_files: int = 6  # fewer files than 4 a rank: split into parts (units_of)
    overhead_mb: int = 32
    overhead_items: int = 200_000
    workers: tuple[int, ...] = (0, 2)


QUICK = Sizes(
    items=3_000,
    files_mb=1,
    files=12,
    few_files=3,
    overhead_mb=2,
    overhead_items=100_000,
    workers=(0, 2),
)


def header() -> str:
    return (
        f"Machine: {platform.processor() or platform.machine()}, "
        f"{mp.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="best of (3; quick: 1)")
    parser.add_argument("--only", default=",".join(MEASURES), help="comma-separated measures")
    parser.add_argument("--fast-us", type=float, default=200.0, help="per-item cost, ranks 0-1")
    parser.add_argument("--slow-us", type=float, default=600.0, help="per-item cost, rank 2")
    parser.add_argument("--items", type=int, default=None, help="range epoch of the ranks")
    parser.add_argument("--workdir", type=Path, default=None, help="where the JSONL is cached")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables here")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the ranks")
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    if args.items:
        sizes.items = args.items
    repeats = args.repeats or (1 if args.quick else 3)
    only = set(args.only.split(","))
    if only - set(MEASURES):
        parser.error(f"--only takes some of {MEASURES}")
    global FAST_US, SLOW_MULTIPLE
    FAST_US, SLOW_MULTIPLE = args.fast_us, args.slow_us / args.fast_us

    def data(mb: int, shards: int) -> tuple[dict[str, Any], list[str], str]:
        name = f"dispatch-{mb}mb-{shards}shards"
        directory = args.workdir / name if args.workdir else jp.default_workdir(name)
        manifest = jp.generate_shards(directory, mb, shards, seed=0)
        return manifest, [str(directory / f) for f in manifest["files"]], str(directory / "*.jsonl")

    sections: list[str] = []

    def done(section: str) -> None:  # printed and written as soon as it is measured
        sections.append(section)
        print(section + "\n", flush=True)
        if args.markdown:
            args.markdown.write_text("\n\n".join(sections) + "\n")

    done(header())
    if only & {"balance", "units"}:
        manifest, paths, _ = data(sizes.files_mb, sizes.files)
        few, few_paths, _ = data(sizes.files_mb, sizes.few_files)
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        costs = [args.fast_us * 1e-6] * WORLD
        costs[SLOW_RANK] = args.slow_us * 1e-6
        units = UNIT_SIZES if "units" in only else (1024,)
        files = {"files": paths, "few files": few_paths}
        plan = Plan("127.0.0.1", store.port, sizes.items, files, costs)
        plan.jobs = balance_jobs(repeats, units)
        print(f"{len(plan.jobs)} epochs on {WORLD} rank processes ...", flush=True)
        results = run_ranks(plan, store, args.timeout)
        expected = {
            "range": expected_tally(range(sizes.items)),
            "files": expected_tally(range(manifest["records"])),
            "few files": expected_tally(range(few["records"])),
        }
        best, ideal = summarize(plan.jobs, results, expected)
        nominal_rate = sum(1 / c for c in costs)
        nominal = sizes.items / nominal_rate
        labels = {
            "range": f"range({sizes.items:,}).shuffle()",
            "files": f"{manifest['records']:,} JSONL records in {sizes.files} files",
            "few files": f"{few['records']:,} JSONL records in {sizes.few_files} files",
        }
        done(
            f"## Load balancing\n\n{WORLD} rank processes, one TCPStore, num_workers=0; "
            f"{args.fast_us:.0f} us per item, rank {SLOW_RANK} {args.slow_us:.0f} us; "
            f"dispatch_unit_items=1024; best of {repeats}, interleaved.\n\n"
            + balance_table(best, ideal, labels, nominal)
        )
        if "units" in only:
            client = StoreClient(store, 60.0)
            claim_us = {
                "this process (the store's host), TCPStore object": time_claims(
                    store, "bench/c0/store", CLAIMS
                ),
                "this process, the Loader's StoreClient (calls in its thread)": time_claims(
                    client, "bench/c0/client", CLAIMS
                ),
                "another process, TCPStore object": json.loads(
                    store.get("bench/claims/process/store")
                ),
                "another process, StoreClient": json.loads(
                    store.get("bench/claims/process/client")
                ),
            }
            single = single_rank_units(sizes.overhead_items, repeats)
            done(
                f"## Unit size\n\nSlow-rank epoch: range({sizes.items:,}).shuffle() on "
                f"{WORLD} ranks as above; finish spread = last rank's epoch - first rank's. "
                f"One rank, no skew, no per-item work: range({sizes.overhead_items:,})[.shuffle()]"
                f".batch(256), best of {repeats}. "
                f"A claim timed {CLAIMS:,} times (best of 5 rounds).\n\n"
                + unit_table(best, ideal["range"], sizes.items, single, claim_us)
            )
    if "overhead" in only:
        manifest, paths, pattern = data(sizes.overhead_mb, 16)
        # short passes, 3x the repeats: the best of many resists a neighbour's load
        rows = overhead_rows(paths, pattern, sizes.workers, 3 * repeats)
        mb = sum(manifest["sizes"]) / 2**20
        done(
            f"## Overhead\n\nOne rank, no skew: read -> json -> map -> shuffle({jp.BUFFER:,}) -> "
            f"batch({jp.BATCH}) -> collate over 16 JSONL files, best of {3 * repeats}, "
            "interleaved; store time: the claims' seconds (all consumers) in one more pass with "
            "Loader(stats=True).\n\n" + overhead_table(rows, manifest["records"], mb)
        )


if __name__ == "__main__":
    main()
