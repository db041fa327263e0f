"""Editing a Parquet file's footer, to make hostile files: Thrift's compact protocol, read
and written back, and the footer's fields by number (parquet-format's ``parquet.thrift``).

A struct is a list of ``[field id, type, value]``; a list is ``[element type, [values]]``::

    data = edit_footer(data, lambda meta: set_field(row_groups(meta)[0], ROWS, 2**31))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)

# FileMetaData
FILE_ROWS, ROW_GROUPS = 3, 4
# RowGroup
COLUMNS, TOTAL_BYTE_SIZE, ROWS = 1, 2, 3
# ColumnChunk -> ColumnMetaData
META_DATA = 3
NUM_VALUES, UNCOMPRESSED, COMPRESSED, DATA_PAGE_OFFSET = 5, 6, 7, 9


class _Reader:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return out

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def value(self, kind: int) -> Any:
        if kind in (TRUE, FALSE):
            return kind == TRUE
        if kind == BYTE:
            return self.byte()
        if kind in (I16, I32, I64):
            return self.zigzag()
        if kind == DOUBLE:
            return self.take(8)
        if kind == BINARY:
            return self.take(self.varint())
        if kind in (LIST, SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if elem in (TRUE, FALSE):
                return [elem, [self.byte() == TRUE for _ in range(size)]]
            return [elem, [self.value(elem) for _ in range(size)]]
        if kind == MAP:
            size = self.varint()
            if not size:
                return [0, 0, []]
            kv = self.byte()
            k, v = kv >> 4, kv & 0x0F
            return [k, v, [(self.value(k), self.value(v)) for _ in range(size)]]
        if kind == STRUCT:
            return self.struct()
        raise ValueError(f"unknown thrift type {kind}")

    def struct(self) -> list[list[Any]]:
        fields: list[list[Any]] = []
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            kind, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self.zigzag()
            fields.append([fid, kind, self.value(kind)])
            last = fid


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def varint(self, n: int) -> None:
        while True:
            b, n = n & 0x7F, n >> 7
            self.out.append(b | 0x80 if n else b)
            if not n:
                return

    def zigzag(self, n: int) -> None:
        self.varint((n << 1) ^ (n >> 63))

    def value(self, kind: int, v: Any) -> None:
        if kind in (TRUE, FALSE):
            return  # in the field header
        if kind == BYTE:
            self.out.append(v)
        elif kind in (I16, I32, I64):
            self.zigzag(v)
        elif kind == DOUBLE:
            self.out += v
        elif kind == BINARY:
            self.varint(len(v))
            self.out += v
        elif kind in (LIST, SET):
            elem, items = v
            if len(items) < 15:
                self.out.append(len(items) << 4 | elem)
            else:
                self.out.append(0xF0 | elem)
                self.varint(len(items))
            for item in items:
                if elem in (TRUE, FALSE):
                    self.out.append(TRUE if item else FALSE)
                else:
                    self.value(elem, item)
        elif kind == MAP:
            k, vk, items = v
            self.varint(len(items))
            if items:
                self.out.append(k << 4 | vk)
                for a, b in items:
                    self.value(k, a)
                    self.value(vk, b)
        elif kind == STRUCT:
            self.struct(v)

    def struct(self, fields: list[list[Any]]) -> None:
        last = 0
        for fid, kind, v in fields:
            wire = (TRUE if v else FALSE) if kind in (TRUE, FALSE) else kind
            if 0 < fid - last <= 15:
                self.out.append((fid - last) << 4 | wire)
            else:
                self.out.append(wire)
                self.zigzag(fid)
            self.value(kind, v)
            last = fid
        self.out.append(0)


def get_field(struct: list[list[Any]], fid: int) -> Any:
    return next(f for f in struct if f[0] == fid)[2]


def set_field(struct: list[list[Any]], fid: int, value: Any) -> None:
    next(f for f in struct if f[0] == fid)[2] = value


def row_groups(meta: list[list[Any]]) -> list[list[list[Any]]]:
    return get_field(meta, ROW_GROUPS)[1]


def column_meta(group: list[list[Any]], column: int) -> list[list[Any]]:
    return get_field(get_field(group, COLUMNS)[1][column], META_DATA)


def read_struct(data: bytes, pos: int) -> tuple[list[list[Any]], int]:
    """The struct at ``pos`` of ``data`` (a page header, a footer) and where it ends."""
    reader = _Reader(data, pos)
    return reader.struct(), reader.pos


def write_struct(struct: list[list[Any]]) -> bytes:
    writer = _Writer()
    writer.struct(struct)
    return bytes(writer.out)


def edit_footer(data: bytes, edit: Callable[[list[list[Any]]], None]) -> bytes:
    """``data`` (a Parquet file) with its footer read, edited in place by ``edit``, written."""
    assert data[-4:] == b"PAR1", "not a Parquet file"
    length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - length
    meta = _Reader(data, start).struct()
    edit(meta)
    writer = _Writer()
    writer.struct(meta)
    footer = bytes(writer.out)
    return data[:start] + footer + len(footer).to_bytes(4, "little") + b"PAR1"
