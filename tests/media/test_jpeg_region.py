"""Region decode (nvImageCodec's CPU decoder, the ``jpeg-region`` extra): Pillow's pixels
cut to the box exactly, the per-image choice against the reduced DCT scale, seeded crops
that resume to the same pixels, hostile files that end in Pillow's pixels or a clear
error (never a crashed process), and a clean fallback without the library.
"""

from __future__ import annotations

import importlib.util
import io
import sys
import threading
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import datapipes as dp
from nodes.errors import BadRecordError
from nodes.media.image_resize import crop_resize
from nodes.media.jpeg import RegionJpeg, SimpleJpeg, jpeg_backend
from nodes.media.jpeg_crop import box_scale, decode_jpeg_crop, region_pays
from nodes.testing import roundtrip_state
from tests.file_fixtures import write_tar
from tests.jpeg_fixtures import jpeg_bytes, natural_image
from tests.subprocess_helpers import run_python


def _has_nvimgcodec() -> bool:
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ImportError:
        return False


HAS_REGION = _has_nvimgcodec() and importlib.util.find_spec("simplejpeg") is not None
pytestmark = pytest.mark.skipif(
    not HAS_REGION,
    reason="nvImageCodec is not installed (pip install 'datapipes-torch[jpeg-region]')",
)

#: Layouts the region decoder decodes itself (4:2:0, 4:2:2, 4:4:4, gray, progressive,
#: restart markers) and one it hands on (CMYK).
VARIANTS = {
    "420": {"subsampling": 2},
    "422": {"subsampling": 1},
    "444": {"subsampling": 0},
    "progressive": {"progressive": True},
    "restart markers": {"restart_marker_blocks": 2},
    "gray": {"mode": "L"},
    "cmyk": {"mode": "CMYK"},
    "q20": {"quality": 20},
}
SIZES = [(37, 53), (96, 128), (375, 500)]


def pillow_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.array(image.convert("RGB"))


def boxes(height: int, width: int, rng: np.random.Generator, count: int = 12) -> list[Any]:
    """Random boxes, and the corners, the last row and column, one pixel, the whole image."""
    out = [
        (0, 0, height, width),
        (height - 1, width - 1, 1, 1),
        (0, 0, 1, 1),
        (height - 1, 0, 1, width),
        (0, width - 1, height, 1),
        (height // 3, width // 5, height - height // 3, width - width // 5),
    ]
    for _ in range(count):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        out.append(
            (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
        )
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_region_pixels_are_pillows_full_decode_cut_to_the_box(variant):
    jpeg = RegionJpeg()
    rng = np.random.default_rng(len(variant))
    for height, width in SIZES:
        data = jpeg_bytes(natural_image(height, width, seed=height), **VARIANTS[variant])
        whole = pillow_rgb(data)
        for top, left, h, w in boxes(height, width, rng):
            got = jpeg.decode_region(data, "RGB", (top, left, h, w))
            assert got.shape == (h, w, 3) and got.dtype == np.uint8
            assert np.array_equal(got, whole[top : top + h, left : left + w]), (top, left, h, w)


def test_mode_l_and_none_are_pillows_too():
    jpeg = RegionJpeg()
    data = jpeg_bytes(natural_image(64, 80, seed=3))
    with Image.open(io.BytesIO(data)) as image:
        gray = np.array(image.convert("L"))[:, :, None]
        native = np.array(image)
    box = (5, 7, 40, 50)
    assert np.array_equal(jpeg.decode_region(data, "L", box), gray[5:45, 7:57])
    assert np.array_equal(jpeg.decode_region(data, None, box), native[5:45, 7:57])


def test_region_crops_are_the_unfused_crops_exactly_where_no_reduction_applies():
    region, plain = RegionJpeg(), SimpleJpeg()
    rng = np.random.default_rng(0)
    size = 120  # no box of these images keeps 120 pixels at a reduced scale
    for seed in range(6):
        data = jpeg_bytes(natural_image(150, 200, seed=seed))
        whole = torch.from_numpy(pillow_rgb(data)).permute(2, 0, 1)
        for box in boxes(150, 200, rng, count=6):
            assert box_scale(box[2], box[3], size, region.scales) == 8
            flip = bool(rng.integers(2))
            got = decode_jpeg_crop(region, "RGB", data, box, size, flip)
            assert torch.equal(got, crop_resize(whole, box, size, flip)), box
            assert torch.equal(got, decode_jpeg_crop(plain, "RGB", data, box, size, flip))


def test_the_choice_is_the_less_work_per_box():
    # full scale anyway: the region is always less
    assert region_pays(375, 500, (0, 0, 375, 500), 8)
    assert region_pays(375, 500, (300, 400, 75, 100), 8)
    # a small box near the top of a large photo: its rows only, not the whole photo at 1/8
    assert region_pays(3000, 4000, (0, 0, 300, 300), 1)
    # most of a large photo at 1/8: the scaled decode touches far fewer pixels
    assert not region_pays(3000, 4000, (500, 500, 2400, 3000), 1)
    # the choice goes the same way for the same size and box, whatever the file's bytes
    assert region_pays(3000, 4000, (10, 20, 30, 40), 2) == region_pays(
        3000, 4000, (10, 20, 30, 40), 2
    )


def test_a_scaled_choice_gives_the_scaled_decodes_pixels():
    """Where the reduced scale is chosen, the crop is the simplejpeg backend's own."""
    region, plain = RegionJpeg(), SimpleJpeg()
    data = jpeg_bytes(natural_image(375, 500, seed=9))
    box = (0, 0, 375, 500)  # the whole photo, 16 pixels out: 1/8 scale does less work
    assert not region_pays(375, 500, box, box_scale(375, 500, 16, region.scales))
    got = decode_jpeg_crop(region, "RGB", data, box, 16, False)
    assert torch.equal(got, decode_jpeg_crop(plain, "RGB", data, box, 16, False))


def test_threads_decode_regions_at_once_with_the_same_pixels():
    jpeg = RegionJpeg()
    data = [jpeg_bytes(natural_image(120, 160, seed=s)) for s in range(4)]
    box = (10, 20, 90, 100)
    expected = [pillow_rgb(d)[10:100, 20:120] for d in data]
    failures: list[Any] = []

    def work() -> None:
        for _ in range(20):
            for d, want in zip(data, expected):
                if not np.array_equal(jpeg.decode_region(d, "RGB", box), want):
                    failures.append(box)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


# ----- seeded crops resume to the same pixels ---------------------------------------------

HEIGHT, WIDTH = 96, 128


def sample(i: int, **options: Any) -> dict[str, Any]:
    return {
        "__key__": f"s{i:03d}",
        "jpg": jpeg_bytes(natural_image(HEIGHT, WIDTH, seed=i), **options),
        "cls": str(i % 10).encode(),
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory: Any) -> str:
    root = tmp_path_factory.mktemp("region-shards")
    for f in range(6):
        samples = [sample(4 * f + j) for j in range(4)]
        if f == 1:  # a grayscale and a progressive JPEG among them
            samples[2] = sample(4 * f + 2, mode="L")
            samples[3] = sample(4 * f + 3, progressive=True)
        write_tar(root, f"part-{f}.tar", samples)
    return str(root / "part-*.tar")


def recipe(pattern: str, size: int, backend: str = "nvimgcodec", **crop: Any) -> Any:
    pipe = dp.files(pattern).shuffle().read_tar().decode(image_backend=backend)
    return pipe.random_resized_crop(size, **crop)


def by_key(samples: Any) -> dict[str, tuple[int, bytes]]:
    out: dict[str, tuple[int, bytes]] = {}
    for item in samples:
        assert item["__key__"] not in out, f"{item['__key__']} came twice"
        out[item["__key__"]] = (item["cls"], item["jpg"].numpy().tobytes())
    return out


def test_region_crops_are_pillows_unfused_crops_where_no_reduction_applies(shards):
    region = by_key(dp.Loader(recipe(shards, 64), seed=3))
    pillow = by_key(dp.Loader(recipe(shards, 64, "pillow", fused=False), seed=3))
    assert region == pillow and len(region) == 24


@pytest.mark.parametrize("crop", [{}, {"num_threads": 2}])
def test_region_crops_resume_mid_epoch_to_the_same_pixels(shards, crop):
    pipe = recipe(shards, 16, **crop)
    reference = by_key(dp.Loader(pipe, seed=4))
    for stop in (0, 7, 24):
        loader = dp.Loader(pipe, seed=4)
        head = list(islice(iter(loader), stop))
        state = roundtrip_state(loader.state_dict())
        loader.close()
        resumed = dp.Loader(pipe, seed=4)
        resumed.load_state_dict(state)
        assert by_key(head + list(resumed)) == reference, stop
        resumed.close()


def test_region_crops_are_the_same_after_an_elastic_resume(shards):
    pipe = recipe(shards, 16)
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
def test_region_crops_at_0_and_2_workers_and_after_a_resume_at_2(shards):
    pipe = recipe(shards, 16)
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


# ----- hostile files ------------------------------------------------------------------------


def hostile_files() -> dict[str, bytes]:
    """Damaged and unusual JPEGs, each with a good header unless its name says otherwise."""
    good = jpeg_bytes(natural_image(120, 160, seed=1))
    huge = bytearray(good)
    sof = huge.find(b"\xff\xc0")
    huge[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2  # claims 60000 x 60000
    bad_marker = good[:400] + b"\xff\xd9" + good[402:]  # an end-of-image inside the data
    bad_table = bytearray(good)
    dht = bad_table.find(b"\xff\xc4")
    bad_table[dht + 4 : dht + 21] = b"\xff" * 17  # a Huffman table with impossible counts
    return {
        "truncated": good[: len(good) // 2],
        "truncated header": good[:120],
        "corrupt marker": bad_marker,
        "bad huffman table": bytes(bad_table),
        "garbage after SOI": b"\xff\xd8\xff" + bytes(range(256)) * 8,
        "60000x60000 header": bytes(huge),
        "cmyk": jpeg_bytes(natural_image(120, 160, seed=2), mode="CMYK"),
        "progressive": jpeg_bytes(natural_image(120, 160, seed=3), progressive=True),
    }


def pillow_outcome(data: bytes) -> np.ndarray | None:
    """Pillow's full decode, or None where Pillow refuses the file."""
    try:
        return pillow_rgb(data)
    except Exception:  # noqa: BLE001 - any refusal: the region decoder must refuse too
        return None


@pytest.mark.parametrize("name", sorted(hostile_files()))
def test_hostile_files_give_pillows_pixels_or_pillows_error(name):
    data = hostile_files()[name]
    box = (10, 20, 60, 80)
    expected = pillow_outcome(data)
    jpeg = RegionJpeg()
    if expected is None:
        with pytest.raises(Exception) as refused:  # noqa: PT011 - Pillow's own error
            jpeg.decode_region(data, "RGB", box)
        assert type(refused.value).__module__.startswith(("PIL", "builtins")), refused.value
    else:
        got = jpeg.decode_region(data, "RGB", box)
        assert np.array_equal(got, expected[10:70, 20:100])


def test_hostile_files_in_a_pipeline_are_bad_records_naming_the_sample(tmp_path):
    files = hostile_files()
    samples = [
        {"__key__": f"h{i}", "jpg": data, "cls": b"1"} for i, data in enumerate(files.values())
    ]
    write_tar(tmp_path, "hostile.tar", samples)
    pipe = recipe(str(tmp_path / "hostile.tar"), 16)
    with pytest.raises(BadRecordError, match=r"hostile\.tar.*sample 'h0', field 'jpg'"):
        list(dp.Loader(pipe, seed=0))
    skipping = dp.files(str(tmp_path / "hostile.tar")).read_tar()
    skipping = skipping.decode(image_backend="nvimgcodec", on_error="skip")
    loader = dp.Loader(skipping.random_resized_crop(16), seed=0)
    with pytest.warns(UserWarning, match="skipping a bad record"):
        kept = sorted(item["__key__"] for item in loader)
    good = sorted(f"h{i}" for i, d in enumerate(files.values()) if pillow_outcome(d) is not None)
    assert kept == good and "h6" in kept and "h7" in kept  # CMYK and progressive decode


@pytest.mark.slow
def test_hostile_files_do_not_crash_a_fresh_process(tmp_path):
    """Each file through the region decoder in a new interpreter: it exits normally."""
    for i, data in enumerate(hostile_files().values()):
        (tmp_path / f"{i}.jpg").write_bytes(data)
    code = (
        "import sys, pathlib\n"
        "from nodes.media.jpeg import RegionJpeg\n"
        "jpeg = RegionJpeg()\n"
        "for path in sorted(pathlib.Path(sys.argv[1]).glob('*.jpg')):\n"
        "    try:\n"
        "        out = jpeg.decode_region(path.read_bytes(), 'RGB', (10, 20, 60, 80)).shape\n"
        "    except Exception as error:\n"
        "        out = type(error).__name__\n"
        "    print(path.name, out)\n"
    )
    lines = run_python(code, str(tmp_path)).splitlines()
    assert len(lines) == len(hostile_files())


# ----- without the library ------------------------------------------------------------------


def test_without_nvimgcodec_auto_falls_back_and_the_name_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # what an absent one imports as
    with pytest.raises(ImportError, match=r"datapipes-torch\[jpeg-region\]"):
        dp.from_sequence([{"jpg": b""}]).decode(image_backend="nvimgcodec")
    with pytest.raises(ImportError, match=r"datapipes-torch\[jpeg-region\]"):
        jpeg_backend("nvimgcodec")
    fallback = jpeg_backend("auto")
    assert type(fallback) is SimpleJpeg and not fallback.region


def test_auto_is_the_region_decoder_when_installed():
    assert isinstance(jpeg_backend("auto"), RegionJpeg)


@pytest.mark.slow
def test_the_import_leaves_out_only_the_absent_gpu_libraries_complaints():
    code = "from nodes.media.jpeg import import_nvimgcodec\nimport_nvimgcodec()\nprint('ok')\n"
    import os
    import subprocess

    from tests.subprocess_helpers import ROOT

    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
    assert "nvjpeg" not in done.stderr.lower(), done.stderr
