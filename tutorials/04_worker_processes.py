# %% [markdown]
# # Worker processes: every sample exactly once, in a reproducible order
#
# `num_workers=N` runs the data pipeline in N background processes so that the
# training loop does not wait for data. With a plain torch `IterableDataset`
# that is also the easiest way to train on every sample twice. This tutorial
# shows that bug first, then what datapipes does instead: the data is dealt to
# the workers (ranges by index, files whole or split at line boundaries), a
# source that cannot be dealt is refused, the order is the same every run,
# checkpoints cover every worker, and how to choose `num_workers`. It ends with
# a recipe inside your own `DataLoader` or `StatefulDataLoader`.
#
# Ranks (several training processes) work the same way, one level up: see
# `tutorials/06_distributed_training.py`.
#
# Run `python tutorials/04_worker_processes.py`; it asserts what it shows.

# %%
import collections
import io
import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

import datapipes as dp

warnings.filterwarnings("ignore", message="This DataLoader will create")  # 3 workers, 2 cores
warnings.filterwarnings("ignore", message=".*set_vital")  # torchdata 0.11 on torch 2.13

# %% [markdown]
# ## The classic bug: an `IterableDataset` copied into every worker
#
# A `DataLoader` with `num_workers=2` copies the dataset into two processes
# and iterates *each copy* in full. A map-style `Dataset` is safe because the
# main process hands out indices; an `IterableDataset` has no indices, so each
# worker yields the whole stream. Nothing fails: the epoch is just twice as
# long and every sample is seen twice.


# %%
class Numbers(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


seen = collections.Counter(int(x) for x in DataLoader(Numbers(10), batch_size=None, num_workers=2))
print("plain IterableDataset, 2 workers:", dict(sorted(seen.items())))
assert sum(seen.values()) == 20 and all(count == 2 for count in seen.values())

# %% [markdown]
# The usual hand fix asks `get_worker_info()` which worker it runs in and
# keeps every `num_workers`-th item:


# %%
class ShardedNumbers(Numbers):
    def __iter__(self):
        info = get_worker_info()  # None in the main process (num_workers=0)
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


fixed = [int(x) for x in DataLoader(ShardedNumbers(10), batch_size=None, num_workers=2)]
print("with get_worker_info():", fixed)
assert sorted(fixed) == list(range(10))

# %% [markdown]
# It works, but it is fragile:
#
# - **Easily forgotten.** Every `IterableDataset` (and every reader of files
#   inside one) must remember it; forgetting raises nothing, it doubles data.
# - **It ignores ranks.** Under DDP the stream must be split over
#   `world_size * num_workers` consumers, so the rank has to enter the
#   arithmetic too (`DistributedSampler` does not apply to an
#   `IterableDataset`). Dealing *files* this way leaves workers idle, or reading
#   the same file, when there are fewer files than consumers.
# - **No checkpoint.** The dataset has no position. torchdata's
#   `StatefulDataLoader` can only resume it by re-reading and discarding every
#   item already seen (it warns that it is "naively fast-forwarding"), which
#   costs O(position) and is exact only if the stream is deterministic.

# %% [markdown]
# ## The same data through datapipes
#
# A `dp.Loader` with `num_workers=N` runs the recipe in N worker processes
# (torchdata's `StatefulDataLoader` underneath). Every source knows how to deal
# its data to *consumers* (one per worker here; one per rank x worker under
# DDP): `dp.range` and `dp.from_sequence` by index, `dp.files` by file. So the
# number of workers never changes *which* samples an epoch holds.

# %%
sources = {"dp.range(20)": dp.range(20), "dp.from_sequence": dp.from_sequence(list(range(20)))}
for name, pipe in sources.items():
    for workers in (0, 1, 2, 3):
        got = list(dp.Loader(pipe.shuffle(), seed=0, num_workers=workers))
        assert sorted(got) == list(range(20)), (name, workers, got)  # each exactly once
    print(f"{name}: each sample exactly once with 0, 1, 2 and 3 workers")

# %% [markdown]
# Files: four small JSONL files of 25 records each. With at least as many files
# as workers, whole files are dealt round-robin (with 2 workers, worker 0 takes
# files 0 and 2, worker 1 files 1 and 3). The `where` step below records which worker
# produced each record; it uses `get_worker_info()` only to *show* the deal.

# %%
root = Path(tempfile.mkdtemp())
record_id = 0
for part in range(4):
    with open(root / f"part-{part}.jsonl", "w") as file:
        for _ in range(25):
            file.write(json.dumps({"id": record_id, "part": part}) + "\n")
            record_id += 1
ALL_IDS = list(range(record_id))


def where(record: dict) -> dict:
    info = get_worker_info()
    return {**record, "worker": 0 if info is None else info.id}


def deal(records: list[dict]) -> dict[int, list[str]]:
    """For each worker, the ranges of ids it read, e.g. {0: ['0-24', '50-74'], ...}."""
    runs: dict[int, list[list[int]]] = collections.defaultdict(list)
    for r in sorted(records, key=lambda r: r["id"]):
        mine = runs[r["worker"]]
        if mine and mine[-1][1] == r["id"] - 1:
            mine[-1][1] = r["id"]
        else:
            mine.append([r["id"], r["id"]])
    return {w: [f"{a}-{b}" for a, b in runs[w]] for w in sorted(runs)}


from_files = dp.files(str(root / "part-*.jsonl")).read_jsonl().map(where)
for workers in (0, 1, 2, 3):
    records = list(dp.Loader(from_files, num_workers=workers))
    assert sorted(r["id"] for r in records) == ALL_IDS, workers  # no loss, no duplicates
    print(f"4 files, num_workers={workers}:", deal(records))
    if workers == 2:  # whole files, round-robin
        assert deal(records) == {0: ["0-24", "50-74"], 1: ["25-49", "75-99"]}

# %% [markdown]
# With **fewer files than workers**, whole files cannot go round: the files
# are split instead, by byte ranges aligned to the next line start (a record
# belongs to the range its first byte is in). One file and three workers:
# each worker reads about a third of it, and no line is lost or read twice,
# even though the cut points fall in the middle of lines.

# %%
one_file = dp.files(str(root / "part-0.jsonl")).read_jsonl().map(where)
for workers in (2, 3):
    records = list(dp.Loader(one_file, num_workers=workers))
    got = sorted(r["id"] for r in records)
    assert got == list(range(25)), (workers, got)
    assert len(deal(records)) == workers  # every worker read a part of the file
    print(f"1 file, num_workers={workers}:", deal(records))

# %% [markdown]
# ## A source that cannot split itself is refused
#
# `dp.from_iterable` wraps an arbitrary iterator (a generator, a network
# stream): it has no index and no files, so every worker would read all of it,
# which is the bug above. The Loader refuses it with more than one consumer
# and says what to do.

# %%
stream = dp.from_iterable(lambda: iter(range(20)))  # a factory: each consumer starts afresh
try:
    dp.Loader(stream, num_workers=2)
except ValueError as error:
    print("refused:", str(error).splitlines()[0])
else:
    raise AssertionError("from_iterable with two workers must be refused")

# %% [markdown]
# `.shard()` is the explicit split: each consumer reads the stream in full and
# keeps every n-th item (consumer c of n keeps items c, c + n, ...). The steps
# *before* it run in every worker on all the data, so put it as early as
# possible; a source that deals itself is always cheaper.

# %%
sharded = list(dp.Loader(stream.shard(), num_workers=2))
print("from_iterable(...).shard(), 2 workers:", sharded)
assert sorted(sharded) == list(range(20))

# %% [markdown]
# ## Order: the same every run, but it depends on `num_workers`
#
# Items come from the workers in turns, as in a plain torch `DataLoader`:
# worker 0, 1, ..., N-1, again, and once a worker runs out, the ones that
# still have data. Same seed and same
# `num_workers`, same order, every run. But a different `num_workers` deals the
# data differently, so in general the order changes (the *set* of samples does not):
# with files, 2 workers alternate between two files, 3 workers between three.

# %%
recipe = dp.files(str(root / "part-*.jsonl")).shuffle().read_jsonl()


def ids(loader: dp.Loader) -> list[int]:
    return [r["id"] for r in loader]


two_a = ids(dp.Loader(recipe, seed=3, num_workers=2))
two_b = ids(dp.Loader(recipe, seed=3, num_workers=2))
three = ids(dp.Loader(recipe, seed=3, num_workers=3))
print("2 workers:", two_a[:12], "...")
print("3 workers:", three[:12], "...")
assert two_a == two_b  # deterministic
assert two_a != three and sorted(two_a) == sorted(three) == ALL_IDS

# %% [markdown]
# That is why a checkpoint records the number of workers. The state covers
# every worker: each one's position as of its last snapshot (taken every 32
# items), whose turn is next, and how many items the loop received since; a
# resume restores the snapshot and computes those items again, without
# handing them out twice, then goes on right after the last item received.
# The same `num_workers` resumes exactly, here from a `torch.save` file as in
# a training checkpoint. Another `num_workers` (an elastic resume, see
# tutorial 05) gets the rest of the epoch dealt to its workers: every record
# that was not received yet exactly once (those the two workers had computed
# ahead included), in another order.

# %%
loader = dp.Loader(recipe, seed=3, num_workers=2)
head = []
for record in loader:
    head.append(record["id"])
    if len(head) == 30:
        buffer = io.BytesIO()
        torch.save({"data": loader.state_dict()}, buffer)  # next to model and optimizer
        break
loader.close()

buffer.seek(0)
state = torch.load(buffer, weights_only=True)["data"]
on_three = dp.Loader(recipe, seed=3, num_workers=3)
on_three.load_state_dict(state)
rest = ids(on_three)
assert sorted(head + rest) == ALL_IDS  # every record once, none lost, none repeated
print(f"resumed with 3 workers after {len(head)} records: the other {len(rest)}, once each")

resumed = dp.Loader(recipe, seed=3, num_workers=2)
resumed.load_state_dict(state)
tail = ids(resumed)
assert head + tail == two_a  # the uninterrupted order, nothing lost or repeated
print(f"resumed with 2 workers after {len(head)} records: identical stream")

# %% [markdown]
# ## Choosing `num_workers`
#
# Workers pay off when a step is CPU-bound and holds the GIL: pure-Python
# parsing, tokenizing, augmenting. Here a pure-Python map stands in for a
# tokenizer, and `time.sleep` for the training step on a GPU (it leaves the
# CPU free, as a GPU step does), set to about half the time the map takes per
# batch: without workers the loop must wait. `stats=True` measures how long
# the training loop waited in `next(loader)`.


# %%
def tokenize(i: int) -> int:  # pure Python: holds the GIL
    h = i
    for _ in range(2500):
        h = (h * 31 + 7) % 1_000_003
    return h


start = time.perf_counter()
for i in range(200):
    tokenize(i)
per_item = (time.perf_counter() - start) / 200
step = 16 * per_item / 2  # the training step: half of what a batch of 16 costs to make
print(f"tokenize: {per_item * 1e6:.0f} us per item; a training step of {step * 1e3:.1f} ms")

slow = dp.range(3072).map(tokenize).batch(16)
results = {}
for workers in (0, 1, 2):
    loader = dp.Loader(slow, num_workers=workers, stats=True)
    start = time.perf_counter()
    batches = []
    for batch in loader:
        time.sleep(step)  # the training step
        batches.append(batch)
    elapsed = time.perf_counter() - start
    stats = loader.stats()
    results[workers] = sorted(torch.cat(batches).tolist())
    print(
        f"num_workers={workers}: epoch {elapsed:.2f} s, the loop waited "
        f"{stats.loader_wait_seconds:.2f} s for data "
        f"({100 * stats.loader_wait_seconds / stats.elapsed_seconds:.0f}%)"
    )
print(loader.stats())  # the per-step table of the last run
assert results[0] == results[1] == results[2]  # same samples, whatever the workers

# %% [markdown]
# (Timings are printed, never asserted: they depend on the machine.) With 0
# workers the loop waits while every batch is computed, about two thirds of
# the epoch. One worker computes the next batches during the training step,
# so the loop waits only for what the map costs beyond the step. Two workers
# can produce as fast as the loop consumes, *if* two cores are free for
# them: on a 2-core machine they compete with the training process itself
# and gain less, which is the second rule below at work. The wait also
# includes starting the workers (a fraction of a second), so it never
# reaches zero in an epoch this short.
#
# In the table, a step in the workers reports `self s` as the workers' time
# divided by their number (the wall-clock time it costs the epoch), and
# `us/item` as its cost per item in one process (what a worker spends).
#
# The rule of thumb:
#
# - **Raise `num_workers` until the loop stops waiting** (the "waited" line of
#   `print(loader.stats())`); more only costs memory and start-up time.
# - **Never above the cores you can spare**: the training process, its
#   threads and other jobs need CPUs too. Past that, workers only take turns.
# - **Work that releases the GIL** (numpy, Pillow, torch ops, file or network
#   reads) runs well on threads: `.map(fn, num_workers=k)` inside the recipe,
#   no processes, no pickling of items. A map with `method="process"` is for
#   pure Python without Loader workers (workers cannot start processes).
# - **`persistent_workers=True`** keeps the workers from one epoch to the next
#   instead of starting new ones (worth it when an epoch is short or the
#   workers import a lot); **`prefetch_factor`** (default 2) is how many
#   items each worker computes ahead. Both go to the DataLoader:
#   `dp.Loader(pipe, num_workers=4, persistent_workers=True, prefetch_factor=4)`.
# - **`items_per_transfer`**: every item that crosses from a worker to the
#   training process costs a fraction of a millisecond of CPU in the
#   DataLoader's protocol, whatever its size. So by default (`"auto"`) each
#   worker sends up to 16 items at once, fewer when they hold 256 KiB (a
#   batch of images travels alone); the order is runs of a transfer's items
#   per worker (the same every run: the rule weighs the items, never a
#   clock), and checkpoints stay exact mid-run. `items_per_transfer=1` sends
#   one item at a time, `K` up to K.


# %%
def double(i: int) -> int:
    return 2 * i


small = dp.range(600).map(double)  # cheap, small items: the transfer is the cost
one_by_one = list(dp.Loader(small, num_workers=2, items_per_transfer=1))
bundled = dp.Loader(small, num_workers=2)  # items_per_transfer="auto"
stream = list(bundled)
assert sorted(stream) == sorted(one_by_one)  # the same items, in runs of 16 per worker
assert stream[:17] == [4 * i for i in range(16)] + [2]
it = iter(bundled)
head = [next(it) for _ in range(40)]  # stop in the middle of a run of 16
state = bundled.state_dict()
bundled.close()
again = dp.Loader(small, num_workers=2)
again.load_state_dict(state)
assert head + list(again) == stream  # resumed mid-run: nothing lost or repeated
print(f"auto: runs of 16 per worker, {stream[:3]}..., resumed after 40 items")

# %% [markdown]
# ## Your own DataLoader: `as_torch_dataset()`
#
# To keep a `DataLoader` of your own (its options, a framework that builds
# it), `pipe.as_torch_dataset(seed=...)` gives an `IterableDataset` that deals
# itself across the DataLoader's workers (and ranks) the same way. Call
# `set_epoch(e)` before each epoch, as with `DistributedSampler`: each epoch
# then holds every sample once, in a new shuffle.
#
# Pass **`batch_size=None`** when the recipe batches: the DataLoader's default
# `batch_size=1` would take each of our batches as one sample and collate a
# batch of one around it (an extra leading dimension); `batch_size=None` hands
# the items through as they are.

# %%
batched = dp.range(48).shuffle().batch(8)
dataset = batched.as_torch_dataset(seed=0)
assert next(iter(DataLoader(dataset))).shape == (1, 8)  # batch_size=1: a batch of one batch
assert next(iter(DataLoader(dataset, batch_size=None))).shape == (8,)

loader = DataLoader(dataset, batch_size=None, num_workers=2)
epochs = []
for epoch in range(2):
    dataset.set_epoch(epoch)
    epochs.append(torch.cat(list(loader)).tolist())
print("epoch 0:", epochs[0][:12], "...")
print("epoch 1:", epochs[1][:12], "...")
assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(48))  # each sample once per epoch
assert epochs[0] != epochs[1]  # a new order each epoch

# %% [markdown]
# Forget `set_epoch` and, with workers, every epoch repeats the same order:
# the DataLoader hands each epoch a fresh copy of the dataset, which cannot
# know how many epochs came before (as with `DistributedSampler`). `dp.Loader`
# counts epochs itself, so there is nothing to forget.

# %%
forgetful = DataLoader(batched.as_torch_dataset(seed=0), batch_size=None, num_workers=2)
first, second = (torch.cat(list(forgetful)).tolist() for _ in range(2))
assert first == second  # the same "epoch" twice
loader = dp.Loader(batched, seed=0, num_workers=2)
assert torch.cat(list(loader)).tolist() != torch.cat(list(loader)).tolist()
print("without set_epoch: the same order every epoch; dp.Loader moves on by itself")

# %% [markdown]
# Under torchdata's `StatefulDataLoader`, the loader's `state_dict()` holds
# every worker's dataset state, so a mid-epoch checkpoint resumes exactly,
# without replaying the epoch.

# %%


def stateful_loader() -> StatefulDataLoader:
    return StatefulDataLoader(batched.as_torch_dataset(seed=0), batch_size=None, num_workers=2)


full = [b.tolist() for b in stateful_loader()]
loader = stateful_loader()
it = iter(loader)
head = [next(it).tolist() for _ in range(3)]
buffer = io.BytesIO()
torch.save(loader.state_dict(), buffer)
del it, loader

buffer.seek(0)
loader = stateful_loader()
loader.load_state_dict(torch.load(buffer, weights_only=True))
tail = [b.tolist() for b in loader]
assert head + tail == full
print(f"StatefulDataLoader resumed after {len(head)} of {len(full)} batches: identical stream")

# %%
shutil.rmtree(root)
