# %% [markdown]
# # Reuse across projects: custom nodes, the conformance kit, pipelines as packages, migrating
#
# A recipe is a plain Python object: one project builds it in a function,
# another imports the function and trains on it, in its own processes, with
# checkpoints that move between the two. When the built-in steps are not
# enough, a step of your own is a `nodes.Node` that plugs into a recipe with
# `.apply_node(...)` and runs wherever the recipe runs (worker processes,
# ranks, checkpoints included), as long as it keeps the node contract. The
# conformance kit, `nodes.testing.check_node`, checks that contract on your
# node the way the test suite checks every built-in one.
#
# This tutorial writes two custom nodes for language-model pretraining
# (packing documents into fixed-length rows, masking tokens at random), runs
# the kit on them (and watches it catch a broken one), masks with
# `random_map` instead (augmentations seeded per item), packages a pipeline
# as a small package, resumes its checkpoint in another process that only
# imports the package, and ends with migration guides from
# `torchdata.nodes`, a Hugging Face `datasets` streaming loop (or keeping the
# HF dataset, split over ranks and workers by its shards) and a hand-written
# `IterableDataset`.
#
# Run `python tutorials/08_reuse_across_projects.py`; it asserts what it shows.

# %%
import ast
import inspect
import io
import json
import linecache
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never ask the Hub

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import datapipes as dp
from nodes import Context, Node, UniformStream
from nodes.testing import check_node

warnings.filterwarnings("ignore", message="This DataLoader will create")  # 2-core machines

# %% [markdown]
# ## The data: documents of different lengths
#
# Four JSONL shards of short "documents". A toy tokenizer turns a document's
# text into a list of token ids (one per character; a real project would call
# its tokenizer here).

# %%
workdir = Path(tempfile.mkdtemp(prefix="datapipes-reuse-"))
(workdir / "data").mkdir()
for shard in range(4):
    with open(workdir / "data" / f"docs-{shard}.jsonl", "w") as f:
        for i in range(shard * 30, (shard + 1) * 30):
            f.write(json.dumps({"id": i, "text": f"doc {i} " + "ab" * (i % 9)}) + "\n")
DEFAULT_FILES = str(workdir / "data" / "docs-*.jsonl")


def tokenize(record: dict) -> list[int]:
    return [ord(c) for c in record["text"]]


# %% [markdown]
# ## A custom node
#
# A node is an iterator with a resumable position (the full contract is in
# the `nodes.Node` docstring):
#
# * `__init__(upstream, ...)` passes its input to `super().__init__(upstream)`,
#   so that `close()` and the statistics reach the steps before it;
# * `reset(state)` starts the epoch (`None`) or continues right after the
#   item at which `state` was taken; it resets its input too;
# * `__next__()` returns the next item, or raises `StopIteration` (and keeps
#   raising it) when the epoch is over;
# * `state_dict()` returns the position after the last item returned, as
#   plain data (dicts, lists, str, int, float, bool, None).
#
# `PackTokens` concatenates documents and cuts the stream into rows of
# exactly `block_size` tokens, so no compute is spent on padding. Its state
# is its input's position plus the tokens it holds over for the next row
# (fewer than `block_size`: small, and plain ints).


# %%
class PackTokens(Node):
    """Concatenates lists of token ids and cuts them into blocks of ``block_size``.

    The tokens left at the end of the epoch (less than a block) are dropped.
    """

    def __init__(self, upstream: Node, block_size: int) -> None:
        super().__init__(upstream)
        self.upstream = upstream
        self.block_size = block_size

    def reset(self, state: dict | None = None) -> None:
        self.upstream.reset(None if state is None else state["upstream"])
        self.carry = [] if state is None else list(state["carry"])

    def __next__(self) -> list[int]:
        while len(self.carry) < self.block_size:
            self.carry += next(self.upstream)  # StopIteration here ends the epoch
        block, self.carry = self.carry[: self.block_size], self.carry[self.block_size :]
        return block

    def state_dict(self) -> dict:
        return {"upstream": self.upstream.state_dict(), "carry": list(self.carry)}


# %% [markdown]
# `.apply_node(PackTokens, 16)` makes it a step of a recipe: the Loader
# builds `PackTokens(upstream_node, 16)` in every process that runs the
# recipe. It prints, fingerprints and checkpoints like any other step.

# %%
packed = dp.files(DEFAULT_FILES).read_jsonl().map(tokenize).apply_node(PackTokens, 16)
print(packed)
rows = list(dp.Loader(packed))
all_tokens = [t for r in dp.Loader(dp.files(DEFAULT_FILES).read_jsonl()) for t in tokenize(r)]
print(f"{len(rows)} rows of 16 tokens from {len(all_tokens)} tokens")
assert all(len(row) == 16 for row in rows)
assert sum(rows, []) == all_tokens[: 16 * len(rows)]  # every token, in order, none padded

# %% [markdown]
# ## Randomness in a custom node
#
# A node that draws random numbers must draw them from its `Context`, never
# from the global `random`/`numpy`/`torch` generators: then the same seed
# gives the same draws in every run and process, every epoch draws anew, and
# a resume continues the stream instead of starting it over. A factory (here
# the class) with a `ctx` parameter gets the context of the consumer it runs
# for. `ctx.random_key(...)` is (seed, epoch, this step's place) plus what you
# add: the consumer index, so each worker and rank masks differently.
# `nodes.UniformStream` turns a key into floats you can seek by position, so
# the state is one integer.

# %%
MASK = 0


class MaskTokens(Node):
    """Replaces each token by ``MASK`` with probability ``p``; the rows become tensors."""

    def __init__(self, upstream: Node, p: float, ctx: Context) -> None:
        super().__init__(upstream)
        self.upstream = upstream
        self.p = p
        self.ctx = ctx

    def reset(self, state: dict | None = None) -> None:
        self.upstream.reset(None if state is None else state["upstream"])
        self.draws = UniformStream(self.ctx.random_key(self.ctx.consumer_index))
        self.draws.seek(0 if state is None else state["draws"])

    def __next__(self) -> torch.Tensor:
        row = next(self.upstream)
        return torch.tensor([MASK if self.draws.next() < self.p else t for t in row])

    def state_dict(self) -> dict:
        return {"upstream": self.upstream.state_dict(), "draws": self.draws.position()}


masked = packed.apply_node(MaskTokens, 0.15)
loader = dp.Loader(masked, seed=0)
epoch_0, epoch_1 = [r.tolist() for r in loader], [r.tolist() for r in loader]
share = sum(t == MASK for row in epoch_0 for t in row) / (16 * len(epoch_0))
print(f"masked {share:.0%} of the tokens")
assert 0.08 < share < 0.22
assert epoch_0 != epoch_1  # a new mask every epoch
assert [r.tolist() for r in dp.Loader(masked, seed=0)] == epoch_0  # the same seed: same masks

# %% [markdown]
# ### Augmentations without a custom node: `random_map`
#
# For a per-item random transform no node is needed. `.random_map(fn)` calls
# `fn(item, rng)` with a fresh `numpy.random.Generator` whose stream is a pure
# function of (seed, epoch, the step's place, the item's place in the epoch's
# data; here its file and line). So the same document gets the same mask at
# any `num_workers` or world size, after a resume and in a new process, and a
# new one every epoch. An unmodified transform that draws from `torch.rand`,
# `random` or `np.random` runs the same way under `global_rng=True` (those
# generators are seeded per item and restored afterwards).


# %%
def mask_document(tokens: list[int], rng) -> list[int]:
    keep = rng.random(len(tokens)) >= 0.15
    return [t if k else MASK for t, k in zip(tokens, keep)]


augmented = dp.files(DEFAULT_FILES).read_jsonl().map(tokenize).random_map(mask_document)
in_process = list(dp.Loader(augmented, seed=0))
with_workers = list(dp.Loader(augmented, seed=0, num_workers=2))
assert sorted(with_workers) == sorted(in_process)  # the same masks, whichever worker read it
loader = dp.Loader(augmented, seed=0)
it = iter(loader)
head = [next(it) for _ in range(50)]
resumed = dp.Loader(augmented, seed=0)
resumed.load_state_dict(loader.state_dict())
assert head + list(resumed) == in_process  # and after a resume
assert list(dp.Loader(augmented, seed=0)) != list(loader)  # loader is now in epoch 1: new masks


def flip_torch(tokens: list[int]) -> list[int]:  # an unmodified, global-RNG transform
    return tokens[::-1] if torch.rand(()) < 0.5 else tokens


flipped = dp.files(DEFAULT_FILES).read_jsonl().map(tokenize).random_map(flip_torch, global_rng=True)
before = torch.get_rng_state()
assert sorted(dp.Loader(flipped, seed=0)) == sorted(dp.Loader(flipped, seed=0, num_workers=2))
assert torch.equal(torch.get_rng_state(), before)  # the training loop's RNG is untouched

# Steps that read ahead (prefetch, a parallel map) cannot say which item they returned, so a
# random_map after them is refused when the graph is built, saying where to put it.
ahead = dp.files(DEFAULT_FILES).read_jsonl().map(tokenize).prefetch(4).random_map(mask_document)
try:
    list(dp.Loader(ahead))
    raise AssertionError("a random_map after prefetch() should be refused")
except dp.RandomMapError as error:
    print("refused:", str(error).split(". ")[-1])
print("random_map: the same masks and flips at 0 and 2 workers and after a resume")

# %% [markdown]
# ## The conformance kit
#
# `check_node(factory)` builds the node graph for a context again and again
# and checks the contract: exact resume at every position (or a spread of
# them) in two epochs, including a resume that runs on into the next epoch;
# states that survive `json` and `torch.load(weights_only=True)`;
# `reset(None)` restarting the epoch; an exhausted node staying exhausted
# without moving; `close()` leaving no thread behind. A recipe's `build(ctx)`
# is such a factory, so the kit checks the node inside a real pipeline (here
# after a buffer shuffle, whose resume replays its input).

# %%
report = check_node(lambda ctx: masked.build(ctx))
print(f"MaskTokens after PackTokens: {report.positions_checked} resume positions checked")

stirred = dp.files(DEFAULT_FILES).read_jsonl().shuffle(buffer_size=8).map(tokenize)
report = check_node(lambda ctx: stirred.apply_node(PackTokens, 16).build(ctx))
print(f"PackTokens after a buffer shuffle: items per epoch {report.items_per_epoch}")
assert report.items_per_epoch[0] == len(rows)

# %% [markdown]
# The kit earns its keep on the node that is *almost* right. This variant
# forgets to save the tokens it holds over; everything looks fine until a
# resume, which then loses them. The kit names the first position where the
# resumed stream differs.


# %%
class ForgetfulPackTokens(PackTokens):
    def state_dict(self) -> dict:
        return {"upstream": self.upstream.state_dict(), "carry": []}  # the bug


forgetful = dp.files(DEFAULT_FILES).read_jsonl().map(tokenize).apply_node(ForgetfulPackTokens, 16)
try:
    check_node(lambda ctx: forgetful.build(ctx))
except AssertionError as error:
    print("the kit caught it:", str(error)[:110], "...")
    assert "resume after" in str(error) and "is not exact" in str(error)
else:
    raise AssertionError("the conformance kit must catch a node that loses its carry")

# %% [markdown]
# ## A pipeline as a function another project imports
#
# The data team keeps its recipes in a package: the nodes in one module, a
# function per pipeline in another. A recipe holds no open files, threads or
# data, only the description, so returning it from a function is all there
# is to "packaging" it. Here the package `acme_data` is written from the
# code above, as if it were pip-installed (`source_of` copies a definition
# out of this script or notebook; a real project has the files already).


# %%
def train_pipe(files: str = DEFAULT_FILES, block_size: int = 16, mask: float = 0.15) -> dp.DataPipe:
    """The pretraining stream: shuffled shards, packed rows, masked tokens, batches of 8."""
    return (
        dp.files(files)
        .shuffle()
        .read_jsonl()
        .map(tokenize)
        .apply_node(PackTokens, block_size)
        .apply_node(MaskTokens, mask)
        .batch(8)
    )


def source_of(definition: type | object) -> str:
    """The source of a class or function defined in this script or notebook.

    (``inspect.getsource`` finds no class defined in a notebook cell before
    Python 3.13; the code of its methods still knows where it came from.)
    """
    if inspect.isfunction(definition):
        return inspect.getsource(definition)
    method = next(f for f in vars(definition).values() if inspect.isfunction(f))
    lines = linecache.getlines(method.__code__.co_filename)
    tree = ast.parse("".join(lines))
    found = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name == definition.__name__
    )
    return "".join(lines[found.lineno - 1 : found.end_lineno]) + "\n"


package = workdir / "site-packages" / "acme_data"
package.mkdir(parents=True)
(package / "nodes.py").write_text(
    '"""acme_data\'s custom steps."""\n\nimport torch\n\nfrom nodes import Context, Node, '
    f"UniformStream\n\nMASK = {MASK}\n\n\n"
    + "\n\n".join(source_of(cls) for cls in (PackTokens, MaskTokens))
)
(package / "__init__.py").write_text(
    '"""acme_data: the team\'s training data, as datapipes recipes."""\n\n'
    "import datapipes as dp\nfrom acme_data.nodes import MaskTokens, PackTokens\n\n"
    f"DEFAULT_FILES = {DEFAULT_FILES!r}\n\n\n"
    + "\n\n".join(source_of(fn) for fn in (tokenize, train_pipe))
)
print(sorted(p.name for p in package.iterdir()))

# %% [markdown]
# The training project imports it. Its recipe pickles by reference to the
# package's functions and classes, which another process imports by name; a
# lambda has no name to import, so the standard pickle refuses a recipe that
# holds one. (A Loader's `spawn` and `forkserver` workers receive the recipe
# by value, with cloudpickle, so lambdas work there; a package shares
# recipes by name.) And because a fingerprint names functions and classes by
# their qualified names, the package's `train_pipe()` is *the same recipe*
# as the one defined above.

# %%
sys.path.insert(0, str(package.parent))
import acme_data  # noqa: E402

imported = acme_data.train_pipe()
print(imported)
assert imported.fingerprint() == train_pipe().fingerprint()
shipped = pickle.loads(pickle.dumps(imported))
assert [b.tolist() for b in dp.Loader(shipped)] == [b.tolist() for b in dp.Loader(train_pipe())]
assert "acme_data" in str(pickle.dumps(imported))  # by reference: the names, not the code
try:
    pickle.dumps(dp.range(3).map(lambda x: x))
except (pickle.PicklingError, AttributeError) as error:
    print("a recipe with a lambda does not pickle:", type(error).__name__)
else:
    raise AssertionError("a lambda must not pickle")

# %% [markdown]
# So a checkpoint moves between projects. This process trains 5 batches on
# its own recipe with 2 workers and saves; a *new process* that knows only
# `acme_data` loads the checkpoint and finishes the epoch. The command-line
# inspector, pointed at the package's function, confirms that the
# checkpoint belongs to that recipe.

# %%
reference = [b.tolist() for b in dp.Loader(train_pipe(), seed=0, num_workers=2)]
loader = dp.Loader(train_pipe(), seed=0, num_workers=2)
it = iter(loader)
head = [next(it).tolist() for _ in range(5)]
dp.save_checkpoint({"data": loader.state_dict()}, workdir / "ckpt.pt")
loader.close()

other_project = (
    "import sys\nimport torch\nimport datapipes as dp\nfrom acme_data import train_pipe\n\n"
    "loader = dp.Loader(train_pipe(), seed=0, num_workers=2)\n"
    'loader.load_state_dict(dp.load_checkpoint(sys.argv[1])["data"])\n'
    "torch.save([batch.tolist() for batch in loader], sys.argv[2])\n"
)
(workdir / "train.py").write_text(other_project)
environment = {**os.environ, "PYTHONPATH": str(package.parent)}
run = [
    sys.executable,
    str(workdir / "train.py"),
    str(workdir / "ckpt.pt"),
    str(workdir / "rest.pt"),
]
subprocess.run(run, check=True, env=environment, cwd=workdir)
rest = torch.load(workdir / "rest.pt", weights_only=True)
assert head + rest == reference
print(f"another process resumed after {len(head)} of {len(reference)} batches: identical stream")

inspected = subprocess.run(
    [sys.executable, "-m", "datapipes", "inspect", "ckpt.pt", "--recipe", "acme_data:train_pipe"],
    capture_output=True,
    text=True,
    env=environment,
    cwd=workdir,
)
print("\n".join(inspected.stdout.splitlines()[-3:]))
assert inspected.returncode == 0, inspected.stdout + inspected.stderr

# %% [markdown]
# ## Migrating from `torchdata.nodes`
#
# The runtime layer of datapipes is close to `torchdata.nodes`, one level
# down from recipes. What you wrote there, and what it is here:
#
# * `IterableWrapper(iterable)`: `dp.from_iterable(iterable)`, or
#   `dp.from_sequence(seq)` when items can be fetched by index;
# * `SamplerWrapper(RandomSampler(ds))` + `Mapper(node, ds.__getitem__)`:
#   `dp.from_sequence(ds).shuffle()`;
# * `Mapper(node, fn)`, `ParallelMapper(node, fn, num_workers, method)`:
#   `.map(fn)`, `.map(fn, num_workers, method=...)`;
# * `Batcher(node, n)` + `Mapper(node, collate)`, `Unbatcher(node)`:
#   `.batch(n, collate_fn=...)`, `.unbatch()`;
# * `Prefetcher(node, k)`, `PinMemory(node)`: `.prefetch(k)`, `.pin_memory()`;
# * `MultiNodeWeightedSampler({...}, weights)`: `dp.mix([...], weights)`; its
#   default `CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED` restarts the sources that
#   run out, where `dp.mix` draws each item once (`stop="all_exhausted"`,
#   torchdata's `ALL_DATASETS_EXHAUSTED`) or stops at the first empty one
#   (`"first_exhausted"`); to cycle a small source, `.repeat()` it;
# * `Loader(node)` with `state_dict()`/`load_state_dict()`: `dp.Loader(pipe, seed)`,
#   the same, plus epochs, ranks and worker processes;
# * a `BaseNode` subclass with `reset(initial_state)`, `next()`, `get_state()`:
#   a `nodes.Node` with `reset(state)`, `__next__()`, `state_dict()`, plugged
#   into a recipe with `.apply_node(...)`.
#
# Checkpoints do not carry over between the two libraries: resume the last
# torchdata checkpoint with torchdata, and start the datapipes run at an
# epoch boundary (`loader.set_epoch(e)`).
#
# The same pipeline both ways gives the same batches:

# %%
from torchdata import nodes as tn  # noqa: E402


def collate(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows)


def pad_to_8(tokens: list[int]) -> list[int]:
    return (tokens + [MASK] * 8)[:8]


documents = [tokenize(r) for r in dp.Loader(dp.files(DEFAULT_FILES).read_jsonl())]
node = tn.IterableWrapper(documents)
node = tn.Mapper(node, pad_to_8)
node = tn.Batcher(node, batch_size=16, drop_last=False)
node = tn.Mapper(node, collate)
theirs = [b.tolist() for b in tn.Loader(node)]

ours_pipe = dp.from_sequence(documents).map(pad_to_8).batch(16, collate_fn=collate)
ours = [b.tolist() for b in dp.Loader(ours_pipe)]
assert ours == theirs
print(f"torchdata.nodes and datapipes: the same {len(ours)} batches")

# %% [markdown]
# ## Migrating from a Hugging Face `datasets` streaming loop
#
# * `load_dataset("json", data_files=files, streaming=True)`:
#   `dp.files(files).read_jsonl()` (and `read_csv`, `read_lines`, `read_npy`,
#   `read_tar` for webdataset shards);
# * `.shuffle(seed=..., buffer_size=k)`: `dp.files(...).shuffle()` for the shard
#   order plus `.shuffle(buffer_size=k)` for records; the seed is the Loader's;
# * `.map(fn)`, `.filter(fn)`, `.take(n)`: the same names;
# * `split_dataset_by_node(ds, rank, world_size)`: nothing to call, the Loader
#   deals files to ranks and workers;
# * `ds.set_epoch(epoch)` every epoch: nothing to call, iterating the Loader
#   again runs the next epoch;
# * `DataLoader(ds, batch_size=8, num_workers=2)`: `dp.Loader(pipe.batch(8),
#   num_workers=2)`;
# * `ds.state_dict()`, whose resume skips to the position in the current shard
#   and refills the shuffle buffer with new records (the buffered ones are
#   lost, as its documentation says): `loader.state_dict()`, whose resume
#   seeks to the reader's byte offset and rebuilds the buffer exactly.

# %%
import datasets  # noqa: E402
from datasets.distributed import split_dataset_by_node  # noqa: E402

files = sorted(str(p) for p in (workdir / "data").glob("docs-*.jsonl"))
streaming = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
hf_tokens = [tokenize(record) for record in streaming]
dp_tokens = [tokenize(record) for record in dp.Loader(dp.files(DEFAULT_FILES).read_jsonl())]
assert hf_tokens == dp_tokens
print(f"HF streaming and datapipes: the same {len(dp_tokens)} documents")

# The usual training loop, both ways: shuffled shards and records, this rank's share
# (one rank here), a new order every epoch, batches of 8 from a DataLoader.
hf = streaming.shuffle(seed=0, buffer_size=64)
hf = split_dataset_by_node(hf, rank=0, world_size=1)
hf_epochs = []
for epoch in range(2):
    hf.set_epoch(epoch)
    hf_epochs.append([i for b in DataLoader(hf, batch_size=8) for i in b["id"].tolist()])

recipe = dp.files(DEFAULT_FILES).shuffle().read_jsonl().shuffle(buffer_size=64).batch(8)
loader = dp.Loader(recipe, seed=0)  # rank, world size and epochs: the Loader's business
dp_epochs = [[i for b in loader for i in b["id"].tolist()] for _ in range(2)]
for epochs in (hf_epochs, dp_epochs):
    assert all(sorted(ids) == list(range(120)) for ids in epochs) and epochs[0] != epochs[1]
print("both loops: every document once per epoch, a new order each epoch")

# Keeping the HF dataset and wrapping it works too (its own state_dict resumes it, and
# the Loader tells it each epoch through set_epoch), but its shuffle buffer is not in that
# state: the Loader says so when it is made, and names the exact recipe above.
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always", dp.InexactResumeWarning)
    dp.Loader(dp.from_iterable(streaming.shuffle(seed=0, buffer_size=64)))
assert [w.category for w in said] == [dp.InexactResumeWarning]
print("wrapping HF's shuffle buffer:", str(said[0].message).split(":")[0])

# %% [markdown]
# ### Keeping the HF streaming dataset: split by its shards
#
# `dp.from_iterable(streaming)` deals an HF `IterableDataset` over every
# consumer (ranks x DataLoader workers) the way HF's `split_dataset_by_node`
# does: whole shards when it has at least as many as consumers (shard `i`
# to consumer `i % C`), else every C-th example. Nothing to call per rank,
# `set_epoch` reaches it every epoch, and its own `state_dict` resumes each
# worker exactly (without a shuffle buffer). Here: 2 ranks x 2 workers over
# its 4 shards, every document once, and a resume mid-epoch.

# %%
streamed = dp.from_iterable(streaming).map(tokenize)
per_rank_docs = [
    list(dp.Loader(streamed, rank=rank, world_size=2, num_workers=2)) for rank in range(2)
]
assert sorted(per_rank_docs[0] + per_rank_docs[1]) == sorted(dp_tokens)
loader = dp.Loader(streamed, rank=1, world_size=2, num_workers=2)
it = iter(loader)
first = [next(it) for _ in range(7)]
state = loader.state_dict()
resumed = dp.Loader(streamed, rank=1, world_size=2, num_workers=2)
resumed.load_state_dict(state)
assert first + list(resumed) == per_rank_docs[1]
print(f"HF streaming over 2 ranks x 2 workers: {len(dp_tokens)} documents, each once; resumed")

# %% [markdown]
# ## Migrating from a hand-written `IterableDataset`
#
# The usual hand-written dataset deals its files by DataLoader worker itself
# (and, under DDP, by rank too). It is usually a loop over files, then over
# lines, then a transform: exactly a recipe. The recipe gives the same
# stream, here even in the same order under 2 workers when each worker sends
# one item at a time as the class's DataLoader does (`items_per_transfer=1`;
# by default a worker sends runs of up to 16 small items), and adds what the
# class lacked: ranks, shuffling per epoch, and a checkpoint.


# %%
class HandWrittenDocuments(IterableDataset):
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for path in self.paths[worker::workers]:
            with open(path) as f:
                for line in f:
                    yield tokenize(json.loads(line))


by_hand = list(DataLoader(HandWrittenDocuments(files), batch_size=None, num_workers=2))
recipe = dp.files(DEFAULT_FILES).read_jsonl().map(tokenize)
assert by_hand == list(dp.Loader(recipe, num_workers=2, items_per_transfer=1))
print("hand-written IterableDataset and the recipe: the same stream under 2 workers")

# %% [markdown]
# Not ready to rewrite it? `dp.from_iterable(HandWrittenDocuments(files))` runs
# it as it is: a torch `IterableDataset` that asks `get_worker_info()` is shown
# the consumer it runs for (worker `c` of `C`, over ranks and workers alike),
# so it splits itself over 2 ranks x 2 workers without reading a file twice.
# One that never asks is refused there, naming `.shard()` as the fix.

# %%
wrapped = dp.from_iterable(HandWrittenDocuments(files))
ranks = [list(dp.Loader(wrapped, rank=r, world_size=2, num_workers=2)) for r in range(2)]
assert sorted(ranks[0] + ranks[1]) == sorted(by_hand)
print("the hand-written dataset, wrapped: split over 2 ranks x 2 workers, each document once")

# %% [markdown]
# An iterator you cannot rewrite (a client library's generator, a queue)
# still fits: `dp.from_iterable(factory)` takes a function returning a fresh
# iterator. It resumes through the object's own `state_dict()`/
# `load_state_dict()` when it has them, else by replaying (re-iterating and
# skipping what was seen). It cannot deal itself to consumers, so with
# workers or ranks add `.shard()` (or it is refused: no silent duplicates).


# %%
class Feed:
    """A stream with its own position: resumes by seeking, not by replaying."""

    def __init__(self, n: int) -> None:
        self.n, self.position = n, 0

    def __iter__(self):
        while self.position < self.n:
            self.position += 1
            yield self.position - 1

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


feed = dp.from_iterable(lambda: Feed(50)).map(lambda x: x * 10)
loader = dp.Loader(feed)
it = iter(loader)
first = [next(it) for _ in range(20)]
buffer = io.BytesIO()
torch.save(loader.state_dict(), buffer)
buffer.seek(0)
saved = torch.load(buffer, weights_only=True)
assert '"position":20' in saved["ranks"]["0"]["node"]  # Feed's own state: a seek, no replay
resumed = dp.Loader(feed)
resumed.load_state_dict(saved)
assert first + list(resumed) == [x * 10 for x in range(50)]
assert sorted(dp.Loader(dp.from_iterable(lambda: Feed(50)).shard(), num_workers=2)) == list(
    range(50)
)
print("from_iterable: resumed through the object's own state; .shard() for workers")

# %%
sys.path.remove(str(package.parent))
shutil.rmtree(workdir)
