"""Writing a dataset: the records, the writers, and a check of what each one wrote.

Used by ``compare.py`` (the ``write_tar`` and ``write_parquet`` workloads). The
records are ``n`` dicts ``{"__key__", "jpg", "txt"}``: ``jpg`` JPEG-like bytes
(a JPEG start and end marker around 2-6 KB of random bytes, every record's
different, so that neither parquet's dictionary encoding nor its compression
shrinks them), ``txt`` a caption of 6-20 words. They are generated once, in
memory, and every writer writes the same list, in shards of ``per_shard``
records, to a new folder on local disk:

* ``hand_tar`` / ``hand_parquet``: the hand-written writers, ``tarfile`` (one
  member per field, ``<key>.jpg`` and ``<key>.txt``) and ``pyarrow``
  (``pa.table`` of the three columns, ``pq.write_table``) in a plain loop;
* ``webdataset_tar``: ``wds.ShardWriter(maxcount=per_shard)``, one ``write`` per record;
* ``litdata_optimize``: ``litdata.optimize(chunk_size=per_shard, num_workers=1)``
  (its own chunk format; its one worker process gets the records by fork);
* ``datapipes_write``: ``dp.write(dp.from_sequence(records), format=...,
  records_per_shard=per_shard)``, in this process or with DataLoader workers.
  It does more than the others: it checksums every shard (CRC-32 for its
  manifest by default; a row with ``checksum="sha256"`` shows what a content
  hash costs), writes each through a temporary file that it fsyncs and renames,
  and writes its unit records and manifest.

A pass (``write_pass``) times the writer and then fsyncs every file it wrote,
also timed: the clock stops when the output is on disk, for every writer
alike (dp.write has fsynced its shards already; the others leave them in the
page cache, which a real dataset, larger than the page cache's dirty limit,
would not let them do). The time to return, before that fsync, is kept too.
``check`` then reads back what was written (untimed): the record count, the
total image bytes and a digest of the keys, the same for every writer.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import importlib
import io
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import datapipes as dp

WORDS = (
    "a photo of the small large red blue green dog cat bird tree house car street "
    "river mountain beach city night day sunny cloudy old new bright dark people"
).split()
SOI, EOI = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", b"\xff\xd9"


def make_records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` records (see the module doc), the same for the same ``n`` and ``seed``."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2048, 6144, n)
    blob = memoryview(rng.bytes(int(sizes.sum())))
    lengths = rng.integers(6, 21, n)
    words = rng.integers(0, len(WORDS), int(lengths.sum())).tolist()
    records, offset, word = [], 0, 0
    for i in range(n):
        size, length = int(sizes[i]), int(lengths[i])
        caption = " ".join(WORDS[w] for w in words[word : word + length])
        records.append(
            {
                "__key__": f"{i:08d}",
                "jpg": SOI + blob[offset : offset + size].tobytes() + EOI,
                "txt": f"{i}: {caption}",
            }
        )
        offset, word = offset + size, word + length
    return records


def expected(records: list[dict[str, Any]]) -> tuple[int, int, str]:
    """What ``check`` gives for a complete write of ``records`` (in any shard order)."""
    keys = sorted(r["__key__"] for r in records)
    return len(records), sum(len(r["jpg"]) for r in records), key_digest(keys)


def key_digest(keys: list[str]) -> str:
    return hashlib.sha1("\n".join(sorted(keys)).encode()).hexdigest()[:12]


# ----- the writers -----------------------------------------------------------------------
def shard_ranges(n: int, per_shard: int) -> list[tuple[int, int]]:
    return [(start, min(start + per_shard, n)) for start in range(0, n, per_shard)]


def hand_tar(records: list[dict[str, Any]], out: Path, per_shard: int) -> None:
    out.mkdir(parents=True)
    for number, (start, end) in enumerate(shard_ranges(len(records), per_shard)):
        with tarfile.open(out / f"shard-{number:06d}.tar", "w") as tar:
            for record in records[start:end]:
                key = record["__key__"]
                for member in ("jpg", "txt"):
                    value = record[member]
                    data = value if isinstance(value, bytes) else value.encode()
                    info = tarfile.TarInfo(f"{key}.{member}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def hand_parquet(records: list[dict[str, Any]], out: Path, per_shard: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True)
    for number, (start, end) in enumerate(shard_ranges(len(records), per_shard)):
        shard = records[start:end]
        table = pa.table({name: [r[name] for r in shard] for name in ("__key__", "jpg", "txt")})
        pq.write_table(table, out / f"shard-{number:06d}.parquet")


def webdataset_tar(records: list[dict[str, Any]], out: Path, per_shard: int) -> None:
    import webdataset as wds

    out.mkdir(parents=True)
    pattern = str(out / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=per_shard, maxsize=1e15, verbose=0) as sink:
        for record in records:
            sink.write(record)


#: The records litdata's worker process reads (inherited by fork, not pickled).
_LITDATA_RECORDS: list[dict[str, Any]] = []


def _litdata_record(index: int) -> dict[str, Any]:
    return _LITDATA_RECORDS[index]


def litdata_optimize(records: list[dict[str, Any]], out: Path, per_shard: int) -> None:
    import litdata

    # litdata stages its chunks in a cache folder that it empties first (by default under
    # the system's temporary folder): one of its own beside ``out``
    cache = out.parent / f"{out.name}-litdata-cache"
    saved = {name: os.environ.get(name) for name in LITDATA_CACHES}
    os.environ.update({name: str(cache / name) for name in LITDATA_CACHES})
    _LITDATA_RECORDS[:] = records
    try:
        litdata.optimize(
            fn=_litdata_record,
            inputs=list(range(len(records))),
            output_dir=str(out),
            chunk_size=per_shard,
            num_workers=1,
            start_method="fork",
            mode="overwrite",
            verbose=False,
        )
    finally:
        _LITDATA_RECORDS.clear()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(cache, ignore_errors=True)


LITDATA_CACHES = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")


def datapipes_write(
    records: list[dict[str, Any]],
    out: Path,
    per_shard: int,
    fmt: str,
    workers: int,
    checksum: str = "crc32",
) -> None:
    dp.write(
        dp.from_sequence(records),
        str(out),
        format=fmt,
        records_per_shard=per_shard,
        num_workers=workers,
        checksum=checksum,
    )


# ----- reading back ----------------------------------------------------------------------
def check(out: Path, kind: str) -> tuple[int, int, str]:
    """(records, image bytes, key digest) of what was written to ``out`` as ``kind``
    (``"tar"``, ``"parquet"`` or ``"litdata"``)."""
    keys: list[str] = []
    image_bytes = 0
    if kind == "tar":
        for path in sorted(out.glob("*.tar")):
            for name, size in tar_members(path.read_bytes()):
                key, _, suffix = name.partition(".")
                if suffix == "jpg":
                    keys.append(key)
                    image_bytes += size
    elif kind == "parquet":
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        for path in sorted(out.glob("*.parquet")):
            table = pq.read_table(path, columns=["__key__", "jpg"])
            keys += table.column("__key__").to_pylist()
            image_bytes += pc.sum(pc.binary_length(table.column("jpg"))).as_py() or 0
    elif kind == "litdata":
        from litdata import StreamingDataset

        for item in StreamingDataset(str(out)):
            keys.append(item["__key__"])
            image_bytes += len(item["jpg"])
    else:
        raise ValueError(kind)
    return len(keys), image_bytes, key_digest(keys)


def tar_members(data: bytes) -> list[tuple[str, int]]:
    """(name, size) of the files in the tar ``data``: its headers read directly, about 20x
    faster than ``tarfile`` (ustar, GNU long names and pax ``path`` records)."""
    members, offset, long_name = [], 0, None
    while offset + 512 <= len(data):
        header = data[offset : offset + 512]
        if header == bytes(512):
            break  # the end
        name = header[:100].split(b"\0", 1)[0].decode()
        size = int(header[124:136].strip(b"\0 ") or b"0", 8)
        kind = header[156:157]
        body = data[offset + 512 : offset + 512 + size]
        offset += 512 + -(-size // 512) * 512
        if kind == b"L":  # GNU: the next member's name
            long_name = body.split(b"\0", 1)[0].decode()
        elif kind == b"x":  # pax: "<length> <key>=<value>\n" records
            for record in body.decode().splitlines():
                key, _, value = record.partition(" ")[2].partition("=")
                if key == "path":
                    long_name = value
        elif kind in (b"0", b"\0"):
            members.append((long_name or name, size))
            long_name = None
        else:  # "g" (pax global) and others: not files
            long_name = None
    return members


def sync_files(out: Path) -> None:
    """fsync every file under ``out``: what the writer wrote is on disk."""
    for folder, _, names in os.walk(out):
        for name in names:
            descriptor = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)


def disk_usage(out: Path) -> tuple[int, int]:
    """(files, bytes) under ``out``."""
    sizes = [
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(out)
        for name in names
    ]
    return len(sizes), sum(sizes)


# ----- for compare.py --------------------------------------------------------------------
def title(fmt: str, per_shard: int) -> str:
    """The workload's title in the report (``{n:,}`` left for the record count)."""
    return (
        "write {n:,} records (2-6 KB JPEG-like bytes + a caption) as "
        f"{fmt} shards of {per_shard:,} records to local disk, until the files are on disk"
    )


HAND = {"tar": "hand-written (tarfile)", "parquet": "hand-written (pyarrow)"}
WEBDATASET = "webdataset ShardWriter"
LITDATA = "litdata optimize() (own format, 1 worker)"


def ours(workers: int, checksum: str = "crc32") -> str:
    if checksum != "crc32":
        return f"datapipes dp.write ({workers} workers, checksum={checksum})"
    return f"datapipes dp.write ({workers} workers)"


Writer = Callable[[list[dict[str, Any]], Path, int], None]


def contenders(fmt: str) -> list[tuple[str, Writer, str]]:
    """(row name, writer, what ``check`` reads) of the ``fmt`` workload; the first is the
    baseline. litdata writes its own format: its row is in the tar workload."""
    rows: list[tuple[str, Writer, str]]
    if fmt == "tar":
        rows = [(HAND["tar"], hand_tar, "tar"), (WEBDATASET, webdataset_tar, "tar")]
        rows.append((LITDATA, litdata_optimize, "litdata"))
    else:
        rows = [(HAND["parquet"], hand_parquet, "parquet")]
    for workers in (0, 2):
        rows.append((ours(workers), partial(datapipes_write, fmt=fmt, workers=workers), fmt))
    sha = partial(datapipes_write, fmt=fmt, workers=0, checksum="sha256")
    rows.append((ours(0, "sha256"), sha, fmt))  # what the content hash costs
    return rows


@functools.lru_cache(maxsize=1)
def cached_records(n: int) -> list[dict[str, Any]]:
    """The records of both workloads, made once per run (and the writers' libraries
    imported, so that no row's first pass pays for an import: pyarrow.parquet imports
    pandas)."""
    for library in ("pyarrow.parquet", "webdataset", "litdata"):
        try:
            importlib.import_module(library)
        except ImportError:
            pass  # its row says so
    return make_records(n)


@dataclass
class Info:
    """What the report says besides the rows: sizes, and each row's best time to return
    and what it left on disk."""

    n: int = 0
    per_shard: int = 0
    returned: dict[str, float] = field(default_factory=dict)
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)


INFO: dict[str, Info] = {}  # by workload


def write_pass(
    write: Writer,
    records: list[dict[str, Any]],
    per_shard: int,
    kind: str,
    workdir: Path,
    name: str,
    info: Info,
    cpu_seconds: Callable[[], float],
) -> tuple[float, Any, float]:
    """One timed pass of ``write`` into a new folder of ``workdir``: (seconds until its
    files are on disk, check value, CPU seconds)."""
    out = workdir / f"out-{name.split()[0]}-{time.monotonic_ns()}"
    gc.collect()
    try:
        start, start_cpu = time.perf_counter(), cpu_seconds()
        write(records, out, per_shard)
        returned = time.perf_counter() - start
        sync_files(out)
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - start_cpu
        info.returned[name] = min(info.returned.get(name, returned), returned)
        info.usage[name] = disk_usage(out)
        return seconds, check(out, kind), cpu
    finally:
        shutil.rmtree(out, ignore_errors=True)


def section(rows: dict[str, list[Any]]) -> list[str]:
    """The markdown section of both workloads (``rows``: ``Timed`` rows by workload)."""
    out = ["", "## Writing", ""]
    first = next(iter(INFO.values()), None)
    if first is None:
        return []
    out.append(
        f"{first.n:,} records (`__key__`, `jpg`: 2-6 KB of JPEG-like bytes, `txt`: a "
        f"caption), made once in memory, written in shards of {first.per_shard:,} records "
        "to a new folder on local disk. **on disk**: until the writer returned and every "
        "file it wrote was fsynced (timed; dp.write fsyncs its shards itself); "
        "**returned**: until the writer returned, its files perhaps still in the page "
        "cache. Ratios are to the hand-written writer of the format (> 1.00x: faster)."
    )
    out += [
        "",
        "| format | implementation | on disk | records/s | vs baseline | returned | records/s "
        "| vs baseline | CPU time | files | MB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for workload, timed in rows.items():
        info = INFO.get(workload)
        if info is None:
            continue
        fmt = workload.removeprefix("write_")
        by_name = {row.name: row for row in timed if not row.skipped}
        base = by_name.get(HAND[fmt])
        for row in timed:
            if row.skipped or row.name not in info.returned:
                out.append(f"| {fmt} | {row.name} | — | — | — | — | — | — | — | — | "
                           f"skipped: {row.skipped or 'not run'} |")  # fmt: skip
                continue
            returned = info.returned[row.name]
            files, size = info.usage[row.name]
            on_disk_ratio = f"{base.best / row.best:.2f}x" if base else "n/a"
            base_returned = info.returned.get(HAND[fmt]) if base else None
            returned_ratio = f"{base_returned / returned:.2f}x" if base_returned else "n/a"
            out.append(
                f"| {fmt} | {row.name} | {row.best:.3f} s | {info.n / row.best:,.0f} "
                f"| {on_disk_ratio} | {returned:.3f} s | {info.n / returned:,.0f} "
                f"| {returned_ratio} | {row.cpu:.3f} s | {files} | {size / 1e6:.1f} |"
            )
    return out


def goals(rows: dict[str, list[Any]]) -> list[tuple[bool | None, str]]:
    """(ok or None when not measured, text) for the goals of the write workloads: dp.write
    (one process) within 1.1x of the hand-written writer, for tar and parquet, and faster
    than webdataset's ShardWriter and litdata's optimize()."""
    out: list[tuple[bool | None, str]] = []
    for fmt in ("tar", "parquet"):
        by_name = {r.name: r for r in rows.get(f"write_{fmt}", []) if not r.skipped}
        mine, hand = by_name.get(ours(0)), by_name.get(HAND[fmt])
        ratio = hand.best / mine.best if mine and hand else None
        text = "n/a" if ratio is None else f"{ratio:.2f}x"
        out.append(
            (
                None if ratio is None else ratio >= 1 / 1.1,
                f"datapipes dp.write (0 workers) within 1.1x of the hand-written {fmt} writer "
                f"(>= 0.91x): {text}",
            )
        )
        if fmt == "tar":
            for peer in (WEBDATASET, LITDATA):
                theirs = by_name.get(peer)
                speedup = theirs.best / mine.best if mine and theirs else None
                text = "n/a" if speedup is None else f"{speedup:.2f}x"
                out.append(
                    (
                        None if speedup is None else speedup > 1.0,
                        f"datapipes dp.write (0 workers) faster than {peer}: {text}",
                    )
                )
    return out


if __name__ == "__main__":  # python benchmarks/write_compare.py: compare.py's two workloads
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    sys.exit(
        subprocess.call(
            [sys.executable, str(here / "compare.py"), "--only", "write_tar,write_parquet"]
            + sys.argv[1:]
        )
    )
