"""Validation of a workers' node state: torchdata's layout, then each worker's dataset state.

Each worker's state is checked against the graph that worker would build
(its own context), in the main process, before any worker starts; building
opens nothing.
"""

from __future__ import annotations

from typing import Any

from nodes.adapters import torchdata
from nodes.errors import MISSING, InvalidStateError
from nodes.state_checks import at, expect_bool, expect_int, expect_keys
from nodes.workers.bundles import bundled as is_bundled
from nodes.workers.bundles import max_items


def validate_workers_state(
    dataset: Any,
    num_workers: int,
    epoch: int,
    state: Any,
    path: str,
    *,
    snapshot_every: int,
    max_replay: int = 0,
    items_per_transfer: int | str = 1,
) -> None:
    """Refuse a :class:`nodes.WorkerStreamNode` state its workers could not resume exactly.

    ``dataset`` (a :class:`datapipes.TorchDataset`) checks each worker's part;
    ``max_replay``: the most items a state may replay after its snapshot, when more
    than the snapshot interval allows (a state rebuilt after a worker died);
    ``items_per_transfer`` > 1 or ``"auto"``: the state also says how many items of
    the bundle after its DataLoader position were taken (fewer than a bundle holds),
    and (states saved since it was recorded) how many a bundle holds.
    """
    bundles = is_bundled(items_per_transfer)
    bundled = {"taken"} if bundles else set()
    recorded = {"items_per_transfer"} if bundles else set()  # not always
    expect_keys(state, path, {"ended"}, optional={"dataloader", *bundled, *recorded})
    if expect_bool(state, "ended", path):
        expect_keys(state, path, {"ended"})  # an ended epoch holds nothing more
        return
    expect_keys(state, path, {"ended", "dataloader", *bundled}, optional=recorded)
    if bundled:
        expect_int(state, "taken", path, 0, max_items(items_per_transfer) - 1)
    recorded_value = state.get("items_per_transfer", items_per_transfer)
    if type(recorded_value) is not type(items_per_transfer) or recorded_value != items_per_transfer:
        raise InvalidStateError(
            at(path, "items_per_transfer"),
            f"{items_per_transfer!r} (this Loader's items_per_transfer)",
            state["items_per_transfer"],
        )
    where = at(path, "dataloader")
    checked = torchdata.check_dataloader_state(
        state["dataloader"], num_workers, snapshot_every, where, max_replay=max_replay
    )
    step = torchdata.snapshot_summary(state["dataloader"])["snapshot_step"]
    for worker_id, dataset_state, place in checked:
        # Workers take turns from worker 0: by the snapshot, one asked for an item has a
        # position; one without would start its share again (its items repeated).
        asked = step > worker_id
        if dataset_state is not None and not isinstance(dataset_state, dict):
            raise InvalidStateError(place, "a dict (the worker's state)", dataset_state)
        if not dataset_state and not asked:
            continue  # {} or None: a worker that had sent no state yet starts its share
        if asked and (not dataset_state or dataset_state.get("node", MISSING) is None):
            where = at(place, "node") if dataset_state else place
            raise InvalidStateError(
                where,
                f"worker {worker_id}'s position (it had been asked for items by the snapshot "
                f"at item {step})",
                dataset_state.get("node") if dataset_state else dataset_state,
            )
        ended = torchdata.fetcher_ended(state["dataloader"], worker_id)
        dataset.validate_state(dataset_state, worker_id, num_workers, epoch, place, ended=ended)
