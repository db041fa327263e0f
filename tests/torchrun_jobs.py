"""Running torchrun jobs from tests: the environment, a timeout that kills every rank,
and reading what the ranks reported (the sample ids they consumed, their warnings)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 240
#: The jobs' gloo collective timeout: a rank starved of CPU on a loaded machine (seen: 60 s
#: were not enough with two pytest processes beside 3 ranks and their workers) still arrives.
COLLECTIVE_S = 180

WARNING = re.compile(  # as the job prints it: [phase] file:line: Category: message
    r"^\[(\w+)\] \S+: UnevenDataWarning: even_batches: rank (\d+) dropped its last (\d+) "
    r"item\(s\) of epoch (\d+) so that every rank yields (\d+)\.",
    re.MULTILINE,
)

Steps = list[list[int]]  # the sample ids of each step (batch) of one epoch on one rank


# ----- running a job ----------------------------------------------------------------------


def write_data(folder: Path, sizes: list[int]) -> list[int]:
    """JSONL files with ``sizes[i]`` records each (very different sizes); returns all ids."""
    folder.mkdir(parents=True)
    next_id = 0
    for index, size in enumerate(sizes):
        lines = []
        for _ in range(size):
            i = next_id
            x = [((i * 37) % 11) / 11, ((i * 53) % 7) / 7, -(i % 5) / 5, 1.0]
            lines.append(json.dumps({"id": i, "x": x, "y": (i % 3) - 1.0}))
            next_id += 1
        (folder / f"part-{index:02d}.jsonl").write_text("".join(line + "\n" for line in lines))
    return list(range(next_id))


def child_env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
        and not key.startswith("TORCHELASTIC_")
    }
    path = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    return {**env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


@dataclass
class Job:
    ranks: list[dict[str, Any]]  # rank<R>.json of each rank, in rank order
    stderr: str


def torchrun(job: Path, config_path: Path, nproc: int, cwd: Path, what: str) -> tuple[str, str]:
    """Run ``job`` under torchrun with ``nproc`` ranks; its (stdout, stderr). Fails the test,
    naming ``what``, when the job exits with an error or hangs (then all ranks are killed)."""
    returncode, stdout, stderr = torchrun_may_fail(job, config_path, nproc, cwd, what)
    if returncode != 0 and aborted_in_teardown(stderr, config_path, nproc):
        warnings.warn(
            f"{what}: a rank aborted in torch's teardown ({TEARDOWN_ABORT!r}) after every "
            "rank had written its results; the results are checked as usual",
            stacklevel=2,
        )
        return stdout, stderr
    assert returncode == 0, f"{what} failed ({returncode}):\n{stderr[-8000:]}"
    return stdout, stderr


#: What the C++ runtime prints when a std::thread is destroyed while joinable: seen, rarely and
#: under load, as a rank exits after destroy_process_group (a thread of torch's, not ours).
TEARDOWN_ABORT = "terminate called without an active exception"


def aborted_in_teardown(stderr: str, config_path: Path, nproc: int) -> bool:
    """Whether the job's only failure is that abort, after every rank wrote its results
    (``rank<R>.json`` in the config's ``out``, written just before the final barrier)."""
    if TEARDOWN_ABORT not in stderr:
        return False
    try:
        out = Path(json.loads(config_path.read_text())["out"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all((out / f"rank{rank}.json").exists() for rank in range(nproc))


def torchrun_may_fail(
    job: Path, config_path: Path, nproc: int, cwd: Path, what: str
) -> tuple[int, str, str]:
    """:func:`torchrun` for a job that may exit with an error (a rank killed on purpose):
    its (exit code, stdout, stderr). A hang still fails the test, naming ``what``."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(job),
        str(config_path),
    ]
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a hang is killed with all ranks
    )
    try:
        stdout, stderr = process.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stdout, stderr = stop_job(process)
        pytest.fail(f"{what} hung: killed after {JOB_TIMEOUT_S}s\n{stderr[-4000:]}")
    return process.returncode, stdout, stderr


def descendants(pid: int) -> list[int]:
    """The processes started under ``pid``, children before grandchildren (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        kids = children.get(queue.pop(0), [])
        found += kids
        queue += kids
    return found


def stop_job(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Stop a hung torchrun and its ranks; return its output so far.

    torchrun starts every rank in a session of its own, so killing torchrun's process
    group would orphan them: ask torchrun to stop them (SIGTERM), then SIGKILL whatever
    of this job is left (ranks, their DataLoader workers).
    """
    started = descendants(process.pid)
    os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        for pid in [process.pid, *started, *descendants(process.pid)]:
            with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
                os.kill(pid, signal.SIGKILL)
        return process.communicate()


def reported_drops(stderr: str, phase: str) -> dict[tuple[int, int], tuple[int, int]]:
    """``{(rank, epoch): (dropped batches, batches every rank yields)}`` from the warnings."""
    found: dict[tuple[int, int], tuple[int, int]] = {}
    for tag, rank, dropped, epoch, yields in WARNING.findall(stderr):
        if tag != phase:
            continue
        key = (int(rank), int(epoch))
        assert key not in found, f"two warnings for rank {rank}, epoch {epoch}"
        found[key] = (int(dropped), int(yields))
    return found


def flat(steps: Steps) -> list[int]:
    return [i for step in steps for i in step]


def assert_no_sample_twice(per_rank: list[Steps], dataset: list[int]) -> list[int]:
    """No id on two ranks or twice on one, all of them from the dataset; returns them all."""
    seen = [i for steps in per_rank for i in flat(steps)]
    twice = [i for i, n in Counter(seen).items() if n > 1]
    assert twice == [], f"samples consumed more than once in one epoch: {sorted(twice)[:20]}"
    assert set(seen) <= set(dataset)
    return seen
