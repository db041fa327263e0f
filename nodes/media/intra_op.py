"""Small per-item torch ops on one intra-op thread, without changing the process's setting.

A resize of one image takes about 0.3 ms; torch splits it over its intra-op
threads (one per core in the main process), and on busy cores waiting for
them costs more than the split saves: decode + crop in the main process ran
at 70-80 images/s with torch's 2 threads against 240-380 with one, measured on
2 loaded cores. Per-item work is parallel across items already (DataLoader
workers, thread pools), so such ops run best on one thread.

torch's CPU ops run on OpenMP, whose thread count is a per-thread setting:
:func:`one_thread` sets it to 1 for the calling thread around the call and
back, so other threads (a training loop) keep theirs. Where torch's OpenMP
runtime cannot be found (another build), calls run unchanged; the results are
the same either way, only the time differs.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

R = TypeVar("R")

_runtime: Any = None
_looked = False
_lock = threading.Lock()


def openmp_runtime() -> Any | None:
    """torch's OpenMP library (``omp_set_num_threads`` and friends), or ``None``."""
    global _runtime, _looked
    if not _looked:
        with _lock:
            if not _looked:
                _runtime, _looked = _find_runtime(), True
    return _runtime


def _find_runtime() -> Any | None:
    folder = os.path.join(os.path.dirname(torch.__file__), "lib")
    paths: list[str | None] = []
    for pattern in ("libgomp*.so*", "libiomp5*", "libomp*"):
        paths.extend(sorted(glob.glob(os.path.join(folder, pattern))))
    paths.append(None)  # the libraries loaded into the process's global scope
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            if _is_torchs(lib):
                return lib
        except (OSError, AttributeError):
            continue
    return None


def _is_torchs(lib: Any) -> bool:
    """Whether setting ``lib``'s thread count is what torch then reports (on a scratch thread,
    so no thread of the caller's is touched)."""
    seen: list[bool] = []

    def probe() -> None:
        before = torch.get_num_threads()  # torch sets up this thread's count first
        lib.omp_set_num_threads(before + 1)
        seen.append(torch.get_num_threads() == before + 1)

    thread = threading.Thread(target=probe, name="datapipes-openmp-probe")
    thread.start()
    thread.join()
    return seen == [True]


def one_thread(fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)`` with torch's intra-op threads set to 1 for this thread, then restored."""
    lib = openmp_runtime()
    if lib is None:
        return fn(*args)
    before = torch.get_num_threads()  # this thread's count (torch sets it on first use)
    if before == 1:
        return fn(*args)
    lib.omp_set_num_threads(1)
    try:
        return fn(*args)
    finally:
        lib.omp_set_num_threads(before)
