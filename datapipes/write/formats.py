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
from typing import IO, Any, Protocol

import numpy as np


class ShardSink(Protocol):
    """Where a shard is written: ``file``, or on local disk ``path`` (else ``None``)."""

    @property
    def file(self) -> IO[bytes]: ...

    @property
    def path(self) -> str | None: ...


class ShardFormat:
    """How a shard's records become its bytes (see the module doc)."""

    name = ""
    extension = ""
    #: Whether :meth:`encode` reads ``keys`` (else it is given none).
    keyed = False

    def encode(self, records: Sequence[Any], keys: Sequence[str]) -> bytes:
        """The shard holding ``records``; ``keys``: a default key for each (their unit and
        index), for formats whose records need one."""
        raise NotImplementedError

    def write(self, records: Sequence[Any], keys: Sequence[str], out: IO[bytes]) -> None:
        """Write the shard :meth:`encode` gives to the binary file ``out`` (a format that
        can write it in parts does, so that no whole shard is held in memory)."""
        out.write(self.encode(records, keys))

    def write_shard(self, records: Sequence[Any], keys: Sequence[str], sink: ShardSink) -> None:
        """Write the shard to ``sink``: :meth:`write` to its file (a format whose library
        writes local files faster itself writes ``sink.path`` instead)."""
        self.write(records, keys, sink.file)

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


_NUL = bytes(tarfile.BLOCKSIZE)
_RUN = 1 << 20  # bytes of members a tar shard is written in at a time
_TAR_ENCODING, _TAR_ERRORS = tarfile.ENCODING, "surrogateescape"  # a TarFile's defaults


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o444
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _tarfile_header(name: str, size: int) -> bytes:
    """The header block(s) tarfile writes for a member ``name`` of ``size`` bytes."""
    return _tar_info(name, size).tobuf(tarfile.GNU_FORMAT, _TAR_ENCODING, _TAR_ERRORS)


def _header_template() -> tuple[bytes, bytes, bytes, int]:
    """The parts of a member's header that do not depend on its name and size (the mode,
    owner, mtime, type, magic... fields: taken from tarfile's own header, so they are
    what this Python's tarfile writes), and the sum of their bytes."""
    block = _tarfile_header("", 0)
    middle, mtime, rest = block[100:124], block[136:148], block[156:]
    return middle, mtime, rest, sum(middle) + sum(mtime) + sum(rest) + 8 * ord(" ")


_MIDDLE, _MTIME, _REST, _TEMPLATE_SUM = _header_template()


def _member_header(name: str, size: int) -> bytes:
    """``_tarfile_header(name, size)``, about 10x faster: a name of at most 100 bytes and a
    size under 8 GiB fill the template's name, size and checksum fields (a ustar header:
    name 0-100, mode, uid, gid 100-124, size 124-136, mtime 136-148, checksum 148-156 as
    six octal digits, NUL, space; the rest 156-512); other members go through tarfile."""
    raw = name.encode(_TAR_ENCODING, _TAR_ERRORS)
    if len(raw) > 100 or size >= 8**11 or not _FAST_HEADERS:
        return _tarfile_header(name, size)
    size_field = b"%011o\0" % size
    checksum = _TEMPLATE_SUM + sum(raw) + sum(size_field)
    return b"".join(
        (raw, _NUL[: 100 - len(raw)], _MIDDLE, size_field, _MTIME, b"%06o\0 " % checksum, _REST)
    )


#: Whether _member_header may build headers itself: it gives tarfile's bytes here (checked
#: once, on a few names and sizes; a tarfile that writes otherwise is used as it is).
_FAST_HEADERS = True
_FAST_HEADERS = all(
    _member_header(name, size) == _tarfile_header(name, size)
    for name in ("k.jpg", "0000/x-00000001.txt", "é/ü.json", "n" * 100)
    for size in (0, 1, 511, 512, 8**11 - 1)
)


class TarFormat(ShardFormat):
    """A webdataset shard: each record a dict, ``__key__`` its key (else its unit and
    index), each other field one member ``<key>.<field>``: bytes as they are, str as
    UTF-8, numbers, lists and dicts as JSON, arrays in a field ending in ``npy`` as .npy.
    Headers are fixed (mtime 0, no owner, mode 0444), so the bytes are too."""

    name, extension = "tar", "tar"
    keyed = True

    def encode(self, records: Sequence[Any], keys: Sequence[str]) -> bytes:
        buffer = io.BytesIO()
        self.write(records, keys, buffer)
        return buffer.getvalue()

    def write(self, records: Sequence[Any], keys: Sequence[str], out: IO[bytes]) -> None:
        # The bytes tarfile.open(mode="w", format=GNU_FORMAT) and addfile would write, with
        # each header made by _member_header (tarfile's own work per member is most of the
        # cost of a shard), written in runs of members joined up to about _RUN bytes.
        parts: list[bytes] = []
        size = run = 0
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
                header = _member_header(f"{key}.{field}", len(data))
                padding = -len(data) % tarfile.BLOCKSIZE
                parts += (header, data, _NUL[:padding])
                run += len(header) + len(data) + padding
            if run >= _RUN:
                out.write(b"".join(parts))
                size, run = size + run, 0
                parts.clear()
        size += run + 2 * tarfile.BLOCKSIZE  # the end: two zero blocks, then zeros to a record
        parts.append(bytes(2 * tarfile.BLOCKSIZE + -size % tarfile.RECORDSIZE))
        out.write(b"".join(parts))

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
    columns, the schema inferred from the shard's records (as ``pyarrow.Table.from_pylist``).
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
        buffer = io.BytesIO()
        self.write(records, keys, buffer)
        return buffer.getvalue()

    def write(self, records: Sequence[Any], keys: Sequence[str], out: IO[bytes]) -> None:
        import pyarrow.parquet as pq

        pq.write_table(self._table(records), out)

    def write_shard(self, records: Sequence[Any], keys: Sequence[str], sink: ShardSink) -> None:
        """On local disk pyarrow writes the path itself: through a Python file it would
        take the GIL for every write, which the publishing thread then waits for."""
        import pyarrow.parquet as pq

        pq.write_table(self._table(records), sink.path or sink.file)

    def _table(self, records: Sequence[Any]) -> Any:
        import pyarrow as pa

        for record in records:
            if not isinstance(record, dict):
                raise TypeError(
                    f"a parquet shard holds dicts of columns, got a {type(record).__name__}: "
                    "map each record to a dict first"
                )
        # What pa.Table.from_pylist(records) does (the first record's fields are the columns,
        # a field a record lacks is null), a column at a time: arrays and numpy numbers as
        # lists and numbers, converted only in the columns that hold any.
        names = list(records[0]) if records else []
        columns = [_column([record.get(name) for record in records]) for name in names]
        return pa.Table.from_arrays(columns, names)


def _column(values: list[Any]) -> list[Any]:
    if any(issubclass(kind, np.ndarray | np.generic) for kind in set(map(type, values))):
        return [_plain(v) if isinstance(v, np.ndarray | np.generic) else v for v in values]
    return values


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
