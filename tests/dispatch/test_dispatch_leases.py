"""Dispatch leases: a stalled or dead rank's units taken over within the epoch, exactly once.

In-process tests stop a rank's heartbeat to stand for a stall (its Loader then simply
isn't iterated); the slow tests run real rank processes that share a FileStore and run no
collectives: one stops itself (SIGSTOP) or kills itself (SIGKILL) mid-epoch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from lease_helpers import LEASE, LIVE_LEASE, stall
from torchrun_jobs import child_env, torchrun_may_fail, write_data

import datapipes as dp
from datapipes.dispatch.dynamic import private_file_store
from datapipes.dispatch.takeover import LeaseTakenWarning, TakeoverCheckpointError
from nodes.dispatch.dispatcher import claimants, claims_in, seal, sealable_claim
from nodes.dispatch.lease import lease_key, state_key
from nodes.dispatch.store import StoreClient

ROOT = Path(__file__).resolve().parents[2]
#: The lease of the real rank processes: the survivors wait this long for the stopped rank,
#: and a live rank is taken for stalled only after this long without a write (its heartbeat
#: writes every quarter of it): 8x its heartbeat's interval, for processes on a loaded machine.
PROCESS_LEASE = 2.0
#: How long a rank thread may take to end before the test calls it a hang.
JOIN_SECONDS = 120


def times_ten(x: int) -> int:
    return x * 10


def make_pipe(count: int = 600, buffer: int = 0) -> dp.DataPipe[Any]:
    pipe = dp.from_sequence(list(range(count))).shuffle(seed=1).map(times_ten)
    return pipe.shuffle(buffer, seed=2) if buffer else pipe


def loaders(
    world: int,
    *,
    workers: int = 0,
    buffer: int = 0,
    count: int = 600,
    store: Any = None,
    lease: float = LEASE,
) -> list[dp.Loader]:
    store = store if store is not None else private_file_store()
    return [
        dp.Loader(
            make_pipe(count, buffer),
            seed=0,
            rank=rank,
            world_size=world,
            num_workers=workers,
            dispatch="dynamic",
            store=store,
            dispatch_unit_items=25,
            dispatch_lease_seconds=lease,
            even_batches=False,
        )  # fmt: skip
        for rank in range(world)
    ]


def read_in_threads(ranks: list[dp.Loader], which: list[int]) -> dict[int, list[Any]]:
    """One epoch of each rank in ``which``, each on its own thread, read together: every
    thread joined and checked to have ended, and an error in one raised here."""
    results: dict[int, list[Any]] = {}
    errors: dict[int, BaseException] = {}

    def run(rank: int) -> None:
        try:
            results[rank] = list(ranks[rank])
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            errors[rank] = error

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in which]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    assert not [t.name for t in threads if t.is_alive()], f"a rank hung ({JOIN_SECONDS} s)"
    for rank, error in errors.items():
        raise AssertionError(f"rank {rank}'s thread failed") from error
    return results


def assert_exactly_once(delivered: list[int], count: int) -> None:
    counts = Counter(delivered)
    assert [v for v, n in counts.items() if n > 1] == []
    assert sorted(counts) == [10 * i for i in range(count)]


@pytest.mark.parametrize("buffer", [0, 13])
@pytest.mark.parametrize("after", [1, 24, 25, 77, 299])
def test_a_stalled_rank_is_taken_over_and_its_late_item_dropped(after: int, buffer: int) -> None:
    first, second = loaders(2, buffer=buffer)
    stalled = iter(second)
    early = [next(stalled) for _ in range(after)]
    stall(second)
    started = time.monotonic()
    survivor = list(first)
    assert time.monotonic() - started >= LEASE  # it waited for the lease to go stale
    with pytest.warns(LeaseTakenWarning, match="taken over by rank 0"):
        late = list(stalled)
    assert late == []
    assert_exactly_once(survivor + early, 600)


def test_three_ranks_one_stalled_the_other_two_share_its_rest() -> None:
    ranks = loaders(3, buffer=7, count=900)
    stalled = iter(ranks[2])
    early = [next(stalled) for _ in range(40)]
    stall(ranks[2])
    results = read_in_threads(ranks, [0, 1])
    with pytest.warns(LeaseTakenWarning):
        assert list(stalled) == []
    assert_exactly_once(results[0] + results[1] + early, 900)
    taken = json.loads(
        StoreClient(ranks[0]._dispatch.client._store, 10).get_or_none(  # type: ignore[union-attr]
            lease_key(ranks[0]._dispatch.spec.key, 2)  # type: ignore[union-attr]
        )
    )
    assert taken["status"] == "taken" and taken["by"] in (0, 1)


def test_a_rank_that_never_starts_is_fenced_from_its_epoch() -> None:
    first, second = loaders(2)
    delivered = list(first)  # rank 1 never came: after the lease time rank 0 read it all
    assert_exactly_once(delivered, 600)
    with pytest.warns(LeaseTakenWarning):
        assert list(second) == []


def test_the_ranks_run_together_without_takeovers() -> None:
    ranks = loaders(2, buffer=5, lease=LIVE_LEASE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LeaseTakenWarning)
        results = read_in_threads(ranks, [0, 1])
    assert_exactly_once(results[0] + results[1], 600)
    assert results[0] and results[1]
    for rank in ranks:  # the next epoch runs as usual, with new leases
        assert rank.epoch == 1
        assert rank._takeovers is not None
        report = rank._takeovers.report()
        assert report["took_over"] == [] and not report["fenced"]
        assert report["wait_seconds"] < LIVE_LEASE / 2  # nobody waited for a lease to expire


def test_a_checkpoint_while_reading_a_taken_over_rank_is_refused() -> None:
    first, second = loaders(2)
    stalled = iter(second)
    next(stalled)
    stall(second)
    items = iter(first)
    for _ in items:
        if first._takeovers is not None and first._takeovers.reading_phase is not None:
            break
    else:
        pytest.fail("rank 0 never read rank 1's units")
    with pytest.raises(TakeoverCheckpointError, match="stalled rank 1"):
        first.state_dict()


def test_a_damaged_lease_in_the_store_is_a_clear_error() -> None:
    first, second = loaders(2)
    items = iter(first)
    next(items)
    spec = first._dispatch.spec  # type: ignore[union-attr]
    first._dispatch.client.set(lease_key(spec.key, 1), "{not json")  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="lease .*lease/1 holds no JSON"):
        list(items)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dispatch_lease_seconds": 0}, "a number > 0"),
        ({"dispatch_lease_seconds": True}, "a number > 0"),
        ({"dispatch_lease_seconds": "5"}, "a number > 0"),
        ({"dispatch_lease_seconds": 5, "even_batches": True}, "no collectives"),
        ({"dispatch_lease_seconds": 5, "dispatch": "static"}, "is for dispatch='dynamic'"),
    ],
)
def test_lease_arguments_are_checked(options: dict[str, Any], message: str) -> None:
    arguments = {"rank": 0, "world_size": 2, "dispatch": "dynamic", **options}
    if arguments["dispatch"] == "dynamic":
        arguments["store"] = private_file_store()
    with pytest.raises(ValueError, match=message):
        dp.Loader(make_pipe(), **arguments)


def test_a_sealed_rank_claims_nothing_more() -> None:
    client = StoreClient(private_file_store(), 10)
    claimed = [sealable_claim(client, "k", consumer, consumer // 2, 5, 0) for consumer in (0, 2, 1)]
    assert claimed == [0, 1, 2]
    entries = seal(client, "k", 0)
    assert entries == ["0.0.0", "1.2.0", "0.1.0", "S0"]
    assert sealable_claim(client, "k", 1, 0, 5, 1) is None  # consumer 1 is rank 0's: sealed
    assert sealable_claim(client, "k", 3, 1, 5, 0) == 3  # the sealed claim took no unit
    entries = claimants(client.get_or_none("k"))
    assert entries == ["0.0.0", "1.2.0", "0.1.0", "S0", "0.1.1", "1.3.0"]
    assert claims_in(entries, 1) == [2] and claims_in(entries, 3) == [3]
    assert seal(client, "k", 0)[:-1] == entries  # sealing again changes nothing


def test_claims_past_the_last_unit_name_no_unit() -> None:
    client = StoreClient(private_file_store(), 10)
    claimed = [sealable_claim(client, "k", c, 0, 2, n) for c, n in ((0, 0), (0, 1), (0, 2))]
    assert claimed == [0, 1, None]
    entries = claimants(client.get_or_none("k"))
    assert claims_in(entries, 0) == [0, 1, 2]  # a taker keeps the units under the work's count


def test_concurrent_claims_hand_out_each_unit_once() -> None:
    """Consumers of several ranks claim at once while a taker seals one rank: every unit
    goes to one consumer, what each consumer got is what the list says it claimed, and
    the sealed rank claims nothing after its seal."""
    store = private_file_store()
    got: dict[int, list[int]] = {}

    def claim_all(consumer: int) -> None:
        client = StoreClient(store, 30)
        mine = got.setdefault(consumer, [])
        while (
            unit := sealable_claim(client, "k", consumer, consumer % 3, 60, len(mine))
        ) is not None:
            mine.append(unit)

    threads = [threading.Thread(target=claim_all, args=(c,)) for c in range(6)]
    for thread in threads:
        thread.start()
    sealed = seal(StoreClient(store, 30), "k", 1)
    for thread in threads:
        thread.join(JOIN_SECONDS)
    assert sorted(unit for units in got.values() for unit in units) == list(range(60))
    entries = claimants(StoreClient(store, 30).get_or_none("k"))
    for consumer, units in got.items():
        assert [u for u in claims_in(entries, consumer) if u < 60] == units
        if consumer % 3 == 1:  # rank 1's claims are the ones its taker read at the seal
            assert units == [u for u in claims_in(sealed, consumer) if u < 60]


# ----- real processes: a rank stopped (SIGSTOP) or killed (SIGKILL) mid-epoch -------------
SIZES = [23, 61, 17, 35, 48, 29, 52, 19, 41, 30]


def start_ranks(
    tmp_path: Path, world: int, workers: int, **fault: Any
) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    store = tmp_path / "store"
    procs, outs = [], []
    for rank in range(world):
        out = tmp_path / f"rank{rank}.txt"
        config = {
            "rank": rank, "world_size": world, "store": str(store),
            "data": str(tmp_path / "data" / "*.jsonl"), "workers": workers, "lease": PROCESS_LEASE,
            "out": str(out), **fault,
        }  # fmt: skip
        command = [sys.executable, str(ROOT / "tests" / "lease_job.py"), json.dumps(config)]
        procs.append(subprocess.Popen(command, env=child_env(), stderr=subprocess.PIPE))
        outs.append(out)
    return procs, outs


def read_out(path: Path) -> tuple[list[int], str | None]:
    ids, done = [], None
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("done"):
            done = line
        else:
            ids.append(int(line))
    return ids, done


def wait_for(proc: subprocess.Popen[bytes], seconds: float) -> int:
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"a rank did not end within {seconds} s (a hang)")


def wait_stopped(pid: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ")[1].startswith("T"):
                return
        time.sleep(0.05)
    pytest.fail("the rank never stopped itself")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_real_ranks_a_stopped_rank_is_taken_over_and_fenced(tmp_path: Path, workers: int) -> None:
    ids = write_data(tmp_path / "data", SIZES)
    procs, outs = start_ranks(tmp_path, 3, workers, stall_rank=2, after=20)
    wait_stopped(procs[2].pid)
    for proc in procs[:2]:
        assert wait_for(proc, 120) == 0, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    os.kill(procs[2].pid, signal.SIGCONT)
    assert wait_for(procs[2], 60) == 0
    delivered, dones = [], []
    for out in outs:
        got, done = read_out(out)
        delivered += got
        dones.append(done)
    assert dones[2] == "done 2 LeaseTakenWarning"  # it woke up fenced: its late item dropped
    assert dones[:2] == ["done 0 -", "done 1 -"]
    counts = Counter(delivered)
    assert [i for i, n in counts.items() if n > 1] == []
    assert sorted(counts) == ids
    assert len(read_out(outs[2])[0]) == 20


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_real_ranks_a_killed_rank_is_taken_over(tmp_path: Path, workers: int) -> None:
    ids = write_data(tmp_path / "data", SIZES)
    procs, outs = start_ranks(tmp_path, 3, workers, kill_rank=1, after=15)
    assert wait_for(procs[1], 120) == -signal.SIGKILL
    for proc in (procs[0], procs[2]):
        assert wait_for(proc, 120) == 0, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    delivered = [i for out in outs for i in read_out(out)[0]]
    counts = Counter(delivered)
    assert [i for i, n in counts.items() if n > 1] == []
    assert sorted(counts) == ids
    assert len(read_out(outs[1])[0]) == 15


@pytest.mark.slow
def test_real_ranks_a_stalled_worker_makes_its_rank_taken_over(tmp_path: Path) -> None:
    ids = write_data(tmp_path / "data", SIZES)
    procs, outs = start_ranks(tmp_path, 3, 2, stall_worker_rank=1, after=15)
    for proc in (procs[0], procs[2]):  # they take rank 1 over: its heartbeat stopped renewing
        assert wait_for(proc, 120) == 0, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    worker = int((tmp_path / "rank1.txt.worker").read_text())
    os.kill(worker, signal.SIGCONT)
    assert wait_for(procs[1], 60) == 0, procs[1].stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    assert read_out(outs[1])[1] == "done 1 LeaseTakenWarning"  # it woke up fenced
    counts = Counter(i for out in outs for i in read_out(out)[0])
    assert [i for i, n in counts.items() if n > 1] == []
    assert sorted(counts) == ids


@pytest.mark.slow
def test_leases_are_refused_under_torchrun_where_even_batches_is_on(tmp_path: Path) -> None:
    # even_batches=None turns on under a process group of several ranks: only known late.
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"lease": 5}))
    code, out, err = torchrun_may_fail(
        ROOT / "tests" / "lease_job.py", config, 2, tmp_path, "leases under torchrun"
    )
    assert code == 0, err[-3000:]
    assert out.count("refused: ") == 2 and "no collectives" in out


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_the_epoch_after_a_takeover_runs_as_usual(workers: int) -> None:
    first, second = loaders(2, workers=workers, count=300)
    stalled = iter(second)
    early = [next(stalled) for _ in range(30)]
    stall(second)
    survivor = list(first)
    with pytest.warns(LeaseTakenWarning):
        assert list(stalled) == []
    assert_exactly_once(survivor + early, 300)
    results = read_in_threads([first, second], [0, 1])
    assert first.epoch == second.epoch == 2
    assert_exactly_once(results[0] + results[1], 300)


# ----- random cases: ranks, the stalled one, when, buffers, unit sizes --------------------
LEASE_CASES = int(os.environ.get("LEASE_CASES", "8"))


@pytest.mark.parametrize("case", range(LEASE_CASES))
def test_random_stalls_deliver_every_item_once(case: int) -> None:
    """``LEASE_CASES=100 pytest tests/dispatch/test_dispatch_leases.py -k random``: deeper."""
    import random

    rng = random.Random(case)
    world, count = rng.choice([2, 3]), rng.randrange(50, 400)
    buffer, unit = rng.choice([0, 0, 3, 17]), rng.choice([1, 7, 25, 64])
    store = private_file_store()
    ranks = [
        dp.Loader(
            make_pipe(count, buffer),
            seed=case,
            rank=rank,
            world_size=world,
            dispatch="dynamic",
            store=store,
            dispatch_unit_items=unit,
            dispatch_lease_seconds=LEASE,
            even_batches=False,
        )  # fmt: skip
        for rank in range(world)
    ]
    frozen = rng.randrange(world)
    iterator = iter(ranks[frozen])
    early = []
    for _ in range(rng.randrange(0, count // world + 1)):
        item = next(iterator, None)
        if item is None:
            break
        early.append(item)
    stall(ranks[frozen])
    results = read_in_threads(ranks, [r for r in range(world) if r != frozen])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeaseTakenWarning)
        late = list(iterator)
    delivered = early + late + [i for items in results.values() for i in items]
    assert_exactly_once(delivered, count)


def test_stats_tell_the_wait_the_takeovers_and_the_fence() -> None:
    store = private_file_store()
    first, second = (
        dp.Loader(
            make_pipe(200),
            rank=rank,
            world_size=2,
            dispatch="dynamic",
            store=store,
            dispatch_unit_items=10,
            dispatch_lease_seconds=LEASE,
            even_batches=False,
            stats=True,
        )  # fmt: skip
        for rank in range(2)
    )
    stalled = iter(second)
    early = [next(stalled) for _ in range(15)]
    stall(second)
    survivor = list(first)
    with pytest.warns(LeaseTakenWarning):
        list(stalled)
    mine, theirs = first.stats(), second.stats()
    assert mine.leases["took_over"] == [1] and not mine.leases["fenced"]
    assert mine.leases["wait_seconds"] >= LEASE
    # rank 1 had claimed units 0-1 (it was reading the second): their rest came over
    assert 0 < mine.leases["items_taken_over"] <= 20 - len(early)
    assert theirs.leases["fenced"] and theirs.leases["took_over"] == []
    assert "took over ranks [1]" in str(mine) and "was taken over" in str(theirs)
    assert_exactly_once(survivor + early, 200)
    assert mine.as_dict()["leases"]["took_over"] == [1]


@pytest.mark.parametrize("damage", ["not a state", "another rank's state", "another number"])
def test_a_damaged_published_position_is_a_clear_error(damage: str) -> None:
    first, second = loaders(2)
    stalled = iter(second)
    for _ in range(80):  # past the first full state: it publishes one every 64 items
        next(stalled)
    stall(second)
    lease = second._takeovers.lease  # type: ignore[union-attr]
    number = lease._value["state"]  # type: ignore[union-attr]
    client = first._dispatch.client  # type: ignore[union-attr]
    text = '{"version": 5, "ranks": 3}'
    if damage == "another rank's state":  # a valid state, but it holds rank 0's position
        text = json.dumps(first.state_dict())
    numbered = number + 2 if damage == "another number" else number  # the other state's slot
    client.set(state_key(lease.key, number), f"{numbered}:{text}")  # type: ignore[union-attr]
    with pytest.raises(dp.InvalidStateError):
        list(first)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "stalled"])
def test_a_store_that_goes_away_while_a_rank_waits_is_a_clear_error(how: str) -> None:
    # Rank 0 has read its share and waits for rank 1's lease (never taken: rank 1 does not
    # start); the store's host dies or freezes meanwhile: an error within the store's
    # timeout, not a wait for the lease time (60 s) or forever.
    from datetime import timedelta

    import torch.distributed as dist
    from test_dispatch_distributed import STORE_HOST

    from nodes.dispatch import DispatchStoreError

    host = subprocess.Popen(
        [sys.executable, "-c", STORE_HOST], stdout=subprocess.PIPE, text=True, env=child_env()
    )
    try:
        port = int(host.stdout.readline())  # type: ignore[union-attr]
        store = dist.TCPStore(
            "127.0.0.1", port, is_master=False, wait_for_workers=False,
            timeout=timedelta(seconds=3),
        )  # fmt: skip
        loader = dp.Loader(
            make_pipe(100), rank=0, world_size=2, dispatch="dynamic", store=store,
            dispatch_unit_items=10, dispatch_lease_seconds=60, even_batches=False,
        )  # fmt: skip
        items = iter(loader)
        for _ in range(100):  # all of it: rank 1 never came
            next(items)
        fault = threading.Timer(
            0.5, os.kill, (host.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        )
        fault.start()
        started = time.monotonic()
        with pytest.raises(DispatchStoreError, match=f"127.0.0.1:{port}"):
            next(items)  # waiting for rank 1's lease when the store goes
        assert time.monotonic() - started < 20  # the store's 3 s timeout, not the lease's 60
        fault.join(10)
        assert not fault.is_alive()
    finally:
        host.kill()
        host.wait()


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1].startswith("T")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("step", "how", "workers"),
    [  # each step killed, one stopped (it wakes fenced), 0 and 2 workers
        ("won", "KILL", 0),
        ("working_out", "KILL", 0),
        ("reading", "KILL", 2),
        ("working_out", "STOP", 2),
    ],
)
def test_real_ranks_a_taker_that_dies_or_stops_leaves_its_work_to_the_others(
    tmp_path: Path, step: str, how: str, workers: int
) -> None:
    """Rank 2 stops; rank 0 or 1 takes it over and dies (or stops) at ``step``: after
    winning its lease, after working out its work (sealed, not published), or the first
    to read the takeover phase, after its first item there. The last rank takes both
    over: every item once."""
    ids = write_data(tmp_path / "data", SIZES)
    fault = {"step": step, "signal": how, "items": 1}
    procs, outs = start_ranks(tmp_path, 3, workers, stall_rank=2, after=20, taker_fault=fault)
    wait_stopped(procs[2].pid)
    deadline = time.monotonic() + 120
    while True:  # one of ranks 0 and 1 wins the takeover and faults; the other goes on
        codes = [proc.poll() for proc in procs[:2]]
        faulted = [
            r
            for r in (0, 1)
            if codes[r] == -signal.SIGKILL or (codes[r] is None and stopped(procs[r].pid))
        ]
        if faulted:
            break
        assert None in codes and time.monotonic() < deadline, f"no taker faulted: {codes}"
        time.sleep(0.05)
    taker = faulted[0]
    survivor = 1 - taker
    assert wait_for(procs[survivor], 120) == 0, procs[survivor].stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    for r in (2, taker) if how == "STOP" else (2,):
        os.kill(procs[r].pid, signal.SIGCONT)
        assert wait_for(procs[r], 60) == 0, procs[r].stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    delivered = [i for out in outs for i in read_out(out)[0]]
    counts = Counter(delivered)
    assert [i for i, n in counts.items() if n > 1] == []
    assert sorted(counts) == ids
    assert read_out(outs[survivor])[1] == f"done {survivor} -"
    assert read_out(outs[2])[1] == "done 2 LeaseTakenWarning"
    if how == "STOP":  # it woke up fenced: the work it had taken went to the survivor
        assert read_out(outs[taker])[1] == f"done {taker} LeaseTakenWarning"


def test_a_fenced_rank_whose_taker_died_with_nobody_left_is_a_clear_error() -> None:
    """Two ranks: rank 1 stalls, rank 0 takes it over and dies mid-way through its units.
    Rank 1 wakes fenced: nobody is left to deliver the rest, so its epoch does not end
    as if complete; it raises, naming rank 0 (the last checkpoint resumes exactly)."""
    first, second = loaders(2)
    stalled = iter(second)
    for _ in range(30):
        next(stalled)
    stall(second)
    taker = iter(first)
    takeovers = first._takeovers
    assert takeovers is not None
    while takeovers.reading_phase != 1:  # its own units, then the wait, then rank 1's
        next(taker)
    for _ in range(3):
        next(taker)
    stall(first)  # rank 0 dies mid-way through rank 1's units
    with warnings.catch_warnings(), pytest.raises(dp.UnfinishedEpochError, match=r"rank\(s\) 0"):
        warnings.simplefilter("ignore", LeaseTakenWarning)
        next(stalled)
    for loader in (first, second):
        loader.close()
