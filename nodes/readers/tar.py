"""Tar archives with webdataset conventions: consecutive members sharing a key form a sample.

A member ``dir/img001.seg.png`` has key ``dir/img001`` and field
``seg.png``; the sample is ``{"__key__": "dir/img001", "__url__": url,
"seg.png": b"..."}``. Members whose name has no extension, directories,
links and hidden files (``._x``) are not fields, as in webdataset.

Headers are parsed directly (ustar, GNU long names, pax paths), so a reader
can start at any member: the cursor is ``[header offset, sample number]``.
A resume walks the headers before the cursor (seeking past the data where
the file seeks), to know the keys seen so far and to check that the cursor
is where that sample starts. A file is split among consumers by samples:
part ``p`` of ``n`` takes samples ``p, p + n, ...`` and seeks past the
others' data.

Damage is never read as the end: the archive must end with its
end-of-archive marker (two zero blocks); EOF before it, a lone zero block
where a header should be, or a header whose checksum fails loses the rest of
the file (a :class:`BadRecordError`, or under ``on_error="skip"`` a counted
loss with the bytes not read). A member named with ``..`` components or an
absolute path, and a key that appears again after other keys (webdataset
would yield two samples with that key), make a bad sample.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import Any

from nodes.errors import BadRecordError, ErrorPolicy, InvalidStateError
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
        # Re-walking headers read before (a resume): plain ones are parsed without tarfile.
        self.quick = False

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
                info = (self.quick and _plain_header(buf)) or tarfile.TarInfo.frombuf(
                    buf, "utf-8", "surrogateescape"
                )
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


class _Header:
    __slots__ = ("name", "size", "type")

    def __init__(self, name: str, size: int, type: bytes) -> None:
        self.name, self.size, self.type = name, size, type


_USTAR = (b"ustar\x0000", b"ustar  \x00")


def _plain_header(buf: bytes) -> _Header | None:
    """Name, size and type of a plain ustar or GNU header, parsed as tarfile would, 15x faster.

    None for anything else (base-256 sizes, other magic), which tarfile then parses.
    Used only to re-walk headers read before, so the checksum is not verified again.
    """
    if buf[257:265] not in _USTAR or buf[124] & 0x80:
        return None
    type_ = buf[156:157]
    if type_ not in _PLAIN_TYPES:
        return None
    name = buf[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    try:
        size = int(buf[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    if type_ == tarfile.AREGTYPE and name.endswith("/"):
        type_ = tarfile.DIRTYPE
    if type_ == tarfile.DIRTYPE:
        name = name.rstrip("/")
    if buf[257:263] == b"ustar\x00":  # POSIX: the name may continue in the prefix field
        prefix = buf[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if prefix:
            name = prefix + "/" + name
    return _Header(name, size, type_)


_PLAIN_TYPES = (
    *_REGULAR,
    tarfile.DIRTYPE,
    tarfile.SYMTYPE,
    tarfile.LNKTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.XHDTYPE,
)


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
        # A resume walks the headers before the cursor to know the keys seen so far (a key
        # seen again is a bad sample): only headers are read where the file seeks; a
        # compressed file is decompressed from its start either way.
        with source.open(0) as f:
            walker = _TarWalker(f, source.url, 0, source.seekable)
            seen, first = _keys_before(walker, offset, sample_no) if offset else (set(), None)
            block: list[Any] = []
            size = 0
            loss = _Loss(source, errors)
            try:
                for sample, sample_bytes, after in self._samples(
                    walker, part, parts, sample_no, seen, loss, first
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
        first: _Field | None,
    ) -> Iterator[tuple[dict[str, Any], int, Cursor]]:
        """(sample, its data size, cursor after it) for this part's samples.

        A bad sample (a repeated field, a key seen before, an unsafe name) is
        skipped or raised by its owner; a truncated or damaged archive ends the
        file, reported (with what was lost) by the owner of the sample it broke.
        """
        url = walker.url
        before = walker.offset
        try:
            member = first or self._next(walker)
        except BadRecordError as fatal:  # the archive is broken before this sample starts
            if sample_no % parts == part:
                loss.rest(fatal, [before, sample_no])
            return
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
            f"the key {key!r} appeared before, not next to this member: a sample's members "
            "must be consecutive (write each sample's files together, e.g. sorted by key)",
        )
    return None


def _keys_before(
    walker: _TarWalker, offset: int, sample_no: int
) -> tuple[set[str], _Field | None]:
    """The keys of the samples before a resume cursor, and the member at it if read already.

    The walker, started at the archive's start, ends at ``offset`` (or just
    past the header of the member there). A cursor that is not where sample
    ``sample_no`` starts (a changed file, an edited state) is refused rather
    than read from.
    """
    seen: set[str] = set()
    key = None
    count = 0  # samples started: a key seen again starts a (bad) sample of its own
    walker.quick = True
    while True:
        if walker.offset == offset and count == sample_no:
            walker.quick = False
            return seen, None
        member = None
        if walker.offset < offset:
            try:
                member = TarFormat._next(walker)
            except BadRecordError:
                pass  # damage before the cursor: no reader could have got past it
        if member is None or member[0].offset >= offset:
            break
        if member[1][0] != key:
            key = member[1][0]
            seen.add(key)
            count += 1
        walker.skip(_padded(member[0].size))
    walker.quick = False
    if member is not None and member[0].offset == offset and count == sample_no:
        return seen, member
    raise InvalidStateError(
        "reader state.cursor",
        f"[the byte offset where a sample starts, its sample number] in {walker.url}",
        [offset, sample_no],
        note=f"{count} samples start before byte offset {offset}",
    )


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK
