"""File readers end to end: dp.files(...).read_*() over local files, fsspec memory:// and a real
HTTP server; .decode() of tar fields and images; exact resume at any position (mid-block,
mid-file, mid-tar, across files, inside compressed files); small reader states."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tarfile
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import fsspec
import fsspec.asyn
import numpy as np
import pytest
import torch
from file_fixtures import (
    csv_table,
    encode_image,
    image_array,
    jsonl_records,
    npy_bytes,
    random_array,
    smooth_image,
    tar_samples,
    text_lines,
    with_url,
    write_csv,
    write_file,
    write_jsonl,
    write_lines,
    write_npy,
    write_npz,
    write_tar,
)
from helpers import assert_same
from http_server import _Handler, serve

import datapipes as dp
from nodes import Context
from nodes.readers import FileReaderNode, NpyFormat, TarFormat
from nodes.readers.format import RecordFormat
from nodes.sources.files import FileSet
from nodes.storage import SourceFile
from nodes.testing import check_node, same

ROOT = Path(__file__).resolve().parents[2]
# "http-no-ranges": a server that answers Range requests with the whole file, as
# `python -m http.server` does; readers fall back to streaming from the start.
FILESYSTEMS = ["local", "memory", "http", "http-no-ranges"]


# ----- where the files live -----------------------------------------------------------------


@dataclass
class Where:
    """A folder of test files: ``root`` is where fixtures write, ``url(name)`` how readers see it.

    ``url(name)`` is also the URL a glob over this folder lists for the file (``__url__``).
    """

    kind: str
    root: str
    prefix: str

    def url(self, name: str) -> str:
        return f"{self.prefix}/{name}"


def _local(tmp_path: Path) -> Where:
    return Where("local", str(tmp_path), str(tmp_path))


@pytest.fixture
def local(tmp_path) -> Where:
    return _local(tmp_path)


@pytest.fixture(params=FILESYSTEMS)
def where(request, tmp_path) -> Where:
    return _local(tmp_path) if request.param == "local" else _remote(request, request.param)


def _remote(request, kind: str) -> Where:
    """A fresh folder on the memory filesystem (removed afterwards) or on the HTTP server."""
    if kind == "memory":
        folder = f"/datapipes-tests/{uuid.uuid4().hex}"

        def remove() -> None:
            fs = fsspec.filesystem("memory")
            if fs.exists(folder):
                fs.rm(folder, recursive=True)

        request.addfinalizer(remove)
        return Where("memory", f"memory://{folder}", f"memory://{folder}")
    server = request.getfixturevalue(
        "http_server" if kind == "http" else "http_server_without_ranges"
    )
    folder = uuid.uuid4().hex
    (server.root / folder).mkdir()
    return Where(kind, str(server.root / folder), f"{server.url}/{folder}")


def run(pipe: dp.DataPipe, **loader_args: Any) -> list[Any]:
    return list(dp.Loader(pipe, **loader_args))


# ----- every reader yields the right records in the right order -----------------------------


def test_read_bytes(where):
    png = encode_image(image_array(4, 5, 3, seed=1))
    contents = {
        "b-000.txt": (b"hello \xc3\xbc", "b-000", "txt", None),
        "b-001.seg.png": (png, "b-001", "seg.png", None),
        "b-002": (bytes(range(256)) * 3, "b-002", "bytes", None),
        "b-003.json.gz": (b'{"a": [1, 2]}', "b-003", "json", "gzip"),
        "b-004.bin": (b"", "b-004", "bin", None),
    }
    for name, (data, _, _, compression) in contents.items():
        write_file(where.root, name, data, compression)
    expected = [
        {"__url__": where.url(name), "__key__": key, field: data}
        for name, (data, key, field, _) in sorted(contents.items())
    ]
    assert_same(expected, run(dp.files(where.url("b-*")).read_bytes()))


@pytest.mark.parametrize("block_size", [1 << 20, 48])
def test_read_lines(where, block_size):
    expected = write_lines(where.root, "t-0.txt", text_lines(80, seed=1))
    expected += write_lines(
        where.root, "t-1.txt", text_lines(60, seed=2, long_every=9), newline="\r\n"
    )
    expected += write_lines(where.root, "t-2.txt", text_lines(30, seed=3), final_newline=False)
    got = run(dp.files(where.url("t-*.txt")).read_lines(block_size=block_size))
    assert got == expected


@pytest.mark.parametrize("block_size", [1 << 20, 256])
def test_read_jsonl(where, block_size):
    expected = write_jsonl(where.root, "j-0.jsonl", jsonl_records(70, seed=1), blank_every=9)
    expected += write_jsonl(where.root, "j-1.jsonl", jsonl_records(40, seed=2), crlf=True)
    expected += write_jsonl(where.root, "j-2.jsonl", jsonl_records(30, seed=3), ensure_ascii=True)
    got = run(dp.files(where.url("j-*.jsonl")).read_jsonl(block_size=block_size))
    assert got == expected


@pytest.mark.parametrize("block_size", [1 << 20, 96])
def test_read_csv(where, block_size):
    header, rows = csv_table(50, seed=1)
    expected = write_csv(where.root, "c-0.csv", header, rows)
    header2, rows2 = csv_table(30, seed=2)
    expected += write_csv(where.root, "c-1.csv", ["id", "name", "other", "more"], rows2)
    got = run(dp.files(where.url("c-*.csv")).read_csv(block_size=block_size))
    assert got == expected
    assert any("\n" in v for row in got for v in row.values())  # the data has quoted newlines
    assert any("," in v and '"' in k for row in got for k, v in row.items())


def test_read_csv_fmtparams(local):
    header, rows = csv_table(40, seed=5)
    expected = write_csv(local.root, "tabs.tsv", header, rows, delimiter="\t")
    assert run(dp.files(local.url("tabs.tsv")).read_csv(delimiter="\t")) == expected


def test_read_npy_rows(where):
    expected = write_npy(where.root, "n-0.npy", random_array((7, 3), np.float32, seed=1))
    expected += write_npy(where.root, "n-1.npy", random_array((5,), np.int64, seed=2))
    expected += write_npy(where.root, "n-2.npy", random_array((4, 2, 2), np.uint8, seed=3))
    expected += write_npy(where.root, "n-3.npy", random_array((3, 2), ">i4", seed=4))
    assert_same(expected, run(dp.files(where.url("n-*.npy")).read_npy()))


@pytest.mark.parametrize("compressed", [False, True], ids=["savez", "savez_compressed"])
def test_read_npz_rows(where, compressed):
    arrays = {"x": random_array((6, 3), np.float32, 1), "y": random_array((6,), np.int32, 2)}
    expected = write_npz(where.root, "z-0.npz", arrays, compressed=compressed)
    arrays = {"x": random_array((4, 3), np.float32, 3), "y": random_array((4,), np.int32, 4)}
    expected += write_npz(where.root, "z-1.npz", arrays, compressed=compressed)
    assert_same(expected, run(dp.files(where.url("z-*.npz")).read_npy()))


def test_npz_fields_are_the_member_names_whatever_their_characters(local):
    arrays = {"it's": np.arange(4), "back\\slash": np.arange(4) * 2, 'say "hi"': np.ones(4)}
    np.savez(Path(local.root, "odd.npz"), **arrays)
    rows = run(dp.files(local.url("odd.npz")).read_npy())
    assert sorted(rows[0]) == sorted(arrays)
    assert [row["it's"].item() for row in rows] == [0, 1, 2, 3]


def test_read_npy_whole_files(where):
    a = random_array((5, 3), np.float64, seed=1)
    b = {"img": random_array((2, 4, 4), np.uint8, seed=2), "label": np.arange(2)}
    c = np.array(3.5)  # 0-d: has no rows, but can be read whole
    write_npy(where.root, "w-0.npy", a)
    write_npz(where.root, "w-1.npz", b)
    write_file(where.root, "w-2.npy", npy_bytes(c))
    got = run(dp.files(where.url("w-*")).read_npy(rows=False))
    assert_same([a, b, c], got)


def test_read_tar(where):
    first = tar_samples(5, seed=1, prefix="v1.0/a/b/")
    first[1]["seg.png"] = encode_image(image_array(3, 4, 3, seed=9))
    extras = [
        (0, "v1.0/", b""),  # a directory
        (2, "v1.0/README", b"no extension: not a field"),
        (3, "v1.0/a/._hidden.txt", b"hidden: not a field"),
    ]
    write_tar(where.root, "shard-0.tar", first, extra_members=extras)
    second = tar_samples(4, seed=2, prefix="c/", start=5)
    write_tar(where.root, "shard-1.tar", second, format=tarfile.GNU_FORMAT)
    expected = with_url(first, where.url("shard-0.tar"))
    expected += with_url(second, where.url("shard-1.tar"))
    got = run(dp.files(where.url("shard-*.tar")).read_tar())
    assert_same(expected, got)
    assert got[1]["__key__"] == "v1.0/a/b/sample00001"
    assert set(got[1]) == {"__key__", "__url__", "cls", "json", "txt", "seg.npy", "seg.png"}


@pytest.mark.parametrize(
    "fmt",
    [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT],
    ids=["ustar", "gnu", "pax"],
)
def test_read_tar_long_names(where, fmt):
    samples = tar_samples(6, seed=3, long_names=True)
    if fmt != tarfile.USTAR_FORMAT:  # beyond ustar's name + prefix split: one 240-char name
        samples[2]["__key__"] = "x" * 240
        samples[4]["__key__"] = "ünïcödé/ключ/样本"
    assert all(len(s["__key__"]) > 100 for s in samples[:2])
    write_tar(where.root, "long.tar", samples, format=fmt)
    expected = with_url(samples, where.url("long.tar"))
    assert_same(expected, run(dp.files(where.url("long.tar")).read_tar()))


@pytest.mark.parametrize("compression,suffix", [("gzip", ".gz"), ("zstd", ".zst")])
def test_read_compressed_jsonl(where, compression, suffix):
    expected = write_jsonl(where.root, "d-0.jsonl", jsonl_records(30, seed=1))
    expected += write_jsonl(
        where.root, f"d-1.jsonl{suffix}", jsonl_records(200, seed=2), compression=compression
    )
    expected += write_jsonl(where.root, "d-2.jsonl", jsonl_records(20, seed=3))
    for block_size in (1 << 20, 256):
        got = run(dp.files(where.url("d-*")).read_jsonl(block_size=block_size))
        assert got == expected


def test_signed_http_urls_keep_their_query_out_of_globs_names_and_fingerprints(request):
    """Pre-signed URLs end in ``?signature``: not a glob, not part of the extension or repr."""
    served = _remote(request, "http")
    expected = write_jsonl(
        served.root, "signed.jsonl.gz", jsonl_records(40, seed=5), compression="gzip"
    )
    url = served.url("signed.jsonl.gz") + "?X-Amz-Signature=abc123&X-Amz-Expires=60"
    pipe = dp.files(url).read_jsonl()
    assert run(pipe) == expected  # read, and decompressed by the path's extension
    assert "abc123" not in repr(pipe) and "X-Amz-Signature=***&X-Amz-Expires=***" in repr(pipe)
    resigned = dp.files(url.replace("abc123", "def456")).read_jsonl()
    assert resigned.fingerprint() == pipe.fingerprint()
    loader = dp.Loader(pipe)
    stream = iter(loader)
    head = [next(stream) for _ in range(7)]
    later = dp.Loader(resigned)  # a resume after the URLs were signed again
    later.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert head + list(later) == expected


@pytest.mark.parametrize("compression", ["gzip", "zstd", "bz2", "xz"])
def test_read_compressed_other_formats(local, compression):
    suffix = {"gzip": "gz", "zstd": "zst", "bz2": "bz2", "xz": "xz"}[compression]
    lines = write_lines(local.root, f"l.txt.{suffix}", text_lines(50, 1), compression=compression)
    header, rows = csv_table(20, seed=2)
    table = write_csv(local.root, f"c.csv.{suffix}", header, rows, compression=compression)
    samples = write_tar(local.root, f"s.tar.{suffix}", tar_samples(5, 3), compression=compression)
    array = random_array((6, 2), np.int16, seed=4)
    write_file(local.root, f"a.npy.{suffix}", npy_bytes(array), compression)
    files = dp.files
    assert run(files(local.url(f"l.txt.{suffix}")).read_lines(block_size=64)) == lines
    assert run(files(local.url(f"c.csv.{suffix}")).read_csv(block_size=64)) == table
    assert_same(
        with_url(samples, local.url(f"s.tar.{suffix}")),
        run(files(local.url(f"s.tar.{suffix}")).read_tar()),
    )
    assert_same(list(array), run(files(local.url(f"a.npy.{suffix}")).read_npy()))


def test_listing_is_sorted_and_dealt_across_lists_and_braces(where):
    names = [f"p-{i:02d}.jsonl" for i in range(12)]
    by_name = {}
    for i, name in enumerate(names):
        by_name[name] = write_jsonl(where.root, name, jsonl_records(3, seed=i, start=10 * i))
    expected = [r for name in sorted(names) for r in by_name[name]]
    assert run(dp.files(where.url("p-*.jsonl")).read_jsonl()) == expected
    braces = dp.files(where.url("p-{00..11}.jsonl")).read_jsonl()
    assert run(braces) == expected
    listed = dp.files([where.url(n) for n in reversed(names)]).read_jsonl()
    assert run(listed) == expected


# ----- decode -------------------------------------------------------------------------------


@dataclass
class DecodeData:
    url: str
    samples: list[dict[str, Any]]  # bytes fields, as read_tar yields them
    arrays: list[dict[str, Any]]  # the source objects of each sample


def _decode_samples(root: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    samples, arrays = [], []
    for i, (h, w) in enumerate([(12, 16), (9, 7), (20, 31)]):
        rgb, gray = image_array(h, w, 3, seed=i), image_array(h, w, None, seed=10 + i)
        rgba, smooth = image_array(h, w, 4, seed=20 + i), smooth_image(h, w, seed=i)
        npy = random_array((2, 3), np.float32, seed=i)
        meta = {"i": i, "name": f"s{i}", "ü": [1, 2]}
        arrays.append(
            {"rgb": rgb, "gray": gray, "rgba": rgba, "smooth": smooth, "npy": npy, "json": meta}
        )
        samples.append(
            {
                "__key__": f"a/b/sample{i:03d}",
                "json": json.dumps(meta).encode(),
                "txt": f"caption ü {i}".encode(),
                "cls": f" {i + 3}\n".encode(),
                "npy": npy_bytes(npy),
                "png": encode_image(rgb, "png"),
                "seg.png": encode_image(gray, "png"),
                "rgba.png": encode_image(rgba, "png"),
                "jpg": encode_image(smooth, "jpeg", quality=95),
                "webp": encode_image(smooth, "webp", quality=95),
            }
        )
    write_tar(root, "images.tar", samples)
    return samples, arrays


@pytest.fixture
def decode_data(local) -> DecodeData:
    samples, arrays = _decode_samples(local.root)
    url = local.url("images.tar")
    return DecodeData(url, with_url(samples, url), arrays)


def chw(array: np.ndarray) -> torch.Tensor:
    tensor = torch.from_numpy(array if array.ndim == 3 else array[:, :, None])
    return tensor.permute(2, 0, 1).contiguous()


def assert_close_image(got: torch.Tensor, original: np.ndarray, layout: str = "chw") -> None:
    """A lossy image: right shape and dtype, and close to the original on average."""
    want = chw(original) if layout == "chw" else torch.from_numpy(original)
    assert got.dtype == torch.uint8 and got.shape == want.shape
    assert (got.float() - want.float()).abs().mean() < 6


def test_decode_defaults(decode_data):
    got = run(dp.files(decode_data.url).read_tar().decode())
    assert len(got) == len(decode_data.samples)
    for sample, raw, src in zip(got, decode_data.samples, decode_data.arrays):
        assert sample["__key__"] == raw["__key__"] and sample["__url__"] == raw["__url__"]
        assert sample["json"] == src["json"]
        assert sample["txt"] == raw["txt"].decode("utf-8")
        assert sample["cls"] == int(raw["cls"])
        assert same(sample["npy"], src["npy"])
        assert same(sample["png"], chw(src["rgb"]))  # lossless: exact pixels, CHW uint8
        # image_mode="RGB" by default: grayscale and RGBA become three channels
        assert same(sample["seg.png"], chw(np.repeat(src["gray"][:, :, None], 3, axis=2)))
        assert same(sample["rgba.png"], chw(src["rgba"][:, :, :3]))
        assert_close_image(sample["jpg"], src["smooth"])
        assert_close_image(sample["webp"], src["smooth"])


def test_decode_hwc(decode_data):
    got = run(dp.files(decode_data.url).read_tar().decode(image="hwc"))
    for sample, src in zip(got, decode_data.arrays):
        assert same(sample["png"], torch.from_numpy(src["rgb"]))
        assert_close_image(sample["jpg"], src["smooth"], "hwc")
        assert_close_image(sample["webp"], src["smooth"], "hwc")
    assert len(got) == len(decode_data.arrays)


@pytest.mark.parametrize("layout", ["chw", "hwc"])
def test_decode_image_mode_none_keeps_channels(decode_data, layout):
    got = run(dp.files(decode_data.url).read_tar().decode(image=layout, image_mode=None))
    for sample, src in zip(got, decode_data.arrays):
        gray, rgba = src["gray"][:, :, None], src["rgba"]
        if layout == "chw":
            gray, rgba = chw(gray), chw(rgba)
        else:
            gray, rgba = torch.from_numpy(gray), torch.from_numpy(rgba)
        assert same(sample["seg.png"], gray)  # one channel, exact
        assert same(sample["rgba.png"], rgba)  # four channels, exact
    assert len(got) == len(decode_data.arrays)


def test_decode_pil(decode_data):
    from PIL import Image

    got = run(dp.files(decode_data.url).read_tar().decode(image="pil"))
    for sample, src in zip(got, decode_data.arrays):
        assert isinstance(sample["png"], Image.Image) and sample["png"].mode == "RGB"
        assert np.array_equal(np.asarray(sample["png"]), src["rgb"])
        assert sample["jpg"].size == (src["smooth"].shape[1], src["smooth"].shape[0])
    gray = run(dp.files(decode_data.url).read_tar().decode(image="pil", image_mode=None))
    for sample, src in zip(gray, decode_data.arrays):
        assert sample["seg.png"].mode == "L"
        assert np.array_equal(np.asarray(sample["seg.png"]), src["gray"])
    assert len(got) == len(gray) == len(decode_data.arrays)


def test_decode_image_none_leaves_image_bytes(decode_data):
    got = run(dp.files(decode_data.url).read_tar().decode(image=None))
    for sample, raw, src in zip(got, decode_data.samples, decode_data.arrays):
        for field in ("png", "seg.png", "jpg", "webp"):
            assert sample[field] == raw[field]
        assert sample["json"] == src["json"]
    assert len(got) == len(decode_data.samples)


def test_decode_user_decoders_by_extension_and_field_name(decode_data):
    def seg(data: bytes) -> str:
        return f"seg:{len(data)}"

    def shout(data: bytes) -> str:
        return data.decode().upper()

    pipe = dp.files(decode_data.url).read_tar().decode(decoders={"seg.png": seg, "txt": shout})
    got = run(pipe)
    for sample, raw, src in zip(got, decode_data.samples, decode_data.arrays):
        assert sample["seg.png"] == f"seg:{len(raw['seg.png'])}"  # the full field name wins
        assert same(sample["png"], chw(src["rgb"]))  # other .png fields: built-in decoder
        assert same(sample["rgba.png"], chw(src["rgba"][:, :, :3]))
        assert sample["txt"] == raw["txt"].decode().upper()
        assert sample["cls"] == int(raw["cls"])
    assert len(got) == len(decode_data.samples)


def test_decode_none_turns_a_decoder_off(decode_data):
    got = run(dp.files(decode_data.url).read_tar().decode(decoders={"txt": None, "cls": None}))
    for sample, raw, src in zip(got, decode_data.samples, decode_data.arrays):
        assert sample["txt"] == raw["txt"] and isinstance(sample["txt"], bytes)
        assert sample["cls"] == raw["cls"]
        assert sample["json"] == src["json"]
        assert same(sample["png"], chw(src["rgb"]))
    assert len(got) == len(decode_data.samples)


def test_decode_loose_image_files(where):
    images = [image_array(5 + i, 8 - i, 3, seed=i) for i in range(3)]
    for i, image in enumerate(images):
        write_file(where.root, f"img-{i}.png", encode_image(image))
    got = run(dp.files(where.url("img-*.png")).read_bytes().decode(image="hwc"))
    assert [s["__key__"] for s in got] == [f"img-{i}" for i in range(3)]
    assert_same([torch.from_numpy(a) for a in images], [s["png"] for s in got])


# ----- exact resume at every position ----------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A reader over some files: ``write(root)`` writes them, returns (pattern, record count).

    ``fs_block_size`` is the filesystem's read block (``dp.files(block_size=...)``): small, so
    that reads cross fsspec's cache blocks, but not so small that HTTP needs thousands of
    requests for a tar (one per member header).
    """

    name: str
    write: Callable[[str], tuple[str, int]]
    read: Callable[[dp.FileList], dp.DataPipe]
    fs_block_size: int = 4096
    max_positions: int = 40  # resume points check_node tries per epoch (fewer for slow cases)


def _bytes_files(root):
    rng = np.random.default_rng(0)
    for i in range(7):
        write_file(root, f"f{i}.bin", rng.bytes(int(rng.integers(0, 400))))
    return "f*.bin", 7


def _lines_files(root):
    n = len(write_lines(root, "l-0.txt", text_lines(60, 1, long_every=9, long_length=100)))
    lines = text_lines(40, 2, long_every=5)
    n += len(write_lines(root, "l-1.txt", lines, newline="\r\n", final_newline=False))
    return "l-*.txt", n


def _jsonl_files(root):
    n = len(write_jsonl(root, "j-0.jsonl", jsonl_records(60, 1), blank_every=7))
    n += len(write_jsonl(root, "j-1.jsonl", jsonl_records(50, 2)))
    return "j-*.jsonl", n


def _csv_files(root):
    header, rows = csv_table(45, seed=1)
    n = len(write_csv(root, "c-0.csv", header, rows))
    header, rows = csv_table(30, seed=2)
    n += len(write_csv(root, "c-1.csv", header, rows))
    return "c-*.csv", n


def _npy_files(root):
    n = len(write_npy(root, "n-0.npy", random_array((40, 3), np.float32, 1)))
    n += len(write_npy(root, "n-1.npy", random_array((25,), np.int64, 2)))
    return "n-*.npy", n


def _npz_files(root):
    arrays = {"x": random_array((30, 2), np.float32, 1), "y": random_array((30,), np.int8, 2)}
    n = len(write_npz(root, "z-0.npz", arrays, compressed=True))
    n += len(write_npz(root, "z-1.npz", {"x": arrays["x"][:20], "y": arrays["y"][:20]}))
    return "z-*.npz", n


def _whole_files(root):
    for i in range(4):
        write_npy(root, f"w-{i}.npy", random_array((i + 1, 2), np.float32, i))
    write_npz(root, "w-4.npz", {"a": np.arange(3)})
    return "w-*", 5


def _tar_files(root):
    # more than one block of 64 samples
    n = len(write_tar(root, "s-0.tar", tar_samples(70, seed=1, fields=("cls", "txt"))))
    n += len(
        write_tar(root, "s-1.tar", tar_samples(9, seed=2, start=70), format=tarfile.GNU_FORMAT)
    )
    return "s-*.tar", n


def _compressed_files(root):
    n = len(write_jsonl(root, "g-0.jsonl.gz", jsonl_records(90, 1), compression="gzip"))
    n += len(write_jsonl(root, "g-1.jsonl.zst", jsonl_records(40, 2), compression="zstd"))
    return "g-*", n


def _tar_gz_files(root):
    samples = tar_samples(70, seed=3, fields=("json", "seg.npy"))
    n = len(write_tar(root, "t-0.tar.gz", samples, compression="gzip"))
    return "t-*.tar.gz", n


CASES = {
    c.name: c
    for c in [
        Case("bytes", _bytes_files, lambda f: f.read_bytes()),
        Case("lines", _lines_files, lambda f: f.read_lines(block_size=48)),
        Case("jsonl", _jsonl_files, lambda f: f.read_jsonl(block_size=256)),
        Case("csv", _csv_files, lambda f: f.read_csv(block_size=96)),
        Case("npy", _npy_files, lambda f: f.read_npy()),
        Case("npz", _npz_files, lambda f: f.read_npy()),
        Case("npy-whole", _whole_files, lambda f: f.read_npy(rows=False)),
        Case("tar", _tar_files, lambda f: f.read_tar(), 1 << 16, 20),
        Case("jsonl-gz-zst", _compressed_files, lambda f: f.read_jsonl(block_size=256)),
        Case("tar-gz", _tar_gz_files, lambda f: f.read_tar(), 1 << 16, 20),
    ]
}


def case_pipe(case: Case, where: Where) -> tuple[dp.DataPipe, int]:
    pattern, n = case.write(where.root)
    return case.read(dp.files(where.url(pattern), block_size=case.fs_block_size)), n


@pytest.mark.parametrize("name", list(CASES))
def test_check_node_resume_local(local, name):
    pipe, n = case_pipe(CASES[name], local)
    report = check_node(lambda ctx: pipe.build(ctx), max_positions=CASES[name].max_positions)
    assert report.items_per_epoch == [n, n]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # a tar without ranges is read from its start again at every checked position
        pytest.param(name, kind, marks=pytest.mark.slow)
        if (name, kind) == ("tar", "http-no-ranges")
        else (name, kind)
        for kind in ["memory", "http", "http-no-ranges"]
        for name in ["jsonl", "tar", "jsonl-gz-zst"]
    ],
)
def test_check_node_resume_remote(request, name, kind):
    where = _remote(request, kind)
    pipe, n = case_pipe(CASES[name], where)
    report = check_node(lambda ctx: pipe.build(ctx), max_positions=10)
    assert report.items_per_epoch == [n, n]


# ----- HTTP servers without Range support --------------------------------------------------
# (the "http-no-ranges" filesystem above runs every reader over one that ignores Range)


def test_a_server_that_announces_no_ranges_is_streamed_and_resumes_exactly(tmp_path):
    fsspec.asyn.get_loop()  # fsspec's shared event-loop thread is not a leak of the node
    records = jsonl_records(600, seed=5)
    write_jsonl(tmp_path, "a.jsonl", records[:400])
    write_jsonl(tmp_path, "b.jsonl", records[400:])
    with serve(tmp_path, announce_no_ranges=True) as server:
        pipe = dp.files(f"{server.url}/*.jsonl", block_size=4096).read_jsonl()
        assert run(pipe) == records
        report = check_node(lambda ctx: pipe.build(ctx), max_positions=12)
        assert report.items_per_epoch == [600, 600]
        assert server.range_requests == 0  # streamed from the start, never asked for a range


@pytest.mark.parametrize("cut_after", [100, 9000, 60_000])
def test_a_stream_cut_mid_file_is_retried_at_the_same_offset(tmp_path, cut_after):
    records = jsonl_records(500, seed=6)
    write_jsonl(tmp_path, "a.jsonl", records)
    with serve(tmp_path, ranges=False) as server:
        pipe = dp.files(f"{server.url}/a.jsonl", block_size=4096).read_jsonl()
        server.cut_next(2, after=cut_after)
        assert run(pipe) == records
        assert server.cuts_left == 0


class _NoSizeHandler(_Handler):
    """Sends no Content-Length (HTTP/1.0: the body ends when the connection closes)."""

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() != "content-length":
            super().send_header(keyword, value)


class _CountingHandler(_Handler):
    """Counts the GETs (each one a download of the file from its start on this server)."""

    def do_GET(self) -> None:  # noqa: N802
        with self.server_state._lock:
            self.server_state.gets = getattr(self.server_state, "gets", 0) + 1
        super().do_GET()


class _TricklingHandler(_Handler):
    """Sends the body in small pieces with pauses, so a client's reads find part of it."""

    def copyfile(self, source, outputfile) -> None:  # noqa: ANN001
        while piece := source.read(512):
            outputfile.write(piece)
            outputfile.flush()
            time.sleep(0.001)


def test_a_file_split_across_ranks_on_a_server_without_size_reads_every_record_once(tmp_path):
    """README: a server that gives no size is read as a stream and the records are the same."""
    records = jsonl_records(400, seed=1)
    write_jsonl(tmp_path, "a.jsonl", records)
    with serve(tmp_path, handler=_NoSizeHandler, ranges=False) as server:
        pipe = dp.files(f"{server.url}/a.jsonl").read_jsonl()
        assert list(dp.Loader(pipe)) == records  # one consumer: fine
        # one file, two consumers: split by byte ranges, which asks for the size
        parts = [list(dp.Loader(pipe, rank=r, world_size=2)) for r in range(2)]
    got = sorted(json.dumps(r, sort_keys=True) for part in parts for r in part)
    assert got == sorted(json.dumps(r, sort_keys=True) for r in records)


def test_an_npz_on_a_server_without_size_is_read_not_called_a_bad_archive(tmp_path):
    """A valid .npz on a server that sends no Content-Length reads (not 'not a .npz archive')."""
    rows = write_npz(tmp_path, "a.npz", {"x": np.arange(20).reshape(10, 2), "y": np.arange(10)})
    with serve(tmp_path, handler=_NoSizeHandler, ranges=False) as server:
        got = list(dp.Loader(dp.files(f"{server.url}/a.npz").read_npy()))
    assert len(got) == len(rows)
    assert all(np.array_equal(g["x"], w["x"]) and g["y"] == w["y"] for g, w in zip(got, rows))


def test_an_npz_read_by_rows_from_a_stream_is_downloaded_about_once_per_member(tmp_path):
    """ForwardOnlyFile's doc: an .npz is downloaded about once per member, not once per block."""
    n = 20_000
    write_npz(tmp_path, "a.npz", {"x": np.zeros((n, 8), np.float32), "y": np.arange(n)})
    with serve(tmp_path, handler=_CountingHandler, announce_no_ranges=True) as server:
        files = FileSet(f"{server.url}/a.npz", {})
        node = FileReaderNode(files, NpyFormat(block_bytes=1 << 14), Context())  # ~50 blocks
        node.reset(None)
        try:
            assert sum(1 for _ in node) == n
        finally:
            node.close()
        downloads = server.gets
    assert downloads <= 8, f"{downloads} downloads of a 2-member .npz"


def test_a_read_is_retried_when_reopening_the_file_fails_too(tmp_path):
    """retries=3 survives 3 failed requests even when one of them is the reopen itself."""
    records = jsonl_records(300, seed=2)
    write_jsonl(tmp_path, "a.jsonl", records)
    data = (tmp_path / "a.jsonl").read_bytes()
    with serve(tmp_path) as server:
        source = SourceFile(f"{server.url}/a.jsonl", {}, retries=3, block_size=4096)
        with source.open(0) as f:
            # the read's GET, then the reopen's HEAD and GET, answer 503
            server.fail_next(3)
            assert f.read(len(data) + 1) == data


def test_a_stream_is_positioned_after_a_cut_mid_seek(tmp_path):
    """Checked, holds: a resume deep into a no-range file, cut while skipping, is exact."""
    records = jsonl_records(600, seed=3)
    write_jsonl(tmp_path, "a.jsonl", records)
    data = (tmp_path / "a.jsonl").read_bytes()
    with serve(tmp_path, announce_no_ranges=True) as server:
        source = SourceFile(f"{server.url}/a.jsonl", {}, retries=3, block_size=4096)
        server.cut_next(1, after=5000)
        with source.open(len(data) // 2) as f:
            assert f.read(len(data)) == data[len(data) // 2 :]


def test_a_read_of_a_stream_returns_what_was_asked_for_not_what_has_arrived(tmp_path):
    """Bug: a read of a no-range file returned the bytes that had arrived so far, and a
    caller that takes a short read for the end of the file (zipfile) saw it truncated."""
    records = jsonl_records(300, seed=4)
    write_jsonl(tmp_path, "a.jsonl", records)
    data = (tmp_path / "a.jsonl").read_bytes()
    arrays = {"x": np.arange(4000, dtype=np.int64).reshape(1000, 4), "y": np.arange(1000)}
    write_npz(tmp_path, "b.npz", arrays)
    with serve(tmp_path, handler=_TricklingHandler, announce_no_ranges=True) as server:
        source = SourceFile(f"{server.url}/a.jsonl", {}, retries=0, block_size=4096)
        with source.open(100) as f:
            assert f.read(len(data)) == data[100:]
        rows = list(dp.Loader(dp.files(f"{server.url}/b.npz").read_npy()))
    assert [int(r["y"]) for r in rows] == list(range(1000))
    assert np.array_equal(np.stack([r["x"] for r in rows]), arrays["x"])


def _node_factory(where: Where, pattern: str, fmt_factory: Callable[[], Any]):
    def make(ctx: Context) -> FileReaderNode:
        return FileReaderNode(FileSet(where.url(pattern), {}), fmt_factory(), ctx)

    return make


def test_check_node_npy_small_blocks(local):
    """Row blocks of a few rows: resume points inside blocks, at block ends, across files."""
    n = len(write_npy(local.root, "a-0.npy", random_array((23, 4), np.int32, 1)))
    arrays = {"x": random_array((17, 2), np.float64, 2), "y": random_array((17,), np.uint8, 3)}
    n += len(write_npz(local.root, "a-1.npz", arrays, compressed=True))
    n += len(write_npy(local.root, "a-2.npy", random_array((9, 2, 2), np.float16, 4)))
    factory = _node_factory(local, "a-*", lambda: NpyFormat(block_bytes=40))
    assert check_node(factory, max_positions=60).items_per_epoch == [n, n]


@pytest.mark.parametrize(
    "fmt",
    [
        tarfile.USTAR_FORMAT,
        tarfile.GNU_FORMAT,
        tarfile.PAX_FORMAT,
    ],
    ids=["ustar", "gnu", "pax"],
)
def test_check_node_tar_small_blocks_long_names(local, fmt):
    """Blocks of 3 samples over tars whose names need more than the 100-char name field."""
    n = len(write_tar(local.root, "L-0.tar", tar_samples(14, 1, long_names=True), format=fmt))
    n += len(write_tar(local.root, "L-1.tar", tar_samples(5, 2, long_names=True), format=fmt))
    factory = _node_factory(local, "L-*.tar", lambda: TarFormat(block_samples=3))
    assert check_node(factory).items_per_epoch == [n, n]


def test_check_node_tar_small_blocks_short_names(local):
    n = len(write_tar(local.root, "S-0.tar", tar_samples(14, 1), format=tarfile.GNU_FORMAT))
    n += len(write_tar(local.root, "S-1.tar", tar_samples(5, 2), format=tarfile.PAX_FORMAT))
    n += len(write_tar(local.root, "S-2.tar.gz", tar_samples(7, 3), compression="gzip"))
    factory = _node_factory(local, "S-*", lambda: TarFormat(block_samples=3))
    assert check_node(factory, max_positions=60).items_per_epoch == [n, n]


@pytest.mark.parametrize(
    "fmt",
    [
        pytest.param(tarfile.GNU_FORMAT, id="gnu"),
        pytest.param(tarfile.PAX_FORMAT, id="pax"),
    ],
)
def test_loader_resume_tar_long_names_at_block_boundary(local, fmt):
    samples = write_tar(local.root, "long.tar", tar_samples(70, 4, long_names=True), format=fmt)
    pipe = dp.files(local.url("long.tar")).read_tar()
    full = run(pipe)
    assert_same(with_url(samples, local.url("long.tar")), full)
    for k in (64, 66):  # the default block holds 64 samples
        assert_same(full[k:], resumed_rest(pipe, k))


def resumed_rest(pipe: dp.DataPipe, k: int, epochs_after: int = 0) -> list[Any]:
    """Run k items, checkpoint (through json), resume in a fresh Loader, return the rest."""
    loader = dp.Loader(pipe, seed=3)
    it = iter(loader)
    head = list(islice(it, k))
    assert len(head) == k
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    fresh = dp.Loader(pipe, seed=3)
    fresh.load_state_dict(state)
    rest = list(fresh)
    for _ in range(epochs_after):
        rest.append(list(fresh))
    return rest


@pytest.mark.parametrize("name", list(CASES))
def test_loader_resume_at_random_positions(where, name):
    pipe, n = case_pipe(CASES[name], where)
    loader = dp.Loader(pipe, seed=3)
    full, next_epoch = list(loader), list(loader)
    assert len(full) == n
    rng = np.random.default_rng(zlib.crc32(f"{name}-{where.kind}".encode()))
    for k in sorted({0, n, *rng.integers(1, n, size=3).tolist()}):
        rest = resumed_rest(pipe, k, epochs_after=1)
        assert_same(full[k:], rest[:-1])
        assert_same(next_epoch, rest[-1])  # and the epoch after the resumed one


@pytest.mark.parametrize("kind", FILESYSTEMS)
def test_loader_resume_shuffled_files(request, tmp_path, kind):
    where = _local(tmp_path) if kind == "local" else _remote(request, kind)
    pattern, n = _jsonl_files(where.root)
    for i in range(4):
        write_jsonl(where.root, f"j-x{i}.jsonl", jsonl_records(5, seed=10 + i))
    pipe = dp.files(where.url(pattern)).shuffle().read_jsonl(block_size=256)
    loader = dp.Loader(pipe, seed=3)
    epochs = [list(loader), list(loader)]
    assert epochs[0] != epochs[1]  # the files come in another order
    assert sorted(map(json.dumps, epochs[0])) == sorted(map(json.dumps, epochs[1]))
    rng = np.random.default_rng(7)
    for k in rng.integers(1, len(epochs[0]), size=3).tolist():
        rest = resumed_rest(pipe, k, epochs_after=1)
        assert rest[:-1] == epochs[0][k:]
        assert rest[-1] == epochs[1]


# ----- splitting files among consumers ------------------------------------------------------


SPLITS = {
    # name: (file name, write(root, name) -> records, read step, how records are dealt)
    "lines": (
        "one.txt",
        lambda r, n: write_lines(r, n, text_lines(100, 1, long_every=7)),
        lambda f: f.read_lines(block_size=64),
        "ranges",
    ),
    "jsonl": (
        "one.jsonl",
        lambda r, n: write_jsonl(r, n, jsonl_records(100, 1), blank_every=5),
        lambda f: f.read_jsonl(block_size=256),
        "ranges",
    ),
    "jsonl-gz": (  # cannot seek: every consumer decompresses it and keeps its blocks
        "one.jsonl.gz",
        lambda r, n: write_jsonl(r, n, jsonl_records(100, 1), compression="gzip"),
        lambda f: f.read_jsonl(block_size=256),
        "any",
    ),
    "csv": (
        "one.csv",
        lambda r, n: write_csv(r, n, ["a", "b"], [[str(i), "x,y" * i] for i in range(99)]),
        lambda f: f.read_csv(block_size=64),
        "ranges",
    ),
    "npy": (
        "one.npy",
        lambda r, n: write_npy(r, n, random_array((100, 3), np.float32, 1)),
        lambda f: f.read_npy(),
        "ranges",
    ),
    "npz": (
        "one.npz",
        lambda r, n: write_npz(r, n, {"a": np.arange(20), "b": random_array((20, 2), seed=1)}),
        lambda f: f.read_npy(),
        "ranges",
    ),
    "tar": (
        "one.tar",
        lambda r, n: write_tar(r, n, tar_samples(50, 1, fields=("cls", "txt"))),
        lambda f: f.read_tar(),
        "round-robin",
    ),
}


@pytest.mark.parametrize("name", list(SPLITS))
def test_one_file_split_among_consumers(local, name):
    file_name, write, read, dealt = SPLITS[name]
    expected = write(local.root, file_name)
    if name == "tar":
        expected = with_url(expected, local.url(file_name))
    pipe = read(dp.files(local.url(file_name)))
    world = 3
    shares = [run(pipe, rank=r, world_size=world) for r in range(world)]
    assert all(shares), "every consumer gets a part of the file"
    assert sum(map(len, shares)) == len(expected)
    if dealt == "round-robin":
        assert_same(expected, [shares[i % world][i // world] for i in range(len(expected))])
    elif dealt == "ranges":
        assert_same(expected, [x for share in shares for x in share])
    else:
        merged = sorted((x for share in shares for x in share), key=json.dumps)
        assert merged == sorted(expected, key=json.dumps)
    report = check_node(
        lambda ctx: pipe.build(ctx), context=lambda e: Context(rank=1, world_size=world, epoch=e)
    )
    assert report.items_per_epoch == [len(shares[1])] * 2


# ----- bugs ---------------------------------------------------------------------------------

# Reads each case in its own thread of a fresh interpreter and reports those that did not
# finish in time, so a reader that loops forever fails the test instead of hanging the suite.
_HANG_PROBE = """
import json, os, sys, threading, time
import datapipes as dp

cases = json.loads(sys.argv[1])
results = {}

def read(name, url, step, block_size):
    results[name] = list(dp.Loader(getattr(dp.files(url), step)(block_size=block_size)))

threads = [threading.Thread(target=read, args=case, daemon=True) for case in cases]
for t in threads:
    t.start()
deadline = time.monotonic() + float(sys.argv[2])
for t in threads:
    t.join(max(0.0, deadline - time.monotonic()))
print(json.dumps({case[0]: results.get(case[0], "did not finish") for case in cases}))
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_text_readers_finish_on_empty_files_and_exact_block_ends(local):
    write_file(local.root, "empty.jsonl", b"")
    write_file(local.root, "empty.txt", b"")
    header_only = write_csv(local.root, "header.csv", ["a", "b"], [])
    lines = write_lines(local.root, "exact.txt", ["x" * 15] * 16)  # 256 bytes
    records = write_jsonl(local.root, "exact.jsonl", [{"i": i} for i in range(32)])
    exact = Path(local.root, "exact.jsonl").stat().st_size
    cases = [
        ["empty.jsonl", local.url("empty.jsonl"), "read_jsonl", 1 << 20],
        ["empty.txt", local.url("empty.txt"), "read_lines", 1 << 20],
        ["header.csv", local.url("header.csv"), "read_csv", 1 << 20],
        ["exact.txt", local.url("exact.txt"), "read_lines", 256],
        ["exact.txt, one byte more", local.url("exact.txt"), "read_lines", 257],
        ["exact.jsonl", local.url("exact.jsonl"), "read_jsonl", exact],
    ]
    done = subprocess.run(
        [sys.executable, "-c", _HANG_PROBE, json.dumps(cases), "3"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got == {
        "empty.jsonl": [],
        "empty.txt": [],
        "header.csv": header_only,
        "exact.txt": lines,
        "exact.txt, one byte more": lines,
        "exact.jsonl": records,
    }


def test_read_csv_other_quotechar(local):
    rows = [[str(i), f"line {i}\nbreak" if i % 3 == 0 else f"plain {i}"] for i in range(60)]
    expected = write_csv(local.root, "q.csv", ["a", "b"], rows, quotechar="'")
    assert b"'line 0\nbreak'" in Path(local.root, "q.csv").read_bytes()
    # One block holding the whole file reads right; blocks of 64 bytes (or files over 1 MiB
    # with the default block size) are cut inside rows.
    assert run(dp.files(local.url("q.csv")).read_csv(quotechar="'")) == expected
    assert run(dp.files(local.url("q.csv")).read_csv(quotechar="'", block_size=64)) == expected


@pytest.mark.parametrize(
    "dialect",
    [
        {"escapechar": "\\", "doublequote": False},  # quotes escaped, not doubled
        {},  # the default dialect, with quotes inside unquoted fields
    ],
    ids=["escapechar", "stray-quotes"],
)
def test_read_csv_finds_row_ends_like_the_csv_module(local, dialect):
    """Block ends must fall between rows however the dialect quotes; csv.DictReader is the judge."""
    path = Path(local.root, "d.csv")
    with open(path, "w", newline="") as f:
        if dialect:
            writer = csv.writer(f, **dialect)
            writer.writerow(["x", "y"])
            for i in range(80):
                writer.writerow([f'{i}" screw\nlong' if i % 4 == 0 else f"p{i}", str(i)])
        else:
            f.write("x,y\n")
            for i in range(80):  # a quote inside an unquoted field, then a quoted line break
                f.write(f'{i}" screw,"two\nlines {i}"\n' if i % 3 == 0 else f"p{i},{i}\n")
    with open(path, newline="") as f:
        expected = list(csv.DictReader(f, **dialect))
    for block_size in (16, 37, 64, 1 << 16):
        got = run(dp.files(str(path)).read_csv(block_size=block_size, **dialect))
        assert got == expected, block_size


def test_read_lines_refuses_encodings_without_a_newline_byte(local):
    write_lines(local.root, "u16.txt", text_lines(50, 1), encoding="utf-16-le")
    with pytest.raises(ValueError, match="utf-16-le"):
        run(dp.files(local.url("u16.txt")).read_lines(encoding="utf-16-le", block_size=64))


# ----- states are small ---------------------------------------------------------------------


def _big_jsonl(root):
    write_jsonl(root, "big.jsonl", [{"i": i, "s": "x" * (i % 13)} for i in range(12_000)])
    return "big.jsonl", lambda f: f.read_jsonl(block_size=4096)


def _big_lines(root):
    write_lines(root, "big.txt", [f"line {i}" for i in range(12_000)])
    return "big.txt", lambda f: f.read_lines(block_size=4096)


def _big_csv(root):
    write_csv(root, "big.csv", ["a", "b"], [[str(i), f"{i}\n{i}"] for i in range(12_000)])
    return "big.csv", lambda f: f.read_csv(block_size=4096)


def _big_npy(root):
    write_npy(root, "big.npy", random_array((12_000, 4), np.float32, 0))
    return "big.npy", lambda f: f.read_npy()


def _big_tar(root):
    samples = [{"__key__": f"k{i:05d}", "txt": str(i).encode()} for i in range(10_500)]
    write_tar(root, "big.tar", samples)
    return "big.tar", lambda f: f.read_tar()


@pytest.mark.parametrize(
    "make", [_big_jsonl, _big_lines, _big_csv, _big_npy, _big_tar], ids=lambda f: f.__name__[5:]
)
def test_state_is_small_after_10k_records(local, make):
    pattern, read = make(local.root)
    pipe = read(dp.files(local.url(pattern)))
    loader = dp.Loader(pipe)
    it = iter(loader)
    assert len(list(islice(it, 10_000))) == 10_000
    state = json.loads(json.dumps(loader.state_dict()))
    node = state["ranks"]["0"]["node"]  # the node states, as one JSON string
    assert len(node) < 300, node
    fresh = dp.Loader(pipe)
    fresh.load_state_dict(state)
    assert_same(list(it), list(fresh))


def test_jsonl_state_is_a_byte_offset_cursor(local):
    records = [{"i": i, "pad": "y" * (i % 17)} for i in range(12_000)]
    write_jsonl(local.root, "big.jsonl", records)
    data = Path(local.root, "big.jsonl").read_bytes()
    starts = [0, *(i + 1 for i, b in enumerate(data) if b == 0x0A)]  # each record's first byte
    block_size = 4096
    node = dp.files(local.url("big.jsonl")).read_jsonl(block_size=block_size).build(Context())
    node.reset(None)
    rng = np.random.default_rng(11)
    taken = 0
    for k in sorted(rng.integers(1, len(records), size=5).tolist()) + [10_000]:
        taken += len(list(islice(node, k - taken)))
        state = node.state_dict()
        assert len(json.dumps(state)) < 300
        offset, index = state["cursor"][0], state["index"]
        # the cursor is the byte offset of the block holding the next record, and ``index`` the
        # records already returned from that block
        assert isinstance(offset, int) and starts[k - index] == offset
        assert 0 <= starts[k] - offset < block_size
    node.close()


def test_field_names_are_lower_cased_as_webdataset_does(tmp_path):
    # e0.JPG is field "jpg" (decoded as an image), e0.Seg.PNG is "seg.png"; keys keep their case
    rgb = image_array(6, 5, seed=3)
    samples = [
        {"__key__": "Shard/E0", "JPG": encode_image(rgb, "png"), "Seg.PNG": encode_image(rgb)},
        {"__key__": "Shard/E1", "CLS": b"7", "TXT": b"hi"},
    ]
    write_tar(tmp_path, "caps.tar", samples)
    got = run(dp.files(str(tmp_path / "caps.tar")).read_tar().decode(image="hwc"))
    assert [sorted(k for k in s if not k.startswith("__")) for s in got] == [
        ["jpg", "seg.png"],
        ["cls", "txt"],
    ]
    assert [s["__key__"] for s in got] == ["Shard/E0", "Shard/E1"]
    assert same(got[0]["jpg"], torch.from_numpy(rgb)) and same(got[0]["seg.png"], got[0]["jpg"])
    assert got[1]["cls"] == 7 and got[1]["txt"] == "hi"


class _KeptBlocks(RecordFormat):
    """A format of one record per line that keeps every blocks generator it makes, as a
    traceback or a cache of the user's might: nothing but the reader can close them."""

    name, splittable = "kept", False

    def __init__(self) -> None:
        self.made: list[Any] = []
        self.open_files = 0

    def blocks(self, source: SourceFile, part: int, parts: int, cursor: Any, errors: Any) -> Any:
        made = self._blocks(source, cursor or 0)
        self.made.append(made)
        return made

    def _blocks(self, source: SourceFile, start: int) -> Any:
        with source.open(0) as file:
            self.open_files += 1
            try:
                lines = file.read().decode().splitlines()
                for at in range(start, len(lines)):
                    yield [lines[at]], at + 1 if at + 1 < len(lines) else None
            finally:
                self.open_files -= 1


def test_a_reader_closes_its_file_when_it_closes_not_when_the_gc_does(tmp_path: Path):
    (tmp_path / "a.txt").write_text("".join(f"{i}\n" for i in range(6)))
    fmt = _KeptBlocks()
    node = FileReaderNode(FileSet(str(tmp_path / "a.txt"), {}), fmt, Context())
    node.reset(None)
    assert [next(node), next(node)] == ["0", "1"]
    assert fmt.open_files == 1
    node.close()
    assert fmt.open_files == 0, "the file stays open while anything else holds the generator"
    node.reset(None)  # a new epoch reads from the start, with a file of its own
    assert list(node) == [str(i) for i in range(6)] and fmt.open_files == 0
    assert len(fmt.made) == 2
