"""No record exhausts memory: decompression bombs end in a clear error or a counted skip.

A line (after decompression) over ``max_record_bytes`` is a ``BadRecordError`` naming the
file and offset before it is held whole; under ``on_error="skip"`` it is skipped, counted,
and reading goes on at the next line. A ``*.gz`` field of a sample expands at most to
``nodes.errors.MAX_RECORD_BYTES``.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import pytest
import zstandard
from file_fixtures import tar_bytes

import datapipes as dp
from nodes.errors import BadRecordError

LIMIT = 4 << 20  # 4 MiB: a bomb of 64 MiB is 16 limits, from a file of ~64 KB


def records(ids: range) -> str:
    return "".join(json.dumps({"id": i}) + "\n" for i in ids)


def bomb_file(folder: Path, compression: str, line_bytes: int = 64 << 20) -> Path:
    """Five records, one line of ``line_bytes`` (compressing over 1,000 times), five more."""
    text = records(range(5)) + '{"pad": "' + "a" * line_bytes + '"}\n' + records(range(5, 10))
    data = text.encode()
    if compression == "gzip":
        path, packed = folder / "bomb.jsonl.gz", gzip.compress(data, 9)
    else:
        path, packed = folder / "bomb.jsonl.zst", zstandard.ZstdCompressor(level=19).compress(data)
    path.write_bytes(packed)
    assert len(data) > 1000 * len(packed)
    return path


@pytest.fixture(params=["gzip", "zstd"])
def bomb(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return bomb_file(tmp_path, request.param)


def read(path: Path, **options: Any) -> dp.DataPipe[Any]:
    return dp.files(str(path)).read_jsonl(max_record_bytes=LIMIT, **options)


def peak_bytes(action: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = action()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_bomb_is_an_error_naming_the_file_and_offset(bomb: Path):
    loader = dp.Loader(read(bomb))
    got: list[int] = []
    with pytest.raises(BadRecordError, match=r"bomb\.jsonl\.(gz|zst), line 6 \(byte offset 50\)"):
        _, peak = peak_bytes(lambda: got.extend(r["id"] for r in loader))
    assert got == [0, 1, 2, 3, 4]  # the records before it were delivered


def test_a_skipped_bomb_is_counted_and_the_next_record_read(bomb: Path):
    loader = dp.Loader(read(bomb, on_error="skip"))
    with pytest.warns(UserWarning, match="max_record_bytes=4,194,304"):
        ids, peak = peak_bytes(lambda: [r["id"] for r in loader])
    assert ids == list(range(10))
    assert list(loader.skipped().values()) == [1]
    assert peak < 2 * LIMIT, f"peak {peak:,} bytes for a limit of {LIMIT:,}"


def test_a_resume_past_a_skipped_bomb_is_exact(bomb: Path):
    loader = dp.Loader(read(bomb, on_error="skip"))
    stream = iter(loader)
    with pytest.warns(UserWarning):
        head = [next(stream)["id"] for _ in range(7)]
    state = loader.state_dict()
    resumed = dp.Loader(read(bomb, on_error="skip"))
    resumed.load_state_dict(state)
    assert head + [r["id"] for r in resumed] == list(range(10))
    assert list(resumed.skipped().values()) == [1]  # counted once, carried by the state


def test_a_record_just_below_the_limit_passes(tmp_path: Path):
    pad = LIMIT - len('{"pad": ""}\n') - 1
    path = tmp_path / "big.jsonl.gz"
    text = records(range(2)) + '{"pad": "' + "b" * pad + '"}\n' + records(range(2, 4))
    path.write_bytes(gzip.compress(text.encode()))
    got = list(dp.Loader(read(path)))
    assert [len(r.get("pad", "")) for r in got] == [0, 0, pad, 0, 0]


def test_no_limit_and_the_default_leave_the_recipe_as_it_was(tmp_path: Path):
    path = str(tmp_path / "*.jsonl")
    default = dp.files(path).read_jsonl()
    assert dp.files(path).read_jsonl(max_record_bytes=256 << 20).fingerprint() == (
        default.fingerprint()
    )
    assert repr(default) == f"dp.files({path!r}).read_jsonl()"
    assert "max_record_bytes=None" in repr(dp.files(path).read_jsonl(max_record_bytes=None))
    with pytest.raises(ValueError, match="max_record_bytes must be a positive number"):
        dp.files(path).read_jsonl(max_record_bytes=0)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_gz_field_that_expands_past_the_limit_is_a_bad_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
):
    from nodes import errors

    monkeypatch.setattr(errors, "MAX_RECORD_BYTES", LIMIT)  # read at each field, not imported
    big = gzip.compress(json.dumps({"pad": "c" * (64 << 20)}).encode(), 9)
    assert len(big) * 1000 < 64 << 20
    samples = [
        {"__key__": "s0", "json.gz": gzip.compress(b'{"i": 0}')},
        {"__key__": "s1", "json.gz": big},
        {"__key__": "s2", "json.gz": gzip.compress(b'{"i": 2}')},
    ]
    (tmp_path / "a.tar").write_bytes(tar_bytes(samples))
    pipe = dp.files(str(tmp_path / "a.tar")).read_tar()
    with pytest.raises(BadRecordError, match=r"s1.*json\.gz.*expands past 4,194,304 bytes"):
        list(dp.Loader(pipe.decode(), num_workers=workers))  # forked workers share the limit
    skipping = dp.Loader(pipe.decode(on_error="skip"), num_workers=workers)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")  # a worker warns in its own process
        kept, peak = peak_bytes(lambda: sorted(s["json.gz"]["i"] for s in skipping))
    assert kept == [0, 2] and list(skipping.skipped().values()) == [1]
    assert workers or any("expands past" in str(w.message) for w in warned)
    if not workers:  # the tar member (64 KB) and the limit's worth of output, no more
        assert peak < 2 * LIMIT + (1 << 20), f"peak {peak:,} bytes"


def _trace_memory(worker_id: int) -> None:
    tracemalloc.start()  # in each worker: what it allocates from its start on


def _with_peak(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "peak": tracemalloc.get_traced_memory()[1]}


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_two_workers_raise_or_skip_the_same_way_within_the_memory(tmp_path: Path, compression: str):
    path = bomb_file(tmp_path, compression)
    other = tmp_path / "other.jsonl"
    other.write_text(records(range(10, 20)))
    pipe = dp.files([str(path), str(other)]).read_jsonl(max_record_bytes=LIMIT, on_error="skip")
    loader = dp.Loader(pipe.map(_with_peak), num_workers=2, worker_init_fn=_trace_memory)
    got = list(loader)
    assert sorted(r["id"] for r in got) == list(range(20))
    assert list(loader.skipped().values()) == [1]
    peak = max(r["peak"] for r in got)
    assert LIMIT < peak < 2 * LIMIT, f"a worker's peak: {peak:,} bytes for a limit of {LIMIT:,}"
    raising = dp.files([str(path), str(other)]).read_jsonl(max_record_bytes=LIMIT)
    with pytest.raises(BadRecordError, match="max_record_bytes"):
        list(dp.Loader(raising, num_workers=2))


def test_an_npz_that_would_expand_past_the_limit_is_a_bad_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import numpy as np

    from nodes import errors

    monkeypatch.setattr(errors, "MAX_RECORD_BYTES", LIMIT)
    np.savez_compressed(tmp_path / "big.npz", a=np.zeros(64 << 20, dtype=np.uint8))
    np.savez_compressed(tmp_path / "small.npz", a=np.arange(3))
    assert (tmp_path / "big.npz").stat().st_size * 1000 < 64 << 20
    whole = dp.files(str(tmp_path / "*.npz")).read_npy(rows=False)
    with pytest.raises(BadRecordError, match=r"big\.npz.*would expand to 67,10\d,\d+ bytes"):
        list(dp.Loader(whole))
    skipping = dp.Loader(dp.files(str(tmp_path / "*.npz")).read_npy(rows=False, on_error="skip"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept, peak = peak_bytes(lambda: [r["a"].tolist() for r in skipping])
    assert kept == [[0, 1, 2]] and list(skipping.skipped().values()) == [1]
    assert peak < 2 * LIMIT, f"peak {peak:,} bytes"
    # the same file as a tar sample's npz field: a bad sample, decoded never
    samples = [{"__key__": "s0", "npz": (tmp_path / "big.npz").read_bytes()}]
    (tmp_path / "a.tar").write_bytes(tar_bytes(samples))
    fields = dp.files(str(tmp_path / "a.tar")).read_tar().decode(on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, peak = peak_bytes(lambda: list(dp.Loader(fields)))
    assert got == [] and peak < 2 * LIMIT


def test_a_parquet_row_group_of_rows_past_the_limit_is_lost_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from nodes import errors

    monkeypatch.setattr(errors, "MAX_RECORD_BYTES", LIMIT)
    table = pa.table({"id": [0, 1], "text": ["a" * (32 << 20), "b" * (32 << 20)]})
    pq.write_table(table, tmp_path / "big.parquet", compression="zstd", row_group_size=1)
    pq.write_table(pa.table({"id": [2, 3], "text": ["c", "d"]}), tmp_path / "small.parquet")
    assert (tmp_path / "big.parquet").stat().st_size * 1000 < 64 << 20
    pipe = dp.files(str(tmp_path / "*.parquet")).read_parquet()
    with pytest.raises(BadRecordError, match=r"big\.parquet, row group 0.*rows of over 4,194,304"):
        list(dp.Loader(pipe))
    skipping = dp.Loader(dp.files(str(tmp_path / "*.parquet")).read_parquet(on_error="skip"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids = [r["id"] for r in skipping]  # the big row groups are refused from the footer
    assert ids == [2, 3] and list(skipping.skipped().values()) == [2]  # unread: two groups


def test_a_pth_field_whose_archive_expands_past_the_limit_is_a_bad_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import io

    import torch

    from nodes import errors

    monkeypatch.setattr(errors, "MAX_RECORD_BYTES", LIMIT)
    big, small = io.BytesIO(), io.BytesIO()
    torch.save({"w": torch.zeros(2 << 20)}, big)  # 8 MiB of storage
    torch.save({"w": torch.arange(3)}, small)
    samples = [
        {"__key__": "s0", "pth": small.getvalue()},
        {"__key__": "s1", "pth": big.getvalue()},
    ]
    (tmp_path / "a.tar").write_bytes(tar_bytes(samples))
    pipe = dp.files(str(tmp_path / "a.tar")).read_tar()
    with pytest.raises(BadRecordError, match=r"s1.*pth.*the pth would expand to 8,\d+,\d+ bytes"):
        list(dp.Loader(pipe.decode()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = [s["pth"]["w"].tolist() for s in dp.Loader(pipe.decode(on_error="skip"))]
    assert kept == [[0, 1, 2]]


@pytest.mark.slow
def test_a_gz_field_bomb_in_a_worker_stays_within_the_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from nodes import errors

    monkeypatch.setattr(errors, "MAX_RECORD_BYTES", LIMIT)  # forked workers inherit it
    bomb = gzip.compress(json.dumps({"pad": "c" * (64 << 20)}).encode(), 9)
    small = [
        {"__key__": f"t{i:03d}", "json.gz": gzip.compress(b'{"i": %d}' % i)} for i in range(80)
    ]
    # the bomb first, so the worker that reads it reads small samples after it, whose
    # records carry that worker's peak
    (tmp_path / "a.tar").write_bytes(tar_bytes([{"__key__": "s0", "json.gz": bomb}, *small]))
    pipe = dp.files(str(tmp_path / "a.tar")).read_tar().decode(on_error="skip")
    loader = dp.Loader(pipe.map(_with_peak), num_workers=2, worker_init_fn=_trace_memory)
    got = list(loader)
    assert sorted(s["json.gz"]["i"] for s in got) == list(range(80))
    assert list(loader.skipped().values()) == [1]
    peak = max(s["peak"] for s in got)
    assert LIMIT < peak < 2 * LIMIT + (1 << 20), f"a worker's peak: {peak:,} bytes"


def test_a_zstd_bomb_after_a_normal_start_stays_within_the_memory(tmp_path: Path):
    """The decoder gets a few zstd blocks a call (128 KiB each at most), however far into
    the file the dense part starts: reads sized by the ratio seen so far would not hold."""
    import random

    rng = random.Random(3)
    normal = "".join(json.dumps({"id": i, "t": rng.random()}) + "\n" for i in range(5000))
    text = normal + '{"pad": "' + "z" * (64 << 20) + '"}\n' + records(range(5000, 5010))
    path = tmp_path / "late.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor(level=19).compress(text.encode()))
    loader = dp.Loader(read(path, on_error="skip"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids, peak = peak_bytes(lambda: [r["id"] for r in loader])
    assert ids == list(range(5010)) and list(loader.skipped().values()) == [1]
    assert peak < 2 * LIMIT, f"peak {peak:,} bytes for a limit of {LIMIT:,}"
