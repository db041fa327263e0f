"""TorchTitanLoader: torchtitan's data-loader protocol, checkpointed as torchtitan does
(``torch.distributed.checkpoint`` of ``{"dataloader": loader}`` from every rank) and
resumed on the same and on another number of data-parallel ranks."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from helpers import run_gloo_ranks

import datapipes as dp
from datapipes.integrations.torchtitan import STATE_KEY, TorchTitanLoader, titan_batch

ITEMS, BATCH, SEED, STOP = 96, 4, 7, 5


def as_tokens(i: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor([i, i]), "labels": torch.tensor([i, -100])}


def recipe() -> dp.DataPipe[Any]:
    return dp.range(ITEMS).shuffle().map(as_tokens).batch(BATCH)


def first_ids(batches: list[tuple[dict[str, Any], Any]]) -> list[list[int]]:
    return [inputs["input"][:, 0].tolist() for inputs, _ in batches]


def _job(rank: int, store: str, folder: str, *, world: int, phase: str) -> None:
    """One rank of a torchtitan-style run: ``first`` stops after a checkpoint at step STOP,
    ``resume`` loads it (on any number of ranks) and reads to the end."""
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    try:
        data = TorchTitanLoader(dp.Loader(recipe(), seed=SEED))
        checkpoint = str(Path(folder).parent / "checkpoint")
        if phase == "resume":
            dcp.load({"dataloader": data}, checkpoint_id=checkpoint)
        seen = []
        for step, batch in enumerate(data, start=1):
            seen.append(batch)
            if phase == "first" and step == STOP:
                dcp.save({"dataloader": data}, checkpoint_id=checkpoint)
                break
        Path(folder, f"{rank}.json").write_text(json.dumps(first_ids(seen)))
    finally:
        dist.destroy_process_group()


def run(tmp_path: Path, phase: str, world: int, name: str) -> list[list[list[int]]]:
    folder = tmp_path / name
    folder.mkdir()
    run_gloo_ranks(functools.partial(_job, world=world, phase=phase), world, folder)
    return [json.loads((folder / f"{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow  # gloo ranks in new processes
def test_a_dcp_checkpoint_resumes_on_the_same_and_on_another_dp_degree(tmp_path):
    before = run(tmp_path, "first", 2, "first")
    same = run(tmp_path, "resume", 2, "same")
    for rank in range(2):
        uninterrupted = [
            first_ids([titan_batch(b)])[0]
            for b in dp.Loader(recipe(), seed=SEED, rank=rank, world_size=2)
        ]
        assert len(before[rank]) == STOP
        assert before[rank] + same[rank] == uninterrupted
    more = run(tmp_path, "resume", 3, "more")  # torchtitan's own loader refuses this
    delivered = [i for rank in before + more for batch in rank for i in batch]
    assert sorted(delivered) == list(range(ITEMS))  # every item once
    # 56 items left on 3 ranks: as many steps on each (no rank waits in a collective alone)
    assert [len(rank) for rank in more] == [5, 5, 5]


def test_titan_batch_splits_pack_batches_and_refuses_others():
    inputs, labels = titan_batch(
        {
            "input_ids": torch.ones(2, 3),
            "labels": torch.zeros(2, 3),
            "position_ids": torch.ones(2, 3),
        }
    )
    assert set(inputs) == {"input", "positions"} and labels.shape == (2, 3)
    pair = ({"input": torch.ones(1)}, torch.zeros(1))
    assert titan_batch(pair)[1] is pair[1]
    with pytest.raises(TypeError, match="pass split=... to TorchTitanLoader"):
        titan_batch(torch.ones(3))


def test_its_state_is_one_json_entry_and_a_damaged_one_is_refused():
    data = TorchTitanLoader(dp.Loader(recipe(), seed=SEED))
    it = iter(data)
    head = [next(it) for _ in range(3)]
    state = data.state_dict()
    assert list(state) == [STATE_KEY] and isinstance(state[STATE_KEY], str)
    resumed = TorchTitanLoader(dp.Loader(recipe(), seed=SEED))
    resumed.load_state_dict({})  # torchtitan's first run: nothing to load
    resumed.load_state_dict(state)
    fresh = [b for b in TorchTitanLoader(dp.Loader(recipe(), seed=SEED))]
    assert first_ids(head) + first_ids(list(resumed)) == first_ids(fresh)
    for damaged in ({"other": "x"}, {STATE_KEY: 3}, {STATE_KEY: "{not json"}, [1]):
        with pytest.raises(dp.InvalidStateError):
            TorchTitanLoader(dp.Loader(recipe(), seed=SEED)).load_state_dict(damaged)
    wrong = json.loads(state[STATE_KEY])
    wrong["epoch"] = -1
    with pytest.raises(dp.InvalidStateError):
        TorchTitanLoader(dp.Loader(recipe(), seed=SEED)).load_state_dict(
            {STATE_KEY: json.dumps(wrong)}
        )
