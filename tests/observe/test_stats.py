"""Per-step statistics (``Loader(stats=True)``, ``loader.stats()``) and the progress bar
(``Loader(progress=True)``).

The slow step is named, also in DataLoader workers, behind a prefetch and as a parallel map;
counts are the true counts (filters, batches, skipped bad records); checkpoints do not depend
on statistics; the table and ``as_dict()``; the tqdm bar and its helpers.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
import warnings
from collections import namedtuple
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_same, rich_pipe, worker_counts

import datapipes as dp
import datapipes.loader.progress
import nodes.observe.stats
from datapipes.loader.progress import batch_length, outputs_are_batches
from datapipes.observe.stats import PipelineStats, StepStats, merge_rows
from nodes import Context
from nodes.observe.stats import StatsNode, graph_stats
from nodes.testing import roundtrip_state

# ----- clocks -------------------------------------------------------------------------------------


class VirtualClock:
    """Stands in for ``perf_counter`` in nodes.observe.stats: time moves only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


#: The clock of the tests that use the ``virtual_clock`` fixture: the steps below move it by
#: the work they stand for, so which step is slowest does not depend on the machine's load.
CLOCK = VirtualClock()


@pytest.fixture
def virtual_clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """The statistics' clocks (the steps' and the epoch's) replaced by :data:`CLOCK`."""
    CLOCK.now = 0.0
    monkeypatch.setattr(nodes.observe.stats, "perf_counter", CLOCK)
    monkeypatch.setattr(datapipes.loader.progress, "perf_counter", CLOCK)
    return CLOCK


def on_virtual_clock() -> bool:
    return nodes.observe.stats.perf_counter is CLOCK


# ----- functions (module level: DataLoader workers and process pools pickle them) ----------------


def slow_step(x: int) -> int:
    """1 ms of work: on the virtual clock when a test runs on it, else a real sleep."""
    if on_virtual_clock():
        CLOCK.now += 0.001
    else:
        time.sleep(0.001)
    return x


def cheap(x: int) -> int:
    return x + 1


def quarter_pair(x: int) -> bool:
    # keeps half of the items, and half of every worker's share (workers get x = w mod 2)
    return x % 4 < 2


def is_even(x: int) -> bool:
    return x % 2 == 0


def identity(x: Any) -> Any:
    return x


# ----- helpers ------------------------------------------------------------------------------------


def row(stats: PipelineStats, step: str) -> StepStats:
    found = [s for s in stats.steps if s.step == step]
    assert len(found) == 1, f"{step!r} not one row of {[s.step for s in stats.steps]}"
    return found[0]


def assert_sane_times(stats: PipelineStats) -> None:
    for step in stats.steps:
        assert step.self_seconds >= 0 and step.wait_seconds >= 0, step
        assert math.isfinite(step.us_per_item)
    assert 0 <= stats.loader_wait_seconds <= stats.elapsed_seconds


def busy_20us(x: int) -> int:
    """Work per item, so that sampled times are well above the clock's own cost (real work,
    unless the test runs on the virtual clock)."""
    if on_virtual_clock():
        CLOCK.now += 20e-6
        return x
    end = time.perf_counter() + 20e-6
    while time.perf_counter() < end:  # a spin, not a sleep: sleep() cannot wait 20 µs
        continue
    return x


def counted_batches(n: int, size: int) -> int:
    return -(-n // size)


# ----- 1. the slow step is named ------------------------------------------------------------------


def test_a_slow_step_is_named_the_slowest(virtual_clock: VirtualClock) -> None:
    pipe = dp.range(300).map(cheap).map(slow_step).filter(quarter_pair).batch(10)
    loader = dp.Loader(pipe, stats=True)
    batches = list(loader)
    stats = loader.stats()
    assert stats.slowest().step == "map(slow_step)"
    assert "slowest step: map(slow_step)" in str(stats)
    assert [s.step for s in stats.steps] == [
        "range(300)",
        "map(cheap)",
        "map(slow_step)",
        "filter(quarter_pair)",
        "batch(10)",
    ]
    assert all(s.where == "main" and s.processes == 1 for s in stats.steps)
    assert stats.delivered == len(batches) == counted_batches(150, 10)
    assert_sane_times(stats)


@pytest.mark.slow
def test_a_slow_step_in_dataloader_workers_is_named_and_their_rows_arrive():
    n = 300
    pipe = dp.range(n).map(cheap).map(slow_step).filter(quarter_pair).batch(10)
    loader = dp.Loader(pipe, stats=True, num_workers=2)
    batches = list(loader)
    stats = loader.stats()
    assert stats.slowest().step == "map(slow_step)"
    assert "slowest step: map(slow_step)" in str(stats)
    kept = sum(1 for x in range(n) if quarter_pair(x))
    expected = {
        "range(300)": n,
        "map(cheap)": n,
        "map(slow_step)": n,
        "filter(quarter_pair)": kept,
        "batch(10)": len(batches),
    }
    for step, items in expected.items():
        found = row(stats, step)
        assert (found.where, found.processes, found.items) == ("workers", 2, items), found
    # every worker batches its own share: more batches than one process would make
    assert len(batches) == 2 * counted_batches(kept // 2, 10)
    assert sum(len(b) for b in batches) == kept
    main = [s for s in stats.steps if s.where == "main"]
    assert [s.step for s in main] == ["DataLoader workers (2 processes)"]
    assert main[0].items == stats.delivered == len(batches)
    assert main[0].self_seconds == 0  # it only waits for the workers
    assert_sane_times(stats)


def test_a_prefetch_is_not_blamed_for_the_slow_step_before_it(
    virtual_clock: VirtualClock,
) -> None:
    pipe = dp.range(200).map(slow_step).prefetch(4).map(cheap).batch(10)
    loader = dp.Loader(pipe, stats=True)
    assert len(list(loader)) == 20
    stats = loader.stats()
    assert stats.slowest().step == "map(slow_step)"
    prefetch = row(stats, "prefetch(4)")
    assert prefetch.items == 200
    assert prefetch.self_seconds == 0  # its input runs on its thread: it only waits
    assert "slowest step: map(slow_step)" in str(stats)


def test_a_slow_parallel_map_is_named():
    pipe = dp.range(200).map(cheap).map(slow_step, num_workers=2).filter(is_even).batch(10)
    loader = dp.Loader(pipe, stats=True)
    assert len(list(loader)) == 10
    stats = loader.stats()
    slowest = stats.slowest()
    assert slowest.step.startswith("map(slow_step") and "num_workers=2" in slowest.step
    assert slowest.items == 200
    assert "slowest step: map(slow_step" in str(stats)


# ----- 2. counts ----------------------------------------------------------------------------------


def test_counts_filter_batch_and_the_chain_of_times(virtual_clock: VirtualClock) -> None:
    pipe = dp.range(1000).shuffle().map(busy_20us).filter(is_even).batch(16)
    loader = dp.Loader(pipe, stats=True)
    batches = list(loader)
    stats = loader.stats()
    kept = sum(1 for x in range(1000) if is_even(x))
    assert [s.items for s in stats.steps] == [1000, 1000, kept, counted_batches(kept, 16)]
    assert stats.delivered == len(batches)
    assert all(s.skipped == 0 for s in stats.steps)
    assert_sane_times(stats)
    # a serial chain: each step waits on the total of the step before it (capped by its own
    # total: after the first items, totals are estimated from one item in 16), and every
    # step's own time plus its wait is its total, within what the loop waited for
    rows = [r for r in graph_stats(loader._graph.root) if r["key"] != "loader"]
    for before, after in zip(rows, rows[1:]):
        assert after["wait_seconds"] == min(before["seconds"], after["seconds"])
    for r in rows:
        assert r["self_seconds"] + r["wait_seconds"] == pytest.approx(r["seconds"])
        assert r["seconds"] <= 1.5 * stats.loader_wait_seconds  # an estimate: some slack
    assert stats.loader_wait_seconds <= stats.elapsed_seconds
    # on the virtual clock the work is all in the map, and the loop waited for all of it
    assert stats.loader_wait_seconds == pytest.approx(1000 * 20e-6)
    assert stats.slowest().step == "map(busy_20us)"


def test_skipped_samples_of_decode_are_in_its_row():
    samples = [{"cls": b"%d" % i} if i % 4 else {"cls": b"x%d" % i} for i in range(40)]
    bad = sum(1 for i in range(40) if not i % 4)
    pipe = dp.from_sequence(samples).decode(on_error="skip").map(identity).batch(5)
    loader = dp.Loader(pipe, stats=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dp.BadRecordWarning)
        batches = list(loader)
    stats = loader.stats()
    by_step = {s.step: s for s in stats.steps}
    assert by_step["decode(on_error='skip')"].skipped == bad
    assert by_step["decode(on_error='skip')"].items == 40 - bad
    assert by_step["from_sequence(<list of 40>)"].items == 40
    assert [s.skipped for s in stats.steps if not s.step.startswith("decode")] == [0, 0, 0]
    assert stats.delivered == len(batches) == counted_batches(40 - bad, 5)
    assert sum(loader.skipped().values()) == bad


@pytest.mark.slow
def test_skipped_lines_of_read_jsonl_are_in_its_row(tmp_path):
    good, bad = 0, 0
    for f in range(3):
        lines = []
        for j in range(25):
            if (f + j) % 6 == 0:
                lines.append('{"broken": ' + str(j))
                bad += 1
            else:
                lines.append(json.dumps({"f": f, "j": j}))
                good += 1
        (tmp_path / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pipe = dp.files(str(tmp_path / "*.jsonl")).read_jsonl(on_error="skip").map(identity)
    for num_workers in (0, 2):
        loader = dp.Loader(
            pipe.batch(4, collate_fn=dp.no_collate), stats=True, num_workers=num_workers
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dp.BadRecordWarning)
            batches = list(loader)
        stats = loader.stats()
        reader = row(stats, "read_jsonl(on_error='skip')")
        assert (reader.items, reader.skipped) == (good, bad)
        assert row(stats, "map(identity)").skipped == 0
        assert sum(len(b) for b in batches) == good
        assert stats.delivered == len(batches)


@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_stats_restart_each_epoch(num_workers):
    pipe = dp.range(200).shuffle().filter(is_even).batch(10)
    loader = dp.Loader(pipe, stats=True, num_workers=num_workers)
    for epoch in range(2):
        batches = list(loader)
        stats = loader.stats()
        assert stats.epoch == epoch
        assert row(stats, "range(200).shuffle()").items == 200
        assert row(stats, "filter(is_even)").items == 100
        assert row(stats, "batch(10)").items == len(batches)
        assert stats.delivered == len(batches)
    # mid-epoch: this epoch's count so far, not the last epoch's
    iterator = iter(loader)
    list(islice(iterator, 2))
    if num_workers == 0:
        assert loader.stats().delivered == 2
        assert row(loader.stats(), "batch(10)").items == 2
    assert loader.stats().epoch == 2
    loader.close()


def test_stats_before_the_first_epoch_are_empty_not_an_error():
    loader = dp.Loader(dp.range(10).map(cheap), stats=True)
    stats = loader.stats()
    assert stats.steps == [] and stats.delivered == 0 and stats.slowest() is None
    assert "epoch 0" in str(stats)


def test_stats_survive_close():
    with dp.Loader(dp.range(100).map(cheap).batch(10), stats=True) as loader:
        assert len(list(loader)) == 10
    stats = loader.stats()
    assert stats.delivered == 10
    assert [s.items for s in stats.steps] == [100, 100, 10]


def test_an_abandoned_iterator_does_not_stop_the_running_epochs_clock():
    loader = dp.Loader(dp.range(60).map(slow_step), stats=True)
    old = iter(loader)
    next(old)
    current = iter(loader)  # the next epoch
    next(current)
    del old
    gc.collect()
    assert len(list(current)) == 59
    stats = loader.stats()
    assert stats.delivered == 60
    assert stats.loader_wait_seconds <= stats.elapsed_seconds


# ----- 3. switching statistics on and off ------------------------------------------------------


def test_stats_off_says_how_to_switch_on():
    loader = dp.Loader(dp.range(10))
    list(loader)
    with pytest.raises(RuntimeError, match=r"stats=True"):
        loader.stats()


@pytest.mark.parametrize("k", [0, 7, 19])
def test_checkpoints_do_not_depend_on_stats(k):
    pipe = rich_pipe()
    reference = list(dp.Loader(pipe, seed=4))
    states = {}
    for on in (False, True):
        loader = dp.Loader(pipe, seed=4, stats=on)
        iterator = iter(loader)
        assert_same(reference[:k], list(islice(iterator, k)))
        states[on] = roundtrip_state(loader.state_dict())
        loader.close()
    assert states[True] == states[False]
    for saved in (False, True):
        for on in (False, True):
            loader = dp.Loader(pipe, seed=4, stats=on)
            loader.load_state_dict(states[saved])
            assert_same(reference[k:], list(loader))
            if on:
                assert loader.stats().delivered == len(reference) - k


def without_stats(state: Any) -> Any:
    """A worker checkpoint minus the statistics rows (the workers' base seed is seeded, so
    it is the same in both runs)."""
    if isinstance(state, dict):
        return {k: without_stats(v) for k, v in state.items() if k != "stats"}
    if isinstance(state, list):
        return [without_stats(v) for v in state]
    return state


@pytest.mark.slow
def test_worker_checkpoints_with_and_without_stats_resume_either_way():
    pipe = dp.range(240).shuffle().map(cheap).batch(4)
    reference = list(dp.Loader(pipe, seed=2, num_workers=2))
    k = 37
    states = {}
    for on in (False, True):
        loader = dp.Loader(pipe, seed=2, stats=on, num_workers=2)
        assert_same(reference[:k], list(islice(iter(loader), k)))
        states[on] = roundtrip_state(loader.state_dict())
        loader.close()
    # the workers' rows ride on their snapshots to the main process, but not into checkpoints
    nodes = {on: json.loads(state["ranks"]["0"]["node"]) for on, state in states.items()}
    assert '"stats"' not in json.dumps(nodes[True]) and '"stats"' not in json.dumps(nodes[False])
    assert without_stats(nodes[True]) == without_stats(nodes[False])
    for saved, on in ((True, False), (False, True)):
        loader = dp.Loader(pipe, seed=2, stats=on, num_workers=2)
        loader.load_state_dict(states[saved])
        assert_same(reference[k:], list(loader))


# ----- 4. as_dict and the table -------------------------------------------------------------------


@pytest.mark.slow
def test_as_dict_is_json_and_the_table_has_a_line_per_step():
    pipe = dp.range(120).map(cheap).map(slow_step).filter(is_even).batch(8)
    loader = dp.Loader(pipe, stats=True, num_workers=1)
    list(loader)
    stats = loader.stats()
    data = json.loads(json.dumps(stats.as_dict()))
    assert data["delivered"] == stats.delivered and data["epoch"] == 0
    assert [r["step"] for r in data["steps"]] == [s.step for s in stats.steps]
    assert [r["items"] for r in data["steps"]] == [s.items for s in stats.steps]
    assert all("us_per_item" in r for r in data["steps"])

    lines = stats.table().splitlines()
    assert stats.table() == str(stats)
    assert lines[0].split()[:3] == ["step", "where", "items"]
    body = lines[1 : 1 + len(stats.steps)]
    for step, line in zip(stats.steps, body):
        assert line.startswith(step.step + " ")
    assert len(lines) == 1 + len(stats.steps) + 2
    assert lines[-2].startswith("slowest step: map(slow_step)")
    assert lines[-1].startswith(f"epoch 0: {stats.delivered:,} outputs")


def test_merge_rows_sums_processes():
    a = [
        {
            "key": "k1",
            "step": "map(f)",
            "items": 3,
            "self_seconds": 1.0,
            "wait_seconds": 0.5,
            "skipped": 1,
            "seconds": 1.5,
        }
    ]
    b = [
        {
            "key": "k1",
            "step": "map(f)",
            "items": 5,
            "self_seconds": 3.0,
            "wait_seconds": 1.5,
            "skipped": 2,
            "seconds": 4.5,
        }
    ]
    (merged,) = merge_rows("workers", [a, b, None])
    assert (merged.items, merged.skipped, merged.processes) == (8, 3, 2)
    assert merged.self_seconds == 2.0 and merged.wait_seconds == 1.0
    assert merged.us_per_item == pytest.approx(4.0 / 8 * 1e6)


# ----- 5. the progress bar ------------------------------------------------------------------------


def test_progress_bar_on_batches(capsys):
    pipe = dp.range(100).map(cheap).batch(8)
    plain = list(dp.Loader(pipe))
    assert not capsys.readouterr().err
    loader = dp.Loader(pipe, progress=True)
    with_bar = list(loader)
    assert_same(plain, with_bar)
    err = capsys.readouterr().err
    assert "epoch 0" in err and f"{len(plain)}batch" in err
    list(loader)
    assert "epoch 1" in capsys.readouterr().err


def test_progress_bar_on_items_and_an_abandoned_epoch(capsys):
    loader = dp.Loader(dp.range(30).map(cheap), progress=True)
    for i, _ in enumerate(loader):
        if i == 9:
            break
    err = capsys.readouterr().err
    assert "epoch 0" in err and "10item" in err
    from tqdm import tqdm

    assert not list(getattr(tqdm, "_instances", []))  # the bar was closed


def test_progress_needs_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match="tqdm"):
        dp.Loader(dp.range(5), progress=True)
    assert list(dp.Loader(dp.range(5))) == list(range(5))  # without the bar, no tqdm needed


def test_outputs_are_batches():
    base = dp.range(20)
    assert outputs_are_batches(base.batch(4))
    assert outputs_are_batches(base.batch(4).map(identity).prefetch(2))
    assert outputs_are_batches(base.batch(4).shuffle(buffer_size=3).take(2))
    assert not outputs_are_batches(base)
    assert not outputs_are_batches(base.map(identity))
    assert not outputs_are_batches(base.batch(4).unbatch())
    assert not outputs_are_batches(base.batch(4).flat_map(list))
    assert not outputs_are_batches(dp.zip(base.batch(2), base.batch(2)))


def test_batch_length():
    Pair = namedtuple("Pair", "x y")
    assert batch_length(torch.zeros(5, 3)) == 5
    assert batch_length(np.zeros((7, 2))) == 7
    assert batch_length([1, 2, 3]) == 3
    assert batch_length({"image": torch.zeros(4, 3, 2), "label": torch.zeros(4)}) == 4
    assert batch_length({"text": ["a", "b"], "n": torch.zeros(2)}) == 2
    assert batch_length((torch.zeros(6), torch.zeros(6))) == 6
    assert batch_length(Pair(torch.zeros(9), [0] * 9)) == 9
    assert batch_length(torch.tensor(3.0)) == 1  # a scalar is one sample
    assert batch_length(42) == 1
    batches = list(dp.Loader(dp.range(10).map(lambda x: {"v": x}).batch(4)))
    assert [batch_length(b) for b in batches] == [4, 4, 2]


# ----- 6. counts across repeat rounds and zip branches; checkpoints with statistics on --------

calls: list[int] = []


def counted(x: int) -> int:
    calls.append(x)
    return x


def worker_dataset_states(loader_state: dict[str, Any]) -> list[dict[str, Any]]:
    node = json.loads(loader_state["ranks"]["0"]["node"])
    workers = node["dataloader"]["_snapshot"]["_worker_snapshots"]
    return [w["dataset_state"] for w in workers.values()]


def test_stats_count_every_round_of_a_repeat() -> None:
    calls.clear()
    loader = dp.Loader(dp.range(20).map(counted).repeat(3), stats=True)
    assert len(list(loader)) == 60
    rows = {row.step: row for row in loader.stats().steps}
    assert len(calls) == 60  # the map really ran 60 times
    assert rows["map(counted)"].items == len(calls)
    assert rows["range(20)"].items == 60


@pytest.mark.slow
def test_checkpoint_layout_same_with_stats_on_or_off() -> None:
    pipe = dp.range(200).map(str)
    keys = []
    for stats in (False, True):
        loader = dp.Loader(pipe, num_workers=2, stats=stats)
        it = iter(loader)
        for _ in range(70):
            next(it)
        state = loader.state_dict()
        loader.close()
        keys.append([sorted(s) for s in worker_dataset_states(state)])
    assert keys[0] == keys[1]


def zip_long_first() -> dp.DataPipe:
    # > 256 items, so the statistics reach their sampled phase (islice runs of 15 items)
    return dp.zip(dp.range(500).map(counted), dp.range(300))


def test_stats_do_not_pull_an_extra_item_from_the_longer_zip_branch() -> None:
    pulled = {}
    for stats in (False, True):
        calls.clear()
        loader = dp.Loader(zip_long_first(), stats=stats)
        assert len(list(loader)) == 300
        pulled[stats] = len(calls)
    assert pulled[True] == pulled[False]  # statistics must not change what the pipeline reads
    rows = {row.step: row.items for row in loader.stats().steps}
    assert rows["map(counted)"] == pulled[False]


def test_checkpoints_are_the_same_with_stats_on_and_off() -> None:
    def pipe() -> dp.DataPipe:
        return dp.mix([dp.zip(dp.range(500), dp.range(300)), dp.range(100)], weights=[3, 1])

    runs = {}
    for stats in (False, True):
        loader = dp.Loader(pipe(), stats=stats)
        items, states = [], []
        for item in loader:
            items.append(item)
            states.append(json.loads(loader.state_dict()["ranks"]["0"]["node"]))
        runs[stats] = items, states
    assert runs[True][0] == runs[False][0]  # the items agree (this part holds)
    differ = [i for i, (a, b) in enumerate(zip(runs[False][1], runs[True][1])) if a != b]
    assert differ == []


def test_stats_node_clear_mid_pass_counts_the_items_after_it() -> None:
    node = StatsNode(dp.range(100).build(Context()), "k", "range(100)")
    node.reset(None)
    assert [next(node) for _ in range(10)] == list(range(10))
    assert node.items == 10
    node.clear()
    assert [next(node) for _ in range(7)] == list(range(10, 17))
    assert node.items == 7


def test_sampled_seconds_are_not_aliased_by_a_power_of_two_fan_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = VirtualClock()

    def expand(x: int) -> list[int]:
        clock.now += 1.0  # one virtual second of work per input item
        return [x] * 16

    monkeypatch.setattr(nodes.observe.stats, "perf_counter", clock)
    loader = dp.Loader(dp.range(1000).flat_map(expand), stats=True)
    assert sum(1 for _ in loader) == 16_000
    stats = loader.stats()
    assert stats.loader_wait_seconds == pytest.approx(1000.0)  # the Loader row times every item
    flat_map = next(s for s in stats.steps if s.step.startswith("flat_map"))
    assert flat_map.items == 16_000
    # The step's own time is all of the work; an unbiased 1-in-16 estimate is close to it.
    assert flat_map.self_seconds == pytest.approx(clock.now, rel=0.5)


def test_a_mix_reports_its_realised_shares_against_its_weights() -> None:
    # the draws are seeded: 10,000 items drawn 70/30 land within a point of the weights
    a, b = dp.range(7_000), dp.range(7_000, 10_000)
    loader = dp.Loader(dp.mix([a, b], weights=[7, 3]).batch(10), stats=True, seed=3)
    batches = list(islice(iter(loader), 500))  # 5,000 of the 10,000: before either runs out
    stats = loader.stats()
    (mix,) = [step for step in stats.steps if step.mix]
    assert mix.mix["weights"] == [7.0, 3.0]  # as given (the shares say 70%, 30% asked)
    assert sum(mix.mix["drawn"]) == mix.items == 5_000 == sum(len(b) for b in batches)
    assert abs(mix.shares[0] - 0.7) < 0.02 and abs(sum(mix.shares) - 1) < 1e-9
    text = stats.table()
    assert f"drawn {mix.mix['drawn']} items per input" in text and "(asked 70.0%)" in text
    assert stats.as_dict()["steps"][[s.step for s in stats.steps].index(mix.step)]["shares"]
    # the slowest step's share is of the steps' own time, not of the weights
    slowest = stats.slowest()
    assert slowest is not None
    total = sum(step.self_seconds for step in stats.steps)
    expected = f"({100 * slowest.self_seconds / total:.0f}% of the steps' own time)"
    assert expected in text


@pytest.mark.slow  # DataLoader worker processes
def test_a_mix_in_workers_reports_the_draws_of_all_of_them() -> None:
    pipe = dp.mix([dp.range(600), dp.range(600, 800)], weights=[3, 1]).batch(8)
    with dp.Loader(pipe, num_workers=2, stats=True) as loader:
        list(loader)
        (mix,) = [step for step in loader.stats().steps if step.mix]
    assert mix.mix["drawn"] == [600, 200] and mix.processes == 2
