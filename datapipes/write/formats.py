"""Shard formats: records in, the bytes of one shard out, the same bytes on every run.

A format's :meth:`ShardFormat.encode` takes a shard's records (in order) and
returns its bytes; nothing in them depends on the time, the host or the
process (tar headers carry mtime 0 and no owner), so a unit written again after
a kill gives the very bytes it gave before, and the output of a run is the
same whatever the topology. Formats read back elsewhere: JSONL line by line,
tar as webdataset shards (``__key__`` plus one member per field), parquet by
pyarrow and Hugging Face ``datasets``.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Sequence
from typing import Any

import numpy as np


class ShardFormat:
    """How a shard's records become its bytes (see the module doc)."""

    name = ""
    extension = ""

    def encode(self, records: Sequence[Any], keys: Sequence[str]) -> bytes:
        """The shard holding ``records``; ``keys``: a default key for each (their unit and
        index), for formats whose records need one."""
        raise NotImplementedError

    def size_of(self, record: Any) -> int:
        """About the bytes ``record`` adds to a shard (``bytes_per_shard`` counts these)."""
        return len(_json_line(record))


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: arrays and tensors as lists, numpy scalars as numbers."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(
        f"a record field of type {type(value).__name__} cannot be written as JSON: write "
        "bytes to tar or parquet, or map it to str, numbers, lists or dicts first"
    )


def _json_line(record: Any) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=_plain).encode()


class JsonlFormat(ShardFormat):
    """One JSON object (or value) per line, UTF-8."""

    name, extension = "jsonl", "jsonl"

    def encode(self, records: Sequence[Any], keys: Sequence[str]) -> bytes:
        return b"".join(_json_line(record) + b"\n" for record in records)


#: Tar member fields that hold the sample's key, not a file.
KEY = "__key__"


def _member_bytes(field: str, value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        if field.endswith("npy"):
            buffer = io.BytesIO()
            np.save(buffer, value, allow_pickle=False)
            return buffer.getvalue()
        value = value.tolist()
    if isinstance(value, bool | int | float | np.generic):
        return json.dumps(value.item() if isinstance(value, np.generic) else value).encode()
    if isinstance(value, dict | list | tuple) or value is None:
        return _json_line(value)
    raise TypeError(
        f"field {field!r} of type {type(value).__name__} cannot be a tar member: give it "
        "bytes, str, numbers, lists, dicts or arrays (a field ending in 'npy' is saved as .npy)"
    )


class TarFormat(ShardFormat):
    """A webdataset shard: each record a dict, ``__key__`` its key (else its unit and
    index), each other field one member ``<key>.<field>``: bytes as they are, str as
    UTF-8, numbers, lists and dicts as JSON, arrays in a field ending in ``npy`` as .npy.
    Headers are fixed (mtime 0, no owner, mode 0444), so the bytes are too."""

    name, extension = "tar", "tar"

    def encode(self, records: Sequence[Any], keys: Sequence[str]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for record, default_key in zip(records, keys, strict=True):
                if not isinstance(record, dict):
                    raise TypeError(
                        f"a tar shard holds dicts of fields (webdataset samples), got a "
                        f"{type(record).__name__}: map each record to a dict first"
                    )
                key = str(record.get(KEY, default_key))
                if "." in key.rsplit("/", 1)[-1]:
                    raise ValueError(
                        f"a tar sample key cannot hold a dot ({key!r}): readers split a member "
                        "name at its first dot into the key and the field"
                    )
                for field in sorted(f for f in record if f != KEY and not f.startswith("__")):
                    data = _member_bytes(field, record[field])
                    info = tarfile.TarInfo(f"{key}.{field}")
                    info.size, info.mtime, info.mode = len(data), 0, 0o444
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()

    def size_of(self, record: Any) -> int:
        if not isinstance(record, dict):
            return 0  # encode says why
        return sum(
            512 + len(v) if isinstance(v, bytes | bytearray) else 512 + len(_json_line(v))
            for f, v in record.items()
            if not f.startswith("__") and isinstance(v, bytes | bytearray | str | int | float)
        )


class ParquetFormat(ShardFormat):
    """One parquet file per shard (pyarrow, the ``parquet`` extra): each record a dict of
    columns, the schema inferred from the shard's records (``pyarrow.Table.from_pylist``).
    Read back by pyarrow and ``datasets.load_dataset("parquet", ...)``."""

    name, extension = "parquet", "parquet"

    def __init__(self) -> None:
        try:
            import pyarrow  # noqa: F401
        except ImportError as error:
            raise ImportError(
                "format='parquet' needs pyarrow: pip install 'datapipes-torch[parquet]'"
            ) from error

    def encode(self, records: Sequence[Any], keys: Sequence[str]) -> bytes:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if records and not isinstance(records[0], dict):
            raise TypeError(
                f"a parquet shard holds dicts of columns, got a {type(records[0]).__name__}: "
                "map each record to a dict first"
            )
        table = pa.Table.from_pylist([_columns(record) for record in records])
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        return buffer.getvalue()


def _columns(record: dict[str, Any]) -> dict[str, Any]:
    return {
        field: _plain(value) if isinstance(value, np.ndarray | np.generic) else value
        for field, value in record.items()
    }


FORMATS: dict[str, type[ShardFormat]] = {
    "jsonl": JsonlFormat,
    "tar": TarFormat,
    "parquet": ParquetFormat,
}


def shard_format(name: str) -> ShardFormat:
    """The format named ``name`` (``"jsonl"``, ``"tar"``, ``"parquet"``)."""
    try:
        return FORMATS[name]()
    except KeyError:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {name!r}") from None
