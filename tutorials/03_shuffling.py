# %% [markdown]
# # Shuffling: global permutations, file order and buffers, epochs and seeds
#
# How datapipes shuffles, and what decides the order:
#
# 1. random-access data (`dp.range`, `dp.from_sequence`) gets a **global** shuffle, a full
#    permutation every epoch, computed on the fly;
# 2. across ranks, every rank takes a disjoint share of that one permutation;
# 3. streams (files, filters, iterables) cannot be permuted globally: shuffle the **file
#    order** and mix records in a **buffer**, and see what the buffer size buys;
# 4. every epoch draws a new order, and `set_epoch(e)` reproduces epoch `e` exactly;
# 5. what the seed controls (and that the global RNGs are left alone);
# 6. how to choose, and an exact resume inside a shuffle.
#
# Coming from torch: `DataLoader(shuffle=True)` / `DistributedSampler(shuffle=True)` +
# `sampler.set_epoch(e)` become `.shuffle()` + `dp.Loader(rank=, world_size=)`, and the Loader
# advances the epoch itself. From HF `datasets` / webdataset: `IterableDataset.shuffle(
# buffer_size=...)` and `shardshuffle` become `.shuffle(buffer_size=...)` and
# `dp.files(...).shuffle()`. Run `python tutorials/03_shuffling.py`; it asserts what it shows.

# %%
import itertools
import json
import pathlib
import random
import shutil
import statistics
import tempfile
import time

import numpy as np
import torch

import datapipes as dp

# %% [markdown]
# ## 1. Global shuffle of random-access data
#
# When item `i` can be fetched directly (`seq[i]`), `.shuffle()` needs no buffer: the Loader
# walks positions `0, 1, 2, ...` through a seeded *permutation* and fetches `seq[perm(p)]`.
# Up to 65,536 items the permutation is drawn whole (a Fisher-Yates shuffle: every order
# equally likely, under a millisecond); above that it is a keyed Feistel network computed
# on the fly, so nothing of the data's size is ever built and a billion items start as fast
# as ten. Either way the state is one integer: how many items this consumer has taken.

# %%
start = time.perf_counter()
loader = dp.Loader(dp.range(10**9).shuffle(), seed=0)
it = iter(loader)
first = [next(it) for _ in range(5)]
print(f"first 5 of a shuffled range(10**9): {first} ({time.perf_counter() - start:.3f} s)")
state = loader.state_dict()
print(f"loader.state_dict(): {len(json.dumps(state))} bytes, node state {state['ranks']['0']}")
loader.close()
assert len(set(first)) == 5 and all(0 <= x < 10**9 for x in first)
assert json.loads(state["ranks"]["0"]["node"]) == {"position": 5}

# %% [markdown]
# Every epoch is a permutation of all items (each exactly once), and each epoch draws a new
# one. Maps before the shuffle keep the data random-access (they are applied to `seq[i]`),
# so `from_sequence(array).map(f).shuffle()` is a global shuffle too.

# %%
loader = dp.Loader(dp.range(1000).shuffle(), seed=0)
epoch_0, epoch_1 = list(loader), list(loader)
print("epoch 0 starts", epoch_0[:8], "| epoch 1 starts", epoch_1[:8])
assert sorted(epoch_0) == sorted(epoch_1) == list(range(1000))  # a permutation
assert epoch_0 != epoch_1  # a new one each epoch

table = np.arange(200, dtype=np.float32).reshape(100, 2)  # 100 rows
rows = list(dp.Loader(dp.from_sequence(table).map(lambda row: row * 10).shuffle()))
assert sorted(int(r[0]) // 20 for r in rows) == list(range(100))  # every row once
assert [int(r[0]) // 20 for r in rows] != list(range(100))  # ... and not in order

# %% [markdown]
# ## 2. Across ranks: disjoint shares of one permutation
#
# Every rank computes the *same* permutation (it depends on the seed, the epoch and the step,
# never on the rank) and takes every `world_size`-th position of it, like
# `DistributedSampler`. So the shares are disjoint and together they are the whole epoch;
# interleaved back, they are exactly the single-process order. Unlike `DistributedSampler`,
# nothing is padded with repeated samples: 1,000 items over 3 ranks are 334, 333 and 333
# (tutorial 6 shows how `even_batches` keeps ranks in step anyway).

# %%
pipe = dp.range(1000).shuffle()
world = 3
whole = list(dp.Loader(pipe, seed=5))
shares = [list(dp.Loader(pipe, seed=5, rank=r, world_size=world)) for r in range(world)]
print("share sizes:", [len(s) for s in shares], "| rank 1 starts", shares[1][:5])
assert sum(len(s) for s in shares) == len(set().union(*shares)) == 1000  # disjoint, all
for r in range(world):
    assert shares[r] == whole[r::world]  # rank r takes positions r, r + W, r + 2W, ...

# %% [markdown]
# ## 3. Streams: shuffle the file order, then mix records in a buffer
#
# A stream has no `seq[i]`: after a `filter` nobody knows which item is the 500th without
# reading 499 before it, and a file of JSON lines is read front to back. So `.shuffle()`
# without a buffer is refused on a stream, with the fix in the message:

# %%
try:
    dp.range(100).filter(lambda x: x % 3 == 0).shuffle()
except ValueError as error:
    print("refused:", error)
else:
    raise AssertionError("a global shuffle of a stream must be refused")

# Some sharded JSON-lines files: 8 shards of 500 records, each record names its shard.
folder = pathlib.Path(tempfile.mkdtemp())
SHARDS, PER_SHARD = 8, 500
for s in range(SHARDS):
    lines = (json.dumps({"shard": s, "id": s * PER_SHARD + j}) for j in range(PER_SHARD))
    (folder / f"part-{s:03d}.jsonl").write_text("\n".join(lines) + "\n")
files = dp.files(str(folder / "part-*.jsonl"))

for stream in (files.read_jsonl(), dp.from_iterable(lambda: iter(range(10)))):
    try:
        stream.shuffle()
    except ValueError as error:
        print("refused:", str(error).split(".")[0])
    else:
        raise AssertionError(f"{stream!r}.shuffle() must be refused")

# %% [markdown]
# The recipe for files has two levels:
#
# * `dp.files(...).shuffle()` permutes the **file list** every epoch. Every rank and worker
#   computes the same order, and only then are the files dealt to them, so they still split
#   the files exactly.
# * `.read_jsonl().shuffle(buffer_size=k)` mixes **records** in a buffer of `k`: it fills with
#   the first `k` records, then each new record takes the place of a random one, which is
#   emitted.
#
# Iterating a file list gives its URLs, which shows the file order directly:

# %%
shuffled_files = files.shuffle()
loader = dp.Loader(shuffled_files, seed=0)
order_0 = [pathlib.Path(u).name for u in loader]
order_1 = [pathlib.Path(u).name for u in loader]
print("file order, epoch 0:", order_0)
print("file order, epoch 1:", order_1)
listing = sorted(p.name for p in folder.iterdir())
assert sorted(order_0) == sorted(order_1) == listing and order_0 != order_1

# Two ranks deal the same (epoch 0) order round-robin: rank r gets files r, r + 2, ...
for r in range(2):
    mine = [pathlib.Path(u).name for u in dp.Loader(shuffled_files, seed=0, rank=r, world_size=2)]
    assert mine == order_0[r::2], (r, mine)

# %% [markdown]
# **What a buffer guarantees.** The buffer holds `k` items and emits one per item it reads, so
# output position `i` is drawn from the first `i + k` input items: an item comes out at most
# `k - 1` places *earlier* than it went in. It may come out much *later*, since it can sit in
# the buffer for a while (`k = 1` is no shuffle at all). We check that against the stream the
# buffer reads, which is the same recipe without it (same seed and epoch: same file order).

# %%
files_in_order = shuffled_files.read_jsonl()
inputs = [r["id"] for r in dp.Loader(files_in_order, seed=0)]
file_runs = [shard for shard, _ in itertools.groupby(i // PER_SHARD for i in inputs)]
assert file_runs == [int(name[5:8]) for name in order_0]  # whole files, in epoch 0's order


def displacement(k: int) -> dict[str, float]:
    """Run the buffer shuffle of size ``k`` over the shuffled files; measure how far items moved."""
    out = [r["id"] for r in dp.Loader(files_in_order.shuffle(buffer_size=k), seed=0)]
    assert sorted(out) == sorted(inputs)  # every record exactly once
    where = {item: p for p, item in enumerate(inputs)}
    moved = [i - where[item] for i, item in enumerate(out)]  # > 0: later, < 0: earlier
    assert all(where[item] < i + k for i, item in enumerate(out))  # the guarantee
    shard = [item // PER_SHARD for item in out]
    return {
        "mean |moved|": statistics.fmean(abs(m) for m in moved),
        "max earlier": -min(moved),
        "max later": max(moved),
        "same-shard neighbours": statistics.fmean(a == b for a, b in zip(shard, shard[1:])),
        "shards in first 200": len(set(shard[:200])),
    }


print(f"{'k':>5} | {'mean |moved|':>12} | {'max earlier':>11} | {'max later':>9} | "
      f"{'same-shard neighbours':>21} | shards in first 200")  # fmt: skip
results = {}
for k in (1, 8, 1000):
    m = results[k] = displacement(k)
    print(f"{k:>5} | {m['mean |moved|']:>12.1f} | {m['max earlier']:>11} | {m['max later']:>9} | "
          f"{m['same-shard neighbours']:>21.1%} | {m['shards in first 200']}")  # fmt: skip
assert results[1]["mean |moved|"] == 0  # a buffer of one changes nothing
assert results[8]["max earlier"] <= 7 and results[1000]["max earlier"] <= 999  # k - 1
assert results[8]["same-shard neighbours"] > 0.95  # k=8: records stay beside their file-mates
assert results[1000]["same-shard neighbours"] < results[8]["same-shard neighbours"]
assert results[1000]["mean |moved|"] > 20 * results[8]["mean |moved|"]

# %% [markdown]
# A small buffer leaves every record near its file neighbours: one file after another,
# locally stirred. That is why the two levels go together. Without the file shuffle, every
# epoch would even *start* with the same file; the file shuffle changes which file comes
# when, the buffer mixes records across the few files it spans. Make the buffer span several
# files (or make files small), and shuffle the files every epoch:

# %%
unshuffled = files.read_jsonl().shuffle(buffer_size=8)
loader = dp.Loader(unshuffled, seed=0)
for epoch in range(2):
    starts = {r["shard"] for r in list(loader)[:200]}
    print(f"no file shuffle, buffer 8, epoch {epoch}: the first 200 records come from {starts}")
    assert starts == {0}

# %% [markdown]
# ## 4. What changes between epochs
#
# Every shuffle (global, file order, buffer) draws anew each epoch: the epoch number is part
# of every random key. The Loader counts epochs as you iterate it; `set_epoch(e)` jumps to
# epoch `e`, which is then the very same epoch as one reached by iterating, in a fresh Loader
# or a new process (no RNG state to carry along).

# %%
recipes = {
    "global": dp.range(1000).shuffle(),
    "files + buffer": files.shuffle().read_jsonl().shuffle(buffer_size=64).map(lambda r: r["id"]),
}
for name, recipe in recipes.items():
    loader = dp.Loader(recipe, seed=1)
    epochs = [list(loader) for _ in range(4)]  # epochs 0, 1, 2, 3
    assert all(a != b for a, b in zip(epochs, epochs[1:]))  # new order every epoch
    fresh = dp.Loader(recipe, seed=1)
    fresh.set_epoch(3)
    assert list(fresh) == epochs[3]  # set_epoch(3) == the 4th pass
    print(f"{name}: 4 different epochs; set_epoch(3) on a fresh Loader reproduces epoch 3")

# %% [markdown]
# ## 5. What the seed controls
#
# Every random choice is a pure function of (the Loader's `seed`, the epoch, the step's place
# in the recipe: the structure of the recipe up to it (step kinds, parameters, explicit seeds),
# the combinator branch and `repeat` round it sits in; so adding, removing or changing a step
# before a shuffle changes its order). So:
#
# * the same `seed` and recipe give the same orders in every Loader, process and run;
# * another `seed` gives another order;
# * a step's own `seed=` replaces the Loader's seed *for that step*: its order is the same
#   whatever the Loader seed, and still new every epoch (the epoch stays in the key);
# * the *names* of your functions are not part of it: renaming `normalize` to `scale` keeps
#   every order (a checkpoint still records the names, and refuses a recipe whose names
#   differ; see `pipe.identity()` for exactly what counts).

# %%
pipe = dp.range(1000).shuffle()
a, b = dp.Loader(pipe, seed=7), dp.Loader(pipe, seed=7)
assert [list(a), list(a)] == [list(b), list(b)]  # same seed: same epochs 0 and 1
assert list(dp.Loader(pipe, seed=7)) != list(dp.Loader(pipe, seed=8))  # another seed


def normalize(x):
    return x / 1000


def scale(x):  # normalize, renamed
    return x / 1000


renamed = [list(dp.Loader(dp.range(1000).map(f).shuffle(), seed=7)) for f in (normalize, scale)]
assert renamed[0] == renamed[1]  # a renamed function moves no order
assert dp.range(10).map(normalize).fingerprint() != dp.range(10).map(scale).fingerprint()

# Worker processes compute the same permutation; dealt to 2 workers and interleaved back
# one item at a time (items_per_transfer=1), the global shuffle's stream is even
# item-for-item the in-process one. By default each worker sends runs of up to 16 items
# (fewer transfers, much less CPU): the same items, in runs, the same in every run.
one_by_one = dp.Loader(pipe, seed=7, num_workers=2, items_per_transfer=1)
assert list(one_by_one) == list(dp.Loader(pipe, seed=7))
runs = list(dp.Loader(pipe, seed=7, num_workers=2))
assert sorted(runs) == list(range(1000)) and runs == list(dp.Loader(pipe, seed=7, num_workers=2))

# A buffer shuffle is different: every consumer (rank x worker) shuffles its own share in
# a buffer of its own, with its own random stream, so its order depends on how many
# consumers there are. Same seed and same topology: same order; another num_workers or
# world_size: another order (and a checkpoint resumed on another topology deals the rest
# of the epoch anew: tutorial 05).
buffered = files.shuffle().read_jsonl().shuffle(buffer_size=100).map(lambda r: r["id"])
in_process, in_workers = (
    list(dp.Loader(buffered, seed=7)),
    list(dp.Loader(buffered, seed=7, num_workers=2)),
)
assert sorted(in_process) == sorted(in_workers) and in_process != in_workers
assert list(dp.Loader(buffered, seed=7, num_workers=2)) == in_workers

pinned = dp.range(1000).shuffle(seed=123)
under_0, under_1 = dp.Loader(pinned, seed=0), dp.Loader(pinned, seed=1)
e0, e1 = list(under_0), list(under_0)
assert list(under_1) == e0  # the Loader seed does not matter for this step...
assert e1 != e0 and list(under_1) == e1  # ...the epoch still does
print("shuffle(seed=123): same order under Loader seeds 0 and 1, new order each epoch")

# %% [markdown]
# **The global RNGs are neither read nor changed.** Seeding `random`, `numpy.random` or
# `torch` does not move the data order, and iterating a Loader does not advance them, so
# adding or removing a shuffle never changes your model's initialization or dropout masks.
# That holds with worker processes too: the Loader seeds them from its own seed and the
# epoch, not from `torch`'s global generator.

# %%


def global_rng_state() -> tuple:
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


orders = []
for global_seed in (0, 1):
    random.seed(global_seed)
    np.random.seed(global_seed)
    torch.manual_seed(global_seed)
    before = global_rng_state()
    for workers in (0, 2):
        loader = dp.Loader(
            files.shuffle().read_jsonl().shuffle(buffer_size=100), seed=0, num_workers=workers
        )
        orders.append([r["id"] for r in loader])
        assert global_rng_state() == before  # iterating consumed nothing from them
assert orders[0] == orders[2] and orders[1] == orders[3]  # their seeds change no order
print("global RNGs: untouched, and irrelevant to the order")

# %% [markdown]
# **Places in the recipe get their own streams.** The two branches of
# `dp.zip(a.shuffle(), a.shuffle())` shuffle independently (same recipe, different place),
# and each round of `repeat()` draws a fresh order.

# %%
a = dp.range(100)
pairs = list(dp.Loader(dp.zip(a.shuffle(), a.shuffle())))
left, right = [p[0] for p in pairs], [p[1] for p in pairs]
assert sorted(left) == sorted(right) == list(range(100)) and left != right

rounds = list(dp.Loader(dp.range(100).shuffle().repeat(3)))
r0, r1, r2 = rounds[:100], rounds[100:200], rounds[200:]
assert sorted(r0) == sorted(r1) == sorted(r2) == list(range(100))
assert r0 != r1 and r1 != r2 and r0 != r2
print("zip branches and repeat rounds: independent orders")

# %% [markdown]
# ## 6. Choosing, and resuming inside a shuffle
#
# * **Random-access data** (a list, a numpy array, a map-style `Dataset`, an HF `Dataset`,
#   rows of one big array): `dp.from_sequence(data).shuffle()`: a permutation of all of it
#   every epoch, no memory, O(1) resume. Shuffle *before* steps that make a stream
#   (`filter`, `flat_map`, `batch`, a parallel map).
# * **Sharded files**: `dp.files(...).shuffle().read_...().shuffle(buffer_size=k)`. Many
#   small shards help: the file shuffle does the coarse mixing, the buffer the fine mixing
#   across the files it spans.
# * **The buffer size** trades for mixing: it holds `k` items in memory, its checkpoint holds
#   `k` integers (positions, never items), and a resume re-reads a window of upstream items
#   (about `k * ln k`, whatever the position in the epoch).
#
# Checkpoints resume exactly inside any of these shuffles: here mid-epoch, with a full
# buffer and a shuffled file order, through a JSON round trip into a fresh Loader.

# %%
recipe = files.shuffle().read_jsonl().shuffle(buffer_size=256).batch(32)
reference = [b["id"].tolist() for b in dp.Loader(recipe, seed=3)]

loader = dp.Loader(recipe, seed=3)
it = iter(loader)
seen = [next(it)["id"].tolist() for _ in range(40)]  # 1,280 of 4,000 records in
saved = json.dumps(loader.state_dict())
loader.close()

resumed = dp.Loader(recipe, seed=3)
resumed.load_state_dict(json.loads(saved))
rest = [b["id"].tolist() for b in resumed]
assert seen + rest == reference
print(f"resumed after {len(seen)} of {len(reference)} batches (state: {len(saved)} bytes):"
      " identical stream")  # fmt: skip

shutil.rmtree(folder)
