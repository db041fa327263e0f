# %% [markdown]
# # Feeding the GPU: find the slow step, make it parallel, overlap the copy
#
# A training step waits whenever the input pipeline is slower than the model.
# This tutorial builds a small image pipeline, reads its per-step statistics
# to find the bottleneck, runs that step on a thread pool, prefetches so that
# the pipeline works while the model trains, and moves batches to the device
# with `pin_memory()` / `to_device()`, then takes a checkpoint while the pool
# still has items in flight, which resumes exactly. It ends with real JPEG
# shards on the library's fast image path. (Timings are printed, never
# asserted: they depend on the machine.)
#
# Run `python tutorials/07_feeding_the_gpu.py`; it asserts what it shows.

# %%
import io
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import datapipes as dp

# %% [markdown]
# ## A pipeline with a slow step
#
# "Decoding" here is numpy work plus a short sleep standing in for a JPEG
# decode or a network read: both release the GIL, so threads help.

# %%
rng = np.random.default_rng(0)
RAW = [rng.integers(0, 255, size=(3, 32, 32), dtype=np.uint8) for _ in range(256)]


def decode(index: int) -> np.ndarray:
    time.sleep(0.002)  # I/O or a C decoder: the GIL is released
    return RAW[index].astype(np.float32) / 255.0


def augment(image: np.ndarray) -> np.ndarray:
    return image[:, ::-1, :].copy()  # a horizontal flip: cheap


def recipe(decode_workers: int | None = None, prefetch: int | None = 2) -> dp.DataPipe:
    pipe = dp.range(len(RAW)).shuffle().map(decode, num_workers=decode_workers).map(augment)
    pipe = pipe.batch(32)
    return pipe if prefetch is None else pipe.prefetch(prefetch)


# %% [markdown]
# ## Read the statistics
#
# `Loader(stats=True)` times every step: its own work, and the time it waited
# on its input. `print(loader.stats())` shows a table and names the slowest
# step. (Statistics cost a fraction of a microsecond per item per step; they
# are off unless asked for.)

# %%
loader = dp.Loader(recipe(), seed=0, stats=True)
serial = [batch for batch in loader]
print(loader.stats())
assert loader.stats().slowest().step == "map(decode)"

# %% [markdown]
# Reading the table, one row per step from the source down:
#
# * `where`: `main` (the training process) or `workers xN` (DataLoader worker
#   processes, their times divided by N: what the step costs the epoch);
# * `items`: how many items the step yielded (batches, from `batch(32)` on);
# * `self s`: time in the step's own work, its `next()` minus its input's;
# * `us/item`: that time per item it yielded, in one process;
# * `wait s`: time spent waiting on its input, so it adds up along the chain
#   (`batch` waits for everything above it);
# * `share`: the step's part of all steps' own time. The slowest step is the
#   one to work on. The last line says how long the training loop itself
#   waited for data: here all of the epoch, since there is no training step
#   yet.
#
# The same epoch over time: `stats.figure(path)` draws the outputs per
# second with the share of each interval the loop waited, then each
# step's share of the work, the slowest step bold (matplotlib, the `[plots]`
# extra). `stats.log_to(writer, step)` sends the numbers to TensorBoard.

# %%
picture = Path(tempfile.mkdtemp()) / "epoch.png"
figure = loader.stats().figure(str(picture))
print(f"the epoch over time: {picture} ({picture.stat().st_size:,} bytes)")
assert "slowest step: map(decode)" in figure._suptitle.get_text()

# %% [markdown]
# ## Make the slow step parallel
#
# `.map(fn, num_workers=4)` runs `decode` on 4 threads (use
# `method="process"` for pure-Python work that holds the GIL). The output is
# the same stream in the same order: `ordered=True` is the default.

# %%
loader = dp.Loader(recipe(decode_workers=4), seed=0, stats=True)
start = time.perf_counter()
parallel = [batch for batch in loader]
print(f"4 decode threads: {time.perf_counter() - start:.2f} s for the epoch")
print(loader.stats())
assert len(parallel) == len(serial)
assert all(torch.equal(a, b) for a, b in zip(serial, parallel))  # same batches, same order

# %% [markdown]
# ## Prefetch: work while the model trains
#
# Without `prefetch`, the pipeline runs only inside `next(loader)`: while the
# model trains on a batch, nothing prepares the next one. `.prefetch(n)`
# computes up to `n` items ahead on a background thread, so the two overlap
# and the loop waits only for whatever the pipeline is slower than the
# training step. The `waited` line of `loader.stats()` (`loader_wait_seconds`)
# is the number to watch. (DataLoader worker processes, `Loader(num_workers=N)`,
# overlap the same way, one process each; tutorial 4.)


# %%
def train_one_epoch(loader: dp.Loader) -> list[torch.Tensor]:
    out = []
    for batch in loader:
        time.sleep(0.015)  # the training step on the GPU: the CPU is free meanwhile
        out.append(batch)
    return out


for depth in (None, 2):
    loader = dp.Loader(recipe(decode_workers=4, prefetch=depth), seed=0, stats=True)
    batches = train_one_epoch(loader)
    stats = loader.stats()
    assert all(torch.equal(a, b) for a, b in zip(batches, serial)) and len(batches) == len(serial)
    print(
        f"prefetch={depth}: epoch {stats.elapsed_seconds:.2f} s, the loop waited "
        f"{stats.loader_wait_seconds:.2f} s for data"
    )

# %% [markdown]
# ## A trace: every process on one clock
#
# The table sums an epoch up; a trace shows it happening. `loader.trace(path)`
# around the loop writes one Chrome / Perfetto trace (open it at
# https://ui.perfetto.dev): the main process and each DataLoader worker as
# processes of their own, every thread as a row, each step's work as spans
# named `datapipes: <step>`, nested under the step that asked for the item,
# and the training loop's waits. Here 2 worker processes each run the
# 4-thread decode under a prefetch, while the loop trains 15 ms a batch.
# `trace.figure(path)` draws a stretch of it.

# %%
trace_file = Path(tempfile.mkdtemp()) / "trace.json"
loader = dp.Loader(recipe(decode_workers=4), seed=0, num_workers=2)
with loader.trace(trace_file) as trace:
    traced = train_one_epoch(loader)
print(f"{trace.spans} spans from {trace.processes}: open {trace_file} in Perfetto")
assert trace.processes == ["main", "DataLoader worker 0", "DataLoader worker 1"]
# the same images, dealt to two workers (another order): a trace changes no item
assert sum(len(b) for b in traced) == sum(len(b) for b in serial)
assert torch.allclose(torch.cat(traced).sum(), torch.cat(serial).sum())
trace_picture = trace_file.with_suffix(".png")
trace.figure(trace_picture, seconds=0.3)
print(f"its first 0.3 s: {trace_picture} ({trace_picture.stat().st_size:,} bytes)")

# %% [markdown]
# Each worker's `prefetch` thread decodes (the red spans, 4 threads' worth)
# while the main process's loop mostly trains: its waits (pink) are short
# once the workers are ahead. With statistics on or a trace running, a
# `torch.profiler` in the process shows the same spans beside the model's
# operators, and `dp.merge_traces(profiler_trace, trace_file, out)` adds the
# workers to the profiler's trace.
#
# When the pipeline is faster than the training step, prefetch hides it
# entirely: with a 40 ms step, the loop hardly waits at all.

# %%
loader = dp.Loader(recipe(decode_workers=4), seed=0, stats=True)
for _batch in loader:
    time.sleep(0.04)  # a slower model
stats = loader.stats()
waited, elapsed = stats.loader_wait_seconds, stats.elapsed_seconds
print(f"40 ms steps: the loop waited {waited:.3f} s of {elapsed:.2f} s (the first batch)")

# %% [markdown]
# ## Onto the device
#
# `pin_memory()` puts each batch's tensors in page-locked memory, from which
# the copy to the GPU is faster and asynchronous; `to_device()` then copies
# them with `non_blocking=True` on a side CUDA stream, overlapping the model's
# work on the previous batch. Both run in the main process, after any worker
# processes (the Loader splits the recipe there). `to_device()` without an
# argument picks the current CUDA device when there is one and does nothing
# on a CPU-only machine, and `pin_memory()` is then a no-op too, so one recipe
# serves both. `dp.Loader(pipe, pin_memory=True, device="cuda")` is a
# shorthand for appending the two steps.

# %%
gpu_recipe = recipe(decode_workers=4).pin_memory().to_device()
batches = list(dp.Loader(gpu_recipe, seed=0, num_workers=1))
assert all(torch.equal(a.cpu(), b) for a, b in zip(batches, serial))  # the same batches
if torch.cuda.is_available():
    assert all(b.is_cuda for b in batches)
else:  # no copy at all: the batch is the very tensor the pipeline made
    one = torch.zeros(3)
    assert next(iter(dp.Loader(dp.from_sequence([one]).pin_memory().to_device()))) is one
print("batches arrive on", batches[0].device)

# %% [markdown]
# ## A checkpoint while items are in flight
#
# The parallel map's state is a position, not the items in its pool: a
# resume re-reads the few items that were in flight and computes them again.

# %%
loader = dp.Loader(recipe(decode_workers=4), seed=0)
it = iter(loader)
head = [next(it) for _ in range(3)]
buffer = io.BytesIO()
torch.save({"data": loader.state_dict()}, buffer)
loader.close()

buffer.seek(0)
resumed = dp.Loader(recipe(decode_workers=4), seed=0)
resumed.load_state_dict(torch.load(buffer, weights_only=True)["data"])
tail = list(resumed)
assert all(torch.equal(a, b) for a, b in zip(head + tail, serial))
assert len(head) + len(tail) == len(serial)
print(f"resumed after {len(head)} batches: the stream is identical")

# %% [markdown]
# ## Real images: JPEG shards, decoded and cropped on the fast path
#
# The vision recipe everyone trains with: webdataset-style tar shards of
# photos (here 48 generated ones, 500x375 at quality 90), a random resized
# crop to 224 with a horizontal flip, uint8 batches, and the normalization on
# the device, where it is cheap. `random_resized_crop` right after `decode()`
# decodes each JPEG itself: it reads the size from the header, draws the box,
# decodes at the smallest DCT scale that keeps the box at least 224 pixels
# (here full size: the photos are small), and resizes straight from the
# decoder's output; with `pip install 'datapipes-torch[jpeg]'` the decode
# goes through simplejpeg, with Pillow's pixels. `num_threads=2` runs the
# decode and crop on two threads (both release the GIL). The crops are drawn
# per image from the seed, the epoch and where the image sits in the data, so
# a resume gives the same pixels.

# %%
import tarfile  # noqa: E402

from PIL import Image  # noqa: E402


def photo(seed: int) -> bytes:
    """A 500x375 JPEG with smooth shapes and fine texture, ~60-120 KB at quality 90."""
    noise = np.random.default_rng(seed)
    coarse = Image.fromarray(noise.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((500, 375), Image.BICUBIC), dtype=np.int16)
    grain = noise.normal(0, 14, smooth.shape).astype(np.int16)
    out = io.BytesIO()
    Image.fromarray((smooth + grain).clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


folder = Path(tempfile.mkdtemp(prefix="datapipes-photos-"))
for shard in range(2):
    with tarfile.open(folder / f"photos-{shard}.tar", "w") as tar:
        for i in range(24):
            key = f"{shard}-{i:03d}"
            for ext, data in (("jpg", photo(100 * shard + i)), ("cls", str(i % 5).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def normalize(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images -> float, normalized on whatever device the batch is on."""
    images = batch["jpg"].float().div_(255)
    return (images - MEAN.to(images.device)) / STD.to(images.device), batch["cls"]


def photos(threads: int | None = 2) -> dp.DataPipe:
    return (
        dp.files(str(folder / "photos-*.tar"))
        .shuffle()
        .read_tar()
        .decode()
        .random_resized_crop(224, num_threads=threads)
        .batch(16)
        .to_device()
        .map(normalize)
    )


loader = dp.Loader(photos(), seed=0, stats=True)
started = time.perf_counter()
epoch = list(loader)
seconds = time.perf_counter() - started
images, labels = epoch[0]
assert images.shape == (16, 3, 224, 224) and images.dtype == torch.float32
assert sum(len(y) for _, y in epoch) == 48
print(f"48 photos in {seconds:.2f} s ({48 / seconds:.0f} images/s on this machine)")
print(loader.stats())

# %% [markdown]
# The table shows where the time goes: the fused `decode() +
# random_resized_crop(...)` row is nearly all of it, which is why it runs on
# threads (and, on a machine with more cores, in worker processes too:
# `num_workers=N`, each with its own threads). The uint8 batches a worker
# makes travel to the training process through shared memory without a copy
# per image; `to_device()` and the normalization run in the training process.
#
# Resuming mid-epoch gives the same pixels, at 0 workers and with workers, as
# on one thread: the draws do not depend on who computes them.

# %%
reference = [x for x, _ in dp.Loader(photos(threads=None), seed=0)]
assert all(torch.equal(a, b) for a, b in zip(reference, [x for x, _ in epoch]))
for workers in (0, 2):
    first = dp.Loader(photos(), seed=0, num_workers=workers)
    it = iter(first)
    head = [next(it)[0]]
    saved = first.state_dict()
    first.close()
    again = dp.Loader(photos(), seed=0, num_workers=workers)
    again.load_state_dict(saved)
    tail = [x for x, _ in again]
    same = dp.Loader(photos(), seed=0, num_workers=workers)
    assert all(torch.equal(a, b) for a, b in zip(head + tail, [x for x, _ in same]))
    print(f"num_workers={workers}: resumed after 1 batch, the same pixels")

# %%
import shutil  # noqa: E402

shutil.rmtree(folder)  # the generated shards
