"""Files through fsspec: deterministic listings, retried reads, transparent decompression."""

from __future__ import annotations

import errno
import hashlib
import io
import lzma
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
from fsspec.compression import compr
from fsspec.utils import infer_compression

from nodes.errors import BadRecordError

_BRACE = re.compile(r"\{([^{}]*)\}")
_NUMERIC_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_GLOB_CHARS = re.compile(r"[*?\[]")

# OS error numbers that may clear up (network trouble); any other errno is final.
_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EAGAIN",
        "EINTR",
        "EIO",
        "ETIMEDOUT",
        "ECONNRESET",
        "ECONNREFUSED",
        "ECONNABORTED",
        "EPIPE",
        "ENETDOWN",
        "ENETUNREACH",
        "EHOSTUNREACH",
        "EHOSTDOWN",
        "ESTALE",
    )
    if hasattr(errno, name)
)

# Errors that say "this will not get better by trying again".
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def url_path(url: str) -> str:
    """The URL without an HTTP query string (``?X-Amz-Signature=...`` is not a glob)."""
    if url.startswith(("http://", "https://")):
        return url.split("?", 1)[0]
    return url


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{a,b}`` lists and ``{000..127}`` ranges (zero padding kept), left to right.

    >>> expand_braces("shard-{0..2}.tar")
    ['shard-0.tar', 'shard-1.tar', 'shard-2.tar']
    >>> expand_braces("{train,val}-{00..01}.jsonl")
    ['train-00.jsonl', 'train-01.jsonl', 'val-00.jsonl', 'val-01.jsonl']
    """
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    numeric = _NUMERIC_RANGE.match(body)
    if numeric:
        lo, hi = int(numeric.group(1)), int(numeric.group(2))
        width = len(numeric.group(1)) if numeric.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        choices = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    else:
        choices = body.split(",")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [head + choice + rest for choice in choices for rest in expand_braces(tail)]


def as_patterns(urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The URL patterns as a list of strings (paths are accepted too)."""
    patterns = [urls] if isinstance(urls, str | os.PathLike) else list(urls)
    if not patterns:
        raise ValueError("dp.files() got an empty list of URLs")
    for pattern in patterns:
        if not isinstance(pattern, str | os.PathLike):
            raise TypeError(f"dp.files() takes URL strings or paths, got {pattern!r}")
    return [os.fspath(pattern) for pattern in patterns]


def list_files(
    urls: str | Sequence[str], storage_options: dict[str, Any], retries: int = 3
) -> list[str]:
    """The sorted, de-duplicated URLs that ``urls`` names (lists, globs, brace ranges).

    The result is the same in every process that sees the same storage, which
    is what lets every consumer deal the same list. Patterns that match
    nothing are an error naming the pattern.
    """
    found: set[str] = set()
    for pattern in as_patterns(urls):
        for url in expand_braces(pattern):
            if not _GLOB_CHARS.search(url_path(url)):
                found.add(url)
                continue
            fs, path = fsspec.core.url_to_fs(url, **storage_options)
            listing = with_retries(
                lambda fs=fs, path=path: fs.glob(path, detail=True),
                retries,
                url=url,
                doing=lambda: "listing",
            )
            matches = [p for p, info in listing.items() if _is_file(info)]
            if not matches:
                raise FileNotFoundError(f"dp.files(): {url!r} matched no files")
            found.update(_as_url(fs, url, match) for match in matches)
    return sorted(found)


def _is_file(info: dict[str, Any]) -> bool:
    return info.get("type", "file") != "directory"


def _as_url(fs: Any, pattern: str, path: str) -> str:
    """A glob match written the way the user wrote the pattern (local paths stay paths)."""
    if "://" not in pattern and not pattern.startswith("file:"):
        # A local pattern: keep relative paths relative, so listings match across machines.
        return path if os.path.isabs(pattern) else os.path.relpath(path)
    return fs.unstrip_protocol(path)


def listing_digest(urls: Sequence[str]) -> str:
    """A short digest of a listing, kept in states to notice that the files changed."""
    # Query strings (signatures of pre-signed URLs) change when URLs are re-signed.
    return hashlib.sha256("\n".join(map(url_path, urls)).encode()).hexdigest()[:16]


def is_transient(error: BaseException) -> bool:
    """Whether a read error may go away on retry (network trouble, 5xx, timeouts).

    fsspec's HTTP filesystem reports any failed metadata request as
    ``FileNotFoundError``; the HTTP status behind it decides.
    """
    if isinstance(error, FileNotFoundError) and error.__cause__ is not None:
        return is_transient(error.__cause__)
    if isinstance(error, (*_PERMANENT, io.UnsupportedOperation)):
        return False
    status = getattr(error, "status", None)
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno in _TRANSIENT_ERRNOS
    if isinstance(error, OSError | TimeoutError | ConnectionError):
        return True
    return type(error).__module__.split(".")[0] in ("aiohttp", "requests", "urllib3")


class ReadFailedError(OSError):
    """Reading a file failed for good: not found, refused, or still failing after retries."""


def with_retries(
    action: Callable[[], Any],
    retries: int,
    *,
    url: str,
    doing: Callable[[], str],
    between: Callable[[], None] | None = None,
    backoff: float = 0.05,
) -> Any:
    """``action()`` on ``url``, retried up to ``retries`` times on transient errors.

    ``doing()`` names the operation in the error raised when it still fails
    (``"read at byte offset 10"``); ``between()`` runs before each retry (to
    reopen a file). A missing file is a ``FileNotFoundError``, never retried.
    """
    for attempt in range(retries + 1):
        try:
            return action()
        except Exception as error:  # noqa: BLE001 - classified below
            transient = is_transient(error)
            if isinstance(error, FileNotFoundError) and not transient:
                status = getattr(error.__cause__, "status", None)
                if status in (401, 403):  # fsspec's HTTP reports a refused request as missing
                    raise PermissionError(f"{url}: access denied (HTTP {status})") from error
                raise FileNotFoundError(f"{url}: no such file") from error
            if not transient or attempt == retries:
                shown = error.__cause__ if isinstance(error, FileNotFoundError) else error
                raise ReadFailedError(
                    f"{url}: {doing()} failed after {attempt + 1} attempt(s): "
                    f"{type(shown).__name__}: {shown}"
                ) from error
            time.sleep(backoff * 2**attempt)
            if between is not None:
                between()
    raise AssertionError("unreachable")


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
    """A read-only file that reopens itself and retries a failed read a bounded number of times.

    ``opener()`` returns a fresh binary file at its start. Each read that
    fails with a transient error (see :func:`is_transient`) is retried on a
    reopened file, positioned again, after an exponential back-off; after
    ``retries`` failed attempts the last error is raised with the URL added.
    A seek only records the position; the next read goes there.
    """

    def __init__(
        self,
        url: str,
        opener: Callable[[], Any],
        retries: int,
        backoff: float = 0.05,
        *,
        stream_instead: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.url = url
        self._opener = opener
        self._retries = retries
        self._backoff = backoff
        self._pos = 0
        self.retried = 0
        # Called once if the server turns out to ignore Range requests; the opener then
        # returns a stream (see ForwardOnlyFile).
        self._stream_instead = stream_instead
        self._file: Any = None  # opened (again) by _here() when None
        self._positioned = False  # whether self._file sits at self._pos
        self._attempt(self._here)  # a missing file fails now, not at the first read

    def _attempt(self, action: Callable[[], Any]) -> Any:
        return with_retries(
            action,
            self._retries,
            url=self.url,
            doing=lambda: f"read at byte offset {self._pos}",
            between=self._between_attempts,
            backoff=self._backoff,
        )

    def _between_attempts(self) -> None:
        self.retried += 1
        self._discard()

    def _discard(self) -> None:
        """Drop the handle (broken, or of the wrong kind); the next attempt opens another."""
        file, self._file, self._positioned = self._file, None, False
        if file is not None:
            try:
                file.close()
            except Exception:  # noqa: BLE001 - the old handle is broken anyway
                pass

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
        return end

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = self._target(offset, whence)
        if target != self._pos:
            self._pos, self._positioned = target, False
        return self._pos

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._attempt(lambda: self._here().read(size))
        except ReadFailedError as error:
            if self._stream_instead is None or not ignores_range_requests(error.__cause__):
                raise
            self._stream_instead()
            self._stream_instead = None
            self._discard()
            data = self._attempt(lambda: self._here().read(size))
        self._pos += len(data)
        return data


def ignores_range_requests(error: BaseException | None) -> bool:
    """Whether fsspec's HTTP file failed because the server answers Range requests in full.

    fsspec raises a plain ``ValueError`` for it (``python -m http.server`` is such a
    server), so its message is what tells it apart.
    """
    return isinstance(error, ValueError) and "support range requests" in str(error)


def is_stream(file: Any) -> bool:
    """Whether an fsspec file reads only forward (an HTTP server without ranges or size)."""
    return type(file).__name__ == "HTTPStreamFile"


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


class SourceFile:
    """One file of a listing: how to open it, its size, and whether it is compressed.

    Compression is inferred from the extension (``.gz``, ``.bz2``, ``.xz``,
    ``.zst``; zstd needs the ``zstandard`` package). Compressed files are read
    as their decompressed bytes; they cannot seek cheaply, so offsets into
    them are reached by decompressing from the start of the file.
    """

    def __init__(
        self, url: str, storage_options: dict[str, Any], retries: int, block_size: int
    ) -> None:
        self.url = url
        self.compression = infer_compression(url_path(url))
        self._options = storage_options
        self._retries = retries
        self._block_size = block_size
        self._fs: Any = None
        self._path = ""
        self._stream_only = False  # the server ignores Range requests: read from the start

    @property
    def name(self) -> str:
        """The URL without query string and compression suffix (``a.npz.gz`` -> ``a.npz``)."""
        path = url_path(self.url)
        return path.rsplit(".", 1)[0] if self.compression else path

    @property
    def seekable(self) -> bool:
        """Whether a byte offset of the (decompressed) content can be reached in O(1)."""
        return self.compression is None

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            self._fs, self._path = fsspec.core.url_to_fs(self.url, **self._options)
        return self._fs, self._path

    def _open_raw(self) -> Any:
        fs, path = self._filesystem()
        if self._stream_only:
            return ForwardOnlyFile(self._open_stream, self.size)
        file = fs.open(path, "rb", block_size=self._block_size)
        if is_stream(file):  # the server gave no size, or said Accept-Ranges: none
            self._stream_only = True
            return ForwardOnlyFile(self._open_stream, self.size, file)
        return file

    def _open_stream(self) -> Any:
        fs, path = self._filesystem()
        return fs.open(path, "rb", block_size=0)

    def _stream_instead(self) -> None:
        self._stream_only = True

    def open(self, offset: int = 0) -> Any:
        """A binary file over the decompressed content, positioned at ``offset``.

        A file on an HTTP server that ignores Range requests is read as a
        stream: reaching ``offset`` then downloads the bytes before it.
        """
        raw = RetryingFile(
            self.url, self._open_raw, self._retries, stream_instead=self._stream_instead
        )
        if self.compression is None:
            raw.seek(offset)
            return raw
        if self.compression == "zstd":
            decompressor = ZstdReader(raw, self.url)
        elif self.compression in compr:
            decompressor = compr[self.compression](raw, mode="rb")
        else:
            raw.close()
            raise ImportError(f"{self.url}: no decompressor for {self.compression} files")
        stream = Decompressed(decompressor, raw, self.url, self.compression)
        skip_forward(stream, offset)
        return stream

    def size(self) -> int | None:
        """The size in bytes of the stored (not decompressed) file; ``None`` if the server
        does not say (an HTTP answer without ``Content-Length``)."""
        fs, path = self._filesystem()
        size = with_retries(
            lambda: fs.size(path), self._retries, url=self.url, doing=lambda: "size query"
        )
        return None if size is None else int(size)


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
        self._frame = self._new()
        self._in_frame = False
        self._buffer = bytearray()
        self._pos = 0
        self._raw_done = False

    def _fill(self, wanted: int) -> None:
        while not self._raw_done and (wanted < 0 or len(self._buffer) < wanted):
            data = self._raw.read(self._chunk)
            if not data:
                self._raw_done = True
                if self._in_frame:
                    raise EOFError("the file ends inside a zstd frame (truncated)")
                return
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


def read_full(f: Any, size: int) -> bytes:
    """Read ``size`` bytes, or fewer only at the end of the file."""
    data = f.read(size)
    if len(data) < size and data:
        parts = [data]
        got = len(data)
        while got < size:
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
