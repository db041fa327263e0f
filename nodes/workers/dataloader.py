"""The torchdata ``StatefulDataLoader`` a worker node runs, and how its workers' deaths read."""

from __future__ import annotations

import multiprocessing
import re
import signal
import warnings
from typing import Any

from nodes.adapters import torchdata
from nodes.rng import stable_hash
from nodes.workers.parent_watch import WatchMainProcess

#: The main process snapshots the workers' states every ``SNAPSHOT_EVERY``
#: items (torchdata's ``snapshot_every_n_steps``); workers send their states
#: only with the items near a snapshot. A resume restores the last snapshot and
#: replays the items since, fewer than ``SNAPSHOT_EVERY``. Measured on the JSONL
#: benchmark (2 workers, 10,000-item shuffle buffer): a state with every item
#: costs the main process 0.5 ms per batch; at 32 the cost is within noise of a
#: StatefulDataLoader over a dataset with no state at all.
SNAPSHOT_EVERY = 32


def keep_as_is(item: Any) -> Any:
    """The DataLoader's collate for items the pipeline made: unchanged (no tuple -> list)."""
    return item


def stateful_dataloader(dataset: Any, num_workers: int, epoch: int, **options: Any) -> Any:
    """A torchdata ``StatefulDataLoader`` over ``dataset`` yielding its items as they are.

    The workers' base seed (from which torch seeds their ``random`` and
    ``torch`` generators) comes from the dataset's ``seed``, its rank and
    ``epoch``, not from torch's global generator, which the DataLoader would
    otherwise draw from, so iterating never moves the training process's RNG
    and the workers of different ranks draw differently.
    """
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    # Every worker first makes sure it ends with the main process (see nodes.workers.parent_watch).
    options["worker_init_fn"] = WatchMainProcess(
        options.get("worker_init_fn"), start_method(options.get("multiprocessing_context"))
    )
    topology = getattr(dataset, "topology", None)
    rank = getattr(topology, "rank", 0)
    key = f"datapipes workers {getattr(dataset, 'seed', 0)} {rank} {epoch}"
    with warnings.catch_warnings():
        # torchdata calls a torch API deprecated in torch >= 2.6 on every construction.
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        return StatefulDataLoader(
            dataset,
            batch_size=None,
            collate_fn=keep_as_is,  # the default would turn tuples into lists, arrays to tensors
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(stable_hash(key)),
            **{"snapshot_every_n_steps": SNAPSHOT_EVERY, **options},
        )


def start_method(context: Any) -> str:
    """How worker processes start under a DataLoader's ``multiprocessing_context``."""
    if context is None:
        return multiprocessing.get_start_method()
    return context if isinstance(context, str) else context.get_start_method()


def without_stats(state: dict[str, Any]) -> dict[str, Any]:
    """The DataLoader's state without the statistics the workers' states carry.

    Statistics ride on the workers' states to reach this process (see
    ``TorchDataset.state_dict``); a checkpoint stays the same with them on or
    off. Anything unexpected is kept.
    """
    return torchdata.map_dataset_states(state, _drop_stats)


def _drop_stats(dataset: Any) -> Any:
    if isinstance(dataset, dict) and "stats" in dataset:
        return {k: v for k, v in dataset.items() if k != "stats"}
    return dataset


class WorkerDiedError(RuntimeError):
    """A DataLoader worker process ended abruptly (a signal, ``os._exit``, the OOM killer)."""


def signal_name(number: int) -> str:
    """``"SIGKILL"`` for 9: the name of the signal that ended a worker."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def died_as_they_started(message: str) -> str:
    """``"worker process(es) pid 123"`` from torch's error for workers that died before the
    node knew them (``DataLoader worker (pid(s) 123) exited unexpectedly``), else ``""``."""
    found = re.search(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly", message)
    return f"worker process(es) pid {found.group(1)}" if found else ""
