"""Saving a checkpoint so that a crash at any moment leaves a complete file.

``torch.save(obj, "ckpt.pt")`` truncates ``ckpt.pt`` first and then writes it:
a job killed during the save (a preempted node, an out-of-memory kill, a
``SIGKILL`` at the end of a time slot) leaves neither the old checkpoint nor
the new one, only an unreadable prefix, and the next start has nothing to
resume from. :func:`save_checkpoint` writes the new checkpoint to a
temporary file next to the target, makes it durable and then renames it over
the target in one step, so the target is always the old complete file or the
new complete one::

    >>> import tempfile, torch, datapipes as dp
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     dp.save_checkpoint({"step": 7, "weights": torch.ones(2)}, f"{folder}/ckpt.pt")
    ...     dp.load_checkpoint(f"{folder}/ckpt.pt")["step"]
    7
"""

from __future__ import annotations

import contextlib
import glob
import os
import pickle
import re
import secrets
import socket
import stat
from pathlib import Path
from typing import IO, Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem

__all__ = ["load_checkpoint", "save_checkpoint"]

# Filesystems whose move replaces the target in one step (memory: one dict assignment).
_ATOMIC_MOVE = {"memory"}
# Object stores publish an object only when its upload completes: a direct write is
# all-or-nothing there, and a "move" would be a second full copy.
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"}

_HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:32] or "host"


def save_checkpoint(obj: Any, path: str | os.PathLike[str], **storage_options: Any) -> None:
    """``torch.save(obj, path)`` that a crash at any moment cannot leave half-written.

    A local ``path`` is written as ``.{name}.tmp-{host}-{pid}-{random}`` in the
    same directory, flushed and fsynced, renamed over ``path`` with
    ``os.replace`` and the directory is fsynced (POSIX), so after a crash
    ``path`` holds the old complete checkpoint or the new complete one. A save
    that fails (an object that cannot be pickled, a full disk) removes its
    temporary file and leaves ``path`` untouched. Temporary files left by
    processes of this host that were killed during a save are removed by the
    next successful save of the same ``path``. A symlink is written through,
    as ``torch.save`` would.

    fsspec URLs (``storage_options`` go to the filesystem): on ``memory://``
    the temporary file is moved over the target, which replaces it in one
    step; object stores (``s3://``, ``gs://``, ``az://``, ...) are written
    directly, which is atomic there because an object appears only when its
    upload completes. Other filesystems (``sftp://``, ``ftp://``, ``smb://``,
    ...) are written directly too and are **not** protected against a crash
    during the save; save locally and copy the file there if that matters.

    >>> import tempfile, datapipes as dp
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     dp.save_checkpoint({"epoch": 3}, f"{folder}/ckpt.pt")
    ...     dp.load_checkpoint(f"{folder}/ckpt.pt")
    {'epoch': 3}
    """
    text = os.fspath(path)
    if "://" in text or "::" in text:
        fs, fs_path = fsspec.core.url_to_fs(text, **storage_options)
        if not isinstance(fs, LocalFileSystem):
            _save_fsspec(obj, fs, fs_path)
            return
        text = fs_path
    _save_local(obj, Path(text))


def load_checkpoint(
    path: str | os.PathLike[str], map_location: Any = None, **storage_options: Any
) -> Any:
    """``torch.load(path, weights_only=True)`` with a clear error for an incomplete file.

    Only plain data and tensors are loaded (no arbitrary pickled objects), which is
    all a model, optimizer or :class:`datapipes.Loader` state holds. A file that is
    cut short or is not a ``torch.save`` file raises a ``RuntimeError`` naming
    ``path``; a missing file raises ``FileNotFoundError`` (so "no checkpoint yet"
    can be told apart). fsspec URLs take ``storage_options``.

    >>> import pathlib, tempfile, datapipes as dp
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     dp.save_checkpoint({"epoch": 3}, f"{folder}/ckpt.pt")
    ...     whole = pathlib.Path(f"{folder}/ckpt.pt").read_bytes()
    ...     _ = pathlib.Path(f"{folder}/cut.pt").write_bytes(whole[: len(whole) // 2])
    ...     dp.load_checkpoint(f"{folder}/cut.pt")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    RuntimeError: .../cut.pt is not a complete checkpoint
    """
    text = os.fspath(path)
    if "://" in text or "::" in text:
        fs, fs_path = fsspec.core.url_to_fs(text, **storage_options)
        opened = fs.open(fs_path, "rb")
    else:
        opened = open(text, "rb")  # a missing or unreadable path fails here, as itself
    with opened as file:
        return _load(file, text, map_location)


def _load(file: IO[bytes], name: str, map_location: Any) -> Any:
    # torch.save writes a zip archive, whose index sits at the end: a zip that gets as far as
    # unpickling is complete, so a refusal there is about its contents. Anything else the
    # weights-only unpickler refuses is garbage or the legacy format, never "trust it".
    is_zip = file.read(4) == b"PK\x03\x04"
    file.seek(0)
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if not is_zip or "Weights only load failed" not in str(error):
            raise _incomplete(name, error) from error
        lines = [line.strip() for line in str(error).splitlines()]
        details = [line for line in lines if line.startswith("WeightsUnpickler error:")]
        reason = (details or lines)[0].removeprefix("WeightsUnpickler error:").split(". ")[0]
        raise pickle.UnpicklingError(
            f"{name} holds objects that torch.load(weights_only=True) refuses to load "
            f"({reason.strip()}). load_checkpoint loads only plain data and tensors; if you "
            f"trust the file, load it with torch.load({name!r}, weights_only=False)."
        ) from error
    except Exception as error:  # truncation shows as EOFError, OSError, RuntimeError, KeyError
        raise _incomplete(name, error) from error


def _incomplete(name: str, error: BaseException) -> RuntimeError:
    # torch's messages run on for lines; the first sentence says what failed
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0]
    return RuntimeError(
        f"{name} is not a complete checkpoint ({type(error).__name__}: {reason}): it may "
        "have been cut by a crash during a save that did not use save_checkpoint, or it "
        "is not a torch.save file. Resume from an earlier checkpoint, and save with "
        "dp.save_checkpoint, which never leaves a half-written file."
    )


def _save_local(obj: Any, target: Path) -> None:
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    folder = target.parent
    if not folder.is_dir():
        raise FileNotFoundError(
            f"cannot save the checkpoint to {target}: the directory {folder} does not "
            "exist; create it first (os.makedirs(..., exist_ok=True))"
        )
    if target.is_dir():
        raise IsADirectoryError(
            f"cannot save the checkpoint to {target}: it is a directory; pass a file name"
        )
    prefix = f".{target.name[:120]}.tmp-"  # cut: the whole name must stay under NAME_MAX
    temporary = folder / f"{prefix}{_HOST}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        file = open(temporary, "xb")  # "x": never reuse someone else's file
    except PermissionError as error:
        raise PermissionError(
            f"cannot save the checkpoint to {target}: save_checkpoint writes a temporary "
            f"file next to it and renames it, and the directory {folder} is not writable "
            "by this process; make it writable or save to another directory"
        ) from error
    try:
        with file:
            with contextlib.suppress(FileNotFoundError):  # a private checkpoint stays private
                os.chmod(file.fileno(), stat.S_IMODE(os.stat(target).st_mode))
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())  # the data is on disk before the name points at it
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(folder)  # the rename itself survives a power loss
    _remove_stale(folder, prefix)


def _fsync_directory(folder: Path) -> None:
    if os.name != "posix":
        return  # Windows cannot open a directory; os.replace is its atomic step
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems (e.g. certain network mounts) refuse fsync on a directory
    finally:
        os.close(descriptor)


def _remove_stale(folder: Path, prefix: str) -> None:
    """Removes temporary files of this target left by killed processes of this host.

    Only files named with this host and a pid that no longer runs: a save in
    progress elsewhere (another host on a shared filesystem, a live process) is
    never touched.
    """
    for leftover in folder.glob(f"{glob.escape(prefix)}{_HOST}-*"):
        pid_text = leftover.name[len(prefix) + len(_HOST) + 1 :].split("-")[0]
        if pid_text.isdigit() and not _running(int(pid_text)):
            with contextlib.suppress(OSError):
                leftover.unlink()


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it runs, as another user
        return True
    return True


def _save_fsspec(obj: Any, fs: Any, target: str) -> None:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if not protocols & _ATOMIC_MOVE:
        with fs.open(target, "wb") as file:
            torch.save(obj, file)
        return
    parent, slash, name = target.rpartition("/")
    temporary = f"{parent}{slash}.{name[:120]}.tmp-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with fs.open(temporary, "wb") as file:
            torch.save(obj, file)
        fs.mv(temporary, target)
    except BaseException:
        with contextlib.suppress(Exception):
            if fs.exists(temporary):
                fs.rm(temporary)
        raise
