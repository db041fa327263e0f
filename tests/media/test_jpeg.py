"""JPEG backends: Pillow's pixels at full scale from every backend, header-only sizes,
reduced-scale decodes at the smallest DCT scale that keeps the asked size, clear errors.

References are computed by Pillow itself (``Image.open(...).convert(mode)``), the
decoder the library promises to match.
"""

from __future__ import annotations

import importlib.util
import io
import sys
import warnings
from functools import cache
from itertools import product

import numpy as np
import pytest
import torch
from PIL import Image

import datapipes as dp
from nodes.errors import BadRecordError
from nodes.media.decode import ImageDecoder, image_decoder
from nodes.media.jpeg import (
    _SIMPLEJPEG_EXACT,
    PILLOW_SCALES,
    SCALES,
    PillowJpeg,
    SimpleJpeg,
    dct_scale,
    is_jpeg,
    jpeg_backend,
    scaled_size,
)
from tests.jpeg_fixtures import jpeg_bytes, natural_image, png_bytes

HAS_SIMPLEJPEG = importlib.util.find_spec("simplejpeg") is not None
needs_simplejpeg = pytest.mark.skipif(
    not HAS_SIMPLEJPEG, reason="simplejpeg is not installed (pip install 'datapipes-torch[jpeg]')"
)
BACKENDS = ("pillow", "auto", *(("simplejpeg",) if HAS_SIMPLEJPEG else ()))

#: Every layout the encoder makes: 4:2:0, 4:2:2, 4:4:4, progressive, restart markers,
#: grayscale, CMYK (which simplejpeg hands to Pillow), low and top quality.
VARIANTS = {
    "420": {"subsampling": 2},
    "422": {"subsampling": 1},
    "444": {"subsampling": 0},
    "progressive": {"progressive": True},
    "restart markers": {"restart_marker_blocks": 2},
    "progressive 444": {"progressive": True, "subsampling": 0},
    "gray": {"mode": "L"},
    "cmyk": {"mode": "CMYK"},
    "q20": {"quality": 20},
    "q100": {"quality": 100, "subsampling": 0},
}
#: Sizes that are and are not multiples of the 16-pixel MCU.
SIZES = [(48, 64), (37, 53), (17, 101), (375, 500)]


@cache
def encoded(variant: str, height: int, width: int, seed: int = 0) -> bytes:
    options = dict(VARIANTS[variant])
    return jpeg_bytes(natural_image(height, width, seed=seed), **options)


def pillow_pixels(data: bytes, mode: str | None = "RGB") -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        image = image.convert(mode) if mode is not None and image.mode != mode else image
        array = np.array(image)
    return array if array.ndim == 3 else array[:, :, None]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_full_scale_pixels_are_pillows(backend, variant):
    decode = image_decoder("hwc", "RGB", backend)
    for (height, width), seed in product(SIZES, range(2)):
        data = encoded(variant, height, width, seed)
        ours = decode(data)
        assert ours.dtype == torch.uint8 and ours.shape == (height, width, 3)
        assert np.array_equal(ours.numpy(), pillow_pixels(data)), (variant, height, width, seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["L", None, "RGBA"])
def test_other_modes_are_pillows(backend, mode):
    decode = image_decoder("chw", mode, backend)
    for variant in ("420", "gray", "cmyk"):
        data = encoded(variant, 37, 53)
        expected = torch.from_numpy(pillow_pixels(data, mode)).permute(2, 0, 1)
        assert torch.equal(decode(data), expected), (variant, mode)


@needs_simplejpeg
def test_many_random_photos_decode_the_same_with_simplejpeg():
    rng = np.random.default_rng(7)
    decode = image_decoder("hwc", "RGB", "simplejpeg")
    for seed in range(24):
        height, width = (int(n) for n in rng.integers(8, 200, 2))
        options = {"quality": int(rng.integers(30, 101)), "subsampling": int(rng.integers(0, 3))}
        data = jpeg_bytes(natural_image(height, width, seed=seed), **options)
        assert np.array_equal(decode(data).numpy(), pillow_pixels(data)), (seed, options)


@needs_simplejpeg
def test_the_claimed_layouts_go_through_simplejpeg_and_the_others_to_pillow():
    import simplejpeg

    claimed = set(VARIANTS) - {"cmyk"}
    for variant in VARIANTS:
        data = encoded(variant, 48, 64)
        layout = (*simplejpeg.decode_jpeg_header(data)[2:], "RGB")
        assert (layout in _SIMPLEJPEG_EXACT) == (variant in claimed), variant
    gray_to_l = (*simplejpeg.decode_jpeg_header(encoded("gray", 8, 8))[2:], "L")
    assert gray_to_l in _SIMPLEJPEG_EXACT
    assert ("YCbCr", "420", "L") not in _SIMPLEJPEG_EXACT  # Pillow converts RGB to L itself


def test_png_named_jpg_and_other_formats_go_to_pillow():
    array = natural_image(20, 30)
    data = png_bytes(array)
    assert not is_jpeg(data) and is_jpeg(encoded("420", 20, 30))
    for backend in BACKENDS:
        sample = {"__key__": "a", "jpg": data}
        (out,) = dp.Loader(dp.from_sequence([sample]).decode(image_backend=backend))
        assert torch.equal(out["jpg"], torch.from_numpy(array).permute(2, 0, 1))


@needs_simplejpeg
def test_header_only_size():
    data = encoded("420", 375, 500)
    header = data[:1000]  # no image data: the size must come from the header alone
    for backend in (PillowJpeg(), SimpleJpeg()):
        assert backend.size(data) == backend.size(header) == (375, 500)
    progressive = encoded("progressive", 37, 53)
    assert SimpleJpeg().size(progressive[:400]) == PillowJpeg().size(progressive) == (37, 53)


def test_dct_scale_is_the_smallest_allowed():
    rng = np.random.default_rng(0)
    for _ in range(500):
        height, width = (int(n) for n in rng.integers(1, 2000, 2))
        want_h, want_w = (int(n) for n in rng.integers(1, 1200, 2))
        for scales in (SCALES, PILLOW_SCALES):
            chosen = dct_scale(height, width, want_h, want_w, scales)
            fits = [
                e
                for e in scales
                if scaled_size(height, width, e)[0] >= want_h
                and scaled_size(height, width, e)[1] >= want_w
            ]
            assert chosen == (min(fits) if fits else 8)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "auto"])
@pytest.mark.parametrize("want", [(40, 40), (100, 150), (187, 250), (188, 251), (375, 500), 64])
def test_image_size_decodes_at_the_smallest_scale_that_is_big_enough(backend, want):
    jpeg = jpeg_backend(backend)
    data = encoded("420", 375, 500)
    want_h, want_w = (want, want) if isinstance(want, int) else want
    eighths = dct_scale(375, 500, want_h, want_w, jpeg.scales)
    (out,) = dp.Loader(
        dp.from_sequence([{"jpg": data}]).decode(image_size=want, image_backend=backend)
    )
    height, width = out["jpg"].shape[1:]
    assert (height, width) == scaled_size(375, 500, eighths)
    assert height >= want_h and width >= want_w
    smaller = [e for e in jpeg.scales if e < eighths]
    if smaller:  # the next smaller scale would be too small
        h, w = scaled_size(375, 500, max(smaller))
        assert h < want_h or w < want_w


@needs_simplejpeg
def test_reduced_scales_of_the_two_backends_agree_where_both_have_them():
    data = encoded("420", 375, 500)
    for eighths in (1, 2, 4):
        ours, used = SimpleJpeg().decode(data, "RGB", eighths)
        theirs, used_too = PillowJpeg().decode(data, "RGB", eighths)
        assert used == used_too == eighths
        assert np.array_equal(ours, theirs), eighths


@needs_simplejpeg
def test_simplejpeg_scales_pillow_lacks_fall_back_to_the_next_larger():
    cmyk = encoded("cmyk", 375, 500)  # Pillow decodes it, at a power of two
    array, eighths = SimpleJpeg().decode(cmyk, "RGB", 3)
    assert eighths == 4 and array.shape[:2] == scaled_size(375, 500, 4)


def test_reduced_decode_of_a_non_jpeg_is_full_size():
    array = natural_image(60, 80)
    decoded = ImageDecoder("chw", "RGB", "auto", (10, 10))(png_bytes(array))
    assert torch.equal(decoded, torch.from_numpy(array).permute(2, 0, 1))


def test_image_size_with_pil_layout_drafts_too():
    data = encoded("420", 375, 500)
    image = ImageDecoder("pil", "RGB", "auto", (90, 120))(data)
    assert image.size == (125, 94)  # 2/8 is Pillow's smallest fitting scale: 1/4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "damage", ["truncated", "cut in the header", "garbage after SOI", "zeroed scan"]
)
def test_damaged_jpegs_are_bad_records_naming_key_and_field(backend, damage):
    data = encoded("420", 48, 64)
    bad = {
        "truncated": data[: len(data) // 2],
        "cut in the header": data[:40],
        "garbage after SOI": data[:3] + bytes(200),
        "zeroed scan": data[:-300] + bytes(298) + data[-2:],
    }[damage]
    samples = [{"__key__": "good", "jpg": data}, {"__key__": "bad-one", "jpg": bad}]
    pipe = dp.from_sequence(samples).decode(image_backend=backend)
    try:
        pillow_pixels(bad)
        pillow_refuses = False
    except Exception:  # noqa: BLE001 - any refusal of Pillow's: ours must refuse too
        pillow_refuses = True
    if not pillow_refuses:  # a damage Pillow decodes anyway: so do we, the same pixels
        out = list(dp.Loader(pipe))
        assert np.array_equal(out[1]["jpg"].permute(1, 2, 0).numpy(), pillow_pixels(bad))
        return
    with pytest.raises(BadRecordError, match=r"'bad-one'.*'jpg'"):
        list(dp.Loader(pipe))
    skipping = dp.Loader(dp.from_sequence(samples).decode(image_backend=backend, on_error="skip"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = list(skipping)
    assert [s["__key__"] for s in kept] == ["good"] and sum(skipping.skipped().values()) == 1


def test_bad_arguments_are_refused_when_the_recipe_is_made():
    pipe = dp.from_sequence([{"jpg": b""}])
    with pytest.raises(ValueError, match="image_backend must be one of"):
        pipe.decode(image_backend="turbo")
    for size in (0, (10,), (10, -1), "224", (1.5, 2)):
        with pytest.raises(ValueError, match="image_size must be"):
            pipe.decode(image_size=size)
    with pytest.raises(ValueError, match="image is None"):
        pipe.decode(image=None, image_size=10)


def test_missing_simplejpeg_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # what an absent package imports as
    with pytest.raises(ImportError, match=r"datapipes-torch\[jpeg\]"):
        dp.from_sequence([{"jpg": b""}]).decode(image_backend="simplejpeg")
    assert isinstance(jpeg_backend("auto"), PillowJpeg)  # auto: Pillow without simplejpeg


def test_recipe_repr_and_identity_keep_the_new_options():
    pipe = dp.range(1).decode(image_size=224, image_backend="pillow")
    assert repr(pipe) == "dp.range(1).decode(image_size=(224, 224), image_backend='pillow')"
    assert pipe.fingerprint() != dp.range(1).decode().fingerprint()
    assert repr(dp.range(1).decode()) == "dp.range(1).decode()"


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "auto"])
def test_the_scale_a_decode_reports_is_the_one_it_used_even_for_tiny_images(backend):
    jpeg = jpeg_backend(backend)
    for height, width in [(1, 1), (3, 5), (7, 9), (9, 17), (15, 8), (64, 48)]:
        data = jpeg_bytes(natural_image(height, width))
        for eighths in (1, 2, 3, 4, 8):
            array, used = jpeg.decode(data, "RGB", eighths)
            assert array.shape[:2] == scaled_size(height, width, used), (height, width, eighths)
            assert used in jpeg.scales or used < eighths  # Pillow: an image under 8 px wide


@pytest.mark.parametrize("backend", BACKENDS)
def test_decompression_bombs_are_refused_as_pillow_refuses_them(backend, monkeypatch):
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # a 48x64 image is then a bomb
    samples = [{"__key__": "big", "jpg": encoded("420", 48, 64)}]
    for crop in (False, True):
        pipe = dp.from_sequence(samples).decode(image_backend=backend)
        if crop:
            pipe = pipe.random_resized_crop(8)
        with pytest.raises(BadRecordError, match="'big'.*DecompressionBombError"):
            list(dp.Loader(pipe))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # over the limit, under twice it
    with pytest.warns(Image.DecompressionBombWarning):
        list(dp.Loader(dp.from_sequence(samples).decode(image_backend=backend)))
