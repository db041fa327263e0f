"""read_parquet: rows and record batches of Parquet files through pyarrow, over local disk,
memory:// and a real HTTP server; column projection; positions [row group, row] with exact
resume that reads no earlier row group; splitting by row groups and row ranges (ranks,
workers, elastic resume, dynamic dispatch); Hugging Face image columns through decode();
hostile files (cut, zeroed footer, wrong magic, another schema, a footer claiming a 2 GB
row group, damaged pages), raised naming the file or skipped and counted."""

from __future__ import annotations

import gc
import io
import json
import re
import resource
import subprocess
import sys
import uuid
import warnings
from collections import Counter
from decimal import Decimal
from itertools import islice
from pathlib import Path
from typing import Any

import fsspec
import fsspec.asyn
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from file_fixtures import encode_image, image_array, write_file
from http_server import serve
from parquet_footer import (
    COLUMNS,
    COMPRESSED,
    FILE_ROWS,
    NUM_VALUES,
    ROWS,
    column_meta,
    edit_footer,
    get_field,
    read_struct,
    row_groups,
    set_field,
    write_struct,
)

import datapipes as dp
from nodes import Context
from nodes.errors import InvalidStateError
from nodes.media.decode import sniff_extension
from nodes.readers import FileReaderNode, ParquetFormat
from nodes.readers.parquet import part_ranges
from nodes.sources.files import FileSet
from nodes.testing import check_node

ROOT = Path(__file__).resolve().parents[2]

# ----- data -------------------------------------------------------------------------------------


def table(n: int, start: int = 0, seed: int = 0) -> pa.Table:
    """``n`` rows with ids ``start ..``: ints, floats, strings, bytes, lists, structs, nulls."""
    rng = np.random.default_rng(seed)
    ids = list(range(start, start + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "x": pa.array(rng.random(n), pa.float64()),
            "text": [None if i % 7 == 3 else f"row {i} " + "é" * (i % 4) for i in ids],
            "blob": [bytes([i % 256]) * (i % 5) for i in ids],
            "tags": [None if i % 11 == 5 else [f"t{j}" for j in range(i % 4)] for i in ids],
            "point": [
                None if i % 13 == 7 else {"a": i * 2, "b": None if i % 3 else [1.5, float(i)]}
                for i in ids
            ],
            "maybe": pa.array([None if i % 5 == 0 else i % 9 for i in ids], pa.int32()),
        }
    )


def parquet_bytes(t: pa.Table, row_group_size: int, **options: Any) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(t, buffer, row_group_size=row_group_size, **options)
    return buffer.getvalue()


def write_parquet(root: Any, name: str, t: pa.Table, row_group_size: int = 10) -> list[dict]:
    """Write ``t`` as ``root/name`` (any fsspec root); return its rows."""
    write_file(root, name, parquet_bytes(t, row_group_size))
    return t.to_pylist()


def two_files(root: Any, prefix: str = "p") -> tuple[str, list[dict]]:
    """A glob over two files (37 rows in groups of 10, 12 rows in groups of 5) and their rows."""
    rows = write_parquet(root, f"{prefix}-0.parquet", table(37), 10)
    rows += write_parquet(root, f"{prefix}-1.parquet", table(12, start=37, seed=1), 5)
    return f"{root}/{prefix}-*.parquet", rows


def run(pipe: dp.DataPipe, **loader_args: Any) -> list[Any]:
    return list(dp.Loader(pipe, **loader_args))


def ids(items: list[Any]) -> list[int]:
    return [
        i
        for item in items
        for i in (item.column("id").to_pylist() if hasattr(item, "column") else [item["id"]])
    ]


@pytest.fixture
def memory_root(request) -> str:
    folder = f"/datapipes-parquet/{uuid.uuid4().hex}"

    def remove() -> None:
        fs = fsspec.filesystem("memory")
        if fs.exists(folder):
            fs.rm(folder, recursive=True)

    request.addfinalizer(remove)
    return f"memory://{folder}"


@pytest.fixture(params=["local", "memory", "http", "http-no-ranges"])
def where(request, tmp_path) -> tuple[str, str]:
    """(root to write to, root readers read from); "http-no-ranges": a server that answers
    every GET with the whole file, as ``python -m http.server`` does (read as a stream)."""
    if request.param == "local":
        return str(tmp_path), str(tmp_path)
    if request.param == "memory":
        root = request.getfixturevalue("memory_root")
        return root, root
    name = "http_server" if request.param == "http" else "http_server_without_ranges"
    server = request.getfixturevalue(name)
    folder = uuid.uuid4().hex
    (server.root / folder).mkdir()
    return str(server.root / folder), f"{server.url}/{folder}"


# ----- records ----------------------------------------------------------------------------------


def test_round_trip_ints_strings_lists_structs_nulls(where):
    write_root, read_root = where
    _, expected = two_files(write_root)
    pipe = dp.files(f"{read_root}/p-*.parquet").read_parquet()
    assert run(pipe) == expected
    shares = [run(pipe, rank=r, world_size=5) for r in range(5)]  # split by row groups
    assert sum(shares, []) == expected


def test_rows_equal_to_pylist_for_other_types(tmp_path):
    t = pa.table(
        {
            "b": [True, None, False],
            "i8": pa.array([1, None, -3], pa.int8()),
            "u64": pa.array([2**64 - 1, 0, 7], pa.uint64()),
            "f32": pa.array([1.5, float("inf"), None], pa.float32()),
            "d": pa.array([0, 1, None], pa.date32()),
            "ts": pa.array([0, 10**9, None], pa.timestamp("ms")),
            "dec": pa.array([None, Decimal("1.25"), Decimal("-2.50")], pa.decimal128(10, 2)),
            "m": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
            "dict": pa.array(["a", "b", "a"]).dictionary_encode(),
            "ll": [[[1], [2, 3]], None, [[]]],
        }
    )
    write_parquet(tmp_path, "t.parquet", t, 2)
    assert (
        run(dp.files(str(tmp_path / "t.parquet")).read_parquet())
        == pq.read_table(tmp_path / "t.parquet").to_pylist()
    )


def test_blocks_of_nested_rows_are_small_and_the_collector_stays_on(tmp_path):
    write_parquet(tmp_path, "t.parquet", table(3000), 3000)
    loader = dp.Loader(dp.files(str(tmp_path / "t.parquet")).read_parquet())
    it = iter(loader)
    next(it)
    node = json.loads(loader.state_dict()["ranks"]["0"]["node"])
    assert (node["cursor"], node["index"]) == (None, 1)
    for _ in range(1024):
        next(it)
    node = json.loads(loader.state_dict()["ranks"]["0"]["node"])
    assert (node["cursor"], node["index"]) == ([0, 1024], 1)  # blocks of 1,024 rows
    assert gc.isenabled()  # paused while a block is converted only
    rows = run(dp.files(str(tmp_path / "t.parquet")).read_parquet(columns=["id", "text"]))
    assert rows == table(3000).select(["id", "text"]).to_pylist()
    assert gc.isenabled()


def test_projection(tmp_path):
    pattern, expected = two_files(tmp_path)
    got = run(dp.files(pattern).read_parquet(columns=["text", "id"]))
    assert got == [{"text": r["text"], "id": r["id"]} for r in expected]
    assert list(got[0]) == ["text", "id"]  # in the order asked for
    nested = run(dp.files(pattern).read_parquet(columns=["point.a"]))
    assert nested == [
        {"point": None if r["point"] is None else {"a": r["point"]["a"]}} for r in expected
    ]


def test_a_missing_column_names_the_file_and_the_column(tmp_path):
    pattern, _ = two_files(tmp_path)
    with pytest.raises(dp.BadRecordError, match=r"p-0\.parquet.*no column 'nope'"):
        run(dp.files(pattern).read_parquet(columns=["id", "nope"]))


def test_batches_mode_yields_record_batches_one_position_each(tmp_path):
    pattern, expected = two_files(tmp_path)
    pipe = dp.files(pattern).read_parquet(batches=True, batch_size=4)
    batches = run(pipe)
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    # blocks of 4 from each row group's start: 10 -> 4 4 2; 7 (the last group of 37) -> 4 3
    assert [b.num_rows for b in batches] == [4, 4, 2] * 3 + [4, 3] + [4, 1] * 2 + [2]
    assert pa.Table.from_batches(batches).to_pylist() == expected
    loader = dp.Loader(pipe)
    it = iter(loader)
    next(it), next(it)
    node = json.loads(loader.state_dict()["ranks"]["0"]["node"])
    assert (node["cursor"], node["index"]) in (([0, 4], 1), ([0, 8], 0))


def test_default_blocks_hold_about_8_mib(tmp_path):
    rng = np.random.default_rng(0)
    t = pa.table({"id": range(3000), "big": [rng.bytes(10_000) for _ in range(3000)]})  # 30 MB
    data = parquet_bytes(t, 3000, compression="none", use_dictionary=False)  # one row group
    write_file(tmp_path, "big.parquet", data)
    batches = run(dp.files(str(tmp_path / "big.parquet")).read_parquet(batches=True))
    assert 700 <= batches[0].num_rows <= 900, [b.num_rows for b in batches]
    assert sum(b.num_rows for b in batches) == 3000


def test_recipe_arguments_are_checked_when_the_recipe_is_made(tmp_path):
    files = dp.files(str(tmp_path / "*.parquet"))
    with pytest.raises(TypeError, match="list of column names"):
        files.read_parquet(columns="id")
    with pytest.raises(ValueError, match="batch_size"):
        files.read_parquet(batch_size=0)
    with pytest.raises(ValueError, match="on_error"):
        files.read_parquet(on_error="ignore")
    pipe = files.read_parquet(columns=("a", "b"), batches=True)
    assert "read_parquet(columns=['a', 'b'], batches=True)" in repr(pipe)
    assert pipe.fingerprint() == files.read_parquet(columns=["a", "b"], batches=True).fingerprint()
    assert pipe.fingerprint() != files.read_parquet(columns=["a"], batches=True).fingerprint()


def test_a_missing_pyarrow_is_an_import_error_naming_the_extra_at_build(tmp_path, monkeypatch):
    pattern, _ = two_files(tmp_path)
    pipe = dp.files(pattern).read_parquet()  # a recipe is made without pyarrow
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert "read_parquet" in repr(dp.files(pattern).read_parquet(columns=["id"]))
    with pytest.raises(ImportError, match=re.escape("datapipes-torch[parquet]")):
        pipe.build(Context())


@pytest.mark.slow  # a new Python process
def test_importing_datapipes_does_not_import_pyarrow():
    code = "import sys, datapipes, nodes.readers; print('pyarrow' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.stdout.strip() == "False", done.stderr[-2000:]


def test_a_compressed_parquet_file_is_refused_naming_it(tmp_path):
    write_file(tmp_path, "t.parquet.gz", parquet_bytes(table(5), 5), compression="gzip")
    with pytest.raises(dp.BadRecordError, match=r"t\.parquet\.gz.*compressed"):
        run(dp.files(str(tmp_path / "t.parquet.gz")).read_parquet())


# ----- positions and resume ---------------------------------------------------------------------


def _reader(pattern: str, **options: Any):
    def make(ctx: Context) -> FileReaderNode:
        return FileReaderNode(FileSet(pattern, {}), ParquetFormat(**options), ctx)

    return make


@pytest.mark.parametrize(
    "options", [{"batch_size": 3}, {}, {"batches": True, "batch_size": 4}, {"columns": ["tags"]}]
)
def test_check_node_resume_everywhere(tmp_path, options):
    pattern, expected = two_files(tmp_path)
    per_epoch = len(expected) if not options.get("batches") else 3 * 3 + 2 + 2 * 2 + 1
    report = check_node(_reader(pattern, **options), max_positions=60)
    assert report.items_per_epoch == [per_epoch, per_epoch]


@pytest.mark.parametrize("kind", ["memory", "http"])
def test_check_node_resume_remote(request, kind):
    if kind == "memory":
        root = read = request.getfixturevalue("memory_root")
    else:
        server = request.getfixturevalue("http_server")
        folder = uuid.uuid4().hex
        (server.root / folder).mkdir()
        root, read = str(server.root / folder), f"{server.url}/{folder}"
    _, expected = two_files(root)
    pipe = dp.files(f"{read}/p-*.parquet", block_size=4096).read_parquet(batch_size=4)
    report = check_node(lambda ctx: pipe.build(ctx), max_positions=12)
    assert report.items_per_epoch == [len(expected)] * 2


def test_loader_resume_mid_file_equals_the_uninterrupted_order(tmp_path):
    pattern, expected = two_files(tmp_path)
    pipe = dp.files(pattern).shuffle().read_parquet(batch_size=4).shuffle(buffer_size=5)
    reference = run(pipe, seed=3)
    assert sorted(r["id"] for r in reference) == [r["id"] for r in expected]
    for stop in (1, 6, 13, 30, 44):
        first = dp.Loader(pipe, seed=3)
        head = list(islice(iter(first), stop))
        state = json.loads(json.dumps(first.state_dict()))
        fresh = dp.Loader(pipe, seed=3)
        fresh.load_state_dict(state)
        assert head + list(fresh) == reference, stop


def test_the_position_is_a_row_group_and_a_row(tmp_path):
    pattern, _ = two_files(tmp_path)
    loader = dp.Loader(dp.files(pattern).read_parquet(batch_size=4))
    it = iter(loader)
    for _ in range(23):  # row group 2, rows 0-2 (its block [0, 4)) of the first file
        next(it)
    node = json.loads(loader.state_dict()["ranks"]["0"]["node"])
    assert (node["file"], node["cursor"], node["index"]) == (0, [2, 0], 3)


def test_resume_reads_no_earlier_row_group(tmp_path):
    """Row group 0's pages are damaged: a resume in row group 2 never meets them."""
    data = bytearray(parquet_bytes(table(30), 10, compression="none"))
    meta = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    first = meta.row_group(0).column(0)
    data[first.data_page_offset : first.data_page_offset + first.total_compressed_size] = bytes(
        first.total_compressed_size
    )
    write_file(tmp_path, "d.parquet", bytes(data))
    pipe = dp.files(str(tmp_path / "d.parquet")).read_parquet(batch_size=4)
    with pytest.raises(dp.BadRecordError, match=r"d\.parquet, row group 0"):
        run(pipe)
    state = {"unit": 0, "file": 0, "part": [0, 1], "cursor": [2, 4], "index": 1, "skipped": 0}
    node = pipe.build(Context())
    node.reset({**state, "listing": FileSet(str(tmp_path / "d.parquet"), {}).listing_state()})
    assert [r["id"] for r in node] == list(range(25, 30))


@pytest.mark.parametrize(
    ("cursor", "words"),
    [
        ([4, 0], "4 row groups"),  # the first file has row groups 0-3
        ([3, 7], "row group 3 has 7 rows"),
        ([0, -1], "two integers >= 0"),
        ("x", "two integers >= 0"),
        ([1], "two integers >= 0"),
    ],
)
def test_a_cursor_outside_the_file_is_refused_naming_the_path(tmp_path, cursor, words):
    pattern, _ = two_files(tmp_path)
    make = _reader(pattern, batch_size=4)
    node = make(Context())
    node.reset(None)
    next(node)
    state = {**node.state_dict(), "cursor": cursor}
    with pytest.raises(InvalidStateError, match=re.escape(words)) as caught:
        make(Context()).validate_state(state, "ranks.0.node")
    assert "ranks.0.node.cursor" in str(caught.value)


def test_a_cursor_outside_the_consumers_part_is_refused_at_resume(tmp_path):
    write_parquet(tmp_path, "one.parquet", table(40), 10)
    pipe = dp.files(str(tmp_path / "one.parquet")).read_parquet(batch_size=4)
    ctx = Context(rank=1, world_size=2)  # part 1 of 2: row groups 2 and 3
    node = pipe.build(ctx)
    node.reset(None)
    next(node)
    state = {**node.state_dict(), "cursor": [0, 4]}  # in the file, not in this part
    fresh = pipe.build(Context(rank=1, world_size=2))
    fresh.validate_state(state)  # the file has that row: the part is checked as it is read
    fresh.reset(state)
    with pytest.raises(InvalidStateError, match=r"row group 2 rows \[0, 10\)"):
        next(fresh)


# ----- splitting among consumers ----------------------------------------------------------------


def test_part_ranges_cover_every_row_once():
    for rows in ([10], [10, 10, 3], [5, 0, 7, 1], [3] * 9, []):
        for parts in range(1, 12):
            cover = Counter(
                (g, r)
                for part in range(parts)
                for g, a, b in part_ranges(rows, part, parts)
                for r in range(a, b)
            )
            assert cover == Counter((g, r) for g, n in enumerate(rows) for r in range(n))
            if len(rows) >= parts:  # whole row groups, never a piece of one
                assert all(
                    (a, b) == (0, rows[g])
                    for part in range(parts)
                    for g, a, b in part_ranges(rows, part, parts)
                )
            elif rows:  # each part reads one row group
                assert all(len(part_ranges(rows, p, parts)) == 1 for p in range(parts))


@pytest.mark.parametrize("world", [2, 3, 4, 5, 9])
def test_fewer_files_than_consumers_deliver_every_row_once(tmp_path, world):
    pattern, expected = two_files(tmp_path)  # 4 + 3 row groups
    pipe = dp.files(pattern).read_parquet(batch_size=3)
    shares = [run(pipe, rank=r, world_size=world) for r in range(world)]
    assert sorted(ids(sum(shares, []))) == [r["id"] for r in expected]
    assert all(shares)
    report = check_node(
        lambda ctx: pipe.build(ctx),
        context=lambda e: Context(rank=world - 1, world_size=world, epoch=e),
        max_positions=15,
    )
    assert report.items_per_epoch == [len(shares[-1])] * 2


@pytest.mark.slow  # DataLoader worker processes
def test_two_ranks_of_two_workers_read_every_row_once(tmp_path):
    write_parquet(tmp_path, "one.parquet", table(103), 10)  # one file, 11 row groups
    pipe = dp.files(str(tmp_path / "one.parquet")).read_parquet(batch_size=4)
    shares = [run(pipe, rank=r, world_size=2, num_workers=2) for r in range(2)]
    assert sorted(ids(sum(shares, []))) == list(range(103))
    assert all(shares)
    # and batches over 2 x 2 consumers: fewer row groups (3) than consumers, split by rows
    write_parquet(tmp_path, "small.parquet", table(30), 10)
    pipe = dp.files(str(tmp_path / "small.parquet")).read_parquet(batches=True)
    shares = [run(pipe, rank=r, world_size=2, num_workers=2) for r in range(2)]
    assert sorted(ids(sum(shares, []))) == list(range(30))


def test_elastic_resume_onto_another_world_size(tmp_path):
    write_parquet(tmp_path, "a.parquet", table(53), 10)
    write_parquet(tmp_path, "b.parquet", table(21, start=53), 4)
    pipe = dp.files(str(tmp_path / "*.parquet")).read_parquet(batch_size=3).shuffle(buffer_size=4)
    for before, counts, after in [(2, [7, 20], 3), (3, [5, 0, 11], 2), (1, [30], 5)]:
        group = [dp.Loader(pipe, seed=5, rank=r, world_size=before) for r in range(before)]
        taken = []
        for loader, count in zip(group, counts):
            taken += list(islice(iter(loader), count))
        merged = json.loads(json.dumps(dp.merge_states([g.state_dict() for g in group])))
        rest = []
        for r in range(after):
            loader = dp.Loader(pipe, seed=5, rank=r, world_size=after)
            loader.load_state_dict(merged)
            rest += list(loader)
        assert sorted(ids(taken + rest)) == list(range(74)), (before, after)


def test_dynamic_dispatch_over_row_groups(tmp_path):
    from dispatch_chains import run_chain

    write_parquet(tmp_path, "one.parquet", table(90), 10)  # one file of 9 row groups
    pipe = dp.files(str(tmp_path / "one.parquet")).read_parquet(batch_size=4)
    expected = list(range(90))
    run_chain(pipe, expected, [("dynamic", 2, None)])
    run_chain(pipe, expected, [("dynamic", 2, 0.3), ("dynamic", 3, 0.6), ("static", 2, None)])
    run_chain(pipe, expected, [("static", 3, 0.4), ("dynamic", 2, None)])


# ----- Hugging Face layout: an image column through decode() -------------------------------------


def _images(n: int) -> list[tuple[np.ndarray, bytes]]:
    arrays = [image_array(6, 5 + i % 3, 3, seed=i) for i in range(n)]
    return [(a, encode_image(a, "png")) for a in arrays]


def test_an_hf_image_column_is_read_and_decoded(tmp_path):
    datasets = pytest.importorskip("datasets")
    images = _images(7)
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for _, b in images], "label": list(range(7))}
    ).cast_column("image", datasets.Image())
    ds.to_parquet(str(tmp_path / "train-00000.parquet"))
    pipe = dp.files(str(tmp_path / "train-*.parquet")).read_parquet()
    raw = run(pipe)
    assert raw[0]["image"] == {"bytes": images[0][1], "path": None}
    decoded = run(pipe.decode(image="hwc"))
    for (array, _), row in zip(images, decoded):
        assert np.array_equal(row["image"].numpy(), array)
    assert [row["label"] for row in decoded] == list(range(7))
    chw = run(pipe.decode().batch(7, collate_fn=list))[0]
    assert chw[1]["image"].shape == (3, 6, 6)


def test_stored_files_decode_by_field_then_path_then_content(tmp_path):
    (a, png), (b, _) = _images(2)
    jpeg = encode_image(b, "jpeg")
    t = pa.table(
        {
            "img": [{"bytes": png, "path": "x/0001.png"}, {"bytes": jpeg, "path": None}],
            "doc": [{"bytes": b'{"k": 1}', "path": "a.json"}, {"bytes": b"[2]", "path": "b.json"}],
            "elsewhere": [{"bytes": None, "path": "s3://bucket/x.png"}] * 2,
            "odd": [{"bytes": png, "path": "p.dat"}, {"bytes": b"\0\1", "path": None}],
        }
    )
    write_parquet(tmp_path, "s.parquet", t)
    pipe = dp.files(str(tmp_path / "s.parquet")).read_parquet()
    rows = run(pipe.decode(image="hwc"))
    assert np.array_equal(rows[0]["img"].numpy(), a)  # by the path's extension
    assert rows[1]["img"].shape == (6, 6, 3)  # a JPEG without a path: by its first bytes
    assert [r["doc"] for r in rows] == [{"k": 1}, [2]]
    assert rows[0]["elsewhere"] == {"bytes": None, "path": "s3://bucket/x.png"}  # no bytes
    assert np.array_equal(rows[0]["odd"].numpy(), a)  # an unknown extension: by content
    assert rows[1]["odd"] == {"bytes": b"\0\1", "path": None}  # nothing known: left as is
    # the field's own decoder comes first; image=None leaves images as they are
    mine = run(pipe.decode(decoders={"img": len}))
    assert [r["img"] for r in mine] == [len(png), len(jpeg)]
    assert run(pipe.decode(image=None))[0]["img"] == {"bytes": png, "path": "x/0001.png"}


def test_a_bad_stored_image_is_a_bad_record_or_skipped(tmp_path):
    t = pa.table({"image": [{"bytes": b"\x89PNG\r\n\x1a\nbroken", "path": None}], "i": [1]})
    write_parquet(tmp_path, "b.parquet", t)
    pipe = dp.files(str(tmp_path / "b.parquet")).read_parquet()
    with pytest.raises(dp.BadRecordError, match="field 'image'"):
        run(pipe.decode())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = dp.Loader(pipe.decode(on_error="skip"))
        assert list(loader) == []
    assert sum(loader.skipped().values()) == 1


def test_a_random_resized_crop_of_a_stored_image_field(tmp_path):
    images = _images(3)
    t = pa.table({"image": [{"bytes": b, "path": None} for _, b in images]})
    write_parquet(tmp_path, "c.parquet", t)
    pipe = dp.files(str(tmp_path / "c.parquet")).read_parquet()
    out = run(pipe.decode().random_resized_crop(4, fields="image"))
    assert [tuple(r["image"].shape) for r in out] == [(3, 4, 4)] * 3


# ----- hostile files ----------------------------------------------------------------------------


def _good(tmp_path: Path, name: str = "z-good.parquet") -> list[dict]:
    return write_parquet(tmp_path, name, table(6, start=1000), 3)


def _hostile(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _footer_edit(edit) -> bytes:
    return edit_footer(parquet_bytes(table(20), 10), edit)


def _claims_2_gb_of_rows(meta) -> None:
    set_field(row_groups(meta)[0], ROWS, 2**31)
    set_field(meta, FILE_ROWS, 2**31 + 10)


def _claims_2_gb_of_bytes(meta) -> None:
    set_field(column_meta(row_groups(meta)[0], 0), COMPRESSED, 2**31)


def _claims_fewer_values(meta) -> None:
    set_field(column_meta(row_groups(meta)[1], 2), NUM_VALUES, 3)


def _zeroed_footer(data: bytes) -> bytes:
    length = int.from_bytes(data[-8:-4], "little")
    return data[: -8 - length] + bytes(length) + data[-8:]


FULL = parquet_bytes(table(20), 10)
WHOLE_FILE = {  # unreadable files: (bytes, what the error says)
    "cut": (FULL[: len(FULL) // 2], "magic bytes not found in footer"),
    "cut-3": (FULL[:-3], "magic bytes not found"),
    "zeroed-footer": (_zeroed_footer(FULL), "cannot read it"),
    "zeroed-length": (FULL[:-8] + bytes(4) + b"PAR1", "cannot read it"),
    "wrong-end-magic": (FULL[:-4] + b"PAR2", "magic bytes not found"),
    "wrong-start-magic": (b"PARX" + FULL[4:], "not a Parquet file: it starts with b'PARX'"),
    "huge-footer-length": (FULL[:-8] + (2**31 - 1).to_bytes(4, "little") + b"PAR1", "footer"),
    "empty": (b"", "not a Parquet file"),
    "not-parquet": (b'{"a": 1}\n' * 50, "not a Parquet file"),
}


def _refused_naming_it(tmp_path, case, data, words):
    """A hostile file ``data`` beside a good one: reading raises, naming the file and saying
    ``words``; then the rows of the good file, and the pipe that skips (``on_error="skip"``)."""
    path = _hostile(tmp_path, f"a-{case}.parquet", data)
    good = _good(tmp_path)
    with pytest.raises(dp.BadRecordError, match=re.escape(str(path))) as caught:
        run(dp.files(str(tmp_path / "*.parquet")).read_parquet())
    assert words in str(caught.value)
    return path, good, dp.files(str(tmp_path / "*.parquet")).read_parquet(on_error="skip")


@pytest.mark.parametrize("case", list(WHOLE_FILE))
def test_an_unreadable_file_names_it_or_is_skipped_whole(tmp_path, case):
    path, good, pipe = _refused_naming_it(tmp_path, case, *WHOLE_FILE[case])
    with pytest.warns(dp.BadRecordWarning, match=re.escape(str(path))):
        loader = dp.Loader(pipe)
        assert list(loader) == good
    assert loader.skipped() == {repr(pipe): 1}
    assert loader.losses() == {repr(pipe): {"records": 0, "files": 1, "ranges": 0, "bytes": 0}}


HOSTILE_GROUPS = {  # a footer whose row group 0 (or 1) cannot be true: (bytes, words, rows lost)
    "2-gb-of-rows": (_footer_edit(_claims_2_gb_of_rows), "claims 2,147,483,648 rows", 0),
    "2-gb-of-bytes": (_footer_edit(_claims_2_gb_of_bytes), "bytes [4, 2,147,483,652)", 10),
    "fewer-values": (_footer_edit(_claims_fewer_values), "holds 3 values", 0),
}


@pytest.mark.parametrize("case", list(HOSTILE_GROUPS))
def test_a_footer_claiming_an_impossible_row_group_is_refused_before_reading(tmp_path, case):
    data, words, lost = HOSTILE_GROUPS[case]
    _, good, pipe = _refused_naming_it(tmp_path, case, data, words)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = dp.Loader(pipe)
        got = list(loader)
    other = list(range(10, 20)) if case != "fewer-values" else list(range(10))
    assert ids(got) == other + [r["id"] for r in good]  # the other row group is read
    assert loader.skipped() == {repr(pipe): 1}
    assert loader.losses() == {repr(pipe): {"records": lost, "files": 0, "ranges": 1, "bytes": 0}}


def test_rows_a_row_group_does_not_hold_are_a_bad_record(tmp_path):
    """The footer claims 15 rows where the pages hold 10 (and values to match)."""

    def more_rows(meta) -> None:
        group = row_groups(meta)[0]
        set_field(group, ROWS, 15)
        for c in range(len(get_field(group, COLUMNS)[1])):
            column = column_meta(group, c)
            set_field(column, NUM_VALUES, max(15, get_field(column, NUM_VALUES)))

    path = _hostile(tmp_path, "a.parquet", _footer_edit(more_rows))
    with pytest.raises(dp.BadRecordError, match=r"row group 0, row 10: the data ends there"):
        run(dp.files(str(path)).read_parquet(batch_size=4))


def test_damaged_pages_lose_their_row_group_and_the_next_is_read(tmp_path):
    data = bytearray(parquet_bytes(table(30), 10))
    meta = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    column = meta.row_group(1).column(2)  # the text column of row group 1
    start = column.dictionary_page_offset or column.data_page_offset
    data[start + 2 : start + column.total_compressed_size] = bytes(column.total_compressed_size - 2)
    path = _hostile(tmp_path, "d.parquet", bytes(data))
    pipe = dp.files(str(path)).read_parquet(batch_size=4)
    with pytest.raises(dp.BadRecordError, match=r"d\.parquet, row group 1, rows from 0"):
        run(pipe)
    skipping = dp.files(str(path)).read_parquet(batch_size=4, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = dp.Loader(skipping)
        assert ids(list(loader)) == list(range(10)) + list(range(20, 30))
        assert loader.losses() == {
            repr(skipping): {"records": 10, "files": 0, "ranges": 1, "bytes": 0}
        }
        # exact resume from every position, the skips and losses included
        reference = ids(run(skipping))
        for stop in range(len(reference) + 1):
            first = dp.Loader(skipping)
            head = ids(list(islice(iter(first), stop)))
            fresh = dp.Loader(skipping)
            fresh.load_state_dict(json.loads(json.dumps(first.state_dict())))
            assert head + ids(list(fresh)) == reference, stop
            assert fresh.losses() == loader.losses(), stop


def test_a_page_claiming_2_gb_is_a_bad_record_and_is_not_allocated(tmp_path):
    """A data page header (not the footer) claiming 2 GB once decompressed."""
    data = parquet_bytes(pa.table({"a": list(range(1000))}), 1000, use_dictionary=False)
    start = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0).data_page_offset
    header, end = read_struct(data, start)
    set_field(header, 2, 2**31 - 1)  # PageHeader.uncompressed_page_size
    written = write_struct(header)
    grown = len(written) - (end - start)
    data = data[:start] + written + data[end:]

    def longer_chunk(meta) -> None:
        column = column_meta(row_groups(meta)[0], 0)
        set_field(column, COMPRESSED, get_field(column, COMPRESSED) + grown)

    path = _hostile(tmp_path, "page.parquet", edit_footer(data, longer_chunk))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(dp.BadRecordError, match=r"page\.parquet, row group 0.*2147483647"):
        run(dp.files(str(path)).read_parquet())
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024  # KiB


@pytest.mark.parametrize(
    ("head", "extension"),
    [
        (b"\xff\xd8\xff\xe0", "jpg"),
        (b"\x89PNG\r\n\x1a\n", "png"),
        (b"GIF89a", "gif"),
        (b"RIFF\0\0\0\0WEBPVP8 ", "webp"),
        (b"BM", "bmp"),
        (b"II*\0", "tiff"),
        (b"RIFF\0\0\0\0WAVEfmt ", "wav"),
        (b"fLaC", "flac"),
        (b"OggS", "ogg"),
        (b"RIFF\0\0\0\0AVI ", None),
        (b"", None),
    ],
)
def test_stored_files_are_recognised_by_their_first_bytes(head, extension):
    assert sniff_extension(head + b"\0" * 8) == extension


def test_a_schema_that_differs_from_the_first_files_names_both(tmp_path):
    first = write_parquet(tmp_path, "a.parquet", table(5), 5)
    other = table(4, start=5).set_column(0, "id", pa.array([5, 6, 7, 8], pa.int32()))
    write_parquet(tmp_path, "b.parquet", other, 5)
    renamed = table(3, start=9).rename_columns(
        ["ID", "x", "text", "blob", "tags", "point", "maybe"]
    )
    write_parquet(tmp_path, "c.parquet", renamed, 5)
    last = write_parquet(tmp_path, "d.parquet", table(2, start=12), 5)
    pattern = str(tmp_path / "*.parquet")
    with pytest.raises(dp.BadRecordError) as caught:
        run(dp.files(pattern).read_parquet())
    message = str(caught.value)
    assert str(tmp_path / "b.parquet") in message and str(tmp_path / "a.parquet") in message
    assert "column 'id' is int64 there, int32 here" in message
    # consumers that never read the first file compare with it too
    with pytest.raises(dp.BadRecordError, match=re.escape(str(tmp_path / "a.parquet"))):
        run(dp.files(pattern).read_parquet(), rank=1, world_size=4)
    pipe = dp.files(pattern).read_parquet(on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = dp.Loader(pipe)
        assert list(loader) == first + last
    assert loader.skipped() == {repr(pipe): 2}
    assert loader.losses() == {repr(pipe): {"records": 7, "files": 2, "ranges": 0, "bytes": 0}}
    # the columns read are compared, not the others
    assert (
        ids(run(dp.files(pattern).read_parquet(columns=["x"]).map(lambda r: {"id": 0}))) == [0] * 14
    )


def test_a_storage_failure_is_not_called_a_bad_file(tmp_path):
    pattern, _ = two_files(tmp_path)
    with serve(tmp_path) as server:
        pipe = dp.files(f"{server.url}/p-*.parquet", retries=0, retry_seconds=0).read_parquet()
        it = iter(dp.Loader(pipe))
        next(it)
        server.fail_next(1000, status=500)
        with pytest.raises(OSError) as caught:
            list(it)
        assert not isinstance(caught.value, dp.BadRecordError)


# ----- s3:// through s3fs against moto's server -------------------------------------------------


def test_s3_reads_only_the_row_groups_of_its_part(tmp_path):
    """Rank 1 of 2 asks for ranges from its first row group on (and the footer), nothing
    before: pyarrow reads the footer, then only the row groups it needs."""
    s3fs = pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from s3_server import KEY, REGION, SECRET, fault_proxy, moto_server

    rng = np.random.default_rng(0)
    t = pa.table({"id": range(80), "blob": [rng.bytes(4000) for _ in range(80)]})
    data = parquet_bytes(t, 10, compression="none", use_dictionary=False)  # 8 row groups
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    half = min(meta.row_group(4).column(j).data_page_offset for j in range(2))
    with moto_server() as endpoint, fault_proxy(endpoint) as proxy:
        client = {"endpoint_url": proxy.url, "region_name": REGION}
        options = {"key": KEY, "secret": SECRET, "client_kwargs": client}
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        fs.mkdir("parquet-bucket")
        fs.pipe("parquet-bucket/t.parquet", data)
        proxy.reset()
        files = dp.files("s3://parquet-bucket/*.parquet", block_size=1 << 14, **options)
        try:
            shares = [run(files.read_parquet(), rank=r, world_size=2) for r in range(2)]
            assert shares[0] + shares[1] == t.to_pylist()
            proxy.reset()
            assert run(files.read_parquet(columns=["id"]), rank=1, world_size=2) == [
                {"id": i} for i in range(40, 80)
            ]
            ranges = [r for _, method, path, _, r in proxy.log if method == "GET" and "t.p" in path]
            starts = [int(r.removeprefix("bytes=").split("-")[0]) for r in ranges]
            assert starts and min(starts) >= half, (half, len(data), ranges)
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
