# %% [markdown]
# # Quickstart: tensors out of a pipeline
#
# A *recipe* (`dp.DataPipe`) describes a pipeline: a source and the steps
# chained on it. It runs nothing until a `dp.Loader` iterates it, one epoch
# per pass. This tutorial goes from a Python list, a numpy array and a torch
# map-style `Dataset` to batched tensors: fixed-shape arrays stack, dicts and
# tuples are batched field by field, ragged arrays need a collate of your own.
# It ends with the two things the later tutorials build on: a new shuffle
# every epoch and a checkpoint that resumes exactly.
#
# Run `python tutorials/01_quickstart.py`; it asserts what it shows.

# %%
import collections
import io

import numpy as np
import torch

import datapipes as dp

# %% [markdown]
# ## Three sources
#
# `dp.from_sequence` takes anything with `len()` and `[i]`: a list, a numpy
# array (its rows), a torch map-style `Dataset`, a Hugging Face `Dataset`.
# `dp.range(n)` counts. A `Loader` yields the items one epoch at a time.

# %%
words = dp.from_sequence(["cat", "dog", "emu"])
print(list(dp.Loader(words)))
assert list(dp.Loader(words)) == ["cat", "dog", "emu"]

table = np.arange(12, dtype=np.float32).reshape(6, 2)  # 6 rows of 2 features
rows = list(dp.Loader(dp.from_sequence(table)))
print(rows[:2])
assert len(rows) == 6 and rows[1].tolist() == [2.0, 3.0]  # a row is a numpy array


class Squares(torch.utils.data.Dataset):
    """A map-style Dataset, as you may already have one: ``len`` and ``[i]``."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int) -> dict:
        return {"x": i, "y": i * i, "name": f"item-{i}"}


print(list(dp.Loader(dp.from_sequence(Squares())))[:2])
assert len(list(dp.Loader(dp.from_sequence(Squares())))) == 5

# %% [markdown]
# ## Batches become tensors
#
# `.batch(n)` groups `n` items and collates them with `dp.default_collate`:
# numbers become tensors (`int64`, `float64`, `bool`), same-shaped numpy
# arrays and tensors are stacked in one call (their dtype kept), dicts,
# tuples and namedtuples are collated per field, and strings stay lists.
# The last batch may be short; `drop_last=True` drops it.

# %%
ints = list(dp.Loader(dp.range(10).batch(4)))
print(ints)
assert [b.tolist() for b in ints] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
assert ints[0].dtype == torch.int64
assert len(list(dp.Loader(dp.range(10).batch(4, drop_last=True)))) == 2

# Fixed-shape arrays: rows of the numpy table stack into a (batch, features) tensor.
features = next(iter(dp.Loader(dp.from_sequence(table).batch(4))))
print(features.shape, features.dtype)
assert features.shape == (4, 2) and features.dtype == torch.float32
assert torch.equal(features, torch.from_numpy(table[:4]))

# Dicts of fields: one tensor per numeric field, a list for the strings.
batch = next(iter(dp.Loader(dp.from_sequence(Squares()).batch(3))))
print(batch)
assert batch["y"].tolist() == [0, 1, 4] and batch["name"] == ["item-0", "item-1", "item-2"]

# Tuples and namedtuples keep their type, field by field.
Pair = collections.namedtuple("Pair", "image label")
pairs = dp.from_sequence([Pair(np.full((2, 2), i, np.uint8), i % 2) for i in range(4)])
batch = next(iter(dp.Loader(pairs.batch(4))))
assert isinstance(batch, Pair)
images, labels = batch
assert images.shape == (4, 2, 2) and images.dtype == torch.uint8
assert labels.tolist() == [0, 1, 0, 1]

# %% [markdown]
# ## Steps chain into a recipe, and a recipe prints like the code that made it
#
# `map`, `filter`, `batch` and the rest each return a new recipe; the old one
# is unchanged. Functions defined at module level (not lambdas) keep a recipe
# picklable, which worker processes started with `spawn` need (tutorial 4);
# the default `fork` on Linux needs nothing, and neither does a notebook.


# %%
def scale(sample: dict) -> dict:
    return {"x": sample["x"] / 10, "y": sample["y"]}


def has_odd_y(sample: dict) -> bool:
    return sample["y"] % 2 == 1


pipe = dp.from_sequence(Squares()).map(scale).filter(has_odd_y).batch(2)
print(pipe)
batches = list(dp.Loader(pipe))
print(batches)
assert [b["y"].tolist() for b in batches] == [[1, 9]]
assert batches[0]["x"].dtype == torch.float64  # Python floats collate to float64

# %% [markdown]
# ## Ragged arrays and a custom collate
#
# Arrays of different lengths cannot be stacked: the default collate says
# which field and what to do. A `collate_fn` of your own (here: pad to the
# longest and return the lengths) takes the list of samples of one batch;
# `dp.no_collate` keeps the list as it is.

# %%
sentences = [np.arange(1, n + 1) for n in (3, 1, 4, 2)]
ragged = dp.from_sequence([{"tokens": s, "label": len(s) % 2} for s in sentences])
try:
    next(iter(dp.Loader(ragged.batch(4))))
except ValueError as error:
    print("default_collate:", error)
    assert "samples['tokens']" in str(error)
else:
    raise AssertionError("ragged arrays must not be stacked silently")


def pad_tokens(samples: list[dict]) -> dict:
    """Pad every ``tokens`` array with zeros to the longest; keep the true lengths."""
    lengths = [len(s["tokens"]) for s in samples]
    padded = torch.zeros(len(samples), max(lengths), dtype=torch.int64)
    for row, s in enumerate(samples):
        padded[row, : len(s["tokens"])] = torch.from_numpy(s["tokens"])
    labels = torch.tensor([s["label"] for s in samples])
    return {"tokens": padded, "lengths": torch.tensor(lengths), "label": labels}


padded = next(iter(dp.Loader(ragged.batch(4, collate_fn=pad_tokens))))
print(padded)
assert padded["tokens"].shape == (4, 4) and padded["lengths"].tolist() == [3, 1, 4, 2]
assert padded["tokens"][1].tolist() == [1, 0, 0, 0]

as_lists = next(iter(dp.Loader(ragged.batch(4, collate_fn=dp.no_collate))))
assert [len(s["tokens"]) for s in as_lists] == [3, 1, 4, 2]

# %% [markdown]
# ## Combining pipes: concat, zip, mix
#
# `dp.concat` chains pipes, `dp.zip` pairs their items, `dp.mix` draws from
# several by weight (each item still exactly once by default).

# %%
chained = list(dp.Loader(dp.concat(dp.range(2), dp.from_sequence("ab"))))
paired = list(dp.Loader(dp.zip(dp.range(3), dp.from_sequence("xyz"))))
print(chained, paired)
assert chained == [0, 1, "a", "b"] and paired == [(0, "x"), (1, "y"), (2, "z")]
mixed = list(dp.Loader(dp.mix([dp.range(50), dp.range(100, 110)], weights=[5, 1], seed=0)))
assert sorted(mixed) == list(range(50)) + list(range(100, 110))  # every item exactly once

# %% [markdown]
# ## Epochs: a new shuffle each time
#
# Iterating the Loader again runs the next epoch; `.shuffle()` draws a new
# order each epoch from the Loader's `seed`, the same in every run
# (tutorial 3 covers shuffling in depth).

# %%
loader = dp.Loader(dp.range(10).shuffle(), seed=42)
epoch_0, epoch_1 = list(loader), list(loader)
print("epoch 0:", epoch_0)
print("epoch 1:", epoch_1)
assert sorted(epoch_0) == sorted(epoch_1) == list(range(10)) and epoch_0 != epoch_1
assert list(dp.Loader(dp.range(10).shuffle(), seed=42)) == epoch_0  # reproducible

# %% [markdown]
# ## Checkpoint mid-epoch, resume exactly
#
# `loader.state_dict()` is plain data: save it next to the model with
# `torch.save` (to a file: `dp.save_checkpoint`, which a crash during the save
# cannot leave half-written), load it with `torch.load(weights_only=True)`
# (`dp.load_checkpoint`), and a fresh Loader continues right after the last
# batch you received, even with a
# `.prefetch(2)` step computing two batches ahead on a background thread
# (tutorial 7). Tutorial 5 covers checkpoints in depth.


# %%
def double(x: int) -> int:
    return x * 2


def make_pipe() -> dp.DataPipe:
    return dp.range(1000).shuffle().map(double).batch(16).prefetch(2)


reference = [b.tolist() for b in dp.Loader(make_pipe(), seed=7)]

loader = dp.Loader(make_pipe(), seed=7)
seen, buffer = [], io.BytesIO()
for batch in loader:
    seen.append(batch.tolist())
    if len(seen) == 20:
        torch.save({"data": loader.state_dict()}, buffer)  # with the model and the optimizer
        break
loader.close()

buffer.seek(0)
resumed = dp.Loader(make_pipe(), seed=7)
resumed.load_state_dict(torch.load(buffer, weights_only=True)["data"])
rest = [b.tolist() for b in resumed]
print(f"{len(seen)} batches before the checkpoint, {len(rest)} after")
assert seen + rest == reference
print("resumed stream == uninterrupted stream")
