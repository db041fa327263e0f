"""Running Python code in a fresh interpreter, for tests that cross a process boundary."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, *args: str, hash_seed: str = "123") -> str:
    """Run ``python -c code args...`` in a new process; return its stdout, fail on error.

    ``hash_seed`` sets PYTHONHASHSEED, so tests can show that nothing depends on ``hash()``.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_forked_ranks(
    target: Callable[..., None],
    store: Path,
    *args: Any,
    world_size: int = 2,
    answers_per_rank: int = 1,
    timeout: float = 60,
) -> list[Any]:
    """A gloo job of ``world_size`` forked processes; what they put on their queue, sorted.

    Each process runs ``target(rank, store_file, *args, answers)``, where ``store_file``
    is the file store for ``init_process_group`` and ``answers`` a queue to report on.
    A rank that hangs is killed after ``timeout`` seconds.
    """
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    ranks = [
        context.Process(target=target, args=(rank, str(store), *args, answers))
        for rank in range(world_size)
    ]
    for process in ranks:
        process.start()
    try:
        results = [answers.get(timeout=timeout) for _ in range(world_size * answers_per_rank)]
    finally:
        for process in ranks:
            process.join(timeout=timeout)
            if process.is_alive():
                process.kill()
    assert [process.exitcode for process in ranks] == [0] * world_size
    return sorted(results, key=str)


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a rank's DataLoader workers), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(") ", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
    return found


def processes_in_group(group: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found
