"""Every use of torchdata's private ``StatefulDataLoader`` internals, in one place.

torchdata offers no public API for what the workers' node needs, so this module
reads private attributes, and nothing else in datapipes or nodes does:

- in a ``StatefulDataLoader.state_dict()`` (with workers): ``"_snapshot"`` holding
  ``"_worker_snapshots"`` (per ``"worker_<id>"``: ``"worker_id"``,
  ``"dataset_state"``), ``"_snapshot_step"``, ``"_last_yielded_worker_id"`` and
  ``"_main_snapshot"`` (``"_num_workers"``), beside ``"_steps_since_snapshot"``
  and ``"_iterator_finished"``;
- on the multi-process iterator: ``_worker_snapshots`` (the latest state each
  worker sent, objects with ``get_state()``), ``_workers`` (the processes) and
  ``_shutdown_workers()``.

Checked against torchdata 0.11.0 (with torch 2.6 to 2.13). ``tests/test_torchdata_adapter.py``
runs a real ``StatefulDataLoader`` with two workers and fails, naming the
attribute, when a torchdata release changes any of them; update this module then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def _worker_snapshots(state: Any) -> dict[str, Any] | None:
    snapshot = state.get(SNAPSHOT) if isinstance(state, dict) else None
    workers = snapshot.get(WORKER_SNAPSHOTS) if isinstance(snapshot, dict) else None
    return workers if isinstance(workers, dict) else None


def worker_dataset_states(state: Any) -> list[tuple[int, dict[str, Any]]]:
    """``(worker id, dataset state)`` of each worker in a StatefulDataLoader state, by id.

    A worker that has sent no state yet has ``{}``. A state without workers gives ``[]``.
    """
    found = []
    for name, worker in (_worker_snapshots(state) or {}).items():
        worker = worker if isinstance(worker, dict) else {}
        try:
            worker_id = int(worker.get(WORKER_ID, str(name).rsplit("_", 1)[-1]))
        except ValueError:
            continue
        found.append((worker_id, worker.get(DATASET_STATE) or {}))
    return sorted(found, key=lambda pair: pair[0])


def map_dataset_states(state: dict[str, Any], fn: Callable[[Any], Any]) -> dict[str, Any]:
    """A copy of a StatefulDataLoader state with each worker's dataset state replaced by
    ``fn(dataset state)``; a state of another layout comes back unchanged."""
    workers = _worker_snapshots(state)
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
    workers = _worker_snapshots(state) or {}
    main = snapshot.get(MAIN_SNAPSHOT) or {}
    last = snapshot.get(LAST_YIELDED_WORKER_ID)
    return {
        "snapshot_step": int(snapshot.get(SNAPSHOT_STEP) or 0),
        "steps_since": int(state.get(STEPS_SINCE_SNAPSHOT) or 0),
        "last_worker": last if isinstance(last, int) else None,
        "num_workers": len(workers) or int(main.get(NUM_WORKERS) or 0),
        "finished": bool(state.get(ITERATOR_FINISHED)),
    }


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
    early (an error, ``close()``) must not wait for that.
    """
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
