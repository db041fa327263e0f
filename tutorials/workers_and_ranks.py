# %% [markdown]
# # Worker processes and ranks: every sample exactly once, checkpoints included
#
# The classic pitfall first: a hand-written `IterableDataset` under a
# `DataLoader` with `num_workers=2` yields every sample twice. Then the same
# data through datapipes with workers and (simulated) ranks: each sample once,
# an even number of batches per rank, and a mid-epoch checkpoint taken with
# worker processes that resumes exactly. Run
# `python tutorials/workers_and_ranks.py`; it asserts what it shows.

# %%
import collections
import io
import warnings

import torch
from torch.utils.data import DataLoader, IterableDataset

import datapipes as dp

warnings.filterwarnings("ignore", message="This DataLoader will create")  # 2-core machines

# %% [markdown]
# ## The pitfall: an IterableDataset copied into every worker

# %%


class Numbers(IterableDataset):
    def __iter__(self):
        return iter(range(10))


seen = collections.Counter(int(x) for x in DataLoader(Numbers(), batch_size=None, num_workers=2))
print("plain torch, 2 workers:", dict(sorted(seen.items())))
assert all(count == 2 for count in seen.values())  # every sample twice

# %% [markdown]
# ## The same data through datapipes
#
# A source deals its data to consumers, one per (rank, worker) pair, so the
# number of workers never changes *which* samples an epoch holds.

# %%
pipe = dp.range(10)
for workers in (0, 1, 2, 3):
    got = sorted(dp.Loader(pipe, num_workers=workers))
    assert got == list(range(10)), (workers, got)
print("datapipes, 0-3 workers: each sample once")

# %% [markdown]
# A stream that cannot deal itself is refused rather than duplicated, and
# `.shard()` splits it explicitly.

# %%
stream = dp.from_iterable(lambda: iter(range(10)))
try:
    dp.Loader(stream, num_workers=2)
except ValueError as error:
    print("refused:", str(error).split(":")[0])
else:
    raise AssertionError("a from_iterable with two workers must be refused")
assert sorted(dp.Loader(stream.shard(), num_workers=2)) == list(range(10))

# %% [markdown]
# ## Your own DataLoader: `as_torch_dataset()`

# %%
dataset = dp.range(10).shuffle().as_torch_dataset(seed=0)
loader = DataLoader(dataset, batch_size=None, num_workers=2)
dataset.set_epoch(0)
epoch0 = [int(x) for x in loader]
dataset.set_epoch(1)
epoch1 = [int(x) for x in loader]
assert sorted(epoch0) == sorted(epoch1) == list(range(10)) and epoch0 != epoch1
print("as_torch_dataset, epoch 0:", epoch0)

# %% [markdown]
# ## Ranks: disjoint shares and even epochs
#
# Three ranks (given explicitly here; under `torchrun` they come from
# `torch.distributed`) over 20 samples in batches of 3. Rank shares differ in
# size, so without care one rank would finish an epoch early and DDP would
# hang waiting for it. `even_batches=True` makes every rank stop after the
# same number of batches and warns how many items it dropped.

# %%
batches = dp.range(20).shuffle().batch(3)
per_rank, dropped = [], 0
for rank in range(3):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dp.UnevenDataWarning)
        loader = dp.Loader(batches, rank=rank, world_size=3, num_workers=2, even_batches=True)
        per_rank.append([b.tolist() for b in loader])
    for warning in caught:
        print(f"rank {rank}:", warning.message)
        dropped += int(str(warning.message).split("last ")[1].split(" ")[0])
counts = [len(b) for b in per_rank]
samples = [x for rank_batches in per_rank for b in rank_batches for x in b]
print("batches per rank:", counts)
assert len(set(counts)) == 1
assert len(samples) == len(set(samples))  # no sample on two ranks
print(f"{len(samples)} samples delivered; {dropped} batch(es) dropped to keep ranks even")

# %% [markdown]
# ## A checkpoint taken with worker processes
#
# The state covers every worker: each one's position as of the last batch
# the training loop received, and which worker is next. Batches the workers
# had computed ahead are computed again after the resume.

# %%
pipe = dp.range(100).shuffle().map(lambda x: x * 10).batch(8)
full = [b.tolist() for b in dp.Loader(pipe, seed=1, num_workers=2)]

loader = dp.Loader(pipe, seed=1, num_workers=2)
it = iter(loader)
first = [next(it).tolist() for _ in range(5)]
buffer = io.BytesIO()
torch.save(loader.state_dict(), buffer)
loader.close()

resumed = dp.Loader(pipe, seed=1, num_workers=2)
buffer.seek(0)
resumed.load_state_dict(torch.load(buffer, weights_only=True))
rest = [b.tolist() for b in resumed]
assert first + rest == full
print(f"resumed after 5 of {len(full)} batches with 2 workers: identical stream")
