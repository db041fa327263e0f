"""Loader.stats_by_rank(): every rank's statistics gathered, naming the slowest rank and its
slowest step (a real 3-rank gloo job with one rank slowed)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import run_gloo_ranks

import datapipes as dp
from datapipes.observe.rank_stats import RankStats
from datapipes.observe.stats import PipelineStats, StepStats


def ranked(wait: float, own: float, name: str = "map(decode)") -> PipelineStats:
    step = StepStats(name, "main", 1, 10, own, 0.0, 0)
    return PipelineStats(
        [step, StepStats("range(10)", "main", 1, 10, 0.001, 0.0, 0)], 0, 10, 2.0, wait
    )


def test_the_slowest_rank_is_the_one_whose_steps_took_longest_per_output():
    # every rank waited about as long (the others wait for the slow one in collectives)
    view = RankStats([ranked(1.5, 0.2), ranked(1.4, 1.4, "map(slow)"), ranked(1.5, 0.3)])
    assert view.slowest_rank() == 1
    assert view.slowest_step(1).step == "map(slow)"
    table = str(view)
    assert "slowest rank: 1" in table and "map(slow)" in table
    assert len(table.splitlines()) == 1 + 3 + 1  # header, a row per rank, the verdict
    assert json.loads(json.dumps(view.as_dict()))["slowest_rank"] == 1


def test_equal_work_names_the_rank_that_waited_longest():
    assert RankStats([ranked(0.2, 0.5), ranked(0.9, 0.5), ranked(0.1, 0.5)]).slowest_rank() == 1


def test_without_a_process_group_it_says_to_use_stats():
    loader = dp.Loader(dp.range(5), stats=True)
    list(loader)
    with pytest.raises(RuntimeError, match="not initialized.*stats\\(\\)"):
        loader.stats_by_rank()


def slow_on_rank_one(x: int) -> int:
    if dist.get_rank() == 1:
        time.sleep(0.004)
    return x


def _rank(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=3)
    try:
        loader = dp.Loader(dp.range(150).map(slow_on_rank_one).batch(5), stats=True)
        for _ in loader:
            dist.all_reduce(torch.zeros(1))  # a training step: every rank waits for the slowest
        view = loader.stats_by_rank()  # collective, after the loop
        Path(out, f"{rank}.json").write_text(
            json.dumps(
                {
                    "slowest": view.slowest_rank(),
                    "table": str(view),
                    "step": view.slowest_step(view.slowest_rank()).step,
                }
            )
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # three processes
def test_a_three_rank_job_names_the_slowed_rank_and_its_step(tmp_path):
    run_gloo_ranks(_rank, 3, tmp_path, timeout=180)
    views = [json.loads(Path(tmp_path, f"{r}.json").read_text()) for r in range(3)]
    assert all(v["slowest"] == 1 for v in views), views[0]["table"]
    assert all(v["step"] == "map(slow_on_rank_one)" for v in views)
    assert views[0]["table"] == views[2]["table"]  # every rank sees the same view
