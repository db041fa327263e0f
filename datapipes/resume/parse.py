"""A saved Loader state, checked and parsed once into :class:`datapipes.resume.JobState`.

Shapes and types first (:mod:`datapipes.resume.schema`, naming the path
inside the state), then the fields against each other: a contradiction is an
:class:`InvalidStateError` naming both places, and nothing in a state is
believed before all of it was checked. The recipe, the seed and the new
topology are compared later, by the resume plan (:mod:`datapipes.resume.plan`).
"""

from __future__ import annotations

import json
from typing import Any

from datapipes.resume.model import (
    DispatchRecord,
    Drops,
    JobSetup,
    JobState,
    Plans,
    RankEntry,
    Remaining,
)
from datapipes.resume.schema import check_envelope, node_state, rank_path
from nodes.adapters import torchdata
from nodes.base import UPSTREAM
from nodes.errors import InvalidStateError, StateMismatchError
from nodes.workers.bundles import bundled

#: 5: a shard's state records its stream position (``"read"``), and a rank's entry may
#: hold its consumers' plans after a resume on another topology (``"plans"``), or the
#: units they claimed under dynamic dispatch (``"dispatch"``, added within version 5:
#: states without it read as before).
#: 4: every node keeps its input's state under ``nodes.UPSTREAM`` (``"upstream"``; version
#: 3 used ``"up"``, ``"anchor"``, ``"inputs"``, ``"current"``), and random streams derive
#: from the recipe's structure, not its display string, so shuffle orders moved.
#: 3: shuffles of up to 65,536 items draw uniform permutations, unlike version 2's.
STATE_VERSION = 5

#: Why a state of an older version cannot resume exactly, by version.
_WHY_REFUSED = {
    2: "whose shuffles ordered items differently",
    3: (
        "whose node states were laid out differently and whose shuffle orders derived "
        "from the recipe's display string, not its structure"
    ),
    4: "whose shard states did not record the stream position",
}


def parse_state(raw: Any) -> JobState:
    """The :class:`JobState` of a saved Loader state, or a clear error.

    :class:`StateMismatchError` for what is not a Loader state of this
    version (a whole training checkpoint is pointed at its Loader entry);
    :class:`InvalidStateError` naming the path for a damaged one.

    >>> import datapipes as dp
    >>> state = parse_state(dp.Loader(dp.range(4), seed=3).state_dict())
    >>> state.setup, sorted(state.ranks)
    (JobSetup(world_size=1, num_workers=0, seed=3, even_batches=False, items_per_transfer=1), [0])
    """
    check_version(raw)
    check_envelope(raw)
    topology = raw["topology"]
    setup = JobSetup(
        world_size=topology["world_size"],
        num_workers=topology["num_workers"],
        seed=raw["seed"],
        even_batches=topology["even_batches"],
        items_per_transfer=topology.get("items_per_transfer", 1),
    )
    ranks = {int(rank): _entry(int(rank), entry) for rank, entry in raw["ranks"].items()}
    for group in raw.get("idle", []):
        for first, last in group["ranks"]:
            for rank in range(first, last + 1):
                ranks[rank] = RankEntry(rank, group["epoch"])
    for entry in ranks.values():
        _check_against_setup(entry, setup)
        _check_workers_against_setup(entry, setup)
    remaining = None
    if "remaining" in raw:
        value = json.loads(raw["remaining"]["text"])
        remaining = Remaining(value["epoch"], value["work"], value["dropped"])
    return JobState(
        fingerprint=raw["fingerprint"],
        steps=tuple(raw["steps"]),
        setup=setup,
        ranks={rank: ranks[rank] for rank in sorted(ranks)},
        remaining=remaining,
    )


def check_version(raw: Any) -> None:
    """Refuse (:class:`StateMismatchError`, saying what it is) anything but a Loader state of
    this version."""
    version = raw.get("version") if isinstance(raw, dict) else None
    if isinstance(raw, dict) and type(version) is int and version == STATE_VERSION:
        return
    found = version if isinstance(raw, dict) else type(raw).__name__
    hint = ""
    if isinstance(found, int) and found < STATE_VERSION:
        why = _WHY_REFUSED.get(found, "whose positions meant something else")
        hint = (
            f": it was saved by an older datapipes, {why}, so it cannot resume "
            "exactly; restart the epoch (set_epoch) or resume with the version that saved it"
        )
    elif isinstance(raw, dict) and version is None:
        from datapipes.resume.graph_record import find_loader_states, top_level

        inner = find_loader_states(raw)
        if inner:  # a whole training checkpoint: say which entry is the Loader's
            path = inner[0][0]
            hint = (
                f": this looks like a whole checkpoint; pass the Loader's own entry, "
                f"at {path!r} in it (e.g. load_state_dict(checkpoint[{path!r}]))"
                if path.isidentifier()
                else f": this looks like a whole checkpoint; pass its entry at {path!r}"
            )
        else:
            hint = f": no Loader state in it ({top_level(raw)})"
    raise StateMismatchError(
        f"not a datapipes Loader state of version {STATE_VERSION} (found {found!r})" + hint
    )


def _entry(rank: int, raw: dict[str, Any]) -> RankEntry:
    path = rank_path(str(rank))
    plans = None
    if "plans" in raw:
        value = json.loads(raw["plans"]["text"])
        plans = Plans(value["epoch"], tuple(value["consumers"]))
    dropped = None
    if "dropped" in raw:
        found = raw["dropped"]
        dropped = Drops(found["epoch"], dict(found["counts"]), dict(found.get("carried", {})))
    dispatch = None
    if "dispatch" in raw:
        found = raw["dispatch"]
        dispatch = DispatchRecord(
            epoch=found["epoch"],
            key=found["key"],
            consumers=found["consumers"],
            unit_items=found["unit_items"],
            work=found["work"],
            claims={int(c): dict(places) for c, places in found["claims"].items()},
        )
    graph = raw.get("graph")
    return RankEntry(
        rank=rank,
        epoch=raw["epoch"],
        node=node_state(raw["node"], f"{path}.node"),
        graph=graph if isinstance(graph, str) else None,
        plans=plans,
        dispatch=dispatch,
        dropped=dropped,
    )


def _check_against_setup(entry: RankEntry, setup: JobSetup) -> None:
    """Refuse a rank entry whose records contradict the job's setup, naming both places."""
    path = rank_path(str(entry.rank))
    if entry.plans is not None and len(entry.plans.consumers) != setup.consumers_per_rank:
        raise InvalidStateError(
            f"{path}.plans.text.consumers",
            f"{setup.consumers_per_rank} plans (one per consumer of the rank, as "
            "topology.num_workers says)",
            len(entry.plans.consumers),
        )
    record = entry.dispatch
    if record is not None:
        mine = setup.consumers_of(entry.rank)
        if record.consumers != setup.num_consumers:
            raise InvalidStateError(
                f"{path}.dispatch.consumers",
                f"{setup.num_consumers} (topology.world_size x the rank's consumers)",
                record.consumers,
            )
        per_rank = record.consumers // setup.world_size
        own = range(entry.rank * per_rank, (entry.rank + 1) * per_rank)
        strays = sorted(c for c in record.claims if c not in own and c not in mine)
        if strays:
            raise InvalidStateError(
                f"{path}.dispatch.claims",
                f"claims of the rank's own consumers {list(own)} (from topology)",
                strays,
            )


def _check_workers_against_setup(entry: RankEntry, setup: JobSetup) -> None:
    """Refuse a rank's node state whose DataLoader holds another number of workers than
    ``topology.num_workers`` says, or none where it says there are some, or whose
    transfers are not of the items ``topology.items_per_transfer`` says (believing either
    would lose or repeat items)."""
    node = entry.node
    while isinstance(node, dict) and "dataloader" not in node and "ended" not in node:
        node = node.get(UPSTREAM)
    path = f"{rank_path(str(entry.rank))}.node"
    has_loader = isinstance(node, dict) and "dataloader" in node
    if not setup.num_workers:
        if has_loader:
            raise InvalidStateError(
                f"{path}...dataloader",
                "no DataLoader state (topology.num_workers is 0)",
                "a DataLoader state",
            )
        return
    if entry.node is not None and not isinstance(node, dict):  # mid-epoch, not in workers
        raise InvalidStateError(
            f"{path}...dataloader",
            f"the DataLoader's state (topology.num_workers is {setup.num_workers})",
            "a position of a rank without workers",
        )
    if has_loader and ("taken" in node) != bundled(setup.items_per_transfer):
        # The items of the current transfer taken: recorded where a transfer holds several.
        expected = (
            f"the items taken of the current transfer (topology.items_per_transfer is "
            f"{setup.items_per_transfer})"
            if bundled(setup.items_per_transfer)
            else "no items taken of a transfer (topology.items_per_transfer is 1)"
        )
        raise InvalidStateError(f"{path}...taken", expected, node.get("taken", "none"))
    recorded = node.get("items_per_transfer") if has_loader else None
    expected = setup.items_per_transfer
    if recorded is not None and (type(recorded) is not type(expected) or recorded != expected):
        # Recorded beside "taken" (states saved before it was are read as before).
        raise InvalidStateError(
            f"{path}...items_per_transfer",
            f"{setup.items_per_transfer!r} (topology.items_per_transfer)",
            node["items_per_transfer"],
        )
    if not has_loader or not isinstance(node["dataloader"], dict) or not node["dataloader"]:
        return  # at the epoch's start, or ended: nothing to compare
    try:
        found = torchdata.snapshot_summary(node["dataloader"])["num_workers"]
        ids = [worker for worker, _ in torchdata.worker_dataset_states(node["dataloader"])]
    except (AttributeError, TypeError, ValueError, KeyError) as error:
        raise InvalidStateError(
            f"{path}...dataloader", "a DataLoader state of torchdata's layout", "?",
            note=f"reading it failed: {type(error).__name__}: {error}",
        ) from None  # fmt: skip
    if found != setup.num_workers:
        missing = [w for w in range(min(setup.num_workers, 4096)) if w not in ids][:8]
        told = f"{found} workers" + (
            f" (none for {', '.join(f'worker_{w}' for w in missing)})" if missing else ""
        )
        raise InvalidStateError(
            f"{path}...dataloader",
            f"the snapshots of {setup.num_workers} workers (topology.num_workers)",
            told,
        )
