"""Tar archives with webdataset conventions: consecutive members sharing a key form a sample.

A member ``dir/img001.seg.png`` has key ``dir/img001`` and field
``seg.png``; the sample is ``{"__key__": "dir/img001", "__url__": url,
"seg.png": b"..."}``. Members whose name has no extension, directories,
links and hidden files (``._x``) are not fields, as in webdataset.

Headers are parsed directly (nodes.readers.tar.walker), so a reader can
start at any member: the cursor is ``[header offset, sample number]``, and a
resume opens the file there, whatever the position (it checks that the
header there is valid and starts a sample field; it reads nothing before).
A file is split among consumers by samples: part ``p`` of ``n`` takes
samples ``p, p + n, ...`` and seeks past the others' data.

Damage is never read as the end: the archive ends with its end-of-archive
marker (two zero blocks) followed by no valid header. EOF before it, a zero
block where a header should be, a header whose checksum fails, or two zero
blocks followed by a valid header (zeroed bytes inside the archive, or
archives concatenated with ``cat``) is a :class:`BadRecordError` naming the
file and byte offset. Under ``on_error="skip"`` the reader resynchronises on
the next header whose checksum verifies and reads on; the damaged range is
one counted loss, and a sample next to it that lacks a field the sample
across the damage has is a bad record (nodes.readers.tar.damage). Samples
wholly inside damaged bytes cannot be counted: ``losses()["records"]`` is
then a lower bound. Limits: a member whose data holds a valid tar header (a
tar inside a tar) can be taken for a header when resynchronising inside it;
the member of a pax or GNU long-name header whose own block is damaged is
read under the name in its own header (truncated, non-ASCII as ``?``).
A member named with ``..`` components or an absolute path, and a key that
appears again after other keys within one block (webdataset would yield two
samples with that key), make a bad sample.

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
from nodes.readers.tar.cursor import check_tar_cursor
from nodes.readers.tar.damage import BlockMemory, Group, Loss
from nodes.readers.tar.header import parse_header
from nodes.readers.tar.walker import BLOCK, REGULAR, Member, TarWalker, padded_size
from nodes.storage import SourceFile, read_full


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
            walker = TarWalker(f, source.url, offset, source.seekable)
            if resume is not None:
                resume.check_header(walker)
            block: list[Any] = []
            size = 0
            # What was read since this block's start cursor: a resume starts there knowing
            # nothing, so repeats and damage are judged alike in a resumed and an
            # uninterrupted run.
            memory = BlockMemory()
            reading = _Reading(walker, part, parts, memory, Loss(source, errors))
            try:
                for sample, sample_bytes, after, may_end in reading.samples(sample_no, resume):
                    block.append(sample)
                    size += sample_bytes
                    if after is None:
                        break
                    full = len(block) >= self.block_samples or size >= self.block_bytes
                    if full and may_end:
                        yield block, after
                        block, size = [], 0
                        memory.clear()  # a new block starts at ``after`` (nothing of it read)
            except BadRecordError as error:  # raise mode: hand out the good samples first
                # A state taken after this raise resumes at the bad sample, which then starts
                # a block: a repeated key is read there as a sample (a repeat across blocks).
                yield block, error.cursor  # type: ignore[attr-defined]
                raise
            if source.compression is not None:
                # Read past the end-of-archive marker to the end of the compressed stream,
                # so that its checksum (gzip's CRC) is verified; a mismatch raises or counts.
                try:
                    if walker.stream_error is not None:  # found looking past the end marker
                        raise walker.stream_error
                    while f.read(1 << 16):
                        pass
                except BadRecordError as error:
                    if part == 0:  # one report per file, however many consumers share it
                        errors.lose(error, whole_file=False)
            yield block, None


_Field = tuple[Member, tuple[str, str]]  # a member that is a sample field, its (key, field)


class _Reading:
    """This consumer's samples of one archive read from a cursor, damage skipped or raised."""

    def __init__(
        self, walker: TarWalker, part: int, parts: int, memory: BlockMemory, loss: Loss
    ) -> None:
        self.walker, self.part, self.parts = walker, part, parts
        self.memory, self.loss, self.url = memory, loss, walker.url

    def samples(
        self, sample_no: int, resume: _Resume | None
    ) -> Iterator[tuple[dict[str, Any], int, Cursor, bool]]:
        """(sample, its data size, cursor after it, whether a block may end after it).

        A sample next to damaged bytes is judged once the sample on the other
        side is read (both are then in one block, so a resume judges alike):
        it is handed out only if it lacks no field of that sample.
        """
        held: Group | None = None  # a sample next to damage, awaiting the sample after it
        for group in self._groups(sample_no, resume):
            before, held = held, None
            if before is not None:
                before.judge(group.fields, self.url)
                if group.damaged_before:
                    group.judge(before.fields, self.url)
                yield from self._out(before, may_end=not before.damaged_after)
            if group.damaged_after or (group.damaged_before and before is None):
                held = group  # after damage with nothing before it: judged by the next one
                continue
            yield from self._out(group, may_end=True)
        if held is not None and held.damaged_after:  # damage to the end: judged by the last
            held.judge(self.memory.last, self.url)
        if held is not None:
            yield from self._out(held, may_end=True)

    def _out(
        self, group: Group, may_end: bool
    ) -> Iterator[tuple[dict[str, Any], int, Cursor, bool]]:
        """Hand out a sample of this consumer's, or raise or count it as a bad record."""
        if group.problem is None and not group.counted:
            self.memory.last = group.fields
        if not group.mine or group.counted:
            return
        if group.problem is not None:
            group.problem.cursor = [group.start, group.number]  # type: ignore[attr-defined]
            self.loss.errors.handle(group.problem)
            return
        yield group.sample, group.size, group.after, may_end

    def _groups(self, sample_no: int, resume: _Resume | None) -> Iterator[Group]:
        """Every sample's members in order (data read for this consumer's), damage skipped."""
        walker, url = self.walker, self.url
        start = [walker.offset, sample_no]
        if resume is not None:  # a cursor is where a sample's valid headers start
            try:
                member = self._next()
            except BadRecordError:
                raise resume.refuse("damaged bytes follow the header there") from None
            resume.check_member(member)
            damaged = False
        else:
            member, damaged = self._next_across(start, self._mine(sample_no))
        while member is not None:
            info, (key, _) = member
            group = Group(key, info.offset, sample_no, self._mine(sample_no), url)
            group.damaged_before, damaged = damaged, False
            group.problem = _key_problem(url, info, key, self.memory.seen)
            self.memory.seen.add(key)
            while member is not None and member[1][0] == key:
                info, (_, field) = member
                if field in group.fields and group.problem is None:
                    group.problem = BadRecordError(
                        url,
                        f"member {info.name!r} at byte offset {info.offset}",
                        f"sample {key!r} has two {field!r} fields",
                    )
                group.fields.add(field)
                if group.mine and group.problem is None:
                    try:
                        group.sample[field] = walker.data(info)
                    except BadRecordError as cut:  # the file ends inside this member
                        group.counted = True  # the lost range counts this sample as a record
                        self.loss.gap(walker, cut, [group.start, sample_no], True, records=1)
                        member, damaged = None, True
                        break
                    group.size += info.size
                else:
                    walker.skip(padded_size(info.size))
                member, damaged = self._next_across([group.start, sample_no], group.mine)
            group.damaged_after = damaged
            group.after = None if member is None else [member[0].offset, sample_no + 1]
            yield group
            sample_no += 1

    def _mine(self, sample_no: int) -> bool:
        return sample_no % self.parts == self.part

    def _next_across(self, cursor: Cursor, report: bool) -> tuple[_Field | None, bool]:
        """The next sample field (None at the end), and whether damaged bytes were skipped.

        Damage raises (every consumer of the file raises: none may end it silently),
        or is counted by the consumer that ``report``s it and skipped.
        """
        damaged = False
        while True:
            try:
                return self._next(), damaged
            except BadRecordError as error:
                damaged = True
                if not self.loss.gap(self.walker, error, cursor, report):
                    return None, damaged

    def _next(self) -> _Field | None:
        """The next member that is a sample field, with its (key, field)."""
        while True:
            member = self.walker.next_member()
            if member is None:
                return None
            named = split_name(member.name)
            if named is not None:
                return member, named
            self.walker.skip(padded_size(member.size))


def _key_problem(url: str, member: Member, key: str, seen: set[str]) -> BadRecordError | None:
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

    def check_header(self, walker: TarWalker) -> None:
        """Read the block at the cursor (kept for the walker): a valid header it may read."""
        buf = read_full(walker.f, BLOCK)
        if len(buf) < BLOCK:
            raise self.refuse("past the end of the archive")
        if buf == bytes(BLOCK):
            raise self.refuse("a zero block (the end-of-archive marker, or damage) is there")
        try:
            info = parse_header(buf)
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
_STARTS = (*REGULAR, tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)
