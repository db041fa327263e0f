"""Reading tar headers one after another from any header offset, and resynchronising on damage.

Headers are parsed directly (ustar, GNU long names, pax paths). Damage where
a header should be (a block that is no valid header, a zero block that does
not end the archive, the file ending without the end-of-archive marker) is a
:class:`BadRecordError` whose ``at`` attribute is the byte offset where the
damage starts; :meth:`TarWalker.resync` then scans on, block by block, to the
next header whose checksum verifies.
"""

from __future__ import annotations

import tarfile
from typing import Any

from nodes.errors import BadRecordError
from nodes.readers.tar.header import BLOCK, parse_header
from nodes.storage import read_full, skip_forward

REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


class Member:
    """A regular-file member: its name, first header offset, data offset and size."""

    __slots__ = ("name", "offset", "data_offset", "size")

    def __init__(self, name: str, offset: int, data_offset: int, size: int) -> None:
        self.name, self.offset, self.data_offset, self.size = name, offset, data_offset, size


def damage(url: str, where: str, reason: str, at: int) -> BadRecordError:
    """A :class:`BadRecordError` for damaged bytes starting at byte offset ``at``."""
    error = BadRecordError(url, where, reason)
    error.at = at  # type: ignore[attr-defined]
    return error


def valid_header(block: bytes) -> bool:
    """Whether a block is a tar header whose checksum verifies (a zero block is none)."""
    if len(block) < BLOCK or block == bytes(BLOCK):
        return False
    try:
        parse_header(block)
    except tarfile.HeaderError:
        return False
    return True


class TarWalker:
    """Reads member headers one after another from a byte offset, fetching data on request."""

    def __init__(self, f: Any, url: str, offset: int, seekable: bool) -> None:
        self.f, self.url, self.offset, self.seekable = f, url, offset, seekable
        self.pending = b""  # a header block read ahead (a resume's check, a resync), taken first
        self.orphan = False  # an extended header was corrupt: its member's name is unknown
        self.stream_error: BadRecordError | None = None  # a compressed stream failed past the end

    def _read(self, size: int, what: str) -> bytes:
        data = read_full(self.f, size)
        self._check_complete(data, size, what)
        self.offset += size
        return data

    def _check_complete(self, data: bytes, size: int, what: str) -> None:
        if len(data) < size:
            raise damage(
                self.url,
                f"{what} at byte offset {self.offset}",
                f"truncated archive: needed {size} bytes, the file ends after {len(data)}",
                self.offset,
            )

    def next_member(self) -> Member | None:
        """The next regular-file member (its data not yet read), or None at the end."""
        long_name: str | None = None
        first_header = self.offset  # a long-name or pax header comes before the member's own
        while True:
            header_offset = self.offset
            try:
                buf, self.pending = self.pending or read_full(self.f, BLOCK), b""
                if not buf:
                    raise damage(
                        self.url,
                        f"byte offset {header_offset}",
                        "truncated archive: the file ends without the end-of-archive marker "
                        "(two zero blocks), so members after this point may be missing",
                        header_offset,
                    )
                self._check_complete(buf, BLOCK, "header")
                self.offset += BLOCK
                if buf == bytes(BLOCK) and self._end_marker(header_offset, long_name is not None):
                    return None
                member, long_name, skipped = self._member(
                    buf, header_offset, first_header, long_name
                )
            except BadRecordError as error:
                if not hasattr(error, "at"):
                    error.at = header_offset  # type: ignore[attr-defined]
                raise
            if member is not None:
                return member
            if skipped:  # a member that is no regular file: the next one starts after it
                first_header = self.offset

    def _member(
        self, buf: bytes, offset: int, first_header: int, long_name: str | None
    ) -> tuple[Member | None, str | None, bool]:
        """(the regular-file member of header ``buf`` or None, the name for the next member,
        whether a member that is no regular file was skipped)."""
        try:
            info = parse_header(buf)
        except tarfile.HeaderError as error:
            raise BadRecordError(
                self.url, f"header at byte offset {offset}", f"corrupt header: {error}"
            ) from None
        padded = padded_size(info.size)
        if info.type == tarfile.GNUTYPE_LONGNAME:
            self.orphan = True  # until its content is read: the member's name is then known
            data = self._read(padded, "long name")
            self.orphan = False
            return None, data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape"), False
        if info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
            self.orphan = True
            data = self._read(padded, "pax header")[: info.size]
            try:
                name = _pax_path(data) or long_name
            except ValueError as error:
                raise BadRecordError(
                    self.url, f"pax header at byte offset {offset}", f"corrupt: {error}"
                ) from None
            self.orphan = False
            return None, name, False
        if info.type in REGULAR:
            member = Member(long_name or info.name, first_header, self.offset, info.size)
            return member, None, False
        self.skip(padded)
        return None, None, True

    def _end_marker(self, offset: int, named: bool) -> bool:
        """Whether the zero block at ``offset`` starts the end-of-archive marker (else raise).

        Two zero blocks are the end only where no valid header follows them:
        zeroed bytes inside an archive are damage, not its end.
        """
        after = read_full(self.f, BLOCK)
        self.offset += len(after)
        where = f"header at byte offset {offset}"
        if after == bytes(BLOCK) and not named:
            try:
                header = self.resync()
            except BadRecordError as error:  # a compressed stream fails past the marker (CRC)
                self.stream_error = error
                return True
            if header is None:
                return True  # only zeros (padding) or bytes that are no header follow
            raise damage(
                self.url,
                where,
                "two zero blocks (an end-of-archive marker) followed by a valid tar header at "
                f"byte offset {header}: zeroed bytes inside the archive, or archives "
                "concatenated (cat a.tar b.tar); read with on_error='skip' to resynchronise "
                "there (the damage is counted), or rewrite the shard",
                offset,
            )
        if len(after) < BLOCK and after == bytes(len(after)):
            reason = "truncated archive: the file ends inside the end-of-archive marker"
        else:
            if len(after) == BLOCK:  # it may be the next valid header: a resync looks at it
                self.pending, self.offset = after, self.offset - BLOCK
            reason = (
                "a zero block where a member header should be (a zeroed or lost header: "
                "the end-of-archive marker is two zero blocks at the end)"
            )
        raise damage(self.url, where, reason, offset)

    def resync(self) -> int | None:
        """Scan on to the next valid header (taken next): its offset, or None at the file's end.

        The member of a corrupt extended header (pax, GNU long name) is skipped too:
        its own header holds a truncated or ASCII-replaced name, not its real one.
        """
        while True:
            buf, self.pending = self.pending or read_full(self.f, BLOCK), b""
            if len(buf) < BLOCK:
                self.offset += len(buf)
                return None
            self.offset += BLOCK
            if not valid_header(buf):
                continue
            if not self.orphan:
                self.pending, self.offset = buf, self.offset - BLOCK
                return self.offset
            self.orphan = False
            self.skip(padded_size(parse_header(buf).size))

    def data(self, member: Member) -> bytes:
        try:
            data = self._read(member.size, f"member {member.name!r}")
        except BadRecordError as error:
            error.at = member.offset  # type: ignore[attr-defined]  # the member is lost whole
            raise
        self.skip(padded_size(member.size) - member.size)
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


def padded_size(size: int) -> int:
    """``size`` rounded up to whole 512-byte blocks."""
    return -(-size // BLOCK) * BLOCK
