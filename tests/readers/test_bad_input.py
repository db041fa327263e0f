"""Bad input: errors that name where it happened, and on_error="skip" with exact counts.

Every case has a test for the error (``on_error="raise"``, the default) and
one for ``on_error="skip"``: the bad records are dropped, the good ones are
delivered, the skips are counted in ``Loader.skipped()`` under the step's
repr, the first one issues a ``dp.BadRecordWarning``, and the count
survives a checkpoint and resume exactly.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from http_server import serve
from PIL import Image

import datapipes as dp

# ----- data --------------------------------------------------------------------------------------


def write_jsonl_with_bad_lines(
    path: Path, n: int, bad: set[int]
) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    """``n`` lines, those in ``bad`` malformed; returns (good records, [(line number, offset)])."""
    good, bad_places, lines = [], [], []
    offset = 0
    for j in range(n):
        if j in bad:
            line = f'{{"j": {j}, "broken": '
            bad_places.append((j + 1, offset))
        else:
            record = {"j": j, "file": path.name, "pad": "p" * (j % 7)}
            good.append(record)
            line = json.dumps(record)
        lines.append(line + "\n")
        offset += len(line.encode()) + 1
    path.write_text("".join(lines))
    return good, bad_places


def write_csv_with_bad_rows(
    path: Path, n: int, bad: dict[int, int]
) -> tuple[list[dict[str, str]], list[int]]:
    """A 3-column CSV; row ``j`` in ``bad`` has ``bad[j]`` fields. -> (good rows, bad lines)."""
    header = ["id", "name", "value"]
    lines = [",".join(header)]
    good, bad_lines = [], []
    for j in range(n):
        if j in bad:
            fields = [f"x{j}"] * bad[j]
            bad_lines.append(len(lines) + 1)
        else:
            fields = [str(j), f"n{j}", str(j * j)]
            good.append(dict(zip(header, fields)))
        lines.append(",".join(fields))
    path.write_text("\n".join(lines) + "\n")
    return good, bad_lines


@dataclass
class Member:
    name: str
    offset: int  # header
    offset_data: int
    size: int


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> list[Member]:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        return [Member(m.name, m.offset, m.offset_data, m.size) for m in tar.getmembers()]


def tar_samples(n: int, size: int = 700) -> list[tuple[str, bytes]]:
    """Samples ``s000``... of two fields each; the .txt spans more than one 512-byte block."""
    members = []
    for j in range(n):
        members.append((f"s{j:03d}.txt", bytes([65 + j % 26]) * (size + j)))
        members.append((f"s{j:03d}.cls", str(j).encode()))
    return members


def samples_of(members: list[tuple[str, bytes]], url: str) -> list[dict[str, Any]]:
    samples: dict[str, dict[str, Any]] = {}
    for name, data in members:
        key, field = name.split(".", 1)
        samples.setdefault(key, {"__key__": key, "__url__": url})[field] = data
    return list(samples.values())


def png_bytes(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(buf, "PNG")
    return buf.getvalue()


def read_until_error(loader: dp.Loader) -> tuple[list[Any], BaseException]:
    """The items delivered before the loader raised, and the error."""
    got: list[Any] = []
    try:
        for item in loader:
            got.append(item)
    except Exception as error:  # noqa: BLE001 - each test checks the type
        return got, error
    raise AssertionError(f"no error; {len(got)} items")


def read_warned(pipe: dp.DataPipe[Any], match: str) -> tuple[list[Any], dp.Loader]:
    """One epoch that must warn ``match`` about its first skip: the items and the Loader."""
    with pytest.warns(dp.BadRecordWarning, match=match):
        loader = dp.Loader(pipe)
        items = list(loader)
    return items, loader


def read_skipping(pipe: dp.DataPipe[Any]) -> tuple[list[Any], dict[str, int], list[str]]:
    """Items, ``skipped()`` and the BadRecordWarning messages of one epoch."""
    loader = dp.Loader(pipe)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        items = list(loader)
    messages = [str(w.message) for w in caught if issubclass(w.category, dp.BadRecordWarning)]
    return items, loader.skipped(), messages


# ----- malformed JSON lines ------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1 << 16, 40])
def test_malformed_json_line_names_url_and_line_after_the_good_lines(
    tmp_path: Path, block_size: int
):
    path = tmp_path / "data.jsonl"
    good, bad = write_jsonl_with_bad_lines(path, 20, {13})
    ((line, offset),) = bad
    got, error = read_until_error(dp.Loader(dp.files(str(path)).read_jsonl(block_size=block_size)))
    assert isinstance(error, dp.BadRecordError)
    message = str(error)
    assert str(path) in message
    assert f"line {line}" in message and f"byte offset {offset}" in message, message
    assert got == good[:13]  # every good line before the bad one was delivered first


@pytest.mark.parametrize("block_size", [1 << 16, 40])
def test_malformed_json_lines_skipped_and_counted(tmp_path: Path, block_size: int):
    path = tmp_path / "data.jsonl"
    good, bad = write_jsonl_with_bad_lines(path, 30, {0, 7, 8, 29})
    pipe = dp.files(str(path)).read_jsonl(block_size=block_size, on_error="skip")
    items, loader = read_warned(pipe, re.escape(f"line {bad[0][0]}"))
    assert items == good
    assert loader.skipped() == {repr(pipe): len(bad)}


def test_only_the_first_skip_warns(tmp_path: Path):
    path = tmp_path / "data.jsonl"
    good, bad = write_jsonl_with_bad_lines(path, 12, {2, 5, 9})
    pipe = dp.files(str(path)).read_jsonl(on_error="skip")
    items, skipped, messages = read_skipping(pipe)
    assert items == good and skipped == {repr(pipe): 3}
    assert len(messages) == 1
    assert messages[0].startswith(repr(pipe)) and str(path) in messages[0]


# ----- CSV rows with the wrong number of fields ---------------------------------------------


@pytest.mark.parametrize("fields", [1, 2, 4])
def test_csv_row_with_wrong_field_count_names_url_and_line(tmp_path: Path, fields: int):
    path = tmp_path / "table.csv"
    good, bad_lines = write_csv_with_bad_rows(path, 10, {6: fields})
    got, error = read_until_error(dp.Loader(dp.files(str(path)).read_csv()))
    assert isinstance(error, dp.BadRecordError)
    assert str(path) in str(error) and f"line {bad_lines[0]}" in str(error), str(error)
    assert str(fields) in error.reason
    assert got == good[:6]


def test_csv_bad_rows_skipped_and_counted(tmp_path: Path):
    path = tmp_path / "table.csv"
    good, bad_lines = write_csv_with_bad_rows(path, 25, {0: 2, 11: 4, 12: 1, 24: 5})
    pipe = dp.files(str(path)).read_csv(block_size=50, on_error="skip")
    items, loader = read_warned(pipe, re.escape(str(path)))
    assert items == good
    assert loader.skipped() == {repr(pipe): len(bad_lines)}


# ----- broken tar archives ------------------------------------------------------------------


def test_truncated_tar_names_url_member_and_offset(tmp_path: Path):
    full = tmp_path / "full.tar"
    members = write_tar(full, tar_samples(6))
    victim = members[6]  # s003.txt: cut in the middle of its data
    cut = victim.offset_data + victim.size // 2
    path = tmp_path / "cut.tar"
    path.write_bytes(full.read_bytes()[:cut])
    got, error = read_until_error(dp.Loader(dp.files(str(path)).read_tar()))
    assert isinstance(error, dp.BadRecordError)
    message = str(error)
    assert str(path) in message and victim.name in message, message
    offsets = re.findall(r"byte offset (\d+)", message)
    assert offsets and int(offsets[0]) in (victim.offset, victim.offset_data), message
    assert "truncated" in message
    assert got == samples_of(tar_samples(6), str(path))[:3]


def test_truncated_tar_skipped_and_counted(tmp_path: Path):
    full = tmp_path / "full.tar"
    members = write_tar(full, tar_samples(6))
    cut = members[8].offset_data + 10  # inside s004.txt
    path = tmp_path / "cut.tar"
    path.write_bytes(full.read_bytes()[:cut])
    other = tmp_path / "zz-good.tar"
    write_tar(other, tar_samples(2))
    pipe = dp.files([str(path), str(other)]).read_tar(on_error="skip")
    items, loader = read_warned(pipe, "truncated")
    expected = samples_of(tar_samples(6), str(path))[:4] + samples_of(tar_samples(2), str(other))
    assert items == expected  # the truncated file ends early; the next file is read
    assert loader.skipped() == {repr(pipe): 1}


def _corrupt_header(tmp_path: Path) -> tuple[Path, Member, list[Member]]:
    full = tmp_path / "full.tar"
    members = write_tar(full, tar_samples(5))
    victim = members[6]  # the header of s003.txt
    data = bytearray(full.read_bytes())
    data[victim.offset + 20] ^= 0x55  # inside the name field: the checksum no longer matches
    path = tmp_path / "corrupt.tar"
    path.write_bytes(bytes(data))
    return path, victim, members


def test_corrupt_tar_header_names_url_offset_and_checksum(tmp_path: Path):
    path, victim, _ = _corrupt_header(tmp_path)
    got, error = read_until_error(dp.Loader(dp.files(str(path)).read_tar()))
    assert isinstance(error, dp.BadRecordError)
    message = str(error)
    assert str(path) in message and f"byte offset {victim.offset}" in message, message
    assert "checksum" in message
    expected = samples_of(tar_samples(5), str(path))
    assert got == expected[: len(got)] and len(got) <= 3  # good samples only, in order


def test_corrupt_tar_header_skipped_and_counted(tmp_path: Path):
    path, _, _ = _corrupt_header(tmp_path)
    other = tmp_path / "zz-good.tar"
    write_tar(other, tar_samples(3))
    pipe = dp.files([str(path), str(other)]).read_tar(on_error="skip")
    items, loader = read_warned(pipe, "checksum")
    first = samples_of(tar_samples(5), str(path))
    head = [s for s in items if s["__url__"] == str(path)]
    # The reader resynchronises on s003.cls: only s003, which lost its .txt, is lost (it was
    # every sample from s002 or s003 on before), then the good file in full.
    assert head == [s for s in first if s["__key__"] != "s003"]
    assert items[len(head) :] == samples_of(tar_samples(3), str(other))
    assert loader.skipped() == {repr(pipe): 2}  # the damaged range, and s003


# ----- an undecodable image in a tar ---------------------------------------------------------


def _image_tar(tmp_path: Path, bad_keys: set[str]) -> tuple[Path, list[str]]:
    members = []
    keys = [f"img{j:02d}" for j in range(6)]
    for j, key in enumerate(keys):
        image = b"\x89PNG but not really" if key in bad_keys else png_bytes((j * 40, 7, 200))
        members += [(f"{key}.png", image), (f"{key}.cls", str(j).encode())]
    path = tmp_path / "images.tar"
    write_tar(path, members)
    return path, keys


def test_undecodable_image_names_url_key_and_field(tmp_path: Path):
    path, keys = _image_tar(tmp_path, {"img03"})
    got, error = read_until_error(dp.Loader(dp.files(str(path)).read_tar().decode()))
    assert isinstance(error, dp.BadRecordError)
    message = str(error)
    assert str(path) in message and "'img03'" in message and "'png'" in message, message
    assert [s["__key__"] for s in got] == keys[:3]


def test_undecodable_images_skipped_and_counted(tmp_path: Path):
    path, keys = _image_tar(tmp_path, {"img01", "img04"})
    pipe = dp.files(str(path)).read_tar().decode(on_error="skip")
    items, loader = read_warned(pipe, "img01")
    assert [s["__key__"] for s in items] == [k for k in keys if k not in {"img01", "img04"}]
    assert all(tuple(s["png"].shape) == (3, 3, 4) for s in items)
    assert [s["cls"] for s in items] == [0, 2, 3, 5]
    assert loader.skipped() == {repr(pipe): 2}


def test_skips_of_reader_and_decoder_are_counted_per_step(tmp_path: Path):
    path, _ = _image_tar(tmp_path, {"img02"})
    data = path.read_bytes()
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-2]  # img05.png
    cut = tmp_path / "images-cut.tar"
    cut.write_bytes(data[: last.offset_data + 5])
    read = dp.files(str(cut)).read_tar(on_error="skip")
    pipe = read.decode(on_error="skip")
    items, skipped, messages = read_skipping(pipe)
    assert [s["__key__"] for s in items] == ["img00", "img01", "img03", "img04"]
    assert skipped == {repr(read): 1, repr(pipe): 1}
    assert len(messages) == 2  # one warning per step


# ----- missing files and empty globs ---------------------------------------------------------


def test_missing_file_in_a_list_is_file_not_found_naming_the_url(tmp_path: Path):
    first = tmp_path / "a.jsonl"
    good, _ = write_jsonl_with_bad_lines(first, 4, set())
    missing = str(tmp_path / "b-missing.jsonl")
    got, error = read_until_error(dp.Loader(dp.files([str(first), missing]).read_jsonl()))
    assert isinstance(error, FileNotFoundError)
    assert missing in str(error)
    assert got == good


@pytest.mark.parametrize(
    "read",
    [
        lambda f: f.read_jsonl(on_error="skip"),
        lambda f: f.read_lines(on_error="skip"),
        lambda f: f.read_bytes(on_error="skip"),
    ],
)
def test_missing_file_skipped_and_counted_once(tmp_path: Path, read: Callable[..., Any]):
    paths = [tmp_path / f"{name}.jsonl" for name in ("a", "c")]
    for path in paths:
        write_jsonl_with_bad_lines(path, 3, set())
    missing = str(tmp_path / "b-missing.jsonl")
    pipe = read(dp.files([str(paths[0]), missing, str(paths[1])]))
    reference = list(dp.Loader(read(dp.files([str(p) for p in paths]))))
    items, loader = read_warned(pipe, re.escape(missing))
    assert items == reference
    assert loader.skipped() == {repr(pipe): 1}


def test_missing_file_split_among_consumers_is_counted_by_each_part(tmp_path: Path):
    """One missing file, split among 2 ranks: each rank's part of it is missing."""
    missing = str(tmp_path / "missing.jsonl")
    pipe = dp.files([missing]).read_jsonl(on_error="skip")
    with pytest.raises(FileNotFoundError, match=re.escape(missing)):
        list(dp.Loader(dp.files([missing]).read_jsonl(), rank=1, world_size=2))
    for rank in range(2):
        with pytest.warns(dp.BadRecordWarning):
            loader = dp.Loader(pipe, rank=rank, world_size=2)
            assert list(loader) == []
        assert loader.skipped() == {repr(pipe): 1}


@pytest.mark.parametrize("pattern", ["nothing-*.jsonl", "shard-{0..3}-*.jsonl", "[xyz]*.txt"])
def test_glob_matching_nothing_names_the_pattern(tmp_path: Path, pattern: str):
    (tmp_path / "other.jsonl").write_text("{}\n")
    full = str(tmp_path / pattern)
    for pipe in (dp.files(full), dp.files(full).read_jsonl(), dp.files(full).read_bytes()):
        with pytest.raises(FileNotFoundError) as caught:
            list(dp.Loader(pipe))
        message = str(caught.value)
        assert str(tmp_path) in message
        assert "matched no files" in message


def test_glob_matching_nothing_over_http_names_the_pattern(tmp_path: Path):
    (tmp_path / "other.jsonl").write_text("{}\n")
    with serve(tmp_path) as srv:
        pattern = f"{srv.url}/none-*.jsonl"
        with pytest.raises(FileNotFoundError, match=re.escape(pattern)):
            list(dp.Loader(dp.files(pattern).read_jsonl()))


# ----- truncated .npy -----------------------------------------------------------------------


def _truncated_npy(tmp_path: Path, rows: int, cut_bytes: int) -> tuple[Path, np.ndarray, int]:
    array = np.arange(rows * 3, dtype=np.int64).reshape(rows, 3)
    full = tmp_path / "full.npy"
    np.save(full, array)
    data = full.read_bytes()
    header = len(data) - array.nbytes
    path = tmp_path / "cut.npy"
    path.write_bytes(data[:-cut_bytes])
    return path, array, header


def test_truncated_npy_names_url_row_and_offset(tmp_path: Path):
    path, array, header = _truncated_npy(tmp_path, rows=10, cut_bytes=30)
    row_bytes = array.itemsize * array.shape[1]
    first_bad = (array.nbytes - 30) // row_bytes  # the first row that is not complete
    with pytest.raises(dp.BadRecordError) as caught:
        list(dp.Loader(dp.files(str(path)).read_npy()))
    message = str(caught.value)
    assert str(path) in message
    assert f"row {first_bad}" in message
    assert f"byte offset {header + first_bad * row_bytes}" in message, message
    with pytest.raises(dp.BadRecordError, match=re.escape(str(path))):
        list(dp.Loader(dp.files(str(path)).read_npy(rows=False)))


def test_truncated_npy_skipped_and_counted(tmp_path: Path):
    path, _, _ = _truncated_npy(tmp_path, rows=10, cut_bytes=30)
    good = tmp_path / "zz-good.npy"
    np.save(good, np.full((4, 3), 7, dtype=np.int64))
    pipe = dp.files([str(path), str(good)]).read_npy(on_error="skip")
    items, loader = read_warned(pipe, re.escape(str(path)))
    assert [row.tolist() for row in items[-4:]] == [[7, 7, 7]] * 4  # the next file is read
    assert loader.skipped() == {repr(pipe): 1}


def test_truncated_npy_delivers_the_complete_rows(tmp_path: Path):
    path, array, _ = _truncated_npy(tmp_path, rows=10, cut_bytes=30)
    complete = (array.nbytes - 30) // (array.itemsize * array.shape[1])
    pipe = dp.files(str(path)).read_npy(on_error="skip")
    items, skipped, _ = read_skipping(pipe)
    assert [row.tolist() for row in items] == array[:complete].tolist()
    assert skipped == {repr(pipe): 1}


@pytest.mark.parametrize("rows", [True, False])
def test_npy_with_truncated_header_is_skipped(tmp_path: Path, rows: bool):
    path = tmp_path / "a-cut.npy"
    buf = io.BytesIO()
    np.save(buf, np.zeros((5, 2)))
    path.write_bytes(buf.getvalue()[:40])
    good = tmp_path / "b-good.npy"
    np.save(good, np.ones((2, 2)))
    pipe = dp.files([str(path), str(good)]).read_npy(rows=rows, on_error="skip")
    items, skipped, _ = read_skipping(pipe)
    assert len(items) == (2 if rows else 1)
    assert skipped == {repr(pipe): 1}


def test_npy_with_unknown_version_is_a_bad_record(tmp_path: Path):
    path = tmp_path / "odd.npy"
    buf = io.BytesIO()
    np.save(buf, np.zeros((5, 2)))
    data = bytearray(buf.getvalue())
    data[6] = 9  # major version 9
    path.write_bytes(bytes(data))
    with pytest.raises(dp.BadRecordError, match=re.escape(str(path))):
        list(dp.Loader(dp.files(str(path)).read_npy()))


# ----- skip counts survive checkpoints --------------------------------------------------------


def _scenario_jsonl(tmp_path: Path) -> tuple[dp.DataPipe[Any], list[Any], int]:
    expected, bad = [], 0
    for name, n, broken in [("a", 9, {0, 4}), ("b", 5, set()), ("c", 12, {3, 4, 11})]:
        good, places = write_jsonl_with_bad_lines(tmp_path / f"{name}.jsonl", n, broken)
        expected += good
        bad += len(places)
    pipe = dp.files(str(tmp_path / "*.jsonl")).read_jsonl(block_size=48, on_error="skip")
    return pipe, expected, bad


def _scenario_csv(tmp_path: Path) -> tuple[dp.DataPipe[Any], list[Any], int]:
    good, bad = write_csv_with_bad_rows(tmp_path / "t.csv", 20, {2: 1, 3: 5, 15: 2})
    return dp.files(str(tmp_path / "t.csv")).read_csv(block_size=30, on_error="skip"), good, 3


def _scenario_tar_and_decode(tmp_path: Path) -> tuple[dp.DataPipe[Any], list[Any], int]:
    path, keys = _image_tar(tmp_path, {"img00", "img03"})
    full = path.read_bytes()
    with tarfile.open(path) as tar:
        cut_at = tar.getmembers()[-1].offset_data  # img05.cls has lost its data
    cut = tmp_path / "a-cut.tar"
    cut.write_bytes(full[:cut_at])
    urls = [str(cut), str(path)]
    pipe = dp.files(urls).read_tar(on_error="skip").decode(on_error="skip").map(lambda s: s["cls"])
    expected = [1, 2, 4] + [1, 2, 4, 5]
    return pipe, expected, 1 + 2 + 2


def _scenario_missing(tmp_path: Path) -> tuple[dp.DataPipe[Any], list[Any], int]:
    expected, urls = [], []
    for name in ("a", "c", "e"):
        good, _ = write_jsonl_with_bad_lines(tmp_path / f"{name}.jsonl", 4, set())
        expected += good
        urls += [str(tmp_path / f"{name}.jsonl"), str(tmp_path / f"{name}-missing.jsonl")]
    return dp.files(urls).read_jsonl(on_error="skip"), expected, 3


SCENARIOS = {
    "jsonl": _scenario_jsonl,
    "csv": _scenario_csv,
    "tar_and_decode": _scenario_tar_and_decode,
    "missing_files": _scenario_missing,
}


def _total(skipped: dict[str, int]) -> int:
    return sum(skipped.values())


@pytest.mark.filterwarnings("ignore::nodes.errors.BadRecordWarning")
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_skip_counts_survive_checkpoint_and_resume(tmp_path: Path, scenario: str):
    pipe, expected, bad = SCENARIOS[scenario](tmp_path)
    reference = dp.Loader(pipe, seed=2)
    items, counts = [], []  # counts[k]: skipped() after item k
    for item in reference:
        items.append(item)
        counts.append(reference.skipped())
    final = reference.skipped()
    assert items == expected
    assert _total(final) == bad
    for stop in range(len(items) + 1):
        loader = dp.Loader(pipe, seed=2)
        it = iter(loader)
        head = [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(loader.state_dict()))
        fresh = dp.Loader(pipe, seed=2)
        fresh.load_state_dict(state)
        tail, tail_counts = [], []
        for item in fresh:
            tail.append(item)
            tail_counts.append(fresh.skipped())
        assert head + tail == items, stop
        assert tail_counts == counts[stop:], stop
        assert fresh.skipped() == final, stop
        # The next epoch counts from 0 again, and ends at the same count.
        assert list(fresh) == items and fresh.skipped() == final


@pytest.mark.filterwarnings("ignore::nodes.errors.BadRecordWarning")
def test_skip_counts_with_a_split_file_across_ranks_survive_resume(tmp_path: Path):
    path = tmp_path / "one.jsonl"
    good, bad = write_jsonl_with_bad_lines(path, 40, {1, 9, 10, 22, 30, 39})
    pipe = dp.files(str(path)).read_jsonl(block_size=64, on_error="skip")
    items, totals = [], 0
    for rank in range(2):
        reference = dp.Loader(pipe, rank=rank, world_size=2)
        mine = list(reference)
        items += mine
        totals += _total(reference.skipped())
        for stop in (1, len(mine) // 2, len(mine) - 1):
            loader = dp.Loader(pipe, rank=rank, world_size=2)
            it = iter(loader)
            head = [next(it) for _ in range(stop)]
            fresh = dp.Loader(pipe, rank=rank, world_size=2)
            fresh.load_state_dict(json.loads(json.dumps(loader.state_dict())))
            assert head + list(fresh) == mine
            assert fresh.skipped() == reference.skipped()
    assert sorted(items, key=lambda r: r["j"]) == good
    assert totals == len(bad)


# ----- archives broken from their first byte, corrupt pax headers ---------------------------


def _tar_bytes(fmt: int = tarfile.USTAR_FORMAT, name_prefix: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for j in range(3):
            info = tarfile.TarInfo(f"{name_prefix}s{j:03d}.txt")
            info.size = 5
            tar.addfile(info, io.BytesIO(b"hello"))
    return buf.getvalue()


def _corrupt_first_header() -> bytes:
    data = bytearray(_tar_bytes())
    data[148:156] = b"garbage!"  # the first header's checksum field
    return bytes(data)


def _corrupt_pax_length() -> bytes:
    data = _tar_bytes(tarfile.PAX_FORMAT, name_prefix="\u00fc" * 3)
    at = data.index(b" path=")
    start = data.rindex(b"\n", 512, at) + 1 if b"\n" in data[512:at] else 512
    return data[:start] + b"x" * (at - start) + data[at:]  # "NN path=..." -> "xx path=..."


@pytest.mark.parametrize(
    ("name", "content", "where", "after"),
    [
        # Under skip, the reader resynchronises on the next valid header: s001 and s002 are
        # intact; the member of a corrupt pax header (whose name is unknown) goes with it.
        ("corrupt-first.tar", _corrupt_first_header, "header at byte offset 0", ["s001", "s002"]),
        ("short.tar", lambda: _tar_bytes()[:300], "header at byte offset 0", []),
        (
            "not-a-tar.tar",
            lambda: b"plain text, not an archive\n" * 40,
            "header at byte offset 0",
            [],
        ),
        ("bad-pax.tar", _corrupt_pax_length, "pax header at byte offset 0", ["üüüs001", "üüüs002"]),
    ],
)
def test_a_broken_archive_is_a_bad_record_in_both_modes(
    tmp_path: Path, name, content, where, after
):
    path = tmp_path / name
    path.write_bytes(content())
    got, error = read_until_error(dp.Loader(dp.files(str(path)).read_tar()))
    assert got == [] and isinstance(error, dp.BadRecordError), repr(error)
    assert str(path) in str(error) and where in str(error)
    good = tmp_path / "zz-good.tar"
    good.write_bytes(_tar_bytes())
    pipe = dp.files([str(path), str(good)]).read_tar(on_error="skip")
    items, skipped, _ = read_skipping(pipe)
    assert [item["__key__"] for item in items] == [*after, "s000", "s001", "s002"]
    assert skipped == {repr(pipe): 1}


# ----- truncated and corrupt compressed files -------------------------------------------------


def _compressed_jsonl(codec: str, lines: int = 20_000) -> bytes:
    import bz2
    import gzip
    import lzma

    import zstandard

    raw = "".join(json.dumps({"i": i, "pad": "x" * 20}) + "\n" for i in range(lines)).encode()
    compress = {
        "gz": gzip.compress,
        "bz2": bz2.compress,
        "xz": lzma.compress,
        "zst": zstandard.ZstdCompressor().compress,
    }[codec]
    return compress(raw)


@pytest.mark.parametrize("codec", ["gz", "bz2", "xz", "zst"])
def test_a_truncated_compressed_file_is_never_read_as_complete(tmp_path: Path, codec: str):
    data = _compressed_jsonl(codec)
    path = tmp_path / f"a.jsonl.{codec}"
    path.write_bytes(data[: len(data) * 2 // 3])
    got, error = read_until_error(dp.Loader(dp.files(str(path)).read_jsonl()))
    assert isinstance(error, dp.BadRecordError), repr(error)
    assert str(path) in str(error) and "truncated" in str(error)
    assert len(got) < 20_000
    pipe = dp.files(str(path)).read_jsonl(on_error="skip")
    items, skipped, _ = read_skipping(pipe)
    assert len(items) < 20_000 and skipped == {repr(pipe): 1}


def test_a_corrupt_gzip_names_the_file(tmp_path: Path):
    data = bytearray(_compressed_jsonl("gz"))
    data[len(data) // 2] ^= 0xFF
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(bytes(data))
    _, error = read_until_error(dp.Loader(dp.files(str(path)).read_jsonl()))
    assert isinstance(error, dp.BadRecordError | OSError), repr(error)
    assert str(path) in str(error)


def test_a_tar_gz_with_a_bad_checksum_is_reported(tmp_path: Path):
    import gzip

    data = bytearray(gzip.compress(_tar_bytes()))
    data[-8] ^= 0xFF  # the CRC in the gzip trailer: the members themselves read fine
    path = tmp_path / "a.tar.gz"
    path.write_bytes(bytes(data))
    _, error = read_until_error(dp.Loader(dp.files(str(path)).read_tar()))
    assert isinstance(error, dp.BadRecordError) and str(path) in str(error)
    assert "CRC" in str(error)
    pipe = dp.files(str(path)).read_tar(on_error="skip")
    items, skipped, _ = read_skipping(pipe)
    assert len(items) == 3 and skipped == {repr(pipe): 1}  # the data came, the doubt is counted


# ----- transient errors over HTTP -------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path):
    good, _ = write_jsonl_with_bad_lines(tmp_path / "data.jsonl", 30, set())
    with serve(tmp_path) as srv:
        yield srv, f"{srv.url}/data.jsonl", good


def test_transient_http_errors_are_retried(served):
    srv, url, good = served
    srv.fail_next(2)
    before = srv.requests
    assert list(dp.Loader(dp.files(url).read_jsonl())) == good
    assert srv.failures_left == 0 and srv.requests - before > 2


@pytest.mark.parametrize("status", [500, 429])
def test_other_transient_statuses_are_retried(served, status: int):
    srv, url, good = served
    srv.fail_next(1, status=status)
    assert list(dp.Loader(dp.files(url).read_jsonl())) == good
    assert srv.failures_left == 0


def test_retries_give_up_naming_url_and_attempts(served):
    srv, url, _ = served
    srv.fail_next(100)
    with pytest.raises(OSError) as caught:
        list(dp.Loader(dp.files(url, retries=2).read_jsonl()))
    message = str(caught.value)
    assert url in message
    assert re.search(r"\b3 attempt", message), message  # 1 try + 2 retries
    assert "503" in message


def test_retries_exhausted_in_skip_mode_skip_the_file(served):
    srv, url, _ = served
    srv.fail_next(100)
    pipe = dp.files(url, retries=1).read_jsonl(on_error="skip")
    with pytest.warns(dp.BadRecordWarning, match=re.escape(url)):
        loader = dp.Loader(pipe)
        assert list(loader) == []
    assert loader.skipped() == {repr(pipe): 1}


def test_http_404_is_not_retried(served):
    srv, url, good = served
    missing = url.replace("data.jsonl", "missing.jsonl")
    before = srv.requests
    with pytest.raises(FileNotFoundError, match=re.escape(missing)):
        list(dp.Loader(dp.files(missing, retries=5).read_jsonl()))
    assert srv.requests - before <= 3  # one attempt (HEAD and GET at most), not 6
    pipe = dp.files([missing, url], retries=5).read_jsonl(on_error="skip")
    before = srv.requests
    with pytest.warns(dp.BadRecordWarning):
        loader = dp.Loader(pipe)
        assert list(loader) == good
    assert loader.skipped() == {repr(pipe): 1}


def test_http_403_is_access_denied_not_missing(served):
    srv, url, _ = served
    srv.fail_next(2, status=403)  # fsspec asks with HEAD, then with GET
    before = srv.requests
    with pytest.raises(PermissionError, match=re.escape(url) + ".*403"):
        list(dp.Loader(dp.files(url, retries=5).read_jsonl()))
    assert srv.requests - before <= 3  # a refusal is not retried


# ----- invalid on_error ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["ignore", "warn", "Skip", "", None])
def test_invalid_on_error_is_a_value_error(tmp_path: Path, value: Any):
    files = dp.files(str(tmp_path / "*.jsonl"))
    makers = [
        lambda: files.read_jsonl(on_error=value),
        lambda: files.read_lines(on_error=value),
        lambda: files.read_csv(on_error=value),
        lambda: files.read_npy(on_error=value),
        lambda: files.read_tar(on_error=value),
        lambda: files.read_bytes(on_error=value),
        lambda: files.read_tar().decode(on_error=value),
    ]
    for make in makers:
        with pytest.raises(ValueError, match="on_error"):
            make()  # refused when the recipe is written, before any file is listed
