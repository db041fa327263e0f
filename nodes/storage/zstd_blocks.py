"""Where zstd blocks end in a stream of compressed bytes, so no decompression call makes more
than a few blocks' output.

zstandard's ``decompressobj`` has no output cap: one call on 64 KB of a bomb makes
gigabytes. A zstd block decompresses to 128 KiB at most, whatever its compressed size,
so feeding the decoder a few blocks at a time bounds what one call makes. This module
reads only the frame and block headers (RFC 8878, section 3.1) to find those ends;
the decoder still checks everything.
"""

from __future__ import annotations

#: The magic number of a zstd frame, and the mask of the skippable frames' magic numbers.
_FRAME = 0xFD2FB528
_SKIPPABLE, _SKIPPABLE_MASK = 0x184D2A50, 0xFFFFFFF0
#: Bytes of the dictionary id by its flag, and of the content size by its flag.
_DICT_ID_BYTES = (0, 1, 2, 4)
_CONTENT_SIZE_BYTES = (0, 2, 4, 8)
_RLE, _RESERVED = 1, 3


class ZstdBlockEnds:
    """Fed the compressed bytes in order, says where each zstd block ends.

    ``valid`` turns False at bytes that are no zstd frame (the decoder then reports
    them); from there on no ends are given.

    >>> import zstandard
    >>> data = zstandard.ZstdCompressor().compress(b"a" * 300_000)
    >>> ends = ZstdBlockEnds().ends(data)
    >>> len(ends) >= 3 and ends[-1] <= len(data)  # 300 kB is three blocks at least
    True
    """

    def __init__(self) -> None:
        self.valid = True
        self._field = bytearray()  # the bytes of the header field being read
        self._want = 4  # its size
        self._state = "magic"
        self._skip = 0  # bytes to pass over (a frame header's rest, a block body, ...)
        self._after_skip = "block"
        self._checksum = False
        self._last = False

    def ends(self, data: bytes) -> list[int]:
        """The offsets in ``data`` (after the bytes fed before) at which blocks end."""
        found: list[int] = []
        at, size = 0, len(data)
        while at < size and self.valid:
            if self._skip:
                step = min(self._skip, size - at)
                at += step
                self._skip -= step
                if not self._skip:
                    self._skipped(found, at)
                continue
            step = min(self._want - len(self._field), size - at)
            self._field += data[at : at + step]
            at += step
            if len(self._field) == self._want:
                value = int.from_bytes(self._field, "little")
                self._field.clear()
                self._read(value, found, at)
        return found

    def _expect(self, state: str, want: int) -> None:
        self._state, self._want = state, want

    def _pass(self, count: int, then: str, found: list[int], at: int) -> None:
        self._after_skip = then
        self._skip = count
        if not count:
            self._skipped(found, at)

    def _skipped(self, found: list[int], at: int) -> None:
        then = self._after_skip
        if then == "block end":
            found.append(at)
            if self._last:
                self._pass(4 if self._checksum else 0, "frame", found, at)
            else:
                self._expect("block", 3)
        elif then == "frame":
            self._expect("magic", 4)
        else:
            self._expect("block", 3)

    def _read(self, value: int, found: list[int], at: int) -> None:
        state = self._state
        if state == "magic":
            if value == _FRAME:
                self._expect("descriptor", 1)
            elif value & _SKIPPABLE_MASK == _SKIPPABLE:
                self._expect("skippable size", 4)
            else:
                self.valid = False
        elif state == "skippable size":
            self._pass(value, "frame", found, at)
        elif state == "descriptor":
            single_segment = (value >> 5) & 1
            self._checksum = bool((value >> 2) & 1)
            content_flag = value >> 6
            content = _CONTENT_SIZE_BYTES[content_flag] or (1 if single_segment else 0)
            rest = (0 if single_segment else 1) + _DICT_ID_BYTES[value & 3] + content
            self._pass(rest, "block", found, at)
        else:  # a block header
            self._last = bool(value & 1)
            kind, size = (value >> 1) & 3, value >> 3
            if kind == _RESERVED:
                self.valid = False
                return
            self._pass(1 if kind == _RLE else size, "block end", found, at)
