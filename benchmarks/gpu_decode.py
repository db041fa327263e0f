"""GPU JPEG decode: images/s of the library's device path, and how far its pixels are from
the CPU decoders' (run by ``benchmarks/gpu_check.sh``).

Photos like ``images_large``'s (about 500x375, quality 90, 4:2:0), made in memory.
Measured, each the best of ``--repeats`` passes, the clock stopped after
``torch.cuda.synchronize()``:

* ``decode_crops``: batches of ``--batch`` :class:`nodes.media.device_jpeg.EncodedCrop`
  (random resized crop boxes) decoded in one nvImageCodec call per batch, resized to
  224 and flipped on the device: the decode alone, the JPEG bytes already in memory;
* ``pipeline``: ``dp.files(tar shards).read_tar().decode().random_resized_crop(224,
  on_device=True).batch(n).to_device(device)`` in ``dp.Loader`` (0 workers) plus
  the normalization on the device: what a training loop gets;
* ``decode(device=...)``: whole images, one per call (no batching), for contrast.

Pixels: the crops against the CPU path's (``fused=False``, Pillow's pixels): mean and
largest absolute difference, and how many are identical.

Without CUDA it says so and exits 0; ``--device cpu`` runs the same code on
nvImageCodec's CPU decoder (a smoke run of the path, not a GPU figure). Usage::

    python benchmarks/gpu_decode.py [--images 2048] [--batch 256] [--repeats 3]
        [--device cuda] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import images_large  # noqa: E402

import datapipes as dp  # noqa: E402
from nodes.media.crop_boxes import CropParams, draw_crop  # noqa: E402
from nodes.media.device_jpeg import EncodedCrop, decode_crops  # noqa: E402

SIZE = 224


def photos(count: int) -> list[dict[str, object]]:
    """``count`` samples, a few distinct photos repeated (making photos is slow)."""
    distinct = [images_large.make_photo(seed) for seed in range(min(count, 64))]
    return [
        {"__key__": f"p{i:06d}", "jpg": distinct[i % len(distinct)], "cls": b"1"}
        for i in range(count)
    ]


def write_shards(samples: list[dict[str, object]], directory: Path, per_shard: int) -> str:
    """The samples as webdataset tar shards in ``directory``; their glob pattern."""
    import io
    import tarfile

    for start in range(0, len(samples), per_shard):
        with tarfile.open(directory / f"photos-{start // per_shard:04d}.tar", "w") as tar:
            for sample in samples[start : start + per_shard]:
                for ext in ("jpg", "cls"):
                    data = sample[ext]
                    info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(directory / "photos-*.tar")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_rate(run, count: int, repeats: int, device: torch.device) -> float:
    run()  # warm: decoders made, kernels loaded
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return count / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the lines here")
    args = parser.parse_args()
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    if args.device is None and not torch.cuda.is_available():
        say(
            "- GPU decode: skipped: CUDA is not available on this machine (torch "
            f"{torch.__version__}, torch.cuda.is_available() is False)"
        )
        write(args.markdown, lines)
        return
    device = torch.device(args.device or "cuda")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    samples = photos(args.images)
    params = CropParams(SIZE)
    rng = __import__("numpy").random.default_rng(0)
    from nodes.media.jpeg import jpeg_backend

    sizes = jpeg_backend("auto")
    crops = []
    for s in samples:
        height, width = sizes.size(s["jpg"])
        box, flip = draw_crop(rng, height, width, params)
        crops.append(EncodedCrop(s["jpg"], box, flip, SIZE))
    batches = [crops[i : i + args.batch] for i in range(0, len(crops), args.batch)]
    say(
        f"- device: {name}; {len(samples)} photos of about 500x375 (q90, 4:2:0), batch "
        f"{args.batch}, torch {torch.__version__}"
    )

    def decode_only() -> None:
        for batch in batches:
            decode_crops(batch, device)

    rate = best_rate(decode_only, len(crops), args.repeats, device)
    say(
        f"- decode_crops (batched region decode + resize 224 + flip on {device.type}): "
        f"**{rate:,.0f} images/s**"
    )

    import tempfile

    folder = tempfile.TemporaryDirectory()
    pattern = write_shards(samples, Path(folder.name), 512)
    pipe = dp.files(pattern).read_tar().decode().random_resized_crop(SIZE, on_device=True)
    pipe = pipe.batch(args.batch).to_device(str(device))
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def whole_pipeline() -> None:
        for batch in dp.Loader(pipe, seed=0):
            (batch["jpg"].float() - mean) / std

    rate = best_rate(whole_pipeline, len(samples), args.repeats, device)
    say(
        f"- pipeline (Loader, 0 workers: tar shards, decode() + "
        f"random_resized_crop(on_device=True) + batch + to_device + normalize): "
        f"**{rate:,.0f} images/s**"
    )
    folder.cleanup()

    few = samples[: min(256, len(samples))]
    per_item = dp.from_sequence(few).decode(device=str(device))

    def one_by_one() -> None:
        for _ in dp.Loader(per_item):
            pass

    rate = best_rate(one_by_one, len(few), args.repeats, device)
    say(f"- decode(device={device.type!r}), whole images one per call: {rate:,.0f} images/s")

    check = samples[:64]
    base = dp.from_sequence(check).decode()
    cpu = [s["jpg"] for s in dp.Loader(base.random_resized_crop(SIZE, fused=False), seed=1)]
    moved = base.random_resized_crop(SIZE, on_device=True).batch(16).to_device(str(device))
    got = [image.cpu() for b in dp.Loader(moved, seed=1) for image in b["jpg"]]
    diffs = [(a.int() - b.int()).abs() for a, b in zip(got, cpu, strict=True)]
    identical = sum(int(d.max()) == 0 for d in diffs)
    worst = max(int(d.max()) for d in diffs)
    mean_diff = sum(float(d.float().mean()) for d in diffs) / len(diffs)
    say(
        f"- pixels against the CPU crops (Pillow's): {identical}/{len(diffs)} identical, "
        f"max abs diff {worst}, mean abs diff {mean_diff:.3f}"
    )
    write(args.markdown, lines)


def write(path: Path | None, lines: list[str]) -> None:
    if path is not None:
        path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
