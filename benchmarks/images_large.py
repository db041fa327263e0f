"""ImageNet-like JPEGs in tar shards: the data, the crop every implementation does, the limit.

Used by ``compare.py`` (the ``images_large`` workload; the implementations are in
``images_large_peers.py``). The data set is ``shards`` webdataset-style tar files
of ``per_shard`` samples each: ``s0003-000017.jpg`` (a generated natural-looking
photo of about 500x375, landscape 500 x 333..400 or, one in five, portrait
333..400 x 500, JPEG quality 90, 4:2:0, about 100 KB) and ``s0003-000017.cls``
(its label, ASCII digits). Generated once per directory in a process pool and
cached by a manifest (``jsonl_pipeline.cached_data_set``).

The work per sample, the same everywhere: decode the JPEG, a random resized crop
(torchvision's ``RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3))``
parameters) and a horizontal flip with probability 0.5, to a uint8 CHW tensor;
batches of 256 ``(uint8 [256, 3, 224, 224], int64 labels, keys)``; then in the
main process :func:`on_device`: to float, / 255, minus mean, over std (the
"device" is the CPU here). The peers draw the crop from an RNG seeded by the
sample's key (:func:`key_crop`), so their pixels can be compared with each other.

:func:`measure_limit` measures two limits for this work. Today's: the best
single-thread rate of decode + crop + resize over these files with the decoders
available (Pillow; simplejpeg when installed; each at full scale and at the
reduced DCT scale that still leaves the crop at least 224 a side), times the
cores this process may use. The region-decode limit (nvImageCodec installed,
the ``jpeg-region`` extra): the same crops with only the crop's box decoded
(:func:`region_crop`; or, per crop, the reduced-scale decode where that does
less work), run concurrently in one process per core, so what the cores
really give together is measured, not assumed.
"""

from __future__ import annotations

import hashlib
import io
import math
import multiprocessing
import os
import random
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from images import read_tar_samples
from jsonl_pipeline import cached_data_set

SIZE = 224  # the crop's output side
BATCH = 256
QUALITY = 90
FORMAT_VERSION = 1
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
# ImageNet's mean and std on the 0..255 scale: (x / 255 - mean) / std in two passes, not three
MEAN_255 = 255 * torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD_255 = 255 * torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
NORM_SCALE, NORM_SHIFT = 1 / STD_255, -MEAN_255 / STD_255

#: A crop box in full-resolution pixels: top, left, height, width; and whether to flip.
Crop = tuple[int, int, int, int, bool]


# ----- data generation -------------------------------------------------------------------
def _octave(rng: np.random.Generator, cells: int, size: tuple[int, int], channels: int):
    """Smooth noise with about ``cells`` features across: a small grid upsampled bicubic."""
    from PIL import Image

    width, height = size
    grid = rng.standard_normal((max(2, cells * height // width + 2), cells + 2, channels))
    noise = (grid * 32 + 128).clip(0, 255).astype(np.uint8)
    small = Image.fromarray(noise[..., 0] if channels == 1 else noise)
    big = np.asarray(small.resize(size, Image.BICUBIC), np.float32)
    return (big.reshape(height, width, channels) - 128) / 32


def make_photo(seed: int) -> bytes:
    """A natural-looking JPEG: multi-scale luminance texture, soft colour, shapes, grain.

    Real photos compress to 100-150 KB at 500x375 q90 because of their
    mid- and high-frequency texture; smooth noise alone gives 20 KB, so the
    luminance has octaves down to ~3 px and a little per-pixel grain.
    """
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    long_side, short_side = 500, int(rng.integers(333, 401))
    portrait = rng.random() < 0.2
    size = (short_side, long_side) if portrait else (long_side, short_side)
    luma = (
        55 * _octave(rng, 3, size, 1)
        + 30 * _octave(rng, 10, size, 1)
        + 50 * _octave(rng, 60, size, 1)
        + 45 * _octave(rng, 160, size, 1)
    )
    chroma = 30 * _octave(rng, 4, size, 3) + 8 * _octave(rng, 20, size, 3)
    image = Image.fromarray((rng.uniform(50, 200, 3) + luma + chroma).clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(5, 12))):  # objects: edges JPEG must keep
        x0, y0 = int(rng.integers(0, size[0])), int(rng.integers(0, size[1]))
        box = (x0, y0, x0 + int(rng.integers(20, 200)), y0 + int(rng.integers(20, 200)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = int(rng.integers(3))
        if shape == 0:
            draw.ellipse(box, fill=colour)
        elif shape == 1:
            draw.rectangle(box, fill=colour)
        else:
            draw.line(box, fill=colour, width=int(rng.integers(2, 9)))
    pixels = np.asarray(image, np.float32)
    pixels += 14 * rng.standard_normal((size[1], size[0], 1), dtype=np.float32)  # sensor grain
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, format="JPEG", quality=QUALITY)
    return out.getvalue()


def write_shard(path: Path, shard: int, count: int, seed: int) -> dict[str, Any]:
    """Write ``count`` samples (jpg + cls) to the tar ``path``; their sizes and labels."""
    rng = random.Random(seed * 1_000_003 + shard)
    tmp = path.with_suffix(".tmp")
    jpeg_bytes, labels = 0, []
    with tarfile.open(tmp, "w") as tar:
        for i in range(count):
            key = f"s{shard:04d}-{i:06d}"
            jpeg, label = make_photo(rng.getrandbits(63)), rng.randrange(1000)
            jpeg_bytes += len(jpeg)
            labels.append(label)
            for ext, data in (("jpg", jpeg), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)
    return {"size": path.stat().st_size, "jpeg_bytes": jpeg_bytes, "labels": labels}


def generate_shards(directory: Path, shards: int, per_shard: int, seed: int) -> dict[str, Any]:
    """Shards ``photos-00000.tar`` ... of ``per_shard`` samples, made in parallel, cached.

    The manifest keeps what the output checks need: the number of samples, the
    sum of the labels, a digest of the sorted keys and the mean JPEG size.
    """

    def build() -> dict[str, Any]:
        directory.mkdir(parents=True, exist_ok=True)
        names = [f"photos-{i:05d}.tar" for i in range(shards)]
        workers = min(shards, len(os.sched_getaffinity(0)))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            made = list(
                pool.map(
                    write_shard,
                    [directory / name for name in names],
                    range(shards),
                    [per_shard] * shards,
                    [seed] * shards,
                )
            )
        samples = shards * per_shard
        keys = [f"s{s:04d}-{i:06d}" for s in range(shards) for i in range(per_shard)]
        return {
            "samples": samples,
            "files": names,
            "sizes": [m["size"] for m in made],
            "label_sum": sum(sum(m["labels"]) for m in made),
            "keys_digest": keys_digest(keys),
            "mean_jpeg_kb": round(sum(m["jpeg_bytes"] for m in made) / samples / 1000, 1),
        }

    wanted = {"version": FORMAT_VERSION, "shards": shards, "per_shard": per_shard, "seed": seed}
    return cached_data_set(directory, wanted, f"{shards} tars of {per_shard} photos", build)


def keys_digest(keys: list[str]) -> str:
    """A short digest of a set of keys (sorted first: the orders differ per library)."""
    return hashlib.sha1("\n".join(sorted(keys)).encode()).hexdigest()[:12]


def shuffled(paths: list[str], seed: int) -> list[str]:
    """The file order of an epoch: ``paths`` shuffled by ``seed`` (the same in every worker)."""
    order = list(paths)
    random.Random(seed).shuffle(order)
    return order


# ----- the crop every implementation does -------------------------------------------------
def crop_params(width: int, height: int, rng: random.Random) -> Crop:
    """torchvision ``RandomResizedCrop.get_params`` (10 tries, then a centre crop) + a flip."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = rng.randint(0, height - h), rng.randint(0, width - w)
            return top, left, h, w, rng.random() < 0.5
    ratio = width / height
    if ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif ratio > RATIO[1]:
        w, h = round(height * RATIO[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w, rng.random() < 0.5


def key_crop(key: str, width: int, height: int) -> Crop:
    """The crop of the sample ``key``: parameters from an RNG seeded by the key's hash."""
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return crop_params(width, height, random.Random(seed))


def resized_crop(image: Any, crop: Crop, scale: tuple[float, float] = (1.0, 1.0)) -> torch.Tensor:
    """Crop ``crop`` (full-resolution box, scaled by ``scale`` = (x, y) when the image was
    decoded smaller), resize to 224 x 224 (Pillow, antialiased bilinear), flip: uint8 CHW.

    ``image`` is a Pillow image or an HWC uint8 array. Pillow's ``resize(box=...)``
    crops and resizes in one pass; measured faster here than torch's uint8
    ``interpolate(antialias=True)`` on the cropped view.
    """
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = Image.fromarray(np.asarray(image))
    if image.mode != "RGB":
        image = image.convert("RGB")
    top, left, h, w, flip = crop
    sx, sy = scale
    box = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
    out = image.resize((SIZE, SIZE), Image.BILINEAR, box=box)
    if flip:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(out)).permute(2, 0, 1)  # a writable copy: 150 KB


def pillow_decode_crop(data: bytes, key: str) -> torch.Tensor:
    """Full-scale Pillow decode + the key's crop: the baseline's work for one sample."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return resized_crop(image, key_crop(key, *image.size))


def min_scale_size(width: int, height: int, crop: Crop) -> tuple[int, int]:
    """The smallest image size at which ``crop`` still covers 224 x 224 pixels."""
    _, _, h, w, _ = crop
    return math.ceil(width * SIZE / w), math.ceil(height * SIZE / h)


def pillow_reduced_crop(data: bytes, key: str) -> torch.Tensor:
    """Pillow ``draft`` (DCT scale 1/2, 1/4, 1/8 that keeps the crop >= 224) + the crop."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        crop = key_crop(key, width, height)
        image.draft("RGB", min_scale_size(width, height, crop))
        image.load()
        scale = (image.size[0] / width, image.size[1] / height)
        return resized_crop(image, crop, scale)


def simplejpeg_crop(data: bytes, key: str, reduced: bool = False) -> torch.Tensor:
    """simplejpeg (libjpeg-turbo, exact DCT and upsampling) + the crop; ``reduced``: at the
    smallest libjpeg-turbo scale (M/8) that keeps the crop >= 224."""
    import simplejpeg

    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    crop = key_crop(key, width, height)
    if reduced:
        min_w, min_h = min_scale_size(width, height, crop)
        pixels = simplejpeg.decode_jpeg(data, "RGB", min_height=min_h, min_width=min_w)
    else:
        pixels = simplejpeg.decode_jpeg(data, "RGB")
    scale = (pixels.shape[1] / width, pixels.shape[0] / height)
    return resized_crop(pixels, crop, scale)


_NORMALIZED: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}


def on_device(images: torch.Tensor, device: str = "cpu") -> torch.Tensor:
    """The step on the device: uint8 NCHW -> float, / 255, normalized by ImageNet's mean/std,
    into a float buffer kept per device and shape (overwritten by the next call)."""
    # x * (1 / (255 std)) - mean / std, in place in a reused buffer: a CUDA loop gets that
    # reuse from torch's caching allocator, while on the CPU a new 154 MB tensor per batch
    # costs fresh pages, and the broadcasting uint8 x float multiplication is slow. Measured
    # on one thread, a batch of 256: 155 ms as torch.mul(x, scale).add_(shift), 99 ms as
    # x.float().mul_().add_(), 50 ms here (copy_ converts as it copies).
    x = images.to(device, non_blocking=True)
    key = (str(x.device), tuple(x.shape))
    out = _NORMALIZED.get(key)
    if out is None:
        out = _NORMALIZED[key] = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    return out.copy_(x).mul_(NORM_SCALE.to(x.device)).add_(NORM_SHIFT.to(x.device))


def region_crop(data: bytes, key: str, resizer: str = "torch") -> torch.Tensor:
    """The crop's box decoded alone (nvImageCodec's CPU decoder through the library's
    ``RegionJpeg``: full scale, Pillow's pixels), resized to 224 and flipped. ``"torch"``:
    exactly the library's fused step (``decode_jpeg_crop``: per crop the box or the reduced
    DCT scale, whichever does less work; torch's antialiased resize, 0.3-0.5 ms against
    Pillow's 1.1-1.4 ms for these crops, measured); ``"pillow"``: the box always, then
    :func:`resized_crop` as the other variants resize."""
    from nodes.media.jpeg_crop import decode_jpeg_crop

    jpeg = _region_jpeg()
    height, width = jpeg.size(data)
    top, left, h, w, flip = key_crop(key, width, height)
    box = (top, left, h, w)
    if resizer == "torch":
        return decode_jpeg_crop(jpeg, "RGB", data, box, SIZE, flip, (height, width))
    return resized_crop(jpeg.decode_region(data, "RGB", box), (0, 0, h, w, flip))


_REGION: list[Any] = []


def _region_jpeg() -> Any:
    if not _REGION:
        from nodes.media.jpeg import RegionJpeg

        _REGION.append(RegionJpeg())
    return _REGION[0]


def has_region_decoder() -> bool:
    """Whether the library's region decoder can run here (nvImageCodec and simplejpeg)."""
    try:
        _region_jpeg()
    except ImportError:
        return False
    return True


# ----- the limit -------------------------------------------------------------------------
def decoders() -> dict[str, Callable[[bytes, str], torch.Tensor]]:
    """Decode + crop variants available here, by name (simplejpeg's only when installed)."""
    found: dict[str, Callable[[bytes, str], torch.Tensor]] = {
        "Pillow full scale": pillow_decode_crop,
        "Pillow reduced (draft)": pillow_reduced_crop,
    }
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return found
    found["simplejpeg full scale"] = simplejpeg_crop
    found["simplejpeg reduced (min size)"] = lambda data, key: simplejpeg_crop(data, key, True)
    return found


def load_samples(paths: list[str], count: int) -> list[tuple[str, bytes]]:
    """The first ``count`` (key, JPEG bytes) of the shards, in order."""
    out = []
    for path in paths:
        for sample in read_tar_samples(path):
            out.append((sample["__key__"], sample["jpg"]))
            if len(out) == count:
                return out
    return out


def region_decoders() -> dict[str, Callable[[bytes, str], torch.Tensor]]:
    """The region-decode variants, by name (none without nvImageCodec)."""
    if not has_region_decoder():
        return {}
    return {
        "nvImageCodec region + torch resize (the library's fused crop)": region_crop,
        "nvImageCodec region + Pillow resize": lambda data, key: region_crop(data, key, "pillow"),
    }


def single_thread_rates(
    variants: dict[str, Callable[[bytes, str], torch.Tensor]],
    samples: list[tuple[str, bytes]],
    repeats: int,
) -> dict[str, float]:
    """Images/s of each variant on one thread, best of ``repeats`` passes over ``samples``."""
    rates = {}
    for name, fn in variants.items():
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            for key, data in samples:
                out = fn(data, key)
                assert out.shape == (3, SIZE, SIZE), (name, key, out.shape)
            best = min(best, time.perf_counter() - start)
        rates[name] = len(samples) / best
    return rates


def measure_limit(paths: list[str], count: int = 300, repeats: int = 2) -> dict[str, Any]:
    """Single-thread images/s of every decode + crop variant on ``count`` of the files (in
    memory, best of ``repeats``), today's limit (the best rate times the usable cores) and,
    where nvImageCodec is installed, the region-decode limit (``limit["region"]``): the
    best region variant run concurrently, one process per core."""
    samples = load_samples(paths, count)
    rates = single_thread_rates(decoders(), samples, repeats)
    region_rates = single_thread_rates(region_decoders(), samples, repeats)
    region = None
    if region_rates:
        fastest = max(region_rates, key=region_rates.__getitem__)
        # best of 5 (a pass takes about a second): the one figure other load lowers most
        together = concurrent_rate(fastest, samples, len(os.sched_getaffinity(0)), 5)
        region = {"rates": region_rates, "fastest": fastest, "concurrent": together}
    return limit_of(rates, reducible(samples), region)


def limit_of(
    rates: dict[str, float], shares: dict[str, float], region: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The limits from single-thread ``rates`` by decoder (today's: the best times the usable
    cores) and the region measurement (its limit: the concurrent rate), if any."""
    cores = len(os.sched_getaffinity(0))
    fastest = max(rates, key=rates.__getitem__)
    out = {
        "rates": rates,
        "fastest": fastest,
        "cores": cores,
        "limit": rates[fastest] * cores,
        "reducible": shares,
        "region": None,
    }
    if region is not None:
        out["region"] = {**region, "limit": region["concurrent"]}
    return out


def best_limit(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two measurements of the limits (before and after the rows' turns) merged: the best
    rate of each decoder, as a best-of over the run's quietest moment."""
    again = second["rates"]
    rates = {name: max(rate, again.get(name, 0.0)) for name, rate in first["rates"].items()}
    region = first.get("region")
    if region is not None and second.get("region") is not None:
        other = second["region"]
        region_rates = {n: max(r, other["rates"].get(n, 0.0)) for n, r in region["rates"].items()}
        region = {
            "rates": region_rates,
            "fastest": max(region_rates, key=region_rates.__getitem__),
            "concurrent": max(region["concurrent"], other["concurrent"]),
        }
    return limit_of(rates, first["reducible"], region)


def _variant(name: str) -> Callable[[bytes, str], torch.Tensor]:
    return {**decoders(), **region_decoders()}[name]


def _concurrent_worker(name: str, samples: list[tuple[str, bytes]], start: Any) -> None:
    torch.set_num_threads(1)  # one core each: the processes are the parallelism
    fn = _variant(name)
    for key, data in samples[:8]:  # warm: libraries loaded, decoders made
        fn(data, key)
    start.wait()
    for key, data in samples:
        fn(data, key)


def concurrent_rate(
    name: str, samples: list[tuple[str, bytes]], processes: int, repeats: int
) -> float:
    """Images/s of the variant ``name`` with ``processes`` processes (forked, one per core)
    each doing every sample at once: best of ``repeats``, timed from a common start."""
    context = multiprocessing.get_context("fork")
    best = math.inf
    for _ in range(repeats):
        start = context.Barrier(processes + 1)
        workers = [
            context.Process(target=_concurrent_worker, args=(name, samples, start))
            for _ in range(processes)
        ]
        for worker in workers:
            worker.start()
        start.wait()
        began = time.perf_counter()
        for worker in workers:
            worker.join()
        seconds = time.perf_counter() - began
        if any(worker.exitcode != 0 for worker in workers):
            raise RuntimeError(f"the concurrent measurement of {name} failed in a worker")
        best = min(best, seconds)
    return processes * len(samples) / best


def reducible(samples: list[tuple[str, bytes]]) -> dict[str, float]:
    """The share of ``samples`` whose crop allows a reduced DCT scale: 7/8 or less (any
    libjpeg-turbo scale), 1/2 or less (Pillow's ``draft``: 1/2, 1/4, 1/8)."""
    from PIL import Image

    m8 = half = 0
    for key, jpeg in samples:
        with Image.open(io.BytesIO(jpeg)) as image:
            width, height = image.size
        need_w, need_h = min_scale_size(width, height, key_crop(key, width, height))
        m8 += 8 * need_w <= 7 * width and 8 * need_h <= 7 * height
        half += 2 * need_w <= width and 2 * need_h <= height
    n = max(len(samples), 1)
    return {"7/8 or less": m8 / n, "1/2 or less": half / n}
