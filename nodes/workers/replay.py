"""The DataLoader's turn order, replayed: each worker's position after the last item delivered.

A :class:`torchdata` ``StatefulDataLoader`` state holds every worker's state
at its last snapshot and how many transfers the main process took since, from
the workers in turn (a transfer is one item, or a bundle that
``items_per_transfer``'s rule closes, see :mod:`nodes.workers.bundles`; a
worker at the end of its share sends fewer, then none). Replaying those
transfers on each worker's graph, rebuilt as that worker built it, gives each
worker's position after the last item the main process returned from it: what
an elastic resume converts (see :mod:`datapipes.resume.remaining`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodes.adapters import torchdata
from nodes.base import Node
from nodes.errors import InvalidStateError
from nodes.steps.batch import drop_counts
from nodes.workers.bundles import TransferRule, item_bytes, max_items

#: A worker that had ended its share: it holds nothing more.
ENDED = object()


def worker_positions(
    build: Callable[[int], Node[Any]],
    num_workers: int,
    items_per_transfer: int | str,
    loader_state: dict[str, Any],
    taken: int,
    path: str,
    drops: dict[str, int] | None = None,
) -> list[Any]:
    """Each worker's node state (or :data:`ENDED`) after the transfers ``loader_state``
    says were returned, then ``taken`` items of the next one.

    ``build(worker)`` builds worker ``worker``'s graph; ``path`` is where the
    DataLoader's state sits in the Loader state (errors name it). ``drops``,
    when given, receives what the workers that ended their share dropped.
    """
    if not loader_state:
        return [None] * num_workers
    snapshots = dict(torchdata.worker_dataset_states(loader_state))
    missing = [w for w in range(num_workers) if w not in snapshots]
    if snapshots and missing:
        raise InvalidStateError(
            f"{path}.dataloader",
            f"a snapshot of each of the {num_workers} workers (topology.num_workers)",
            f"none for worker(s) {missing}",
        )
    summary = torchdata.snapshot_summary(loader_state)
    roots: list[Node[Any]] = []
    ended = []
    try:
        for worker in range(num_workers):
            saved = snapshots.get(worker) or {}
            root = build(worker)
            roots.append(root)
            if saved.get("node") is not None:
                root.validate_state(saved["node"], f"{path}.dataloader.worker_{worker}.node")
            root.reset(saved.get("node"))
            ended.append(bool(saved) and torchdata.fetcher_ended(loader_state, worker))
        turn = 0 if summary["last_worker"] is None else (summary["last_worker"] + 1) % num_workers
        exhausted = [False] * num_workers  # a worker that sent a short bundle sends no more

        rule = TransferRule(items_per_transfer)
        measures = rule.measures()

        def transfer(worker: int, limit: int | None) -> int:
            """Items of one transfer of ``worker``: a bundle as ``rule`` closes it, or
            (``limit``) the first that many of the bundle begun (fewer: it held fewer)."""
            count = size = 0
            while not exhausted[worker]:
                item = next(iter(roots[worker]), ENDED)
                if item is ENDED:
                    exhausted[worker] = True
                    break
                count += 1
                size += item_bytes(item) if measures else 0
                if count == limit or rule.full(count, size):
                    break
            return count

        most = max_items(items_per_transfer)
        if not 0 <= taken < most:
            raise InvalidStateError(f"{path}.taken", f"an int in [0, {most - 1}]", taken)
        limits: list[int | None] = [None] * summary["steps_since"] + ([taken] if taken else [])
        for index, limit in enumerate(limits):
            count = 0
            for _ in range(num_workers):
                worker, turn = turn, (turn + 1) % num_workers
                if not ended[worker]:
                    count = transfer(worker, limit)
                    if count:
                        break
                    ended[worker] = True
            if taken and index == len(limits) - 1 and count < taken:
                # The bundle the state says was begun holds fewer items than were taken.
                raise InvalidStateError(f"{path}.taken", f"at most {count} (the items left)", taken)
        ended = [e or x for e, x in zip(ended, exhausted, strict=True)]
        if drops is not None:
            for worker in range(num_workers):
                if ended[worker]:
                    saved = (snapshots.get(worker) or {}).get("dropped", {})
                    for step, count in {**saved, **drop_counts(roots[worker])}.items():
                        drops[step] = drops.get(step, 0) + count
        return [ENDED if ended[w] else roots[w].state_dict() for w in range(num_workers)]
    finally:
        for root in roots:
            root.close()


def with_more_steps(node: Any, since: int, path: str) -> Any:
    """A Loader graph state whose DataLoader returned ``since`` more transfers."""
    if not isinstance(node, dict):
        raise InvalidStateError(path, "a DataLoader state to replay items after", node)
    if "dataloader" in node:
        loader = node["dataloader"]
        summary = torchdata.snapshot_summary(loader)
        moved = torchdata.at_step(loader, summary["snapshot_step"] + summary["steps_since"] + since)
        return {**node, "dataloader": moved}
    from nodes.base import UPSTREAM

    return {**node, UPSTREAM: with_more_steps(node.get(UPSTREAM), since, path)}
