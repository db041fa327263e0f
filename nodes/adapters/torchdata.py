"""Every use of the private names of torch's DataLoader and torchdata, in one place.

torch and torchdata offer no public API for what the workers' node needs, so this
module reads private names, and nothing else in datapipes or nodes does (torch's
other private names are in :mod:`nodes.adapters.torch`):

- in a ``StatefulDataLoader.state_dict()`` (with workers): ``"_snapshot"`` holding
  ``"_worker_snapshots"`` (per ``"worker_<id>"``: ``"worker_id"``,
  ``"dataset_state"``, ``"fetcher_state"``), ``"_snapshot_step"``,
  ``"_last_yielded_worker_id"`` and ``"_main_snapshot"`` (``"_num_workers"``,
  ``"_sampler_iter_state"``, ``"_index_sampler_state"``, ``"_sampler_iter_yielded"``,
  ``"_IterableDataset_len_called"``, ``"_shared_seed"``, ``"_base_seed"``), beside
  ``"_steps_since_snapshot"`` and ``"_iterator_finished"``: reading, moving and
  checking a saved position;
- on the multi-process iterator
  (``torchdata.stateful_dataloader.stateful_dataloader._StatefulMultiProcessingDataLoaderIter``):
  ``_worker_snapshots`` (the latest state each worker sent, objects with
  ``get_state()``), ``_workers`` (the processes), ``_shutdown_workers()``,
  ``_try_get_data`` (where it waits for data) and ``_worker_pids_set``: the
  workers' states between snapshots, stopping them, reporting their deaths;
- torch's SIGCHLD handling (``torch.utils.data._utils.signal_handling``:
  ``_set_SIGCHLD_handler``, ``_remove_worker_pids``), so that a worker's death
  is reported from the node's own ``next()`` (see ``watch_deaths``);
- in a worker, ``torchdata.stateful_dataloader.worker.ManagerWatchdog`` (its
  ``manager_pid``), the worker's watch on the main process (``the_main_process_is``);
- ``torch.utils.data._utils.worker._worker_info``, what ``get_worker_info()``
  answers, set while a dataset starts (:func:`set_worker_info`), and its class
  ``WorkerInfo``, which has no public import path (re-exported here);
- ``torch.UntypedStorage._new_shared``: a batch allocated in shared memory, as
  torch's own ``default_collate`` does in a worker (:func:`new_shared_storage`).

Checked against torchdata 0.11.0 (with torch 2.6 to 2.13).
``tests/adapters/test_torchdata_adapter.py``
runs a real ``StatefulDataLoader`` with two workers and fails, naming the
attribute, when a torch or torchdata release changes any of them; update this module then.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data._utils import worker as _torch_worker
from torch.utils.data._utils.worker import WorkerInfo  # re-exported: no public import path

#: Keys of a StatefulDataLoader state (torchdata's private names).
SNAPSHOT = "_snapshot"
WORKER_SNAPSHOTS = "_worker_snapshots"
MAIN_SNAPSHOT = "_main_snapshot"
SNAPSHOT_STEP = "_snapshot_step"
STEPS_SINCE_SNAPSHOT = "_steps_since_snapshot"
LAST_YIELDED_WORKER_ID = "_last_yielded_worker_id"
ITERATOR_FINISHED = "_iterator_finished"
NUM_WORKERS = "_num_workers"
WORKER_ID = "worker_id"
DATASET_STATE = "dataset_state"
FETCHER_STATE = "fetcher_state"


def _snapshots_of_workers(state: Any) -> dict[str, Any] | None:
    snapshot = state.get(SNAPSHOT) if isinstance(state, dict) else None
    workers = snapshot.get(WORKER_SNAPSHOTS) if isinstance(snapshot, dict) else None
    return workers if isinstance(workers, dict) else None


def worker_dataset_states(state: Any) -> list[tuple[int, dict[str, Any]]]:
    """``(worker id, dataset state)`` of each worker in a StatefulDataLoader state, by id.

    A worker that has sent no state yet has ``{}``. A state without workers gives ``[]``.
    """
    found = []
    for name, worker in (_snapshots_of_workers(state) or {}).items():
        worker = worker if isinstance(worker, dict) else {}
        try:
            worker_id = int(worker.get(WORKER_ID, str(name).rsplit("_", 1)[-1]))
        except (ValueError, TypeError):
            continue
        found.append((worker_id, worker.get(DATASET_STATE) or {}))
    return sorted(found, key=lambda pair: pair[0])


def map_dataset_states(state: dict[str, Any], fn: Callable[[Any], Any]) -> dict[str, Any]:
    """A copy of a StatefulDataLoader state with each worker's dataset state replaced by
    ``fn(dataset state)``; a state of another layout comes back unchanged."""
    workers = _snapshots_of_workers(state)
    if workers is None:
        return state
    mapped = {}
    for key, worker in workers.items():
        if isinstance(worker, dict) and DATASET_STATE in worker:
            worker = {**worker, DATASET_STATE: fn(worker[DATASET_STATE])}
        mapped[key] = worker
    return {**state, SNAPSHOT: {**state[SNAPSHOT], WORKER_SNAPSHOTS: mapped}}


def snapshot_summary(state: dict[str, Any]) -> dict[str, Any]:
    """Where a StatefulDataLoader state stands, for people.

    ``snapshot_step`` (items returned at the last snapshot), ``steps_since``
    (items returned after it, which a resume replays), ``last_worker`` (the
    worker that gave the item before the snapshot, or ``None``),
    ``num_workers`` and ``finished`` (the iterator had ended).
    """
    snapshot = state.get(SNAPSHOT) or {}
    workers = _snapshots_of_workers(state) or {}
    main = snapshot.get(MAIN_SNAPSHOT) or {}
    last = snapshot.get(LAST_YIELDED_WORKER_ID)
    return {
        "snapshot_step": int(snapshot.get(SNAPSHOT_STEP) or 0),
        "steps_since": int(state.get(STEPS_SINCE_SNAPSHOT) or 0),
        "last_worker": last if isinstance(last, int) else None,
        "num_workers": len(workers) or int(main.get(NUM_WORKERS) or 0),
        "finished": bool(state.get(ITERATOR_FINISHED)),
    }


def at_step(state: Any, step: int) -> dict[str, Any] | None:
    """``state`` made to resume after ``step`` items (replaying from its snapshot), or
    ``None`` when its snapshot is past ``step`` (or it is no StatefulDataLoader state)."""
    if not isinstance(state, dict) or not isinstance(state.get(SNAPSHOT), dict):
        return None
    snapshot_step = snapshot_summary(state)["snapshot_step"]
    if snapshot_step > step:
        return None
    return {**state, STEPS_SINCE_SNAPSHOT: step - snapshot_step}


def latest_worker_states(iterator: Any, num_workers: int) -> list[Any] | None:
    """The latest dataset state each worker sent, as the DataLoader iterator keeps them.

    ``None`` for a worker that sent none; ``None`` overall when ``iterator`` is
    not a multi-process StatefulDataLoader iterator (ended, or not started).
    """
    latest = getattr(iterator, WORKER_SNAPSHOTS, None)
    if not isinstance(latest, dict):
        return None
    states = []
    for worker in range(num_workers):
        tracked = latest.get(f"worker_{worker}")
        state = tracked.get_state() if hasattr(tracked, "get_state") else None
        states.append(state.get(DATASET_STATE) if isinstance(state, dict) else None)
    return states


def worker_processes(iterator: Any) -> list[Any]:
    """The worker processes of a DataLoader iterator (``[]`` when it has none)."""
    return list(getattr(iterator, "_workers", None) or [])


def shutdown_workers(iterator: Any) -> None:
    """Stop a DataLoader iterator's worker processes now (nothing when it has none).

    The iterator would do it when garbage collected; a node that stops an epoch
    early (an error, ``close()``) must not wait for that. A worker that outlives the
    DataLoader's own shutdown (stopped with SIGSTOP, or stuck in native code: its
    SIGTERM stays pending) is killed, so a closed Loader leaves no process behind.
    """
    processes = worker_processes(iterator)
    for process in processes:
        # A worker stopped (SIGSTOP) while it held the lock of the DataLoader's "workers
        # done" event would block the shutdown's set() of that event forever: let it go on.
        if process.pid is not None and process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    for process in processes:
        if process.is_alive():
            process.kill()  # SIGKILL ends a stopped process too
            process.join(10)


def shutdown_failed_start(error: BaseException) -> None:
    """Stop the workers of a DataLoader iterator whose start raised ``error`` (torchdata
    fast-forwards a resumed one in its ``__init__``: a worker that refuses its state raises
    there). Nothing but the traceback holds that iterator: its workers would be stopped
    when it is garbage collected, at some later allocation, which then waits seconds per
    worker for them."""
    traceback = error.__traceback__
    while traceback is not None:
        iterator = traceback.tb_frame.f_locals.get("self")
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            shutdown_workers(iterator)
        traceback = traceback.tb_next


#: The main snapshot of a StatefulDataLoader over an IterableDataset (no sampler state).
_MAIN_KEYS = (
    NUM_WORKERS,
    "_sampler_iter_state",
    "_index_sampler_state",
    "_sampler_iter_yielded",
    "_IterableDataset_len_called",
    "_shared_seed",
    "_base_seed",
)


def check_dataloader_state(
    state: Any, num_workers: int, snapshot_every: int, path: str, *, max_replay: int = 0
) -> list[tuple[int, Any, str]]:
    """``(worker id, dataset state, its path)`` for each worker of a StatefulDataLoader state,
    after refusing (:class:`nodes.errors.InvalidStateError`, naming the path) a state that
    is not torchdata's layout for ``num_workers`` workers snapshotting every
    ``snapshot_every`` items: a snapshot missing or ``None`` for a worker, a worker id out of
    range, a count that is no int >= 0 or is past the snapshot interval (or ``max_replay``
    items after a snapshot, when larger), an unknown key.
    """
    from nodes.errors import InvalidStateError
    from nodes.state_checks import at, check_int, expect_bool, expect_int, expect_keys

    expect_keys(state, path, {SNAPSHOT, STEPS_SINCE_SNAPSHOT, ITERATOR_FINISHED})
    # Snapshots are taken every `snapshot_every` items: the replay after one is shorter.
    expect_int(state, STEPS_SINCE_SNAPSHOT, path, 0, max(snapshot_every - 1, max_replay))
    finished = state.get(ITERATOR_FINISHED)
    if finished is not False:  # an ended epoch is saved as {"ended": true}, without this
        raise InvalidStateError(at(path, ITERATOR_FINISHED), "false (a running epoch)", finished)
    snapshot, where = state[SNAPSHOT], at(path, SNAPSHOT)
    keys = {SNAPSHOT_STEP, LAST_YIELDED_WORKER_ID, MAIN_SNAPSHOT, WORKER_SNAPSHOTS}
    expect_keys(snapshot, where, keys)
    step = expect_int(snapshot, SNAPSHOT_STEP, where)
    if step % snapshot_every:
        raise InvalidStateError(
            at(where, SNAPSHOT_STEP), f"a multiple of {snapshot_every} (the interval)", step
        )
    expect_int(snapshot, LAST_YIELDED_WORKER_ID, where, 0, num_workers - 1)
    main, place = snapshot[MAIN_SNAPSHOT], at(where, MAIN_SNAPSHOT)
    expect_keys(main, place, _MAIN_KEYS)
    expect_int(main, NUM_WORKERS, place, num_workers, num_workers)
    expect_int(main, "_sampler_iter_yielded", place)
    expect_int(main, "_base_seed", place, 0, 2**64 - 1)
    for key in ("_sampler_iter_state", "_index_sampler_state"):  # an IterableDataset's: none
        if main[key] is not None:
            raise InvalidStateError(at(place, key), "null (no sampler)", main[key])
    for key in ("_IterableDataset_len_called", "_shared_seed"):
        if main[key] is not None:
            check_int(main[key], at(place, key))
    workers, where = snapshot[WORKER_SNAPSHOTS], at(where, WORKER_SNAPSHOTS)
    names = [f"worker_{i}" for i in range(num_workers)]
    expect_keys(workers, where, names)
    found = []
    for worker_id, name in enumerate(names):
        worker, place = workers[name], at(where, name)
        expect_keys(worker, place, {WORKER_ID, DATASET_STATE, FETCHER_STATE})
        check_int(worker[WORKER_ID], at(place, WORKER_ID), worker_id, worker_id)
        fetcher = worker[FETCHER_STATE]
        expect_keys(fetcher, at(place, FETCHER_STATE), {"fetcher_ended", "dataset_iter_state"})
        expect_bool(fetcher, "fetcher_ended", at(place, FETCHER_STATE))
        if fetcher["dataset_iter_state"] is not None:  # the dataset keeps its own state
            raise InvalidStateError(
                at(at(place, FETCHER_STATE), "dataset_iter_state"), "null", fetcher
            )
        found.append((worker_id, worker[DATASET_STATE], at(place, DATASET_STATE)))
    return found


def fetcher_ended(state: dict[str, Any], worker_id: int) -> bool:
    """Whether worker ``worker_id`` had run out of items in a checked StatefulDataLoader state."""
    worker = state[SNAPSHOT][WORKER_SNAPSHOTS][f"worker_{worker_id}"]
    return bool(worker[FETCHER_STATE]["fetcher_ended"])


# ----- worker deaths ------------------------------------------------------------------------
# torch registers each iterator's worker pids and installs a SIGCHLD handler that raises
# "DataLoader worker (pid N) is killed by signal" wherever the main thread happens to be:
# in user code between epochs (an idle persistent worker), in another Loader's loop, or
# inside torch's __next__ after it counted an item the caller never receives. For the
# iterators a WorkerStreamNode runs, watch_deaths() takes them out of torch's registry; our
# handler (chained before torch's) raises only where it is safe, the iterator itself
# blocked waiting for data (torch's _try_get_data, before any count moves), and otherwise
# only counts the exit, so the node checks its workers at its own next step.

#: SIGCHLDs seen since the handler was installed; a node checks its workers when this moved.
child_exits = 0
_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_handler_installed = False
_previous_handler: Any = None


def watch_deaths(iterator: Any) -> bool:
    """Report deaths of ``iterator``'s workers only inside its own ``__next__`` (see above).

    Returns whether it is watched: not where no SIGCHLD handler can be set (not the main
    thread, Windows), where torch's handling is left as it is.
    """
    if not worker_processes(iterator) or not _install_handler():
        return False
    if getattr(iterator, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False  # so its shutdown does not remove them again
    _watched.add(iterator)
    return True


def _install_handler() -> bool:
    global _handler_installed, _previous_handler
    if _handler_installed:
        return True
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        return False
    from torch.utils.data._utils import signal_handling

    signal_handling._set_SIGCHLD_handler()  # torch's first, so it is the one chained to
    _previous_handler = signal.getsignal(signal.SIGCHLD)
    signal.signal(signal.SIGCHLD, _on_child_exit)
    _handler_installed = True
    return True


def _on_child_exit(signum: int, frame: Any) -> None:
    global child_exits
    child_exits += 1
    waiting = _waiting_iterator(frame)
    if waiting is not None:
        dead = [p.pid for p in worker_processes(waiting) if _has_died(p)]
        if dead:  # caught by _try_get_data, which names the workers it finds dead
            raise RuntimeError(f"DataLoader worker (pid(s) {dead}) died")
    if callable(_previous_handler):
        _previous_handler(signum, frame)


def _waiting_iterator(frame: Any) -> Any:
    """The watched iterator whose ``_try_get_data`` the main thread is in, if any."""
    from torchdata.stateful_dataloader.stateful_dataloader import (
        _StatefulMultiProcessingDataLoaderIter as Iterator,
    )

    code = Iterator._try_get_data.__code__
    for _ in range(32):  # queue.get -> connection.poll -> selectors: a few frames deep
        if frame is None:
            return None
        if frame.f_code is code:
            iterator = frame.f_locals.get("self")
            return iterator if iterator in _watched else None
        frame = frame.f_back
    return None


def _has_died(process: Any) -> bool:
    """Whether a worker ended other than by exiting with 0 (not reaped: torch does that)."""
    if not hasattr(os, "waitid"):  # not on every Unix: reap it, then torch finds its exit code
        return process.exitcode not in (None, 0)
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # already reaped: its exit code is known
        return process.exitcode not in (None, 0)
    return info is not None and not (info.si_code == os.CLD_EXITED and info.si_status == 0)


# ----- the workers' watch on the main process ---------------------------------------------
# torchdata's worker loop makes a ManagerWatchdog after the worker_init_fn, which records
# os.getppid() as the main process: a worker whose main process died before that records
# init (or a subreaper) and waits forever. In the worker, the_main_process_is() makes the
# watchdog compare against the pid recorded before forking instead.


def the_main_process_is(pid: int) -> None:
    """In a worker: make torchdata's parent watch expect ``pid`` as the main process."""
    from torchdata.stateful_dataloader import worker

    class WatchRecordedParent(worker.ManagerWatchdog):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            super().__init__()
            self.manager_pid = pid

    worker.ManagerWatchdog = WatchRecordedParent


# ----- what get_worker_info() answers, and shared memory ------------------------------------


def set_worker_info(info: WorkerInfo | None) -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer ``info`` in this process from now on
    (``None``: as in the main process). Read the current answer with ``get_worker_info()``."""
    _torch_worker._worker_info = info


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """``nbytes`` of shared memory, which a worker sends to the main process as they are."""
    return torch.UntypedStorage._new_shared(nbytes)
