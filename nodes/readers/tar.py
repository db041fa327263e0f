"""Tar archives with webdataset conventions: consecutive members sharing a key form a sample.

A member ``dir/img001.seg.png`` has key ``dir/img001`` and field
``seg.png``; the sample is ``{"__key__": "dir/img001", "__url__": url,
"seg.png": b"..."}``. Members whose name has no extension, directories,
links and hidden files (``._x``) are not fields, as in webdataset.

Headers are parsed directly (ustar, GNU long names, pax paths), so a reader
can start at any member: the cursor is ``[header offset, sample number]``,
and a resume opens the file there, whatever the position (it checks that the
header there is valid and starts a sample field; it reads nothing before).
A file is split among consumers by samples: part ``p`` of ``n`` takes
samples ``p, p + n, ...`` and seeks past the others' data.

Damage is never read as the end: the archive must end with its
end-of-archive marker (two zero blocks); EOF before it, a lone zero block
where a header should be, or a header whose checksum fails loses the rest of
the file (a :class:`BadRecordError`, or under ``on_error="skip"`` a counted
loss with the bytes not read). A member named with ``..`` components or an
absolute path, and a key that appears again after other keys within one
block (webdataset would yield two samples with that key), make a bad sample.

Keys are remembered per block (the samples read from a block's start cursor:
up to ``block_samples`` of this consumer's, with the others' and the bad ones
in between), because a resume re-reads its block from that cursor and knows
nothing before it: detection is then the same in a resumed run as in an
uninterrupted one. A key that reappears in a later block is not detected and
makes a second sample with that key.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import Any

from nodes.errors import BadRecordError, ErrorPolicy, InvalidStateError
from nodes.readers.format import Cursor, RecordFormat
from nodes.readers.tar_cursor import check_tar_cursor
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
        self.pending = b""  # a header block read ahead (a resume's check), taken first

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
            buf, self.pending = self.pending or read_full(self.f, BLOCK), b""
            if not buf:
                raise BadRecordError(
                    self.url,
                    f"byte offset {header_offset}",
                    "truncated archive: the file ends without the end-of-archive marker "
                    "(two zero blocks), so members after this point may be missing",
                )
            self._check_complete(buf, BLOCK, "header")
            self.offset += BLOCK
            if buf == bytes(BLOCK):
                if self._end_marker(header_offset, long_name is not None):
                    return None
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

    def _end_marker(self, offset: int, named: bool) -> bool:
        """Whether the zero block at ``offset`` starts the end-of-archive marker (else raise)."""
        after = read_full(self.f, BLOCK)
        self.offset += len(after)
        if after == bytes(BLOCK) and not named:
            return True
        if not after or after == bytes(len(after)):
            reason = "truncated archive: the file ends inside the end-of-archive marker"
        else:
            reason = (
                "a zero block where a member header should be (a zeroed or lost header: "
                "the end-of-archive marker is two zero blocks at the end)"
            )
        raise BadRecordError(self.url, f"header at byte offset {offset}", reason)

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
    """``(key, field)`` of a member name by webdataset rules, or None if it is not a field.

    The field is lower-cased, as webdataset does: ``e0.JPG`` is field ``jpg`` (and decoded
    as an image); the key keeps its case.

    >>> split_name("shard/e0.Seg.PNG")
    ('shard/e0', 'seg.png')
    """
    name = name.removeprefix("./")
    slash = name.rfind("/") + 1
    base = name[slash:]
    dot = base.find(".", 1 if base.startswith("_") else 0)
    if base.startswith(".") or dot <= 0:
        return None
    return name[: slash + dot], base[dot + 1 :].lower()


class TarFormat(RecordFormat):
    """Samples of a tar archive (a ``dict`` of bytes fields per key)."""

    name = "read_tar"

    def __init__(self, block_samples: int = 64, block_bytes: int = 1 << 23) -> None:
        self.block_samples = block_samples
        self.block_bytes = block_bytes

    def check_cursor(self, source: SourceFile, cursor: Cursor, path: str) -> None:
        check_tar_cursor(source, cursor, path)

    def blocks(
        self, source: SourceFile, part: int, parts: int, cursor: Cursor, errors: ErrorPolicy
    ) -> Iterator[tuple[list[Any], Cursor]]:
        offset, sample_no = (0, 0) if cursor is None else cursor
        resume = _Resume(source.url, offset, sample_no) if offset or sample_no else None
        if resume is not None:
            resume.check_offset()
        with source.open(offset) as f:
            walker = _TarWalker(f, source.url, offset, source.seekable)
            if resume is not None:
                resume.check_header(walker)
            block: list[Any] = []
            size = 0
            loss = _Loss(source, errors)
            # The keys read since this block's start cursor: a resume starts there with none,
            # so a repeat is found (or not) alike in a resumed and an uninterrupted run.
            seen: set[str] = set()
            try:
                for sample, sample_bytes, after in self._samples(
                    walker, part, parts, sample_no, seen, loss, resume
                ):
                    block.append(sample)
                    size += sample_bytes
                    if after is None:
                        break
                    if len(block) >= self.block_samples or size >= self.block_bytes:
                        yield block, after
                        block, size = [], 0
                        seen.clear()  # a new block starts at ``after`` (nothing of it read yet)
            except BadRecordError as error:  # raise mode: hand out the good samples first
                # A state taken after this raise resumes at the bad sample, which then starts
                # a block: a repeated key is read there as a sample (a repeat across blocks).
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
                        errors.lose(error, whole_file=False)
            yield block, None

    def _samples(
        self,
        walker: _TarWalker,
        part: int,
        parts: int,
        sample_no: int,
        seen: set[str],
        loss: _Loss,
        resume: _Resume | None,
    ) -> Iterator[tuple[dict[str, Any], int, Cursor]]:
        """(sample, its data size, cursor after it) for this part's samples.

        A bad sample (a repeated field, a key seen before, an unsafe name) is
        skipped or raised by its owner; a truncated or damaged archive ends the
        file, reported (with what was lost) by the owner of the sample it broke.
        """
        url = walker.url
        before = walker.offset
        try:
            member = self._next(walker)
        except BadRecordError as fatal:  # the archive is broken before this sample starts
            if sample_no % parts == part:
                loss.rest(fatal, [before, sample_no])
            return
        if resume is not None:
            resume.check_member(member)
        while member is not None:
            key = member[1][0]
            start = member[0].offset
            mine = sample_no % parts == part
            sample: dict[str, Any] = {"__key__": key, "__url__": url}
            size = 0
            problem = _key_problem(url, member[0], key, seen)
            seen.add(key)
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
                    loss.rest(fatal, [start, sample_no])
                return
            if problem is not None:
                if mine:
                    problem.cursor = [start, sample_no]  # type: ignore[attr-defined]
                    loss.errors.handle(problem)
            elif mine:
                yield sample, size, None if member is None else [member[0].offset, sample_no + 1]
            sample_no += 1

    @staticmethod
    def _next(walker: _TarWalker) -> _Field | None:
        """The next member that is a sample field, with its (key, field)."""
        while True:
            member = walker.next_member()
            if member is None:
                return None
            named = split_name(member.name)
            if named is not None:
                return member, named
            walker.skip(_padded(member.size))


_Field = tuple[_Member, tuple[str, str]]  # a member that is a sample field, its (key, field)


class _Loss:
    """Reports the loss of the rest of an archive: where it broke, and the bytes after that."""

    def __init__(self, source: SourceFile, errors: ErrorPolicy) -> None:
        self.source, self.errors = source, errors

    def rest(self, error: BadRecordError, cursor: Cursor) -> None:
        error.cursor = cursor  # type: ignore[attr-defined]  # where a resume meets it again
        if not self.errors.skip:
            raise error
        # Lost: the file from the start of the sample that broke (nothing of it was handed
        # out); its size is known where the stored file is the archive itself.
        nbytes = None
        if self.source.compression is None:
            try:
                size = self.source.size()
            except OSError:
                size = None
            nbytes = None if size is None else max(0, size - cursor[0])
        self.errors.lose(error, whole_file=cursor[0] == 0, nbytes=nbytes)


def _key_problem(url: str, member: _Member, key: str, seen: set[str]) -> BadRecordError | None:
    """Why the sample starting with ``member`` must not be read (None: it may)."""
    where = f"member {member.name!r} at byte offset {member.offset}"
    parts = member.name.replace("\\", "/").split("/")
    drive = len(parts[0]) == 2 and parts[0][1] == ":" and parts[0][0].isalpha()  # C:/x
    if member.name.startswith(("/", "\\")) or ".." in parts or drive:
        return BadRecordError(
            url,
            where,
            "an absolute member name or one with '..' components is refused (extracted, it "
            "would land outside the archive's directory); rename the member when writing",
        )
    if key in seen:
        return BadRecordError(
            url,
            where,
            f"the key {key!r} appeared before in this block of samples, not next to this "
            "member: a sample's members must be consecutive (write each sample's files "
            "together, e.g. sorted by key)",
        )
    return None


class _Resume:
    """Checks that a resume cursor points where a sample starts, reading nothing before it.

    Every cursor a reader hands out is the first header (a GNU long name or
    pax header, or the member's own) of a sample's first member. The header
    there must be valid, and the member it belongs to a sample field; a cursor
    that is not (moved, edited, or into a file that changed) is refused. What
    only the headers before it would tell is not checked: a cursor at the
    second member of a sample, or with another sample number, reads on from
    there (the number decides which consumer owns each sample after it).
    """

    def __init__(self, url: str, offset: int, sample_no: int) -> None:
        self.url, self.offset, self.sample_no = url, offset, sample_no

    def refuse(self, why: str) -> InvalidStateError:
        return InvalidStateError(
            "cursor",
            f"[the byte offset where a sample starts, its sample number] in {self.url}",
            [self.offset, self.sample_no],
            note=f"byte offset {self.offset}: {why}: the cursor was moved, or the file changed",
        )

    def check_offset(self) -> None:
        """Refuse an offset no header can be at, before the file is opened."""
        if self.offset < 0 or self.sample_no < 0:
            raise self.refuse("a negative offset or sample number")
        if self.offset == 0:  # only sample 0 can start at the archive's first byte
            raise self.refuse(f"sample {self.sample_no} cannot start at the archive's start")
        if self.offset % BLOCK:
            raise self.refuse(f"not a multiple of {BLOCK} (tar headers start at one)")

    def check_header(self, walker: _TarWalker) -> None:
        """Read the block at the cursor (kept for the walker): a valid header it may read."""
        buf = read_full(walker.f, BLOCK)
        if len(buf) < BLOCK:
            raise self.refuse("past the end of the archive")
        if buf == bytes(BLOCK):
            raise self.refuse("a zero block (the end-of-archive marker, or damage) is there")
        try:
            info = tarfile.TarInfo.frombuf(buf, "utf-8", "surrogateescape")
        except tarfile.HeaderError as error:
            raise self.refuse(f"no tar header there ({error})") from None
        if info.type not in _STARTS:
            raise self.refuse(f"the header of {info.name!r}, which is no regular file")
        walker.pending = buf

    def check_member(self, member: _Field | None) -> None:
        """The first sample field read from the cursor must be the member there."""
        if member is None or member[0].offset != self.offset:
            found = "no" if member is None else "the header of a member that is no"
            raise self.refuse(f"{found} sample field (a file named key.field)")


# Headers a sample's first member can start with: its own, a GNU long name, a pax header.
_STARTS = (*_REGULAR, tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK
