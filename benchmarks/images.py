"""Image decoding over webdataset-style tar shards: the data and three implementations.

Used by ``compare.py`` (the ``images`` workload). The data set is ``shards`` tar
files of ``per_shard`` small JPEG images each (64x64 to 128x128 pixels, smooth
random colours, quality 90), webdataset conventions: members ``s0003-000017.jpg``
and ``s0003-000017.cls`` (the label, ASCII digits) make one sample. It is
generated once per directory and cached by a manifest (``jsonl_pipeline``'s).

Every implementation does the same work per sample: read the tar members, decode
the JPEG with Pillow to a uint8 CHW tensor, ``to_example`` (resize to 64x64
bilinear with antialiasing, scale to [0, 1], normalize by the ImageNet mean and
std) and batch 64 examples with ``nodes.default_collate`` into
``(images [64, 3, 64, 64] float32, labels [64] int64, keys list[str])``:

* ``hand_written``: a torch ``IterableDataset`` reading the tars with ``tarfile``
  and Pillow, files dealt to DataLoader workers by ``get_worker_info()``, in
  ``torch.utils.data.DataLoader(batch_size=None)``;
* ``webdataset``: ``wds.WebDataset(urls).decode("torchrgb8").map(to_example)
  .batched(64)`` in the same DataLoader (``torchrgb8`` is webdataset's uint8 CHW
  tensor decoder, so the transform gets the same input as everywhere else);
* ``datapipes``: ``dp.files(urls).read_tar().decode().map(to_example).batch(64)``
  in ``dp.Loader``.
"""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from jsonl_pipeline import batches, cached_data_set
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import datapipes as dp
from nodes import default_collate

BATCH = 64
SIZE = 64  # the transform's output side
FORMAT_VERSION = 1
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

Example = tuple[torch.Tensor, int, str]


# ----- data generation -------------------------------------------------------------------
def make_jpeg(rng: random.Random) -> bytes:
    """A JPEG of random size (64..128 a side): a smooth colour field plus a little noise."""
    from PIL import Image

    width, height = rng.randint(64, 128), rng.randint(64, 128)
    np_rng = np.random.default_rng(rng.getrandbits(32))
    coarse = Image.fromarray(np_rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))
    field = np.asarray(coarse.resize((width, height), Image.BILINEAR), dtype=np.int16)
    noisy = field + np_rng.integers(-12, 13, field.shape, dtype=np.int16)
    out = io.BytesIO()
    Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_tar(path: Path, shard: int, count: int, seed: int) -> int:
    """Write ``count`` samples (jpg + cls) to the tar ``path``; return its size."""
    rng = random.Random(seed * 1_000_003 + shard)
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for i in range(count):
            key = f"s{shard:04d}-{i:06d}"
            for ext, data in (("jpg", make_jpeg(rng)), ("cls", str(rng.randrange(10)).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)
    return path.stat().st_size


def generate_tars(directory: Path, shards: int, per_shard: int, seed: int) -> dict[str, Any]:
    """Shards ``images-00000.tar`` ... of ``per_shard`` samples each (cached by manifest)."""

    def build() -> dict[str, Any]:
        names = [f"images-{i:05d}.tar" for i in range(shards)]
        sizes = [write_tar(directory / name, i, per_shard, seed) for i, name in enumerate(names)]
        return {"samples": shards * per_shard, "files": names, "sizes": sizes}

    wanted = {"version": FORMAT_VERSION, "shards": shards, "per_shard": per_shard, "seed": seed}
    return cached_data_set(directory, wanted, f"{shards} tars of {per_shard} JPEGs", build)


# ----- the work every implementation does -----------------------------------------------
def transform(image: torch.Tensor) -> torch.Tensor:
    """uint8 CHW -> float32 3 x 64 x 64: resized, scaled to [0, 1], normalized."""
    resized = F.interpolate(
        image.unsqueeze(0).float(), size=(SIZE, SIZE), mode="bilinear", antialias=True
    )
    return (resized[0] / 255 - MEAN) / STD


def to_example(sample: dict[str, Any]) -> Example:
    """A decoded sample ``{"__key__", "jpg": uint8 CHW tensor, "cls": int}`` -> an example."""
    return transform(sample["jpg"]), sample["cls"], sample["__key__"]


# ----- the contenders --------------------------------------------------------------------
def read_tar_samples(path: str) -> Iterator[dict[str, Any]]:
    """Raw samples ``{"__key__", "jpg": bytes, "cls": bytes}`` of one tar, in member order."""
    sample: dict[str, Any] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            key, ext = member.name.split(".", 1)
            if sample and sample["__key__"] != key:
                yield sample
                sample = {}
            sample["__key__"] = key
            sample[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
    if sample:
        yield sample


def decode_sample(raw: dict[str, Any]) -> dict[str, Any]:
    from PIL import Image

    with Image.open(io.BytesIO(raw["jpg"])) as image:
        pixels = np.array(image.convert("RGB"))
    jpg = torch.from_numpy(pixels).permute(2, 0, 1)
    return {"__key__": raw["__key__"], "jpg": jpg, "cls": int(raw["cls"])}


class TarImages(IterableDataset):
    """Batches of examples from tar shards; worker ``k`` of ``N`` reads files ``k, k + N``..."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__()
        self.paths = paths

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        samples = (s for path in self.paths[worker::workers] for s in read_tar_samples(path))
        examples = map(to_example, map(decode_sample, samples))
        return batches(examples, BATCH, default_collate)


def hand_written(paths: list[str], workers: int) -> Iterator[Any]:
    return iter(DataLoader(TarImages(paths), batch_size=None, num_workers=workers))


def webdataset(paths: list[str], workers: int) -> Iterator[Any]:
    import webdataset as wds

    ds = wds.WebDataset(paths, shardshuffle=False)
    ds = ds.decode("torchrgb8").map(to_example).batched(BATCH, collation_fn=default_collate)
    return iter(DataLoader(ds, batch_size=None, num_workers=workers))


def datapipes(paths: list[str], workers: int) -> Iterator[Any]:
    pipe = dp.files(paths).read_tar().decode().map(to_example).batch(BATCH)
    return iter(dp.Loader(pipe, seed=0, num_workers=workers))
