"""One file of a listing, opened through fsspec with retries and transparent decompression."""

from __future__ import annotations

from typing import Any

import fsspec
from fsspec.utils import infer_compression

from nodes.credentials import remember
from nodes.storage import fsspec_http
from nodes.storage.compression import decompressing
from nodes.storage.listing import url_path
from nodes.storage.retry import RetryPolicy, as_policy, with_retries
from nodes.storage.streams import ForwardOnlyFile, RetryingFile, skip_forward
from nodes.storage.watchdog import can_stall, watchdog_for


class SourceFile:
    """One file of a listing: how to open it, its size, and whether it is compressed.

    Compression is inferred from the extension (``.gz``, ``.bz2``, ``.xz``,
    ``.zst``; zstd needs the ``zstandard`` package). Compressed files are read
    as their decompressed bytes; they cannot seek cheaply, so offsets into
    them are reached by decompressing from the start of the file.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any],
        retries: int | RetryPolicy | None,
        block_size: int,
    ) -> None:
        self.url = url
        remember(url)  # in every process that opens it: its errors are scrubbed there
        self.compression = infer_compression(url_path(url))
        self._retries = as_policy(retries)
        self._options = fsspec_http.with_read_timeout(url, storage_options, self._retries.timeout)
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

    @property
    def can_stall(self) -> bool:
        """Whether a read may block with no error (anything but local disk and memory):
        such reads run under a watchdog with the policy's timeout."""
        return can_stall(self._filesystem()[0])

    def _open_raw(self) -> Any:
        fs, path = self._filesystem()
        if self._stream_only:
            return ForwardOnlyFile(self._open_stream, self.size)
        file = fs.open(path, "rb", block_size=self._block_size)
        if fsspec_http.is_stream(file):  # the server gave no size, or said Accept-Ranges: none
            self._stream_only = True
            return ForwardOnlyFile(self._open_stream, self.size, file)
        return file

    def _open_stream(self) -> Any:
        return fsspec_http.open_stream(*self._filesystem())

    def _stream_instead(self, error: BaseException | None) -> bool:
        """After a read failed with ``error``: stream the file from now on if that is why."""
        if not fsspec_http.ignores_range_requests(error):
            return False
        self._stream_only = True
        return True

    def open(self, offset: int = 0) -> Any:
        """A binary file over the decompressed content, positioned at ``offset``.

        A file on an HTTP server that ignores Range requests is read as a
        stream: reaching ``offset`` then downloads the bytes before it.
        """
        raw = RetryingFile(
            self.url,
            self._open_raw,
            self._retries,
            stream_instead=self._stream_instead,
            watchdog=self.can_stall,
        )
        if self.compression is None:
            raw.seek(offset)
            return raw
        stream = decompressing(raw, self.url, self.compression)
        skip_forward(stream, offset)
        return stream

    def size(self) -> int | None:
        """The size in bytes of the stored (not decompressed) file; ``None`` if the server
        does not say (an HTTP answer without ``Content-Length``)."""
        fs, path = self._filesystem()
        with watchdog_for(fs, self._retries.timeout) as watchdog:
            size = with_retries(
                lambda: fs.size(path),
                self._retries,
                url=self.url,
                doing=lambda: "size query",
                watchdog=watchdog,
            )
        return None if size is None else int(size)
