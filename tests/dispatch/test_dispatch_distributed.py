"""Dynamic dispatch in real torchrun jobs (gloo, CPU): exactly once, a slow rank, faults.

Four jobs run ``tests/dispatch_job.py`` one after the other (see its doc for the phases);
every Loader claims its units through the default process group's store:

1. 2 ranks: whole epochs with 0 and 2 DataLoader workers per rank (even_batches on, the
   default under torch.distributed), and the same with rank 1 slow (even_batches off).
2. 3 ranks: the same; then job A stops mid-epoch (2 workers per rank) and saves each
   rank's state; then a run that saves at step k and whose rank 1 SIGKILLs itself a few
   items later: the job dies.
3. 2 ranks: resumes A (3 -> 2 ranks, dynamic) and the killed job (3 -> 2, dynamic).
4. 3 ranks: resumes A as static dealing, and the killed job on its own topology (dynamic).

A job that does not end in time is killed and fails its test (no hang). Every resume is
read twice from the same merged state: with even_batches (the ranks' deliveries plus what
``dropped()`` counts are the rest of the epoch) and without (the rest, exactly).

The tests after those: a DataLoader worker SIGKILLed mid-unit (the state taken after the
error resumes exactly, on the same topology and others), and a TCPStore whose host process
is killed or stalled (SIGSTOP) while two Loader processes claim from it: a DispatchStoreError
naming the store on both, within a bounded time, never a hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torchrun_jobs import child_env, torchrun_may_fail, write_data

import datapipes as dp
from nodes.dispatch import DispatchStoreError

pytestmark = pytest.mark.slow  # every test reads what torchrun jobs or subprocesses did

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "dispatch_job.py"
SIZES = [23, 61, 17, 35, 48, 29, 52, 19, 41, 30]  # records per file
SHARED = {"data": "data/*.jsonl", "seed": 7, "buffer": 8}
EVEN_DROPS = "even_batches (Loader)"


def epoch(name: str, workers: int, **options: Any) -> dict[str, Any]:
    return {"name": name, "mode": "epoch", "workers": workers, **options}


def resume(name: str, ckpt: str, workers: int, **options: Any) -> dict[str, Any]:
    return {"name": name, "mode": "resume", "ckpt": ckpt, "workers": workers, **options}


STOP_A = {"name": "A", "mode": "stop", "workers": 2, "stop_step": 40, "ckpt": "A"}
KILLED = {
    "name": "K",
    "mode": "kill",
    "workers": 1,
    "stop_step": 30,
    "kill_after": 12,
    "kill_rank": 1,
    "ckpt": "K",
}
JOBS = [  # (job, ranks, its phases, whether it must succeed)
    (
        "two",
        2,
        [
            epoch("even2w0", 0),
            epoch("even2w2", 2),
            epoch("slow2w0", 0, slow=True, even=False),
            epoch("slow2w2", 2, slow=True, even=False),
        ],
        True,
    ),
    (
        "three",
        3,
        [
            epoch("even3w0", 0),
            epoch("even3w2", 2),
            epoch("slow3w0", 0, slow=True, even=False),
            epoch("slow3w2", 2, slow=True, even=False),
            STOP_A,
            KILLED,
        ],
        False,  # its rank 1 kills itself in the last phase
    ),
    (
        "resume2",
        2,
        [
            resume("A_dynamic2", "A", 0),
            resume("A_dynamic2_uneven", "A", 2, even=False),
            resume("K_dynamic2", "K", 0),
            resume("K_dynamic2_uneven", "K", 0, even=False),
        ],
        True,
    ),
    (
        "resume3",
        3,
        [
            resume("A_static3", "A", 0, dispatch="static"),
            resume("A_static3_uneven", "A", 0, dispatch="static", even=False),
            resume("K_dynamic3", "K", 1),
            resume("K_dynamic3_uneven", "K", 1, even=False),
        ],
        True,
    ),
]
EVEN_EPOCHS = ["even2w0", "even2w2", "even3w0", "even3w2"]
SLOW_EPOCHS = ["slow2w0", "slow2w2", "slow3w0", "slow3w2"]
RESUMES = {  # resume phase -> (the stop it resumes, its even_batches=False twin)
    "A_dynamic2": ("A", "A_dynamic2_uneven"),
    "A_static3": ("A", "A_static3_uneven"),
    "K_dynamic2": ("K", "K_dynamic2_uneven"),
    "K_dynamic3": ("K", "K_dynamic3_uneven"),
}


# ----- running the jobs -----------------------------------------------------------------------


@dataclass
class Ran:
    returncode: int
    stderr: str
    seconds: float


def launch(root: Path, name: str, nproc: int, phases: list[dict[str, Any]]) -> Ran:
    """dispatch_job.py under torchrun with ``nproc`` ranks in ``root`` (paths in the config
    are relative to it); a job that does not end in time is stopped and fails the test."""
    config = root / f"{name}.json"
    config.write_text(json.dumps({**SHARED, "phases": phases, "out": str(root / "out")}))
    started = time.perf_counter()
    what = f"the {nproc}-rank job {name}"
    returncode, stdout, stderr = torchrun_may_fail(JOB, config, nproc, root, what)
    return Ran(returncode, stdout + stderr, time.perf_counter() - started)


@dataclass
class Runs:
    dataset: list[int]
    jobs: dict[str, Ran]
    phases: dict[str, list[dict[str, Any] | None]]  # phase -> each rank's result (None: none)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("dispatch")
    dataset = write_data(root / "data", SIZES)
    jobs: dict[str, Ran] = {}
    phases: dict[str, list[dict[str, Any] | None]] = {}
    for name, nproc, steps, must_succeed in JOBS:
        ran = jobs[name] = launch(root, name, nproc, steps)
        if must_succeed:
            assert ran.returncode == 0, f"the job {name} failed:\n{ran.stderr[-8000:]}"
        for step in steps:
            files = [root / "out" / step["name"] / f"rank{r}.json" for r in range(nproc)]
            phases[step["name"]] = [
                json.loads(f.read_text()) if f.exists() else None for f in files
            ]
    print("job seconds:", {name: round(ran.seconds, 1) for name, ran in jobs.items()})
    return Runs(dataset, jobs, phases)


def results(runs: Runs, phase: str) -> list[dict[str, Any]]:
    found = runs.phases[phase]
    missing = [rank for rank, result in enumerate(found) if result is None]
    assert missing == [], f"{phase}: ranks {missing} wrote no result"
    return [r for r in found if r is not None]


def assert_once(per_rank: list[list[int]], dataset: list[int], what: str) -> list[int]:
    seen = [i for ids in per_rank for i in ids]
    twice = sorted(i for i, n in Counter(seen).items() if n > 1)
    assert twice == [], f"{what}: delivered twice: {twice[:20]}"
    assert set(seen) <= set(dataset), f"{what}: ids not in the data"
    return seen


def even_drops(result: dict[str, Any]) -> int:
    unexpected = set(result["dropped"]) - {EVEN_DROPS}
    assert not unexpected, f"drops of another kind: {result['dropped']}"
    return result["dropped"].get(EVEN_DROPS, 0)


# ----- whole epochs ---------------------------------------------------------------------------


@pytest.mark.parametrize("phase", EVEN_EPOCHS)
def test_even_epochs_deliver_every_item_once_plus_what_dropped_counts(runs: Runs, phase: str):
    found = results(runs, phase)
    assert all(r["even_batches"] for r in found)
    seen = assert_once([r["ids"] for r in found], runs.dataset, phase)
    dropped = sum(even_drops(r) for r in found)
    assert len(seen) + dropped == len(runs.dataset), (len(seen), dropped)
    assert len({len(r["ids"]) for r in found}) == 1, [len(r["ids"]) for r in found]
    assert all(r["claimed"] > 0 for r in found), [r["claimed"] for r in found]


@pytest.mark.parametrize("phase", SLOW_EPOCHS)
def test_a_slow_rank_gets_fewer_items_and_nothing_is_lost(runs: Runs, phase: str):
    found = results(runs, phase)
    assert not any(r["even_batches"] for r in found)
    seen = assert_once([r["ids"] for r in found], runs.dataset, phase)
    assert sorted(seen) == runs.dataset
    counts = [len(r["ids"]) for r in found]
    others = [n for rank, n in enumerate(counts) if rank != 1]
    assert counts[1] < min(others), counts
    assert counts[1] < len(runs.dataset) / len(found) / 2, counts  # under half a fair share
    assert all(r["dropped"] == {} for r in found)


# ----- resumes -------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", list(RESUMES))
def test_a_resume_delivers_the_rest_once_plus_what_dropped_counts(runs: Runs, phase: str):
    stop, _ = RESUMES[phase]
    before = [r["ids"] for r in results(runs, stop)]
    found = results(runs, phase)
    assert all(r["even_batches"] for r in found)
    seen = assert_once(before + [r["ids"] for r in found], runs.dataset, phase)
    dropped = sum(even_drops(r) for r in found)
    assert len(seen) + dropped == len(runs.dataset), (len(seen), dropped)
    assert len({len(r["ids"]) for r in found}) == 1, [len(r["ids"]) for r in found]


@pytest.mark.parametrize("phase", list(RESUMES))
def test_a_resume_without_even_batches_delivers_exactly_the_rest(runs: Runs, phase: str):
    stop, uneven = RESUMES[phase]
    before = [r["ids"] for r in results(runs, stop)]
    found = results(runs, uneven)
    seen = assert_once(before + [r["ids"] for r in found], runs.dataset, uneven)
    assert sorted(seen) == runs.dataset
    assert all(r["ids"] for r in found), "a new rank got nothing"


def test_the_stopped_job_had_read_into_its_epoch(runs: Runs):
    """So the resumes are mid-epoch ones: every rank delivered and claimed units."""
    for stop in (STOP_A, KILLED):
        found = results(runs, stop["name"])
        assert [len(r["ids"]) for r in found] == [stop["stop_step"]] * 3
        assert all(r["claimed_at_stop"] > 0 for r in found)


def test_the_killed_rank_ended_its_job(runs: Runs):
    ran = runs.jobs["three"]
    assert ran.returncode != 0
    assert "SIGKILL" in ran.stderr or "Signal 9" in ran.stderr, ran.stderr[-3000:]
    # The phases before it ran to their end; the killed phase wrote only its checkpoint.
    for phase in [*EVEN_EPOCHS[2:], *SLOW_EPOCHS[2:]]:
        results(runs, phase)
    assert all("claimed" not in r for r in results(runs, KILLED["name"]))


# ----- a DataLoader worker SIGKILLed mid-unit (one process, the Loader's own TCPStore) ----------

KILL_FLAG = "DISPATCH_TEST_KILL_FLAG"  # a file path: the first worker to create it dies
ITEMS, UNIT = 600, 50
KILL_AT = 30  # the worker's 30th item: inside its first unit


def die_once_mid_unit(x: int) -> int:
    """A DataLoader worker SIGKILLs itself at its KILL_AT-th item, once per test (the flag
    file is created atomically: the resumed Loaders' workers find it there and go on)."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return x
    seen = _seen_in_this_process[0] = _seen_in_this_process[0] + 1
    if seen == KILL_AT:
        try:
            os.close(os.open(os.environ[KILL_FLAG], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return x
        os.kill(os.getpid(), signal.SIGKILL)
    return x


_seen_in_this_process = [0]  # forked workers each count their own


def kill_recipe() -> dp.DataPipe[int]:
    return dp.range(ITEMS).shuffle().map(die_once_mid_unit)


def read_rest(state: dict[str, Any], topology: str) -> list[int]:
    """Every item a new Loader (of ``topology``) delivers from ``state``."""
    options: dict[str, Any] = {"seed": 3, "dispatch_unit_items": UNIT}
    if topology == "dynamic, 1 rank x 2 workers":  # the killed Loader's own
        loaders = [dp.Loader(kill_recipe(), num_workers=2, dispatch="dynamic", **options)]
    elif topology == "dynamic, 2 ranks x 0 workers":  # two ranks sharing one TCPStore
        store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        loaders = [
            dp.Loader(
                kill_recipe(),
                rank=rank,
                world_size=2,
                even_batches=False,
                dispatch="dynamic",
                store=store,
                **options,
            )
            for rank in range(2)
        ]
    else:  # static dealing, 3 workers
        loaders = [dp.Loader(kill_recipe(), num_workers=3, **options)]
    rest: list[int] = []
    for loader in loaders:
        loader.load_state_dict(state)
    iterators = [iter(loader) for loader in loaders]
    while iterators:  # the ranks interleaved, as if they ran side by side
        for it in list(iterators):
            item = next(it, None)
            if item is None:
                iterators.remove(it)
            else:
                rest.append(int(item))
    for loader in loaders:
        loader.close()
    return rest


@pytest.mark.timeout(120)
def test_a_worker_killed_mid_unit_leaves_a_state_that_resumes_exactly(tmp_path, monkeypatch):
    from nodes.testing import roundtrip_state

    monkeypatch.setenv(KILL_FLAG, str(tmp_path / "killed"))
    _seen_in_this_process[0] = 0
    # One item a transfer: the items before the kill reach the main process (a transfer of
    # several may die with the worker, still in its queue's buffer); the resumed Loaders
    # below take the default, so the state also resumes under another setting.
    loader = dp.Loader(
        kill_recipe(),
        seed=3,
        num_workers=2,
        dispatch="dynamic",
        dispatch_unit_items=UNIT,
        items_per_transfer=1,
    )
    got: list[int] = []
    with pytest.raises(dp.WorkerDiedError, match="SIGKILL") as died:
        for item in loader:
            got.append(int(item))
    assert (tmp_path / "killed").exists()  # it was this test's kill, not another death
    assert 0 < len(got) < ITEMS
    state = roundtrip_state(loader.state_dict())  # taken after the error
    loader.close()
    record = state["ranks"]["0"]["dispatch"]
    claimed = [
        u for places in record["claims"].values() for units in places.values() for u in units
    ]
    assert len(claimed) == len(set(claimed)) and claimed, record
    print(f"killed after {len(got)} items; {died.value}".splitlines()[0])
    for topology in (
        "dynamic, 1 rank x 2 workers",
        "dynamic, 2 ranks x 0 workers",
        "static, 1 rank x 3 workers",
    ):
        rest = read_rest(state, topology)
        both = got + rest
        twice = sorted(i for i, n in Counter(both).items() if n > 1)
        assert twice == [], f"{topology}: delivered twice: {twice[:20]}"
        assert sorted(both) == list(range(ITEMS)), f"{topology}: lost {ITEMS - len(both)}"


# ----- the store's host process killed (or stalled) while two Loader processes claim from it --

#: Long enough that a store op answered late on a loaded 2-core machine is not taken for a
#: dead host before the test kills it (4 s was, once, with the other agents and a suite beside).
STORE_TIMEOUT_S = 10.0

STORE_HOST = """
import sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(600)
"""

STORE_RANK = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
import datapipes as dp

port, rank, workers, started = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def paced(x):
    time.sleep(0.01)  # the epoch lasts long enough to be mid-way when the store dies
    return x

# The Loader bounds every claim by the timeout of the store it is given: a stalled host is
# then an error after STORE_TIMEOUT_S seconds, not after the default minute.
store = dist.TCPStore(
    "127.0.0.1", port, is_master=False, wait_for_workers=False,
    timeout=timedelta(seconds=float(sys.argv[5])),
)
loader = dp.Loader(
    dp.range(100_000).map(paced), rank=rank, world_size=2, num_workers=workers,
    dispatch="dynamic", store=store, even_batches=False, dispatch_unit_items=20,
)
delivered = 0
try:
    for item in loader:
        delivered += 1
        if delivered == 5:
            open(started, "w").close()
except Exception as error:
    print(f"{type(error).__module__}.{type(error).__name__} after {delivered}: {error}")
    sys.exit(3)
print(f"ended after {delivered} items")
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("how", "workers"), [("killed", 0), ("stalled", 0), ("stalled", 2)])
def test_a_store_whose_host_dies_is_a_clear_error_on_every_rank_soon(tmp_path, how, workers):
    """Killed: the clients' sockets are reset, the next claim fails at once. Stalled (SIGSTOP:
    a frozen host, a partition without a reset): a claim gets no answer, and fails after the
    store timeout instead of blocking in recv() forever."""
    env = child_env()
    host = subprocess.Popen(
        [sys.executable, "-c", STORE_HOST], stdout=subprocess.PIPE, text=True, env=env
    )
    ranks: list[subprocess.Popen[str]] = []
    try:
        port = int(host.stdout.readline())  # type: ignore[union-attr]
        flags = [tmp_path / f"started{rank}" for rank in range(2)]
        for rank in range(2):
            args = [str(port), str(rank), str(workers), str(flags[rank]), str(STORE_TIMEOUT_S)]
            ranks.append(
                subprocess.Popen(
                    [sys.executable, "-c", STORE_RANK, *args],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    cwd=tmp_path,
                )
            )
        deadline = time.monotonic() + 60
        while not all(f.exists() for f in flags):
            ended = [r for r in ranks if r.poll() is not None]
            assert not ended, f"a rank ended before the store died: {ended[0].communicate()}"
            assert time.monotonic() < deadline, "the ranks did not start reading"
            time.sleep(0.05)
        os.kill(host.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        killed = time.monotonic()
        for rank, process in enumerate(ranks):
            try:
                stdout, stderr = process.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
                pytest.fail(f"rank {rank} hung after its store died:\n{stderr[-3000:]}")
            took = time.monotonic() - killed
            print(f"{how}, workers={workers}, rank {rank}: ended after {took:.1f}s: {stdout}")
            assert process.returncode == 3, f"rank {rank}: {stdout}\n{stderr[-3000:]}"
            assert stdout.startswith(f"{DispatchStoreError.__module__}.DispatchStoreError"), stdout
            assert f"TCPStore 127.0.0.1:{port}" in stdout
            if how == "stalled":
                assert "no answer within" in stdout
            assert took < STORE_TIMEOUT_S + 30, f"rank {rank} took {took:.0f}s to fail"
    finally:
        for process in [host, *ranks]:
            if process.poll() is None:
                process.kill()
                process.wait()


STALLING_RANK = """
import json, sys, time
from datetime import timedelta
import torch.distributed as dist
import datapipes as dp

port, rank, started, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

def paced(x):
    time.sleep(0.002)
    return x

store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                      timeout=timedelta(seconds=60))
loader = dp.Loader(dp.range(3000).shuffle().map(paced), rank=rank, world_size=2,
                   dispatch="dynamic", store=store, even_batches=False, dispatch_unit_items=50)
got = []
for item in loader:
    got.append(item)
    if len(got) == 20:
        open(started, "w").close()
json.dump(got, open(out, "w"))
"""


@pytest.mark.timeout(150)
def test_a_stalled_rank_delivers_the_rest_of_its_unit_late_and_nothing_twice(tmp_path):
    """Rank 1 is frozen (SIGSTOP) inside a unit while rank 0 empties the pool; thawed, it
    delivers the rest of the unit it held. Nothing is handed out twice (no lease takes the
    unit over), nothing is lost, and the frozen rank's share is what it had claimed."""
    env = child_env()
    host = subprocess.Popen(
        [sys.executable, "-c", STORE_HOST], stdout=subprocess.PIPE, text=True, env=env
    )
    ranks: list[subprocess.Popen[str]] = []
    try:
        port = int(host.stdout.readline())  # type: ignore[union-attr]
        flags = [tmp_path / f"started{rank}" for rank in range(2)]
        outs = [tmp_path / f"rank{rank}.json" for rank in range(2)]
        for rank in range(2):
            args = [str(port), str(rank), str(flags[rank]), str(outs[rank])]
            ranks.append(
                subprocess.Popen(
                    [sys.executable, "-c", STALLING_RANK, *args],
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    cwd=tmp_path,
                )
            )
        deadline = time.monotonic() + 60
        while not flags[1].exists():
            assert time.monotonic() < deadline, "rank 1 did not start reading"
            time.sleep(0.01)
        os.kill(ranks[1].pid, signal.SIGSTOP)  # frozen mid-unit (units of 50, at item 20)
        try:
            ranks[0].wait(timeout=90)  # rank 0 empties the pool alone
        finally:
            os.kill(ranks[1].pid, signal.SIGCONT)
        ranks[1].wait(timeout=60)
        for rank, process in enumerate(ranks):
            assert process.returncode == 0, f"rank {rank}: {process.stderr.read()[-3000:]}"
        got = [json.loads(path.read_text()) for path in outs]
        assert sorted(got[0] + got[1]) == list(range(3000))  # once each, none lost
        assert 20 <= len(got[1]) < len(got[0])  # the frozen rank kept only what it held
    finally:
        for process in [host, *ranks]:
            if process.poll() is None:
                process.kill()
                process.wait()
