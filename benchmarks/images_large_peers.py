"""The implementations of the ``images_large`` workload (``compare.py --only images_large``).

Each ``make(paths, setting, batch)`` returns an iterator over one epoch of
batches ``(uint8 [batch, 3, 224, 224], int64 labels, keys)`` of the tar shards
``paths`` (file order shuffled with seed 0), doing the work of
``images_large``: decode, random resized crop 224 + flip, uint8 CHW, batch. The
peers crop with :func:`images_large.key_crop` (parameters seeded by the key) and
:func:`images_large.resized_crop` (Pillow), so only the frameworks and decoders
differ; ``setting`` is the number of worker processes or threads:

* ``hand_written``: a torch ``IterableDataset`` (``tarfile`` + Pillow + the crop),
  files dealt to workers by ``get_worker_info()``, in ``DataLoader`` (the baseline);
* ``webdataset``: ``WebDataset(urls, shardshuffle=...).decode("pil")`` + the crop,
  ``.batched()``, in ``DataLoader``;
* ``spdl``: SPDL's thread pipeline, its tar parser (``spdl.io.iter_tarfile``) and its
  image decode (``spdl.io.load_image``, FFmpeg) + the crop, ``setting`` threads. SPDL
  loads FFmpeg's shared libraries (4 to 9) at run time; :func:`spdl_unavailable` tries
  one decode first and says why it cannot run, so its rows are skipped with that reason
  once, not failed item by item (a traceback logged per sample);
* ``grain``: a random-access source over the tar members (indexed in the pass),
  ``MapDataset.shuffle().map()`` (Pillow + the crop), ``to_iter_dataset`` with
  ``setting`` threads; ``grain_processes``: the same with ``mp_prefetch`` workers;
* ``datapipes``: ``dp.files().shuffle().read_tar().decode(image_backend="auto")
  .random_resized_crop(224).batch()`` in ``dp.Loader`` with ``setting`` workers
  (before the library had ``random_resized_crop``: ``decode(image="pil")
  .map(crop)``); ``datapipes_threads``: decode + crop in a thread-parallel stage.
"""

from __future__ import annotations

import inspect
import os
import tarfile
import threading
from collections.abc import Iterator
from typing import Any

import images_large as data
import numpy as np
import torch
from images_large import key_crop, pillow_decode_crop, read_tar_samples, resized_crop, shuffled
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import datapipes as dp

SEED = 0
Batch = tuple[torch.Tensor, torch.Tensor, list[str]]
Example = tuple[torch.Tensor, int, str]


def collate(examples: list[Example]) -> Batch:
    """``(image, label, key)`` examples -> ``(uint8 [n, 3, 224, 224], int64 [n], keys)``."""
    images, labels, keys = zip(*examples)
    return torch.stack(images), torch.tensor(labels, dtype=torch.int64), list(keys)


def batched(examples: Iterator[Example], size: int) -> Iterator[Batch]:
    chunk: list[Example] = []
    for example in examples:
        chunk.append(example)
        if len(chunk) == size:
            yield collate(chunk)
            chunk = []
    if chunk:
        yield collate(chunk)


def as_batch(batch: Any) -> Batch:
    """A datapipes batch (dict of columns or a collated tuple) as ``(images, labels, keys)``."""
    if isinstance(batch, dict):
        return batch["jpg"], batch["cls"], list(batch["__key__"])
    images, labels, keys = batch
    return images, labels, list(keys)


# ----- hand-written IterableDataset in DataLoader (the baseline) ---------------------------
class TarCrops(IterableDataset):
    """Batches of cropped images from tar shards; worker ``k`` of ``N`` reads files ``k::N``."""

    def __init__(self, paths: list[str], batch: int) -> None:
        super().__init__()
        self.paths, self.batch = paths, batch

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = shuffled(self.paths, SEED)[worker::workers]
        samples = (s for path in mine for s in read_tar_samples(path))
        examples = (
            (pillow_decode_crop(s["jpg"], s["__key__"]), int(s["cls"]), s["__key__"])
            for s in samples
        )
        return batched(examples, self.batch)


def hand_written(paths: list[str], workers: int, batch: int) -> Iterator[Batch]:
    return iter(DataLoader(TarCrops(paths, batch), batch_size=None, num_workers=workers))


# ----- webdataset -----------------------------------------------------------------------------
def wds_example(sample: dict[str, Any]) -> Example:
    image, key = sample["jpg"], sample["__key__"]
    return resized_crop(image, key_crop(key, *image.size)), int(sample["cls"]), key


def webdataset(paths: list[str], workers: int, batch: int) -> Iterator[Batch]:
    import webdataset as wds

    ds = wds.WebDataset(paths, shardshuffle=len(paths), seed=SEED, empty_check=False)
    ds = ds.decode("pil").map(wds_example).batched(batch, collation_fn=collate)
    return iter(DataLoader(ds, batch_size=None, num_workers=workers))


# ----- SPDL -------------------------------------------------------------------------------
def spdl_samples(paths: list[str]) -> Iterator[dict[str, Any]]:
    """Samples of the shards through SPDL's tar parser (file order shuffled)."""
    import spdl.io

    for path in shuffled(paths, SEED):
        with open(path, "rb") as f:
            data = f.read()
        sample: dict[str, Any] = {}
        for name, content in spdl.io.iter_tarfile(data):
            key, ext = name.split(".", 1)
            if sample and sample["__key__"] != key:
                yield sample
                sample = {}
            sample["__key__"], sample[ext] = key, content
        if sample:
            yield sample


def spdl_example(sample: dict[str, Any]) -> Example:
    import spdl.io

    pixels = spdl.io.to_numpy(spdl.io.load_image(bytes(sample["jpg"])))  # HWC uint8 RGB
    key = sample["__key__"]
    crop = key_crop(key, pixels.shape[1], pixels.shape[0])
    return resized_crop(pixels, crop), int(bytes(sample["cls"])), key


SPDL_HOW = (
    "pip install spdl==0.8.0 and FFmpeg's shared libraries, e.g. apt-get install ffmpeg "
    "(docs/benchmarks.md)"
)
_SPDL_PROBED: list[str | None] = []


def spdl_unavailable() -> str | None:
    """Why SPDL cannot run here (not installed, or FFmpeg's libraries missing), or None:
    one small JPEG decoded once per process, its logging silenced while it tries."""
    if _SPDL_PROBED:
        return _SPDL_PROBED[0]
    import io
    import logging

    from PIL import Image

    reason = None
    quiet = logging.getLogger("spdl")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        import spdl.io
        from spdl.pipeline import PipelineBuilder  # noqa: F401

        out = io.BytesIO()
        Image.new("RGB", (16, 16), (200, 30, 30)).save(out, format="JPEG")
        pixels = spdl.io.to_numpy(spdl.io.load_image(out.getvalue()))
        if pixels.shape != (16, 16, 3):
            reason = f"SPDL decoded a 16x16 JPEG to {pixels.shape}"
    except ImportError as error:
        reason = f"{getattr(error, 'name', None) or 'spdl'} not installed ({SPDL_HOW})"
    except Exception as error:  # FFmpeg missing: SPDL raises when it first needs it
        first = (str(error).strip().splitlines() or [""])[0][:120]
        reason = f"SPDL cannot decode: {type(error).__name__}: {first} ({SPDL_HOW})"
    finally:
        quiet.setLevel(level)
    _SPDL_PROBED.append(reason)
    return reason


def spdl_pipeline(paths: list[str], threads: int, batch: int) -> Iterator[Batch]:
    reason = spdl_unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    from spdl.pipeline import PipelineBuilder

    pipeline = (
        PipelineBuilder()
        .add_source(spdl_samples(paths))
        .pipe(spdl_example, concurrency=threads)
        .aggregate(batch)
        .pipe(collate)
        .add_sink(3)
        .build(num_threads=threads, max_failures=0)  # the first failure ends the pass
    )

    def run() -> Iterator[Batch]:
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=120)

    return run()


# ----- Grain --------------------------------------------------------------------------------
class TarMembers:
    """Random access to the samples of tar shards: (key, jpg, cls) located by one header scan.

    Grain's sources are random access; tar shards are not, so the pass starts by
    reading every member header (seeks only) and reads a sample's bytes with
    ``os.pread``. The file handles are per process and opened lazily (they do
    not pickle to Grain's worker processes).
    """

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.index: list[tuple[str, int, int, int, int, int]] = []
        for p, path in enumerate(paths):
            members: dict[str, dict[str, tuple[int, int]]] = {}
            with tarfile.open(path) as tar:
                for member in tar:
                    key, ext = member.name.split(".", 1)
                    members.setdefault(key, {})[ext] = (member.offset_data, member.size)
            for key, fields in members.items():
                self.index.append((key, p, *fields["jpg"], *fields["cls"]))
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths, "index": self.index}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _fds={}, _lock=threading.Lock())

    def __len__(self) -> int:
        return len(self.index)

    def _fd(self, p: int) -> int:
        with self._lock:
            if p not in self._fds:
                self._fds[p] = os.open(self.paths[p], os.O_RDONLY)
            return self._fds[p]

    def __getitem__(self, i: int) -> dict[str, Any]:
        key, p, jpg_at, jpg_size, cls_at, cls_size = self.index[i]
        fd = self._fd(p)
        jpg, cls = os.pread(fd, jpg_size, jpg_at), os.pread(fd, cls_size, cls_at)
        return {"__key__": key, "jpg": jpg, "cls": cls}


def grain_example(sample: dict[str, Any]) -> tuple[np.ndarray, int, str]:
    key = sample["__key__"]
    image = pillow_decode_crop(sample["jpg"], key).numpy()  # numpy: Grain's shared memory
    return image, int(sample["cls"]), key


def grain_collate(examples: list[tuple[np.ndarray, int, str]]) -> tuple[Any, ...]:
    images, labels, keys = zip(*examples)
    return np.stack(images), np.asarray(labels, dtype=np.int64), np.asarray(keys)


def grain_dataset(paths: list[str], threads: int, batch: int) -> Any:
    import grain

    ds = grain.MapDataset.source(TarMembers(paths)).shuffle(seed=SEED).map(grain_example)
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * batch))
    return ds.batch(batch, batch_fn=grain_collate)


def from_numpy(batches: Any) -> Iterator[Batch]:
    for images, labels, keys in batches:
        yield torch.from_numpy(images), torch.from_numpy(labels), [str(k) for k in keys]


def grain_threads(paths: list[str], threads: int, batch: int) -> Iterator[Batch]:
    return from_numpy(iter(grain_dataset(paths, threads, batch)))


def grain_processes(paths: list[str], workers: int, batch: int) -> Iterator[Batch]:
    import grain

    ds = grain_dataset(paths, 1, batch)
    return from_numpy(iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))))


# ----- datapipes ------------------------------------------------------------------------------
def has_fast_path() -> bool:
    """Whether the library has the vision fast path (``random_resized_crop``, backends)."""
    decode = inspect.signature(dp.DataPipe.decode).parameters
    return hasattr(dp.DataPipe, "random_resized_crop") and "image_backend" in decode


def dp_example(sample: dict[str, Any]) -> Example:
    """The fallback's crop step on ``decode(image="pil")`` samples."""
    image, key = sample["jpg"], sample["__key__"]
    return resized_crop(image, key_crop(key, *image.size)), sample["cls"], key


def dp_decode_example(sample: dict[str, Any]) -> Example:
    """The fallback's thread-parallel step: Pillow decode + crop of a raw tar sample."""
    key = sample["__key__"]
    return pillow_decode_crop(sample["jpg"], key), int(sample["cls"]), key


def thread_keyword() -> str | None:
    """The keyword that runs the library's decode + crop on threads, if it has one."""
    for method in ("random_resized_crop", "decode"):
        params = inspect.signature(getattr(dp.DataPipe, method)).parameters
        for name in ("num_threads", "num_workers"):
            if name in params:
                return f"{method}.{name}"
    return None


def datapipes_recipe(paths: list[str], batch: int, threads: int = 0) -> dp.DataPipe:
    """The recipe; ``threads > 0``: decode + crop on ``threads`` threads.

    With the fast path: ``decode(image_backend="auto").random_resized_crop(224)``
    (their thread keyword when ``threads``); before it: ``decode(image="pil")
    .map(crop)``, or with ``threads`` a thread-parallel ``map`` of Pillow decode
    + crop (the decode step itself is serial).
    """
    pipe = dp.files(paths).shuffle(seed=SEED).read_tar()
    if has_fast_path():
        where = thread_keyword() if threads else None
        if threads and where is None:
            raise NotImplementedError("the library has no thread keyword for decode + crop")
        decode_kw: dict[str, Any] = {"image_backend": "auto"}
        crop_kw: dict[str, Any] = {"seed": SEED}
        if where:
            method, name = where.split(".")
            (decode_kw if method == "decode" else crop_kw)[name] = threads
        pipe = pipe.decode(**decode_kw).random_resized_crop(data.SIZE, **crop_kw)
    elif threads:
        pipe = pipe.map(dp_decode_example, num_workers=threads)
    else:
        pipe = pipe.decode(image="pil").map(dp_example)
    # On threads the main process also collates and normalizes: a prefetch lets the next
    # batch's decodes run meanwhile (measured +15% at 2 threads).
    return pipe.batch(batch).prefetch(2) if threads else pipe.batch(batch)


def datapipes(
    paths: list[str],
    workers: int,
    batch: int,
    stats: list[Any] | None = None,
    threads: int = 0,
) -> Iterator[Batch]:
    """``workers`` DataLoader worker processes, decode + crop on ``threads`` threads in each
    (``0``: in the step's own thread); ``stats`` (a list) gets the Loader's stats."""
    recipe = datapipes_recipe(paths, batch, threads)
    loader = dp.Loader(recipe, seed=SEED, num_workers=workers, stats=stats is not None)

    def run() -> Iterator[Batch]:
        for item in loader:
            yield as_batch(item)
        if stats is not None:
            stats.append(loader.stats())

    return run()


def datapipes_threads(paths: list[str], threads: int, batch: int) -> Iterator[Batch]:
    """Decode + crop on ``threads`` threads in the main process."""
    return datapipes(paths, 0, batch, threads=threads)


def datapipes_workers_threads(paths: list[str], workers: int, batch: int) -> Iterator[Batch]:
    """``workers`` worker processes, each decoding + cropping on 2 threads."""
    return datapipes(paths, workers, batch, threads=2)
