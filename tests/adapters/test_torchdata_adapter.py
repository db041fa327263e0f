"""nodes/adapters/torchdata.py against a real torchdata ``StatefulDataLoader`` with 2 workers.

The adapter reads torch's DataLoader and torchdata's private names and guards every
read (a missing one gives ``None`` or ``[]``, never a crash mid-epoch), so a release
that renames one would silently lose worker states. These tests fail instead, naming
what changed.
"""

from __future__ import annotations

import time
from itertools import islice
from typing import Any

import pytest
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader

from nodes.adapters import torchdata as adapter
from nodes.errors import InvalidStateError

#: The tests that start DataLoader worker processes.
slow = pytest.mark.slow


def changed(attribute: str) -> str:
    return f"torch or torchdata changed {attribute}; update nodes/adapters/torchdata.py"


class Counting(torch.utils.data.IterableDataset):
    """Worker ``w`` of ``n`` yields ``w, w + n, ...`` below 40; its state is how many it gave."""

    def __init__(self) -> None:
        self.given = 0
        self.worker = 0

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        self.worker, count = (info.id, info.num_workers) if info is not None else (0, 1)
        for value in range(self.worker, 40, count):
            if value // count < self.given:
                continue  # resumed: already given
            self.given += 1
            yield value

    def state_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "given": self.given}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.given = state["given"]


def loader() -> StatefulDataLoader:
    return StatefulDataLoader(Counting(), batch_size=None, num_workers=2, snapshot_every_n_steps=2)


@slow
def test_a_dataloader_state_has_what_the_adapter_reads():
    dl = loader()
    taken = list(islice(iter(dl), 7))
    state = dl.state_dict()
    del dl

    assert sorted(taken) == sorted(set(taken)) and len(taken) == 7
    assert adapter.SNAPSHOT in state, changed(f"the state key {adapter.SNAPSHOT!r}")
    snapshot = state[adapter.SNAPSHOT]
    for key in (adapter.WORKER_SNAPSHOTS, adapter.SNAPSHOT_STEP, adapter.LAST_YIELDED_WORKER_ID):
        assert key in snapshot, changed(f"the snapshot key {key!r}")
    assert adapter.NUM_WORKERS in snapshot.get(adapter.MAIN_SNAPSHOT, {}), changed(
        f"the main snapshot's {adapter.NUM_WORKERS!r} (under {adapter.MAIN_SNAPSHOT!r})"
    )
    for key in (adapter.STEPS_SINCE_SNAPSHOT, adapter.ITERATOR_FINISHED):
        assert key in state, changed(f"the state key {key!r}")
    for name, worker in snapshot[adapter.WORKER_SNAPSHOTS].items():
        for key in (adapter.WORKER_ID, adapter.DATASET_STATE):
            assert key in worker, changed(f"the worker snapshot key {key!r} (in {name!r})")

    workers = adapter.worker_dataset_states(state)
    assert [worker_id for worker_id, _ in workers] == [0, 1], changed("the worker snapshots")
    for worker_id, dataset in workers:
        assert dataset["worker"] == worker_id, changed("the dataset states of the workers")

    summary = adapter.snapshot_summary(state)
    assert summary["num_workers"] == 2, changed("the number of workers in a state")
    assert summary["snapshot_step"] > 0, changed(f"{adapter.SNAPSHOT_STEP!r}")
    assert summary["snapshot_step"] + summary["steps_since"] == 7, changed(
        f"{adapter.SNAPSHOT_STEP!r} or {adapter.STEPS_SINCE_SNAPSHOT!r}"
    )
    assert summary["last_worker"] in (0, 1), changed(f"{adapter.LAST_YIELDED_WORKER_ID!r}")
    assert not summary["finished"]

    try:  # the whole layout, every key included, is what the adapter checks a state against
        checked = adapter.check_dataloader_state(state, 2, 2, "state")
    except InvalidStateError as error:
        pytest.fail(changed(f"the StatefulDataLoader state's layout: {error}"))
    assert [worker_id for worker_id, _, _ in checked] == [0, 1]
    assert adapter.fetcher_ended(state, 0) is False, changed(f"{adapter.FETCHER_STATE!r}")

    marked = adapter.map_dataset_states(state, lambda dataset: {**dataset, "seen": True})
    assert all(d["seen"] for _, d in adapter.worker_dataset_states(marked))
    assert all("seen" not in d for _, d in adapter.worker_dataset_states(state))  # a copy

    resumed = loader()  # the state (its layout included) still loads: the rest, exactly once
    resumed.load_state_dict(state)
    assert sorted(taken + list(resumed)) == list(range(40))


@slow
def test_the_iterator_has_what_the_adapter_reads():
    dl = loader()
    it = iter(dl)
    list(islice(it, 6))  # past a snapshot: both workers have sent their states

    for name in (adapter.WORKER_SNAPSHOTS, "_workers", "_shutdown_workers"):
        assert hasattr(it, name), changed(f"the iterator's attribute {name!r}")
    latest = adapter.latest_worker_states(it, 2)
    assert latest is not None and len(latest) == 2, changed(
        f"the iterator's {adapter.WORKER_SNAPSHOTS!r}"
    )
    assert [state["worker"] for state in latest] == [0, 1], changed(
        "the states the iterator keeps per worker (get_state())"
    )
    processes = adapter.worker_processes(it)
    assert len(processes) == 2, changed("the iterator's '_workers' (the worker processes)")
    assert all(p.is_alive() and p.pid for p in processes), changed("the worker processes")

    adapter.shutdown_workers(it)

    assert not any(p.is_alive() for p in processes), changed("'_shutdown_workers()'")


def test_the_adapter_names_match_torchdatas_own():
    """torchdata spells the state keys as class constants; a rename shows here first."""
    from torchdata.stateful_dataloader.stateful_dataloader import (
        _StatefulMultiProcessingDataLoaderIter as Iterator,
    )

    for constant, ours in (
        ("_SNAPSHOT", adapter.SNAPSHOT),
        ("_WORKER_SNAPSHOTS", adapter.WORKER_SNAPSHOTS),
        ("_MAIN_SNAPSHOT", adapter.MAIN_SNAPSHOT),
        ("_SNAPSHOT_STEP", adapter.SNAPSHOT_STEP),
        ("_STEPS_SINCE_SNAPSHOT", adapter.STEPS_SINCE_SNAPSHOT),
        ("_LAST_YIELDED_WORKER_ID", adapter.LAST_YIELDED_WORKER_ID),
        ("_NUM_WORKERS", adapter.NUM_WORKERS),
    ):
        assert getattr(Iterator, constant, None) == ours, changed(constant)


@slow
def test_what_the_death_watch_relies_on_is_still_there():
    """watch_deaths takes a watched iterator's pids out of torch's SIGCHLD registry and
    raises only inside its _try_get_data; the_main_process_is replaces the worker loop's
    ManagerWatchdog. A torch or torchdata release that moves any of it fails here."""
    import os
    import signal

    from torch.utils.data._utils import signal_handling
    from torchdata.stateful_dataloader import worker
    from torchdata.stateful_dataloader.stateful_dataloader import (
        _StatefulMultiProcessingDataLoaderIter as Iterator,
    )

    for name in ("_set_SIGCHLD_handler", "_remove_worker_pids", "_set_worker_pids"):
        assert callable(getattr(signal_handling, name, None)), changed(f"signal_handling.{name}")
    code = Iterator._try_get_data.__code__
    assert "_data_queue" in code.co_names and "is_alive" in code.co_names, changed(
        "_try_get_data (where the iterator waits for data and checks its workers)"
    )
    assert "ManagerWatchdog" in worker._worker_loop.__code__.co_names, changed(
        "the worker loop's ManagerWatchdog"
    )
    assert worker.ManagerWatchdog().manager_pid == os.getppid(), changed(
        "ManagerWatchdog.manager_pid"
    )

    dl = loader()
    it = iter(dl)
    assert it._worker_pids_set, changed("the iterator's '_worker_pids_set'")
    assert adapter.watch_deaths(it)
    assert not it._worker_pids_set
    with pytest.raises(ValueError):  # gone from torch's registry: removing again fails
        signal_handling._remove_worker_pids(id(it))
    assert signal.getsignal(signal.SIGCHLD) is adapter._on_child_exit
    exits = adapter.child_exits
    victim = adapter.worker_processes(it)[0]
    victim.kill()
    victim.join(5)
    deadline = time.monotonic() + 5
    while adapter.child_exits == exits and time.monotonic() < deadline:
        time.sleep(0.01)
    assert adapter.child_exits > exits  # counted, and nothing raised here in "user code"
    with pytest.raises(RuntimeError, match=f"pid.*{victim.pid}"):
        list(it)  # the iterator itself reports it
    adapter.shutdown_workers(it)


def test_a_worker_watches_the_pid_recorded_before_forking():
    import os

    from torchdata.stateful_dataloader import worker

    original = worker.ManagerWatchdog
    try:
        adapter.the_main_process_is(os.getpid())  # as if this process's parent were itself
        watchdog = worker.ManagerWatchdog()
        assert watchdog.manager_pid == os.getpid()
        assert not watchdog.is_alive()  # its parent is not the recorded pid: "dead"
    finally:
        worker.ManagerWatchdog = original


def test_set_worker_info_is_what_get_worker_info_answers():
    info = adapter.WorkerInfo(id=3, num_workers=5, seed=11, dataset=None)
    assert torch.utils.data.get_worker_info() is None  # the main process
    try:
        adapter.set_worker_info(info)
        assert torch.utils.data.get_worker_info() is info, changed(
            "torch.utils.data._utils.worker._worker_info (what get_worker_info() answers)"
        )
    finally:
        adapter.set_worker_info(None)
    assert torch.utils.data.get_worker_info() is None


class ReportsWorkerInfo(torch.utils.data.IterableDataset):
    """Each worker yields what get_worker_info() answered before and after the adapter set it,
    and a tensor over the adapter's shared memory."""

    def __iter__(self) -> Any:
        torchs = torch.utils.data.get_worker_info()
        adapter.set_worker_info(
            adapter.WorkerInfo(id=100 + torchs.id, num_workers=1, seed=0, dataset=self)
        )
        try:
            presented = torch.utils.data.get_worker_info().id
        finally:
            adapter.set_worker_info(torchs)
        shared = torch.empty(0, dtype=torch.int64).set_(adapter.new_shared_storage(8 * 4))
        shared.copy_(torch.arange(4))
        yield {
            "torchs": type(torchs),
            "id": torchs.id,
            "presented": presented,
            "restored": torch.utils.data.get_worker_info() is torchs,
            "shared": shared,
            "shared_in_worker": shared.is_shared(),
        }


@slow
def test_a_worker_sees_the_worker_info_the_adapter_sets():
    got = sorted(
        StatefulDataLoader(ReportsWorkerInfo(), batch_size=None, num_workers=2),
        key=lambda item: item["presented"],
    )

    assert all(item["torchs"] is adapter.WorkerInfo for item in got), changed(
        "torch.utils.data._utils.worker.WorkerInfo (the class of a worker's info)"
    )
    assert [item["id"] for item in got] == [0, 1]
    assert [item["presented"] for item in got] == [100, 101], changed(
        "torch.utils.data._utils.worker._worker_info, in a worker"
    )
    assert all(item["restored"] for item in got)
    for item in got:
        assert item["shared_in_worker"], changed("torch.UntypedStorage._new_shared")
        assert item["shared"].tolist() == [0, 1, 2, 3]


def test_new_shared_storage_is_shared_memory_of_that_size():
    storage = adapter.new_shared_storage(64)

    assert storage.is_shared(), changed("torch.UntypedStorage._new_shared")
    assert storage.nbytes() == 64, changed("torch.UntypedStorage._new_shared (its size)")
