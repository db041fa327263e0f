"""Sharding files across consumers: whole files, parts of files, shuffled file orders, resume.

A consumer is one (rank, worker) pair, simulated by building the recipe with
``Context(rank=r, world_size=R, worker_id=w, num_workers=W)``. For every
reader the union (as a multiset) of what all consumers read must be the
dataset exactly once, whether files are dealt whole (at least as many files
as consumers) or split inside files (fewer files than consumers).
"""

from __future__ import annotations

import gzip
import io
import json
import signal
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import canon, multiset
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import datapipes as dp
from nodes import Context
from nodes.context import every_consumer
from nodes.testing import read_epoch

# ----- a guard against hangs ------------------------------------------------------------------


class HangError(AssertionError):
    """Reading did not finish within the guard's time (the reader loops forever)."""


class _Alarm(BaseException):
    """Raised by SIGALRM inside the library; a BaseException so no retry loop swallows it."""


@contextmanager
def no_hang(seconds: float = 5.0) -> Iterator[None]:
    """Fail with HangError if the block runs longer than ``seconds`` (reads here take ms).

    Restores any outer SIGALRM timer (pytest-timeout's) afterwards.
    """

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Alarm

    started = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Alarm:
        raise HangError(f"reading did not finish in {seconds}s: the reader hangs") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            left = old_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), old_interval)


@pytest.fixture(autouse=True)
def _no_test_hangs() -> Iterator[None]:
    """A hanging reader fails its test in 30s instead of stalling the suite."""
    with no_hang(30.0):
        yield


# ----- data generators ------------------------------------------------------------------------


def _pad(i: int, j: int, long_every: int = 5, long_size: int = 90) -> str:
    """Uneven padding; every ``long_every``-th record is longer than the small block sizes."""
    if (i + j) % long_every == 0:
        return "L" * long_size + "é"
    return "x" * ((7 * i + 3 * j) % 13) + ("ü" if j % 3 == 0 else "")


@dataclass
class Dataset:
    """Files written to disk, the URLs to pass to dp.files, and what reading them yields."""

    urls: list[str]
    expected: list[Any]
    read: Callable[[dp.FileList], dp.DataPipe[Any]]


def _text_file(header: bytes, lines: list[str]) -> bytes:
    return header + "".join(line + "\n" for line in lines).encode()


def write_lines(folder: Path, sizes: list[int], block: int) -> Dataset:
    urls, expected = [], []
    for i, n in enumerate(sizes):
        lines = [f"{i}:{j}:{_pad(i, j)}" for j in range(n)]
        path = folder / f"part-{i:02d}.txt"
        path.write_bytes(_text_file(b"", lines))
        urls.append(str(path))
        expected += lines
    return Dataset(urls, expected, lambda f: f.read_lines(block_size=block))


def _jsonl_content(i: int, n: int) -> tuple[bytes, list[dict[str, Any]]]:
    records = [{"f": i, "j": j, "pad": _pad(i, j)} for j in range(n)]
    return _text_file(b"", [json.dumps(r, ensure_ascii=False) for r in records]), records


def write_jsonl(folder: Path, sizes: list[int], block: int) -> Dataset:
    urls, expected = [], []
    for i, n in enumerate(sizes):
        content, records = _jsonl_content(i, n)
        path = folder / f"part-{i:02d}.jsonl"
        path.write_bytes(content)
        urls.append(str(path))
        expected += records
    return Dataset(urls, expected, lambda f: f.read_jsonl(block_size=block))


def write_jsonl_gz(folder: Path, sizes: list[int], block: int) -> Dataset:
    urls, expected = [], []
    for i, n in enumerate(sizes):
        content, records = _jsonl_content(i, n)
        path = folder / f"part-{i:02d}.jsonl.gz"
        path.write_bytes(gzip.compress(content, mtime=0))
        urls.append(str(path))
        expected += records
    return Dataset(urls, expected, lambda f: f.read_jsonl(block_size=block))


def write_csv(folder: Path, sizes: list[int], block: int) -> Dataset:
    urls, expected = [], []
    fields = ["id", "file", "pad"]
    for i, n in enumerate(sizes):
        rows = [{"id": f"{i}-{j}", "file": str(i), "pad": _pad(i, j)} for j in range(n)]
        lines = [",".join(row[k] for k in fields) for row in rows]
        path = folder / f"part-{i:02d}.csv"
        path.write_bytes(_text_file((",".join(fields) + "\n").encode(), lines))
        urls.append(str(path))
        expected += rows
    return Dataset(urls, expected, lambda f: f.read_csv(block_size=block))


def _array(i: int, n: int) -> np.ndarray:
    return (np.arange(n * 3, dtype=np.int32).reshape(n, 3) + 1000 * i).astype(np.int32)


def write_npy(folder: Path, sizes: list[int], block: int, rows: bool = True) -> Dataset:
    """``.npy`` files read by rows (one record a row) or whole (one array a file)."""
    urls, expected = [], []
    for i, n in enumerate(sizes):
        array = _array(i, n)
        path = folder / f"part-{i:02d}.npy"
        np.save(path, array)
        urls.append(str(path))
        expected += list(array) if rows else [array]
    return Dataset(urls, expected, lambda f: f.read_npy(rows=rows))


def write_tar(folder: Path, sizes: list[int], block: int) -> Dataset:
    urls, expected = [], []
    for i, n in enumerate(sizes):
        path = folder / f"shard-{i:02d}.tar"
        samples = []
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for j in range(n):
                key = f"f{i}/s{j:03d}"
                fields = {
                    "txt": (f"{i}-{j}-" + _pad(i, j) * (1 + j % 4)).encode(),
                    "cls": str(j % 10).encode(),
                }
                for field, data in fields.items():
                    info = tarfile.TarInfo(f"{key}.{field}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                samples.append({"__key__": key, "__url__": str(path), **fields})
        urls.append(str(path))
        expected += samples
    return Dataset(urls, expected, lambda f: f.read_tar())


def write_bytes(folder: Path, sizes: list[int], block: int) -> Dataset:
    urls, expected = [], []
    for i, n in enumerate(sizes):
        path = folder / f"blob-{i:02d}.bin"
        data = bytes((i * 31 + k) % 256 for k in range(n * 7))
        path.write_bytes(data)
        urls.append(str(path))
        expected.append({"__url__": str(path), "__key__": f"blob-{i:02d}", "bin": data})
    return Dataset(urls, expected, lambda f: f.read_bytes())


def write_parquet(folder: Path, sizes: list[int], block: int) -> Dataset:
    """Parquet files in row groups of 6 rows (the last one shorter), read in blocks of
    ``block`` rows: files split by row groups, and by rows inside one for 9 consumers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    urls, expected = [], []
    for i, n in enumerate(sizes):
        rows = [{"id": f"{i}-{j}", "file": i, "pad": _pad(i, j)} for j in range(n)]
        schema = pa.schema([("id", pa.string()), ("file", pa.int64()), ("pad", pa.string())])
        path = folder / f"part-{i:02d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=6)
        urls.append(str(path))
        expected += rows
    return Dataset(urls, expected, lambda f: f.read_parquet(batch_size=block))


WRITERS: dict[str, Callable[[Path, list[int], int], Dataset]] = {
    "lines": write_lines,
    "jsonl": write_jsonl,
    "jsonl.gz": write_jsonl_gz,
    "csv": write_csv,
    "npy_rows": write_npy,
    "tar": write_tar,
    "bytes": write_bytes,
    "npy_whole": partial(write_npy, rows=False),
    "parquet": write_parquet,
}

# Record counts per file. Block sizes are small and odd, so splits and block cuts fall
# inside records and some records are longer than a block.
FILE_SETS: dict[str, list[int]] = {
    "more_files": [9, 1, 17, 4, 2, 11, 6],  # 7 files: dealt whole to up to 7 consumers
    "with_empty": [12, 0, 5, 1],  # uneven, one empty file
    "fewer_files": [23, 6],  # split inside files for 3+ consumers
    "single_file": [40],  # one file split among all consumers
}
BLOCK = 37

# (world_size, num_workers), fewest consumers first: 1, 2, 2, 3, 3, 4, 6, 6, 9.
TOPOLOGIES = sorted([(r, w) for r in (1, 2, 3) for w in (1, 2, 3)], key=lambda t: (t[0] * t[1], t))


def read_as(pipe: dp.DataPipe[Any], ctx: Context) -> list[Any]:
    with no_hang():
        return read_epoch(pipe.build(ctx))


def union_of_consumers(pipe: dp.DataPipe[Any], world_size: int, num_workers: int) -> list[Any]:
    return [item for ctx in every_consumer(world_size, num_workers) for item in read_as(pipe, ctx)]


# ----- every reader, every file layout, 1-3 ranks x 1-3 workers -------------------------------


def _matrix() -> list[Any]:
    params = []
    for reader in WRITERS:
        for name in FILE_SETS:
            params.append(pytest.param(reader, name, id=f"{reader}-{name}"))
    return params


@pytest.mark.parametrize(("reader", "file_set"), _matrix())
def test_consumers_read_every_record_exactly_once(tmp_path: Path, reader: str, file_set: str):
    data = WRITERS[reader](tmp_path, FILE_SETS[file_set], BLOCK)
    pipe = data.read(dp.files(data.urls))
    expected = multiset(data.expected)
    assert sum(expected.values()) == len(data.expected) > 0
    for world_size, num_workers in TOPOLOGIES:
        got = union_of_consumers(pipe, world_size, num_workers)
        missing = expected - multiset(got)
        extra = multiset(got) - expected
        assert not missing and not extra, (
            f"{world_size} ranks x {num_workers} workers: {sum(missing.values())} records "
            f"missing, {sum(extra.values())} extra or repeated"
        )


@pytest.mark.parametrize("reader", list(WRITERS))
@pytest.mark.parametrize("file_set", list(FILE_SETS))
def test_loader_ranks_read_every_record_exactly_once(tmp_path: Path, reader: str, file_set: str):
    data = WRITERS[reader](tmp_path, FILE_SETS[file_set], BLOCK)
    pipe = data.read(dp.files(data.urls))
    for world_size in (1, 2, 3):
        got: list[Any] = []
        for rank in range(world_size):
            with no_hang():
                got += list(dp.Loader(pipe, rank=rank, world_size=world_size))
        assert multiset(got) == multiset(data.expected), world_size


@pytest.mark.parametrize("reader", ["lines", "jsonl", "csv", "npy_rows", "tar", "parquet"])
def test_a_split_file_gives_every_consumer_a_share(tmp_path: Path, reader: str):
    """With fewer files than consumers the files are split: nobody reads a whole file."""
    data = WRITERS[reader](tmp_path, [40], BLOCK)
    pipe = data.read(dp.files(data.urls))
    shares = [read_as(pipe, ctx) for ctx in every_consumer(2, 2)]
    assert multiset([r for share in shares for r in share]) == multiset(data.expected)
    assert all(0 < len(share) < len(data.expected) for share in shares), [len(s) for s in shares]


def test_compressed_file_is_split_by_interleaved_blocks(tmp_path: Path):
    """A .gz file cannot seek: consumers keep every n-th block, and together read it once."""
    data = write_jsonl_gz(tmp_path, [60], block=41)
    pipe = data.read(dp.files(data.urls))
    for world_size, num_workers in [(2, 1), (1, 3), (3, 2)]:
        shares = [read_as(pipe, ctx) for ctx in every_consumer(world_size, num_workers)]
        assert multiset([r for s in shares for r in s]) == multiset(data.expected)
        assert all(share for share in shares), [len(s) for s in shares]
        # Each share is in file order (blocks are kept in order).
        for share in shares:
            assert [r["j"] for r in share] == sorted(r["j"] for r in share)


@pytest.mark.parametrize("reader", ["lines", "jsonl", "csv"])
def test_lines_longer_than_the_block_are_read_whole_when_split(tmp_path: Path, reader: str):
    """Records much longer than block_size, split among consumers at odd places."""
    sizes = [25]
    data = WRITERS[reader](tmp_path, sizes, BLOCK)
    long_records = [r for r in data.expected if "L" * 90 in str(r)]
    assert len(long_records) >= 3
    for block in (1, 2, 5, 16, 91):
        reread = WRITERS[reader](tmp_path, sizes, block)  # the same files, another block size
        pipe = reread.read(dp.files(reread.urls))
        for world_size, num_workers in [(1, 1), (3, 1), (2, 3)]:
            got = union_of_consumers(pipe, world_size, num_workers)
            assert multiset(got) == multiset(data.expected), (block, world_size, num_workers)


# ----- ends of files, and tiny files ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "read", "expected"),
    [
        ("empty.txt", b"", lambda f: f.read_lines(), []),
        ("empty.jsonl", b"", lambda f: f.read_jsonl(), []),
        ("header_only.csv", b"a,b\n", lambda f: f.read_csv(), []),
        ("empty.csv", b"", lambda f: f.read_csv(), []),
        ("exact_block.jsonl", b"[1]\n[22]\n", lambda f: f.read_jsonl(block_size=5), [[1], [22]]),
        ("exact_block.txt", b"123\n5678\n", lambda f: f.read_lines(block_size=5), ["123", "5678"]),
        ("empty.jsonl.gz", gzip.compress(b"", mtime=0), lambda f: f.read_jsonl(), []),
    ],
)
def test_line_reader_finishes_at_end_of_file(
    tmp_path: Path, name: str, content: bytes, read: Any, expected: list[Any]
):
    path = tmp_path / name
    path.write_bytes(content)
    with no_hang(1.0):
        got = list(dp.Loader(read(dp.files(str(path)))))
    assert got == expected


@pytest.mark.parametrize("content", [b"", b"a\n", b"ab\ncd\n"])
def test_a_text_file_smaller_than_the_consumer_count_can_be_split(tmp_path: Path, content: bytes):
    path = tmp_path / "tiny.txt"
    path.write_bytes(content)
    pipe = dp.files(str(path), retries=0).read_lines()
    got = union_of_consumers(pipe, 3, 3)
    assert Counter(got) == Counter(content.decode().splitlines())


# ----- dp.files itself deals whole URLs --------------------------------------------------------


@pytest.mark.parametrize("n_files", [1, 2, 5, 11])
def test_file_list_deals_whole_urls_exactly_once(tmp_path: Path, n_files: int):
    for i in range(n_files):
        (tmp_path / f"u-{i:02d}.txt").write_text(str(i))
    listing = sorted(str(tmp_path / f"u-{i:02d}.txt") for i in range(n_files))
    pipe = dp.files(str(tmp_path / "u-*.txt"))
    for world_size, num_workers in TOPOLOGIES:
        shares = [read_as(pipe, ctx) for ctx in every_consumer(world_size, num_workers)]
        assert sorted(u for share in shares for u in share) == listing
        sizes = [len(share) for share in shares]
        assert max(sizes) - min(sizes) <= 1, sizes  # dealt round-robin
    for world_size in (1, 2, 3):
        got = [u for r in range(world_size) for u in dp.Loader(pipe, rank=r, world_size=world_size)]
        assert sorted(got) == listing


# ----- file-order shuffle ----------------------------------------------------------------------


def _file_order(records: list[dict[str, Any]]) -> list[int]:
    """The order in which files were read, from a consumer's records."""
    order: list[int] = []
    for record in records:
        if not order or order[-1] != record["f"]:
            order.append(record["f"])
    return order


def test_file_shuffle_new_order_each_epoch_same_on_every_consumer(tmp_path: Path):
    sizes = [3, 5, 2, 4, 6, 1, 3, 2, 5, 4]
    data = write_jsonl(tmp_path, sizes, BLOCK)
    pipe = dp.files(data.urls).shuffle().read_jsonl(block_size=BLOCK)
    orders = []
    for epoch in range(4):
        (ctx,) = every_consumer(1, 1, epoch=epoch, seed=7)
        full = read_as(pipe, ctx)
        assert multiset(full) == multiset(data.expected)
        order = _file_order(full)
        assert sorted(order) == list(range(len(sizes)))
        orders.append(order)
        # Every consumer computes the same permutation and takes files order[c::C].
        for world_size, num_workers in TOPOLOGIES:
            n = world_size * num_workers
            shares = [
                read_as(pipe, c)
                for c in every_consumer(world_size, num_workers, epoch=epoch, seed=7)
            ]
            assert multiset([r for s in shares for r in s]) == multiset(data.expected)
            if n <= len(sizes):
                for index, share in enumerate(shares):
                    assert _file_order(share) == order[index::n], (epoch, world_size, num_workers)
    assert len({tuple(o) for o in orders}) > 1, "the file order never changed between epochs"
    assert orders[0] != list(range(len(sizes))) or orders[1] != list(range(len(sizes)))


def test_file_shuffle_depends_on_the_seed(tmp_path: Path):
    sizes = [2] * 12
    data = write_jsonl(tmp_path, sizes, BLOCK)
    pipe = dp.files(data.urls).shuffle().read_jsonl()
    by_seed = {}
    for seed in range(4):
        loader = dp.Loader(pipe, seed=seed)
        by_seed[seed] = _file_order(list(loader))
        again = _file_order(list(dp.Loader(pipe, seed=seed)))
        assert again == by_seed[seed], "same seed and epoch, same order"
    assert len({tuple(o) for o in by_seed.values()}) > 1
    # A step's own seed overrides the Loader's seed.
    fixed = dp.files(data.urls).shuffle(seed=5).read_jsonl()
    orders = {tuple(_file_order(list(dp.Loader(fixed, seed=s)))) for s in range(3)}
    assert len(orders) == 1


def test_file_shuffle_through_loader_ranks_is_exact_every_epoch(tmp_path: Path):
    sizes = [4, 1, 7, 3, 5, 2]
    data = write_jsonl(tmp_path, sizes, BLOCK)
    pipe = dp.files(data.urls).shuffle().read_jsonl(block_size=BLOCK)
    for world_size in (2, 3):
        loaders = [
            dp.Loader(pipe, seed=3, rank=r, world_size=world_size) for r in range(world_size)
        ]
        epochs = []
        for _ in range(3):
            shares = [list(loader) for loader in loaders]
            assert multiset([r for s in shares for r in s]) == multiset(data.expected)
            epochs.append([_file_order(s) for s in shares])
        assert len({repr(e) for e in epochs}) > 1


# ----- resume with split files -----------------------------------------------------------------

RESUMABLE = ["lines", "jsonl", "jsonl.gz", "csv", "npy_rows", "tar", "parquet"]


def _roundtrip(state: Any) -> Any:
    return json.loads(json.dumps(state))


@pytest.mark.parametrize("reader", RESUMABLE)
def test_node_resume_mid_epoch_with_split_files(tmp_path: Path, reader: str):
    data = WRITERS[reader](tmp_path, [13, 8], block=23)
    pipe = data.read(dp.files(data.urls))
    for ctx in every_consumer(3, 1, epoch=1, seed=4):  # 2 files, 3 consumers: split
        reference = read_as(pipe, ctx)
        assert reference
        for stop in range(len(reference) + 1):
            node = pipe.build(ctx)
            node.reset(None)
            head = [next(node) for _ in range(stop)]
            state = _roundtrip(node.state_dict())
            node.close()
            resumed = pipe.build(ctx)
            resumed.reset(state)
            with no_hang():
                tail = list(resumed)
            assert multiset(head + tail) == multiset(reference)
            assert [canon(r) for r in head + tail] == [canon(r) for r in reference], (ctx, stop)


@pytest.mark.parametrize("reader", RESUMABLE)
def test_loader_resume_mid_epoch_with_split_files(tmp_path: Path, reader: str):
    data = WRITERS[reader](tmp_path, [31], block=19)
    pipe = data.read(dp.files(data.urls)).map(canon)
    for rank in range(2):
        reference = list(dp.Loader(pipe, seed=1, rank=rank, world_size=2))
        assert 0 < len(reference) < len(data.expected)
        for stop in sorted({0, 1, len(reference) // 3, len(reference) // 2, len(reference) - 1}):
            loader = dp.Loader(pipe, seed=1, rank=rank, world_size=2)
            it = iter(loader)
            head = [next(it) for _ in range(stop)]
            state = _roundtrip(loader.state_dict())
            fresh = dp.Loader(pipe, seed=1, rank=rank, world_size=2)
            fresh.load_state_dict(state)
            with no_hang():
                tail = list(fresh)
            assert head + tail == reference, (rank, stop)
            # The next epoch follows as it would have.
            assert list(fresh) == list(dp.Loader(pipe, seed=1, rank=rank, world_size=2))


def test_resume_with_shuffled_files_across_an_epoch(tmp_path: Path):
    data = write_jsonl(tmp_path, [4, 9, 2, 6, 3], BLOCK)
    pipe = dp.files(data.urls).shuffle().read_jsonl(block_size=BLOCK)
    for rank in range(2):
        reference = dp.Loader(pipe, seed=9, rank=rank, world_size=2)
        epochs = [list(reference) for _ in range(2)]
        loader = dp.Loader(pipe, seed=9, rank=rank, world_size=2)
        first = list(loader)
        it = iter(loader)
        head = [next(it) for _ in range(len(epochs[1]) // 2)]
        state = _roundtrip(loader.state_dict())
        fresh = dp.Loader(pipe, seed=9, rank=rank, world_size=2)
        fresh.load_state_dict(state)
        assert [first, head + list(fresh)] == epochs


# ----- property: random layouts ----------------------------------------------------------------


def _write_random_lines(folder: Path, files: list[list[int]], trailing_newline: list[bool]):
    """Files of lines of the given lengths; returns (urls, expected lines)."""
    urls, expected = [], []
    for i, lengths in enumerate(files):
        lines = [f"{i}.{j}." + "z" * n for j, n in enumerate(lengths)]
        text = "\n".join(lines) + ("\n" if lines and trailing_newline[i] else "")
        path = folder / f"p-{i:02d}.txt"
        path.write_text(text)
        urls.append(str(path))
        expected += lines
    return urls, expected


def _check_random_layout(
    folder: Path,
    files: list[list[int]],
    newline: list[bool],
    world_size: int,
    num_workers: int,
    block: int,
    resume: tuple[int, float] | None = None,
) -> None:
    folder.mkdir(exist_ok=True)
    urls, expected = _write_random_lines(folder, files, newline)
    pipe = dp.files(urls, retries=0).read_lines(block_size=block)
    shares = [read_as(pipe, ctx) for ctx in every_consumer(world_size, num_workers)]
    assert Counter(line for share in shares for line in share) == Counter(expected)
    if resume is not None:  # one consumer, stopped part way, resumed from a json state
        which, fraction = resume
        ctx = list(every_consumer(world_size, num_workers))[which % len(shares)]
        reference = shares[which % len(shares)]
        node = pipe.build(ctx)
        node.reset(None)
        head = [next(node) for _ in range(int(fraction * len(reference)))]
        state = _roundtrip(node.state_dict())
        node.close()
        resumed = pipe.build(ctx)
        resumed.reset(state)
        assert head + list(resumed) == reference


_layout_settings = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_layout_settings
@given(
    files=st.lists(st.lists(st.integers(0, 40), max_size=12), min_size=1, max_size=5),
    newline=st.lists(st.booleans(), min_size=5, max_size=5),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 3),
    block=st.integers(1, 64),
    resume=st.tuples(st.integers(0, 8), st.floats(0, 1)),
)
@example(files=[[]], newline=[True] * 5, world_size=3, num_workers=3, block=8, resume=(0, 0.5))
def test_property_random_layouts(
    tmp_path_factory: pytest.TempPathFactory,
    files: list[list[int]],
    newline: list[bool],
    world_size: int,
    num_workers: int,
    block: int,
    resume: tuple[int, float],
):
    """Random line lengths (many longer than the block), empty and one-line files, consumers,
    block sizes, and a resume at a random point."""
    folder = tmp_path_factory.mktemp("layout")
    _check_random_layout(folder, files, newline, world_size, num_workers, block, resume)


def test_npy_rows_split_property_like_sweep(tmp_path: Path):
    """Row ranges: every (rows, consumers) pair up to 9x9 covers each row exactly once."""
    for rows in range(10):
        np.save(tmp_path / f"r{rows}.npy", np.arange(rows * 2, dtype=np.int16).reshape(rows, 2))
    for rows in range(10):
        pipe = dp.files(str(tmp_path / f"r{rows}.npy")).read_npy()
        expected = np.arange(rows * 2, dtype=np.int16).reshape(rows, 2).tolist()
        for world_size, num_workers in TOPOLOGIES:
            got = [row.tolist() for row in union_of_consumers(pipe, world_size, num_workers)]
            assert sorted(got) == expected, (rows, world_size, num_workers)
