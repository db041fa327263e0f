"""Decoding onto a device: ``decode(device=...)`` (whole images, in the main process) and
``random_resized_crop(on_device=True)`` + ``to_device()`` (boxes drawn in the workers, the
JPEGs decoded and cropped in batches on the device). On the CPU the same code path runs
through nvImageCodec's CPU decoder, whose pixels are Pillow's, so the crops must equal the
unfused CPU crops exactly; the CUDA tests run where there is a GPU
(``benchmarks/gpu_check.sh``)."""

from __future__ import annotations

import importlib.util
import warnings
from itertools import islice
from typing import Any

import pytest
import torch

import datapipes as dp
from nodes.media.device_jpeg import EncodedCrop, check_device, decode_crops
from nodes.testing import roundtrip_state
from tests.file_fixtures import write_tar
from tests.jpeg_fixtures import jpeg_bytes, natural_image, png_bytes

warnings.filterwarnings("ignore", message="This DataLoader will create")


def _has_nvimgcodec() -> bool:
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ImportError:
        return False


pytestmark = pytest.mark.skipif(
    not _has_nvimgcodec(),
    reason="nvImageCodec is not installed (pip install 'datapipes-torch[jpeg-region]')",
)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA (benchmarks/gpu_check.sh)")


def sample(i: int, **options: Any) -> dict[str, Any]:
    return {
        "__key__": f"s{i:03d}",
        "jpg": jpeg_bytes(natural_image(72, 96, seed=i), **options),
        "cls": str(i % 10).encode(),
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory: Any) -> str:
    root = tmp_path_factory.mktemp("device-shards")
    for f in range(5):
        samples = [sample(4 * f + j) for j in range(4)]
        if f == 2:  # grayscale, progressive and 4:4:4 JPEGs among them
            samples[1] = sample(4 * f + 1, mode="L")
            samples[2] = sample(4 * f + 2, progressive=True)
            samples[3] = sample(4 * f + 3, subsampling=0)
        write_tar(root, f"part-{f}.tar", samples)
    return str(root / "part-*.tar")


def images_by_key(batches: Any, field: str = "jpg") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for batch in batches:
        keys = batch["__key__"]
        for key, image in zip(keys, batch[field]):
            assert key not in out, f"{key} came twice"
            out[key] = image.cpu()
    return out


def same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def crops(pattern: str, device: str | None = "cpu", **crop: Any) -> dp.DataPipe[Any]:
    pipe = dp.files(pattern).shuffle().read_tar().decode()
    pipe = pipe.random_resized_crop(20, **crop).batch(3)
    return pipe.to_device(device) if crop.get("on_device") else pipe


# ----- decode(device=...) ---------------------------------------------------------------------


def test_decode_on_the_cpu_device_gives_pillows_pixels(shards):
    pipe = dp.files(shards).read_tar().decode().batch(1, collate_fn=dp.no_collate)
    on_device = dp.files(shards).read_tar().decode(device="cpu").batch(1, collate_fn=dp.no_collate)
    plain = [s for batch in dp.Loader(pipe) for s in batch]
    moved = [s for batch in dp.Loader(on_device) for s in batch]
    assert [s["__key__"] for s in moved] == [s["__key__"] for s in plain]
    for a, b in zip(moved, plain):
        assert a["jpg"].dtype == torch.uint8 and torch.equal(a["jpg"], b["jpg"]), a["__key__"]
    png = {"__key__": "p", "png": png_bytes(natural_image(30, 40, seed=1))}
    (decoded,) = dp.Loader(dp.from_sequence([png]).decode(device="cpu"))
    assert torch.equal(
        decoded["png"], torch.from_numpy(natural_image(30, 40, seed=1)).permute(2, 0, 1)
    )


def test_decode_on_a_device_runs_in_the_main_process():
    pipe = dp.range(3).map(lambda i: {"jpg": jpeg_bytes(natural_image(8, 8))}).decode(device="cpu")
    assert pipe.main_process_only
    assert not dp.range(3).decode().main_process_only
    assert repr(pipe).endswith(".decode(device='cpu')")


@pytest.mark.slow
def test_decode_on_a_device_after_two_workers(shards):
    pipe = dp.files(shards).read_tar().decode(device="cpu").batch(1, collate_fn=dp.no_collate)
    one = {s["__key__"]: s for b in dp.Loader(pipe, seed=0) for s in b}
    two = {s["__key__"]: s for b in dp.Loader(pipe, seed=0, num_workers=2) for s in b}
    assert one.keys() == two.keys() and len(one) == 20
    for key, s in one.items():
        assert torch.equal(s["jpg"], two[key]["jpg"])


def test_decode_device_arguments_are_checked_when_the_recipe_is_made():
    with pytest.raises(ValueError, match="on 'cuda' \\(nvJPEG\\) or 'cpu', got 'meta'"):
        dp.range(1).decode(device="meta")
    with pytest.raises(ValueError, match="image must be 'chw'"):
        dp.range(1).decode(device="cpu", image="hwc")
    with pytest.raises(ValueError, match="leave image_size out"):
        dp.range(1).decode(device="cpu", image_size=32)
    with pytest.raises(ValueError, match=r"on_device=True\)\.batch\(n\)\.to_device\('cpu'\)"):
        dp.range(1).decode(device="cpu").random_resized_crop(16)
    with pytest.raises(ValueError, match="right after decode\\(\\), with fused=True"):
        dp.range(1).random_resized_crop(16, on_device=True)
    with pytest.raises(ValueError, match="right after decode\\(\\), with fused=True"):
        dp.range(1).decode().random_resized_crop(16, on_device=True, fused=False)
    with pytest.raises(TypeError, match="on_device must be True or False"):
        dp.range(1).decode().random_resized_crop(16, on_device=1)


@pytest.mark.skipif(CUDA, reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_says_what_to_do():
    with pytest.raises(RuntimeError, match=r"needs CUDA.*leave device out.*\.to_device\(\)"):
        dp.range(1).decode(device="cuda")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        check_device("cuda:0")


# ----- random_resized_crop(on_device=True) + to_device() ------------------------------------


def test_on_device_crops_are_the_unfused_crops_exactly(shards):
    want = images_by_key(dp.Loader(crops(shards, fused=False), seed=3))
    got = images_by_key(dp.Loader(crops(shards, on_device=True), seed=3))
    assert same(got, want) and len(want) == 20
    assert all(image.shape == (3, 20, 20) for image in got.values())
    # to_device() with no device names the current CUDA device, else decodes on the CPU
    anywhere = images_by_key(dp.Loader(crops(shards, None, on_device=True), seed=3))
    assert same(anywhere, want) or CUDA


def test_on_device_crops_leave_pngs_to_the_cpu_path(tmp_path):
    samples = [sample(0), {"__key__": "p", "jpg": png_bytes(natural_image(72, 96)), "cls": b"1"}]
    write_tar(tmp_path, "mixed.tar", samples)
    pattern = str(tmp_path / "mixed.tar")
    want = images_by_key(dp.Loader(crops(pattern, fused=False), seed=1))
    got = images_by_key(dp.Loader(crops(pattern, on_device=True), seed=1))
    assert same(got, want)


def test_without_to_device_the_items_say_what_they_are(shards):
    pipe = dp.files(shards).read_tar().decode().random_resized_crop(20, on_device=True)
    item = next(iter(dp.Loader(pipe, seed=0)))
    assert type(item["jpg"]) is EncodedCrop
    assert ".to_device() decodes it" in repr(item["jpg"])


def test_on_device_crops_resume_mid_epoch(shards):
    pipe = crops(shards, on_device=True)
    reference = images_by_key(dp.Loader(pipe, seed=4))
    for stop in (0, 2, 5):
        loader = dp.Loader(pipe, seed=4)
        head = list(islice(iter(loader), stop))
        state = roundtrip_state(loader.state_dict())
        loader.close()
        resumed = dp.Loader(pipe, seed=4)
        resumed.load_state_dict(state)
        assert same(images_by_key(head + list(resumed)), reference), stop
        resumed.close()


def test_on_device_crops_after_an_elastic_resume(shards):
    pipe = crops(shards, on_device=True)
    whole = images_by_key(dp.Loader(pipe, seed=2))
    old = [dp.Loader(pipe, seed=2, rank=r, world_size=2) for r in range(2)]
    taken: list[Any] = []
    for loader, count in zip(old, [1, 2]):
        taken.extend(islice(iter(loader), count))
    merged = dp.merge_states([loader.state_dict() for loader in old])
    for loader in old:
        loader.close()
    for rank in range(3):
        new = dp.Loader(pipe, seed=2, rank=rank, world_size=3)
        new.load_state_dict(roundtrip_state(merged))
        taken.extend(new)
        new.close()
    assert same(images_by_key(taken), whole)


@pytest.mark.slow
def test_on_device_crops_at_0_and_2_workers_and_after_a_resume(shards):
    pipe = crops(shards, on_device=True)
    reference = images_by_key(dp.Loader(pipe, seed=8))
    assert same(images_by_key(dp.Loader(pipe, seed=8, num_workers=2)), reference)
    loader = dp.Loader(pipe, seed=8, num_workers=2)
    head = list(islice(iter(loader), 3))
    state = roundtrip_state(loader.state_dict())
    loader.close()
    resumed = dp.Loader(pipe, seed=8, num_workers=2)
    resumed.load_state_dict(state)
    assert same(images_by_key(head + list(resumed)), reference)
    resumed.close()


def test_a_damaged_jpeg_is_named_when_to_device_cannot_decode_it(tmp_path):
    samples = [sample(i) for i in range(4)]
    samples[2]["jpg"] = samples[2]["jpg"][:1500]  # the header survives, the data does not
    write_tar(tmp_path, "bad.tar", samples)
    pipe = crops(str(tmp_path / "bad.tar"), on_device=True)
    with pytest.raises(ValueError, match=r"could not decode the JPEG of sample 's002', field"):
        list(dp.Loader(pipe, seed=0))


def test_decode_crops_stacks_a_batch_on_the_device():
    data = jpeg_bytes(natural_image(40, 50, seed=5))
    batch = [EncodedCrop(data, (0, 0, 40, 50), False, 8), torch.zeros(3, 8, 8, dtype=torch.uint8)]
    out = decode_crops(batch, torch.device("cpu"))
    assert out.shape == (2, 3, 8, 8) and out.dtype == torch.uint8
    assert torch.equal(out[1], torch.zeros(3, 8, 8, dtype=torch.uint8))


# ----- on a GPU -------------------------------------------------------------------------------


@needs_cuda
def test_cuda_decode_is_close_to_pillows_pixels(shards):
    pipe = dp.files(shards).read_tar().decode().batch(1, collate_fn=dp.no_collate)
    on_gpu = dp.files(shards).read_tar().decode(device="cuda").batch(1, collate_fn=dp.no_collate)
    plain = {s["__key__"]: s for b in dp.Loader(pipe) for s in b}
    for batch in dp.Loader(on_gpu):
        for s in batch:
            image = s["jpg"]
            assert image.is_cuda and image.dtype == torch.uint8
            diff = (image.cpu().int() - plain[s["__key__"]]["jpg"].int()).abs()
            assert diff.float().mean() < 1.0 and diff.max() <= 16, (s["__key__"], diff.max())


@needs_cuda
def test_cuda_crops_are_close_to_the_cpu_crops_and_on_the_gpu(shards):
    want = images_by_key(dp.Loader(crops(shards, fused=False), seed=3))
    batches = list(dp.Loader(crops(shards, "cuda", on_device=True), seed=3))
    assert all(b["jpg"].is_cuda and b["jpg"].shape[1:] == (3, 20, 20) for b in batches)
    got = images_by_key(batches)
    assert got.keys() == want.keys()
    for key in want:
        diff = (got[key].int() - want[key].int()).abs()
        assert diff.float().mean() < 2.0, (key, diff.float().mean())
