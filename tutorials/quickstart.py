# %% [markdown]
# # Quickstart: from data to batched tensors, with an exact checkpoint
#
# A *recipe* (`dp.DataPipe`) describes the pipeline; a `dp.Loader` runs it
# epoch by epoch and can checkpoint it mid-epoch. Run this file with
# `python tutorials/quickstart.py`; it asserts everything it shows.

# %%
import io

import numpy as np
import torch

import datapipes as dp

# %% [markdown]
# ## Sources: a range, a list, a numpy array, a map-style Dataset

# %%
print(list(dp.Loader(dp.range(5))))
print(list(dp.Loader(dp.from_sequence(["cat", "dog"]))))

table = np.arange(12, dtype=np.float32).reshape(6, 2)
rows = list(dp.Loader(dp.from_sequence(table)))
assert len(rows) == 6 and rows[0].tolist() == [0.0, 1.0]


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": i, "y": i * i}


print(list(dp.Loader(dp.from_sequence(Squares()))))

# %% [markdown]
# ## Steps chain into a recipe; the recipe prints like the code that made it


# %%
def scale(sample):
    return {"x": float(sample["x"]) / 10, "y": sample["y"]}


def has_odd_y(sample):
    return sample["y"] % 2 == 1


pipe = dp.from_sequence(Squares()).map(scale).filter(has_odd_y).batch(2)
print(pipe)
batches = list(dp.Loader(pipe))
print(batches)
assert batches[0]["y"].tolist() == [1, 9]
assert batches[0]["x"].dtype == torch.float64

# %% [markdown]
# ## Shuffling: a global shuffle of random-access data, new every epoch

# %%
loader = dp.Loader(dp.range(10).shuffle(), seed=42)
epoch_0, epoch_1 = list(loader), list(loader)
print("epoch 0:", epoch_0)
print("epoch 1:", epoch_1)
assert sorted(epoch_0) == sorted(epoch_1) == list(range(10)) and epoch_0 != epoch_1

# A stream (after a filter) needs a buffer: shuffle(buffer_size=...).
stream = dp.range(100).filter(lambda x: x % 3 == 0).shuffle(buffer_size=8)
assert sorted(dp.Loader(stream)) == list(range(0, 100, 3))

# %% [markdown]
# ## Combining pipes: concat, zip, mix

# %%
print(list(dp.Loader(dp.concat(dp.range(2), dp.from_sequence("ab")))))
print(list(dp.Loader(dp.zip(dp.range(3), dp.from_sequence("xyz")))))
mixed = list(dp.Loader(dp.mix([dp.range(50), dp.range(100, 110)], weights=[5, 1], seed=0)))
assert sorted(mixed) == list(range(50)) + list(range(100, 110))  # every item exactly once

# %% [markdown]
# ## Ragged data and a custom collate

# %%
ragged = dp.from_sequence([np.ones(n) for n in (1, 3, 2)])


def pad(samples):
    longest = max(len(s) for s in samples)
    return torch.stack(
        [torch.nn.functional.pad(torch.from_numpy(s), (0, longest - len(s))) for s in samples]
    )


padded = next(iter(dp.Loader(ragged.batch(3, collate_fn=pad))))
assert padded.shape == (3, 3)
as_lists = next(iter(dp.Loader(ragged.batch(3, collate_fn=dp.no_collate))))
assert [len(a) for a in as_lists] == [1, 3, 2]

# %% [markdown]
# ## Checkpoint mid-epoch, resume exactly


# %%
def make_pipe():
    return dp.range(1000).shuffle().map(lambda x: x * 2).batch(16).prefetch(2)


reference = [b.tolist() for b in dp.Loader(make_pipe(), seed=7)]

loader = dp.Loader(make_pipe(), seed=7)
seen = []
for batch in loader:
    seen.append(batch.tolist())
    if len(seen) == 20:
        buffer = io.BytesIO()
        torch.save(loader.state_dict(), buffer)  # next to the model and the optimizer
        break
loader.close()

buffer.seek(0)
resumed = dp.Loader(make_pipe(), seed=7)
resumed.load_state_dict(torch.load(buffer, weights_only=True))
rest = [b.tolist() for b in resumed]
print(f"{len(seen)} batches before the checkpoint, {len(rest)} after")
assert seen + rest == reference
print("resumed stream == uninterrupted stream")
