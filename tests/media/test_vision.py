"""random_resized_crop: seeded per item (same pixels at any workers, ranks, after a resume),
fused with decode (same boxes; the same pixels where no DCT reduction applies), on threads
(the same pixels), and bad images as bad records naming the sample and field.
"""

from __future__ import annotations

import io
import math
import threading
import warnings
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch

import datapipes as dp
from nodes import Context
from nodes.errors import BadRecordError
from nodes.media.crop_boxes import DRAWS, CropParams, MixedSizesError, centre_box, draw_crop
from nodes.media.crops import ResizedCrop
from nodes.media.intra_op import one_thread, openmp_runtime
from nodes.steps.random_map import RandomMapError
from nodes.steps.transforms import MapNode
from nodes.testing import check_node, roundtrip_state
from tests.file_fixtures import write_tar
from tests.jpeg_fixtures import jpeg_bytes, natural_image, png_bytes

warnings.filterwarnings("ignore", message="This DataLoader will create")

HEIGHT, WIDTH = 96, 128
#: No crop box of a 96x128 image keeps 64 pixels at 4/8 scale: fused decodes full size.
NO_REDUCTION = 64
#: Most boxes keep 16 pixels at a reduced scale: fused decodes smaller.
REDUCED = 16


def jpeg_sample(i: int, **options: Any) -> dict[str, Any]:
    image = natural_image(HEIGHT, WIDTH, seed=i)
    return {
        "__key__": f"s{i:03d}",
        "jpg": jpeg_bytes(image, **options),
        "cls": str(i % 10).encode(),
        "json": b'{"i": %d}' % i,
    }


def write_shards(tmp_path: Any, files: int = 6, per_file: int = 4) -> str:
    for f in range(files):
        samples = [jpeg_sample(f * per_file + j) for j in range(per_file)]
        if f == 1:  # a grayscale and a progressive JPEG among them
            samples[2] = jpeg_sample(f * per_file + 2, mode="L")
            samples[3] = jpeg_sample(f * per_file + 3, progressive=True)
        write_tar(tmp_path, f"part-{f}.tar", samples)
    return str(tmp_path / "part-*.tar")


def recipe(pattern: str, size: int = REDUCED, **crop: Any) -> dp.DataPipe[Any]:
    decode = crop.pop("decode", {})
    return dp.files(pattern).shuffle().read_tar().decode(**decode).random_resized_crop(size, **crop)


def by_key(samples: Any) -> dict[str, tuple[int, bytes]]:
    """key -> (label, the crop's bytes), checking that no key came twice."""
    out: dict[str, tuple[int, bytes]] = {}
    for sample in samples:
        key = sample["__key__"]
        assert key not in out, f"{key} came twice"
        out[key] = (sample["cls"], sample["jpg"].numpy().tobytes())
    return out


def pixels(samples: Any) -> dict[str, torch.Tensor]:
    return {s["__key__"]: s["jpg"] for s in samples}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: Any) -> str:
    return write_shards(tmp_path_factory.mktemp("shards"))


# ----- the draws ------------------------------------------------------------------------------


def test_draws_follow_random_resized_crop():
    params = CropParams(8)
    rng = np.random.default_rng(0)
    areas, ratios, flips = [], [], 0
    for _ in range(2000):
        (top, left, h, w), flip = draw_crop(rng, 60, 90, params)
        assert 0 <= top and top + h <= 60 and 0 <= left and left + w <= 90
        areas.append(h * w / (60 * 90))
        ratios.append(w / h)
        flips += flip
    # rounding to whole pixels moves the bounds a little; large boxes of other aspects do
    # not fit the image and are drawn again (the mean area is below scale's mid-point)
    assert 0.07 < min(areas) and max(areas) <= 1.0 and 0.3 < np.mean(areas) < 0.55
    assert 0.7 < min(ratios) and max(ratios) < 1.4
    assert 900 < flips < 1100  # flip = 0.5


def test_draws_fall_back_to_the_centre_crop_after_ten_misses():
    params = CropParams(8, scale=(1.0, 1.0), ratio=(2.0, 3.0))  # never fits a square image
    (box, _), expected = draw_crop(np.random.default_rng(1), 50, 50, params), (12, 0, 25, 50)
    assert box == expected == centre_box(50, 50, (2.0, 3.0))
    assert centre_box(40, 100, (0.75, 4 / 3)) == (0, 23, 40, 53)
    assert centre_box(40, 50, (0.75, 4 / 3)) == (0, 0, 40, 50)


def test_every_item_draws_the_same_number_of_uniforms():
    for ratio in ((0.75, 4 / 3), (2.0, 3.0)):  # found at once, or after ten misses
        rng = np.random.default_rng(3)
        draw_crop(rng, 50, 50, CropParams(8, scale=(1.0, 1.0), ratio=ratio))
        fresh = np.random.default_rng(3)
        fresh.random(DRAWS)
        assert rng.random() == fresh.random()


def test_flip_only_mirrors_the_same_box():
    image = torch.from_numpy(natural_image(50, 70)).permute(2, 0, 1).contiguous()
    for seed in range(5):
        crops = {
            flip: ResizedCrop(CropParams(20, flip=flip), None)(image, np.random.default_rng(seed))
            for flip in (0.0, 1.0)
        }
        assert torch.equal(crops[1.0], crops[0.0].flip(-1))


# ----- outputs --------------------------------------------------------------------------------


def test_crops_are_uint8_chw_and_other_fields_are_decoded_as_decode_does(shards):
    out = list(dp.Loader(recipe(shards), seed=1))
    assert len(out) == 24
    for sample in out:
        assert sample["jpg"].dtype == torch.uint8 and sample["jpg"].shape == (3, 16, 16)
        i = int(sample["__key__"][1:])
        assert sample["cls"] == i % 10 and sample["json"] == {"i": i}
        assert sample["__url__"].endswith(".tar")


def test_gray_jpegs_give_three_channels_or_one_with_image_mode_l(tmp_path):
    write_tar(tmp_path, "g.tar", [jpeg_sample(0, mode="L"), jpeg_sample(1)])
    pattern = str(tmp_path / "g.tar")
    for fused in (True, False):
        rgb = list(dp.Loader(recipe(pattern, fused=fused)))
        gray = list(dp.Loader(recipe(pattern, fused=fused, decode={"image_mode": "L"})))
        assert [s["jpg"].shape[0] for s in rgb] == [3, 3]
        assert [s["jpg"].shape[0] for s in gray] == [1, 1]
        channels = rgb[0]["jpg"]
        assert torch.equal(channels[0], channels[1]) and torch.equal(channels[1], channels[2])


def test_tensor_items_are_cropped():
    images = [torch.from_numpy(natural_image(40, 60, seed=i)).permute(2, 0, 1) for i in range(4)]
    out = list(dp.Loader(dp.from_sequence(images).random_resized_crop(24, seed=2)))
    assert [tuple(x.shape) for x in out] == [(3, 24, 24)] * 4
    assert all(x.is_contiguous() for x in out)


def test_one_box_for_all_image_fields_of_a_sample():
    image = natural_image(40, 60)
    sample = {"__key__": "a", "a.png": png_bytes(image), "b.png": png_bytes(image)}
    for fused in (True, False):
        (out,) = dp.Loader(dp.from_sequence([sample]).decode().random_resized_crop(20, fused=fused))
        assert torch.equal(out["a.png"], out["b.png"])
    other = {**sample, "b.png": png_bytes(natural_image(30, 60))}
    for fused in (True, False):
        pipe = dp.from_sequence([other]).decode().random_resized_crop(20, fused=fused)
        with pytest.raises(MixedSizesError, match="'b.png' is 30x60"):
            list(dp.Loader(pipe))


def test_fields_pick_the_images_to_crop():
    image = natural_image(40, 60)
    sample = {"__key__": "a", "jpg": jpeg_bytes(image), "mask.png": png_bytes(image)}
    for fused in (True, False):
        pipe = (
            dp.from_sequence([sample]).decode().random_resized_crop(20, fields="jpg", fused=fused)
        )
        (out,) = dp.Loader(pipe)
        assert out["jpg"].shape == (3, 20, 20) and out["mask.png"].shape == (3, 40, 60)
        missing = dp.from_sequence([sample]).decode().random_resized_crop(20, fields=["seg"])
        with pytest.raises(KeyError, match="no field 'seg'"):
            list(dp.Loader(missing))


def test_images_not_decoded_to_chw_tensors_are_refused_saying_why():
    sample = {"__key__": "a", "jpg": jpeg_bytes(natural_image(40, 60))}
    for layout in ("pil", "hwc"):
        with pytest.raises(ValueError, match=f"makes image='{layout}'"):
            dp.from_sequence([sample]).decode(image=layout).random_resized_crop(20)
    hwc = dp.from_sequence([sample]).decode(image="hwc").map(lambda s: s)
    with pytest.raises(TypeError, match=r"shaped \(40, 60, 3\), which looks like \(H, W, C\)"):
        list(dp.Loader(hwc.random_resized_crop(20)))
    as_bytes = dp.from_sequence([sample]).decode(image=None).random_resized_crop(20)
    with pytest.raises(TypeError, match=r"uint8 \(C, H, W\) tensors.*field 'jpg' is bytes"):
        list(dp.Loader(as_bytes))
    floats = dp.from_sequence([torch.zeros(3, 8, 8)]).random_resized_crop(4)
    with pytest.raises(TypeError, match="the item is Tensor torch.float32"):
        list(dp.Loader(floats))


def test_bad_arguments_are_refused_when_the_recipe_is_made():
    pipe = dp.range(3)
    for kwargs, match in [
        ({"size": 0}, "size must be a positive int"),
        ({"size": 8, "scale": (0.5, 0.1)}, "scale must be"),
        ({"size": 8, "ratio": (0, 1)}, "ratio must be"),
        ({"size": 8, "scale": 3}, "scale must be a"),
        ({"size": 8, "flip": 1.5}, "flip is a probability"),
        ({"size": 8, "fields": []}, "fields must be field names"),
        ({"size": 8, "num_threads": 0}, "num_threads must be an int"),
    ]:
        with pytest.raises(ValueError, match=match):
            pipe.random_resized_crop(**kwargs)
    with pytest.raises(TypeError, match="seed must be an int"):
        pipe.random_resized_crop(8, seed="1")


def test_repr_lists_only_what_differs_from_the_defaults():
    pipe = dp.range(1).random_resized_crop(224, flip=0.0, num_threads=2, fused=False)
    assert repr(pipe) == (
        "dp.range(1).random_resized_crop(224, flip=0.0, fused=False, num_threads=2)"
    )


# ----- the same draws wherever the item is read -----------------------------------------------


def test_same_crops_for_the_same_seed_new_ones_for_a_new_epoch_or_seed(shards):
    loader = dp.Loader(recipe(shards), seed=1)
    first, second = by_key(loader), by_key(loader)
    assert first == by_key(dp.Loader(recipe(shards), seed=1))
    other_seed = by_key(dp.Loader(recipe(shards), seed=2))
    step_seed = by_key(dp.Loader(recipe(shards, seed=7), seed=1))
    for other in (second, other_seed, step_seed):
        assert other.keys() == first.keys()
        assert sum(other[k] != first[k] for k in first) >= len(first) - 1
        assert all(other[k][0] == first[k][0] for k in first)  # labels stay with their images


@pytest.mark.parametrize("variant", ["fused", "unfused", "threads", "unfused threads"])
def test_resume_mid_epoch_gives_the_same_pixels(shards, variant):
    crop = {
        "fused": {},
        "unfused": {"fused": False},
        "threads": {"num_threads": 2},
        "unfused threads": {"fused": False, "num_threads": 2},
    }[variant]
    pipe = recipe(shards, **crop)
    reference = list(dp.Loader(pipe, seed=4))
    for stop in (0, 5, 13, 24):
        loader = dp.Loader(pipe, seed=4)
        head = list(islice(iter(loader), stop))
        state = roundtrip_state(loader.state_dict())
        loader.close()
        resumed = dp.Loader(pipe, seed=4)
        resumed.load_state_dict(state)
        assert by_key(head + list(resumed)) == by_key(reference), stop
        resumed.close()


def test_threads_fusion_and_backend_change_how_not_what(shards):
    """Fused or not, on threads or not, any backend: the same boxes, so (no reduction here)
    the same pixels."""
    runs = [
        by_key(dp.Loader(recipe(shards, NO_REDUCTION, **crop), seed=3))
        for crop in (
            {},
            {"fused": False},
            {"num_threads": 2},
            {"fused": False, "num_threads": 3},
            {"decode": {"image_backend": "pillow"}},
        )
    ]
    assert all(run == runs[0] for run in runs[1:])


def test_fused_reduced_decodes_are_close_to_full_size_ones():
    # In memory (origins are positions, not file paths): the same boxes every run.
    pipe = dp.from_sequence([jpeg_sample(i) for i in range(24)]).decode()
    fused = pixels(dp.Loader(pipe.random_resized_crop(REDUCED), seed=5))
    unfused = pixels(dp.Loader(pipe.random_resized_crop(REDUCED, fused=False), seed=5))
    other_boxes = pixels(dp.Loader(pipe.random_resized_crop(REDUCED, fused=False), seed=6))
    diffs, unrelated = [], []
    for key, image in fused.items():
        diffs.append((image.float() - unfused[key].float()).abs().mean().item())
        unrelated.append((image.float() - other_boxes[key].float()).abs().mean().item())
    # of 255: the same boxes from a lower-resolution source (measured: mean 2.5-2.9, max up
    # to ~6 for the smallest boxes at 1/8 over many box draws)
    assert np.mean(diffs) < 3.5 and max(diffs) < 8.0, diffs
    assert np.mean(diffs) < np.mean(unrelated) / 5, (diffs, unrelated)
    assert sum(d > 0 for d in diffs) >= 12  # most boxes of these images allow a reduced decode


@pytest.mark.parametrize("crop", [{}, {"num_threads": 2}])
def test_same_pixels_across_world_sizes_and_after_an_elastic_resume(shards, crop):
    pipe = recipe(shards, **crop)
    whole = by_key(dp.Loader(pipe, seed=2))
    old = [dp.Loader(pipe, seed=2, rank=r, world_size=2) for r in range(2)]
    taken: list[Any] = []
    for loader, count in zip(old, [5, 9]):
        taken.extend(islice(iter(loader), count))
    merged = dp.merge_states([loader.state_dict() for loader in old])
    for loader in old:
        loader.close()
    for rank in range(3):
        new = dp.Loader(pipe, seed=2, rank=rank, world_size=3)
        new.load_state_dict(roundtrip_state(merged))
        taken.extend(new)
        new.close()
    assert by_key(taken) == whole


@pytest.mark.slow
@pytest.mark.parametrize("crop", [{}, {"num_threads": 2}, {"fused": False}])
def test_same_pixels_at_0_and_2_workers_and_after_a_resume_at_2(shards, crop):
    pipe = recipe(shards, **crop)
    reference = by_key(dp.Loader(pipe, seed=8))
    assert by_key(dp.Loader(pipe, seed=8, num_workers=2)) == reference
    loader = dp.Loader(pipe, seed=8, num_workers=2)
    head = list(islice(iter(loader), 11))
    state = roundtrip_state(loader.state_dict())
    loader.close()
    resumed = dp.Loader(pipe, seed=8, num_workers=2)
    resumed.load_state_dict(state)
    assert by_key(head + list(resumed)) == reference
    resumed.close()


# ----- bad images -----------------------------------------------------------------------------


@pytest.mark.parametrize("crop", [{}, {"fused": False}, {"num_threads": 2}])
def test_a_truncated_jpeg_is_a_bad_record_naming_key_and_field(tmp_path, crop):
    samples = [jpeg_sample(i) for i in range(6)]
    samples[3]["jpg"] = samples[3]["jpg"][:300]
    samples[4]["jpg"] = b"\xff\xd8\xff" + bytes(50)  # a JPEG start, then nothing
    write_tar(tmp_path, "bad.tar", samples)
    pattern = str(tmp_path / "bad.tar")
    with pytest.raises(BadRecordError, match=r"bad\.tar.*sample 's003', field 'jpg'"):
        list(dp.Loader(recipe(pattern, **crop)))
    pipe = recipe(pattern, decode={"on_error": "skip"}, **crop)
    loader = dp.Loader(pipe, seed=1)
    with pytest.warns(UserWarning, match="skipping a bad record"):
        kept = [s["__key__"] for s in loader]
    assert sorted(kept) == ["s000", "s001", "s002", "s005"]
    assert list(loader.skipped().values()) == [2]
    for stop in range(5):  # the count survives a resume wherever it is taken
        again = dp.Loader(pipe, seed=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            head = [s["__key__"] for s in islice(iter(again), stop)]
            resumed = dp.Loader(pipe, seed=1)
            resumed.load_state_dict(roundtrip_state(again.state_dict()))
            assert head + [s["__key__"] for s in resumed] == kept
        assert list(resumed.skipped().values()) == [2]


# ----- where it can and cannot go -------------------------------------------------------------


def test_random_map_after_the_threaded_crop_is_refused_and_after_the_plain_one_works(shards):
    def tag(sample: Any, rng: np.random.Generator) -> Any:
        return {**sample, "r": rng.random()}

    fine = recipe(shards).random_map(tag)
    assert len(list(dp.Loader(fine))) == 24
    with pytest.raises(RandomMapError, match="parallel map"):
        list(dp.Loader(recipe(shards, num_threads=2).random_map(tag)))


def summary(sample: dict[str, Any]) -> tuple[str, int, float]:
    return sample["__key__"], sample["cls"], float(sample["jpg"].float().mean())


@pytest.mark.parametrize("crop", [{}, {"num_threads": 2}])
def test_node_conformance(shards, crop):
    pipe = recipe(shards, **crop)
    report = check_node(lambda ctx: MapNode(pipe.build(ctx), summary), max_positions=6)
    assert report.positions_checked > 0


def test_the_fused_step_reads_the_decode_steps_input_not_its_output(shards):
    node = recipe(shards).build(Context())
    kinds = []
    while node.inputs:
        kinds.append(node.kind)
        node = node.inputs[0]
    assert kinds[:2] == ["decode", "random_map"] and kinds.count("decode") == 1
    unfused = recipe(shards, fused=False).build(Context())
    assert [unfused.kind, unfused.inputs[0].kind] == ["random_map", "decode"]


def test_output_area_matches_the_box_it_was_resized_from():
    """A flat image with one bright column: where it lands says which box was cut."""
    image = torch.zeros(1, 30, 40, dtype=torch.uint8)
    image[:, :, 20] = 255
    params = CropParams(10, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3), flip=0.0)
    out = ResizedCrop(params, None)(image, np.random.default_rng(0))
    column = int(out[0].float().mean(0).argmax())
    assert math.isclose(column, 20 / 40 * 10, abs_tol=1)  # the whole image (scale 1, ratio 4/3)


def test_per_item_torch_ops_run_on_one_thread_and_leave_the_callers_setting():
    if openmp_runtime() is None:
        pytest.skip("torch's OpenMP runtime was not found: calls run unchanged")
    before = torch.get_num_threads()
    torch.set_num_threads(max(2, before))
    try:
        assert one_thread(torch.get_num_threads) == 1
        assert torch.get_num_threads() == max(2, before)
        seen: list[int] = []
        other = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        other.start()
        other.join(10)
        assert not other.is_alive()
        assert seen[0] > 1  # other threads keep the process's count
    finally:
        torch.set_num_threads(before)


def test_the_stats_row_of_the_fused_step_names_the_decode_too(shards):
    loader = dp.Loader(recipe(shards), stats=True)
    assert len(list(loader)) == 24
    steps = [line.split("  ")[0] for line in str(loader.stats()).splitlines()[1:]]
    assert "decode() + random_resized_crop(16)" in steps and "decode()" not in steps
    unfused = dp.Loader(recipe(shards, fused=False), stats=True)
    list(unfused)
    steps = [line.split("  ")[0] for line in str(unfused.stats()).splitlines()[1:]]
    assert "decode()" in steps and "random_resized_crop(16, fused=False)" in steps


def crops_both_ways(samples: list[dict[str, Any]], size: int, **decode: Any) -> list[Any]:
    pipe = dp.from_sequence(samples).decode(**decode)
    return [
        list(dp.Loader(pipe.random_resized_crop(size, fused=fused), seed=3))
        for fused in (True, False)
    ]


def test_png_fields_fused_are_the_unfused_crops_exactly():
    samples = [
        {"__key__": f"p{i}", "png": png_bytes(natural_image(50, 70, seed=i))} for i in range(6)
    ]
    fused, unfused = crops_both_ways(samples, 12)
    assert all(torch.equal(a["png"], b["png"]) for a, b in zip(fused, unfused))


def test_one_channel_reduced_decodes_are_close_too():
    samples = [
        {"__key__": f"g{i}", "jpg": jpeg_bytes(natural_image(HEIGHT, WIDTH, seed=i, channels=1))}
        for i in range(8)
    ]
    fused, unfused = crops_both_ways(samples, REDUCED, image_mode="L")
    diffs = [
        (a["jpg"].float() - b["jpg"].float()).abs().mean().item() for a, b in zip(fused, unfused)
    ]
    assert all(a["jpg"].shape == (1, REDUCED, REDUCED) for a in fused)
    assert max(diffs) < 6.0 and sum(d > 0 for d in diffs) >= 4, diffs


def decode_to_chw(data: bytes) -> torch.Tensor:
    """A decoder of the user's: the fused step crops its tensors as they come."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)


def test_an_image_field_with_a_decoder_of_the_users_is_cropped_after_it():
    samples = [jpeg_sample(i) for i in range(4)]
    fused, unfused = crops_both_ways(samples, NO_REDUCTION, decoders={"jpg": decode_to_chw})
    assert all(torch.equal(a["jpg"], b["jpg"]) for a, b in zip(fused, unfused))
    assert all(a["jpg"].shape == (3, NO_REDUCTION, NO_REDUCTION) for a in fused)
