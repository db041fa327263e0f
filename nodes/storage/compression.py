"""Compressed files read as their decompressed bytes, with errors that name the file."""

from __future__ import annotations

import io
import lzma
import zlib
from typing import Any

from fsspec.compression import compr

from nodes.errors import BadRecordError
from nodes.storage.retry import ReadFailedError
from nodes.storage.streams import _CountedStream, _ReadOnlyStream, skip_forward
from nodes.storage.zstd_blocks import ZstdBlockEnds


def decompressing(raw: io.RawIOBase, url: str, codec: str) -> Decompressed:
    """``raw``'s decompressed content, for a ``codec`` fsspec names (``"gzip"``, ``"zstd"``).

    ``raw`` is closed with the stream; a codec without a decompressor is an
    ``ImportError`` (and closes ``raw``).
    """
    if codec == "zstd":
        decompressor = ZstdReader(raw, url)
    elif codec in compr:
        decompressor = compr[codec](raw, mode="rb")
    else:
        raw.close()
        raise ImportError(f"{url}: no decompressor for {codec} files")
    return Decompressed(decompressor, raw, url, codec)


class Decompressed(_ReadOnlyStream):
    """A decompressing stream that names its file when the data is corrupt or truncated.

    A decoder error (a truncated gzip, a bad CRC, corrupt xz or zstd data)
    becomes a :class:`BadRecordError` naming the URL and the decompressed
    offset; it also closes the file under it, which gzip leaves to the GC.
    """

    def __init__(self, stream: Any, raw: io.RawIOBase, url: str, codec: str) -> None:
        super().__init__()
        self._stream, self._raw, self._url, self._codec = stream, raw, url, codec

    def read(self, size: int = -1) -> bytes:
        try:
            return self._stream.read(size)
        except ReadFailedError:
            raise
        except (EOFError, OSError, ValueError, zlib.error, lzma.LZMAError) as error:
            raise self._corrupt(error) from error
        except Exception as error:  # noqa: BLE001 - decoder libraries have their own errors
            if type(error).__module__.split(".")[0] not in ("zstandard", "compression"):
                raise
            raise self._corrupt(error) from error

    def _corrupt(self, error: Exception) -> BadRecordError:
        try:
            where = f"decompressed byte offset {self._stream.tell()}"
        except Exception:  # noqa: BLE001 - a broken decoder may not know its position
            where = "decompressing"
        return BadRecordError(
            self._url, where, f"corrupt or truncated {self._codec} data: {error or type(error)}"
        )

    def seekable(self) -> bool:
        return True  # forward by decompressing; gzip and bz2 also rewind by restarting

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()

    def close(self) -> None:
        if not self.closed:
            try:
                self._stream.close()
            finally:
                self._raw.close()
                super().close()


#: zstd blocks handed to the decoder per call: each makes 128 KiB at most, so one call makes
#: 1 MiB at most, however dense the file (a bomb's 64 KB can hold 16,000 blocks).
BLOCKS_PER_CALL = 8


class ZstdReader(_CountedStream):
    """zstd frames, decompressed in order; a file that ends inside a frame is an error.

    (zstandard's own ``stream_reader`` returns a truncated frame's bytes as if
    the file ended there, which would drop the rest silently.) The decoder gets
    :data:`BLOCKS_PER_CALL` blocks at a time (:mod:`nodes.storage.zstd_blocks` finds
    where they end), and no more once a read has what it asked for: a read holds about
    1 MiB beyond its size at most, whatever the file holds.
    """

    def __init__(self, raw: io.RawIOBase, url: str, chunk: int = 1 << 16) -> None:
        super().__init__()
        try:
            import zstandard
        except ImportError as error:
            raise ImportError(
                f"{url}: reading .zst files needs zstandard (pip install zstandard)"
            ) from error
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._raw, self._chunk = raw, chunk
        self._frame = self._new()
        self._in_frame = False
        self._buffer = bytearray()
        self._pos = 0
        self._raw_done = False
        # Compressed bytes read but not decoded yet, a few blocks a piece: a read that
        # filled the buffer leaves the rest of its pieces for the next one.
        self._pending: list[bytes] = []
        self._blocks = ZstdBlockEnds()

    def _fill(self, wanted: int) -> None:
        while wanted < 0 or len(self._buffer) < wanted:
            if not self._pending:
                if self._raw_done:
                    return
                data = self._raw.read(self._chunk)
                if not data:
                    self._raw_done = True
                    if self._in_frame:
                        raise EOFError("the file ends inside a zstd frame (truncated)")
                    return
                ends = self._blocks.ends(data) if self._blocks.valid else []
                cuts = [*ends[BLOCKS_PER_CALL - 1 :: BLOCKS_PER_CALL], len(data)]
                self._pending = [data[a:b] for a, b in zip([0, *cuts], cuts) if b > a]
            self._decompress(self._pending.pop(0))

    def _decompress(self, data: bytes) -> None:
        while data:
            if self._frame.eof:  # a new frame follows
                self._frame = self._new()
            self._buffer += self._frame.decompress(data)
            self._in_frame = not self._frame.eof
            data = self._frame.unused_data if self._frame.eof else b""

    def read(self, size: int = -1) -> bytes:
        self._fill(size)
        if size < 0 or size >= len(self._buffer):
            out, self._buffer = bytes(self._buffer), bytearray()
        else:
            out = bytes(self._buffer[:size])
            del self._buffer[:size]
        self._pos += len(out)
        return out

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = self._target(offset, whence)
        if target < self._pos:
            raise io.UnsupportedOperation("a zstd stream only seeks forward")
        skip_forward(self, target)
        return self._pos
