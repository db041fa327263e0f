"""Items cross from DataLoader workers with their tensors intact, small ones inside the pickle."""

from __future__ import annotations

import pickle

import pytest
import torch

import datapipes as dp
from nodes.handover import INLINE_TENSOR_BYTES, inline_small_tensors
from nodes.testing import same

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def make_item(index: int) -> dict:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) + index
    return {
        "index": index,
        "float": base,
        "view": base[:, 1:4],  # non-contiguous view of a bigger storage
        "transposed": base.t(),
        "ints": torch.tensor([index, -index], dtype=torch.int64),
        "flags": torch.tensor([True, False]),
        "half": torch.ones(3, dtype=torch.float16) * index,
        "bfloat": torch.ones(3, dtype=torch.bfloat16) * index,  # no numpy dtype: torch's path
        "complex": torch.tensor([1 + 2j], dtype=torch.complex64) * index,
        "scalar": torch.tensor(float(index)),
        "empty": torch.zeros(0, 5),
        "large": torch.full((INLINE_TENSOR_BYTES // 4 + 1,), float(index)),  # shared memory
        "nested": [(torch.tensor([index]), "text")],
    }


def test_items_through_workers_equal_the_items_made_in_process() -> None:
    pipe = dp.range(6).map(make_item)
    expected = list(dp.Loader(pipe))
    got = list(dp.Loader(pipe, num_workers=2))
    assert sorted(item["index"] for item in got) == list(range(6))
    for item in got:
        want = expected[item["index"]]
        assert same(item, want), item["index"]
        assert all(type(v) is torch.Tensor for k, v in item.items() if k not in ("index", "nested"))
        # small tensors with storage of their own came inside the pickle; the large one,
        # and a storage that several tensors share (they must still share it), did not
        assert not item["ints"].is_shared() and not item["complex"].is_shared()
        assert item["large"].is_shared() and item["bfloat"].is_shared()
        assert item["float"].is_shared() and item["view"].is_shared()


def test_small_tensors_pickle_inline_and_large_ones_do_not() -> None:
    small = torch.arange(10)
    big = torch.zeros(INLINE_TENSOR_BYTES // 8 + 1, dtype=torch.int64)
    grad = torch.ones(2).requires_grad_()
    packed = inline_small_tensors({"small": small, "big": big, "grad": grad})
    assert packed["big"] is big  # left to torch's shared-memory path
    assert type(packed["grad"]) is torch.Tensor  # tensors needing grad too
    assert type(packed["small"]) is not torch.Tensor
    restored = pickle.loads(pickle.dumps(packed["small"]))
    assert type(restored) is torch.Tensor and torch.equal(restored, small)


def test_own_dataloader_with_collation_gets_plain_tensors() -> None:
    # as_torch_dataset() under a collating DataLoader must not hand the collate any wrapper.
    from torch.utils.data import DataLoader

    ds = dp.range(8).map(lambda i: torch.tensor([i])).as_torch_dataset()
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    assert sorted(int(x) for b in batches for x in b.flatten()) == list(range(8))
