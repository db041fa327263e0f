# %% [markdown]
# # Preprocess and write: a raw corpus into shards, exactly once, whatever is killed
#
# Training reads the same data many times; preprocessing it once (cleaning,
# filtering, tokenizing) and writing the result as shards saves that work on
# every epoch. `dp.write(recipe, dest, ...)` runs any recipe to the end and
# writes its records as `jsonl`, `tar` (webdataset) or `parquet` shards plus a
# `manifest.json`, from one process or from every rank of a job.
#
# Preprocessing jobs are long, so they get killed: preempted, out of memory,
# a node lost. `dp.write` keeps no state but the destination itself: start
# the job again, on any number of ranks, and it skips what is done and redoes
# the rest, and the output is byte for byte the output of one uninterrupted
# process.
#
# This tutorial preprocesses a generated corpus in one process (the
# reference), then with 3 rank processes of which one is killed midway (and
# the others torn down with it, as a launcher does), restarts the job on 2
# ranks, compares every byte, and reads the shards back for training.
#
# Run `python tutorials/09_preprocess_and_write.py`; it asserts what it shows.

# %%
import inspect
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import datapipes as dp

warnings.filterwarnings("ignore", message="This DataLoader will create")  # 2-core machines

SOURCES = 8  # raw files, one per "crawl"
DOCS_PER_SOURCE = 60
JOB_TIMEOUT_S = 60  # a rank that hangs fails the tutorial instead of blocking it

# %% [markdown]
# ## The raw corpus
#
# Eight JSONL files of scraped "documents": messy whitespace, mixed case,
# and some too short to keep.

# %%
workdir = Path(tempfile.mkdtemp(prefix="datapipes-write-"))
raw = workdir / "raw"
raw.mkdir()
words = "the a data model token shard write rank epoch loss batch corpus".split()
generator = np.random.default_rng(0)
for source in range(SOURCES):
    with open(raw / f"crawl-{source:02d}.jsonl", "w") as out:
        for i in range(DOCS_PER_SOURCE):
            length = int(generator.integers(1, 40))
            text = "  ".join(str(w).upper() if j % 5 == 0 else str(w)
                             for j, w in enumerate(generator.choice(words, length)))  # fmt: skip
            doc = {"id": source * DOCS_PER_SOURCE + i, "source": source, "text": f" {text}\n"}
            out.write(json.dumps(doc) + "\n")
print(sorted(p.name for p in raw.iterdir()))

# %% [markdown]
# ## The preprocessing recipe
#
# Keep documents of at least 5 words, normalize their text, and tokenize it
# (a toy tokenizer: one id per character). Each output record is a
# webdataset sample: `txt` (the clean text), `tokens.npy` (an int32 array:
# a field ending in `npy` is saved as `.npy`) and `json` (metadata).
#
# `SLOW_S` stands for real preprocessing cost (a tokenizer, an image
# resize): a few milliseconds per document, so that the kill below lands in
# the middle of the job. The functions live at the top level: the rank
# processes below run the very same code (a recipe is identified by its
# steps and the names of its functions: its *fingerprint*, stored in the
# output).


# %%
SLOW_S = float(os.environ.get("SLOW_S", "0"))


def long_enough(doc: dict) -> bool:
    return len(doc["text"].split()) >= 5


def preprocess(doc: dict) -> dict:
    if SLOW_S:
        time.sleep(SLOW_S)
    text = " ".join(doc["text"].split()).lower()
    tokens = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)
    meta = {"id": doc["id"], "source": doc["source"], "tokens": len(tokens)}
    return {"__key__": f"doc{doc['id']:05d}", "txt": text, "tokens.npy": tokens, "json": meta}


def recipe(raw: str) -> dp.DataPipe:
    return dp.files(f"{raw}/*.jsonl").read_jsonl().filter(long_enough).map(preprocess)


OPTIONS = {"format": "tar", "records_per_shard": 32, "min_units": 12}

# %% [markdown]
# ## One uninterrupted process: the reference
#
# `dp.write` cuts the recipe's input into **units** that depend only on the
# input (here: the 8 files, split into parts until there are `min_units`),
# never on how many processes write them. Unit `u` becomes the shards
# `shard-<u>-<k>.tar`, at most `records_per_shard` records each; a shard never
# spans two units. Each shard is published whole (written under a temporary
# name, then renamed), then the unit's record in `_datapipes/units/`, and the
# manifest last.

# %%
reference = dp.write(recipe(str(raw)), str(workdir / "reference"), **OPTIONS)
print(f"{reference.records} records in {len(reference.shards)} shards, e.g. {reference.shards[0]}")
print("stats:", {k: round(v, 2) if isinstance(v, float) else v for k, v in reference.stats.items()})
assert reference.records == sum(1 for _ in dp.Loader(recipe(str(raw))))
assert all(shard.records <= 32 for shard in reference.shards)
print(sorted(os.listdir(workdir / "reference"))[:4], "...")
print("_datapipes/:", sorted(os.listdir(workdir / "reference" / "_datapipes")))

# %% [markdown]
# Calling it again finds every unit done, writes nothing and returns the
# manifest. `dp.read_manifest(dest)` gives it to readers too, and
# `manifest.verify()` checks every shard's size and checksum against it.

# %%
again = dp.write(recipe(str(raw)), str(workdir / "reference"), **OPTIONS)
assert again.stats["units_written"] == 0 and again == reference
assert dp.read_manifest(str(workdir / "reference")) == reference
reference.verify()


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (``_datapipes/`` included) by relative path."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


expected = files_of(workdir / "reference")

# %% [markdown]
# ## Three ranks, one killed midway
#
# In a job, every rank calls `dp.write` with the same recipe and destination
# and its `rank` and `world_size` (or nothing: a `torch.distributed` process
# group is found by itself). The ranks need no collective: they share only
# the destination. Here they are 3 processes of a small script that holds
# the recipe's functions above (copied with `inspect.getsource`), started with
# the same `datapipes` as this process.

# %%
RANK_MAIN = """
if __name__ == "__main__":
    raw, dest, rank, world_size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    manifest = dp.write(recipe(raw), dest, rank=rank, world_size=world_size, **OPTIONS)
    print(json.dumps({"rank": rank, **manifest.stats}), flush=True)
"""
script = "\n\n".join(
    [
        "import json\nimport os\nimport sys\nimport time\n\nimport numpy as np\n\n"
        "import datapipes as dp",
        "SLOW_S = float(os.environ.get('SLOW_S', '0'))",
        f"OPTIONS = {OPTIONS!r}",
        *(inspect.getsource(f) for f in (long_enough, preprocess, recipe)),
        RANK_MAIN,
    ]
)
(workdir / "preprocess_rank.py").write_text(script)
environment = {
    **os.environ,
    "PYTHONPATH": str(Path(dp.__file__).resolve().parents[1]),  # this process's datapipes
    "SLOW_S": "0.01",
}


def start_ranks(dest: Path, world_size: int) -> list[subprocess.Popen]:
    command = [sys.executable, str(workdir / "preprocess_rank.py"), str(raw), str(dest)]
    return [
        subprocess.Popen(
            [*command, str(rank), str(world_size)],
            env=environment,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(world_size)
    ]


def visible_shards(dest: Path) -> list[str]:
    return sorted(n for n in os.listdir(dest) if n.startswith("shard-")) if dest.exists() else []


job = workdir / "job"
ranks = start_ranks(job, world_size=3)
deadline = time.monotonic() + JOB_TIMEOUT_S
while len(visible_shards(job)) < 4:  # a few shards in: the job is well under way
    assert time.monotonic() < deadline and all(r.poll() is None for r in ranks), "too fast"
    time.sleep(0.01)
ranks[1].send_signal(signal.SIGKILL)  # rank 1 dies: no exception, no cleanup
for rank in (ranks[0], ranks[2]):  # and, as torchrun does, the launcher ends the others
    rank.send_signal(signal.SIGKILL)
for rank in ranks:
    rank.wait(JOB_TIMEOUT_S)
print("exit codes:", [r.returncode for r in ranks])

# %% [markdown]
# What the killed job left: some shards, each complete (only whole files
# are ever renamed into place: every visible shard is already the
# reference's file, byte for byte), the records of the units it finished,
# no manifest (so `dp.read_manifest` says the write has not finished), and
# perhaps markers (`_datapipes/writing/<unit>.<host>.<pid>`: "this process
# is writing this unit") and temporaries (`.shard-....tmp-<host>-<pid>-<n>`)
# of the dead processes.

# %%
left = files_of(job)
shards = visible_shards(job)
done = sorted(n for n in os.listdir(job / "_datapipes" / "units") if not n.startswith("."))
debris = [n for n in left if n.startswith(".") or "/writing/" in n or "/." in n]
print(f"{len(shards)} of {len(reference.shards)} shards, {len(done)} units done, debris: {debris}")
for name in shards:
    assert left[name] == expected[name]  # complete, and already the final bytes
    with tarfile.open(fileobj=io.BytesIO(left[name])) as tar:
        assert len(tar.getmembers()) == 3 * next(s.records for s in reference if s.name == name)
assert "manifest.json" not in left
try:
    dp.read_manifest(str(job))
except FileNotFoundError as error:
    print("read_manifest:", str(error).split(":")[0])

# %% [markdown]
# ## The job again, on 2 ranks
#
# The restarted ranks remove the dead processes' markers and temporaries,
# skip the units whose records exist, and write the others again, whole: a
# unit killed midway is redone from its start, into the same shard names
# with the same bytes. Each rank returns once every unit is done: a rank
# that finished its share helps with the units nobody holds.

# %%
ranks = start_ranks(job, world_size=2)
stats = [json.loads(r.communicate(timeout=JOB_TIMEOUT_S)[0]) for r in ranks]
assert [r.returncode for r in ranks] == [0, 0]
for line in stats:
    print(f"rank {line['rank']}: wrote {line['units_written']} units, "
          f"found {line['units_found_done']} done")  # fmt: skip
units = len(os.listdir(workdir / "reference" / "_datapipes" / "units"))
assert sum(line["units_written"] for line in stats) >= units - len(done)  # each one left
assert all(line["units_found_done"] >= len(done) for line in stats)
assert all(line["records"] == reference.records for line in stats)

assert files_of(job) == expected  # every file, _datapipes/ included, byte for byte
print(f"identical to the uninterrupted run: {len(expected)} files, byte for byte")

# %% [markdown]
# ## Reading the shards back for training
#
# `manifest.files()` is a `dp.files` over the shards, in order, so the
# written dataset is a recipe like any other: shuffle the shard order, read
# the tar samples, decode their fields (`txt` to str, `json` to a dict,
# `npy` to an array), shuffle within a buffer, pad and batch. Each epoch
# every document comes exactly once.

# %%
manifest = dp.read_manifest(str(job))


def to_example(sample: dict) -> dict:
    tokens = torch.as_tensor(sample["tokens.npy"][:64])
    padded = torch.zeros(64, dtype=torch.long)
    padded[: len(tokens)] = tokens
    return {"id": sample["json"]["id"], "tokens": padded, "label": sample["json"]["source"]}


train = (
    manifest.files().shuffle().read_tar().decode().map(to_example).shuffle(buffer_size=64).batch(16)
)
kept = [doc["id"] for doc in dp.Loader(dp.files(f"{raw}/*.jsonl").read_jsonl().filter(long_enough))]
model = torch.nn.Sequential(torch.nn.EmbeddingBag(256, 16), torch.nn.Linear(16, SOURCES))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = dp.Loader(train, seed=0)
for epoch in range(2):
    seen = []
    for batch in loader:
        loss = torch.nn.functional.cross_entropy(model(batch["tokens"]), batch["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += batch["id"].tolist()
    assert sorted(seen) == sorted(kept)
    print(f"epoch {epoch}: {len(seen)} documents, each once; last loss {loss.item():.3f}")

# %% [markdown]
# ## What is guaranteed, and what is not
#
# * Every record of the recipe is written exactly once, and whatever is
#   killed (a rank, a DataLoader worker of a rank, the whole job) the finished
#   output is the same bytes as one uninterrupted process's, on any number of
#   ranks: the units, the shard names and each unit's graph (its seed too)
#   depend only on the recipe and its input.
# * A shard is visible complete or not at all (a rename on local disk, one
#   upload on object stores); the manifest appears after every shard.
# * A unit killed midway is redone whole: keep units small enough to redo
#   (`min_units`, `unit_items`).
# * A rank stopped or stuck (not dead) holds its unit until its marker is
#   `stale_seconds` old (60 by default); then another rank writes it too,
#   the same bytes.
# * The recipe must be deterministic given its seed (no clock, no global
#   RNG): the bytes are only as reproducible as the recipe.
#
# More in the guide: `docs/guides/writing.md`.

# %%
shutil.rmtree(workdir)
