"""random_map: augmentations whose draws are a pure function of (seed, epoch, step, item).

The same item gets the same draws at 0, 1 and 3 DataLoader workers, across world
sizes, after a resume at any point and in a new process; a new epoch or seed gives
new ones. With global_rng=True unmodified transforms that draw from torch, random
and np.random become reproducible, and the caller's RNGs are left as they were.
"""

from __future__ import annotations

import json
import random
import warnings
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch

import datapipes as dp
from nodes import Context, SequenceNode
from nodes.steps.random_map import RandomMapError, RandomMapNode
from nodes.steps.shuffle import BufferShuffleNode
from nodes.steps.transforms import FlatMapNode
from nodes.testing import check_node, roundtrip_state
from tests.subprocess_helpers import run_python

warnings.filterwarnings("ignore", message="This DataLoader will create")


# ----- functions (module level: they travel to DataLoader workers) ------------------------------


def jitter(x: Any, rng: np.random.Generator) -> tuple[Any, int]:
    """The item and a draw: the draw must follow the item wherever it is read."""
    return x, int(rng.integers(1 << 62))


def record_jitter(record: dict[str, Any], rng: np.random.Generator) -> tuple[int, float]:
    return record["id"], float(rng.random())


def global_draws(x: int) -> tuple[int, float, float, float]:
    """An unmodified transform: it draws from the three global RNGs."""
    return x, torch.rand(()).item(), random.random(), float(np.random.rand())


class RandomCrop:
    """A torchvision-style transform (the PyTorch tutorial's RandomCrop): global RNGs inside."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        h, w = image.shape[-2:]
        top = int(torch.randint(0, h - self.size + 1, ()).item())
        left = random.randint(0, w - self.size)
        flip = np.random.rand() < 0.5
        crop = image[..., top : top + self.size, left : left + self.size]
        return crop.flip(-1) if flip else crop


def image(i: int) -> torch.Tensor:
    return torch.arange(64, dtype=torch.float32).reshape(1, 8, 8) + 100 * i


def crop_item(i: int) -> tuple[int, torch.Tensor]:
    return i, RandomCrop(4)(image(i))


def batch_jitter(batch: torch.Tensor, rng: np.random.Generator) -> tuple[list[int], float]:
    return batch.tolist(), float(rng.random())


def explode(x: int) -> list[int]:
    return [10 * x, 10 * x + 1, 10 * x + 2]


def fails_on_7(x: int, rng: np.random.Generator) -> int:
    if x == 7:
        raise ValueError(f"augmentation failed on item {x}")
    return x


def draws_by_item(loader: Any) -> dict[Any, Any]:
    """item -> its draw, checking that no item came twice."""
    out: dict[Any, Any] = {}
    for item, draw in loader:
        assert item not in out, f"item {item} came twice"
        out[item] = draw
    return out


def shuffled(n: int = 60) -> dp.DataPipe[Any]:
    return dp.range(n).shuffle().random_map(jitter)


# ----- the node contract ----------------------------------------------------------------------


def test_conformance_over_a_shuffled_sequence():
    report = check_node(
        lambda ctx: RandomMapNode(SequenceNode(range(50), ctx, shuffle_key=[3]), jitter, ctx, 11)
    )
    assert report.positions_checked > 0


def test_conformance_over_a_buffer_shuffle_and_a_flat_map():
    def make(ctx: Context) -> RandomMapNode:
        source = SequenceNode(range(30), ctx)
        buffered = BufferShuffleNode(FlatMapNode(source, explode), 8, ctx, key=5)
        return RandomMapNode(buffered, jitter, ctx, 12)

    check_node(make, max_positions=30)


def test_conformance_with_global_rng():
    report = check_node(
        lambda ctx: RandomMapNode(SequenceNode(range(30), ctx), global_draws, ctx, 13, **GLOBAL)
    )
    assert report.positions_checked > 0


GLOBAL = {"global_rng": True}


# ----- the same draws for the same item ------------------------------------------------------


def test_same_draws_across_world_sizes_by_item():
    whole = draws_by_item(dp.Loader(shuffled(), seed=3))
    union: dict[Any, Any] = {}
    for rank in range(2):
        part = draws_by_item(dp.Loader(shuffled(), seed=3, rank=rank, world_size=2))
        assert not union.keys() & part.keys()
        union.update(part)
    assert union == whole
    assert len(set(whole.values())) == len(whole)  # every item draws its own


def test_new_epoch_new_seed_and_step_seed_give_new_draws():
    loader = dp.Loader(shuffled(), seed=3)
    first, second = draws_by_item(loader), draws_by_item(loader)
    other_seed = draws_by_item(dp.Loader(shuffled(), seed=4))
    step_seed = draws_by_item(dp.Loader(dp.range(60).shuffle().random_map(jitter, seed=9), seed=3))
    for other in (second, other_seed, step_seed):
        assert other.keys() == first.keys()
        assert all(other[k] != first[k] for k in first)
    # set_epoch(1) on a fresh Loader reproduces the second epoch
    again = dp.Loader(shuffled(), seed=3)
    again.set_epoch(1)
    assert draws_by_item(again) == second


def test_two_random_maps_in_one_recipe_draw_differently():
    pipe = dp.range(20).random_map(jitter).random_map(lambda pair, rng: (*pair, rng.random()))
    for _, first, second in dp.Loader(pipe):
        assert first / (1 << 62) != second


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_resume_at_random_points_gives_the_same_draws(seed):
    pipe = dp.range(50).shuffle().filter(lambda x: x % 7 != 3).random_map(jitter).batch(4)
    loader = dp.Loader(pipe, seed=seed)
    full = [list(loader), list(loader)]
    assert _plain(list(dp.Loader(pipe, seed=seed))) == _plain(full[0])
    rng = random.Random(seed)
    for _ in range(3):
        k = rng.randrange(len(full[0]) + 1)
        loader = dp.Loader(pipe, seed=seed)
        taken = list(islice(iter(loader), k))
        state = roundtrip_state(loader.state_dict())
        loader.close()
        resumed = dp.Loader(pipe, seed=seed)
        resumed.load_state_dict(state)
        assert _plain(taken + list(resumed)) == _plain(full[0])
        assert _plain(list(resumed)) == _plain(full[1])


def _plain(batches: list[Any]) -> list[Any]:
    return [[t.tolist() for t in batch] for batch in batches]


def test_buffer_shuffle_below_works_and_keeps_draws_by_item():
    recipe = dp.range(80).shuffle(buffer_size=16).random_map(jitter)
    whole = draws_by_item(dp.Loader(recipe, seed=5))
    union: dict[Any, Any] = {}
    for rank in range(2):
        union.update(draws_by_item(dp.Loader(recipe, seed=5, rank=rank, world_size=2)))
    assert union == whole
    # and exact resume inside the buffer
    reference = list(dp.Loader(recipe, seed=5))
    loader = dp.Loader(recipe, seed=5)
    head = list(islice(iter(loader), 23))
    resumed = dp.Loader(recipe, seed=5)
    resumed.load_state_dict(roundtrip_state(loader.state_dict()))
    assert head + list(resumed) == reference


def test_flat_map_outputs_draw_each_their_own():
    recipe = dp.range(20).flat_map(explode).random_map(jitter)
    whole = draws_by_item(dp.Loader(recipe, seed=1))
    assert len(whole) == 60 and len(set(whole.values())) == 60
    union: dict[Any, Any] = {}
    for rank in range(3):
        union.update(draws_by_item(dp.Loader(recipe, seed=1, rank=rank, world_size=3)))
    assert union == whole
    loader = dp.Loader(recipe, seed=1)
    head = list(islice(iter(loader), 31))  # inside a parent's outputs
    resumed = dp.Loader(recipe, seed=1)
    resumed.load_state_dict(roundtrip_state(loader.state_dict()))
    assert dict(head + list(resumed)) == whole


def test_random_map_over_a_batch_gets_one_draw_per_batch():
    recipe = dp.range(20).shuffle().batch(4).random_map(batch_jitter)
    first = list(dp.Loader(recipe, seed=2))
    assert list(dp.Loader(recipe, seed=2)) == first
    assert sorted(x for items, _ in first for x in items) == list(range(20))
    assert len({draw for _, draw in first}) == len(first)
    loader = dp.Loader(recipe, seed=2)
    head = list(islice(iter(loader), 2))
    resumed = dp.Loader(recipe, seed=2)
    resumed.load_state_dict(roundtrip_state(loader.state_dict()))
    assert head + list(resumed) == first


def test_mix_and_concat_below_key_by_source():
    a, b = dp.range(10), dp.range(10)  # the same values in two sources: different places
    recipe = dp.concat(a, b).random_map(jitter)
    draws = [draw for _, draw in dp.Loader(recipe)]
    assert len(set(draws)) == 20


def test_a_kept_rng_keeps_its_own_stream():
    kept: list[np.random.Generator] = []

    def keep(x: int, rng: np.random.Generator) -> float:
        kept.append(rng)
        return float(rng.random())

    firsts = list(dp.Loader(dp.range(5).random_map(keep)))
    later = [float(rng.random()) for rng in kept]  # drawn after every item was mapped
    fresh = list(dp.Loader(dp.range(5).random_map(lambda x, rng: (rng.random(), rng.random()))))
    assert [(a, b) for a, b in zip(firsts, later)] == fresh


# ----- global RNGs ---------------------------------------------------------------------------


def _global_states() -> tuple[Any, ...]:
    return torch.get_rng_state(), random.getstate(), np.random.get_state(legacy=False)


def test_global_rng_leaves_the_callers_rngs_as_they_were():
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    before = _global_states()
    out = list(dp.Loader(dp.range(10).random_map(global_draws, global_rng=True)))
    after = _global_states()
    assert torch.equal(before[0], after[0])
    assert before[1] == after[1]
    assert before[2]["state"]["key"].tolist() == after[2]["state"]["key"].tolist()
    assert before[2]["state"]["pos"] == after[2]["state"]["pos"]
    # the draws are per item, not the caller's stream
    assert len({draw for _, draw, _, _ in out}) == 10


def test_global_rng_can_name_the_rngs_it_manages():
    only_torch = dp.range(6).random_map(global_draws, global_rng="torch")
    random.seed(1)
    np.random.seed(2)
    out = list(dp.Loader(only_torch))
    # torch draws are per item; random and np.random are the caller's, moved on by fn
    assert [t for _, t, _, _ in out] == [t for _, t, _, _ in dp.Loader(only_torch)]
    random.seed(1)
    np.random.seed(2)
    assert [r for _, _, r, _ in out] == [random.random() for _ in range(6)]
    assert [n for _, _, _, n in out] == [float(np.random.rand()) for _ in range(6)]
    every = dp.range(3).random_map(global_draws, global_rng=["numpy", "random", "torch"])
    assert (
        every.fingerprint() == dp.range(3).random_map(global_draws, global_rng=True).fingerprint()
    )
    assert repr(dp.range(3).random_map(global_draws, global_rng=["numpy", "torch"])).endswith(
        "global_rng='torch,numpy')"
    )


def test_global_rng_draws_do_not_depend_on_the_callers_rngs():
    pipe = dp.range(12).shuffle().random_map(global_draws, global_rng=True)
    torch.manual_seed(5)
    first = list(dp.Loader(pipe, seed=1))
    torch.manual_seed(99)
    random.seed(7)
    np.random.seed(8)
    assert list(dp.Loader(pipe, seed=1)) == first


def test_torchvision_style_crops_resume_exactly():
    pipe = dp.range(30).shuffle().random_map(crop_item, global_rng=True)
    reference = list(dp.Loader(pipe, seed=4))
    loader = dp.Loader(pipe, seed=4)
    head = list(islice(iter(loader), 11))
    resumed = dp.Loader(pipe, seed=4)
    resumed.load_state_dict(roundtrip_state(loader.state_dict()))
    got = head + list(resumed)
    assert [i for i, _ in got] == [i for i, _ in reference]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, reference))
    crops = {tuple(c.flatten().tolist()) for _, c in reference}
    assert len(crops) == 30


# ----- refusals and errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recipe", "where"),
    [
        (lambda: dp.range(10).prefetch(2).random_map(jitter), "before the prefetch"),
        (lambda: dp.range(10).map(abs, num_workers=2).random_map(jitter), "before the"),
        (lambda: dp.from_iterable(lambda: iter(range(5))).random_map(jitter), ".shard()"),
    ],
)
def test_steps_that_cannot_say_which_item_are_refused(recipe, where):
    with pytest.raises(RandomMapError, match="random_map seeds each item") as caught:
        list(dp.Loader(recipe()))
    assert where in str(caught.value)


def test_from_iterable_with_shard_works():
    pipe = dp.from_iterable(lambda: iter(range(8))).shard().random_map(jitter)
    assert draws_by_item(dp.Loader(pipe)) == draws_by_item(dp.Loader(pipe))


def test_random_map_inside_a_repeat_draws_anew_each_round():
    pipe = dp.range(5).random_map(jitter).repeat(2)
    out = list(dp.Loader(pipe))
    assert [x for x, _ in out] == [0, 1, 2, 3, 4] * 2
    assert all(a[1] != b[1] for a, b in zip(out[:5], out[5:]))


def test_random_map_after_a_repeat_draws_per_round_on_any_topology():
    """A repeat's rounds are places of their own: each item's draw differs round to round,
    and follows the item (and its round) onto another number of ranks."""
    pipe = dp.range(20).shuffle().repeat(3).random_map(jitter)
    whole = sorted(dp.Loader(pipe, seed=5))
    assert len({draw for _, draw in whole}) == 60
    old = [dp.Loader(pipe, seed=5, rank=r, world_size=2) for r in range(2)]
    taken: list[Any] = []
    for loader, count in zip(old, [23, 4]):
        taken.extend(islice(iter(loader), count))
    merged = dp.merge_states([loader.state_dict() for loader in old])
    for loader in old:
        loader.close()
    for rank in range(3):
        with dp.Loader(pipe, seed=5, rank=rank, world_size=3) as new:
            new.load_state_dict(roundtrip_state(merged))
            taken.extend(new)
    assert sorted(taken) == whole


def test_fn_raising_gives_its_own_error():
    with pytest.raises(ValueError, match="augmentation failed on item 7"):
        list(dp.Loader(dp.range(10).random_map(fails_on_7)))


def test_bad_arguments_are_refused_early():
    with pytest.raises(TypeError, match="takes a function"):
        dp.range(3).random_map("not a function")
    for bad in ("yes", [], ["torch", "cuda"], 1, "torch,"):
        with pytest.raises(ValueError, match="global_rng"):
            dp.range(3).random_map(jitter, global_rng=bad)
    with pytest.raises(TypeError, match="seed"):
        dp.range(3).random_map(jitter, seed=1.5)


def test_recipe_identity_and_repr():
    a = dp.range(3).random_map(jitter)
    assert repr(a).startswith("dp.range(3).random_map(")
    assert a.fingerprint() != dp.range(3).random_map(jitter, global_rng=True).fingerprint()
    assert a.fingerprint() != dp.range(3).map(abs).fingerprint()


# ----- across processes (slow) ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe",
    [
        shuffled,
        lambda: dp.range(60).shuffle(buffer_size=8).random_map(jitter),
        lambda: (
            dp.range(20).flat_map(explode).random_map(jitter).batch(5, collate_fn=list).unbatch()
        ),
    ],
)
def test_same_draws_at_0_1_and_3_workers(recipe):
    results = [
        draws_by_item(dp.Loader(recipe(), seed=6, num_workers=workers)) for workers in (0, 1, 3)
    ]
    assert results[0] == results[1] == results[2]


@pytest.mark.slow
def test_fn_raising_in_a_worker_gives_its_own_error():
    with pytest.raises(ValueError, match="augmentation failed on item 7"):
        list(dp.Loader(dp.range(10).random_map(fails_on_7), num_workers=2))


@pytest.mark.slow
def test_global_rng_crops_the_same_at_0_and_3_workers():
    pipe = dp.range(24).shuffle().random_map(crop_item, global_rng=True)
    by_workers = []
    for workers in (0, 3):
        crops = {i: c.flatten().tolist() for i, c in dp.Loader(pipe, seed=2, num_workers=workers)}
        by_workers.append(crops)
    assert by_workers[0] == by_workers[1]


@pytest.mark.slow
def test_same_draws_in_a_new_process():
    code = (
        "import json, datapipes as dp\n"
        "from tests.steps.test_random_map import shuffled, draws_by_item\n"
        "print(json.dumps(sorted(draws_by_item(dp.Loader(shuffled(), seed=6)).items())))\n"
    )
    here = sorted(draws_by_item(dp.Loader(shuffled(), seed=6)).items())
    there = json.loads(run_python(code, hash_seed="999"))
    assert [tuple(pair) for pair in there] == here


def _jsonl_files(tmp_path: Any, files: int, per_file: int) -> str:
    # Imported here: a new process imports this module as tests.steps.test_random_map, where the
    # tests folder is not on the path.
    from file_fixtures import write_id_files

    write_id_files(tmp_path, files, per_file, name="part-{}")
    return str(tmp_path / "*.jsonl")


@pytest.mark.slow
def test_file_recipe_same_draws_at_any_workers(tmp_path):
    pattern = _jsonl_files(tmp_path, files=4, per_file=50)
    pipe = dp.files(pattern).shuffle().read_jsonl().random_map(record_jitter)
    results = [draws_by_item(dp.Loader(pipe, seed=1, num_workers=w)) for w in (0, 1, 3)]
    assert len(results[0]) == 200
    assert results[0] == results[1] == results[2]


def test_file_records_resume_exactly_and_split_files_stay_exact(tmp_path):
    pattern = _jsonl_files(tmp_path, files=1, per_file=120)
    pipe = dp.files(pattern).read_jsonl().random_map(record_jitter)
    for world_size in (1, 3):  # 3 consumers split the one file into parts
        for rank in range(world_size):
            reference = list(dp.Loader(pipe, rank=rank, world_size=world_size))
            loader = dp.Loader(pipe, rank=rank, world_size=world_size)
            head = list(islice(iter(loader), 17))
            resumed = dp.Loader(pipe, rank=rank, world_size=world_size)
            resumed.load_state_dict(roundtrip_state(loader.state_dict()))
            assert head + list(resumed) == reference


@pytest.mark.parametrize(
    "recipe",
    [
        lambda: dp.range(60).shuffle().random_map(jitter),
        lambda: dp.range(60).shuffle(buffer_size=8).random_map(jitter),
        lambda: dp.range(20).flat_map(explode).shuffle(buffer_size=8).random_map(jitter),
    ],
)
def test_resume_on_another_world_size_keeps_each_items_draws(recipe):
    whole = draws_by_item(dp.Loader(recipe(), seed=5))
    old = [dp.Loader(recipe(), seed=5, rank=r, world_size=2) for r in range(2)]
    taken: list[Any] = []
    for loader, count in zip(old, [13, 7]):
        taken.extend(islice(iter(loader), count))
    merged = dp.merge_states([loader.state_dict() for loader in old])
    for loader in old:
        loader.close()
    for rank in range(3):
        new = dp.Loader(recipe(), seed=5, rank=rank, world_size=3)
        new.load_state_dict(roundtrip_state(merged))
        taken.extend(new)
        new.close()
    assert len(taken) == len(whole)
    assert dict(taken) == whole


def test_file_records_keep_their_draws_on_another_world_size(tmp_path):
    pattern = _jsonl_files(tmp_path, files=4, per_file=30)
    pipe = dp.files(pattern).shuffle().read_jsonl().random_map(record_jitter)
    whole = draws_by_item(dp.Loader(pipe, seed=2))
    old = [dp.Loader(pipe, seed=2, rank=r, world_size=2) for r in range(2)]
    taken: list[Any] = []
    for loader, count in zip(old, [11, 40]):
        taken.extend(islice(iter(loader), count))
    merged = dp.merge_states([loader.state_dict() for loader in old])
    for rank in range(3):
        new = dp.Loader(pipe, seed=2, rank=rank, world_size=3)
        new.load_state_dict(roundtrip_state(merged))
        taken.extend(new)
    assert len(taken) == 120 and dict(taken) == whole


class FetchesInChunks:
    """A map-style dataset with a batched ``__getitems__`` (as HF and some torch datasets)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        return i

    def __getitems__(self, keys: list[int]) -> list[int]:
        return list(keys)


def test_random_map_over_batches_fetched_in_one_call():
    recipe = dp.from_sequence(FetchesInChunks()).shuffle().batch(4).random_map(batch_jitter)
    first = list(dp.Loader(recipe, seed=1))
    assert sorted(x for items, _ in first for x in items) == list(range(40))
    loader = dp.Loader(recipe, seed=1)
    head = list(islice(iter(loader), 3))
    resumed = dp.Loader(recipe, seed=1)
    resumed.load_state_dict(roundtrip_state(loader.state_dict()))
    assert head + list(resumed) == first


def test_global_rng_on_a_background_thread_warns():
    pipe = dp.range(6).random_map(global_draws, global_rng=True).prefetch(2)
    with pytest.warns(RuntimeWarning, match="runs on a background thread"):
        out = list(dp.Loader(pipe))
    assert [x for x, *_ in out] == list(range(6))
