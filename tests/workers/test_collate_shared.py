"""Large batches collated in DataLoader workers go straight into shared memory, values unchanged."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import datapipes as dp
from nodes.testing import same
from nodes.workers import handover
from nodes.workers.handover import INLINE_TENSOR_BYTES, shared_batch

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

#: 16 CHW uint8 images of 3x128x128: 768 KiB a batch, over INLINE_TENSOR_BYTES
SHAPE = (3, 128, 128)
BATCH = 16


def chw_image(index: int) -> torch.Tensor:
    """A distinct uint8 image per index (as a decoder would make it)."""
    generator = torch.Generator().manual_seed(index)
    return torch.randint(0, 256, SHAPE, dtype=torch.uint8, generator=generator)


def hwc_array(index: int) -> np.ndarray:
    return chw_image(index).permute(1, 2, 0).numpy().copy()


def mixed_dtypes(index: int) -> torch.Tensor:
    image = chw_image(index)
    return image.float() if index % 4 >= 2 else image  # both workers' batches mix dtypes


def with_index(make: Any) -> Any:
    return dp.range(BATCH * 4 + 4).map(lambda i: {"index": i, "image": make(i)})


def where_made(batch: dict[str, Any]) -> dict[str, Any]:
    """Runs in the worker, after the collate: was the batch made in shared memory?"""
    return {**batch, "shared_in_worker": batch["image"].is_shared()}


def check_batches(got: list[dict[str, Any]], make: Any) -> None:
    """Each batch holds exactly the images of its indices, stacked as in this process;
    the ones over INLINE_TENSOR_BYTES were made in shared memory, the others not."""
    assert sorted(i for item in got for i in item["index"].tolist()) == list(range(BATCH * 4 + 4))
    for item in got:
        images = [make(i) for i in item["index"].tolist()]
        assert same(item["image"], dp.default_collate(images))
        large = item["image"].nbytes > INLINE_TENSOR_BYTES
        assert item["shared_in_worker"] == large, item["index"]


def test_in_the_main_process_a_batch_stays_in_ordinary_memory() -> None:
    assert shared_batch((BATCH, *SHAPE), torch.uint8) is None
    batch = dp.default_collate([chw_image(i) for i in range(BATCH)])
    assert batch.nbytes > INLINE_TENSOR_BYTES and not batch.is_shared()
    assert torch.equal(batch[3], chw_image(3))
    arrays = dp.default_collate([hwc_array(i) for i in range(BATCH)])
    assert not arrays.is_shared() and torch.equal(arrays[5], chw_image(5).permute(1, 2, 0))


def test_different_shapes_still_raise_the_error_naming_the_field() -> None:
    samples = [{"image": chw_image(0)}, {"image": chw_image(1)[:, :64]}]
    with pytest.raises(ValueError, match=r"different shapes .*samples\['image'\]"):
        dp.default_collate(samples)


@pytest.mark.slow
@pytest.mark.parametrize("make", [chw_image, hwc_array], ids=["tensors", "numpy arrays"])
def test_a_large_batch_is_collated_in_shared_memory_and_arrives_equal(make: Any) -> None:
    pipe = with_index(make).batch(BATCH).map(where_made)
    in_process = list(dp.Loader(pipe))
    assert not any(item["shared_in_worker"] for item in in_process)
    got = list(dp.Loader(pipe, num_workers=2))
    check_batches(got, make)
    # 34 images per worker: two full batches each (shared memory), a short one (inline)
    assert [item["shared_in_worker"] for item in got] == [True] * 4 + [False] * 2
    # the main process holds ordinary tensors: readable, writable, in torch's own layout
    batches = [item["image"] for item in got]
    for batch in batches:
        assert type(batch) is torch.Tensor and batch.dtype == torch.uint8
        assert batch.is_contiguous()
        batch[0, 0] += 1  # writable in place
        assert batch.clone().resize_(1).shape == (1,)  # a copy is ordinary memory
    with pytest.raises(RuntimeError, match="not resizable"):  # as torch DataLoader batches
        batches[0].resize_(batches[0].numel() + 1)


@pytest.mark.slow
def test_small_and_mixed_batches_in_workers_are_collated_as_before() -> None:
    small = with_index(chw_image).batch(2).map(where_made)  # 96 KiB a batch: inline
    got = list(dp.Loader(small, num_workers=2))
    check_batches(got, chw_image)
    assert not any(item["shared_in_worker"] for item in got)
    mixed = with_index(mixed_dtypes).batch(BATCH)  # uint8 and float32: stack promotes
    for item in dp.Loader(mixed, num_workers=2):
        images = [mixed_dtypes(i) for i in item["index"].tolist()]
        assert item["image"].dtype == torch.float32
        assert same(item["image"], torch.stack(images))


@pytest.mark.slow
def test_a_worker_keeps_few_shared_batches_alive_then_uses_ordinary_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Forked workers inherit the lower limit; 6 large batches per worker wait in the
    # shuffle buffer at once, so the ones past the limit are made in ordinary memory.
    monkeypatch.setattr(handover, "MAX_LIVE_SHARED_BATCHES", 2)
    pipe = dp.range(BATCH * 12).map(lambda i: {"index": i, "image": chw_image(i)})
    pipe = pipe.batch(BATCH).shuffle(6).map(where_made)
    got = list(dp.Loader(pipe, num_workers=2))
    shared = [item["shared_in_worker"] for item in got]
    assert 0 < sum(shared) < len(shared) == 12
    for item in got:  # wherever it was made, each batch holds its images
        images = [chw_image(i) for i in item["index"].tolist()]
        assert same(item["image"], torch.stack(images))
