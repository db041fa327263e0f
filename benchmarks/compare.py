"""Every workload side by side in one run: datapipes, hand-written baselines and peer libraries.

The workloads, each a set of implementations doing the same work with the same
step functions (imported from the single-workload scripts next to this one):

* ``overhead``: map -> filter -> batch(256) -> collate over N ints (``overhead.py``):
  a plain generator chain (baseline), torch ``DataLoader`` over a generator
  ``IterableDataset``, ``torchdata.nodes``, Grain, Hugging Face ``datasets``, datapipes;
* ``jsonl``: read -> json -> map -> shuffle(10,000) -> batch(256) -> collate over JSONL
  shards (``jsonl_pipeline.py``, ``workers_pipeline.py``): the hand-written generator
  (baseline), ``datasets`` streaming, ``torchdata.nodes``, datapipes; with 2 worker
  processes, the hand-written loop in a torch ``DataLoader`` (the 2-worker baseline)
  and datapipes;
* ``images``: read tar shards -> decode JPEG -> resize/normalize -> batch(64)
  (``images.py``): a hand-written ``IterableDataset`` with ``tarfile`` and Pillow in a
  torch ``DataLoader`` (baseline), webdataset, datapipes; each with 0 and 2 workers;
* ``resume``: time from ``load_state_dict`` to the first batch at 10% and at 90% of an
  epoch of one JSONL file (read -> json -> map -> batch(256)): ``datasets`` +
  torchdata's ``StatefulDataLoader``, ``torchdata.nodes``, datapipes;
* ``parquet``: every row of Parquet shards (``parquet_read.py``): a hand-written
  ``pyarrow`` ``iter_batches`` loop making a dict per row with ``to_pylist`` (baseline),
  ``datasets`` streaming, datapipes ``read_parquet()`` (dicts), and the record batches
  themselves, hand-written and ``read_parquet(batches=True)``.
* ``write_tar``, ``write_parquet``: 100,000 records (a 2-6 KB JPEG-like image and a
  caption) written as shards of 2,000 records to local disk, until the files are on
  disk (``write_compare.py``): a hand-written ``tarfile`` / ``pyarrow`` loop
  (baseline), webdataset's ``ShardWriter`` and litdata's ``optimize()`` (tar only),
  ``dp.write`` with 0 and 2 DataLoader workers.
* ``text``: text pretraining (W5): generated documents in Parquet shards -> a BPE
  tokenizer trained here -> EOS after every document -> concat packing into 2,048-token
  sequences -> batches of 8, in tokens per second (``text_compare.py``): a hand-written
  ``pyarrow`` + ``encode_batch`` + token buffer loop (baseline), a torchtitan-style
  loader (``datasets`` streaming, a token buffer, ``StatefulDataLoader``), Grain's
  ``ConcatThenSplitIterDataset``, datapipes; with 2 workers, the hand-written loop in a
  torch ``DataLoader`` and datapipes.

Within a workload the implementations take turns in every repeat (the order
reversed every other repeat) and the best of ``--repeats`` counts. Every pass is
checked: the same records (count and sum of ids, or of labels and keys) as the
reference, or the exact ids where they are known. A peer that is not installed,
fails, times out or gives other records is reported as ``skipped: <reason>``.

Prints a header (machine, versions), a markdown table per measure (best wall
time, throughput, CPU time of the process and its workers, and the ratio to the
baseline: > 1 means faster) and the goals that pass; ``--markdown FILE`` writes
the same to a file. torch runs with 1 intra-op thread (``--torch-threads``), as
in DataLoader workers. Usage::

    python benchmarks/compare.py                  # a few minutes on 2 cores
    python benchmarks/compare.py --quick          # tiny sizes, 1 repeat (smoke test)
    python benchmarks/compare.py --only jsonl,resume --repeats 5 --workdir ~/.cache/dp-bench
"""

from __future__ import annotations

import argparse
import gc
import glob
import hashlib
import importlib.metadata
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never ask the Hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import images  # noqa: E402
import images_large  # noqa: E402
import images_large_bench  # noqa: E402
import jsonl_pipeline  # noqa: E402
import overhead  # noqa: E402
import parquet_read  # noqa: E402
import peers  # noqa: E402
import resume_cost  # noqa: E402
import text_compare  # noqa: E402
import torch  # noqa: E402
import workers_pipeline  # noqa: E402
import write_compare  # noqa: E402

WORKLOADS = (
    "overhead", "jsonl", "images", "images_large", "resume", "parquet", "write_tar",
    "write_parquet", "text",
)  # fmt: skip
WORKERS = 2
RESUME_AT = (0.1, 0.9)
PEERS = (
    "torchdata",
    "datasets",
    "grain",
    "webdataset",
    "spdl",
    "pillow",
    "simplejpeg",
    "nvidia-nvimgcodec-cu12",  # the jpeg-region extra: region decode of crops
    "numpy",
    "pyarrow",
    "litdata",
    "tokenizers",
)
RATIO_NOTE = (
    "vs baseline = the baseline's best time / this row's best time: "
    "**> 1.00x means faster** than the baseline, < 1.00x slower. Times are wall clock; "
    "CPU time (user + system, of this process and its worker processes, best pass) "
    "shows the work done, which other load on the machine disturbs less than the wall clock."
)


@dataclass
class Sizes:
    ints: int = 200_000
    jsonl_mb: int = 32
    jsonl_shards: int = 16
    image_shards: int = 8
    images_per_shard: int = 256
    resume_mb: int = 32
    large_shards: int = 4  # ~100 MB each
    large_per_shard: int = 800
    large_batch: int = 256
    parquet_rows: int = 400_000
    parquet_shards: int = 8
    write_records: int = 100_000
    write_per_shard: int = 2_000  # dp.write's units here are 10,000 records: whole shards
    text_documents: int = 3_000  # ~2.5 M tokens: 2-10 s a pass on 2 cores (load permitting)
    text_shards: int = 8


QUICK = Sizes(
    ints=20_000,
    jsonl_mb=1,
    jsonl_shards=4,
    image_shards=2,
    images_per_shard=16,
    resume_mb=1,
    large_shards=2,
    large_per_shard=12,
    large_batch=8,
    parquet_rows=20_000,
    parquet_shards=2,
    write_records=400,
    write_per_shard=50,  # dp.write's units: 400 / 8 = 50 records
    text_documents=24,
    text_shards=4,
)


Pass = tuple[float, Any, "float | None"]  # wall seconds, check value, CPU seconds


@dataclass
class Row:
    """One implementation of one workload.

    ``run()`` does one timed pass and returns (seconds, check value, CPU seconds
    or ``None``). The check value must equal ``expected`` when given, else the
    workload's first row's. ``baseline`` names the row the ratio is taken
    against (``None``: this row is the workload's baseline).
    """

    workload: str
    name: str
    run: Callable[[], Pass]
    baseline: str | None = None
    expected: Any = None
    best: float = math.inf
    cpu: float = math.inf
    check: Any = None
    skipped: str | None = None
    turns: list[float] = field(default_factory=list)  # the fastest pass of each repeat


# ----- measuring -------------------------------------------------------------------------
@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``TimeoutError`` in this (the main) thread after ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"timed out after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def describe(error: BaseException) -> str:
    if isinstance(error, ModuleNotFoundError) and error.name:
        return f"{error.name} not installed"
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first}"[:160]


def cpu_seconds() -> float:
    """User + system CPU time of this process and of its ended (joined) child processes."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_pass(
    make: Callable[[], Iterable[Any]], keep: Callable[[Any], Any], digest: Callable[[list], Any]
) -> Callable[[], Pass]:
    """A ``run`` that times one full pass over ``make()``, keeping ``keep(batch)`` of each.

    Wall and CPU time (worker processes included: a DataLoader joins its
    workers when the epoch ends) are taken when the last batch is in; the kept
    parts are digested into the check value after that.
    """

    def run() -> Pass:
        gc.collect()
        start, start_cpu = time.perf_counter(), cpu_seconds()
        stream = make()
        kept = [keep(batch) for batch in stream]
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - start_cpu
        del stream  # ends worker processes before the next contender starts
        gc.collect()
        return seconds, digest(kept), cpu

    return run


def measure(rows: list[Row], repeats: int, timeout: float, turn: float) -> None:
    """Best-of seconds per row over ``repeats`` turns each; then checks every row's output.

    The rows take turns (the order reversed every other repeat), so a noisy
    neighbour slows them alike. A row whose passes are quick runs several in
    its turn, until ``turn`` seconds of them (at most 20): more samples for the
    best-of where a pass is short enough for noise to matter.
    """
    for repeat in range(repeats):
        order = rows if repeat % 2 == 0 else rows[::-1]
        for row in order:
            if row.skipped:
                continue
            passes, spent, fastest = 0, 0.0, math.inf
            try:
                while passes == 0 or (spent < turn and passes < 20):
                    with time_limit(timeout):
                        seconds, check, cpu = row.run()
                    if passes + repeat > 0 and check != row.check:
                        raise ValueError(f"passes differ: {short(check)} != {short(row.check)}")
                    row.check, passes, spent = check, passes + 1, spent + seconds
                    fastest = min(fastest, seconds)
                    row.cpu = min(row.cpu, math.inf if cpu is None else cpu)
            except Exception as error:  # a failing peer is a skipped row, never a crash
                row.skipped = f"failed: {describe(error)}"
                print(f"  {row.workload:<13}{row.name:<48}{row.skipped}", flush=True)
                continue
            row.best = min(row.best, fastest)
            row.turns.append(fastest)
            print(
                f"  {row.workload:<13}{row.name:<48}repeat {repeat + 1}/{repeats} "
                f"{fastest:8.3f} s (best of {passes})",
                flush=True,
            )
    reference = rows[0]
    for row in rows:
        if row.skipped:
            continue
        expected = row.expected
        if expected is None and row is not reference:
            if reference.skipped:
                row.skipped = "no reference output to check against"
                continue
            expected = reference.check
        if expected is not None and row.check != expected:
            row.skipped = f"wrong output: {short(row.check)}, expected {short(expected)}"


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def generate(make_data: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    """``make_data(*args)`` and ``None``, or ``None`` and why it failed (its rows are skipped)."""
    try:
        return make_data(*args), None
    except Exception as error:  # no data: the workload's rows say why, the others still run
        return None, f"no data: {describe(error)}"


def skip_all(rows: list[Row], reason: str | None) -> list[Row]:
    if reason is not None:
        for row in rows:
            row.skipped = reason
    return rows


# ----- the workloads ---------------------------------------------------------------------
#: datapipes with per-step statistics on: what keeping them costs (not held to the goals).
STATS_ROW = "datapipes, Loader(stats=True)"
#: datapipes inside Loader.trace(): held to costing at most TRACE_COST of their baseline.
TRACE_ROWS = {
    "datapipes (0 workers), Loader.trace()": "datapipes (0 workers)",
    f"datapipes ({WORKERS} workers), Loader.trace()": f"datapipes ({WORKERS} workers)",
}
TRACE_COST = 0.05


def overhead_rows(sizes: Sizes, workdir: Path) -> tuple[list[Row], int]:
    n = sizes.ints
    kept = (n + 1) // 2  # 3x is even exactly when x is
    expected = (kept, 3 * kept * (kept - 1))  # 3 * (0 + 2 + 4 + ...)

    def digest(batches: list[torch.Tensor]) -> tuple[int, int]:
        return sum(len(b) for b in batches), sum(int(b.sum()) for b in batches)

    contenders: dict[str, Callable[[int], Iterator[Any]]] = {
        "plain generator chain": overhead.plain_chain,
        "torch DataLoader (IterableDataset, 0 workers)": peers.torch_dataloader_ints,
        "torchdata.nodes": overhead.torchdata_nodes,
        "Grain (MapDataset -> IterDataset)": peers.grain_ints,
        "HF datasets (IterableDataset)": peers.hf_datasets_ints,
        "datapipes": overhead.datapipes_loader,
        STATS_ROW: partial(overhead.datapipes_loader, stats=True),
    }
    rows = [
        Row(
            "overhead",
            name,
            timed_pass(partial(make, n), lambda b: b, digest),
            baseline=None if name == "plain generator chain" else "plain generator chain",
            expected=expected,
        )
        for name, make in contenders.items()
    ]
    return rows, n


def jsonl_rows(sizes: Sizes, workdir: Path) -> tuple[list[Row], int]:
    directory = workdir / f"jsonl-{sizes.jsonl_mb}mb-{sizes.jsonl_shards}shards"
    made, failure = generate(
        jsonl_pipeline.generate_shards, directory, sizes.jsonl_mb, sizes.jsonl_shards, 0
    )
    paths = sorted(glob.glob(str(directory / "train-*.jsonl")))
    pattern = str(directory / "train-*.jsonl")
    records = made["records"] if made else 0
    expected = (records, records * (records - 1) // 2)

    def digest(ids: list[torch.Tensor]) -> tuple[int, int]:
        return sum(len(i) for i in ids), sum(int(i.sum()) for i in ids)

    hand, pooled = "hand-written generator", f"hand-written in torch DataLoader ({WORKERS} workers)"
    contenders = [
        (hand, jsonl_pipeline.hand_written, None),
        ("HF datasets (streaming)", jsonl_pipeline.hf_datasets, hand),
        ("torchdata.nodes", peers.torchdata_nodes_jsonl, hand),
        ("datapipes (0 workers)", jsonl_pipeline.datapipes_loader, hand),
        (STATS_ROW, partial(jsonl_pipeline.datapipes_loader, stats=True), hand),
        (pooled, partial(workers_pipeline.torch_dataloader, workers=WORKERS), hand),
        (
            f"datapipes ({WORKERS} workers)",
            partial(workers_pipeline.datapipes_loader, workers=WORKERS),
            pooled,
        ),
    ]
    traced = (
        partial(jsonl_pipeline.datapipes_loader, trace=True),
        partial(workers_pipeline.datapipes_loader, workers=WORKERS, trace=True),
    )
    # Each traced row takes its turn right beside its baseline's (the order reverses every
    # repeat), so the two passes of a repeat meet the same load: the goal pairs them.
    for name, make in zip(TRACE_ROWS, traced):
        after = next(i for i, c in enumerate(contenders) if c[0] == TRACE_ROWS[name])
        contenders.insert(after + 1, (name, make, TRACE_ROWS[name]))
    rows = [
        Row(
            "jsonl",
            name,
            timed_pass(partial(make, paths, pattern), lambda b: b["id"], digest),
            baseline=baseline,
            expected=expected,
        )
        for name, make, baseline in contenders
    ]
    return skip_all(rows, failure), records


def image_rows(sizes: Sizes, workdir: Path) -> tuple[list[Row], int]:
    directory = workdir / f"images-{sizes.image_shards}x{sizes.images_per_shard}"
    made, failure = generate(
        images.generate_tars, directory, sizes.image_shards, sizes.images_per_shard, 0
    )
    paths = [str(directory / name) for name in made["files"]] if made else []

    def keep(batch: tuple[torch.Tensor, torch.Tensor, list[str]]) -> tuple[Any, ...]:
        pixels, labels, keys = batch
        assert pixels.shape[1:] == (3, images.SIZE, images.SIZE), pixels.shape
        return len(keys), int(labels.sum()), keys, float(pixels.sum(dtype=torch.float64))

    def digest(kept: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        count = sum(k[0] for k in kept)
        keys = sorted(key for k in kept for key in k[2])
        key_digest = hashlib.sha1("\n".join(keys).encode()).hexdigest()[:12]
        mean = round(math.fsum(k[3] for k in kept) / max(count, 1), 3)
        return count, sum(k[1] for k in kept), key_digest, mean

    rows = []
    for workers in (0, WORKERS):
        hand = f"hand-written in torch DataLoader ({workers} workers)"
        first = "hand-written in torch DataLoader (0 workers)"
        for label, make in (
            (hand, images.hand_written),
            (f"webdataset ({workers} workers)", images.webdataset),
            (f"datapipes ({workers} workers)", images.datapipes),
        ):
            baseline = None if label == first else (first if label == hand else hand)
            run = timed_pass(partial(make, paths, workers), keep, digest)
            rows.append(Row("images", label, run, baseline=baseline))
    return skip_all(rows, failure), made["samples"] if made else 0


#: What the images_large report needs besides its rows: the data's manifest, the limit, the
#: baseline's name, the pixel checks and the stats tables (filled by its builder and finisher).
LARGE: dict[str, Any] = {}


def images_large_rows(sizes: Sizes, workdir: Path) -> tuple[list[Row], int]:
    directory = workdir / f"photos-{sizes.large_shards}x{sizes.large_per_shard}"
    made, failure = generate(
        images_large.generate_shards, directory, sizes.large_shards, sizes.large_per_shard, 0
    )
    LARGE.clear()
    if made is None:
        return skip_all([Row("images_large", "all", lambda: (0.0, None, None))], failure), 0
    paths = [str(directory / name) for name in made["files"]]
    print(f"  limit: decode + crop single-thread on {min(300, made['samples'])} photos", flush=True)
    limit = images_large.measure_limit(paths, count=min(300, made["samples"]))
    LARGE.update(manifest=made, limit=limit, batch=sizes.large_batch, paths=paths)
    LARGE.update(limit_count=min(300, made["samples"]))
    LARGE.update(check=images_large_bench.check_shard(workdir))
    expected = images_large_bench.expected(made)
    rows = [
        Row(
            "images_large",
            name,
            timed_pass(
                partial(make, paths, setting, sizes.large_batch),
                images_large_bench.keep,
                images_large_bench.digest,
            ),
            expected=expected,
        )
        for name, make, setting in images_large_bench.contenders(sizes is QUICK)
    ]
    return rows, made["samples"]


def finish_images_large(rows: list[Row]) -> None:
    """After the timing: the baseline (the hand-written DataLoader's best setting), the
    pixel checks and one datapipes pass with statistics (none of them timed)."""
    if not LARGE:
        return
    baseline = images_large_bench.baseline_name(timed_rows(rows))
    LARGE["baseline"] = baseline
    for row in rows:
        row.baseline = None if row.name == baseline else baseline
    print("  the limit again (the best of both counts), pixel checks, loader.stats()", flush=True)
    again = images_large.measure_limit(LARGE["paths"], count=LARGE["limit_count"])
    LARGE["limit"] = images_large.best_limit(LARGE["limit"], again)
    LARGE["pixels"] = images_large_bench.pixel_checks(LARGE["check"], 8)
    try:
        LARGE["stats"] = images_large_bench.stats_tables(LARGE["paths"], LARGE["batch"])
    except Exception as error:  # the report says so; the timings stand
        LARGE["stats"] = {"all": f"not measured: {describe(error)}"}


def resume_rows(sizes: Sizes, workdir: Path) -> tuple[list[Row], int]:
    directory = workdir / f"resume-{sizes.resume_mb}mb"
    made, failure = generate(resume_cost.generate_file, directory, sizes.resume_mb, 0)
    path, records = made or (directory, 0)
    batches = math.ceil(records / jsonl_pipeline.BATCH)
    positions = [int(fraction * batches) for fraction in RESUME_AT]
    libraries: dict[str, Callable[[Path], Any]] = {
        "HF datasets + StatefulDataLoader": peers.hf_datasets_resumable,
        "torchdata.nodes": peers.torchdata_nodes_resumable,
        "datapipes": peers.datapipes_resumable,
    }
    rows = []
    for library, make_loader in libraries.items():
        states: dict[int, Any] = {}  # collected (untimed) on the first run of either row
        for fraction, position in zip(RESUME_AT, positions):
            first_id = position * jsonl_pipeline.BATCH
            last_id = min(first_id + jsonl_pipeline.BATCH, records)
            run = partial(resume_once, make_loader, path, states, positions, position)
            name = f"{library} @ {fraction:.0%}"
            rows.append(Row("resume", name, run, expected=tuple(range(first_id, last_id))))
    return skip_all(rows, failure), records


def resume_once(
    make_loader: Callable[[Path], Any],
    path: Path,
    states: dict[int, Any],
    positions: list[int],
    position: int,
) -> Pass:
    """Seconds from ``load_state_dict`` (on a new loader) to the first batch; that batch's ids."""
    if not states:
        states.update(resume_cost.collect_states(make_loader(path), positions)[0])
    loader = make_loader(path)
    gc.collect()
    start = time.perf_counter()
    loader.load_state_dict(states[position])
    batch = next(iter(loader))
    seconds = time.perf_counter() - start
    if hasattr(loader, "close"):
        loader.close()
    return seconds, tuple(batch["id"].tolist()), None


def parquet_rows(sizes: Sizes, workdir: Path) -> tuple[list[Row], int]:
    directory = workdir / f"parquet-{sizes.parquet_rows}x{sizes.parquet_shards}"
    made, failure = generate(
        parquet_read.generate_shards, directory, sizes.parquet_rows, sizes.parquet_shards
    )
    paths = [str(directory / name) for name in made["files"]] if made else []
    pattern = str(directory / "train-*.parquet")
    records = made["records"] if made else 0
    expected = (records, records * (records - 1) // 2)
    rows = [
        Row(
            "parquet",
            name,
            timed_pass(partial(make, paths, pattern), parquet_read.keep, parquet_read.digest),
            baseline=baseline,
            expected=expected,
        )
        for name, make, baseline in parquet_read.CONTENDERS
    ]
    return skip_all(rows, failure), records


def write_rows(fmt: str) -> Callable[[Sizes, Path], tuple[list[Row], int]]:
    """The builder of the ``write_<fmt>`` workload (``write_compare.py``)."""

    def build(sizes: Sizes, workdir: Path) -> tuple[list[Row], int]:
        workload = f"write_{fmt}"
        records, failure = generate(write_compare.cached_records, sizes.write_records)
        info = write_compare.Info(sizes.write_records, sizes.write_per_shard)
        write_compare.INFO[workload] = info
        TITLES[workload] = write_compare.title(fmt, sizes.write_per_shard)
        expected = write_compare.expected(records) if records else None
        folder = workdir / "written"
        folder.mkdir(parents=True, exist_ok=True)
        contenders = write_compare.contenders(fmt)
        baseline = contenders[0][0]
        rows = [
            Row(
                workload,
                name,
                partial(
                    write_compare.write_pass,
                    write,
                    records,
                    sizes.write_per_shard,
                    kind,
                    folder,
                    name,
                    info,
                    cpu_seconds,
                ),  # fmt: skip
                baseline=None if name == baseline else baseline,
                expected=expected,
            )
            for name, write, kind in contenders
        ]
        return skip_all(rows, failure), sizes.write_records

    return build


def text_rows(sizes: Sizes, workdir: Path) -> tuple[list[Row], int]:
    """The ``text`` workload (``text_compare.py``): every row against the data's checks."""
    directory = workdir / f"text-{sizes.text_documents}x{sizes.text_shards}"
    made, failure = generate(
        text_compare.generate, directory, sizes.text_documents, sizes.text_shards
    )
    text_compare.INFO.clear()
    if made is None:
        return skip_all([Row("text", "all", lambda: (0.0, None, None))], failure), 0
    text_compare.INFO.update(made)
    tokenizer = text_compare.load_tokenizer(str(directory / text_compare.TOKENIZER_FILE))
    paths = [str(directory / name) for name in made["files"] if name.endswith(".parquet")]
    pattern = str(directory / "train-*.parquet")
    rows = [
        Row(
            "text",
            name,
            timed_pass(make, text_compare.keep, text_compare.digest),
            baseline=baseline,
            expected=made[check],
        )
        for name, make, baseline, check in text_compare.contenders(paths, pattern, tokenizer)
    ]
    return rows, made["tokens"]


BUILDERS = {
    "overhead": (overhead_rows, "ints"),
    "jsonl": (jsonl_rows, "records"),
    "images": (image_rows, "images"),
    "images_large": (images_large_rows, "images"),
    "resume": (resume_rows, "records"),
    "parquet": (parquet_rows, "rows"),
    "write_tar": (write_rows("tar"), "records"),
    "write_parquet": (write_rows("parquet"), "records"),
    "text": (text_rows, "tokens"),
}
FINISH = {"images_large": finish_images_large}

TITLES = {
    "overhead": "map -> filter -> batch(256) -> collate over {n:,} ints",
    "jsonl": "JSONL read -> json -> map -> shuffle(10,000) -> batch(256) -> collate, {n:,} records",
    "images": "tar shards -> JPEG decode -> resize/normalize -> batch(64), {n:,} images",
    "images_large": images_large_bench.TITLE,
    "resume": "resume on one JSONL file of {n:,} records (read -> json -> map -> batch(256))",
    "parquet": "every row of Parquet shards ({n:,} rows of id, text, label, 8 floats)",
    "write_tar": write_compare.title("tar", Sizes.write_per_shard),  # the run's: write_rows
    "write_parquet": write_compare.title("parquet", Sizes.write_per_shard),
    "text": text_compare.TITLE,
}


# ----- reporting -------------------------------------------------------------------------
def version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "unknown"


def machine_header() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    peers_text = ", ".join(f"{name} {version(name)}" for name in PEERS)
    return (
        f"Machine: {cpu_model()}, {os.cpu_count()} cores ({usable} usable), "
        f"{platform.system()} {platform.release()}; Python {platform.python_version()}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} intra-op threads); "
        f"peers: {peers_text}; datapipes {version('datapipes-torch')} (git {git_revision()})"
    )


def paired_ratio(row: Row, by_name: dict[str, Row]) -> float | None:
    """The median over repeats of the baseline's time over the row's, each repeat's turns
    taken side by side: steadier than best against best where the machine's speed drifts
    by more than the difference measured (a trace's few percent on a busy 2-core VM)."""
    base = by_name.get(row.baseline) if row.baseline else None
    if row.skipped or base is None or base.skipped or not row.turns:
        return None
    if len(base.turns) != len(row.turns):
        return None  # a row that failed part-way: its turns pair with nothing
    return statistics.median(b / r for b, r in zip(base.turns, row.turns))


def ratio_of(row: Row, by_name: dict[str, Row]) -> float | None:
    if row.skipped:
        return None
    base = by_name.get(row.baseline) if row.baseline else row
    if base is None or base.skipped:
        return None
    return base.best / row.best


def throughput_table(results: dict[str, tuple[list[Row], int]]) -> list[str]:
    lines = [
        "| workload | implementation | best time | throughput | CPU time | vs baseline "
        "| baseline |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for workload, (rows, items) in results.items():
        if workload == "resume":
            continue
        unit = BUILDERS[workload][1]
        by_name = {row.name: row for row in rows}
        for row in rows:
            ratio = ratio_of(row, by_name)
            if row.skipped:
                cells = ["—", "—", "—", f"skipped: {row.skipped}"]
            else:
                cells = [f"{row.best:.3f} s", f"{items / row.best:,.0f} {unit}/s"]
                cells.append(f"{row.cpu:.3f} s")
                if ratio is None:
                    cells.append(f"skipped: baseline {row.baseline} missing")
                elif row.name.startswith("datapipes"):
                    cells.append(f"**{ratio:.2f}x**")
                else:
                    cells.append(f"{ratio:.2f}x")
            cells.append("(itself)" if row.baseline is None else row.baseline)
            lines.append(f"| {workload} | {row.name} | " + " | ".join(cells) + " |")
    return lines


def resume_table(rows: list[Row]) -> list[str]:
    lines = [
        "| implementation | resume @ 10% | resume @ 90% | 90% / 10% |",
        "| --- | ---: | ---: | ---: |",
    ]
    for low, high in zip(rows[::2], rows[1::2]):
        library = low.name.rsplit(" @ ", 1)[0]
        if low.skipped or high.skipped:
            reason = low.skipped or high.skipped
            lines.append(f"| {library} | — | — | skipped: {reason} |")
            continue
        lines.append(
            f"| {library} | {low.best * 1e3:.1f} ms | {high.best * 1e3:.1f} ms "
            f"| {high.best / low.best:.2f}x |"
        )
    return lines


def goals(results: dict[str, tuple[list[Row], int]]) -> list[str]:
    """The project's goals, each PASS, MISS or n/a (not measured in this run)."""
    lines = []

    def verdict(ok: bool | None) -> str:
        return "n/a " if ok is None else ("PASS" if ok else "MISS")

    def best(workload: str, name: str) -> Row | None:
        row = next((r for r in results.get(workload, ([], 0))[0] if r.name == name), None)
        return None if row is None or row.skipped else row

    ours = []
    for workload, (rows, _) in results.items():
        if workload in WRITE_WORKLOADS or workload == "text":  # their modules' goals
            continue
        by_name = {row.name: row for row in rows}
        for row in rows:
            if row.name in TRACE_ROWS:
                ratio = paired_ratio(row, by_name)
                ok = ratio is not None and ratio >= 1.0 - TRACE_COST
                lines.append(
                    f"- {verdict(None if ratio is None else ok)} a trace costs at most "
                    f"{TRACE_COST:.0%}: {workload}, {row.name}: "
                    f"{'n/a' if ratio is None else f'{ratio:.2f}x'} of {row.baseline} "
                    f"(median of {len(row.turns)} repeats, the two rows side by side)"
                )
                continue
            if row.name.startswith("datapipes") and row.baseline and row.name != STATS_ROW:
                ratio = ratio_of(row, by_name)
                ours.append(f"{workload} {row.name} {'n/a' if ratio is None else f'{ratio:.2f}x'}")
                ok = ratio is not None and ratio >= 1.0
                lines.append(
                    f"- {verdict(None if ratio is None else ok)} datapipes >= its baseline: "
                    f"{workload}, {row.name}: "
                    f"{'n/a' if ratio is None else f'{ratio:.2f}x'} vs {row.baseline}"
                )
    for workload, peer, ours_name, target in (
        ("overhead", "torchdata.nodes", "datapipes", 2.0),
        ("jsonl", "HF datasets (streaming)", "datapipes (0 workers)", 5.0),
        ("parquet", parquet_read.HF, parquet_read.DP_ROWS, 5.0),
    ):
        theirs, mine = best(workload, peer), best(workload, ours_name)
        speedup = theirs.best / mine.best if theirs and mine else None
        text = "n/a" if speedup is None else f"{speedup:.2f}x"
        ok = None if speedup is None else speedup >= target
        lines.append(
            f"- {verdict(ok)} datapipes >= {target:.0f}x faster than {peer} on {workload}: {text}"
        )
    # Workers that scale without a knob (issue 29): the default settings against one plain
    # process (the hand-written generator), and against datapipes' own single process.
    one, two = (
        best("jsonl", "datapipes (0 workers)"),
        best("jsonl", f"datapipes ({WORKERS} workers)"),
    )
    plain = best("jsonl", "hand-written generator")
    scale = plain.best / two.best if plain and two else None
    own = f", {one.best / two.best:.2f}x datapipes (0 workers)" if one and two else ""
    text = "n/a" if scale is None else f"{scale:.2f}x the hand-written generator{own}"
    lines.append(
        f"- {verdict(None if scale is None else scale >= 1.6)} datapipes {WORKERS} workers "
        f">= 1.6x one plain process on jsonl (default settings): {text}"
    )
    if "images_large" in results and LARGE:
        for ok, text in images_large_bench.goals(timed_rows(results["images_large"][0]), LARGE):
            lines.append(f"- {verdict(ok)} {text}")
    low, high = best("resume", "datapipes @ 10%"), best("resume", "datapipes @ 90%")
    growth = high.best / low.best if low and high else None
    ok = None if growth is None else growth <= 1.5
    text = "n/a" if growth is None else f"{growth:.2f}x"
    lines.append(f"- {verdict(ok)} datapipes resume at 90% within 1.5x of at 10%: {text}")
    for ok, text in write_compare.goals(written_rows(results)):
        lines.append(f"- {verdict(ok)} {text}")
    text_timed = timed_rows(results["text"][0]) if "text" in results else []
    for ok, text in text_compare.goals(text_timed):
        lines.append(f"- {verdict(ok)} {text} (text)")
    return lines


WRITE_WORKLOADS = ("write_tar", "write_parquet")


def written_rows(results: dict[str, tuple[list[Row], int]]) -> dict[str, list[Any]]:
    return {w: timed_rows(results[w][0]) for w in WRITE_WORKLOADS if w in results}


def timed_rows(rows: list[Row]) -> list[images_large_bench.Timed]:
    return [images_large_bench.Timed(r.name, r.best, r.cpu, r.skipped) for r in rows]


def report(
    results: dict[str, tuple[list[Row], int]], header: str, repeats: int, turn: float
) -> str:
    out = [f"# datapipes compare (best of {repeats} turns, implementations interleaved)", ""]
    out += [header, ""]
    if turn:
        out += [f"A row whose passes are short runs several per turn, up to {turn:.1f} s.", ""]
    for workload, (_, items) in results.items():
        title = TITLES[workload]
        if workload == "images_large":
            title = title.format(batch=LARGE.get("batch", "?"))
        out.append(f"- {workload}: {title.format(n=items)}")
    if any(w != "resume" for w in results):
        out += ["", "## Throughput", "", RATIO_NOTE, ""]
        out += throughput_table(results)
    if "resume" in results:
        out += ["", "## Resume cost", ""]
        out.append(
            "Time from `load_state_dict` on a new loader to its first batch (the loader is "
            "built before the clock starts); 90% / 10% near 1.00x: the cost does not grow "
            "with the position."
        )
        out += [""] + resume_table(results["resume"][0])
    if "images_large" in results and LARGE:
        out += images_large_bench.section(timed_rows(results["images_large"][0]), LARGE)
    if any(w in results for w in WRITE_WORKLOADS):
        out += write_compare.section(written_rows(results))
    if "text" in results:
        out += text_compare.section(timed_rows(results["text"][0]))
    out += ["", "## Goals", ""] + goals(results)
    return "\n".join(out) + "\n"


# ----- main ------------------------------------------------------------------------------
def parse_only(text: str) -> list[str]:
    chosen = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {unknown}; choose from {WORKLOADS}")
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="passes per row (default 3)")
    parser.add_argument(
        "--only", type=parse_only, default=list(WORKLOADS), help=f"comma-separated: {WORKLOADS}"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="data cache (default: temp)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the report here")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per pass (300)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads in this process (default 1, as in DataLoader workers: "
        "2 threads on 2 cores made the per-image resize 2-5x slower and noisy)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)

    sizes = QUICK if args.quick else Sizes()
    repeats = args.repeats or (1 if args.quick else 3)
    timeout = args.timeout or (60.0 if args.quick else 300.0)
    turn = 0.0 if args.quick else 0.3
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="datapipes-compare-"))
    header = machine_header()
    print(header, flush=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    results: dict[str, tuple[list[Row], int]] = {}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*DataLoader will create.*")
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            for workload in [w for w in WORKLOADS if w in args.only]:
                build = BUILDERS[workload][0]
                print(f"{workload}:", flush=True)
                rows, items = build(sizes, workdir)
                measure(rows, repeats, timeout, turn)
                if workload in FINISH:
                    FINISH[workload](rows)
                results[workload] = (rows, items)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    header += (
        f"\nLoad average {load_before[0]:.1f} before, {load_after[0]:.1f} after (1 min); "
        f"whole run {time.perf_counter() - started:.0f} s."
    )
    text = report(results, header, repeats, turn)
    print()
    print(text, end="")
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
