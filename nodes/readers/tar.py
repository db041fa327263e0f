"""Tar archives with webdataset conventions: consecutive members sharing a key form a sample.

A member ``dir/img001.seg.png`` has key ``dir/img001`` and field
``seg.png``; the sample is ``{"__key__": "dir/img001", "__url__": url,
"seg.png": b"..."}``. Members whose name has no extension, directories,
links and hidden files (``._x``) are not fields, as in webdataset.

Headers are parsed directly (ustar, GNU long names, pax paths), so a reader
can start at any member: the cursor is ``[header offset, sample number]``
and resume seeks there. A file is split among consumers by samples: part
``p`` of ``n`` takes samples ``p, p + n, ...`` and seeks past the others' data.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import Any

from nodes.errors import BadRecordError, ErrorPolicy
from nodes.readers.reader import Cursor, RecordFormat
from nodes.storage import SourceFile, read_full, skip_forward

BLOCK = 512
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


class _Member:
    __slots__ = ("name", "offset", "data_offset", "size")

    def __init__(self, name: str, offset: int, data_offset: int, size: int) -> None:
        self.name, self.offset, self.data_offset, self.size = name, offset, data_offset, size


class _TarWalker:
    """Reads member headers one after another from a byte offset, fetching data on request."""

    def __init__(self, f: Any, url: str, offset: int, seekable: bool) -> None:
        self.f, self.url, self.offset, self.seekable = f, url, offset, seekable

    def _read(self, size: int, what: str) -> bytes:
        data = read_full(self.f, size)
        self._check_complete(data, size, what)
        self.offset += size
        return data

    def _check_complete(self, data: bytes, size: int, what: str) -> None:
        if len(data) < size:
            raise BadRecordError(
                self.url,
                f"{what} at byte offset {self.offset}",
                f"truncated archive: needed {size} bytes, the file ends after {len(data)}",
            )

    def next_member(self) -> _Member | None:
        """The next regular-file member (its data not yet read), or None at the end."""
        long_name: str | None = None
        first_header = self.offset  # a long-name or pax header comes before the member's own
        while True:
            header_offset = self.offset
            buf = read_full(self.f, BLOCK)
            if not buf or buf == bytes(BLOCK) or buf == bytes(len(buf)):
                return None  # end-of-archive marker, or a file that simply ends here
            self._check_complete(buf, BLOCK, "header")
            self.offset += BLOCK
            try:
                info = tarfile.TarInfo.frombuf(buf, "utf-8", "surrogateescape")
            except tarfile.HeaderError as error:
                raise BadRecordError(
                    self.url, f"header at byte offset {header_offset}", f"corrupt header: {error}"
                ) from None
            padded = _padded(info.size)
            if info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = (
                    self._read(padded, "long name")
                    .split(b"\0", 1)[0]
                    .decode("utf-8", "surrogateescape")
                )
                continue
            if info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
                data = self._read(padded, "pax header")[: info.size]
                try:
                    long_name = _pax_path(data) or long_name
                except ValueError as error:
                    raise BadRecordError(
                        self.url, f"pax header at byte offset {header_offset}", f"corrupt: {error}"
                    ) from None
                continue
            member = _Member(long_name or info.name, first_header, self.offset, info.size)
            long_name = None
            if info.type in _REGULAR:
                return member
            self.skip(padded)
            first_header = self.offset

    def data(self, member: _Member) -> bytes:
        data = self._read(member.size, f"member {member.name!r}")
        self.skip(_padded(member.size) - member.size)
        return data

    def skip(self, size: int) -> None:
        if size <= 0:
            return
        if self.seekable:
            self.f.seek(self.offset + size)
        else:
            skip_forward(self.f, self.offset + size)
        self.offset += size


def _pax_path(data: bytes) -> str | None:
    """The ``path`` record of a pax extended header, if any (ValueError if malformed)."""
    position = 0
    while position < len(data):
        space = data.find(b" ", position)
        length = int(data[position:space]) if space > position else 0
        if length <= space - position or position + length > len(data):
            raise ValueError(f"bad pax record length at header byte {position}")
        key, _, value = data[space + 1 : position + length - 1].partition(b"=")
        if key == b"path":
            return value.decode("utf-8", "surrogateescape")
        position += length
    return None


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, field)`` of a member name by webdataset rules, or None if it is not a field."""
    name = name.removeprefix("./")
    slash = name.rfind("/") + 1
    base = name[slash:]
    dot = base.find(".", 1 if base.startswith("_") else 0)
    if base.startswith(".") or dot <= 0:
        return None
    return name[: slash + dot], base[dot + 1 :]


class TarFormat(RecordFormat):
    """Samples of a tar archive (a ``dict`` of bytes fields per key)."""

    name = "read_tar"

    def __init__(self, block_samples: int = 64, block_bytes: int = 1 << 23) -> None:
        self.block_samples = block_samples
        self.block_bytes = block_bytes

    def blocks(
        self, source: SourceFile, part: int, parts: int, cursor: Cursor, errors: ErrorPolicy
    ) -> Iterator[tuple[list[Any], Cursor]]:
        offset, sample_no = (0, 0) if cursor is None else cursor
        with source.open(offset) as f:
            walker = _TarWalker(f, source.url, offset, source.seekable)
            block: list[Any] = []
            size = 0
            try:
                for sample, sample_bytes, after in self._samples(
                    walker, part, parts, sample_no, errors
                ):
                    block.append(sample)
                    size += sample_bytes
                    if after is None:
                        break
                    if len(block) >= self.block_samples or size >= self.block_bytes:
                        yield block, after
                        block, size = [], 0
            except BadRecordError as error:  # raise mode: hand out the good samples first
                yield block, error.cursor  # type: ignore[attr-defined]
                raise
            if source.compression is not None:
                # Read past the end-of-archive marker to the end of the compressed stream,
                # so that its checksum (gzip's CRC) is verified; a mismatch raises or counts.
                try:
                    while f.read(1 << 16):
                        pass
                except BadRecordError as error:
                    if part == 0:  # one report per file, however many consumers share it
                        errors.handle(error)
            yield block, None

    def _samples(
        self, walker: _TarWalker, part: int, parts: int, sample_no: int, errors: ErrorPolicy
    ) -> Iterator[tuple[dict[str, Any], int, Cursor]]:
        """(sample, its data size, cursor after it) for this part's samples.

        A bad sample (a repeated field) is skipped or raised by its owner; a
        truncated or corrupt archive ends the file, reported by the owner of
        the sample it broke.
        """
        url = walker.url
        try:
            member = self._next(walker)
        except BadRecordError as fatal:  # the archive is broken before this sample starts
            if sample_no % parts == part:
                self._report(fatal, [walker.offset, sample_no], errors)
            return
        while member is not None:
            key = member[1][0]
            start = member[0].offset
            mine = sample_no % parts == part
            sample: dict[str, Any] = {"__key__": key, "__url__": url}
            size = 0
            problem: BadRecordError | None = None
            try:
                while member is not None and member[1][0] == key:
                    info, (_, field) = member
                    if not mine or problem is not None:
                        walker.skip(_padded(info.size))
                    elif field in sample:
                        problem = BadRecordError(
                            url,
                            f"member {info.name!r} at byte offset {info.offset}",
                            f"sample {key!r} has two {field!r} fields",
                        )
                        walker.skip(_padded(info.size))
                    else:
                        sample[field] = walker.data(info)
                        size += info.size
                    member = self._next(walker)
            except BadRecordError as fatal:
                if mine:
                    self._report(fatal, [start, sample_no], errors)
                return
            if problem is not None:
                if mine:
                    self._report(problem, [start, sample_no], errors)
            elif mine:
                yield sample, size, None if member is None else [member[0].offset, sample_no + 1]
            sample_no += 1

    @staticmethod
    def _report(error: BadRecordError, cursor: Cursor, errors: ErrorPolicy) -> None:
        error.cursor = cursor  # type: ignore[attr-defined]  # where a resume meets it again
        errors.handle(error)

    @staticmethod
    def _next(walker: _TarWalker) -> tuple[_Member, tuple[str, str]] | None:
        """The next member that is a sample field, with its (key, field)."""
        while True:
            member = walker.next_member()
            if member is None:
                return None
            named = split_name(member.name)
            if named is not None:
                return member, named
            walker.skip(_padded(member.size))


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK
