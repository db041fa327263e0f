"""The Loader as parts: options checked once into a frozen record, the recipe split once, a
resume checked on the graph it then runs, and workers that get what they read as one record."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import datapipes as dp
import datapipes.placement as placement
from datapipes.loader.options import LoaderOptions
from datapipes.placement import RecipePlan
from datapipes.resume.schema import node_digest
from datapipes.workers.torch_dataset import NO_JOB, WorkerJob
from nodes.base import walk_graph
from nodes.workers.stream import WorkerStreamNode


def test_the_options_are_one_frozen_record_checked_together() -> None:
    options = LoaderOptions.check(
        dp.range(4), seed=2, num_workers=1, dataloader_options={"prefetch_factor": 3}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        options.dataloader_options["timeout"] = 5  # type: ignore[index]
    assert dict(options.dataloader_options) == {"prefetch_factor": 3}
    assert options.items_per_transfer == "auto" and options.dispatch is None
    leased = LoaderOptions.check(
        dp.range(4), rank=0, world_size=2, dispatch="dynamic", dispatch_lease_seconds=5
    )
    assert leased.items_per_transfer == 1 and leased.takeovers
    assert leased.dispatch is not None and leased.dispatch.lease_seconds == 5.0


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"store": object()}, "store= is for dispatch='dynamic'"),
        ({"dispatch_lease_seconds": 1}, "dispatch_lease_seconds= is for dispatch='dynamic'"),
        ({"dispatch": "dynamic", "dispatch_unit_items": 0}, "dispatch_unit_items must be"),
        ({"dispatch": "dynamic", "dispatch_lease_seconds": -1}, "must be a number > 0"),
        ({"dispatch": "sometimes"}, "dispatch must be one of"),
        ({"num_workers": 1, "items_per_transfer": 0}, "items_per_transfer must be"),
    ],
)
def test_the_loader_refuses_what_its_options_refuse(arguments: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        LoaderOptions.check(dp.range(4), **arguments)
    with pytest.raises(ValueError, match=error):
        dp.Loader(dp.range(4), **arguments)


def counting_splits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    split = placement.split_main_steps

    def counted(pipe: Any) -> Any:
        calls.append(1)
        return split(pipe)

    monkeypatch.setattr(placement, "split_main_steps", counted)
    return calls


def test_the_recipe_is_split_once_per_loader_checkpoint_and_resume_included(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipe = dp.range(20).shuffle().map(abs).batch(3)
    calls = counting_splits(monkeypatch)
    loader = dp.Loader(pipe, seed=1)
    it = iter(loader)
    first = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [b.tolist() for b in it]
    assert len(calls) == 1
    resumed = dp.Loader(pipe, seed=1)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest and len(first) == 2
    assert len(calls) == 2  # one for each Loader


def test_a_resume_is_checked_on_the_graph_the_epoch_then_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipe = dp.range(12).map(abs).batch(2)
    loader = dp.Loader(pipe)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = dp.Loader(pipe)
    built: list[Any] = []
    build = dp.DataPipe.build

    def counted(self: Any, ctx: Any) -> Any:
        node = build(self, ctx)
        if self is resumed.pipe:
            built.append(node)
        return node

    monkeypatch.setattr(dp.DataPipe, "build", counted)
    resumed.load_state_dict(state)
    assert len(built) == 1  # the graph that checked the position...
    assert [b.tolist() for b in resumed] == [[2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert len(built) == 1  # ...is the one the epoch ran: nothing built again
    assert built[0] in list(walk_graph(resumed._graph.root))


def test_a_refused_state_leaves_the_running_graph_as_it_was() -> None:
    pipe = dp.range(12).batch(2)
    loader = dp.Loader(pipe)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    root = loader._graph.root
    bad = loader.state_dict()
    entry = bad["ranks"]["0"]
    entry["node"] = entry["node"].replace('"position":2', '"position":99')  # past the data
    entry["digest"] = node_digest(entry["node"])  # well formed: refused by the graph only
    with pytest.raises(dp.InvalidStateError, match="position"):
        loader.load_state_dict(bad)
    assert loader._graph.root is root
    assert [b.tolist() for b in it] == [[2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


def test_a_worker_job_is_frozen_and_each_start_of_the_workers_gets_its_own() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        NO_JOB.listings = None  # type: ignore[misc]
    loader = dp.Loader(dp.range(8).map(abs), num_workers=2, items_per_transfer=2)
    root = loader._graph.current()
    stream = next(node for node in walk_graph(root) if isinstance(node, WorkerStreamNode))
    first, second = stream._dataset_for_epoch(0), stream._dataset_for_epoch(1)
    assert first is not second and first.job == second.job
    assert first.job == WorkerJob(items_per_transfer=2, listings=first.job.listings)
    with loader:
        assert sorted(loader) == list(range(8))


def test_a_recipe_plan_knows_what_each_consumer_runs() -> None:
    recipe = dp.range(4).map(abs).pin_memory()
    plan = RecipePlan.of(recipe, num_workers=2)
    assert plan.consumer_part(2) is plan.worker_part and plan.consumer_part(0) is recipe
    assert plan.fingerprint == recipe.fingerprint() and list(plan.steps) == recipe.steps()
    with pytest.raises(ValueError, match="must run in the main process"):
        RecipePlan.of(dp.zip(dp.range(2).pin_memory(), dp.range(2)), num_workers=1)
