"""Worker processes: duplicated streams refused, worker errors and deaths reported, nothing
left running afterwards, and Loader arguments checked.

Every test here starts real DataLoader worker processes. A per-test timeout turns a hang
(a lost worker the main process waits for forever) into a failure instead of a stalled suite.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
import time
from itertools import islice
from typing import Any

import pytest
import torch
from helpers import new_children, worker_counts
from subprocess_helpers import processes_in_group, run_forked_ranks
from torch.utils.data import DataLoader

import datapipes as dp
from nodes import WorkerStreamNode
from nodes.testing import roundtrip_state

# ----- helpers (module level, so DataLoader workers could pickle them) ------------------------


class CorruptSampleError(Exception):
    """A user exception type the main process must see again, unchanged."""


def fail_on_13(x: int) -> int:
    if x == 13:
        raise CorruptSampleError(f"sample {x} is corrupt")
    return 10 * x


def die_on_9(x: int) -> int:
    if x == 9:
        if torch.utils.data.get_worker_info() is None:  # never kill the test process itself
            raise AssertionError("die_on_9 ran in the main process, not in a worker")
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def letters() -> list[str]:
    return [f"s{i}" for i in range(23)]


def new_non_daemon_threads(before: set[threading.Thread], wait_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + wait_s
    while True:
        alive = [
            t.name
            for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.daemon
        ]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def snapshot() -> tuple[set[Any], set[threading.Thread]]:
    return set(multiprocessing.active_children()), set(threading.enumerate())


def assert_nothing_left(before: tuple[set[Any], set[threading.Thread]]) -> None:
    children, threads = before
    assert new_children(children) == [], "worker processes still running"
    assert new_non_daemon_threads(threads) == [], "non-daemon threads still running"


# ----- duplicated streams -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "topology",
    [
        {"num_workers": 2},
        {"rank": 1, "world_size": 2, "num_workers": 1},
        {"rank": 2, "world_size": 3, "num_workers": 2},
    ],
    ids=["2-workers", "2-ranks-1-worker", "3-ranks-2-workers"],
)
def test_from_iterable_in_several_workers_is_refused_when_the_loader_is_built(topology):
    before = snapshot()
    with pytest.raises(ValueError, match=r"shard\(\)") as info:
        dp.Loader(dp.from_iterable(lambda: iter(range(10))), **topology)
    consumers = topology.get("world_size", 1) * topology["num_workers"]
    assert f"{consumers} consumers" in str(info.value)
    assert "every consumer would read every item" in str(info.value)
    assert_nothing_left(before)  # refused before any worker started


def test_from_iterable_over_several_ranks_is_refused_when_the_loader_is_built():
    with pytest.raises(ValueError, match=r"shard\(\)"):
        dp.Loader(dp.from_iterable(lambda: iter(range(10))), rank=0, world_size=2)


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_from_iterable_with_shard_splits_across_ranks_and_workers(num_workers):
    seen = []
    for rank in range(2):
        with dp.Loader(
            dp.from_iterable(letters).shard(), rank=rank, world_size=2, num_workers=num_workers
        ) as loader:
            seen += list(loader)
    assert sorted(seen) == sorted(letters())
    assert len(seen) == len(letters())


@pytest.mark.slow
def test_from_iterable_as_torch_dataset_in_two_workers_raises_in_the_main_process():
    before = snapshot()
    ds = dp.from_iterable(lambda: iter(range(10))).as_torch_dataset()
    it = iter(DataLoader(ds, batch_size=None, num_workers=2))
    try:
        with pytest.raises(ValueError, match=r"shard\(\)") as info:
            next(it)
    finally:
        # torch's own iterator: stop its workers now (collected later through the reference
        # cycle of the traceback, its queues may be gone first and it waits 5 s per worker)
        it._shutdown_workers()
    message = str(info.value)
    assert "DataLoader worker process" in message
    assert "every consumer would read every item" in message
    assert new_children(before[0]) == []


# ----- an exception in a worker ----------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_exception_reaches_the_main_process_with_its_traceback():
    got = []
    # One item a transfer: the items before the error are then every one before 13 (with
    # bundles, those of the bundle before it: tests/workers/test_worker_bundles.py).
    loader = dp.Loader(dp.range(40).map(fail_on_13), num_workers=2, items_per_transfer=1)
    with loader:
        with pytest.raises(CorruptSampleError) as info:
            for item in loader:
                got.append(item)
    assert type(info.value) is CorruptSampleError
    message = str(info.value)
    # 13 is odd: worker 1 of 2 reads the odd items
    assert "Caught CorruptSampleError in DataLoader worker process 1" in message
    assert "Original Traceback" in message
    assert "fail_on_13" in message  # the user function, from the worker's traceback
    assert "sample 13 is corrupt" in message
    # round-robin over the workers: everything before item 13 arrived, in order
    assert got == [10 * x for x in range(13)]


# ----- a worker killed by a signal -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)  # noticed promptly: a main process waiting forever fails here
def test_a_killed_worker_raises_worker_died_error_naming_it():
    before = snapshot()
    got = []
    loader = dp.Loader(dp.range(40).map(die_on_9), num_workers=2, items_per_transfer=1)
    with pytest.raises(dp.WorkerDiedError) as info:
        for item in loader:
            got.append(item)
    message = str(info.value)
    assert "worker 1" in message  # 9 is odd: worker 1 of 2
    assert "SIGKILL" in message
    assert "epoch 0" in message
    assert isinstance(info.value, RuntimeError)
    # the other worker may not have delivered all of its items before the death was seen
    assert got == list(range(len(got))) and len(got) <= 9
    assert_nothing_left(before)
    loader.close()


# ----- nothing left running ----------------------------------------------------------------


@pytest.mark.slow
def test_close_mid_epoch_stops_workers_and_the_next_iteration_continues_the_epoch():
    pipe = dp.range(100).shuffle().map(abs)
    with dp.Loader(pipe, seed=4, num_workers=2) as uninterrupted:
        reference = [list(uninterrupted), list(uninterrupted)]
    before = snapshot()
    loader = dp.Loader(pipe, seed=4, num_workers=2)
    it = iter(loader)
    head = list(islice(it, 37))
    state = loader.state_dict()
    loader.close()
    assert_nothing_left(before)
    assert loader.state_dict() == state  # close() keeps the position
    del it
    gc.collect()
    rest = list(loader)
    assert head + rest == reference[0]
    assert list(loader) == reference[1]
    loader.close()
    assert_nothing_left(before)


@pytest.mark.slow
def test_breaking_out_of_the_loop_mid_epoch_stops_the_workers():
    before = snapshot()
    loader = dp.Loader(dp.range(500), num_workers=2)
    for i, _ in enumerate(loader):
        if i == 10:
            break
    gc.collect()
    assert_nothing_left(before)
    assert sorted(loader) == list(range(500))  # the next epoch runs in full
    assert_nothing_left(before)


@pytest.mark.slow
def test_dropping_the_iterator_mid_epoch_stops_the_workers():
    before = snapshot()
    loader = dp.Loader(dp.range(500).shuffle(), num_workers=2)
    it = iter(loader)
    assert len(list(islice(it, 7))) == 7
    del it
    gc.collect()
    assert_nothing_left(before)
    assert sorted(loader) == list(range(500))
    assert_nothing_left(before)


@pytest.mark.slow
def test_after_a_worker_error_close_leaves_nothing_running():
    before = snapshot()
    loader = dp.Loader(dp.range(40).map(fail_on_13), num_workers=2)
    with pytest.raises(CorruptSampleError):
        list(loader)
    loader.close()
    assert_nothing_left(before)


@pytest.mark.slow
def test_after_a_worker_error_the_workers_are_gone():
    before = snapshot()
    loader = dp.Loader(dp.range(40).map(fail_on_13), num_workers=2)
    with pytest.raises(CorruptSampleError):
        list(loader)
    try:
        assert new_children(before[0], wait_s=3.0) == []
    finally:
        loader.close()


@pytest.mark.slow
def test_a_checkpoint_taken_mid_epoch_in_workers_resumes_in_a_fresh_loader():
    pipe = dp.range(60).shuffle().map(abs).batch(4)
    reference = [[b.tolist() for b in dp.Loader(pipe, seed=2, num_workers=2)]]
    loader = dp.Loader(pipe, seed=2, num_workers=2)
    head = [b.tolist() for b in islice(iter(loader), 6)]
    state = roundtrip_state(loader.state_dict())
    loader.close()
    resumed = dp.Loader(pipe, seed=2, num_workers=2)
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == reference[0]
    resumed.close()


# ----- Loader arguments ------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [-1, 1.5, "2"])
def test_a_bad_num_workers_is_refused(num_workers):
    with pytest.raises(ValueError, match="num_workers"):
        dp.Loader(dp.range(5), num_workers=num_workers)


@pytest.mark.parametrize("option", ["batch_size", "shuffle", "prefetch"])
def test_an_unknown_dataloader_option_is_refused_naming_the_known_ones(option):
    before = snapshot()
    with pytest.raises(TypeError) as info:
        dp.Loader(dp.range(5), num_workers=2, **{option: 4})
    message = str(info.value)
    assert repr(option) in message
    assert "prefetch_factor" in message and "worker_init_fn" in message
    assert_nothing_left(before)


@pytest.mark.parametrize(
    "option", [{"prefetch_factor": 4}, {"timeout": 5}, {"worker_init_fn": print}]
)
def test_a_dataloader_option_without_workers_is_refused(option):
    with pytest.raises(ValueError, match="num_workers > 0") as info:
        dp.Loader(dp.range(5), **option)
    assert next(iter(option)) in str(info.value)


def record_worker(worker_id: int) -> None:
    os.environ["DATAPIPES_TEST_WORKER"] = str(worker_id)


def worker_tag(x: int) -> str:
    return f"{x} from worker {os.environ.get('DATAPIPES_TEST_WORKER', '(not set)')}"


@pytest.mark.slow
def test_dataloader_options_are_passed_on_to_the_workers():
    pipe = dp.range(30).map(worker_tag)
    with dp.Loader(
        pipe,
        num_workers=2,
        prefetch_factor=1,
        timeout=60,
        worker_init_fn=record_worker,
        items_per_transfer=1,  # so items alternate between the workers
    ) as loader:
        got = list(loader)
    assert got == [f"{x} from worker {x % 2}" for x in range(30)]  # worker_init_fn ran


def _set_up_then_join(rank: int, store_file: str, answers) -> None:
    import torch.distributed as dist

    loader = dp.Loader(dp.range(10))  # before init_process_group: looks like one process
    dataset = dp.range(10).as_torch_dataset()
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    in_workers = DataLoader(dataset, batch_size=None, num_workers=2)
    try:
        for name, iterable in (("loader", loader), ("dataset", dataset), ("workers", in_workers)):
            try:
                answers.put((rank, name, f"read {len(list(iterable))} items"))
            except RuntimeError as error:
                answers.put((rank, name, str(error)))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_pipeline_set_up_before_init_process_group_refuses_to_duplicate(tmp_path):
    """Set up as one process, then torch.distributed runs 2 ranks: iterating is refused."""
    results = run_forked_ranks(_set_up_then_join, tmp_path / "store", answers_per_rank=3)
    for rank, name, message in results:
        assert "every rank would read all the data" in message, (rank, name, message)
        assert "after init_process_group" in message


def _made_under_torchrun_before_init(rank: int, store_file: str, answers) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2")  # what torchrun sets
    loader = dp.Loader(dp.range(13).batch(2))  # before init_process_group
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    try:
        batches = [batch.tolist() for batch in loader]
        answers.put((rank, loader.even_batches, batches, loader.state_dict()["topology"]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_loader_made_under_torchrun_before_init_process_group_still_evens_the_epoch(tmp_path):
    """RANK/WORLD_SIZE give the ranks before the process group is up; the default
    even_batches is decided at the first epoch, when it is, so no rank takes an extra step."""
    results = run_forked_ranks(_made_under_torchrun_before_init, tmp_path / "store")
    assert [even for _, even, _, _ in results] == [True, True]
    assert [len(batches) for _, _, batches, _ in results] == [3, 3]  # rank 0 had 4 batches
    assert all(topology["even_batches"] for _, _, _, topology in results)
    seen = [x for _, _, batches, _ in results for batch in batches for x in batch]
    assert len(seen) == len(set(seen))


def _jsonl_with_bad_lines(folder) -> str:
    for index in range(2):
        lines = [f'{{"j": {j}}}' if j != 5 else "{bad" for j in range(20)]
        (folder / f"part-{index}.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder / "*.jsonl")


@pytest.mark.filterwarnings("ignore::datapipes.BadRecordWarning")
@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_skipped_counts_bad_records_read_in_workers(tmp_path, num_workers):
    pipe = dp.files(_jsonl_with_bad_lines(tmp_path)).read_jsonl(on_error="skip")
    loader = dp.Loader(pipe, num_workers=num_workers)
    assert len(list(loader)) == 38
    assert sum(loader.skipped().values()) == 2  # one bad line in each file


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_a_checkpoint_with_other_even_batches_is_refused(num_workers):
    options = {"rank": 0, "world_size": 2, "num_workers": num_workers}
    saved = dp.Loader(dp.range(10), even_batches=True, **options)
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    saved.close()
    other = dp.Loader(dp.range(10), **options)
    with pytest.raises(dp.StateMismatchError, match="even_batches"):
        other.load_state_dict(state)


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_an_iterator_kept_from_before_close_ends(num_workers):
    reference = list(dp.Loader(dp.range(10), num_workers=num_workers))
    loader = dp.Loader(dp.range(10), num_workers=num_workers)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    loader.close()
    assert list(it) == []  # not the rest of the epoch a second time
    assert first + list(loader) == reference  # the Loader itself continues the epoch


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::datapipes.BadRecordWarning")
def test_skip_counts_survive_asking_an_ended_worker_stream_again(tmp_path):
    pipe = dp.files(_jsonl_with_bad_lines(tmp_path)).read_jsonl(on_error="skip")
    dataset = dp.TorchDataset(pipe, dp.Topology(0, 1, "arguments"))
    stream = WorkerStreamNode(dataset, 2, lambda: 0)
    stream.reset()
    assert len(list(stream)) == 38
    with pytest.raises(StopIteration):
        next(stream)  # asked again after the end: still ended, counts kept
    skipped = [sum(state["skipped"].values()) for state in stream.worker_states()]
    assert sum(skipped) == 2


# ----- worker deaths outside the live iteration (issue 14) ------------------------------------


def with_pid(x: int) -> tuple[int, int]:
    return x, os.getpid()


def values(items: list[tuple[int, int]]) -> list[int]:
    return [x for x, _ in items]


def busy_user_code(seconds: float) -> None:
    """What a training step does between two next() calls: Python code, then a sleep."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(1000))
        time.sleep(0.005)


def wait_dead(pid: int, wait_s: float = 5.0) -> None:
    """Until ``pid`` (a child of this process) has exited, zombie or reaped."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still alive after {wait_s} s")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_an_idle_persistent_worker_killed_between_epochs_raises_at_the_next_epochs_first_next():
    pipe = dp.range(40).shuffle().map(with_pid)
    options = {"seed": 3, "num_workers": 2, "persistent_workers": True}
    with dp.Loader(pipe, **options) as uninterrupted:
        reference = [values(list(uninterrupted)) for _ in range(2)]
    loader = dp.Loader(pipe, **options)
    first = list(loader)
    assert values(first) == reference[0]
    pid = next(p for _, p in first if p != first[0][1])  # worker 0 gave the first item
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)
    busy_user_code(0.3)  # the SIGCHLD arrives here: nothing may be raised in user code
    it = iter(loader)
    with pytest.raises(dp.WorkerDiedError) as info:
        next(it)
    message = str(info.value)
    assert f"worker 1 (pid {pid}, killed by SIGKILL)" in message
    assert "between epochs" in message and "epoch 1" in message
    state = roundtrip_state(loader.state_dict())
    loader.close()
    resumed = dp.Loader(pipe, **options)
    resumed.load_state_dict(state)
    assert values(list(resumed)) == reference[1]  # epoch 1 in full: nothing lost or repeated
    resumed.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_worker_of_one_loader_killed_while_another_iterates_leaves_that_one_alone():
    pipe = dp.range(300).map(with_pid)
    reference = values(list(dp.Loader(pipe, num_workers=2)))
    a = dp.Loader(pipe, num_workers=2)
    it_a = iter(a)
    head_a = [next(it_a) for _ in range(10)]  # A is mid-epoch, its workers idle
    victim = head_a[0][1]  # A's worker 0
    got_b = []
    with dp.Loader(pipe, num_workers=2) as b:
        for i, item in enumerate(b):
            if i == 20:
                os.kill(victim, signal.SIGKILL)
                wait_dead(victim)
            if i == 21:
                busy_user_code(0.2)
            got_b.append(item[0])
    assert got_b == reference  # B went on unaffected
    with pytest.raises(dp.WorkerDiedError, match=rf"worker 0 \(pid {victim}, killed by SIGKILL"):
        for item in it_a:  # what A holds of its current transfer comes first
            head_a.append(item)
    state = roundtrip_state(a.state_dict())
    a.close()
    resumed = dp.Loader(pipe, num_workers=2)
    resumed.load_state_dict(state)
    assert values(head_a) + values(list(resumed)) == reference
    resumed.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_killed_at_random_moments_leaves_a_state_that_resumes_exactly():
    """A timer kills a worker while the main process is anywhere: in torch's __next__, in
    user code, in the node. The state taken after the error never counts an unseen batch."""
    import random

    pipe = dp.range(3000).shuffle().batch(8)
    options = {"seed": 5, "num_workers": 2}
    with dp.Loader(pipe, **options) as uninterrupted:
        reference = [x for batch in uninterrupted for x in batch.tolist()]
    chance = random.Random(14)
    deaths = 0
    for trial in range(10):
        before = set(multiprocessing.active_children())
        loader = dp.Loader(pipe, **options)
        got: list[int] = []
        it = iter(loader)
        workers = [p for p in multiprocessing.active_children() if p not in before]
        assert len(workers) == 2
        victim = chance.choice(workers)
        # Process.kill signals only a process not reaped yet: never a reused pid
        timer = threading.Timer(chance.uniform(0.02, 0.25), victim.kill)
        timer.start()
        try:
            for batch in it:
                got += batch.tolist()
                time.sleep(0.0005)
        except dp.WorkerDiedError as error:
            deaths += 1
            assert f"pid {victim.pid}" in str(error)
        finally:
            timer.cancel()
            timer.join(10)
            assert not timer.is_alive()
        state = roundtrip_state(loader.state_dict())
        loader.close()
        resumed = dp.Loader(pipe, **options)
        resumed.load_state_dict(state)
        rest = [x for batch in resumed for x in batch.tolist()]
        resumed.close()
        assert got + rest == reference, f"trial {trial}: {len(got)} + {len(rest)} items"
    assert deaths >= 5  # most kills land mid-epoch


# ----- no orphans: workers end with the main process, however early it dies --------------------


def _loader_then_wait(ready_fd: int) -> None:
    """A forked child: its own process group (to find its workers), a Loader, then forking."""
    os.setpgid(0, 0)
    loader = dp.Loader(dp.range(10**6), num_workers=2, persistent_workers=True)
    os.write(ready_fd, b"x")  # about to fork the workers
    it = iter(loader)
    next(it)
    time.sleep(60)  # killed long before


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through /proc")
def test_no_worker_survives_its_main_process_killed_right_after_forking():
    import random
    import select

    chance = random.Random(5)
    fork = multiprocessing.get_context("fork")
    orphans: dict[int, list[int]] = {}
    for trial in range(10):
        read_end, write_end = os.pipe()
        child = fork.Process(target=_loader_then_wait, args=(write_end,))
        child.start()
        os.close(write_end)
        try:
            assert select.select([read_end], [], [], 30)[0], "the child never got to forking"
            time.sleep(chance.choice([0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15]))
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
            deadline = time.monotonic() + 3.0  # a couple of seconds for them to notice
            while processes_in_group(child.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = processes_in_group(child.pid)
            if left:
                orphans[trial] = left
        finally:
            os.close(read_end)
            for pid in processes_in_group(child.pid):  # never leave one behind, even failing
                os.kill(pid, signal.SIGKILL)
    assert orphans == {}, f"workers outlived their main process: {orphans}"


# ----- one exception type at any num_workers ---------------------------------------------------


class TwoPartError(Exception):
    """A user exception whose constructor takes several arguments."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code, self.detail = code, detail


def raise_on_5(kind: str):
    def fail(x: int) -> int:
        if x == 5:
            if kind == "value":
                raise ValueError("five is not allowed")
            if kind == "key":
                raise KeyError(("shard", 5))
            if kind == "custom":
                raise CorruptSampleError("sample 5 is corrupt")
            if kind == "two-part":
                raise TwoPartError(5, "five")
            if kind == "bad-record":
                raise dp.BadRecordError("data.jsonl", "line 6", "not JSON")
        return x

    return fail


@pytest.mark.parametrize("num_workers", worker_counts(0, 1, 2))
@pytest.mark.parametrize(
    "kind, expected",
    [
        ("value", ValueError),
        ("key", KeyError),
        ("custom", CorruptSampleError),
        ("two-part", TwoPartError),
        ("bad-record", dp.BadRecordError),
    ],
)
def test_an_exception_in_a_step_has_the_same_type_and_fields_at_any_num_workers(
    kind, expected, num_workers
):
    loader = dp.Loader(dp.range(12).map(raise_on_5(kind)), num_workers=num_workers)
    with pytest.raises(expected) as info:
        list(loader)
    loader.close()
    error = info.value
    assert type(error) is expected
    if kind == "key":
        assert error.args == (("shard", 5),)  # the key itself, as without workers
    if kind == "two-part":
        assert (error.args, error.code, error.detail) == ((5, "five"), 5, "five")
    if kind == "bad-record":
        assert (error.url, error.where, error.reason) == ("data.jsonl", "line 6", "not JSON")
    if num_workers:  # the worker's traceback comes along: in the message, or as the cause
        shown = str(error) + str(error.__cause__ or "")
        worker = 5 % num_workers  # items are dealt round-robin
        assert f"Caught {expected.__name__} in DataLoader worker process {worker}" in shown
        assert "Original Traceback" in shown and "in fail" in shown


@pytest.mark.filterwarnings("ignore::datapipes.BadRecordWarning")
@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_a_bad_record_read_in_a_worker_is_caught_as_bad_record_error(tmp_path, num_workers):
    pipe = dp.files(_jsonl_with_bad_lines(tmp_path)).read_jsonl()
    with dp.Loader(pipe, num_workers=num_workers) as loader:
        with pytest.raises(dp.BadRecordError) as info:
            list(loader)
    assert info.value.where.startswith("line 6") and info.value.url.endswith(".jsonl")
    assert "line 6" in str(info.value)


@pytest.mark.slow
def test_an_exception_type_the_main_process_cannot_rebuild_becomes_a_runtime_error_naming_it():
    class MadeInAFunction(Exception):
        """Defined in a function: no module attribute, so pickle cannot name it."""

    def fail(x: int) -> int:
        if x == 3:
            raise MadeInAFunction("from a local class")
        return x

    with dp.Loader(dp.range(8).map(fail), num_workers=2, multiprocessing_context="fork") as loader:
        with pytest.raises(RuntimeError) as info:
            list(loader)
    assert type(info.value) is RuntimeError
    assert "Caught MadeInAFunction in DataLoader worker process 1" in str(info.value)
    assert "from a local class" in str(info.value)


def test_a_carried_exception_is_rebuilt_by_torchs_own_reraise():
    """torch rebuilds a worker's exception as ``type(message)`` (ExceptionWrapper.reraise);
    the carrier turns that into the original. Fails here if torch changes how it rebuilds."""
    from torch._utils import ExceptionWrapper

    from nodes.workers.carry import carry

    try:
        raise carry(dp.BadRecordError("a.tar", "member 'x.jpg'", "truncated"), worker_id=3)
    except Exception:
        wrapper = ExceptionWrapper(where="in DataLoader worker process 3")
    with pytest.raises(dp.BadRecordError) as info:
        wrapper.reraise()
    assert info.value.url == "a.tar" and info.value.reason == "truncated"
    assert str(info.value).startswith("Caught BadRecordError in DataLoader worker process 3.")


@pytest.mark.slow
@pytest.mark.parametrize("returned", [31, 40], ids=["before-a-snapshot", "after-a-snapshot"])
def test_an_item_torch_counted_but_the_caller_never_got_is_not_in_the_state(returned):
    """torch counts an item before it reaches the caller; an exception in between (a signal
    handler, Ctrl-C) loses it. The state must be the last item returned, not torch's count,
    also where torch took its snapshot (every 32 items) at the lost item."""
    topology = dp.Topology(0, 1, "arguments")
    stream = WorkerStreamNode(dp.TorchDataset(dp.range(100), topology), 2, lambda: 0)
    stream.reset()
    got = [next(stream) for _ in range(returned)]
    next(stream._it)  # torch hands out (and counts) one more item that never reaches the caller
    stream.close()
    state = roundtrip_state(stream.state_dict())
    again = WorkerStreamNode(dp.TorchDataset(dp.range(100), topology), 2, lambda: 0)
    again.reset(state)
    assert got + list(again) == list(range(100))
    again.close()


@pytest.mark.slow
def test_a_closed_loader_leaves_no_stopped_worker_behind() -> None:
    from nodes.adapters import torchdata

    loader = dp.Loader(dp.range(2000).map(abs), num_workers=2)
    items = iter(loader)
    next(items)
    node = loader._graph.root
    while not hasattr(node, "_it"):
        node = node.inputs[0]
    workers = torchdata.worker_processes(node._it)
    assert len(workers) == 2
    os.kill(workers[0].pid, signal.SIGSTOP)  # a stalled worker: SIGTERM cannot end it
    loader.close()
    for worker in workers:
        assert not worker.is_alive(), f"worker {worker.pid} outlived close()"


def test_workers_that_die_as_torch_starts_them_are_named_from_its_error() -> None:
    """A worker killed while a fresh DataLoader iterator starts is not known to the node yet:
    torch's message names its pid, and the node raises WorkerDiedError with it."""
    from nodes.workers.dataloader import died_as_they_started as _died_as_they_started

    message = "DataLoader worker (pid(s) 4242, 4243) exited unexpectedly"
    assert _died_as_they_started(message) == "worker process(es) pid 4242, 4243"
    assert _died_as_they_started("some other RuntimeError") == ""


def _hold_the_lock_then_stop(event: Any) -> None:
    with event._cond:  # what a DataLoader worker's done_event.is_set() takes, briefly
        os.kill(os.getpid(), signal.SIGSTOP)  # stalled right there, the lock held


@pytest.mark.slow  # a process of its own
def test_shutdown_lets_a_worker_stopped_with_the_done_events_lock_let_it_go() -> None:
    # torch's _shutdown_workers sets its "workers done" event first: a worker stopped while
    # it held that event's lock blocked it forever (seen once under load); SIGCONT first
    import types

    from nodes.adapters import torchdata

    context = multiprocessing.get_context("fork")
    event = context.Event()
    worker = context.Process(target=_hold_the_lock_then_stop, args=(event,), daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while _process_state(worker.pid) != "T":
        assert time.monotonic() < deadline, "the worker never stopped"
        time.sleep(0.01)
    iterator = types.SimpleNamespace(_workers=[worker], _shutdown_workers=event.set)
    done = threading.Thread(target=torchdata.shutdown_workers, args=(iterator,), daemon=True)
    done.start()
    done.join(60)
    assert not done.is_alive(), "shutdown_workers hung on the stopped worker's lock"
    assert event.is_set() and not worker.is_alive()


def _process_state(pid: int | None) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]
