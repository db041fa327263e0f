"""Where a write goes: files that appear only complete, on any fsspec filesystem.

Local disk: a file is written under a temporary name beside its final one
(``.<name>.tmp-<host>-<pid>-<n>``) and renamed over it when complete, so a
reader sees the whole file or none. Object stores (``s3://``, ``gs://``...)
and ``memory://``: the file is uploaded in one go and appears when the upload
completes, as those stores do (a writer killed mid-upload leaves nothing).

A unit being written is marked (``_datapipes/writing/<unit>.<host>.<pid>``)
so that another rank can tell a unit in progress from one abandoned by a
dead writer; temporaries of dead writers are removed.

Other processes write here too: every look (a read, a listing, a file's time)
asks the store again instead of fsspec's listing cache (s3fs keeps a folder's
listing for ever, and then misses, or even fails to open, what others wrote
since).
"""

from __future__ import annotations

import io
import itertools
import os
import posixpath
import socket
import time
from typing import IO, Any

import fsspec

from datapipes.write.checksum import checksum_bytes, checksum_fd
from nodes.credentials import masked_options, remember

#: The folder of a destination that holds the write's own records (not shards).
META = "_datapipes"
_counter = itertools.count()


def _host() -> str:
    return socket.gethostname().replace(".", "_").replace("-", "_") or "host"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


class Destination:
    """A write's destination folder (any fsspec URL): atomic files, markers, listing."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = str(url).rstrip("/")
        remember(self.url)  # its credentials, and the options', are scrubbed from every error
        masked_options(storage_options or {})
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        #: Whether files go through a temporary name and a rename (local disk).
        self.renames = bool({"file", "local"} & set(protocols))
        self.host = _host()

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # ----- files that appear complete ----------------------------------------------------------
    def publish(self, name: str, data: bytes) -> None:
        """Write ``data`` as ``name`` (a path inside the destination), all or nothing."""
        shard = self.create(name)
        try:
            shard.file.write(data)
        except BaseException:
            shard.discard()
            raise
        shard.commit()

    def create(self, name: str) -> NewFile:
        """A file to be written as ``name`` (a path inside the destination): write to its
        ``file``, then ``commit()`` makes it appear whole (or ``discard()`` forgets it)."""
        final = self.path(name)
        self.fs.makedirs(posixpath.dirname(final), exist_ok=True)
        if not self.renames:
            return NewFile(self, final, None)
        folder, base = posixpath.split(final)
        temporary = posixpath.join(
            folder, f".{base}.tmp-{self.host}-{os.getpid()}-{next(_counter)}"
        )
        return NewFile(self, final, temporary)

    def _fresh(self, path: str) -> str:
        """``path``, with what fsspec cached of it and its folders forgotten."""
        self.fs.invalidate_cache(path)
        return path

    def read(self, name: str) -> bytes | None:
        """The bytes of ``name``, or ``None`` if there is no such file."""
        try:
            with self.fs.open(self._fresh(self.path(name)), "rb") as source:
                return source.read()
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self._fresh(self.path(name))))

    def names(self, folder: str = "") -> list[str]:
        """The names of the files directly in ``folder`` (a path inside the destination)."""
        try:
            entries = self.fs.ls(self._fresh(self.path(folder)), detail=False)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(str(entry).rstrip("/")) for entry in entries)

    def remove(self, name: str) -> None:
        try:
            self.fs.rm(self.path(name))
        except FileNotFoundError:
            pass

    # ----- units in progress -------------------------------------------------------------------
    def mark_writing(self, unit_name: str) -> str:
        """Mark ``unit_name`` as being written by this process; the marker's name."""
        marker = f"{META}/writing/{unit_name}.{self.host}.{os.getpid()}"
        self.publish(marker, str(time.time()).encode())
        return marker

    def held_units(self, stale_seconds: float) -> set[str]:
        """The units a live writer holds: a marker of a live process of this host, or of
        another host touched within ``stale_seconds`` (a writer touches its marker every
        quarter of it). One listing for all units."""
        held = set()
        for marker in self.names(f"{META}/writing"):
            unit, _, owner = marker.partition(".")
            host, _, pid = owner.rpartition(".")
            if host == self.host and pid.isdigit() and not pid_alive(int(pid)):
                continue
            if not self._stale(f"{META}/writing/{marker}", stale_seconds):
                held.add(unit)
        return held

    def _stale(self, name: str, stale_seconds: float) -> bool:
        """Whether ``name`` was not modified for ``stale_seconds`` (a vanished file is)."""
        try:
            modified = self.fs.modified(self._fresh(self.path(name))).timestamp()
        except (FileNotFoundError, NotImplementedError):
            return True
        return time.time() - modified >= stale_seconds

    def clean_dead(self, stale_seconds: float | None = None) -> int:
        """Remove the markers and temporaries of this host's dead writers, and the markers
        of other hosts' writers untouched for ``stale_seconds`` (their temporaries stay:
        no pid tells whether they are dead); how many."""
        removed = 0
        for marker in self.names(f"{META}/writing"):
            if marker.startswith("."):
                continue  # a marker's temporary: below
            host, _, pid = marker.partition(".")[2].rpartition(".")
            name = f"{META}/writing/{marker}"
            if host == self.host and pid.isdigit():
                dead = not pid_alive(int(pid))
            else:
                dead = stale_seconds is not None and self._stale(name, stale_seconds)
            if dead:
                self.remove(name)
                removed += 1
        if self.renames:
            for folder, _, files in os.walk(self.root):
                for name in files:
                    owner = name.rpartition(".tmp-")[2]
                    parts = owner.rsplit("-", 2)
                    if name.startswith(".") and ".tmp-" in name and len(parts) == 3:
                        host, pid, _ = parts
                        if host == self.host and pid.isdigit() and not pid_alive(int(pid)):
                            os.remove(os.path.join(folder, name))
                            removed += 1
        return removed


class NewFile:
    """A file of a destination being written (:meth:`Destination.create`). On local disk
    it is a temporary file beside the final one (``path``), fsynced and renamed over it by
    :meth:`commit`; elsewhere it is memory, uploaded in one go by :meth:`commit`. Write
    to ``file``, or, on local disk, have a library write ``path`` itself."""

    def __init__(self, dest: Destination, final: str, temporary: str | None) -> None:
        self.dest, self.final, self.temporary = dest, final, temporary
        self._file: IO[bytes] | None = None

    @property
    def path(self) -> str | None:
        """The local temporary file behind ``file`` (``None`` off local disk): a library
        that writes files itself (without the GIL per write) may write this path instead."""
        return self.temporary

    @property
    def file(self) -> IO[bytes]:
        if self._file is None:
            self._file = open(self.temporary, "wb") if self.temporary else io.BytesIO()
        return self._file

    def commit(self, checksum: str | None = None) -> tuple[int, str]:
        """Make the file appear whole under its name; its size and (with ``checksum``, an
        algorithm of :mod:`datapipes.write.checksum`) its checksum, read back from what
        was written."""
        if self.temporary is None:
            assert isinstance(self.file, io.BytesIO)
            data = self.file.getbuffer()
            size = len(data)
            digest = checksum_bytes(checksum, data) if checksum else ""
            with self.dest.fs.open(self.final, "wb") as out:
                out.write(data)
            del data
            return size, digest
        if self._file is not None:
            self._file.close()
        fd = os.open(self.temporary, os.O_RDONLY)  # fsync syncs the file, whichever fd
        try:
            os.fsync(fd)
            size = os.fstat(fd).st_size
            digest = checksum_fd(checksum, fd) if checksum else ""
        finally:
            os.close(fd)
        os.replace(self.temporary, self.final)  # atomic: readers see the old file or the new one
        return size, digest

    def discard(self) -> None:
        """Forget the file: nothing appears under its name."""
        if self._file is not None:
            self._file.close()
        if self.temporary is not None:
            try:
                os.remove(self.temporary)
            except FileNotFoundError:
                pass
