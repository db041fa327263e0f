"""Where zstd blocks end: found the same however the bytes are fed, never past them, and
given up (to the decoder's own error) at bytes that are no zstd frame."""

from __future__ import annotations

import os
import random

import zstandard

from nodes.storage.zstd_blocks import ZstdBlockEnds


def _frames() -> bytes:
    checked = zstandard.ZstdCompressor(write_checksum=True)
    unsized = zstandard.ZstdCompressor(write_content_size=False)
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"xxxxx"
    return (
        checked.compress(os.urandom(200_000) + b"a" * 500_000)
        + skippable
        + unsized.compress(b"hello " * 100_000)
    )


def test_block_ends_do_not_depend_on_how_the_bytes_are_fed() -> None:
    data = _frames()
    whole = ZstdBlockEnds().ends(data)
    assert len(whole) >= 8 and whole == sorted(set(whole)) and whole[-1] <= len(data)
    rng = random.Random(5)
    for _ in range(20):
        blocks, ends, at = ZstdBlockEnds(), [], 0
        while at < len(data):
            size = rng.randint(1, 5000)
            ends += [at + end for end in blocks.ends(data[at : at + size])]
            at += size
        assert ends == whole and blocks.valid


def test_each_block_decodes_to_at_most_128_kib() -> None:
    data = zstandard.ZstdCompressor(level=19).compress(b"z" * (8 << 20))
    decoder, before, largest = zstandard.ZstdDecompressor().decompressobj(), 0, 0
    for end in ZstdBlockEnds().ends(data):
        largest = max(largest, len(decoder.decompress(data[before:end])))
        before = end
    assert 0 < largest <= 128 << 10


def test_bytes_that_are_no_zstd_frame_are_given_up_on() -> None:
    for junk in (b"PK\x03\x04" + bytes(100), os.urandom(64), _frames()[:50] + b"\xff" * 64):
        blocks = ZstdBlockEnds()
        ends = blocks.ends(junk)
        assert all(0 < end <= len(junk) for end in ends)
    reserved = (0xFD2FB528).to_bytes(4, "little") + bytes([0x20, 0]) + (7).to_bytes(3, "little")
    blocks = ZstdBlockEnds()
    assert blocks.ends(reserved) == [] and not blocks.valid  # block type 3 is reserved
