"""File sources and readers: ``dp.files(...)`` and its ``read_*`` steps."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from datapipes.describe import describe
from datapipes.identity import plain
from datapipes.pipe import DataPipe
from nodes import Context, Node
from nodes.credentials import masked_options, remember, shown_url
from nodes.errors import check_on_error
from nodes.readers import (
    BytesFormat,
    CsvFormat,
    FileReaderNode,
    JsonLinesFormat,
    LineFormat,
    NpyFormat,
    ParquetFormat,
    RecordFormat,
    TarFormat,
)
from nodes.readers.lines import MAX_RECORD_BYTES, RECORD_BLOCK_SIZE
from nodes.sources.files import DEFAULT_BLOCK_SIZE, FileListNode, FileSet
from nodes.storage import as_patterns, listing_digest
from nodes.storage.retry import DEFAULT_RETRY_SECONDS, DEFAULT_TIMEOUT, RetryPolicy


class FileList(DataPipe[str]):
    """A list of files: iterate it for this consumer's URLs, or chain a ``read_*`` step.

    Every reader deals whole files to consumers when there are at least as
    many files as consumers, and splits files otherwise (byte ranges aligned
    to records for text, row ranges for arrays, samples for tar). Each has an
    ``on_error`` argument: ``"raise"`` (default) stops at a bad record with
    an error naming the file and the position; ``"skip"`` skips it, warns
    once and counts it (see :meth:`datapipes.Loader.skipped`).
    """

    def file_set(
        self, ctx: Context, shuffle_key: list[int] | None = None, shuffle_seed: int | None = None
    ) -> FileSet:
        """The runtime file set (listed lazily), in a shuffled order when ``shuffle_key`` is set."""
        raise NotImplementedError

    def _build(self, ctx: Context) -> Node[str]:
        return FileListNode(self.file_set(ctx), ctx)

    def _read(self, fmt: type[RecordFormat], on_error: str, **options: Any) -> DataPipe[Any]:
        if options.get("max_record_bytes", MAX_RECORD_BYTES) == MAX_RECORD_BYTES:
            options.pop("max_record_bytes", None)  # the default: recipes and states as before
        return Read(self, fmt, on_error=on_error, **options)

    def shuffle(self, buffer_size: int | None = None, *, seed: int | None = None) -> DataPipe[Any]:
        """Shuffle the file order every epoch (before the files are dealt to consumers).

        The permutation is the same on every rank and worker (it depends on
        the Loader's seed, the epoch and this step), so consumers still split
        the files exactly. Shuffle records too with a buffer after reading:
        ``dp.files(...).shuffle().read_jsonl().shuffle(10_000)``.
        """
        if buffer_size is not None:
            raise ValueError(
                "a file list is shuffled whole: call .shuffle() without buffer_size, and "
                "shuffle records with .read_...().shuffle(buffer_size)"
            )
        return ShuffledFiles(self, seed=seed)

    def read_bytes(self, *, on_error: str = "raise") -> DataPipe[dict[str, Any]]:
        """One sample per file: ``{"__url__", "__key__", <extension>: bytes}`` (see ``decode``)."""
        return self._read(BytesFormat, on_error)

    def read_lines(
        self,
        *,
        encoding: str = "utf-8",
        on_error: str = "raise",
        block_size: int = RECORD_BLOCK_SIZE,
        max_record_bytes: int | None = MAX_RECORD_BYTES,
    ) -> DataPipe[str]:
        """One ``str`` per line, without its line ending.

        ``max_record_bytes``: the longest line (after decompression) read; a longer one is
        a ``BadRecordError`` naming the file and offset before it is held whole (under
        ``on_error="skip"``: skipped, counted, and reading goes on at the next line).
        ``None``: no limit. The same holds for ``read_jsonl`` and ``read_csv``.
        """
        return self._read(
            LineFormat, on_error, encoding=encoding, block_size=block_size,
            max_record_bytes=max_record_bytes,
        )  # fmt: skip

    def read_jsonl(
        self,
        *,
        on_error: str = "raise",
        block_size: int = RECORD_BLOCK_SIZE,
        max_record_bytes: int | None = MAX_RECORD_BYTES,
    ) -> DataPipe[Any]:
        """One JSON value per line (blank lines are ignored).

        Lines are decoded a block (about ``block_size`` bytes) at a time; a
        malformed line raises an error naming the file, the line and its byte
        offset, after the good lines before it have been returned. A line over
        ``max_record_bytes`` is a bad record too (see :meth:`read_lines`).
        """
        return self._read(
            JsonLinesFormat, on_error, block_size=block_size, max_record_bytes=max_record_bytes
        )

    def read_csv(
        self,
        *,
        encoding: str = "utf-8",
        on_error: str = "raise",
        block_size: int = RECORD_BLOCK_SIZE,
        max_record_bytes: int | None = MAX_RECORD_BYTES,
        **fmtparams: Any,
    ) -> DataPipe[dict[str, str]]:
        """One ``dict`` per row keyed by the header row (``fmtparams`` go to :mod:`csv`).

        Values are strings; convert them with ``.map``. Splitting one file
        among several consumers needs rows without quoted line breaks.
        """
        return self._read(
            CsvFormat, on_error, encoding=encoding, block_size=block_size,
            max_record_bytes=max_record_bytes, **fmtparams,
        )  # fmt: skip

    def read_npy(self, *, rows: bool = True, on_error: str = "raise") -> DataPipe[Any]:
        """Rows of ``.npy`` arrays (``.npz``: a dict of member rows); ``rows=False``: whole files.

        By rows, resume seeks to the row and a file is split among consumers
        by row ranges.
        """
        return self._read(NpyFormat, on_error, rows=rows)

    def read_parquet(
        self,
        columns: Sequence[str] | None = None,
        *,
        batches: bool = False,
        batch_size: int | None = None,
        on_error: str = "raise",
    ) -> DataPipe[Any]:
        """Rows of Parquet files as dicts (``batches=True``: ``pyarrow.RecordBatch``es).

        Needs pyarrow (``pip install 'datapipes-torch[parquet]'``; a missing one
        is an ``ImportError`` when the pipeline is built). Files are read through
        the library's storage with range reads: pyarrow reads the footer and then
        only the row groups and ``columns`` it needs (a nested field by its dotted
        path, ``"image.bytes"``). Rows come as ``RecordBatch.to_pylist`` makes
        them, structs as dicts; an image column as the Hugging Face ``datasets``
        library stores it (``{"bytes": ..., "path": ...}``) is decoded by
        ``.decode()``. ``batch_size`` is the rows per block (per RecordBatch);
        by default as many as hold about 8 MiB of encoded data, at most 65,536
        (1,024 for dicts that hold lists or structs: fewer rows alive for the
        garbage collector to scan).

        Positions are ``[row group, row]``: resume reads one row group, not the
        ones before it. Files fewer than consumers are split by row groups, and
        by row ranges when a file has fewer row groups than parts. Every file's
        columns (after ``columns``) must have the names and types of the
        listing's first file's. ::

            import pyarrow as pa, pyarrow.parquet as pq

            pq.write_table(pa.table({"id": [1, 2, 3], "text": ["a", "b", "c"]}), "t.parquet")
            rows = list(dp.Loader(dp.files("t.parquet").read_parquet(columns=["id"])))
            assert rows == [{"id": 1}, {"id": 2}, {"id": 3}]
        """
        options: dict[str, Any] = {}
        if columns is not None:
            options["columns"] = list(columns) if not isinstance(columns, str) else columns
        if batches:
            options["batches"] = batches
        if batch_size is not None:
            options["batch_size"] = batch_size
        return self._read(ParquetFormat, on_error, **options)

    def read_tar(self, *, on_error: str = "raise") -> DataPipe[dict[str, Any]]:
        """Samples of tar shards, webdataset style: members grouped by key.

        Each sample is ``{"__key__", "__url__", <field>: bytes, ...}``; chain
        ``.decode()`` to turn fields into objects. Resume seeks to the sample's
        first header.
        """
        return self._read(TarFormat, on_error)


class Files(FileList):
    """The files named by URLs, globs and brace ranges (see :func:`files`)."""

    name = "files"

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        retries: int | None,
        block_size: int,
        storage_options: dict[str, Any],
        timeout: float | None = DEFAULT_TIMEOUT,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ) -> None:
        patterns = as_patterns(urls)  # validates now, lists nothing
        for pattern in patterns:
            remember(pattern)  # their credentials are taken out of every error and warning
        urls = patterns[0] if isinstance(urls, str | os.PathLike) else tuple(patterns)
        # Validates all three, naming the one that is wrong.
        policy = RetryPolicy(retries=retries, retry_seconds=retry_seconds, timeout=timeout)
        kwargs: dict[str, Any] = dict(masked_options(storage_options))
        # The retry limits are operational, not structural, so timeout and retry_seconds are
        # not in kwargs (the identity, the fingerprint, the random keys, repr and the skip
        # counts' names): changing them resumes the same checkpoint. An explicit retries
        # count other than 3 stays there as before issue 14, so that a checkpoint taken
        # with it still matches, with the same shuffle orders.
        if retries is not None and retries != 3:
            kwargs["retries"] = retries
        if block_size != DEFAULT_BLOCK_SIZE:
            kwargs["block_size"] = block_size
        super().__init__(args=(urls,), **kwargs)
        object.__setattr__(self, "_options", dict(storage_options))
        object.__setattr__(self, "_retries", policy)
        object.__setattr__(self, "_block_size", block_size)

    def _own_args(self) -> str:
        # Name every pattern (they make the fingerprint); a long list by count and digest.
        urls = self.args[0]
        if not isinstance(urls, str) and len(urls) > 8:
            shown = f"<{len(urls)} urls {listing_digest(urls)}>"
        elif isinstance(urls, str):
            shown = repr(shown_url(urls))
        else:
            shown = repr([shown_url(url) for url in urls])
        return ", ".join([shown] + [f"{k}={describe(v)}" for k, v in self.kwargs.items()])

    def identity_params(self, names: bool) -> tuple[list[Any], dict[str, Any]]:
        # Patterns without query strings (signatures are re-issued), a long list by digest;
        # the storage options are masked already.
        urls = self.args[0]
        if isinstance(urls, str):
            shown: Any = shown_url(urls)
        elif len(urls) > 8:
            shown = {"urls": len(urls), "digest": listing_digest([shown_url(u) for u in urls])}
        else:
            shown = [shown_url(url) for url in urls]
        return [shown], {key: plain(value, names) for key, value in self.kwargs.items()}

    def file_set(
        self, ctx: Context, shuffle_key: list[int] | None = None, shuffle_seed: int | None = None
    ) -> FileSet:
        return FileSet(
            self.args[0],
            self._options,  # type: ignore[attr-defined]
            shuffle_key=shuffle_key,
            shuffle_seed=shuffle_seed,
            retries=self._retries,  # type: ignore[attr-defined]
            block_size=self._block_size,  # type: ignore[attr-defined]
            listings=ctx.listings,  # the job's listing when its owner shares one (a Loader)
        )


class ShuffledFiles(FileList):
    """A file list in a new order every epoch, the same order on every consumer."""

    name = "shuffle"

    def __init__(self, upstream: FileList, *, seed: int | None) -> None:
        super().__init__(upstream, **({} if seed is None else {"seed": seed}))

    def file_set(
        self, ctx: Context, shuffle_key: list[int] | None = None, shuffle_seed: int | None = None
    ) -> FileSet:
        return self.inputs[0].file_set(  # type: ignore[attr-defined]
            ctx, shuffle_key=[self._key()], shuffle_seed=self.kwargs.get("seed")
        )


class Read(DataPipe[Any]):
    """The records of a file list, read with one format."""

    def __init__(
        self, upstream: FileList, fmt: type[RecordFormat], *, on_error: str, **options: Any
    ) -> None:
        check_on_error(on_error)
        fmt(**options)  # a bad option (block size, encoding, csv dialect) fails here, not later
        kwargs = dict(options)
        if on_error != "raise":
            kwargs["on_error"] = on_error
        super().__init__(upstream, **kwargs)
        object.__setattr__(self, "name", fmt.name)
        object.__setattr__(self, "_format", fmt)
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "_on_error", on_error)

    def _own_args(self) -> str:
        defaults = {"block_size": RECORD_BLOCK_SIZE, "encoding": "utf-8", "rows": True}
        shown = {k: v for k, v in self.kwargs.items() if defaults.get(k, object()) != v}
        return ", ".join(f"{k}={v!r}" for k, v in shown.items())

    def _build(self, ctx: Context) -> Node[Any]:
        files = self.inputs[0].file_set(ctx)  # type: ignore[attr-defined]
        fmt = self._format(**self._options)  # type: ignore[attr-defined]
        on_error = self._on_error  # type: ignore[attr-defined]
        return FileReaderNode(files, fmt, ctx, on_error=on_error, step=repr(self))


def files(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    retry_seconds: float = DEFAULT_RETRY_SECONDS,
    retries: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    **storage_options: Any,
) -> FileList:
    """Files from any fsspec URL: a path, a list, a glob, or brace ranges.

    ``"data/train-*.jsonl"``, ``"s3://bucket/x/*.tar"``,
    ``"https://host/shard-{00000..00127}.tar"`` all work; the listing is
    sorted, so every process sees the same order. A Loader lists once (rank 0
    for every rank under ``torch.distributed``) and hands the listing to its
    DataLoader workers, so no two consumers deal different listings. ``storage_options`` go to
    the filesystem (credentials are masked in ``repr``). Chain ``.shuffle()``
    to reorder files each epoch and a ``read_*`` step to get records::

        dp.files("data/train-*.jsonl").shuffle().read_jsonl().shuffle(10_000)

    Compressed files (``.gz``, ``.bz2``, ``.xz``, ``.zst`` with ``zstandard``)
    are decompressed transparently.

    Remote reads (anything but local disk and ``memory://``): an open or read
    that receives nothing for ``timeout`` seconds (default 60; ``None``: no
    limit of ours) fails as a transient error. A transient error (network,
    HTTP 5xx/408/429, timeout) is retried on a reopened file at the same
    offset, after waits that double from 0.1 s up to 5 s (with a
    deterministic jitter), until ``retry_seconds`` (default 60) have passed
    since the read first failed, or after ``retries`` retries if that is
    set (default ``None``: no count cap; whichever comes first ends it).
    Then :class:`~nodes.storage.ReadFailedError` (an ``OSError``) names the
    URL, the byte offset, the attempts, the time spent, the limits and the
    last error; under ``on_error="skip"`` the rest of that file is skipped
    and counted. These limits are not part of the recipe's identity:
    changing them resumes the same checkpoint.
    """
    return Files(
        urls,
        retries=retries,
        block_size=block_size,
        storage_options=storage_options,
        timeout=timeout,
        retry_seconds=retry_seconds,
    )
