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


#: Compressed bytes a zstd stream reads first (and at least): 32 bytes of the densest zstd
#: measured (64 MiB of one byte in 2 KB, level 19) make about 1 MiB.
_FIRST_READ = 32
#: Decompressed bytes a zstd read aims at; the compressed read is sized by the ratio seen.
_OUT_PER_READ = 1 << 20


class ZstdReader(_CountedStream):
    """zstd frames, decompressed in order; a file that ends inside a frame is an error.

    (zstandard's own ``stream_reader`` returns a truncated frame's bytes as if
    the file ended there, which would drop the rest silently.)
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
        self._next_read = _FIRST_READ  # grows to chunk where the data is not a bomb
        self._frame = self._new()
        self._in_frame = False
        self._buffer = bytearray()
        self._pos = 0
        self._raw_done = False

    def _fill(self, wanted: int) -> None:
        while not self._raw_done and (wanted < 0 or len(self._buffer) < wanted):
            data = self._raw.read(self._next_read)
            if not data:
                self._raw_done = True
                if self._in_frame:
                    raise EOFError("the file ends inside a zstd frame (truncated)")
                return
            produced = len(self._buffer)
            while data:
                if self._frame.eof:  # a new frame follows
                    self._frame = self._new()
                self._buffer += self._frame.decompress(data)
                self._in_frame = not self._frame.eof
                data = self._frame.unused_data if self._frame.eof else b""
            self._adapt(len(self._buffer) - produced)

    def _adapt(self, produced: int) -> None:
        """Size the next read of compressed bytes to yield about ``_OUT_PER_READ``, growing at
        most twofold: zstandard's decompressobj has no output cap, and 64 KB of a bomb is
        gigabytes at once. (A file dense only after a normal start can still make one read
        yield ``chunk`` times its ratio; an output-capped decoder, such as Python 3.14's
        ``compression.zstd``, would close that.)"""
        read = self._next_read
        grown = min(self._chunk, 2 * read)
        if produced:
            grown = max(_FIRST_READ, min(grown, int(_OUT_PER_READ * read / produced)))
        self._next_read = grown

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
