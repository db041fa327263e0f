"""Recipes: immutable, picklable, printable, fingerprinted; sources, combinators and steps."""

from __future__ import annotations

import pickle
from collections import Counter
from itertools import islice

import numpy as np
import pytest
import torch
from subprocess_helpers import run_python

import datapipes as dp
from nodes.testing import roundtrip_state, same


def is_even(x: int) -> bool:
    return x % 2 == 0


def plus_one(x: int) -> int:
    return x + 1


def to_record(x: int) -> dict:
    return {"x": x, "name": f"n{x}"}


def everything(pipe, seed: int = 0, epochs: int = 1) -> list:
    loader = dp.Loader(pipe, seed=seed)
    out = [list(loader) for _ in range(epochs)]
    loader.close()
    return out[0] if epochs == 1 else out


# ----- the recipe object ----------------------------------------------------------------


def test_recipes_are_immutable():
    pipe = dp.range(10).map(abs)
    with pytest.raises(AttributeError, match="immutable"):
        pipe.inputs = ()
    with pytest.raises(AttributeError):
        pipe.anything = 1
    longer = pipe.batch(2)
    assert longer is not pipe
    assert repr(pipe) == "dp.range(10).map(abs)"  # chaining left the original alone


def test_building_a_recipe_runs_nothing():
    calls = []

    def factory():
        calls.append(1)
        return [1, 2, 3]

    pipe = dp.from_iterable(factory).map(plus_one).shuffle(buffer_size=2).batch(2).prefetch()
    repr(pipe), pipe.fingerprint()
    assert calls == []
    assert sorted(sum((b.tolist() for b in everything(pipe)), [])) == [2, 3, 4]
    assert calls


def test_pickle_round_trip_keeps_repr_fingerprint_and_output():
    pipe = dp.concat(
        dp.range(30).map(plus_one).shuffle().filter(is_even),
        dp.from_sequence(list(range(100, 120))).shuffle(buffer_size=5, seed=2),
    ).batch(4, drop_last=True)
    copy = pickle.loads(pickle.dumps(pipe))
    assert repr(copy) == repr(pipe)
    assert copy.fingerprint() == pipe.fingerprint()
    a, b = everything(pipe, seed=3, epochs=2), everything(copy, seed=3, epochs=2)
    assert all(same(x, y) for x, y in zip(a, b)) and len(a) == len(b)


def test_repr_reads_like_the_code():
    assert repr(dp.range(10).map(abs).batch(4)) == "dp.range(10).map(abs).batch(4)"
    assert repr(dp.range(2, 8, 2).filter(is_even).take(3)) == (
        "dp.range(2, 8, 2).filter(is_even).take(3)"
    )
    assert repr(dp.range(5).shuffle(buffer_size=100, seed=3)) == (
        "dp.range(5).shuffle(buffer_size=100, seed=3)"
    )


@pytest.mark.parametrize(
    "pipe",
    [
        dp.range(10).map(abs).batch(4),
        dp.range(3, 30, 3).shuffle().map(str).shuffle(buffer_size=4).take(5).repeat(2).prefetch(3),
        dp.from_sequence([5, 6, 7]).batch(2, drop_last=True, collate_fn=dp.no_collate),
        dp.concat(dp.range(3), dp.zip(dp.range(4), dp.range(5)).unbatch()),
        dp.mix([dp.range(3), dp.range(3, 6)], [2, 1], seed=4, stop="first_exhausted"),
    ],
    ids=repr,
)
def test_repr_rebuilds_the_same_recipe(pipe):
    rebuilt = eval(repr(pipe), {"dp": dp, "no_collate": dp.no_collate})
    assert rebuilt.fingerprint() == pipe.fingerprint()
    assert repr(rebuilt) == repr(pipe)


FINGERPRINT = "print(dp.range(100).map(abs).shuffle(buffer_size=8, seed=1).batch(4).fingerprint())"


@pytest.mark.slow
@pytest.mark.parametrize("hash_seed", ["1", "2"])
def test_fingerprint_is_the_same_in_another_process(hash_seed):
    out = run_python("import datapipes as dp; " + FINGERPRINT, hash_seed=hash_seed)
    ours = dp.range(100).map(abs).shuffle(buffer_size=8, seed=1).batch(4).fingerprint()
    assert out.strip() == ours


@pytest.mark.parametrize(
    "other",
    [
        dp.range(11).map(abs).shuffle(buffer_size=8, seed=1).batch(4),
        dp.range(10).map(str).shuffle(buffer_size=8, seed=1).batch(4),
        dp.range(10).map(abs).shuffle(buffer_size=9, seed=1).batch(4),
        dp.range(10).map(abs).shuffle(buffer_size=8, seed=2).batch(4),
        dp.range(10).map(abs).shuffle(buffer_size=8).batch(4),
        dp.range(10).map(abs).shuffle(buffer_size=8, seed=1).batch(5),
        dp.range(10).map(abs).shuffle(buffer_size=8, seed=1).batch(4, drop_last=True),
        dp.range(10).map(abs).shuffle(buffer_size=8, seed=1).batch(4).prefetch(),
    ],
    ids=repr,
)
def test_fingerprint_changes_with_any_argument(other):
    pipe = dp.range(10).map(abs).shuffle(buffer_size=8, seed=1).batch(4)
    same_again = dp.range(10).map(abs).shuffle(buffer_size=8, seed=1).batch(4)
    assert pipe.fingerprint() == same_again.fingerprint()
    assert other.fingerprint() != pipe.fingerprint()


def test_mix_weights_change_the_fingerprint():
    a = dp.mix([dp.range(3), dp.range(3)], [1, 2])
    b = dp.mix([dp.range(3), dp.range(3)], [2, 1])
    assert a.fingerprint() != b.fingerprint()


# ----- argument errors ------------------------------------------------------------------


def test_global_shuffle_of_a_stream_asks_for_a_buffer_size():
    with pytest.raises(ValueError, match="buffer_size"):
        dp.range(10).filter(is_even).shuffle()
    with pytest.raises(ValueError, match="buffer_size"):
        dp.from_iterable([1, 2, 3]).shuffle()
    buffered = everything(dp.range(10).filter(is_even).shuffle(buffer_size=3))
    assert sorted(buffered) == [0, 2, 4, 6, 8]


def test_from_iterable_refuses_a_generator_object():
    with pytest.raises(TypeError, match="one-shot"):
        dp.from_iterable(x for x in range(3))
    with pytest.raises(TypeError):
        dp.from_iterable(iter([1, 2]))


@pytest.mark.parametrize(
    "bad",
    [
        lambda: dp.range(5).batch(0),
        lambda: dp.range(5).take(-1),
        lambda: dp.range(5).repeat(0),
        lambda: dp.range(5).prefetch(0),
        lambda: dp.range(5).shuffle(buffer_size=0),
        lambda: dp.mix([dp.range(2)], [1, 1]),
        lambda: dp.mix([dp.range(2), dp.range(2)], [0, 0]),
        lambda: dp.mix([dp.range(2)], [1], stop="never"),
    ],
)
def test_bad_arguments_raise_value_error(bad):
    with pytest.raises(ValueError):
        bad()


def test_non_callables_and_non_pipes_raise_type_error():
    with pytest.raises(TypeError):
        dp.range(5).map(3)
    with pytest.raises(TypeError):
        dp.concat(dp.range(2), [1, 2])
    with pytest.raises(TypeError):
        dp.from_sequence(x for x in range(2))
    with pytest.raises(TypeError):
        dp.Loader([1, 2, 3])


# ----- sources --------------------------------------------------------------------------


def test_from_iterable_factory_runs_every_epoch_and_resumes_by_replay():
    calls = []

    def factory():
        calls.append(1)
        return (x * x for x in range(20))

    pipe = dp.from_iterable(factory)
    expected = [x * x for x in range(20)]
    assert everything(pipe, epochs=2) == [expected, expected]

    loader = dp.Loader(pipe)
    assert list(islice(iter(loader), 7)) == expected[:7]
    state = roundtrip_state(loader.state_dict())
    calls.clear()
    resumed = dp.Loader(pipe)
    resumed.load_state_dict(state)
    assert list(resumed) == expected[7:]
    assert list(resumed) == expected
    assert len(calls) == 2  # replayed from a fresh iterable, then one more for the next epoch


def test_from_iterable_refuses_several_consumers():
    with pytest.raises(ValueError, match="consumers"):
        dp.Loader(dp.from_iterable([1, 2, 3]), rank=0, world_size=2)


def test_from_sequence_over_a_numpy_array():
    array = np.arange(40, dtype=np.int32) * 3
    items = everything(dp.from_sequence(array))
    assert [int(x) for x in items] == array.tolist()
    shuffled = everything(dp.from_sequence(array).shuffle(), seed=1)
    assert sorted(int(x) for x in shuffled) == array.tolist()
    batches = everything(dp.from_sequence(array).batch(8))
    assert all(b.dtype == torch.int32 and b.shape == (8,) for b in batches)
    assert torch.cat(batches).tolist() == array.tolist()


class SquaresDataset(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"i": i, "square": torch.tensor([float(i * i)])}


def test_from_sequence_over_a_torch_map_style_dataset():
    pipe = dp.from_sequence(SquaresDataset(21)).shuffle().batch(4)
    batches = everything(pipe, seed=2)
    indices = torch.cat([b["i"] for b in batches]).tolist()
    assert sorted(indices) == list(range(21)) and indices != list(range(21))
    for b in batches:
        assert torch.equal(b["square"], (b["i"] ** 2).double().unsqueeze(1).float())
    assert "SquaresDataset of 21" in repr(pipe)


def test_from_sequence_over_a_hugging_face_dataset():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"x": list(range(12)), "y": [str(i) for i in range(12)]})
    items = everything(dp.from_sequence(ds).shuffle(), seed=1)
    assert sorted(item["x"] for item in items) == list(range(12))
    assert all(item["y"] == str(item["x"]) for item in items)


# ----- combinators ----------------------------------------------------------------------


def test_mix_all_exhausted_yields_every_item_once():
    pipe = dp.mix([dp.range(50), dp.range(100, 130).shuffle(), dp.range(200, 205)], [5, 1, 1])
    for epoch in everything(pipe, epochs=2):
        assert sorted(epoch) == [*range(50), *range(100, 130), *range(200, 205)]


def test_mix_keeps_each_pipes_own_order():
    items = everything(dp.mix([dp.range(50), dp.range(100, 130)], [1, 1], seed=3))
    assert [x for x in items if x < 100] == list(range(50))
    assert [x for x in items if x >= 100] == list(range(100, 130))
    assert items != sorted(items)  # actually interleaved


def test_mix_first_exhausted_stops_early():
    short, long = list(range(10)), list(range(100, 200))
    pipes = [dp.from_sequence(short), dp.from_sequence(long)]
    for seed in range(5):
        items = everything(dp.mix(pipes, [1, 1], stop="first_exhausted"), seed=seed)
        # it stopped because the short pipe ran out, long before the long one did
        assert set(short) <= set(items)
        assert len(items) < 60
        both = everything(dp.mix(pipes, [1, 1]), seed=seed)
        assert sorted(both) == short + long


def test_mix_respects_the_weights():
    for seed in range(3):
        items = everything(dp.mix([dp.range(7500), dp.range(7500, 10000)], [3, 1]), seed=seed)
        share = sum(1 for x in items[:4000] if x < 7500) / 4000
        assert 0.7 <= share <= 0.8


def test_mix_seed_argument_overrides_the_loader_seed():
    pipe = dp.mix([dp.range(30), dp.range(30, 60)], [1, 1], seed=7)
    assert everything(pipe, seed=1) == everything(pipe, seed=2)
    free = dp.mix([dp.range(30), dp.range(30, 60)], [1, 1])
    assert everything(free, seed=1) != everything(free, seed=2)


def test_concat():
    pipe = dp.concat(dp.range(3), dp.from_sequence(["a", "b"]), dp.range(0), dp.range(10, 12))
    assert everything(pipe) == [0, 1, 2, "a", "b", 10, 11]


def test_zip_pairs_items_and_stops_with_the_shortest():
    pipe = dp.zip(dp.range(10), dp.from_sequence("abcd"), dp.range(100, 200))
    assert everything(pipe) == list(zip(range(10), "abcd", range(100, 200)))


def test_take():
    assert everything(dp.range(10).take(3)) == [0, 1, 2]
    assert everything(dp.range(2).take(5)) == [0, 1]
    assert everything(dp.range(5).take(0)) == []
    shuffled = everything(dp.range(100).shuffle().take(10), seed=4)
    assert len(set(shuffled)) == 10 and shuffled != list(range(10))


def test_repeat_reshuffles_every_round():
    items = everything(dp.range(30).shuffle().repeat(3), seed=5)
    rounds = [items[i * 30 : (i + 1) * 30] for i in range(3)]
    assert len(items) == 90
    assert all(sorted(r) == list(range(30)) for r in rounds)
    assert rounds[0] != rounds[1] and rounds[1] != rounds[2] and rounds[0] != rounds[2]


def test_repeat_of_a_buffer_shuffle_also_differs_by_round():
    items = everything(dp.range(30).shuffle(buffer_size=8).repeat(2), seed=5)
    assert sorted(items[:30]) == sorted(items[30:]) == list(range(30))
    assert items[:30] != items[30:]


def test_identical_branches_shuffle_independently():
    pairs = everything(dp.zip(dp.range(50).shuffle(), dp.range(50).shuffle()), seed=1)
    assert any(a != b for a, b in pairs)


def test_filter_map_flat_map():
    pipe = dp.range(10).filter(is_even).map(plus_one).flat_map(lambda x: [x] * 2)
    assert everything(pipe) == [y for x in range(10) if is_even(x) for y in [x + 1] * 2]


# ----- batch / unbatch ------------------------------------------------------------------


def test_batch_sizes_and_drop_last():
    assert [b.tolist() for b in everything(dp.range(7).batch(3))] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [b.tolist() for b in everything(dp.range(7).batch(3, drop_last=True))] == [
        [0, 1, 2],
        [3, 4, 5],
    ]


def test_unbatch_of_tensor_batches():
    items = everything(dp.range(10).batch(3).unbatch())
    assert all(isinstance(x, torch.Tensor) and x.shape == () for x in items)
    assert [int(x) for x in items] == list(range(10))
    rows = everything(dp.from_sequence([np.full(2, i) for i in range(5)]).batch(2).unbatch())
    assert [r.tolist() for r in rows] == [[i, i] for i in range(5)]


def test_unbatch_of_dict_batches():
    items = everything(dp.range(7).map(to_record).batch(3).unbatch())
    assert [int(item["x"]) for item in items] == list(range(7))
    assert [item["name"] for item in items] == [f"n{i}" for i in range(7)]


def test_unbatch_of_tuple_and_list_batches():
    pairs = everything(dp.zip(dp.range(5), dp.range(10, 15)).batch(2).unbatch())
    assert [(int(a), int(b)) for a, b in pairs] == list(zip(range(5), range(10, 15)))
    lists = everything(dp.from_sequence([[1, 2], [3], []]).unbatch())
    assert lists == [1, 2, 3]


def test_unbatch_refuses_dict_columns_of_different_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        everything(dp.from_sequence([{"a": [1, 2], "b": [1]}]).unbatch())


def test_shuffle_is_a_permutation_with_new_orders_per_epoch():
    counts = Counter()
    for epoch in everything(dp.range(64).shuffle(), seed=0, epochs=4):
        assert sorted(epoch) == list(range(64))
        counts[tuple(epoch)] += 1
    assert len(counts) == 4


class EpochAware:
    """A re-iterable that orders its items by the epoch it was told (like an HF dataset)."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self):
        epoch = self.epochs[-1] if self.epochs else 0
        return iter(range(epoch * 10, epoch * 10 + 3))


def test_from_iterable_passes_the_epoch_to_an_object_that_takes_it():
    source = EpochAware()
    loader = dp.Loader(dp.from_iterable(source), seed=0)
    assert [list(loader), list(loader)] == [[0, 1, 2], [10, 11, 12]]
    loader.set_epoch(5)
    assert list(loader) == [50, 51, 52] and source.epochs[-1] == 5
    it = iter(loader)  # epoch 6, resumed mid-way in a new Loader: the same epoch is told
    next(it)
    state = loader.state_dict()
    resumed = dp.Loader(dp.from_iterable(source), seed=0)
    resumed.load_state_dict(state)
    assert list(resumed) == [61, 62] and source.epochs[-1] == 6


def test_an_hf_shuffle_buffer_is_said_to_resume_inexactly(tmp_path):
    # HF's state_dict does not hold its shuffle buffer: Loader(...) says so, with the fix.
    datasets = pytest.importorskip("datasets")
    files = []
    for f in range(2):
        path = tmp_path / f"part{f}.jsonl"
        path.write_text("".join(f'{{"id": {100 * f + i}}}\n' for i in range(10)))
        files.append(str(path))
    streaming = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    said = r"buffer of 5 items.*shuffle\(buffer_size=5\)"
    with pytest.warns(dp.InexactResumeWarning, match=said):
        dp.Loader(dp.from_iterable(streaming.shuffle(seed=0, buffer_size=5)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", dp.InexactResumeWarning)
        loader = dp.Loader(dp.from_iterable(streaming))  # no buffer: nothing to say
    assert sorted(r["id"] for r in loader) == list(range(10)) + list(range(100, 110))
