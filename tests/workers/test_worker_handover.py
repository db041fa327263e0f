"""Items cross from DataLoader workers with their tensors intact, small ones inside the pickle."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

import datapipes as dp
from nodes.testing import same
from nodes.workers.handover import INLINE_TENSOR_BYTES, inline_small_tensors

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_own_dataloader_with_collation_gets_plain_tensors() -> None:
    # as_torch_dataset() under a collating DataLoader must not hand the collate any wrapper.
    from torch.utils.data import DataLoader

    ds = dp.range(8).map(lambda i: torch.tensor([i])).as_torch_dataset()
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    assert sorted(int(x) for b in batches for x in b.flatten()) == list(range(8))


# ----- item types and shared storage through the hand-over -----------------------------------


class TaggedList(list):
    """A list subclass: a user's item type, with or without tensors inside."""


def tagged_list_item(x: int) -> TaggedList:
    return TaggedList([x, x + 1])


def shared_tensor_item(x: int) -> dict[str, Any]:
    t = torch.full((4,), float(x))
    return {"a": t, "b": t, "view": t[1:]}


class TaggedTuple(tuple):
    """A tuple subclass that carries an attribute (pickle keeps it: it has a ``__dict__``)."""


class Pair(tuple):
    """A tuple subclass built from its elements as separate arguments."""

    def __new__(cls, *items: Any) -> Pair:
        return super().__new__(cls, items)


def awkward_item(i: int) -> dict[str, Any]:
    tagged = TaggedTuple((torch.full((4,), float(i)), i))
    tagged.source = f"file-{i}"
    gray_chw = torch.arange(12, dtype=torch.uint8).reshape(1, 3, 4) + i
    return {
        "tagged": tagged,
        "pair": Pair(torch.full((3,), float(i)), torch.full((2,), float(i))),
        "hwc": gray_chw.permute(1, 2, 0),  # (3, 4, 1) with strides (4, 1, 12): a plain view
    }


@pytest.fixture(scope="module")
def through_workers() -> tuple[list[Any], list[Any]]:
    """The same items from ``num_workers=0`` and from ``num_workers=2`` (one run each)."""
    pipe = dp.range(4).map(awkward_item)
    in_workers = dp.Loader(pipe, num_workers=2, items_per_transfer=1)  # the same order
    return list(dp.Loader(pipe, num_workers=0)), list(in_workers)


@pytest.mark.slow
def test_item_types_survive_the_worker_hand_over() -> None:
    pipe = dp.range(2).map(tagged_list_item)
    in_process = list(dp.Loader(pipe))
    in_workers = list(dp.Loader(pipe, num_workers=1))
    assert [type(x) for x in in_process] == [TaggedList, TaggedList]
    assert [type(x) for x in in_workers] == [type(x) for x in in_process]


@pytest.mark.slow
def test_tensors_sharing_storage_still_share_after_the_worker_hand_over() -> None:
    (item,) = list(dp.Loader(dp.range(1).map(shared_tensor_item), num_workers=1))
    item["a"].add_(1)
    assert torch.equal(item["a"], item["b"])
    assert torch.equal(item["view"], item["a"][1:])


@pytest.mark.slow
def test_tuple_subclass_keeps_its_attributes_through_workers(
    through_workers: tuple[list[Any], list[Any]],
) -> None:
    plain, workers = through_workers
    assert [x["tagged"].source for x in plain] == [f"file-{i}" for i in range(4)]
    assert [getattr(x["tagged"], "source", None) for x in workers] == [
        x["tagged"].source for x in plain
    ]


def test_tuple_subclass_with_varargs_new_keeps_its_structure() -> None:
    """apply_to_tensors (to_device, the inline hand-over) builds it with tuple.__new__.

    (Sent to another process, such a class also needs ``__getnewargs__``: plain
    pickle rebuilds a tuple subclass as ``cls.__new__(cls, tuple(self))``, which
    this ``__new__`` would wrap once more. That is the class's pickling, not ours.)
    """
    pair = Pair(torch.zeros(3), torch.ones(2))
    moved = dp.Loader(dp.from_sequence([pair]).map(lambda p: p).to_device("cpu"))
    (got,) = list(moved)
    assert type(got) is Pair and len(got) == 2
    assert torch.equal(got[0], pair[0]) and torch.equal(got[1], pair[1])
    packed = inline_small_tensors(pair)
    assert type(packed) is Pair and len(packed) == 2


@pytest.mark.slow
def test_inline_tensors_keep_strides_of_size_one_dims(
    through_workers: tuple[list[Any], list[Any]],
) -> None:
    plain, workers = through_workers
    for a, b in zip(plain, workers):
        assert torch.equal(a["hwc"], b["hwc"]) and a["hwc"].dtype == b["hwc"].dtype
        assert b["hwc"].stride() == a["hwc"].stride()
