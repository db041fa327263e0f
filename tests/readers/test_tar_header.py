"""The tar header fast path reads every block exactly as tarfile does, or refuses it alike."""

from __future__ import annotations

import random
import tarfile

import pytest

from nodes.readers.tar import header
from nodes.readers.tar.header import BLOCK, Header, parse_header

FORMATS = (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)
TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.CONTTYPE)
NAMES = ("e0.jpg", "shard/e0.seg.png", "dir/", "a" * 99, "d" * 120 + "/x.cls", "é/ü.txt")


def tarfile_reading(buf: bytes) -> Header | str:
    try:
        info = tarfile.TarInfo.frombuf(buf, "utf-8", "surrogateescape")
    except tarfile.HeaderError as error:
        return type(error).__name__
    return Header(info.name, info.size, info.type)


def fast_reading(buf: bytes) -> Header | str:
    try:
        return parse_header(buf)
    except tarfile.HeaderError as error:
        return type(error).__name__


def headers(rng: random.Random) -> list[bytes]:
    """The first header block of members of every format, type and kind of name."""
    out = []
    for fmt in FORMATS:
        for kind in TYPES:
            for name in NAMES:
                info = tarfile.TarInfo(name)
                info.type, info.size = kind, rng.choice([0, 1, 511, 512, 10**6, 8**11 - 1])
                info.mtime, info.uid = rng.randrange(2**33), rng.randrange(2**21)
                try:
                    out.append(info.tobuf(fmt, "utf-8", "surrogateescape")[:BLOCK])
                except ValueError:  # a name or number this format cannot hold
                    continue
    return out


def set_checksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)


def mutated(block: bytes, rng: random.Random) -> bytes:
    """The block with a few bytes changed, the checksum fixed or not; numbers in other
    spellings (spaces, NULs, base-256, whitespace) as some writers put them."""
    changed = bytearray(block)
    for _ in range(rng.randint(1, 3)):
        where = rng.choice([rng.randrange(BLOCK), rng.randrange(100, 160), 156, 345])
        changed[where] = rng.choice([0, 32, 9, 0x80, 0xFF, ord("7"), ord("8"), ord("/"), 0xC3])
    if rng.random() < 0.3:
        changed[124:136] = rng.choice([b" 1750\0      ", b"\x80" + bytes(10) + b"\x05", b"\t17\0"])
    if rng.random() < 0.8:
        set_checksum(changed)
    return bytes(changed)


def test_the_fast_path_reads_every_header_as_tarfile_does():
    rng = random.Random(29)
    blocks = headers(rng)
    blocks += [mutated(rng.choice(blocks), rng) for _ in range(4000)]
    blocks += [bytes(BLOCK), bytes(BLOCK - 1), b"x" * BLOCK]
    fast = 0
    for block in blocks:
        assert fast_reading(block) == tarfile_reading(block), block
        fast += header._plain(block) is not None
    # the test means something only if both paths ran many times
    assert fast > 300 and len(blocks) - fast > 1000


def test_a_plain_header_takes_the_fast_path_and_a_signed_checksum_the_slow_one():
    info = tarfile.TarInfo("shard/e0.jpg")
    info.size = 1234
    block = info.tobuf(tarfile.USTAR_FORMAT)[:BLOCK]
    assert header._plain(block) == Header("shard/e0.jpg", 1234, tarfile.REGTYPE)
    high = bytearray(block)
    high[500] = 0xF0  # unused bytes: only the signed sum of old writers differs
    high[148:156] = b" " * 8
    signed = sum(b - 256 if b > 127 else b for b in high)
    high[148:156] = b"%06o\0 " % signed
    assert header._plain(bytes(high)) is None
    assert parse_header(bytes(high)).name == "shard/e0.jpg"


@pytest.mark.parametrize("field", [(100, 108), (136, 148), (329, 337)])
def test_garbage_in_any_number_is_refused_as_tarfile_refuses_it(field):
    info = tarfile.TarInfo("e0.jpg")
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT)[:BLOCK])
    start, end = field
    block[start:end] = b"12x4".ljust(end - start, b"\0")
    set_checksum(block)
    with pytest.raises(tarfile.HeaderError):
        parse_header(bytes(block))
