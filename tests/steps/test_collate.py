"""default_collate, custom collate functions and dp.no_collate."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

import datapipes as dp
from nodes.steps.collate import default_collate

Point = namedtuple("Point", ["x", "label"])


@pytest.mark.parametrize(
    ("samples", "dtype"),
    [
        ([1, 2, 3], torch.int64),
        ([1.5, -2.0, 3.25], torch.float64),
        ([True, False, True], torch.bool),
    ],
    ids=["int", "float", "bool"],
)
def test_python_numbers_become_one_tensor(samples, dtype):
    batch = default_collate(samples)
    assert isinstance(batch, torch.Tensor)
    assert batch.dtype == dtype and batch.shape == (len(samples),)
    assert batch.tolist() == samples


def test_numpy_arrays_are_stacked():
    samples = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(4)]
    batch = default_collate(samples)
    assert isinstance(batch, torch.Tensor)
    assert batch.dtype == torch.float32 and batch.shape == (4, 2, 3)
    assert np.array_equal(batch.numpy(), np.stack(samples))


def test_numpy_scalars_keep_their_dtype():
    batch = default_collate([np.float32(1.5), np.float32(2.5)])
    assert batch.dtype == torch.float32 and batch.tolist() == [1.5, 2.5]
    ints = default_collate([np.int16(3), np.int16(-4)])
    assert ints.dtype == torch.int16 and ints.tolist() == [3, -4]


def test_tensors_are_stacked():
    samples = [torch.full((2, 2), float(i)) for i in range(3)]
    batch = default_collate(samples)
    assert torch.equal(batch, torch.stack(samples))


def test_dicts_are_collated_per_key():
    batch = default_collate(
        [{"x": 1, "y": np.ones(2), "name": "a"}, {"x": 2, "y": np.zeros(2), "name": "b"}]
    )
    assert set(batch) == {"x", "y", "name"}
    assert batch["x"].tolist() == [1, 2]
    assert batch["y"].tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert batch["name"] == ["a", "b"]


def test_tuples_lists_and_namedtuples_are_collated_per_position():
    pairs = default_collate([(1, "a"), (2, "b")])
    assert isinstance(pairs, tuple) and pairs[0].tolist() == [1, 2] and pairs[1] == ["a", "b"]
    lists = default_collate([[1, 2.0], [3, 4.0]])
    assert isinstance(lists, list)
    assert lists[0].dtype == torch.int64 and lists[1].dtype == torch.float64
    points = default_collate([Point(1.0, "p"), Point(2.0, "q")])
    assert isinstance(points, Point)
    assert points.x.tolist() == [1.0, 2.0] and points.label == ["p", "q"]


def test_strings_bytes_and_none_stay_lists():
    assert default_collate(["a", "bb"]) == ["a", "bb"]
    assert default_collate([b"a", b"b"]) == [b"a", b"b"]
    assert default_collate([None, None]) == [None, None]
    assert default_collate([np.str_("a"), np.str_("b")]) == ["a", "b"]


def test_nested_structures():
    batch = default_collate([{"pt": (1, [2.0, 3.0])}, {"pt": (4, [5.0, 6.0])}])
    first, second = batch["pt"]
    assert first.tolist() == [1, 4]
    assert [t.tolist() for t in second] == [[2.0, 5.0], [3.0, 6.0]]


def test_ragged_arrays_name_the_field_and_suggest_collate_fn():
    samples = [{"image": np.zeros((2, 3))}, {"image": np.zeros((2, 4))}]
    with pytest.raises(ValueError, match="collate_fn") as info:
        default_collate(samples)
    assert "image" in str(info.value)
    with pytest.raises(ValueError, match="collate_fn"):
        default_collate([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(ValueError, match="collate_fn"):
        default_collate([[1, 2], [3]])


def test_ragged_arrays_in_a_pipeline_raise_when_batched():
    pipe = dp.from_sequence([np.zeros(i + 1) for i in range(4)]).batch(2)
    with pytest.raises(ValueError, match="collate_fn"):
        list(dp.Loader(pipe))


def pad(samples: list[np.ndarray]) -> torch.Tensor:
    width = max(len(s) for s in samples)
    out = torch.zeros(len(samples), width)
    for i, s in enumerate(samples):
        out[i, : len(s)] = torch.from_numpy(s)
    return out


def test_custom_collate_fn():
    arrays = [np.arange(i + 1, dtype=np.float32) for i in range(5)]
    batches = list(dp.Loader(dp.from_sequence(arrays).batch(2, collate_fn=pad)))
    assert [tuple(b.shape) for b in batches] == [(2, 2), (2, 4), (1, 5)]
    assert batches[1][0].tolist() == [0.0, 1.0, 2.0, 0.0]


def test_no_collate_keeps_lists_of_samples():
    samples = [{"x": np.zeros(i)} for i in range(5)]
    batches = list(dp.Loader(dp.from_sequence(samples).batch(2, collate_fn=dp.no_collate)))
    assert [len(b) for b in batches] == [2, 2, 1]
    assert all(type(b) is list for b in batches)
    assert [len(s["x"]) for b in batches for s in b] == list(range(5))
    assert dp.no_collate is not default_collate and dp.default_collate is default_collate


def test_pil_images_are_refused_with_the_ways_to_batch_them():
    # torch's default_collate fails on PIL images too; ours says what to do instead
    image = pytest.importorskip("PIL.Image")
    samples = [{"image": image.new("RGB", (4, 3)), "label": i} for i in range(2)]
    with pytest.raises(TypeError, match=r"samples\['image'\] are PIL images.*decode.*no_collate"):
        dp.default_collate(samples)
    kept = dp.no_collate(samples)
    assert [s["label"] for s in kept] == [0, 1]
