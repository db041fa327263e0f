"""Generators of test files: JSONL, text lines, CSV, .npy/.npz, tar shards, images, compressed.

Every ``write_<format>`` function takes a ``root`` (a local directory as ``str``/``Path``, or
any fsspec URL such as ``memory:///some/dir``) and a file ``name`` relative to it, writes the
file through fsspec, and returns the records a reader should yield for it, in order. Data
generators take a ``seed`` so expectations are computed from the data, never hard-coded::

    records = write_jsonl(tmp_path, "a.jsonl", jsonl_records(100, seed=1))
    assert list(dp.Loader(dp.files(str(tmp_path / "*.jsonl")).read_jsonl())) == records

Compression (``compression="gzip" | "zstd" | "bz2" | "xz"``) is applied with the standard
library or ``zstandard`` directly (not fsspec), so a reader's decompression is checked against
an independent writer. Tar samples are returned without ``__url__`` (it depends on how the
file is read); add it with :func:`with_url`.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import fsspec
import numpy as np

Root = str | Path

# Characters that trip naive line splitting (str.splitlines splits on all of them).
AWKWARD_CHARS = "\u2028\u2029\x85\x0b\x0c\x1c"


def join(root: Root, name: str) -> str:
    """``root/name`` as a string usable by fsspec (local paths stay paths)."""
    return f"{str(root).rstrip('/')}/{name.lstrip('/')}"


def compress(data: bytes, compression: str | None) -> bytes:
    """``data`` compressed with ``gzip``, ``zstd``, ``bz2`` or ``xz`` (``None``: unchanged)."""
    if compression is None:
        return data
    if compression == "gzip":
        return gzip.compress(data)
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    if compression == "bz2":
        return bz2.compress(data)
    if compression == "xz":
        return lzma.compress(data)
    raise ValueError(f"unknown compression {compression!r}")


def write_file(root: Root, name: str, data: bytes, compression: str | None = None) -> str:
    """Write ``data`` (compressed if asked) to ``root/name``; return the path written."""
    path = join(root, name)
    fs, fs_path = fsspec.core.url_to_fs(path)
    parent = fs_path.rsplit("/", 1)[0] if "/" in fs_path else ""
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(fs_path, "wb") as f:
        f.write(compress(data, compression))
    return path


# ----- text ---------------------------------------------------------------------------------


def jsonl_records(n: int, seed: int = 0, *, start: int = 0) -> list[dict[str, Any]]:
    """``n`` varied JSON objects (nested values, unicode, awkward characters, varying length)."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "béta", "γάμμα", "дельта", "ε", "日本語", "emoji 🎉", AWKWARD_CHARS, ""]
    records = []
    for i in range(start, start + n):
        k = int(rng.integers(0, 6))
        records.append(
            {
                "id": i,
                "x": float(rng.normal()),
                "text": " ".join(words[int(j)] for j in rng.integers(0, len(words), size=k)),
                "tags": [int(t) for t in rng.integers(0, 100, size=int(rng.integers(0, 4)))],
                "nested": {"ok": bool(rng.integers(0, 2)), "none": None},
            }
        )
    return records


def write_jsonl(
    root: Root,
    name: str,
    records: Sequence[Any],
    *,
    compression: str | None = None,
    blank_every: int = 0,
    ensure_ascii: bool = False,
    crlf: bool = False,
) -> list[Any]:
    """Write one JSON value per line; ``blank_every=k`` adds a blank line after every k-th."""
    newline = "\r\n" if crlf else "\n"
    parts = []
    for i, record in enumerate(records, 1):
        parts.append(json.dumps(record, ensure_ascii=ensure_ascii) + newline)
        if blank_every and i % blank_every == 0:
            parts.append(newline if i % (2 * blank_every) else "  \t" + newline)
    write_file(root, name, "".join(parts).encode("utf-8"), compression)
    return list(records)


def write_id_files(
    folder: Path, files: int, per_file: int, *, step: int | None = None, name: str = "part{}"
) -> list[str]:
    """``files`` JSONL files ``folder/part{f}.jsonl`` of ``{"id": f * step + i}`` for ``i`` in
    ``range(per_file)`` (``step``: ``per_file`` unless given, so the ids run on); their paths.
    """
    folder.mkdir(parents=True, exist_ok=True)
    step = per_file if step is None else step
    paths = []
    for f in range(files):
        path = folder / (name.format(f) + ".jsonl")
        path.write_text("".join(json.dumps({"id": f * step + i}) + "\n" for i in range(per_file)))
        paths.append(str(path))
    return paths


def text_lines(n: int, seed: int = 0, *, long_every: int = 0, long_length: int = 500) -> list[str]:
    """``n`` lines of text: empty ones, unicode, awkward characters; ``long_every`` long ones."""
    rng = np.random.default_rng(seed)
    alphabet = list("abcdefghij ,;\"'\t") + ["é", "ß", "中", "🙂", *AWKWARD_CHARS]
    lines = []
    for i in range(n):
        length = int(rng.integers(0, 40))
        if long_every and i % long_every == long_every - 1:
            length = long_length
        lines.append(
            f"{i}:" + "".join(alphabet[int(j)] for j in rng.integers(0, len(alphabet), length))
        )
        if i % 7 == 3:
            lines[-1] = ""
    return lines


def write_lines(
    root: Root,
    name: str,
    lines: Sequence[str],
    *,
    newline: str = "\n",
    final_newline: bool = True,
    compression: str | None = None,
    encoding: str = "utf-8",
) -> list[str]:
    """Write ``lines`` joined by ``newline`` (with or without one after the last line)."""
    text = newline.join(lines) + (newline if final_newline and lines else "")
    write_file(root, name, text.encode(encoding), compression)
    return list(lines)


def csv_table(n: int, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    """A header and ``n`` rows whose fields hold commas, quotes, line breaks and unicode."""
    rng = np.random.default_rng(seed)
    header = ["id", "name", "note, with comma", 'quote "q"']
    pieces = ["plain", "a,b", 'say "hi"', "two\nlines", "crlf\r\ninside", "ünïcödé", "", " pad "]
    rows = []
    for i in range(n):
        picks = rng.integers(0, len(pieces), size=3)
        rows.append([str(i), *(pieces[int(p)] + str(int(p) * i) for p in picks)])
    return header, rows


def write_csv(
    root: Root,
    name: str,
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    compression: str | None = None,
    **fmtparams: Any,
) -> list[dict[str, str]]:
    """Write a CSV file with :mod:`csv` (``fmtparams`` go to ``csv.writer``); return dict rows."""
    rows = [list(row) for row in rows]
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, **fmtparams)
    writer.writerow(header)
    writer.writerows(rows)
    write_file(root, name, buffer.getvalue().encode("utf-8"), compression)
    return [dict(zip(header, row)) for row in rows]


# ----- arrays -------------------------------------------------------------------------------


def random_array(shape: Sequence[int], dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
    """A C-ordered array of ``shape`` with random values of ``dtype``."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.normal(size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    info = np.iinfo(dtype)
    native = dtype.newbyteorder("=")
    return rng.integers(info.min, info.max, size=shape, dtype=native, endpoint=True).astype(dtype)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def write_npy(
    root: Root, name: str, array: np.ndarray, *, compression: str | None = None
) -> list[np.ndarray]:
    """Save ``array`` as ``.npy``; return its rows (``list(array)``)."""
    write_file(root, name, npy_bytes(array), compression)
    return list(array)


def write_npz(
    root: Root, name: str, arrays: dict[str, np.ndarray], *, compressed: bool = False
) -> list[dict[str, np.ndarray]]:
    """Save ``arrays`` (same number of rows) as ``.npz``; return one dict of member rows per row."""
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    write_file(root, name, buffer.getvalue())
    lengths = {len(a) for a in arrays.values()}
    assert len(lengths) == 1, "all members need the same number of rows"
    return [{k: a[i] for k, a in arrays.items()} for i in range(lengths.pop())]


# ----- images -------------------------------------------------------------------------------


def image_array(height: int, width: int, channels: int | None = 3, seed: int = 0) -> np.ndarray:
    """A random uint8 image, ``(H, W, C)`` or ``(H, W)`` when ``channels`` is None."""
    shape = (height, width) if channels is None else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def smooth_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth ``(H, W, 3)`` uint8 image (gradients): lossy codecs keep it close."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    channels = []
    for _ in range(3):
        a, b, c = rng.uniform(0, 255, size=3)
        ramp = 0.4 * a * y / max(1, height - 1) + 0.4 * b * x / max(1, width - 1)
        channels.append(20 + ramp + 0.1 * c)
    return np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)


def encode_image(array: np.ndarray, fmt: str = "png", **save_options: Any) -> bytes:
    """``array`` (``(H, W)`` or ``(H, W, 3|4)`` uint8) encoded as ``png``/``jpeg``/``webp``/..."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format={"jpg": "jpeg"}.get(fmt, fmt), **save_options)
    return buffer.getvalue()


# ----- tar shards ---------------------------------------------------------------------------


def tar_samples(
    n: int,
    seed: int = 0,
    *,
    prefix: str = "",
    start: int = 0,
    long_names: bool = False,
    fields: Sequence[str] = ("cls", "json", "txt", "seg.npy"),
) -> list[dict[str, Any]]:
    """``n`` webdataset samples ``{"__key__", "cls", "json", "txt", "seg.npy"}`` (bytes fields).

    ``long_names`` makes every key longer than 100 characters (ustar can only hold such a name
    split at a ``/``; GNU and PAX headers hold any). ``fields`` picks which fields to include.
    """
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(start, start + n):
        folder = prefix + ("deep-folder-name/" * 7 if long_names else "")
        key = f"{folder}sample{i:05d}"
        sample = {
            "__key__": key,
            "cls": str(int(rng.integers(0, 10))).encode(),
            "json": json.dumps({"i": i, "v": float(rng.normal())}).encode(),
            "txt": f"caption {i} ü".encode() * int(rng.integers(1, 4)),
            "seg.npy": npy_bytes(random_array((2, int(rng.integers(1, 4))), np.int16, i)),
        }
        samples.append({k: v for k, v in sample.items() if k == "__key__" or k in fields})
    return samples


def tar_bytes(
    samples: Sequence[dict[str, Any]],
    *,
    format: int = tarfile.PAX_FORMAT,  # noqa: A002 - tarfile's own name
    extra_members: Sequence[tuple[int, str, bytes]] = (),
) -> bytes:
    """A tar archive of ``samples`` (member ``<key>.<field>`` per bytes field, in dict order).

    ``extra_members`` are ``(position, name, data)`` members inserted before sample
    ``position`` (e.g. files without an extension, which readers must ignore); a name ending
    in ``/`` is a directory.
    """
    buffer = io.BytesIO()
    extras = sorted(extra_members, key=lambda m: m[0])
    with tarfile.open(fileobj=buffer, mode="w", format=format, encoding="utf-8") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                info.name = name.rstrip("/")
                tar.addfile(info)
                return
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        e = 0
        for position, sample in enumerate(samples):
            while e < len(extras) and extras[e][0] <= position:
                add(extras[e][1], extras[e][2])
                e += 1
            for field, value in sample.items():
                if not field.startswith("__"):
                    add(f"{sample['__key__']}.{field}", value)
        for _, name, data in extras[e:]:
            add(name, data)
    return buffer.getvalue()


def write_tar(
    root: Root,
    name: str,
    samples: Sequence[dict[str, Any]],
    *,
    format: int = tarfile.PAX_FORMAT,  # noqa: A002
    compression: str | None = None,
    extra_members: Sequence[tuple[int, str, bytes]] = (),
) -> list[dict[str, Any]]:
    """Write ``samples`` as a tar shard (see :func:`tar_bytes`); return them (no ``__url__``)."""
    data = tar_bytes(samples, format=format, extra_members=extra_members)
    write_file(root, name, data, compression)
    return [dict(s) for s in samples]


def with_url(samples: Iterable[dict[str, Any]], url: str) -> list[dict[str, Any]]:
    """The samples as a reader yields them from ``url``: ``__key__``, ``__url__``, fields."""
    out = []
    for s in samples:
        fields = {k: v for k, v in s.items() if k != "__key__"}
        out.append({"__key__": s["__key__"], "__url__": url, **fields})
    return out
