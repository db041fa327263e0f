"""The Loader: epochs, seeds, checkpoints (also across processes), ranks, global RNGs."""

from __future__ import annotations

import json
import random
import threading
import time
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_same, rich_pipe, tenfold
from subprocess_helpers import run_python
from torch.distributed.checkpoint.stateful import Stateful

import datapipes as dp
from nodes.testing import roundtrip_state


def boom(x: int) -> int:
    if x == 7:
        raise ValueError("bad item 7")
    return x


def epochs(loader: dp.Loader, count: int) -> list[list[Any]]:
    return [list(loader) for _ in range(count)]


# ----- epochs and seeds -----------------------------------------------------------------


def test_each_iteration_is_a_new_epoch_with_a_new_order():
    loader = dp.Loader(dp.range(100).shuffle(), seed=3)
    assert loader.epoch == 0
    first = list(loader)
    assert loader.epoch == 1
    second = list(loader)
    assert sorted(first) == sorted(second) == list(range(100))
    assert first != second


def test_set_epoch_picks_the_epoch():
    pipe = dp.range(50).shuffle().batch(5)
    reference = epochs(dp.Loader(pipe, seed=1), 3)
    loader = dp.Loader(pipe, seed=1)
    loader.set_epoch(2)
    assert_same(reference[2], list(loader))
    loader.set_epoch(0)
    assert_same(reference[0], list(loader))
    assert_same(reference[1], list(loader))
    with pytest.raises(ValueError):
        loader.set_epoch(-1)


def test_same_seed_and_epoch_same_order_other_seed_other_order():
    pipe = dp.range(200).shuffle().shuffle(buffer_size=10)
    a = epochs(dp.Loader(pipe, seed=11), 2)
    b = epochs(dp.Loader(pipe, seed=11), 2)
    c = epochs(dp.Loader(pipe, seed=12), 2)
    assert a == b
    assert a[0] != c[0] and a[1] != c[1]
    assert all(sorted(e) == list(range(200)) for e in a + c)


def test_errors_in_a_background_thread_reach_the_consumer():
    loader = dp.Loader(dp.range(20).map(boom).prefetch(3))
    with pytest.raises(ValueError, match="bad item 7") as info:
        list(loader)
    assert any(entry.name == "boom" for entry in info.traceback)  # the original traceback
    loader.close()


def test_close_stops_prefetch_threads():
    before = set(threading.enumerate())
    with dp.Loader(dp.range(1000).prefetch(2).map(tenfold).prefetch(4)) as loader:
        assert list(islice(iter(loader), 5)) == [0, 10, 20, 30, 40]
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert leftover == []


# ----- checkpoints in this process ------------------------------------------------------


def _background_threads_started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    """The threads started since ``before`` still alive after waiting up to 10 s for them to
    end (a wait that costs nothing when they end, and holds on a loaded machine)."""
    deadline = time.monotonic() + 10.0
    while True:
        alive = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def test_an_abandoned_iterator_of_an_earlier_epoch_leaves_the_current_one_alone():
    pipe = dp.range(1000).filter(lambda x: True).shuffle(buffer_size=50).batch(10).prefetch(2)
    loader = dp.Loader(pipe)
    stale = iter(loader)
    next(stale)  # epoch 0, abandoned after one batch
    seen = []
    for i, batch in enumerate(loader):  # epoch 1
        seen += batch.tolist()
        if i == 10:
            del stale  # collected in the middle of epoch 1
    assert sorted(seen) == list(range(1000))
    loader.close()


def test_an_abandoned_current_epoch_frees_its_threads_and_the_next_iteration_works():
    before = set(threading.enumerate())
    loader = dp.Loader(dp.range(100).prefetch(2))
    it = iter(loader)
    next(it)
    del it  # dropped mid-epoch, without loader.close()
    assert _background_threads_started_since(before) == []
    assert list(loader) == list(range(100))  # the next epoch runs in full
    loader.close()


@pytest.mark.parametrize("where", ["before", "start", "middle", "last item", "end"])
def test_resume_from_a_state_taken(where):
    pipe = rich_pipe()
    reference = epochs(dp.Loader(pipe, seed=4), 3)
    n = len(reference[1])
    loader = dp.Loader(pipe, seed=4)
    list(loader)  # epoch 0
    if where == "before":
        expected = reference[1:]
    elif where == "end":
        list(loader)
        expected = reference[2:]
    else:
        k = {"start": 0, "middle": n // 2, "last item": n}[where]
        list(islice(iter(loader), k))
        expected = [reference[1][k:], reference[2]]
    state = roundtrip_state(loader.state_dict())
    loader.close()

    resumed = dp.Loader(pipe, seed=4)
    resumed.load_state_dict(state)
    for want in expected:
        assert_same(want, list(resumed))
    resumed.close()


def test_state_of_a_fresh_loader_starts_at_epoch_0():
    pipe = rich_pipe()
    reference = epochs(dp.Loader(pipe, seed=2), 2)
    resumed = dp.Loader(pipe, seed=2)
    resumed.load_state_dict(roundtrip_state(dp.Loader(pipe, seed=2).state_dict()))
    assert_same(reference[0], list(resumed))
    assert_same(reference[1], list(resumed))


def test_state_taken_after_loading_but_before_iterating_keeps_the_position():
    pipe = dp.range(40).shuffle().batch(3)
    reference = list(dp.Loader(pipe, seed=9))
    loader = dp.Loader(pipe, seed=9)
    list(islice(iter(loader), 5))
    loaded = dp.Loader(pipe, seed=9)
    loaded.load_state_dict(roundtrip_state(loader.state_dict()))
    again = dp.Loader(pipe, seed=9)
    again.load_state_dict(roundtrip_state(loaded.state_dict()))  # saved again before a step
    assert_same(reference[5:], list(again))


def test_closing_mid_epoch_keeps_the_position():
    pipe = dp.range(30).shuffle().prefetch(2).batch(2)
    reference = epochs(dp.Loader(pipe, seed=6), 2)
    with dp.Loader(pipe, seed=6) as loader:
        for i, _ in enumerate(loader):
            if i == 4:
                break
        before = loader.state_dict()
    after = loader.state_dict()
    assert after == before
    resumed = dp.Loader(pipe, seed=6)
    resumed.load_state_dict(roundtrip_state(after))
    assert_same(reference[0][5:], list(resumed))
    # the closed Loader itself also continues where it stopped, then runs the next epoch
    assert_same(reference[0][5:], list(loader))
    assert_same(reference[1], list(loader))
    loader.close()


def test_loader_is_a_dcp_stateful():
    loader = dp.Loader(dp.range(5))
    assert isinstance(loader, Stateful)


CHILD = """
import json, sys, torch
import datapipes as dp
loader = dp.Loader(eval(sys.argv[1], {"dp": dp}), seed=int(sys.argv[3]))
loader.load_state_dict(torch.load(sys.argv[2], weights_only=True))
plain = lambda x: x.tolist() if isinstance(x, torch.Tensor) else x
print(json.dumps([[plain(x) for x in loader] for _ in range(2)]))
"""

RECIPE = (
    "dp.range(300).shuffle().filter(bool).shuffle(buffer_size=16).map(abs).batch(8).prefetch(2)"
)


@pytest.mark.slow
def test_resume_in_a_new_process(tmp_path):
    pipe = eval(RECIPE, {"dp": dp})
    reference = [[b.tolist() for b in e] for e in epochs(dp.Loader(pipe, seed=7), 2)]
    loader = dp.Loader(pipe, seed=7)
    head = [b.tolist() for b in islice(iter(loader), 13)]
    assert head == reference[0][:13]
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    loader.close()

    rest, next_epoch = json.loads(run_python(CHILD, RECIPE, str(tmp_path / "state.pt"), "7"))
    assert rest == reference[0][13:]
    assert next_epoch == reference[1]


# ----- states that do not belong to this Loader -----------------------------------------


def test_a_state_from_another_recipe_names_the_difference():
    state = dp.Loader(dp.range(100).shuffle().batch(4)).state_dict()
    other = dp.Loader(dp.range(100).shuffle().batch(8))
    with pytest.raises(dp.StateMismatchError, match=r"batch\(4\)") as info:
        other.load_state_dict(state)
    assert "batch(8)" in str(info.value)
    assert "different recipe" in str(info.value)


def test_a_state_with_another_seed_is_refused():
    state = dp.Loader(dp.range(10), seed=1).state_dict()
    with pytest.raises(dp.StateMismatchError, match="seed"):
        dp.Loader(dp.range(10), seed=2).load_state_dict(state)


@pytest.mark.parametrize(("saved", "loading"), [((0, 2), (1, 2)), ((0, 2), (0, 3))])
def test_a_state_from_another_rank_topology_is_refused(saved, loading):
    # One rank's state of a two-rank job covers half of the job: it cannot be re-dealt
    # (a one-rank job's state can: see test_elastic.py).
    pipe = dp.range(30).shuffle()
    state = dp.Loader(pipe, rank=saved[0], world_size=saved[1]).state_dict()
    with pytest.raises(dp.StateMismatchError, match="topology.*merge_states|holds rank"):
        dp.Loader(pipe, rank=loading[0], world_size=loading[1]).load_state_dict(state)


def test_something_that_is_not_a_state_is_refused():
    with pytest.raises(dp.StateMismatchError):
        dp.Loader(dp.range(3)).load_state_dict({"epoch": 3})
    assert issubclass(dp.StateMismatchError, ValueError)


# ----- global RNGs ----------------------------------------------------------------------


def seed_globals(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_global_rngs_do_not_change_the_stream():
    pipe = rich_pipe()
    streams = []
    for global_seed in (1, 2):
        seed_globals(global_seed)
        out = []
        for i, item in enumerate(dp.Loader(pipe, seed=5)):
            out.append(item)
            seed_globals(global_seed * 1000 + i)  # and in between items
            random.random(), np.random.rand(), torch.rand(1)
        streams.append(out)
    assert_same(streams[0], streams[1])


def test_iterating_leaves_the_global_rngs_alone():
    seed_globals(77)
    py, npy, th = random.getstate(), np.random.get_state(), torch.get_rng_state()
    loader = dp.Loader(rich_pipe(), seed=5)
    for _ in range(2):
        assert list(loader)
    state = loader.state_dict()
    resumed = dp.Loader(rich_pipe(), seed=5)
    resumed.load_state_dict(state)
    list(resumed)
    assert random.getstate() == py
    after = np.random.get_state()
    assert after[0] == npy[0] and np.array_equal(after[1], npy[1]) and after[2:] == npy[2:]
    assert torch.equal(torch.get_rng_state(), th)


# ----- ranks ----------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_split_the_data_exactly_once(world_size, shuffle):
    n = 101
    pipe = dp.range(n).shuffle() if shuffle else dp.range(n)
    for epoch in range(2):
        seen = []
        for rank in range(world_size):
            loader = dp.Loader(pipe, seed=3, rank=rank, world_size=world_size)
            loader.set_epoch(epoch)
            seen.extend(loader)
        assert sorted(seen) == list(range(n))


def test_shuffled_ranks_agree_on_one_permutation_per_epoch():
    # a different seed per rank would make the ranks overlap; check they don't, for a mapped source
    shares = [
        set(dp.Loader(dp.range(60).map(tenfold).shuffle(), seed=8, rank=r, world_size=4))
        for r in range(4)
    ]
    assert set().union(*shares) == {10 * x for x in range(60)}
    assert sum(len(s) for s in shares) == 60


def test_rank_and_world_size_from_the_environment(monkeypatch):
    pipe = dp.range(50).shuffle()
    seen = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = dp.Loader(pipe, seed=1)
        assert (loader.rank, loader.world_size) == (rank, 2)
        seen.append(list(loader))
    assert len(seen[0]) + len(seen[1]) == 50
    assert sorted(seen[0] + seen[1]) == list(range(50))
    explicit = dp.Loader(pipe, seed=1, rank=0, world_size=2)
    assert (explicit.rank, explicit.world_size) == (0, 2)  # arguments win over the env


def test_bad_rank_arguments_are_refused(monkeypatch):
    with pytest.raises(ValueError):
        dp.Loader(dp.range(5), rank=2, world_size=2)
    with pytest.raises(ValueError):
        dp.Loader(dp.range(5), rank=0)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK/WORLD_SIZE"):
        dp.Loader(dp.range(5))


@pytest.mark.parametrize(
    ("env", "missing"), [({"WORLD_SIZE": "2"}, "RANK"), ({"RANK": "1"}, "WORLD_SIZE")]
)
def test_a_world_size_without_a_rank_is_refused_not_guessed(monkeypatch, env, missing):
    """Lightning's DDP launcher sets WORLD_SIZE and LOCAL_RANK only: taking the rank as 0
    would read the first share on every process and never the others."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"not {missing}.*rank= and world_size="):
        dp.Loader(dp.range(5))
    with pytest.raises(ValueError, match=f"not {missing}"):
        dp.range(5).as_torch_dataset()
    assert list(dp.Loader(dp.range(5), rank=0, world_size=1)) == [0, 1, 2, 3, 4]  # explicit


def test_a_world_size_of_one_alone_is_one_process(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    loader = dp.Loader(dp.range(4))
    assert (loader.rank, loader.world_size) == (0, 1) and list(loader) == [0, 1, 2, 3]


def test_a_process_group_that_disagrees_with_the_environment_is_refused(monkeypatch, tmp_path):
    """The rank comes from the process group whenever one exists: a Loader set up from the
    environment before the group started must agree with it."""
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = dp.Loader(dp.range(6))  # before the group: rank 1 of 2, from the environment
    agreeing = dp.Loader(dp.range(6), rank=1, world_size=2)
    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="rank 1 of 2 .*rank 0 of 1"):
            iter(loader)
        assert list(agreeing) == [1, 3, 5]  # explicit arguments are the user's own choice
        assert list(dp.Loader(dp.range(6))) == list(range(6))  # made after: the group's
    finally:
        dist.destroy_process_group()


# ----- big data -------------------------------------------------------------------------


def test_a_billion_item_global_shuffle_is_lazy_and_resumes():
    n = 10**9
    pipe = dp.range(n).shuffle()
    loader = dp.Loader(pipe, seed=0)
    it = iter(loader)
    first = list(islice(it, 1000))
    assert len(set(first)) == 1000
    assert all(0 <= x < n for x in first)
    assert first != sorted(first)
    state = loader.state_dict()
    assert len(json.dumps(state)) < 2000
    following = list(islice(it, 1000))

    resumed = dp.Loader(pipe, seed=0)
    resumed.load_state_dict(roundtrip_state(state))
    assert list(islice(iter(resumed), 1000)) == following
    assert not set(first) & set(following)


def test_dropped_still_tells_the_last_epoch_after_close():
    loader = dp.Loader(dp.range(10).batch(4, drop_last=True))
    assert len(list(loader)) == 2
    assert loader.dropped() == {"batch(4, drop_last=True)": 2}
    loader.close()  # the graph goes; the counts of the epoch it ran stay
    assert loader.dropped() == {"batch(4, drop_last=True)": 2}
    assert len(list(loader)) == 2 and loader.dropped() == {"batch(4, drop_last=True)": 2}
    loader.set_epoch(5)
    it = iter(loader)
    next(it)  # epoch 5 mid-way: nothing dropped yet
    loader.close()
    assert loader.dropped() == {}
