"""Damaged shards, honest loss counts, a byte order mark and very long lines.

A damaged tar archive (cut at a member boundary, a zeroed header, a bad
checksum) is never read as complete: the damage is a ``BadRecordError``
naming the URL and offset, or under ``on_error="skip"`` a counted loss after
which the reader resynchronises on the next valid header (tests/
test_tar_resync.py has more). ``Loader.skipped()`` counts one skip per lost
file or range and per bad record; ``Loader.losses()`` says what they held:
records where the format knows (rows of a ``.npy``, a tar's samples that lost
a member), files, ranges and the bytes not read.
"""

from __future__ import annotations

import io
import json
import tarfile
import warnings
from itertools import islice
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

import datapipes as dp
from datapipes.resume.schema import node_digest
from nodes import Context
from nodes.errors import InvalidStateError
from nodes.readers import FileReaderNode, TarFormat
from nodes.sources.files import FileSet

# ----- helpers ----------------------------------------------------------------------------------


def write_tar(path: Path, members: list[tuple[str, bytes]], **options: Any) -> list[Any]:
    """A tar written by Python's tarfile; returns its members (with offsets)."""
    with tarfile.open(path, "w", **options) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(data)
            tar.addfile(info, None if data is None else io.BytesIO(data))
    with tarfile.open(path) as tar:
        return tar.getmembers()


def samples(n: int, prefix: str = "s") -> list[tuple[str, bytes]]:
    """``n`` samples of two fields each; the .txt spans two 512-byte blocks."""
    members = []
    for j in range(n):
        members.append((f"{prefix}{j:03d}.txt", bytes([65 + j % 26]) * (600 + j)))
        members.append((f"{prefix}{j:03d}.cls", str(j).encode()))
    return members


def expected(members: list[tuple[str, bytes]], url: str) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, data in members:
        if data is None:
            continue
        key, field = name.rsplit("/", 1)[-1].split(".", 1)
        key = name[: len(name) - len(field) - 1]
        out.setdefault(key, {"__key__": key, "__url__": url})[field] = data
    return list(out.values())


def run(pipe: dp.DataPipe[Any]) -> tuple[list[Any], dp.Loader, list[str]]:
    """One epoch: items, the Loader, and the BadRecordWarning messages."""
    loader = dp.Loader(pipe)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        items = list(loader)
    return items, loader, [str(w.message) for w in caught if w.category is dp.BadRecordWarning]


def error_of(pipe: dp.DataPipe[Any]) -> tuple[list[Any], BaseException]:
    got: list[Any] = []
    with pytest.raises(dp.BadRecordError) as caught:
        for item in dp.Loader(pipe):
            got.append(item)
    return got, caught.value


def losses(records: int = 0, files: int = 0, ranges: int = 0, nbytes: int = 0) -> dict[str, int]:
    return {"records": records, "files": files, "ranges": ranges, "bytes": nbytes}


def assert_resumes_exactly(pipe: dp.DataPipe[Any], plain: Any = lambda item: item) -> None:
    """From every position, a resumed Loader gives the rest, the skips and the losses."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = dp.Loader(pipe)
        items = [plain(item) for item in reference]
        final = (reference.skipped(), reference.losses())
        for stop in range(len(items) + 1):
            first = dp.Loader(pipe)
            it = iter(first)
            assert [plain(item) for item in islice(it, stop)] == items[:stop]
            state = json.loads(json.dumps(first.state_dict()))
            fresh = dp.Loader(pipe)
            fresh.load_state_dict(state)
            assert [plain(item) for item in fresh] == items[stop:], stop
            assert (fresh.skipped(), fresh.losses()) == final, stop


# ----- tar integrity ----------------------------------------------------------------------------


def _cut_at_member(tmp_path: Path) -> tuple[Path, int, int]:
    """A tar cut before s003's header; s002 is whole (it has the fields s001 has)."""
    full = tmp_path / "full.tar"
    members = write_tar(full, samples(6))
    cut = members[6].offset  # the header of s003.txt: a clean member boundary, no end marker
    path = tmp_path / "cut.tar"
    path.write_bytes(full.read_bytes()[:cut])
    return path, cut, members[4].offset


def test_a_tar_cut_at_a_member_boundary_is_an_error(tmp_path: Path):
    path, cut, _ = _cut_at_member(tmp_path)
    got, error = error_of(dp.files(str(path)).read_tar())
    assert got == expected(samples(6), str(path))[:2]
    message = str(error)
    assert str(path) in message and f"byte offset {cut}" in message, message
    assert "end-of-archive marker" in message


def test_a_tar_cut_at_a_member_boundary_is_a_counted_loss(tmp_path: Path):
    path, cut, s002 = _cut_at_member(tmp_path)
    pipe = dp.files(str(path)).read_tar(on_error="skip")
    items, loader, warned = run(pipe)
    # s002 was lost too before resynchronisation: its end cannot be told, but it has every
    # field s001 has, so it is delivered; what followed the cut is unknown.
    assert items == expected(samples(6), str(path))[:3]
    assert loader.skipped() == {repr(pipe): 1}
    assert loader.losses() == {repr(pipe): losses(ranges=1, nbytes=0)}
    assert len(warned) == 1
    assert "the rest of the file (records: unknown, 0 bytes)" in warned[0]


def test_a_lone_zero_block_at_the_end_is_a_truncated_marker(tmp_path: Path):
    full = tmp_path / "full.tar"
    members = write_tar(full, samples(2))
    end = members[-1].offset_data + 512  # the last member's one data block
    path = tmp_path / "lone.tar"
    path.write_bytes(full.read_bytes()[: end + 512])  # one zero block of the two
    got, error = error_of(dp.files(str(path)).read_tar())
    assert got == expected(samples(2), str(path))[:1]
    assert "ends inside the end-of-archive marker" in str(error)


def _zeroed_header(tmp_path: Path) -> tuple[Path, int]:
    """s003.txt's header zeroed: the reader resynchronises on s003.cls; s003 is a bad sample."""
    full = tmp_path / "full.tar"
    members = write_tar(full, samples(6))
    victim = members[6].offset  # the header of s003.txt
    data = bytearray(full.read_bytes())
    data[victim : victim + 512] = bytes(512)
    path = tmp_path / "zeroed.tar"
    path.write_bytes(bytes(data))
    return path, members[4].offset


def test_a_zeroed_header_is_an_error_naming_url_and_offset(tmp_path: Path):
    path, s002 = _zeroed_header(tmp_path)
    victim = s002 + 3 * 512  # s002.txt (header, 2 data blocks), s002.cls's header
    victim += 2 * 512  # s002.cls's data block
    got, error = error_of(dp.files(str(path)).read_tar())
    assert got == expected(samples(6), str(path))[:2]
    assert str(path) in str(error) and f"header at byte offset {victim}" in str(error)
    assert "zero block where a member header should be" in str(error)


def test_a_zeroed_header_is_a_counted_loss_and_resynchronised(tmp_path: Path):
    path, victim = _zeroed_header(tmp_path)
    other = tmp_path / "zz-good.tar"
    write_tar(other, samples(2, "g"))
    pipe = dp.files([str(path), str(other)]).read_tar(on_error="skip")
    items, loader, warned = run(pipe)
    # Before resynchronisation, everything from s002 on was lost (s002, s004 and s005 intact).
    kept = [s for s in expected(samples(6), str(path)) if s["__key__"] != "s003"]
    assert items == kept + expected(samples(2, "g"), str(other))
    lost_bytes = 3 * 512  # s003.txt's zeroed header and its two data blocks
    assert loader.skipped() == {repr(pipe): 2}  # the damaged range, and s003 (no .txt)
    assert loader.losses() == {repr(pipe): losses(records=1, ranges=1, nbytes=lost_bytes)}
    assert f"{lost_bytes:,} bytes" in warned[0] and "next valid tar header" in warned[0]


def test_a_bad_checksum_is_a_counted_loss_and_resynchronised(tmp_path: Path):
    full = tmp_path / "full.tar"
    members = write_tar(full, samples(5))
    data = bytearray(full.read_bytes())
    data[members[4].offset + 20] ^= 0x55  # s002.txt's name: the checksum fails
    path = tmp_path / "checksum.tar"
    path.write_bytes(bytes(data))
    got, error = error_of(dp.files(str(path)).read_tar())
    assert got == expected(samples(5), str(path))[:1]  # s001 went with it: its end is unknown
    assert f"byte offset {members[4].offset}" in str(error) and "checksum" in str(error)
    pipe = dp.files(str(path)).read_tar(on_error="skip")
    items, loader, _ = run(pipe)
    # Resynchronised on s002.cls: only s002 (no .txt) is lost; it was s001 on before.
    assert items == [s for s in expected(samples(5), str(path)) if s["__key__"] != "s002"]
    assert loader.losses() == {repr(pipe): losses(records=1, ranges=1, nbytes=3 * 512)}


def test_a_tar_that_is_no_tar_loses_the_whole_file(tmp_path: Path):
    path = tmp_path / "junk.tar"
    path.write_bytes(b"not a tar archive at all" * 100)
    pipe = dp.files(str(path)).read_tar(on_error="skip")
    items, loader, _ = run(pipe)
    assert items == []
    assert loader.losses() == {repr(pipe): losses(files=1, nbytes=path.stat().st_size)}


@pytest.mark.parametrize(
    "name", ["../../evil.txt", "/etc/evil.txt", "a/../../evil.txt", "C:/evil.txt"]
)
def test_unsafe_member_names_are_refused(tmp_path: Path, name: str):
    members = samples(2) + [(name, b"owned"), ("z.cls", b"9")]
    path = tmp_path / "unsafe.tar"
    write_tar(path, members)
    got, error = error_of(dp.files(str(path)).read_tar())
    assert got == expected(samples(2), str(path))
    assert repr(name) in str(error) and "'..'" in str(error)
    pipe = dp.files(str(path)).read_tar(on_error="skip")
    items, loader, _ = run(pipe)
    assert items == expected(samples(2), str(path)) + [
        {"__key__": "z", "__url__": str(path), "cls": b"9"}
    ]
    assert all(".." not in s["__key__"] and not s["__key__"].startswith("/") for s in items)
    assert loader.skipped() == {repr(pipe): 1}
    assert loader.losses() == {repr(pipe): losses(records=1)}


def _repeated_key(tmp_path: Path) -> tuple[Path, list[tuple[str, bytes]]]:
    members = [
        ("a.txt", b"a1"),
        ("b.txt", b"b1"),
        ("a.cls", b"again"),  # key "a" again, after "b"
        ("c.txt", b"c1"),
    ]
    path = tmp_path / "repeated.tar"
    write_tar(path, members)
    return path, members


def test_a_key_repeated_within_a_block_is_an_error(tmp_path: Path):
    path, _ = _repeated_key(tmp_path)
    got, error = error_of(dp.files(str(path)).read_tar())
    assert [s["__key__"] for s in got] == ["a", "b"]
    assert "'a.cls'" in str(error) and "appeared before" in str(error)


def test_a_key_repeated_within_a_block_is_skipped_and_resume_stays_exact(tmp_path: Path):
    path, _ = _repeated_key(tmp_path)
    pipe = dp.files(str(path)).read_tar(on_error="skip")
    items, loader, _ = run(pipe)
    assert [s["__key__"] for s in items] == ["a", "b", "c"]  # never two samples keyed "a"
    assert loader.skipped() == {repr(pipe): 1}
    assert loader.losses() == {repr(pipe): losses(records=1)}
    assert_resumes_exactly(pipe)  # a resume re-reads the block from its start: "a" is seen


def test_resume_across_a_skipped_damage_is_exact(tmp_path: Path):
    path, _ = _zeroed_header(tmp_path)
    other = tmp_path / "zz-good.tar"
    write_tar(other, samples(3, "g"))
    pipe = dp.files([str(path), str(other)]).read_tar(on_error="skip")
    assert_resumes_exactly(pipe)


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tarfile_archives_with_long_names_and_directories_read_exactly(tmp_path: Path, fmt):
    deep = "d" * 60 + "/" + "e" * 70
    members: list[tuple[str, Any]] = [("top", None), (deep, None)]
    for j in range(5):
        members += [(f"{deep}/sample-{j:02d}-" + "x" * 40 + ".txt", f"text {j}".encode())]
        members += [(f"{deep}/sample-{j:02d}-" + "x" * 40 + ".cls", str(j).encode())]
        members += [(f"top/s{j}.json", b"{}")]
    path = tmp_path / "long.tar"
    write_tar(path, members, format=fmt)
    pipe = dp.files(str(path)).read_tar()
    items = list(dp.Loader(pipe))
    assert items == expected(members, str(path))
    assert_resumes_exactly(pipe)
    # Split among two consumers, the samples are dealt without loss or repeat.
    parts = [dp.Loader(pipe, rank=r, world_size=2) for r in range(2)]
    got = [s for loader in parts for s in loader]
    assert sorted(got, key=lambda s: s["__key__"]) == sorted(items, key=lambda s: s["__key__"])


def test_a_moved_tar_cursor_is_an_invalid_state(tmp_path: Path):
    path = tmp_path / "good.tar"
    write_tar(path, samples(100))
    pipe = dp.files(str(path)).read_tar()
    loader = dp.Loader(pipe)
    it = iter(loader)
    list(islice(it, 70))  # into the second block of 64 samples
    state = loader.state_dict()
    node = json.loads(state["ranks"]["0"]["node"])  # the node states, as one JSON string
    offset, number = node["cursor"]
    node["cursor"] = [offset + 512, number]  # not where a sample starts
    state["ranks"]["0"]["node"] = json.dumps(node)
    state["ranks"]["0"]["digest"] = node_digest(state["ranks"]["0"]["node"])
    fresh = dp.Loader(pipe)
    with pytest.raises(dp.StateMismatchError, match="cursor"):
        fresh.load_state_dict(state)
        list(fresh)


def _tar_node(path: Path, block_samples: int = 64, on_error: str = "raise") -> FileReaderNode:
    fmt = TarFormat(block_samples=block_samples)
    return FileReaderNode(FileSet(str(path), {}), fmt, Context(), on_error=on_error)


def test_keys_are_remembered_per_block_and_resume_stays_exact(tmp_path: Path):
    """A repeat within a block is a bad sample; one in a later block is not seen (the limit)."""
    names = ["a", "b", "a", "c", "d", "c", "e"]  # blocks of 3: [a, b, (a), c] and [d, c, e]
    path = tmp_path / "keys.tar"
    write_tar(path, [(f"{name}.txt", f"{j}".encode()) for j, name in enumerate(names)])
    node = _tar_node(path, block_samples=3, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        node.reset()
        items = [(s["__key__"], s["txt"]) for s in node]
        assert items == [("a", b"0"), ("b", b"1"), ("c", b"3"), ("d", b"4"), ("c", b"5")] + [
            ("e", b"6")
        ]
        assert node.errors.count == 1
        for stop in range(len(items) + 1):  # a resume finds the same repeat, and only it
            first = _tar_node(path, block_samples=3, on_error="skip")
            first.reset()
            list(islice(first, stop))
            state = json.loads(json.dumps(first.state_dict()))
            fresh = _tar_node(path, block_samples=3, on_error="skip")
            fresh.reset(state)
            assert [(s["__key__"], s["txt"]) for s in fresh] == items[stop:], stop
            assert fresh.errors.count == 1, stop
    node = _tar_node(path)  # blocks of 64: the second "c" is seen too
    node.reset()
    with pytest.raises(dp.BadRecordError, match="'a.txt'"):
        list(node)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_a_resume_cursor_must_be_at_a_sample_start_header(tmp_path: Path, fmt: int):
    """The reader checks the header at the cursor (nothing before it): a sample's first header
    resumes; a data block, a directory, the end marker, or a bad offset is an invalid state."""
    deep = "p" * 90 + "/" + "q" * 50  # long names: a GNU long-name or pax header first
    members: list[tuple[str, Any]] = [("dir", None), (deep, None)]
    for j in range(4):
        members += [(f"{deep}/x{j}.txt", b"y" * (j + 1) * 300), (f"{deep}/x{j}.cls", b"1")]
        members += [(f"top{j}", b"no field")]
    path = tmp_path / "h.tar"
    tar_members = write_tar(path, members, format=fmt)
    size = path.stat().st_size
    starts = {m.offset: j for j, m in enumerate(m for m in tar_members if m.name.endswith("txt"))}
    # A valid header inside a sample (of its second member, or after a long-name header):
    # only the headers before it would tell that no sample starts there.
    fields = [m for m in tar_members if m.name.endswith((".txt", ".cls"))]
    inside = {o for m in fields for o in (m.offset, m.offset_data - 512)} - set(starts)
    node = _tar_node(path)
    node.reset()
    base = node.state_dict()
    refused = 0
    for offset in [*range(0, size + 1024, 512), 512 * 5 + 1]:
        if offset in inside:
            continue
        number = starts.get(offset, 3)
        node = _tar_node(path)
        node.reset({**base, "cursor": [offset, number]})
        if offset in starts:
            assert next(node)["__key__"] == f"{deep}/x{number}", offset
            continue
        with pytest.raises(InvalidStateError, match="cursor") as caught:
            next(node)
        assert str(path) in str(caught.value) and f"byte offset {offset}:" in str(caught.value)
        refused += 1
    assert refused >= 30  # data blocks, directories, files that are no field, the end, past it


PROTOCOL = "bytecountinglocal"
READ = {"bytes": 0, "calls": 0}  # what the counting filesystem's files returned


class _CountingFile(LocalFileOpener):
    def read(self, *args: Any, **kwargs: Any) -> bytes:
        data = super().read(*args, **kwargs)
        READ["bytes"] += len(data)
        READ["calls"] += 1
        return data


class _ByteCountingFileSystem(LocalFileSystem):
    """The local filesystem, counting the bytes its files return (and the read calls)."""

    protocol = (PROTOCOL,)

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        return super()._strip_protocol(str(path).removeprefix(f"{PROTOCOL}://"))

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        return _CountingFile(self._strip_protocol(path), mode, fs=self, **kwargs)


fsspec.register_implementation(PROTOCOL, _ByteCountingFileSystem, clobber=True)


def test_a_tar_resume_reads_one_block_not_the_headers_before_it(tmp_path: Path):
    """Resuming near the end of a 2,000-member tar reads about one block, as near its start."""
    path = tmp_path / "big.tar"
    write_tar(path, [m for j in range(1000) for m in samples(1, f"k{j:04d}-")])
    url = f"{PROTOCOL}://{path}"
    pipe = dp.files(url).read_tar()
    READ["bytes"] = 0
    assert len(list(dp.Loader(pipe))) == 1000
    assert READ["bytes"] >= path.stat().st_size - 2048  # the files' reads are all counted
    costs = []
    for position in (100, 900):
        loader = dp.Loader(pipe)
        list(islice(iter(loader), position))
        state = json.loads(json.dumps(loader.state_dict()))
        READ.update(bytes=0, calls=0)
        fresh = dp.Loader(pipe)
        fresh.load_state_dict(state)
        assert next(iter(fresh))["__key__"] == f"k{position:04d}-000"
        costs.append(dict(READ))
    block = 64 * (512 + 1024 + 512 + 512)  # 64 samples: two headers, a 2-block .txt, a .cls
    # Files are read ahead in 64 KiB requests. Walking the 1,800 headers before the cursor
    # read the whole 2.6 MB file in 38 requests.
    assert costs[1]["bytes"] <= block + 2 * 65536, costs
    assert costs[1]["bytes"] <= costs[0]["bytes"] + 1024, costs
    assert costs[1]["calls"] <= costs[0]["calls"] + 4, costs


# ----- what losses hold, and that they survive a resume ------------------------------------


def _truncated_npy(tmp_path: Path) -> tuple[Path, np.ndarray, int]:
    array = np.arange(100 * 4, dtype=np.float32).reshape(100, 4)
    full = tmp_path / "full.npy"
    np.save(full, array)
    data = full.read_bytes()
    header = len(data) - array.nbytes
    cut = header + 30 * 16 + 5  # 30 whole rows and 5 bytes of the next
    path = tmp_path / "cut.npy"
    path.write_bytes(data[:cut])
    return path, array, 5


def test_a_lost_npy_range_counts_its_rows(tmp_path: Path):
    path, array, partial = _truncated_npy(tmp_path)
    pipe = dp.files(str(path)).read_npy(on_error="skip")
    items, loader, warned = run(pipe)
    assert np.array_equal(np.stack(items), array[:30])
    assert loader.skipped() == {repr(pipe): 1}
    assert loader.losses() == {repr(pipe): losses(records=70, ranges=1, nbytes=partial)}
    assert "the rest of the file (70 records, 5 bytes)" in warned[0]


def test_a_missing_file_counts_a_lost_file(tmp_path: Path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"a": 1}\n')
    pipe = dp.files([str(tmp_path / "missing.jsonl"), str(good)]).read_jsonl(on_error="skip")
    items, loader, warned = run(pipe)
    assert items == [{"a": 1}]
    assert loader.skipped() == {repr(pipe): 1}
    assert loader.losses() == {repr(pipe): losses(files=1)}
    assert "skipping the whole file (records: unknown, bytes: unknown)" in warned[0]


def test_bad_records_count_as_records(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    pipe = dp.files(str(path)).read_jsonl(on_error="skip")
    items, loader, warned = run(pipe)
    assert items == [{"a": 1}, {"a": 3}]
    assert loader.losses() == {repr(pipe): losses(records=1)}
    assert "skipping a bad record" in warned[0]


def test_losses_survive_a_checkpoint_and_are_in_the_stats(tmp_path: Path):
    npy, _, partial = _truncated_npy(tmp_path)
    tar, victim = _zeroed_header(tmp_path)
    npy2, tar2 = tmp_path / "cut2.npy", tmp_path / "zeroed2.tar"
    npy2.write_bytes(npy.read_bytes())
    tar2.write_bytes(tar.read_bytes())
    pipe = dp.files([str(npy), str(npy2)]).read_npy(on_error="skip")
    assert_resumes_exactly(pipe, np.ndarray.tolist)
    tar_pipe = dp.files([str(tar), str(tar2)]).read_tar(on_error="skip")
    assert_resumes_exactly(tar_pipe)
    loader = dp.Loader(tar_pipe, stats=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        list(loader)
    lost = 2 * 3 * 512  # a zeroed header and its member's data in each, read past
    (step,) = loader.stats().steps[-1:]
    assert step.lost == losses(records=2, ranges=2, nbytes=lost)
    assert f"2 ranges of files, {lost:,} bytes known" in str(loader.stats())


@pytest.mark.parametrize(
    "lost",
    [[1, 0, 0], [-1, 0, 0, 0], [1, 1, 0, 0], "1", [1.5, 0, 0, 0], [True, 0, 0, 0]],
)
def test_corrupt_loss_counts_in_a_state_are_refused(tmp_path: Path, lost: Any):
    path, _, _ = _cut_at_member(tmp_path)  # one skip: the lost rest (s000 to s002 delivered)
    other = tmp_path / "zz-good.tar"
    write_tar(other, samples(2, "g"))
    pipe = dp.files([str(path), str(other)]).read_tar(on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = dp.Loader(pipe)
        list(islice(iter(loader), 4))  # into the good file, past the loss
    state = loader.state_dict()
    node = json.loads(state["ranks"]["0"]["node"])
    assert node["skipped"] == 1 and node["lost"][:2] == [0, 1]
    node["lost"] = lost
    state["ranks"]["0"]["node"] = json.dumps(node)
    state["ranks"]["0"]["digest"] = node_digest(state["ranks"]["0"]["node"])
    fresh = dp.Loader(pipe)
    with pytest.raises(InvalidStateError, match="lost"):
        fresh.load_state_dict(state)
        list(fresh)


@pytest.mark.slow
def test_losses_in_workers_reach_the_main_process(tmp_path: Path):
    paths, nbytes = [], 0
    for j in range(2):
        folder = tmp_path / f"d{j}"
        folder.mkdir()
        path, _ = _zeroed_header(folder)
        paths.append(path)
        nbytes += 3 * 512
    pipe = dp.files([str(p) for p in paths]).read_tar(on_error="skip")
    loader = dp.Loader(pipe, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        items = list(loader)
    assert len(items) == 10  # all but s003 of each file
    assert loader.skipped() == {repr(pipe): 4}
    assert loader.losses() == {repr(pipe): losses(records=2, ranges=2, nbytes=nbytes)}


# ----- a byte order mark, and a very long line ----------------------------------------------

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("bom", [True, False])
def test_a_bom_starts_no_record(tmp_path: Path, bom: bool):
    lead = BOM if bom else b""
    (tmp_path / "a.jsonl").write_bytes(lead + b'{"a": 1}\n{"a": 2}\n')
    (tmp_path / "a.csv").write_bytes(lead + b"id,name\n1,x\n2,y\n")
    (tmp_path / "a.txt").write_bytes(lead + b"first\nsecond\n")
    files = dp.files
    assert list(dp.Loader(files(str(tmp_path / "a.jsonl")).read_jsonl())) == [{"a": 1}, {"a": 2}]
    assert list(dp.Loader(files(str(tmp_path / "a.csv")).read_csv())) == [
        {"id": "1", "name": "x"},
        {"id": "2", "name": "y"},
    ]
    assert list(dp.Loader(files(str(tmp_path / "a.txt")).read_lines())) == ["first", "second"]


def test_a_bom_is_stripped_at_byte_0_only(tmp_path: Path):
    path = tmp_path / "a.txt"
    lines = [f"line {j}" for j in range(200)]
    lines[100] = "\ufeffinside"  # a BOM character inside the file is data
    path.write_bytes(BOM + "".join(line + "\n" for line in lines).encode())
    pipe = dp.files(str(path)).read_lines()
    assert list(dp.Loader(pipe)) == lines
    # Split into byte ranges among three consumers: only the first range starts at byte 0.
    got = [line for r in range(3) for line in dp.Loader(pipe, rank=r, world_size=3)]
    assert sorted(got) == sorted(lines)
    assert_resumes_exactly(pipe)


def test_a_bom_in_a_gzip_file_is_stripped(tmp_path: Path):
    import gzip

    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(BOM + b'{"a": 1}\n'))
    assert list(dp.Loader(dp.files(str(path)).read_jsonl())) == [{"a": 1}]


def test_a_5_mb_single_line_record_is_read(tmp_path: Path):
    record = {"words": ["w" * (j % 13) for j in range(600_000)], "end": True}
    line = json.dumps(record).encode()
    assert len(line) > 5_000_000
    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"before": 1}\n' + line + b'\n{"after": 2}\n')
    pipe = dp.files(str(path)).read_jsonl()
    assert list(dp.Loader(pipe)) == [{"before": 1}, record, {"after": 2}]
    loader = dp.Loader(pipe)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    fresh = dp.Loader(pipe)
    fresh.load_state_dict(state)
    assert list(fresh) == [record, {"after": 2}]


def test_a_long_line_is_scanned_once(tmp_path: Path):
    """Each read of a long record is searched for a line break once, never the whole buffer."""
    from nodes.readers.jsonl import JsonLinesFormat

    class Counting(JsonLinesFormat):
        scanned = 0

        def block_end(self, buf: bytes) -> int:
            Counting.scanned += len(buf)
            return super().block_end(buf)

    fmt = Counting(block_size=1024)
    data = b'"' + b"x" * 200_000 + b'"\n'
    f = io.BytesIO(data)
    chunk, leftover, _, dropped = fmt._next_chunk(f, b"", 0, float("inf"))
    assert chunk == data and leftover == b"" and dropped == 0
    assert Counting.scanned <= 2 * len(data)  # was about len(data) ** 2 / (2 * 1024)
