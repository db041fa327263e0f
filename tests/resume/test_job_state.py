"""The job-state model: a state is parsed once into typed records, and a state whose fields
contradict each other is refused naming both places, never believed."""

from __future__ import annotations

import copy
import json
import warnings
from typing import Any

import pytest

import datapipes as dp
from datapipes.resume import JobSetup, parse_state
from datapipes.resume.records import job_state
from datapipes.resume.schema import node_digest
from nodes import UPSTREAM


def _mid_epoch(pipe: dp.DataPipe, items: int, **options: Any) -> dict[str, Any]:
    loader = dp.Loader(pipe, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        iterator = iter(loader)
        for _ in range(items):
            next(iterator)
        state = loader.state_dict()
        loader.close()
    return state


def test_a_state_parses_into_records_and_writes_back_the_same() -> None:
    states = [
        _mid_epoch(dp.range(40).shuffle(buffer_size=8), 5, rank=r, world_size=3) for r in range(3)
    ]
    merged = dp.merge_states(states)
    parsed = parse_state(merged)
    assert parsed.setup == JobSetup(world_size=3, num_workers=0, seed=0)
    assert sorted(parsed.ranks) == [0, 1, 2] and parsed.covers_job
    assert all(entry.node is not None and entry.epoch == 0 for entry in parsed.ranks.values())
    assert job_state(parsed) == merged
    assert parse_state(job_state(parsed)) == parsed


def test_setup_counts_consumers_and_builds_their_contexts() -> None:
    setup = JobSetup(world_size=2, num_workers=3, seed=5)
    assert (setup.consumers_per_rank, setup.num_consumers) == (3, 6)
    assert list(setup.consumers_of(1)) == [3, 4, 5]
    ctx = setup.context(1, 2, epoch=4)
    assert (ctx.consumer_index, ctx.num_consumers, ctx.epoch, ctx.seed) == (5, 6, 4, 5)
    assert JobSetup(world_size=2, num_workers=0, seed=0).consumers_of(1) == range(1, 2)


@pytest.mark.slow
@pytest.mark.parametrize("claimed", [10**15, 0, 3, 1])
def test_a_topology_that_contradicts_the_workers_snapshots_is_refused(claimed: int) -> None:
    pipe = dp.range(700).shuffle(buffer_size=16)
    state = _mid_epoch(pipe, 74, num_workers=2, items_per_transfer=1)
    state["topology"]["num_workers"] = claimed
    for workers in (0, 2):
        with pytest.raises(dp.InvalidStateError, match=r"topology.num_workers") as refused:
            dp.Loader(pipe, num_workers=workers, items_per_transfer=1).load_state_dict(state)
        assert 'ranks["0"].node' in str(refused.value)  # both places named


def test_plans_of_another_number_of_consumers_are_refused() -> None:
    pipe = dp.range(60)
    saved = dp.merge_states([_mid_epoch(pipe, 3, rank=r, world_size=2) for r in range(2)])
    elsewhere = dp.Loader(pipe, rank=0, world_size=3)
    elsewhere.load_state_dict(saved)  # dealt to 3 ranks: plans in its state
    state = elsewhere.state_dict()
    entry = state["ranks"]["0"]
    plans = json.loads(entry["plans"]["text"])
    plans["consumers"] = plans["consumers"] * 2
    text = json.dumps(plans, separators=(",", ":"))
    entry["plans"] = {"text": text, "digest": node_digest(text)}
    with pytest.raises(dp.InvalidStateError, match=r"plans.*topology.num_workers"):
        parse_state(state)


def test_a_dispatch_record_of_another_job_size_is_refused() -> None:
    pipe = dp.range(50)
    state = _mid_epoch(pipe, 4, dispatch="dynamic", dispatch_unit_items=8)
    record = state["ranks"]["0"]["dispatch"]
    for field, value, says in (
        ("consumers", 4, r"dispatch.consumers.*topology"),
        ("claims", {"3": {}}, r"dispatch.claims"),
    ):
        mutated = copy.deepcopy(state)
        mutated["ranks"]["0"]["dispatch"] = {**record, field: value}
        with pytest.raises(dp.InvalidStateError, match=says):
            parse_state(mutated)


@pytest.mark.slow
def test_a_missing_worker_snapshot_is_an_error_not_a_fresh_worker() -> None:
    pipe = dp.range(600).shuffle(buffer_size=8)
    states = [_mid_epoch(pipe, 70, rank=r, world_size=2, num_workers=2) for r in range(2)]
    merged = dp.merge_states(states)
    node = json.loads(merged["ranks"]["1"]["node"])
    inner = node
    while "dataloader" not in inner:
        inner = inner[UPSTREAM]
    snapshots = inner["dataloader"]["_snapshot"]["_worker_snapshots"]
    snapshots.pop(sorted(snapshots)[-1])
    text = json.dumps(node, separators=(",", ":"))
    merged["ranks"]["1"]["node"], merged["ranks"]["1"]["digest"] = text, node_digest(text)
    for workers in (0, 3):
        with pytest.raises(dp.InvalidStateError, match="worker"):
            dp.Loader(pipe, rank=0, world_size=1, num_workers=workers).load_state_dict(merged)
