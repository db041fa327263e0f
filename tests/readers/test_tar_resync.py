"""Damage inside a tar shard followed by valid headers: found, raised or resynchronised.

Zeroed or garbled bytes in the middle of a shard are never read as its end:
``on_error="raise"`` names the file and the byte offset; ``on_error="skip"``
scans on to the next header whose checksum verifies, reads on from there,
counts the damaged range, and counts as bad records the samples next to it
that lost a field. Intact neighbours are delivered, delivered + lost adds up,
and a resume at any position continues exactly.
"""

from __future__ import annotations

import json
import warnings
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from test_damaged_shards import expected, losses, samples, write_tar

import datapipes as dp

N = 12  # samples in a shard; each has a .txt (2 data blocks) and a .cls (1 data block)


def _shard(tmp_path: Path) -> tuple[bytearray, list[Any]]:
    full = tmp_path / "full.tar"
    members = write_tar(full, samples(N))
    return bytearray(full.read_bytes()), members


def _write(tmp_path: Path, data: bytes | bytearray, name: str = "damaged.tar") -> Path:
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def _run(path: Path, **kwargs: Any) -> tuple[list[Any], dp.Loader, dp.DataPipe[Any]]:
    pipe = dp.files(str(path)).read_tar(on_error="skip", **kwargs)
    loader = dp.Loader(pipe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        items = list(loader)
    return items, loader, pipe


def _keys(items: list[Any]) -> list[str]:
    return [item["__key__"] for item in items]


def _all_but(*lost: int) -> list[str]:
    return [f"s{j:03d}" for j in range(N) if j not in lost]


def _raises_at(path: Path, offset: int) -> list[Any]:
    got: list[Any] = []
    with pytest.raises(dp.BadRecordError) as caught:
        for item in dp.Loader(dp.files(str(path)).read_tar()):
            got.append(item)
    assert str(path) in str(caught.value), caught.value
    assert f"byte offset {offset}" in str(caught.value), caught.value
    return got


def _assert_resumes_exactly(path: Path, block_samples: int | None = None) -> None:
    """A state taken after any item (blocks of 3 too) resumes to the same rest and losses."""
    from nodes import Context
    from nodes.readers import FileReaderNode, TarFormat
    from nodes.sources.files import FileSet

    def node() -> FileReaderNode:
        fmt = TarFormat(block_samples=block_samples or 64)
        return FileReaderNode(FileSet(str(path), {}), fmt, Context(), on_error="skip")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = node()
        reference.reset()
        items = [s["__key__"] for s in reference]
        final = reference.errors.tally()
        for stop in range(len(items) + 1):
            first = node()
            first.reset()
            assert [s["__key__"] for s in islice(first, stop)] == items[:stop]
            state = json.loads(json.dumps(first.state_dict()))
            fresh = node()
            fresh.reset(state)
            assert [s["__key__"] for s in fresh] == items[stop:], stop
            assert fresh.errors.tally() == final, stop


def test_two_zero_blocks_inserted_mid_shard_raise_and_resync(tmp_path: Path):
    data, members = _shard(tmp_path)
    at = members[12].offset  # s006.txt's header: a member boundary
    path = _write(tmp_path, data[:at] + bytes(1024) + data[at:])
    got = _raises_at(path, at)
    assert _keys(got) == _all_but(*range(5, N))  # s005 awaited its next header: not handed out
    assert "end-of-archive marker" in _message(path)
    items, loader, pipe = _run(path)
    assert items == expected(samples(N), str(path))  # nothing was lost: all 12 delivered
    assert loader.skipped() == {repr(pipe): 1}
    assert loader.losses() == {repr(pipe): losses(ranges=1, nbytes=1024)}
    _assert_resumes_exactly(path)
    _assert_resumes_exactly(path, block_samples=3)


def _loader(path: Path) -> dp.Loader:
    return dp.Loader(dp.files(str(path)).read_tar())


def _message(path: Path) -> str:
    with pytest.raises(dp.BadRecordError) as caught:
        list(_loader(path))
    return str(caught.value)


def test_two_zero_blocks_over_a_header_lose_that_sample_only(tmp_path: Path):
    data, members = _shard(tmp_path)
    at = members[12].offset  # s006.txt's header and its first data block
    data[at : at + 1024] = bytes(1024)
    path = _write(tmp_path, data)
    _raises_at(path, at)
    items, loader, pipe = _run(path)
    assert _keys(items) == _all_but(6)  # s006 kept only its .cls: a bad sample
    assert loader.skipped() == {repr(pipe): 2}
    assert loader.losses() == {repr(pipe): losses(records=1, ranges=1, nbytes=3 * 512)}
    assert len(items) + loader.losses()[repr(pipe)]["records"] == N
    _assert_resumes_exactly(path)
    _assert_resumes_exactly(path, block_samples=3)


def test_one_zeroed_header_keeps_the_intact_neighbours(tmp_path: Path):
    data, members = _shard(tmp_path)
    at = members[7].offset  # s003.cls's header: s003 lost its last field
    data[at : at + 512] = bytes(512)
    path = _write(tmp_path, data)
    _raises_at(path, at)
    items, loader, pipe = _run(path)
    assert _keys(items) == _all_but(3)  # s002 and s004 are intact and delivered
    assert loader.losses() == {repr(pipe): losses(records=1, ranges=1, nbytes=2 * 512)}
    _assert_resumes_exactly(path, block_samples=3)


def test_a_header_with_a_bad_checksum_is_resynchronised(tmp_path: Path):
    data, members = _shard(tmp_path)
    at = members[4].offset  # s002.txt's header
    data[at + 20] ^= 0x55
    path = _write(tmp_path, data)
    got = _raises_at(path, at)
    assert "checksum" in _message(path)
    assert _keys(got) == ["s000"]
    items, loader, pipe = _run(path)
    assert _keys(items) == _all_but(2)
    assert loader.losses() == {repr(pipe): losses(records=1, ranges=1, nbytes=3 * 512)}
    _assert_resumes_exactly(path, block_samples=3)


def test_garbage_between_members_loses_nothing_but_its_bytes(tmp_path: Path):
    data, members = _shard(tmp_path)
    at = members[10].offset  # before s005.txt's header
    garbage = bytes(range(256)) * 6  # three blocks that are no header
    path = _write(tmp_path, data[:at] + garbage + data[at:])
    _raises_at(path, at)
    items, loader, pipe = _run(path)
    assert items == expected(samples(N), str(path))
    assert loader.losses() == {repr(pipe): losses(ranges=1, nbytes=len(garbage))}
    _assert_resumes_exactly(path)


def test_a_cut_mid_member_loses_that_sample_only(tmp_path: Path):
    data, members = _shard(tmp_path)
    cut = members[8].offset_data + 100  # inside s004.txt's data
    path = _write(tmp_path, data[:cut])
    _raises_at(path, members[8].offset_data)
    items, loader, pipe = _run(path)
    assert _keys(items) == _all_but(*range(4, N))
    # s004 is a bad record; the later samples were never in the file: records is a lower bound.
    assert loader.losses() == {
        repr(pipe): losses(records=1, ranges=1, nbytes=cut - members[8].offset)
    }
    _assert_resumes_exactly(path, block_samples=3)


def test_a_cut_at_a_member_boundary_keeps_the_last_whole_sample(tmp_path: Path):
    data, members = _shard(tmp_path)
    cut = members[8].offset  # s004.txt's header: s003 is whole
    path = _write(tmp_path, data[:cut])
    _raises_at(path, cut)
    items, loader, pipe = _run(path)
    assert _keys(items) == _all_but(*range(4, N))
    assert loader.losses() == {repr(pipe): losses(ranges=1)}
    _assert_resumes_exactly(path, block_samples=3)


@pytest.mark.parametrize("extra", [0, 512, 20 * 512])
def test_trailing_zeros_after_the_end_stay_a_clean_end(tmp_path: Path, extra: int):
    data, _ = _shard(tmp_path)
    path = _write(tmp_path, data + bytes(extra))
    assert list(_loader(path)) == expected(samples(N), str(path))
    items, loader, pipe = _run(path)
    assert len(items) == N and loader.skipped() == {repr(pipe): 0}


def test_samples_split_among_consumers_after_a_resync(tmp_path: Path):
    """Every consumer resynchronises alike: the parts deal the samples without loss or repeat."""
    data, members = _shard(tmp_path)
    at = members[12].offset
    data[at : at + 1024] = bytes(1024)
    path = _write(tmp_path, data)
    pipe = dp.files(str(path)).read_tar(on_error="skip")
    got, lost = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rank in range(3):
            loader = dp.Loader(pipe, rank=rank, world_size=3)
            got += _keys(list(loader))
            lost += sum(n["records"] for n in loader.losses().values())
    assert sorted(got) == _all_but(6) and lost == 1
