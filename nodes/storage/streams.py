"""Read-only streams: a file that retries its reads, and a forward-only stream made seekable."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import Any

from nodes.storage.retry import ReadFailedError, RetryPolicy, as_policy, with_retries
from nodes.storage.watchdog import Watchdog, progress


class _ReadOnlyStream(io.RawIOBase):
    """A readable raw stream whose subclasses define ``read``; ``readinto`` goes through it.

    ``close()`` also closes the file a subclass wraps as ``_file``, if any.
    """

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            try:
                wrapped = getattr(self, "_file", None)
                if wrapped is not None:
                    wrapped.close()
            finally:
                super().close()

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _CountedStream(_ReadOnlyStream):
    """A stream that knows its position (``_pos``) and resolves seek targets from it."""

    _pos = 0

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def _target(self, offset: int, whence: int) -> int:
        if whence == io.SEEK_CUR:
            offset += self._pos
        elif whence == io.SEEK_END:
            offset += self._end()
        if offset < 0:
            raise ValueError(f"negative seek position {offset}")
        return offset

    def _end(self) -> int:
        raise io.UnsupportedOperation(f"{type(self).__name__} cannot seek from its end")


class RetryingFile(_CountedStream):
    """A read-only file that reopens itself and retries a failed read within a retry policy.

    ``opener()`` returns a fresh binary file at its start. Each read that
    fails with a transient error (see :func:`~nodes.storage.retry.is_transient`) is retried on a
    reopened file, positioned again, after an exponential back-off; when the
    policy (``retries``: a :class:`~nodes.storage.retry.RetryPolicy` or a count)
    gives up, a ``ReadFailedError`` names the URL, the offset, the attempts and
    the last error. With ``watchdog=True`` and a policy timeout, every open and
    read runs under a :class:`~nodes.storage.watchdog.Watchdog`, so one that
    stalls fails (and is retried) after the timeout instead of hanging.
    A seek only records the position; the next read goes there.
    """

    #: The most a read asks of the file in one call under the watchdog (8 MiB).
    watched_piece = 8 << 20
    #: The least it asks for: smaller reads are served from the bytes read ahead (64 KiB).
    watched_ahead = 64 << 10

    def __init__(
        self,
        url: str,
        opener: Callable[[], Any],
        retries: int | RetryPolicy | None,
        backoff: float | None = None,
        *,
        stream_instead: Callable[[BaseException | None], bool] | None = None,
        watchdog: bool = False,
    ) -> None:
        super().__init__()
        self.url = url
        self._opener = opener
        self._retries = as_policy(retries)
        self._backoff = backoff
        timeout = self._retries.timeout
        self._watchdog = Watchdog(timeout) if watchdog and timeout is not None else None
        self._pos = 0
        self.retried = 0
        # Asked once, with the cause of a read that failed for good, whether that failure
        # means the file must be streamed (a server that ignores Range requests); if it
        # says yes, the opener returns a stream from then on (see ForwardOnlyFile).
        self._stream_instead = stream_instead
        self._file: Any = None  # opened (again) by _here() when None
        self._positioned = False  # whether self._file sits at self._pos (+ len(self._ahead))
        self._ahead = b""  # bytes read past self._pos under a watchdog, handed out first
        try:
            self._attempt(self._here)  # a missing file fails now, not at the first read
        except BaseException:
            self.close()  # the handle and the watchdog's thread, not left to the GC
            raise

    def _attempt(self, action: Callable[[], Any]) -> Any:
        return with_retries(
            action,
            self._retries,
            url=self.url,
            doing=lambda: f"read at byte offset {self._pos}",
            between=self._between_attempts,
            backoff=self._backoff,
            watchdog=self._watchdog,
        )

    def _between_attempts(self) -> None:
        self.retried += 1
        self._discard()

    def _discard(self) -> None:
        """Drop the handle (broken, or of the wrong kind); the next attempt opens another."""
        file, self._file, self._positioned = self._file, None, False
        self._ahead = b""  # read again from self._pos by the next handle
        if file is None:
            return
        if self._watchdog is not None:  # a stalled read may still hold it: closed after that
            self._watchdog.discard(file)
            return
        try:
            file.close()
        except Exception:  # noqa: BLE001 - the old handle is broken anyway
            pass

    def close(self) -> None:
        if not self.closed:
            try:
                self._discard()  # through the watchdog: a stalled read may still hold it
                if self._watchdog is not None:
                    self._watchdog.close()
            finally:
                super().close()

    def _here(self) -> Any:
        """The open handle, at ``self._pos`` (opening or seeking it as needed)."""
        if self._file is None:
            self._file = self._opener()
            self._positioned = self._pos == 0
        if not self._positioned:
            self._file.seek(self._pos)
            self._positioned = True
        return self._file

    def _end(self) -> int:
        end = self._attempt(lambda: self._here().seek(0, io.SEEK_END))
        self._positioned = False  # the handle is at its end now, not at self._pos
        self._ahead = b""
        return end

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = self._target(offset, whence)
        if self._pos < target <= self._pos + len(self._ahead):  # within the bytes read ahead
            self._ahead = self._ahead[target - self._pos :]
            self._pos = target
        elif target != self._pos:
            self._pos, self._positioned, self._ahead = target, False, b""
        return self._pos

    def read(self, size: int = -1) -> bytes:
        whole = size is None or size < 0
        if self._ahead:
            if not whole and size <= len(self._ahead):
                data, self._ahead = self._ahead[:size], self._ahead[size:]
                self._pos += len(data)
                return data
            # The handle sits where the bytes read ahead end: hand them out, read on from there.
            data, self._ahead = self._ahead, b""
            self._pos += len(data)
            return data + self.read(-1 if whole else size - len(data))
        if self._watchdog is None:
            return self._read(size)
        if whole or size > self.watched_piece:
            # The watchdog times a call, not bytes: a big read is made of pieces that each
            # take far less than the timeout unless the source stalls.
            parts, got, piece = [], 0, self.watched_piece
            while whole or got < size:
                data = self._read(piece if whole else min(piece, size - got))
                if not data:
                    break
                parts.append(data)
                got += len(data)
            return b"".join(parts)
        if size < self.watched_ahead:
            # Small reads (tar headers) would each pay a thread hand-off: read ahead instead.
            data = self._read(self.watched_ahead)
            self._pos -= len(data) - min(size, len(data))
            data, self._ahead = data[:size], data[size:]
            return data
        return self._read(size)

    def _read(self, size: int) -> bytes:
        try:
            data = self._attempt(lambda: self._here().read(size))
        except ReadFailedError as error:
            if self._stream_instead is None or not self._stream_instead(error.__cause__):
                raise
            self._stream_instead = None
            self._discard()
            data = self._attempt(lambda: self._here().read(size))
        self._pos += len(data)
        return data


class ForwardOnlyFile(_CountedStream):
    """A file served only from its start (no ``Range`` support), made seekable by reading.

    Seeks only record the position; the next read gets there, forward by
    reading and dropping the bytes in between, backward by opening the file
    again from its start. A seek from the end asks for the size, or, when the
    server gave none, reads to the end once to learn it. So a resume at byte
    offset ``n`` downloads the first ``n`` bytes again, and a zip (``.npz``),
    which is read from its end, is downloaded about twice per member. A read
    returns as many bytes as asked for, fewer only at the end of the file.
    """

    def __init__(
        self, opener: Callable[[], Any], size: Callable[[], int | None], file: Any = None
    ) -> None:
        super().__init__()
        self._opener = opener
        self._size = size
        self._file: Any = opener() if file is None else file
        self._at = 0  # where the stream is
        self._pos = 0  # where the next read starts
        self._length: int | None = None

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = self._target(offset, whence)
        return self._pos

    def _end(self) -> int:
        if self._length is None:
            self._length = self._size()
        if self._length is None:  # no size given: the end is where the stream ends
            self._move_to(sys.maxsize)  # sets self._length when it gets there
        assert self._length is not None
        return self._length

    def _move_to(self, target: int) -> None:
        if target < self._at:
            self._file.close()
            self._file, self._at = self._opener(), 0
        while self._at < target:
            data = self._file.read(min(1 << 20, target - self._at))
            if not data:
                self._length = self._at
                return
            self._at += len(data)
            progress()  # a long skip under a watchdog is slow, not stalled

    def read(self, size: int = -1) -> bytes:
        self._move_to(self._pos)
        if self._at < self._pos:  # past the end
            return b""
        # A stream returns what has arrived, which may be less than asked; callers such as
        # zipfile take a short read for the end of the file, so fill it.
        data = self._file.read() if size is None or size < 0 else read_full(self._file, size)
        self._at += len(data)
        self._pos = self._at
        return data


def read_full(f: Any, size: int) -> bytes:
    """Read ``size`` bytes, or fewer only at the end of the file."""
    data = f.read(size)
    if len(data) < size and data:
        parts = [data]
        got = len(data)
        while got < size:
            progress()  # a big read made of many short ones is slow, not stalled
            more = f.read(size - got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        data = b"".join(parts)
    return data


def skip_forward(stream: Any, offset: int, chunk: int = 1 << 20) -> None:
    """Move a forward-only stream (a decompressor) to ``offset`` by reading."""
    remaining = offset - stream.tell() if hasattr(stream, "tell") else offset
    while remaining > 0:
        data = stream.read(min(chunk, remaining))
        if not data:
            return
        remaining -= len(data)
