# %% [markdown]
# # Text pretraining: tokenize, mix, pack, and resume a 2-rank job on 3 ranks
#
# Language-model pretraining reads documents from several corpora, turns
# their text into token ids, mixes the corpora in chosen proportions and
# packs the tokens into sequences of one length, with what attention needs
# to keep the documents of a sequence apart. Four steps of a recipe do it:
# `.tokenize(tokenizer)`, `dp.mix([...], weights=...)`, `.pack(seq_len)` and
# `.batch(n)`.
#
# This tutorial generates two small corpora ("web" prose in parquet shards,
# "code" in JSONL shards), trains a tiny BPE tokenizer on them in a second
# with Hugging Face `tokenizers` (nothing is downloaded), mixes their
# documents 70/30 and packs them: a sequence holds documents of both
# corpora. It looks at one packed sequence (`position_ids`, `cu_seqlens`,
# an attention mask built from them) and at the mix's realised shares. Then
# a real `torch.distributed` job (gloo, CPU, launched with `torchrun`) of 2
# ranks reads part of the epoch and checkpoints on every rank, in the
# middle of documents; a job of 3 ranks merges the checkpoints and finishes
# the epoch. Every token of the epoch arrives exactly once, which it checks
# token by token against an uninterrupted run.
#
# Run `python tutorials/10_text_pretraining.py` (it launches both jobs
# itself); it asserts what it shows. Needs `pip install -e '.[text,parquet]'`.

# %%
import inspect
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import datapipes as dp

SEED = 0
SEQ_LEN = 128  # tokens per packed sequence
BATCH = 4  # sequences per batch
WEIGHTS = [0.7, 0.3]  # web, code
STOP = 6  # batches each rank of the first job reads before its checkpoint
JOB_TIMEOUT_S = 120  # a job that hangs fails the tutorial instead of blocking it
tutorial_start = time.perf_counter()

# %% [markdown]
# ## Two corpora
#
# "web": 280 documents of prose in 4 parquet shards (row groups of 16
# rows); "code": 120 small Python-like files in 3 JSONL shards: 70% and 30%
# of the documents. Every record has an `id` (the code ids start at
# 100,000) and a `text`. A few web documents are empty (they will add only
# their end-of-document token) and a few are much longer than a sequence
# (they span several). Everything comes from one seed.
#
# The folder is a new temporary one. A recipe's identity holds its file
# paths, and every random stream of the recipe (the shard orders, the mix's
# draws) is seeded from its identity, so another folder gives other draws
# (and another printout): the checks below hold for any of them.

# %%
workdir = Path(tempfile.mkdtemp(prefix="datapipes-text-"))
rng = np.random.default_rng(SEED)
WORDS = (
    "the a of data model token tokens train training loss batch epoch rank shard "
    "learning rate gradient layer attention sequence corpus text words language"
).split()
KEYWORDS = "def return if else for while in range len print self value items total".split()


def web_text(i: int) -> str:
    if i % 40 == 7:
        return ""  # an empty document
    sentences = int(rng.integers(1, 40 if i % 25 == 3 else 8))  # a few long ones
    return " ".join(
        " ".join(rng.choice(WORDS, int(rng.integers(4, 14)))).capitalize() + "."
        for _ in range(sentences)
    )


def code_text(i: int) -> str:
    lines = [f"def f{i}(items):", "    total = 0"]
    for _ in range(int(rng.integers(1, 7))):
        a, b = rng.choice(KEYWORDS, 2)
        lines.append(f"    {a} {b}(items[{int(rng.integers(0, 9))}]):")
        lines.append(f"        total += len({b})")
    return "\n".join([*lines, "    return total", ""])


web = [{"id": i, "text": web_text(i)} for i in range(280)]
code = [{"id": 100_000 + i, "text": code_text(i)} for i in range(120)]
(workdir / "web").mkdir()
(workdir / "code").mkdir()
for shard in range(4):
    table = pa.Table.from_pylist(web[shard::4])
    pq.write_table(table, workdir / "web" / f"web-{shard}.parquet", row_group_size=16)
for shard in range(3):
    lines = [json.dumps(doc) + "\n" for doc in code[shard::3]]
    (workdir / "code" / f"code-{shard}.jsonl").write_text("".join(lines))
print(sorted(p.name for p in (workdir / "web").iterdir()), sorted(os.listdir(workdir / "code")))
print("a web document: ", web[0]["text"][:70], "...")
print("a code document:", code[0]["text"][:70].replace("\n", "\\n"), "...")

# %% [markdown]
# ## A tokenizer, trained here
#
# A byte-level BPE with a vocabulary of 400 ids, trained on both corpora
# (in a real run: a tokenizer you load, `Tokenizer.from_file(...)` or a
# `transformers` fast tokenizer). Two special tokens: `[PAD]` (id 0) fills
# the end of a sequence, `[EOS]` (id 1) ends every document, so that the
# model sees where one stops. The tokenizer is saved as one JSON file: the
# ranks below load it.

# %%
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=["[PAD]", "[EOS]"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tokenizer.train_from_iterator([doc["text"] for doc in web + code], trainer)
PAD, EOS = tokenizer.token_to_id("[PAD]"), tokenizer.token_to_id("[EOS]")
assert (PAD, EOS) == (0, 1) and tokenizer.get_vocab_size() <= 400
tokenizer.save(str(workdir / "tokenizer.json"))
example = tokenizer.encode("def f(items): return total")
print(f"vocabulary: {tokenizer.get_vocab_size()} ids; {example.tokens} -> {example.ids}")

# %% [markdown]
# ## The recipe
#
# Per corpus: shuffle the shard order (a new order every epoch), read the
# records and tokenize their `text` (`eos=EOS` appends `[EOS]` to every
# document; each tokenizer call encodes a block of 128 documents at once, on
# the tokenizer's own threads). Then `dp.mix` draws each next **document**
# from "web" with probability 0.7 and from "code" with 0.3, `.pack` packs
# the token ids into sequences of `SEQ_LEN`, and `.batch` stacks 4 of them.
# `method="concat"` (the default) puts documents end to end and cuts every
# `SEQ_LEN` tokens: no padding but at the very end, and a document may
# continue in the next sequence. So a sequence holds documents of both
# corpora, in the mix's proportions. (Packing each corpus and mixing the
# sequences, `dp.mix([web.pack(n), code.pack(n)], ...)`, is the other
# option: each sequence then holds one corpus.)
#
# `trace=True` is for the checks of this tutorial only, see below.


# %%
def trace_tokens(record: dict) -> dict:
    """Each token id t, at index i of document d, as one int64 that says all three:
    (d + 1) << 32 | i << 12 | t (ids < 4096, documents < 2**20 tokens)."""
    ids = np.asarray(record["input_ids"], dtype=np.int64)
    where = (record["id"] + 1) << 32 | np.arange(len(ids), dtype=np.int64) << 12
    return {**record, "input_ids": where | ids}


def corpora(folder: str, tokenizer: Tokenizer) -> list[dp.DataPipe]:
    """The two corpora's documents as token ids: web, code."""
    web = dp.files(f"{folder}/web/*.parquet").shuffle().read_parquet()
    code = dp.files(f"{folder}/code/*.jsonl").shuffle().read_jsonl()
    return [records.tokenize(tokenizer, eos=EOS) for records in (web, code)]


def recipe(folder: str, tokenizer: Tokenizer, trace: bool = False) -> dp.DataPipe:
    documents = dp.mix(corpora(folder, tokenizer), weights=WEIGHTS)
    if trace:
        documents = documents.map(trace_tokens)
    return documents.pack(SEQ_LEN, pad_id=PAD).batch(BATCH)


# %% [markdown]
# ## One packed sequence
#
# Every sequence is a dict of four arrays, and `.batch` stacks them:
#
# * `input_ids` (`SEQ_LEN` int64): the tokens; `PAD` only at the end of
#   the last sequence a pack makes in an epoch;
# * `labels`: `input_ids` with `-100` (what `cross_entropy` ignores) at the
#   padding and at the **first token of every segment**: the model predicts
#   token t+1 from tokens up to t, and the first token of a document must
#   not be predicted from the end of another one;
# * `position_ids`: restarting at 0 at every segment (a segment: the part of
#   one document inside the sequence; padding is a segment of its own), for
#   the rotary or learned position embedding;
# * `cu_seqlens` (int32): the segments' bounds, `[0, l1, l1 + l2, ...,
#   SEQ_LEN]`. `dp.default_collate` (what `.batch` uses) joins a batch's
#   into the bounds of its sequences laid end to end: `[0, ..., BATCH *
#   SEQ_LEN]`, the form variable-length attention takes.

# %%
loader = dp.Loader(recipe(str(workdir), tokenizer), seed=SEED, stats=True)
plain = list(loader)  # the whole epoch, in this one process
batch = plain[0]
print({key: (tuple(value.shape), str(value.dtype)) for key, value in batch.items()})
assert batch["input_ids"].shape == (BATCH, SEQ_LEN) and batch["cu_seqlens"][-1] == BATCH * SEQ_LEN


# a sequence of the epoch that holds three documents or more (three segments starting at 0)
batch, row = next(
    (batch, row)
    for batch in plain
    for row in range(BATCH)
    if int((batch["position_ids"][row] == 0).sum()) >= 3
)
ids, labels, positions = (batch[key][row] for key in ("input_ids", "labels", "position_ids"))
joined = batch["cu_seqlens"]  # the batch's bounds, its sequences end to end
offset = row * SEQ_LEN
cu_seqlens = joined[(joined >= offset) & (joined <= offset + SEQ_LEN)] - offset  # this row's
print("cu_seqlens of the batch:   ", joined.tolist())
print(f"cu_seqlens of sequence {row}:", cu_seqlens.tolist())
for start, stop in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
    text = tokenizer.decode(ids[start:stop].tolist(), skip_special_tokens=False)
    print(
        f"  tokens {start:3}-{stop - 1:3}: position_ids {positions[start]}..{positions[stop - 1]}, "
        f"labels[{start}] = {labels[start]}: {text[:24]!r}...{text[-12:]!r}"
    )
starts = cu_seqlens[:-1].long()
lengths = torch.diff(cu_seqlens).long()
assert torch.equal(positions, torch.arange(SEQ_LEN) - torch.repeat_interleave(starts, lengths))
assert labels[starts].eq(-100).all()  # no segment's first token is a target
inside = torch.ones(SEQ_LEN, dtype=torch.bool)
inside[starts] = False
assert torch.equal(labels[inside & (ids != PAD)], ids[inside & (ids != PAD)])  # the rest: the ids
assert labels[ids == PAD].eq(-100).all()

# %% [markdown]
# ### What a model does with them
#
# Tokens of one sequence must attend only to earlier tokens **of their own
# document**. `attention_mask` builds that mask from `cu_seqlens`: causal,
# and block-diagonal over the segments. Below, on the mask's rows and
# columns around the first document boundary, a token after the boundary
# (from the fourth row on) sees nothing before it.
#
# On a GPU, variable-length attention takes `cu_seqlens` directly and
# builds no mask at all: with flash-attn,
# `flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_len,
# max_len, causal=True)` on `q`, `k`, `v` of shape `(BATCH * SEQ_LEN,
# heads, dim)`, which is why `.batch` joins the bounds of a whole batch.
# The check below runs the batch as one long row with the mask built from
# the joined bounds, and compares it with attention run on every segment
# alone: the same numbers.


# %%
def attention_mask(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """True where query i may attend to key j: j <= i, and both in one segment."""
    segment = torch.zeros(length, dtype=torch.long)
    segment[cu_seqlens[1:-1].long()] = 1
    segment = segment.cumsum(0)  # the segment of every token
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return causal & (segment[:, None] == segment[None, :])


mask = attention_mask(cu_seqlens, SEQ_LEN)
edge = int(cu_seqlens[1])
print(f"mask rows/columns {edge - 3}..{edge + 2} (the boundary at {edge}):")
for i in range(edge - 3, edge + 3):
    print("  " + " ".join("x" if allowed else "." for allowed in mask[i, edge - 3 : edge + 3]))

torch.manual_seed(SEED)
q, k, v = torch.randn(3, 1, BATCH * SEQ_LEN, 16).unbind(0)  # (heads, tokens, dim)
mask_of_batch = attention_mask(joined, BATCH * SEQ_LEN)
together = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_of_batch)
bounds = joined.tolist()
apart = torch.cat(
    [
        F.scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b], is_causal=True)
        for a, b in zip(bounds[:-1], bounds[1:])
    ],
    dim=1,
)
assert torch.allclose(together, apart, atol=1e-5)
print(f"attention over {BATCH} x {SEQ_LEN} tokens with the mask == per segment: True")

# %% [markdown]
# The loss: logits at position t predict the label at t + 1, and
# `cross_entropy` skips the `-100`s (its default `ignore_index`), so no
# prediction crosses a document boundary or lands on padding. A tiny model
# (embeddings of the ids and of the positions, the masked attention
# above, an output layer) shows the shapes.

# %%
torch.manual_seed(SEED)
embedding = torch.nn.Embedding(tokenizer.get_vocab_size(), 16)
position = torch.nn.Embedding(SEQ_LEN, 16)
output = torch.nn.Linear(16, tokenizer.get_vocab_size())
x = embedding(batch["input_ids"]) + position(batch["position_ids"])  # (BATCH, SEQ_LEN, 16)
flat = x.reshape(1, BATCH * SEQ_LEN, 16)  # the batch as one row, as with cu_seqlens
hidden = F.scaled_dot_product_attention(flat, flat, flat, attn_mask=mask_of_batch)
logits = output(hidden.reshape(BATCH, SEQ_LEN, 16))  # (BATCH, SEQ_LEN, vocabulary)
targets = batch["labels"][:, 1:]
loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten())
print(f"loss {loss.item():.2f} over {int((targets != -100).sum())} of {targets.numel()} positions")

# %% [markdown]
# ## The mix: asked and realised
#
# `loader.stats()` (with `stats=True`) counts the items the mix drew from
# each input (documents here: the mix stands before the pack) and prints
# the realised shares next to the weights. With the default
# `stop="all_exhausted"` every document of both corpora comes exactly once
# per epoch: the weights set the pace of the draws while both corpora last,
# and a corpus that runs out leaves the draw (the rest of the epoch comes
# from the other). So over a whole epoch the shares are the corpora's sizes
# in documents, here made 70/30; a corpus too small for its weight shows as
# a share below it. `stop="first_exhausted"` ends the epoch when a drawn
# corpus runs out instead, keeping the proportions (and leaving the rest of
# the other corpus unread).
#
# The shares count documents, not tokens: a corpus of longer documents
# gets more than its weight in tokens (here the code files are longer than
# most web documents). Choose the weights, or the corpora, with that in mind.

# %%
stats = loader.stats()
mix_line = next(line for line in str(stats).splitlines() if " shares " in line)
print(mix_line)
mix_step = next(step for step in stats.steps if step.mix)
assert mix_step.mix["drawn"] == [len(web), len(code)]  # every document once
assert all(abs(share - weight) < 0.05 for share, weight in zip(mix_step.shares, WEIGHTS))
web_tokens, code_tokens = (
    sum(len(tokenizer.encode(doc["text"]).ids) + 1 for doc in docs) for docs in (web, code)
)
web_share = web_tokens / (web_tokens + code_tokens)
print(f"in tokens: web {web_share:.1%}, code {1 - web_share:.1%}")

# %% [markdown]
# ## Which token is which: the reference for the checks
#
# The jobs below must deliver every token of the epoch exactly once. To
# check that token by token, a token must say which it is: with 400 ids,
# each id occurs hundreds of times, and a lost token hidden by a repeated
# one with the same id would go unnoticed in a count of ids. So the jobs
# run the recipe with `trace=True`: `trace_tokens`, a map between the mix
# and the pack, widens every id into one int64 that holds (document, index
# in the document, id), unique across the epoch. A map moves no position
# and holds nothing, so the traced recipe reads, packs, checkpoints and
# resumes like the plain one. It even gives the very same batches (`&
# 0xFFF` takes the ids back): a step's random stream is seeded from the
# steps below it and itself (never from function names), and the map
# stands above the mix, so the mix draws as in the plain recipe. (A map
# below the mix would change the mix's draws: the same tokens, another
# interleaving.)
#
# The uninterrupted run is then checked against the corpora themselves:
# every token of every document (its `[EOS]` included) once, nothing else
# but padding.

# %%
traced = [b["input_ids"] for b in dp.Loader(recipe(str(workdir), tokenizer, trace=True), seed=SEED)]


assert all(torch.equal(t & 0xFFF, b["input_ids"]) for t, b in zip(traced, plain, strict=True))


def real_tokens(batches: list[torch.Tensor]) -> list[int]:
    """The non-padding entries of batches of traced ids."""
    flat = torch.cat([batch.flatten() for batch in batches])
    return flat[flat != PAD].tolist()


reference = real_tokens(traced)
every_token = [
    (doc["id"] + 1) << 32 | index << 12 | token
    for doc in web + code
    for index, token in enumerate(tokenizer.encode(doc["text"]).ids + [EOS])
]
assert sorted(reference) == sorted(every_token)  # each token once (the traces are unique)
padding = sum(b.numel() for b in traced) - len(reference)
print(
    f"one process: {len(traced)} batches, {len(reference):,} tokens of {len(web) + len(code)} "
    f"documents, each once, and {padding} padding tokens (the end of the last sequence)"
)
rows = [row[row != PAD] for batch in traced for row in batch]
both = sum(1 for row in rows if (row >> 32 <= len(web)).any() and (row >> 32 > len(web)).any())
assert both > len(rows) // 3  # documents of the two corpora share sequences
print(f"{both} of {len(rows)} sequences hold documents of both corpora")

# %% [markdown]
# ## Resuming, in one process first
#
# Two ranks (given explicitly here, in this one process) each take 3
# batches and save their state, in the middle of documents. On the
# topology it was saved with, a rank's own state resumes exactly: the same
# sequences in the same order as the uninterrupted rank. The states of
# both ranks, merged with `dp.merge_states`, load on 3 ranks: each new rank
# computes its share of the rest of the epoch, the rests of the documents
# the old ranks' packs were in the middle of included (the job below does
# this with `torchrun`, and checks every token).

# %%
mixed = recipe(str(workdir), tokenizer)
two_ranks = [dp.Loader(mixed, seed=SEED, rank=r, world_size=2) for r in range(2)]
for rank_loader in two_ranks:
    batches = iter(rank_loader)
    for _ in range(3):
        next(batches)
saved = [rank_loader.state_dict() for rank_loader in two_ranks]
offsets = [json.loads(state["ranks"][str(r)]["node"])["offset"] for r, state in enumerate(saved)]
assert all(offsets)  # each rank's pack is in the middle of a document (tokens of it delivered)
resumed = dp.Loader(mixed, seed=SEED, rank=0, world_size=2)
resumed.load_state_dict(saved[0])  # the topology it was saved with
rest = [b["input_ids"] for b in resumed]
again = [b["input_ids"] for b in dp.Loader(mixed, seed=SEED, rank=0, world_size=2)][3:]
assert all(torch.equal(a, b) for a, b in zip(rest, again, strict=True))  # exact
on_three = dp.Loader(mixed, seed=SEED, rank=0, world_size=3)
on_three.load_state_dict(dp.merge_states(saved))  # another topology: it loads
print(f"rank 0 of 2: the same {len(rest)} batches as uninterrupted; rank 0 of 3 loads the merge")

# %% [markdown]
# What resuming on another topology needs is that the pack can tell which
# document every item below it is, so that the rest of a partly delivered
# document is taken wherever it arrives. Maps, filters, `tokenize`, ordered
# parallel maps, `dp.mix` and `dp.concat` keep that. A **buffer shuffle**
# (`.shuffle(buffer_size=...)`) or a `flat_map` between the source and the
# pack does not, nor does a `.shard()` stream: a checkpoint taken in the
# middle of a document then refuses another topology with a
# `dp.ElasticResumeError` naming the pack (it still resumes exactly on its
# own topology). Shuffle the shards (as here) or a random-access source,
# and, if you like, the packed sequences with a buffer after the pack.

# %%
buffered = [pipe.shuffle(buffer_size=64) for pipe in corpora(str(workdir), tokenizer)]
buffered = dp.mix(buffered, weights=WEIGHTS).pack(SEQ_LEN, pad_id=PAD).batch(BATCH)
two_ranks = [dp.Loader(buffered, seed=SEED, rank=r, world_size=2) for r in range(2)]
for rank_loader in two_ranks:
    next(iter(rank_loader))
merged = dp.merge_states([rank_loader.state_dict() for rank_loader in two_ranks])
try:
    dp.Loader(buffered, seed=SEED, rank=0, world_size=3).load_state_dict(merged)
except dp.ElasticResumeError as error:
    print("a buffer shuffle below the pack, on 3 ranks:", str(error).split(";")[0])
    assert "'pack'" in str(error)
else:
    raise AssertionError("a buffer shuffle below a pack, mid-document: refused elsewhere")

# %% [markdown]
# ## The job, part 1: 2 ranks, a checkpoint mid-epoch
#
# Now a real `torch.distributed` job. Each rank calls
# `dist.init_process_group("gloo")`, and a plain `dp.Loader(recipe, seed=...)`
# takes its rank and world size from it: every rank reads its own share of
# the shards (of both corpora), packs and mixes them. Each of the 2 ranks
# takes `STOP` batches (a training step each, in a real job), then saves
# `{"data": loader.state_dict()}` (and the model and optimizer, in a real
# job) to a file of its own with `dp.save_checkpoint`, and the job stops.
#
# The ranks here run no collective per batch, so each reads with
# `even_batches=False`, and the checks below can account for every token.
# Under DDP keep `even_batches` on (the default with several ranks): ranks
# then stop together when one runs out, and what the others had left is
# dropped, counted and reported (tutorial 06).
#
# The rank code is a small script of the functions above (copied with
# `inspect.getsource`) and `run_rank` below, started with
# `python -m torch.distributed.run` (that is `torchrun`) and the same
# `datapipes` as this process. A job that does not finish in time is
# stopped: torchrun starts every rank in a session of its own, so it is
# asked to stop them (SIGTERM), and whatever is left is killed.


# %%
def run_rank(folder: str, phase: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    loader = dp.Loader(recipe(folder, tokenizer, trace=True), seed=SEED, even_batches=False)
    delivered = []
    if phase == "before":
        for batch in loader:
            delivered.append(batch["input_ids"])  # ... a training step ...
            if len(delivered) == STOP:
                path = f"{folder}/checkpoints/rank{rank}.pt"
                dp.save_checkpoint({"data": loader.state_dict()}, path)  # + model, optimizer
                break
    else:  # every new rank reads every old rank's file, and merges them the same way
        paths = sorted(Path(folder, "checkpoints").glob("rank*.pt"))
        merged = dp.merge_states([dp.load_checkpoint(path)["data"] for path in paths])
        loader.load_state_dict(merged)
        delivered = [batch["input_ids"] for batch in loader]  # the rest of the epoch
    flat = torch.cat([batch.flatten() for batch in delivered])
    np.save(f"{folder}/delivered/{phase}-rank{rank}.npy", flat[flat != PAD].numpy())
    print(
        f"[rank {rank} of {world_size}] {phase}: {len(delivered)} batches, "
        f"{int((flat != PAD).sum())} tokens (rank and world size from {loader.topology.origin})",
        flush=True,
    )
    dist.destroy_process_group()


RANK_SCRIPT = "\n\n".join(
    [
        "import sys\nfrom datetime import timedelta\nfrom pathlib import Path\n\n"
        "import numpy as np\nimport torch\nimport torch.distributed as dist\n"
        "from tokenizers import Tokenizer\n\nimport datapipes as dp",
        f"SEED, SEQ_LEN, BATCH, WEIGHTS, STOP = {SEED}, {SEQ_LEN}, {BATCH}, {WEIGHTS}, {STOP}",
        f"PAD, EOS = {PAD}, {EOS}",
        *(inspect.getsource(f) for f in (trace_tokens, corpora, recipe, run_rank)),
        'if __name__ == "__main__":\n    run_rank(sys.argv[1], sys.argv[2])\n',
    ]
)
(workdir / "rank.py").write_text(RANK_SCRIPT)
(workdir / "checkpoints").mkdir()
(workdir / "delivered").mkdir()


def descendants(pid: int) -> list[int]:
    """The processes started under ``pid`` (Linux ``/proc``; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        kids = children.get(queue.pop(), [])
        found += kids
        queue += kids
    return found


def run_torchrun(nproc: int, *args: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={nproc}", str(workdir / "rank.py"), *args]
    print("launching:", shlex.join(command), flush=True)
    outer = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in outer}
    env = {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC_")}
    env["PYTHONPATH"] = str(Path(dp.__file__).resolve().parents[1])  # this process's datapipes
    env["OMP_NUM_THREADS"] = "1"  # several processes on a small machine: one thread each
    job = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        returncode = job.wait(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        started = descendants(job.pid)
        job.send_signal(signal.SIGTERM)  # torchrun stops its ranks
        try:
            job.wait(timeout=20)
        except subprocess.TimeoutExpired:
            for pid in [job.pid, *started]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            job.wait()
        raise SystemExit(f"the job hung: stopped after {JOB_TIMEOUT_S}s") from None
    assert returncode == 0, f"the job failed with exit code {returncode}"


run_torchrun(2, str(workdir), "before")
before = [np.load(workdir / "delivered" / f"before-rank{r}.npy").tolist() for r in range(2)]
assert all(len(tokens) > 0 for tokens in before)

# %% [markdown]
# What a rank saved is plain data, and small: positions, never tokens.
# The node state of rank 0, from the outside in: the pack's `offset` (the
# tokens of its current document already delivered) and the state of the
# mix where that document was drawn: its draws so far, and one state per
# input. In the web input's: tokenize's `skip` (the records of its current
# block already handed on) and the parquet reader's position where that
# block starts (the file, its part, the row). A resume reads that block
# again and encodes only the records not handed on.

# %%
saved = [dp.load_checkpoint(workdir / "checkpoints" / f"rank{r}.pt")["data"] for r in range(2)]
print("bytes of JSON per rank:", [len(json.dumps(state)) for state in saved])
node = json.loads(saved[0]["ranks"]["0"]["node"])
mix_state = node["upstream"]
print(f"rank 0: the pack's offset {node['offset']}, the mix's draws {mix_state['draws']}")
print("rank 0, the web input:", json.dumps(mix_state["upstream"][0]))
assert all(len(json.dumps(state)) < 10_000 for state in saved)

# %% [markdown]
# The tokenizer is part of the recipe's identity: the `tokenize` step
# carries a digest of its whole definition (vocabulary, merges,
# normalizer). A checkpoint taken with one vocabulary is refused by a
# recipe with another, with the difference shown, rather than resumed into
# token ids that mean something else.

# %%
other = Tokenizer(models.BPE())
other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
other.train_from_iterator(
    [doc["text"] for doc in web + code],
    trainers.BpeTrainer(vocab_size=300, special_tokens=["[PAD]", "[EOS]"], show_progress=False),
)
try:
    dp.Loader(recipe(str(workdir), other, trace=True), seed=SEED).load_state_dict(saved[0])
except dp.StateMismatchError as error:
    lines = [line for line in str(error).splitlines() if "tokenize" in line]
    print("\n".join(dict.fromkeys(lines)))  # each once (both corpora have the line)
    assert "tokenizers:" in str(error)
else:
    raise AssertionError("a checkpoint of another vocabulary must be refused")

# %% [markdown]
# ## The job, part 2: 3 ranks finish the epoch
#
# The job comes back on 3 ranks. Every new rank reads **all** the old
# ranks' files and merges them with `dp.merge_states` (a pure function:
# each rank computes the same merged state, and from it the same deal,
# without talking to the others), loads it, and reads to the end of the
# epoch. The rest of the epoch is dealt anew: untouched shards and rests of
# shards, and the documents the old ranks were in the middle of, each to
# one new rank. That document comes through the mix with the other
# documents (perhaps after some of them), and the pack knows it by where
# it was read from: it packs only the tokens not delivered yet.

# %%
run_torchrun(3, str(workdir), "after")
after = [np.load(workdir / "delivered" / f"after-rank{r}.npy").tolist() for r in range(3)]

# %% [markdown]
# Before plus after, over all ranks: every token of the uninterrupted
# one-process run, each exactly once. The traces also show which documents
# the checkpoint cut: their first tokens went to the old ranks, the rest to
# the new ones.

# %%
delivered = [token for tokens in before + after for token in tokens]
assert len(set(delivered)) == len(delivered), "a token arrived twice"
assert sorted(delivered) == sorted(reference), "a token was lost"
old = {token >> 32 for tokens in before for token in tokens}
new = {token >> 32 for tokens in after for token in tokens}
cut = sorted(doc - 1 for doc in old & new)
assert cut  # the checkpoint fell in the middle of documents
print(
    f"2 ranks delivered {sum(map(len, before)):,} tokens, then 3 ranks "
    f"{[len(tokens) for tokens in after]}: {len(delivered):,}, every token of the epoch once"
)
print(f"documents cut by the checkpoint, continued on the new ranks: {cut}")

# %% [markdown]
# ## What is guaranteed, and what is not
#
# * A checkpoint of a text recipe holds positions (a reader's, a
#   tokenizer block's, a pack's offset into a document), never tokens: it
#   stays small however long the documents.
# * On the topology it was saved with, a resume delivers the same
#   sequences in the same order; on another number of ranks or workers (a
#   merged state), every remaining token of the epoch exactly once, the
#   rest of a partly delivered document included; the sequences they are
#   packed into may differ.
# * That holds with the mix before the pack, as here, or after it (packs
#   per corpus, mixed): the pack must be able to tell which document each
#   item below it is. Maps, filters, `tokenize`, ordered parallel maps,
#   `dp.mix` and `dp.concat` may stand between the sources and the pack; a
#   buffer shuffle or a `flat_map` there, or a `.shard()` stream, makes a
#   mid-document checkpoint refuse another topology
#   (`dp.ElasticResumeError` naming the pack). Shuffle the shards, as here
#   (and, if you like, the packed sequences, with a buffer after the pack).
# * A recipe with another tokenizer is another recipe: its checkpoints
#   do not load into this one.
#
# More in the guide: `docs/guides/text.md`.

# %%
shutil.rmtree(workdir)
print(f"done in {time.perf_counter() - tutorial_start:.1f} s")
