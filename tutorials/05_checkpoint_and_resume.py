# %% [markdown]
# # Checkpoint and resume mid-epoch
#
# A long training run gets preempted, crashes or hits its time limit in the
# middle of an epoch. Resuming it *exactly* means three things come back
# together: the model, the optimizer (momentum included) and the data
# position, so that the restarted run trains on the very batches the
# uninterrupted run would have, in the same order, none lost, none repeated.
#
# This tutorial trains a tiny model on JSONL shards, stops it mid-epoch, saves
# `{"model", "optimizer", "data"}` in one file with `dp.save_checkpoint`,
# resumes **in a new Python process**, and checks that the batches and the
# final weights equal the uninterrupted run's, bit for bit. Then it opens the
# data state, shows what protects you from loading it into the wrong recipe,
# does the same with worker processes and with
# `torch.distributed.checkpoint`, and finally resumes a 3-rank job on 2
# ranks (elastic resume): every remaining record exactly once.
# Run `python tutorials/05_checkpoint_and_resume.py`; it asserts what it shows.

# %%
import copy
import inspect
import json
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import datapipes as dp

warnings.filterwarnings("ignore", message="This DataLoader will create")  # 2-core machines
# DCP without a process group says it assumes a single process: that is what we want here
warnings.filterwarnings("ignore", message="torch.distributed is disabled")

EPOCHS = 3  # stop in epoch 1, so there is an epoch after the resume to compare too
BATCH = 16
SEED = 0

# %% [markdown]
# ## The data and the recipe
#
# Eight JSONL shards of 50 records each: an `id`, four features `x` and a
# target `y`. The recipe shuffles the file order, reads the records, turns
# them into tensors, shuffles records within a buffer and batches them: 25
# batches per epoch. Everything random in it is seeded from the Loader's
# `seed` and the epoch, so the run is reproducible without touching a global
# RNG.

# %%
folder = Path(tempfile.mkdtemp())
rng = np.random.default_rng(0)
true_weights = np.array([1.5, -2.0, 0.5, 3.0])
for shard in range(8):
    with open(folder / f"train-{shard:02d}.jsonl", "w") as f:
        for i in range(shard * 50, (shard + 1) * 50):
            x = rng.normal(size=4)
            y = float(x @ true_weights + 0.1 * rng.normal())
            f.write(json.dumps({"id": i, "x": x.tolist(), "y": y}) + "\n")
ALL_IDS = list(range(400))


def to_tensors(record: dict) -> dict:
    return {
        "id": record["id"],
        "x": torch.tensor(record["x"], dtype=torch.float32),
        "y": torch.tensor(record["y"], dtype=torch.float32),
    }


def make_recipe(folder: str, batch_size: int = BATCH) -> dp.DataPipe:
    return (
        dp.files(f"{folder}/train-*.jsonl")
        .shuffle()  # file order, new every epoch
        .read_jsonl()
        .map(to_tensors)
        .shuffle(buffer_size=64)  # records, within a buffer
        .batch(batch_size)
    )


print(make_recipe(str(folder)))

# %% [markdown]
# ## A tiny model and a training loop
#
# `torch.nn.Linear` with SGD and momentum: the momentum buffers are optimizer
# state that a resume must restore, just like the weights. The loop runs
# until the Loader has finished `EPOCHS` epochs; it asks the Loader which
# epoch it is in (`loader.epoch`) instead of counting itself, so the same loop
# serves a fresh start and a resume. It records the ids of every batch it
# trains on. `stop_after` plays the preemption: after that many batches the
# run saves `checkpoint` (when given) and stops. (A real loop saves every N
# steps; any step will do, the position is exact wherever it is taken.)


# %%
def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(SEED)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)


def train(model, optimizer, loader, stop_after=None, checkpoint=None) -> list:
    history = []  # (epoch, ids of the batch) for every step
    while loader.epoch < EPOCHS:
        for batch in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
            loss.backward()
            optimizer.step()
            history.append((loader.epoch, batch["id"].tolist()))
            if len(history) == stop_after:  # preempted: save and stop
                if checkpoint is not None:
                    dp.save_checkpoint(
                        {
                            "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "data": loader.state_dict(),  # next to the model: they never drift
                        },
                        checkpoint,
                    )
                return history
    return history


# %% [markdown]
# ## The uninterrupted run: the reference

# %%
model, optimizer = make_model()
reference = train(model, optimizer, dp.Loader(make_recipe(str(folder)), seed=SEED))
reference_weights = {k: v.clone() for k, v in model.state_dict().items()}
per_epoch = [sum(1 for e, _ in reference if e == epoch) for epoch in range(EPOCHS)]
print(f"{len(reference)} batches, per epoch: {per_epoch}")
for epoch in range(EPOCHS):  # every record exactly once per epoch, a new order every epoch
    assert sorted(i for e, ids in reference if e == epoch for i in ids) == ALL_IDS
assert reference[0][1] != reference[per_epoch[0]][1]
print("final weights:", model.weight.detach().numpy().round(3), model.bias.item())

# %% [markdown]
# ## The interrupted run
#
# Same recipe, same seed, stopped 10 batches into epoch 1. The checkpoint
# holds the model's and the optimizer's `state_dict()` and the Loader's, side
# by side in one file next to the model. `train` saves it with
# `dp.save_checkpoint(obj, path)` rather than `torch.save(obj, path)`: see the
# next cell for why.

# %%
STOP = per_epoch[0] + 10
checkpoint = folder / "checkpoint.pt"
model, optimizer = make_model()
loader = dp.Loader(make_recipe(str(folder)), seed=SEED)
head = train(model, optimizer, loader, stop_after=STOP, checkpoint=checkpoint)
loader.close()  # the process "dies" here
print(f"stopped after {len(head)} batches, in epoch {head[-1][0]}; saved {checkpoint.name}")
assert head == reference[:STOP]

# %% [markdown]
# ### Why `dp.save_checkpoint`
#
# `torch.save(obj, path)` empties `path` first and then writes it, so a job
# killed during the save (preempted, out of memory, out of time) is left with
# neither the old checkpoint nor the new one. `dp.save_checkpoint` writes a
# temporary file next to `path`, fsyncs it and renames it over `path` in one
# step: `path` always holds a complete checkpoint. Below, a save that fails
# halfway (a value that cannot be pickled, standing in for the kill) destroys
# a plain `torch.save` checkpoint and leaves a `dp.save_checkpoint` one whole.
# (The test suite kills real training processes with SIGKILL during saves.)

# %%
survived = {}
for name, save in (("torch.save", torch.save), ("dp.save_checkpoint", dp.save_checkpoint)):
    target = folder / f"last-good-{name}.pt"
    save({"step": 1}, target)  # the last good checkpoint
    try:
        save({"step": 2, "broken": lambda: None}, target)  # fails halfway through the save
    except Exception:  # the failure is the point here
        pass
    try:
        survived[name] = dp.load_checkpoint(target)
        print(f"after a failed {name}: step {survived[name]['step']}")
    except RuntimeError as error:
        print(f"after a failed {name}: {str(error).split(' (')[0]}")
assert survived == {"dp.save_checkpoint": {"step": 1}}  # torch.save lost the last good one

# %% [markdown]
# ## Resume in a new process
#
# The restarted script knows nothing of the old one: it builds a fresh model,
# optimizer and Loader over the same recipe, loads the file with
# `dp.load_checkpoint`, which is `torch.load(weights_only=True)` (the data
# state is plain data, so the safe loader accepts it) with a clear error for a
# file cut short, and calls `load_state_dict` on each. `resume` below is
# that code; the Loader's next iteration continues epoch 1 right after the
# last batch the old run trained on.
#
# To make the "new process" real, we write a small script holding the same
# functions (`inspect.getsource` copies them from this file) and run it with
# `sys.executable`. In your project, this is simply your training script
# started again with a `--resume` flag.


# %%
def resume(folder: str, checkpoint: str, num_workers: int = 0) -> tuple[list, torch.nn.Module]:
    state = dp.load_checkpoint(checkpoint)
    model, optimizer = make_model()
    loader = dp.Loader(make_recipe(folder), seed=SEED, num_workers=num_workers)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["data"])
    history = train(model, optimizer, loader)
    loader.close()
    return history, model


script = "\n\n".join(
    [
        "import sys\n\nimport torch\n\nimport datapipes as dp",
        f"EPOCHS, BATCH, SEED = {EPOCHS}, {BATCH}, {SEED}",
        *(inspect.getsource(f) for f in (to_tensors, make_recipe, make_model, train, resume)),
        "history, model = resume(sys.argv[1], sys.argv[2])\n"
        'torch.save({"history": history, "weights": model.state_dict()}, sys.argv[3])\n',
    ]
)
(folder / "resume.py").write_text(script)
result = folder / "resumed.pt"
subprocess.run(
    [sys.executable, str(folder / "resume.py"), str(folder), str(checkpoint), str(result)],
    check=True,
)
resumed = torch.load(result, weights_only=True)
tail = resumed["history"]
print(f"{(folder / 'resume.py').name}: {len(script.splitlines())} lines, ending in")
print("  " + "\n  ".join(script.strip().splitlines()[-2:]))
print(f"the new process trained {len(tail)} more batches")


def in_epoch(history: list, epoch: int) -> list:
    return [ids for e, ids in history if e == epoch]


# the rest of epoch 1: the uninterrupted run's batches after the stop, same ids, same order
assert in_epoch(tail, 1) == in_epoch(reference[STOP:], 1)
epoch_1_ids = [i for ids in in_epoch(head + tail, 1) for i in ids]
assert sorted(epoch_1_ids) == ALL_IDS  # nothing lost, nothing repeated
assert in_epoch(tail, 2) == in_epoch(reference, 2)  # the epoch after it matches too
assert head + tail == reference
for name, weight in resumed["weights"].items():
    assert torch.equal(weight, reference_weights[name]), name  # bit for bit
print("interrupted + resumed == uninterrupted: same batches, bit-identical weights")

# %% [markdown]
# ## What is inside the data state
#
# `loader.state_dict()` is plain data: dicts, lists, strings and numbers, so
# `json.dumps` works and `torch.load(weights_only=True)` needs no allow-list.
# It records what the position belongs to: the recipe's fingerprint and its
# steps, the topology (world size, workers), the seed, and per rank the
# epoch and the node states (as one JSON string). No samples: a file reader
# stores a file and a cursor, the buffer shuffle stores positions and an
# *anchor* (its input's state at an earlier point, no later than the oldest
# record still in the buffer), from which a resume re-reads a bounded window
# of records.

# %%
data_state = torch.load(checkpoint, weights_only=True)["data"]
print(f"{len(json.dumps(data_state))} bytes of JSON; keys: {list(data_state)}")
print("fingerprint:", data_state["fingerprint"])
print("steps:", data_state["steps"])
print("topology:", data_state["topology"], "seed:", data_state["seed"])
print("rank 0 epoch:", data_state["ranks"]["0"]["epoch"])
assert data_state["ranks"]["0"]["epoch"] == 1 and data_state["seed"] == SEED
assert data_state["fingerprint"] == make_recipe(str(folder)).fingerprint()

# %% [markdown]
# The command line reads the same thing out of the `torch.save` file (it
# finds the Loader state wherever it sits in the dict), and prints each
# step's position:

# %%
shown = subprocess.run(
    [sys.executable, "-m", "datapipes", "inspect", str(checkpoint)],
    capture_output=True,
    text=True,
)
print(shown.stdout)
assert shown.returncode == 0, shown.stderr
assert "epoch 1" in shown.stdout

# %% [markdown]
# ## Safety: a checkpoint refuses a changed recipe
#
# Positions only mean something in the recipe that produced them: 10 batches
# of 16 are not 10 batches of 32. Loading into a different recipe raises
# `dp.StateMismatchError` with a diff of the steps, instead of silently
# resuming somewhere else. Another seed is refused the same way. (Another
# world size or `num_workers` is not refused for a state that covers every
# rank of its job, as this one-rank state does: see "Resume on fewer ranks"
# at the end.)
# The file pattern is part of the recipe too: the same shards under another
# path are another recipe (refused, and shuffled in another order), so resume
# with the data where it was.
#
# What the fingerprint cannot see: functions count by their name (an edited
# body of `to_tensors` still matches), and data objects by type and length
# (a list of the same length with other contents still matches). Changing
# what a step *does* without renaming it is on you.

# %%
try:
    dp.Loader(make_recipe(str(folder), batch_size=32), seed=SEED).load_state_dict(data_state)
except dp.StateMismatchError as error:
    print(error)
    assert "batch(16)" in str(error) and "batch(32)" in str(error)
else:
    raise AssertionError("a checkpoint of batch(16) must not load into batch(32)")

try:
    dp.Loader(make_recipe(str(folder)), seed=SEED + 1).load_state_dict(data_state)
except dp.StateMismatchError as error:
    print(error)
    assert f"seed={SEED}" in str(error)
else:
    raise AssertionError("a checkpoint must not load into a Loader with another seed")

# %% [markdown]
# A state that was damaged after the save (a flipped bit, a hand edit, a
# truncated file that still parsed) is refused before anything is read:
# `dp.InvalidStateError` (a `StateMismatchError`) names the place inside the
# state and what belongs there, and the Loader keeps the position it had.

# %%
damaged = copy.deepcopy(data_state)
rank_entry = next(iter(damaged["ranks"].values()))
rank_entry["node"] = rank_entry["node"].replace("1", "2", 1)  # one digit changed
assert rank_entry["node"] != next(iter(data_state["ranks"].values()))["node"]
try:
    dp.Loader(make_recipe(str(folder)), seed=SEED).load_state_dict(damaged)
except dp.InvalidStateError as error:
    print(error)
    assert "digest" in error.path
else:
    raise AssertionError("a damaged state must be refused")

# %% [markdown]
# ## The same with worker processes
#
# With `num_workers=2` the recipe runs in two DataLoader worker processes,
# each reading its own four files and batching its own records; they take
# turns. So the order differs from the in-process run (and each worker ends
# an epoch with a partial batch: 26 batches, not 25), and the reference is a
# 2-worker run. The state covers every worker: torchdata's
# `StatefulDataLoader` snapshots the workers' positions every 32 items and
# counts the items handed out since. A resume restores the last snapshot and
# replays those items (here the 10 batches since epoch 1 began: computed
# again, not trained on again), then continues exactly after the last batch
# the loop received.

# %%
model, optimizer = make_model()
reference_w = train(model, optimizer, dp.Loader(make_recipe(str(folder)), seed=SEED, num_workers=2))
weights_w = {k: v.clone() for k, v in model.state_dict().items()}
per_epoch_w = [sum(1 for e, _ in reference_w if e == epoch) for epoch in range(EPOCHS)]
assert per_epoch_w == [26] * EPOCHS  # 2 workers x 200 records: 12 full batches + 1 partial each
assert sorted(i for e, ids in reference_w if e == 1 for i in ids) == ALL_IDS

stop_w, checkpoint_w = per_epoch_w[0] + 10, folder / "checkpoint-workers.pt"
model, optimizer = make_model()
loader = dp.Loader(make_recipe(str(folder)), seed=SEED, num_workers=2)
head_w = train(model, optimizer, loader, stop_after=stop_w, checkpoint=checkpoint_w)
loader.close()
tail_w, model = resume(str(folder), str(checkpoint_w), num_workers=2)
assert head_w + tail_w == reference_w
assert all(torch.equal(v, weights_w[k]) for k, v in model.state_dict().items())
print(f"2 workers, {per_epoch_w} batches per epoch: resumed 10 batches into epoch 1,")
print("identical stream and weights")

# %% [markdown]
# ## Inside a `torch.distributed.checkpoint` save
#
# In a distributed job you may save with `torch.distributed.checkpoint`
# (DCP): every rank writes its own shard of one checkpoint folder. The Loader
# is a DCP `Stateful`: put the Loader *itself* in the state dict next to the
# model and the optimizer, and DCP calls its `state_dict()` on save and its
# `load_state_dict()` on load; each rank's position sits under its own key.
#
# One trap is about the optimizer, not the data: `dcp.load` loads *in place*
# into the state dict you hand it, and a fresh optimizer's `state_dict()` has
# no slots for momentum yet, so the momentum would be silently dropped. Use
# `get_state_dict(model, optimizer)` (it creates the slots) and
# `set_state_dict(...)` from `torch.distributed.checkpoint.state_dict`.
#
# This runs in one process, without a process group (DCP's warning about
# that is filtered at the top). `python -m datapipes inspect` reads a DCP
# folder too.

# %%
dcp_folder = folder / "dcp-checkpoint"
model, optimizer = make_model()
loader = dp.Loader(make_recipe(str(folder)), seed=SEED)
head_d = train(model, optimizer, loader, stop_after=STOP)
model_state, optim_state = get_state_dict(model, optimizer)
dcp.save({"model": model_state, "optim": optim_state, "data": loader}, checkpoint_id=dcp_folder)
loader.close()

model, optimizer = make_model()
assert optimizer.state_dict()["state"] == {}  # the naive template: nothing to load momentum into
model_state, optim_state = get_state_dict(model, optimizer)  # with momentum slots to fill
print("slots to fill:", {name: list(slots) for name, slots in optim_state["state"].items()})
loader = dp.Loader(make_recipe(str(folder)), seed=SEED)
state = {"model": model_state, "optim": optim_state, "data": loader}
dcp.load(state, checkpoint_id=dcp_folder)  # calls loader.load_state_dict(...)
set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
tail_d = train(model, optimizer, loader)
assert head_d + tail_d == reference
assert all(torch.equal(v, reference_weights[k]) for k, v in model.state_dict().items())
print("DCP: resumed stream and weights identical to the uninterrupted run")

# %% [markdown]
# ## Resume on fewer ranks (elastic resume)
#
# Jobs get rescheduled: a job that ran on 3 GPUs comes back on 2, or with
# another `num_workers`. A rank's own state resumes only that rank on the
# saved topology; for another one, **merge** the states that every rank
# saved at one checkpoint with `dp.merge_states(states)` and give the merged
# state to every new rank's `load_state_dict`. A merged state (or the state of
# a one-rank job) loads on any `rank`, `world_size` and `num_workers`:
#
# * on the saved topology the resumed stream is bit-identical, as above;
# * on another one, the interrupted epoch's remaining items are dealt to
#   the new ranks, each exactly once, including the items that were read but
#   not delivered (here: the records waiting in each rank's shuffle buffer).
#   The order may differ from the uninterrupted run's; the set may not;
# * the epoch after it is a fresh epoch of the new topology.
#
# Here a 3-rank job runs in this one process (`rank=r, world_size=3`, no
# `torch.distributed` needed): each rank takes some steps (not the same
# number: ranks need not be in step), saves its own file with
# `dp.save_checkpoint` as a real rank would, and the job "dies". The
# recipe batches with `drop_last=True` this time, to show where its drops go.

# %%
OLD_RANKS, NEW_RANKS = 3, 2


def elastic_recipe(folder: str) -> dp.DataPipe:
    return (
        dp.files(f"{folder}/train-*.jsonl")
        .shuffle()
        .read_jsonl()
        .map(to_tensors)
        .shuffle(buffer_size=64)
        .batch(BATCH, drop_last=True)  # each consumer drops its short last batch
    )


delivered = []  # the ids every rank's training loop received before the checkpoint
rank_files = []
for rank, steps in enumerate([3, 5, 4]):  # each rank: a few training steps into epoch 0
    loader = dp.Loader(elastic_recipe(str(folder)), seed=SEED, rank=rank, world_size=OLD_RANKS)
    batches = iter(loader)
    for _ in range(steps):
        delivered += next(batches)["id"].tolist()  # ... a training step ...
    rank_files.append(folder / f"elastic-rank{rank}.pt")
    dp.save_checkpoint({"data": loader.state_dict()}, rank_files[-1])  # + model, optimizer
    loader.close()
print(f"{OLD_RANKS} ranks delivered {len(delivered)} of {len(ALL_IDS)} records of epoch 0")

# %% [markdown]
# The restarted job has 2 ranks. Every new rank reads **all** the old
# ranks' files and merges them: `merge_states` is a pure function, so each
# rank computes the same merged state, and from it the same deal, without
# talking to the others. It refuses a list with a rank missing (or states of
# different checkpoints, recipes or seeds), saying which. The merged state is
# plain data like every Loader state: it can be saved as a file of its own
# with `dp.save_checkpoint` and read back with `dp.load_checkpoint`.

# %%
states = [dp.load_checkpoint(path)["data"] for path in rank_files]
try:
    dp.merge_states(states[:2])
except dp.StateMismatchError as error:
    print(error)
    assert "rank(s) [2] are missing" in str(error)
else:
    raise AssertionError("a merge without rank 2 must be refused")

merged = dp.merge_states(states)  # in any order
dp.save_checkpoint({"data": merged}, folder / "elastic-merged.pt")
merged = dp.load_checkpoint(folder / "elastic-merged.pt")["data"]
print(f"merged state: ranks {sorted(merged['ranks'])}, {len(json.dumps(merged))} bytes of JSON")

new_ranks = [
    dp.Loader(elastic_recipe(str(folder)), seed=SEED, rank=rank, world_size=NEW_RANKS)
    for rank in range(NEW_RANKS)
]
for loader in new_ranks:
    loader.load_state_dict(merged)  # every new rank loads the same merged state
assert all(loader.epoch == 0 for loader in new_ranks)  # the interrupted epoch continues
after = [[i for batch in loader for i in batch["id"].tolist()] for loader in new_ranks]
drops = [loader.dropped() for loader in new_ranks]
for rank in range(NEW_RANKS):
    print(
        f"new rank {rank}: {len(after[rank])} records of the rest of epoch 0, dropped {drops[rank]}"
    )

every = delivered + after[0] + after[1]
assert len(every) == len(set(every))  # no record twice: nothing repeated
missing = sorted(set(ALL_IDS) - set(every))
dropped = sum(count for counts in drops for count in counts.values())
assert len(missing) == dropped  # what never arrived is exactly what drop_last dropped, counted
assert all(count < BATCH for counts in drops for count in counts.values())  # a short batch each
print(f"before + after: {len(every)} records once each, + {dropped} dropped = {len(ALL_IDS)}")

# %% [markdown]
# `loader.dropped()` reports what `batch(..., drop_last=True)` dropped at the
# end of the epoch: after the resume, each *new* rank's short last batch
# (records, per step). Without `drop_last` (and without `even_batches`, whose
# drops it counts too), before plus after is the epoch exactly, as the DCP
# case below shows. The two new ranks' shares differ in size: the rests of
# files that were being read and the untouched files are dealt whole,
# round-robin, so with few files the shares are uneven (with many small
# files they even out). The next epoch is an ordinary epoch of the 2-rank
# job: the same batches as a fresh 2-rank Loader's epoch 1.

# %%
next_epoch = [[batch["id"].tolist() for batch in loader] for loader in new_ranks]  # epoch 1
fresh = [
    dp.Loader(elastic_recipe(str(folder)), seed=SEED, rank=rank, world_size=NEW_RANKS)
    for rank in range(NEW_RANKS)
]
for loader in fresh:
    loader.set_epoch(1)
assert next_epoch == [[batch["id"].tolist() for batch in loader] for loader in fresh]
print(
    f"epoch 1 on {NEW_RANKS} ranks: {[len(b) for b in next_epoch]} batches, as a fresh 2-rank job"
)

# %% [markdown]
# ### With `torch.distributed.checkpoint`
#
# With DCP every rank saves the Loader itself in its `dcp.save` dict (as in
# the section above) and so writes its own position. On resume, **every**
# new rank reads all the saved positions, merged, in two lines:
#
# ```python
# state = dp.load_dcp_states(path, key="data")  # every saved rank, merged
# loader.load_state_dict(state)
# ```
#
# and loads the model and optimizer with `dcp.load` as usual, *without* the
# Loader in that dict (`dcp.load` would hand it only the position saved under
# its own rank number). `load_dcp_states` runs no collective and needs no
# process group. Below it reads the one-rank DCP checkpoint of the previous
# section (10 batches into epoch 1), and two ranks finish that epoch: a
# one-rank job's state covers its whole job, so it needs no merging.

# %%
state = dp.load_dcp_states(dcp_folder, key="data")
two_ranks = [
    dp.Loader(make_recipe(str(folder)), seed=SEED, rank=rank, world_size=2) for rank in range(2)
]
for loader in two_ranks:
    loader.load_state_dict(state)
assert all(loader.epoch == 1 for loader in two_ranks)
rest = [[i for batch in loader for i in batch["id"].tolist()] for loader in two_ranks]
before = [i for ids in in_epoch(head_d, 1) for i in ids]
assert sorted(before + rest[0] + rest[1]) == ALL_IDS  # epoch 1 exactly once, across 2 ranks
print(f"DCP, 1 rank -> 2: {len(before)} records before, {[len(r) for r in rest]} after")

# %% [markdown]
# ### What is refused
#
# Some steps have no exact answer on another topology, and the load raises
# `dp.ElasticResumeError` (a `dp.StateMismatchError`) naming the step and
# why, instead of guessing. `dp.range(100).take(10)` takes 10 items *per
# consumer*: 30 on 3 ranks, 20 on 2, so "the rest of the epoch" on 2 ranks
# does not exist. On the saved topology the same merged state loads and
# resumes exactly. (docs/guides/elastic-resume.md lists every step that is refused.)

# %%
take_pipe = dp.range(100).take(10)
takers = [dp.Loader(take_pipe, rank=rank, world_size=OLD_RANKS) for rank in range(OLD_RANKS)]
take_batches = [iter(loader) for loader in takers]
for batches in take_batches:
    next(batches)
merged_take = dp.merge_states([loader.state_dict() for loader in takers])
try:
    dp.Loader(take_pipe, rank=0, world_size=NEW_RANKS).load_state_dict(merged_take)
except dp.ElasticResumeError as error:
    print(error)
    assert "'take'" in str(error)
else:
    raise AssertionError("take() must not resume on another world size")
dp.Loader(take_pipe, rank=0, world_size=OLD_RANKS).load_state_dict(merged_take)  # same: fine

# %% [markdown]
# ## When to checkpoint
#
# At any step: mid-epoch, mid-buffer, with workers; the position is exact
# wherever it is taken. `state_dict()` reads positions, never data, so it is
# cheap enough to take with every model checkpoint. Keep it **in the same
# file** (or the same DCP folder) as the model and the optimizer: saved
# together they describe one moment of the run, and can never drift apart
# (a model from step 1,000 with the data position of step 900 would train on
# 100 batches twice).

# %%
loader = dp.Loader(make_recipe(str(folder)), seed=SEED)
batches = iter(loader)
for _ in range(10):
    next(batches)
start = time.perf_counter()
for _ in range(200):
    loader.state_dict()
per_call = (time.perf_counter() - start) / 200
loader.close()
print(f"loader.state_dict(): {per_call * 1e6:.0f} us per call mid-epoch")
print(f"the whole checkpoint file (model, optimizer, data): {checkpoint.stat().st_size} bytes")

shutil.rmtree(folder)
