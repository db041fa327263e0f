# %% [markdown]
# # Distributed training: DDP, uneven shards, tensor parallelism, checkpoints
#
# A real `torch.distributed` job on CPU (gloo, 4 processes): a `dp.Loader`
# takes its rank and world size from the process group or a `DeviceMesh`, so
# every rank reads its own share and no sample reaches two ranks. This
# tutorial trains a tiny `DistributedDataParallel` model on deliberately
# uneven JSONL shards and shows what `even_batches` does about them, reads a
# 2 x 2 mesh (data parallel x tensor parallel) where both ranks of a
# tensor-parallel group must see the same batches, checkpoints mid-epoch on
# every rank, evaluates on rank 0 alone, and lets a deliberately slow rank
# read less with dynamic dispatch.
#
# For users of `DistributedSampler`: there is nothing to wrap and no
# `set_epoch` to forget; the Loader finds the ranks itself and reshuffles
# every epoch.
#
# Two ways to run it:
#
# * `torchrun --nproc-per-node=4 tutorials/06_distributed_training.py` is how
#   a training script runs: every rank executes the code below.
# * `python tutorials/06_distributed_training.py` (no `RANK` in the
#   environment) launches itself under torchrun, waits for the job with a
#   timeout, then reads what every rank wrote and checks the properties that
#   span ranks.
#
# Either way it asserts what it shows.

# %%
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import datapipes as dp

NPROC = 4  # the job's processes: 4 data-parallel ranks, then a 2 x 2 mesh
SEED = 7
BATCH = 4
FEATURES = 4
TRAIN_SIZES = (6, 40, 7, 8, 9, 10, 11, 12)  # records per shard: one shard is much bigger
EVAL_SIZE = 24
JOB_TIMEOUT_S = 120  # the whole job; a hang fails the script instead of blocking CI
FOLDER_VARIABLE = "DATAPIPES_TUTORIAL_DIR"  # the launcher tells the ranks where the data is

# %% [markdown]
# ## The data: uneven shards
#
# Eight training shards of very different sizes, and one evaluation file. A
# record is `{"id", "x", "y"}`; the ids let us check afterwards which rank
# saw which sample.


# %%
def write_data(folder: Path) -> None:
    def record(i: int) -> dict[str, Any]:
        x = [((i * 37) % 11) / 11, ((i * 53) % 7) / 7, -(i % 5) / 5, 1.0]
        return {"id": i, "x": x, "y": 2 * x[0] - x[1] + 0.5 * x[2]}

    (folder / "data").mkdir(parents=True)
    next_id = 0
    for shard, size in enumerate(TRAIN_SIZES):
        lines = [json.dumps(record(i)) + "\n" for i in range(next_id, next_id + size)]
        (folder / "data" / f"train-{shard:02d}.jsonl").write_text("".join(lines))
        next_id += size
    lines = [json.dumps(record(10_000 + i)) + "\n" for i in range(EVAL_SIZE)]
    (folder / "data" / "eval.jsonl").write_text("".join(lines))


def to_tensors(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": record["id"],
        "x": torch.tensor(record["x"], dtype=torch.float32),
        "y": torch.tensor([record["y"]], dtype=torch.float32),
    }


def train_recipe(folder: Path) -> dp.DataPipe:
    # File order reshuffled every epoch (the same on every rank); whole files dealt to ranks.
    return (
        dp.files(str(folder / "data" / "train-*.jsonl"))
        .shuffle()
        .read_jsonl()
        .map(to_tensors)
        .batch(BATCH)
    )


def ids(batch: dict[str, Any]) -> list[int]:
    return [int(i) for i in batch["id"].tolist()]


def say(text: str) -> None:
    print(f"[rank {dist.get_rank()}] {text}", flush=True)  # one write: ranks' lines don't mix


def dropped_batches(caught: list[warnings.WarningMessage]) -> dict[int, tuple[int, int]]:
    """{epoch: (items dropped, items every rank yields)} from this rank's UnevenDataWarnings."""
    found = {}
    for warning in caught:
        if issubclass(warning.category, dp.UnevenDataWarning):
            say(f"UnevenDataWarning: {warning.message}")
            match = re.search(
                r"dropped its last (\d+) item\(s\) of epoch (\d+) so that every rank yields (\d+)",
                str(warning.message),
            )
            assert match, warning.message
            dropped, epoch, yields = map(int, match.groups())
            found[epoch] = (dropped, yields)
    return found


# %% [markdown]
# ## How the code below runs
#
# Each section has a function that runs **on every rank**, the same code in
# all four processes, each with its own `dist.get_rank()`; each rank asserts
# what it can see by itself and returns what it read. `run_rank()` at the end
# calls them in order and writes one JSON file per rank. The `check_...`
# functions run once, after the job, on all those files: they assert what
# only the whole job can show (no sample on two ranks, equal step counts).
#
# ## 1. DDP: the Loader takes its ranks from `torch.distributed`
#
# After `dist.init_process_group("gloo")` a plain `dp.Loader(pipe, seed=...)`
# knows its rank and world size (`loader.topology` says where they came
# from). Create it after `init_process_group`, as here; made before it under
# `torchrun`, it takes the ranks from `RANK`/`WORLD_SIZE` and still decides
# at its first epoch that the ranks must agree on their step counts
# (`loader.even_batches`, section 2). DDP all-reduces the gradients in
# `backward()`, which keeps the four model replicas identical.


# %%
def train_ddp(folder: Path, epochs: int = 2) -> dict[str, Any]:
    rank = dist.get_rank()
    loader = dp.Loader(train_recipe(folder), seed=SEED)
    say(f"{loader.topology}")
    assert loader.topology == dp.Topology(rank, NPROC, "torch.distributed")
    assert loader.even_batches  # on by default with more than one rank

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps: dict[int, list[list[int]]] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dp.UnevenDataWarning)
        for epoch in range(epochs):
            steps[epoch] = []
            for batch in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
                loss.backward()  # a collective: every rank must take this step
                optimizer.step()
                steps[epoch].append(ids(batch))
            say(f"epoch {epoch}: {len(steps[epoch])} steps, last loss {loss.item():.3f}")
    loader.close()
    drops = dropped_batches(caught)
    for epoch, (_, yields) in drops.items():
        assert yields == len(steps[epoch])  # "every rank yields N": the steps this rank took
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    return {"model": model, "steps": steps, "drops": drops, "params": params}


# %% [markdown]
# ## 2. Uneven shards and `even_batches`
#
# Files are dealt whole, so the rank that got the 40-record shard has about 3x
# the batches of the others. Left alone, the other ranks would finish
# the epoch early and the full rank would wait forever in its next gradient
# all-reduce: DDP hangs (until the collective's timeout). So with more than
# one rank under `torch.distributed`, `even_batches` is on by default: the
# ranks agree, through a tiny gloo `all_reduce` every 8 items, on how many
# items *all* of them have, and stop there together. A rank that had more
# drops the rest of its epoch and says so in a `dp.UnevenDataWarning`:
# "rank R dropped its last N item(s) of epoch E so that every rank yields M".
# The Loader's items are batches here, so N and M count batches.
#
# `even_batches=False` shows what was dropped: the same ranks then read
# their whole share, and the batch counts differ. Only read such a Loader
# where no collective runs per batch (here: no training); under DDP it is
# exactly the hang above.
#
# What is dropped is real data: with one shard four times the others, about
# a third of each epoch never reaches the model (the printout below says how
# much). The drops change from epoch to epoch (the file order does), but the
# fix is in the data: many shards of even size (many more than ranks x
# workers), so that the dealt shares differ by little.


# %%
def read_uneven(folder: Path, trained: dict[str, Any], epochs: int = 2) -> dict[int, Any]:
    loader = dp.Loader(train_recipe(folder), seed=SEED, even_batches=False)
    uneven = {epoch: [ids(batch) for batch in loader] for epoch in range(epochs)}
    loader.close()
    for epoch in range(epochs):
        even = trained["steps"][epoch]
        extra = uneven[epoch][len(even) :]
        say(f"epoch {epoch}: {len(uneven[epoch])} batches without even_batches, {len(even)} with")
        assert uneven[epoch][: len(even)] == even  # even_batches cuts this rank's stream short
        assert trained["drops"].get(epoch, (0, 0))[0] == len(extra)  # as the warning said
    return uneven


def check_ddp(ranks: list[dict[str, Any]], dataset: list[int]) -> None:
    total_dropped = 0
    for epoch in map(str, range(2)):  # the epochs, as JSON keys
        even = [r["ddp"]["steps"][epoch] for r in ranks]
        uneven = [r["uneven"][epoch] for r in ranks]
        steps = [len(s) for s in even]
        assert len(set(steps)) == 1 and steps[0] > 0, f"steps per rank: {steps}"
        delivered = [i for rank_steps in even for batch in rank_steps for i in batch]
        assert len(delivered) == len(set(delivered)), "a sample reached two ranks"
        every = [i for rank_steps in uneven for batch in rank_steps for i in batch]
        assert sorted(every) == dataset  # without the cut: every sample exactly once
        dropped = [i for rank_steps in uneven for batch in rank_steps[steps[0] :] for i in batch]
        assert len(delivered) + len(dropped) == len(dataset)
        total_dropped += len(dropped)
        print(
            f"epoch {epoch}: steps per rank {steps} (without even_batches "
            f"{[len(s) for s in uneven]}); {len(delivered)} samples trained on, "
            f"{len(dropped)} dropped, {len(dataset)} in the data"
        )
    assert total_dropped > 0  # the shards really are uneven
    assert all(r["ddp"]["params"] == ranks[0]["ddp"]["params"] for r in ranks)  # DDP in sync


# %% [markdown]
# ## 3. Tensor parallelism: the data-parallel rank comes from a `DeviceMesh`
#
# A 2 x 2 mesh: dimension `dp` (data parallel) and `tp` (tensor parallel).
# Ranks 0 and 1 form one tensor-parallel group, 2 and 3 the other. The two
# ranks of a group hold different halves of each weight and compute *one*
# model on *one* batch, so they must read the same batches; the two groups
# split the data. `dp.Loader(pipe, mesh=mesh, mesh_dims="dp")` does exactly
# that: its rank is the mesh coordinate along `dp` (world size 2), whatever
# the `tp` coordinate. With hybrid sharding (HSDP) both dimensions of a
# `("replicate", "shard")` mesh are data-parallel: `mesh_dims=("replicate",
# "shard")` makes the rank row-major over the two (world size 4 here), and a
# 3-D mesh with tensor parallelism names the two data-parallel dimensions
# the same way.
#
# `parallelize_module` splits the MLP's first layer by output columns and the
# second by input rows. Gradients are then averaged over the `dp` dimension
# only: each rank all-reduces its own gradient shard with its peer in the
# other group (`mesh["dp"].get_group()`). even_batches still applies: all
# four ranks take part in the agreement and stop together. Its warning names
# the *data-parallel* rank, so both processes of the fuller tensor-parallel
# group report the same rank and the same drop.


# %%
def train_tensor_parallel(folder: Path, steps: int = 4) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    coordinates = {"dp": mesh.get_local_rank("dp"), "tp": mesh.get_local_rank("tp")}
    loader = dp.Loader(train_recipe(folder), seed=SEED, mesh=mesh, mesh_dims="dp")
    say(f"mesh coordinates {coordinates}: {loader.topology}")
    assert loader.topology == dp.Topology(coordinates["dp"], 2, "device mesh")
    hybrid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    hsdp = dp.Loader(train_recipe(folder), mesh=hybrid, mesh_dims=("replicate", "shard"))
    row_major = 2 * hybrid.get_local_rank("replicate") + hybrid.get_local_rank("shard")
    assert hsdp.topology == dp.Topology(row_major, 4, "device mesh")

    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    initial = [p.to_local().detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dp_group, dp_size = mesh["dp"].get_group(), mesh["dp"].size()
    read: list[list[int]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dp.UnevenDataWarning)
        for batch in loader:  # one epoch: all of it is read, the first `steps` batches train
            if len(read) < steps:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
                loss.backward()
                for p in model.parameters():
                    grad = p.grad.to_local()  # this rank's shard of the gradient, in place
                    dist.all_reduce(grad, group=dp_group)  # gloo has no AVG: sum, divide
                    grad /= dp_size
                optimizer.step()
            read.append(ids(batch))
    loader.close()
    drops = dropped_batches(caught)
    local = [p.to_local().detach() for p in model.parameters()]
    shapes = [tuple(t.shape) for t in local]
    say(f"{len(read)} batches; local weight shards {shapes}, last loss {loss.item():.3f}")
    assert any(not torch.equal(a, b) for a, b in zip(initial, local))  # training moved them
    uneven_loader = dp.Loader(
        train_recipe(folder), seed=SEED, mesh=mesh, mesh_dims="dp", even_batches=False
    )
    uneven = [ids(batch) for batch in uneven_loader]
    uneven_loader.close()
    assert uneven[: len(read)] == read and drops.get(0, (0, 0))[0] == len(uneven) - len(read)
    return {
        "coordinates": coordinates,
        "steps": read,
        "uneven": uneven,
        "shards": [t.flatten().tolist() for t in local],
        "drops": drops,
    }


def check_mesh(ranks: list[dict[str, Any]], dataset: list[int]) -> None:
    runs = [r["mesh"] for r in ranks]
    assert len({len(run["steps"]) for run in runs}) == 1  # all four stopped together
    groups: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(run["coordinates"]["dp"], []).append(run)
    for peers in groups.values():  # a tensor-parallel group: identical batches, same drops
        assert peers[0]["steps"] == peers[1]["steps"] and peers[0]["steps"]
        assert peers[0]["drops"] == peers[1]["drops"]
    first, second = groups[0][0], groups[1][0]
    delivered = [i for run in (first, second) for batch in run["steps"] for i in batch]
    assert len(delivered) == len(set(delivered)), "the two dp groups overlap"
    n = len(first["steps"])
    dropped = [i for run in (first, second) for batch in run["uneven"][n:] for i in batch]
    assert sorted(delivered + dropped) == dataset  # together the whole data, drops accounted
    # dp-averaged gradients: the same tp shard is identical in both dp groups
    by_tp = {}
    for run in runs:
        by_tp.setdefault(run["coordinates"]["tp"], []).append(run["shards"])
    assert all(a == b for a, b in by_tp.values())
    print(
        f"mesh: tp peers read the same {n} batches; dp groups disjoint; "
        f"{len(delivered)} samples read + {len(dropped)} dropped = {len(dataset)}"
    )


# %% [markdown]
# ## 4. A mid-epoch checkpoint on every rank
#
# Every rank saves its own `loader.state_dict()` (plain data, here one
# file per rank next to where the model would go, saved with
# `dp.save_checkpoint` so a crash mid-save keeps the previous one); a fresh
# Loader, as after a restart (here in the same job, to keep it short), loads
# it and continues right after the last batch the loop received. All ranks
# stop at the same step, so after the resume their even_batches agreement
# continues in step. (With
# `torch.distributed.checkpoint`, put the Loader itself in the state dict:
# every rank writes and gets back its own position. The checkpoint tutorial
# covers both in depth.)


# %%
def checkpoint_and_resume(folder: Path, trained: dict[str, Any], stop: int = 2) -> None:
    rank = dist.get_rank()
    path = folder / "ckpt" / f"rank{rank}.pt"
    path.parent.mkdir(exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dp.UnevenDataWarning)  # the same drops as in section 1
        loader = dp.Loader(train_recipe(folder), seed=SEED)
        first = []
        for batch in loader:
            first.append(ids(batch))  # ... a training step ...
            if len(first) == stop:
                dp.save_checkpoint({"data": loader.state_dict()}, path)  # + model, optimizer
                break
        loader.close()

        resumed = dp.Loader(train_recipe(folder), seed=SEED)  # a fresh Loader, as after a crash
        resumed.load_state_dict(dp.load_checkpoint(path)["data"])
        rest = [ids(batch) for batch in resumed]  # the rest of epoch 0
        after = [ids(batch) for batch in resumed]  # epoch 1
        resumed.close()
    assert first + rest == trained["steps"][0] and after == trained["steps"][1]
    say(f"resumed after {stop} steps: the rest of epoch 0 and epoch 1 as uninterrupted")


# %% [markdown]
# ## 5. Evaluation on rank 0 alone
#
# A Loader made the usual way on rank 0 would take its ranks from
# `torch.distributed`: it would read only rank 0's quarter of the evaluation
# data, and with even_batches (on by default) it would wait forever in the
# agreement's `all_reduce` for ranks 1-3, which are not iterating it. So a
# Loader that one rank iterates alone is made single-rank:
# `dp.Loader(eval_pipe, rank=0, world_size=1)`. (To evaluate on every rank
# instead, make it the usual way and all-reduce the metrics.)


# %%
def evaluate_on_rank_0(folder: Path, model: torch.nn.Module) -> dict[str, Any] | None:
    result = None
    if dist.get_rank() == 0:
        eval_pipe = dp.files(str(folder / "data" / "eval.jsonl")).read_jsonl().map(to_tensors)
        eval_pipe = eval_pipe.batch(8)
        share = dp.Loader(eval_pipe, even_batches=False)  # no hang, but rank 0 of 4: a share
        partial = [i for batch in share for i in ids(batch)]
        loader = dp.Loader(eval_pipe, rank=0, world_size=1)
        seen, total = [], 0.0
        with torch.no_grad():  # model.module: the plain model, without DDP's collectives
            for batch in loader:
                prediction = model.module(batch["x"])
                total += torch.nn.functional.mse_loss(prediction, batch["y"], reduction="sum")
                seen += ids(batch)
        say(
            f"eval: {len(partial)} of {EVAL_SIZE} samples as rank 0 of {NPROC}; single-rank: "
            f"{len(seen)}, mean squared error {float(total) / len(seen):.3f}"
        )
        assert len(partial) < EVAL_SIZE and sorted(seen) == list(range(10_000, 10_000 + EVAL_SIZE))
        result = {"seen": len(seen)}
    dist.barrier()  # the other ranks wait here (in a real job: until the next epoch)
    return result


# %% [markdown]
# ## 6. A deliberately slow rank: dynamic dispatch
#
# DDP moves in lockstep: every step waits for every rank's batch, so a rank
# that loads slowly sets the pace whoever reads which sample. Jobs whose ranks
# progress on their own (scoring or embedding a dataset, inference,
# preprocessing, asynchronous training) end when the *last* rank ends, and
# with a fixed share each that is the slowest rank. `dispatch="dynamic"`
# hands the epoch out in units (runs of `dispatch_unit_items` positions, or
# files and file parts) through the store of the process group, to whichever
# rank asks next: the slow rank simply asks less often. Every sample still
# reaches exactly one rank, and a checkpoint (each rank's `state_dict()`,
# merged) resumes what no rank delivered, on any number of ranks.
#
# Here rank 1 waits 8x longer per item (a busy disk, a noisy neighbour,
# heavier samples). Each rank iterates alone (`even_batches=False`: no step
# counts to agree on), first with static dealing, then dynamic, and the ranks
# compare what they read.

# %%
ITEMS = 480


def score(i: int) -> int:
    time.sleep(0.004 if dist.get_rank() == 1 else 0.0005)  # waiting, not computing: the
    return i  # ranks do not compete for this machine's cores


# %%
def slow_rank(dispatch: str) -> dict[str, Any]:
    pipe = dp.range(ITEMS).shuffle().map(score)
    loader = dp.Loader(pipe, seed=SEED, even_batches=False, dispatch=dispatch,
                       dispatch_unit_items=16)  # fmt: skip
    started = time.perf_counter()
    mine = list(loader)
    seconds = time.perf_counter() - started
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mine, seconds))
    read = [len(items) for items, _ in everyone]
    assert sorted(i for items, _ in everyone for i in items) == list(range(ITEMS))  # once each
    say(f"{dispatch}: items per rank {read}, the job took {max(t for _, t in everyone):.2f} s")
    return {"read": read, "seconds": max(t for _, t in everyone)}


def dynamic_dispatch() -> dict[str, Any]:
    static, dynamic = slow_rank("static"), slow_rank("dynamic")
    assert static["read"] == [ITEMS // NPROC] * NPROC  # a fixed share each
    assert dynamic["read"][1] < ITEMS // NPROC  # the slow rank read less than its share
    return {"static": static, "dynamic": dynamic}


# %% [markdown]
# ## 7. A rank that freezes: leases
#
# A job whose ranks run no collectives goes on when one rank stops: with
# `dispatch_lease_seconds` each rank writes its position to the store ahead
# of every item and renews a lease; the ranks that finish wait for the others,
# and take over a lease that stays the same that long: they read what the
# frozen rank had claimed but not delivered. Here rank 3 freezes itself
# (SIGSTOP, as a paused VM or a debugger would) after 10 items; rank 0 wakes
# it (SIGCONT) once the others are through. Its next item is dropped (its
# lease is gone: `dp.LeaseTakenWarning`), and every item was read once.


# %%
def frozen_rank() -> dict[str, Any]:
    pids: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    pipe = dp.range(ITEMS).shuffle().map(score)
    loader = dp.Loader(pipe, seed=SEED, even_batches=False, dispatch="dynamic",
                       dispatch_unit_items=16, dispatch_lease_seconds=2.0)  # fmt: skip
    mine = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dp.LeaseTakenWarning)
        for item in loader:
            mine.append(item)
            if dist.get_rank() == 3 and len(mine) == 10:
                os.kill(os.getpid(), signal.SIGSTOP)  # frozen until rank 0 wakes it
    fenced = any(issubclass(w.category, dp.LeaseTakenWarning) for w in caught)
    if dist.get_rank() == 0:  # ranks 1 and 2 are through too: rank 0 waited for them
        os.kill(pids[3], signal.SIGCONT)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mine, fenced))
    assert sorted(i for items, _ in everyone for i in items) == list(range(ITEMS))  # once each
    read = [len(items) for items, _ in everyone]
    say(f"leases: items per rank {read}, rank 3 fenced: {everyone[3][1]}")
    assert read[3] == 10 and everyone[3][1] and not any(f for _, f in everyone[:3])
    return {"read": read}


# %% [markdown]
# ## The job: every rank's main, and the launcher
#
# `run_rank()` is what `torchrun` runs in each process. Started by the
# launcher, it finds the data folder in an environment variable; started by
# you with `torchrun`, rank 0 makes the folder and broadcasts its path, and
# checks the results itself at the end.


# %%
def run_rank() -> None:
    # A collective that waits longer than this raises instead of hanging forever.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        assert dist.get_world_size() == NPROC, f"run this with --nproc-per-node={NPROC}"
        launched = FOLDER_VARIABLE in os.environ
        if launched:
            folder = Path(os.environ[FOLDER_VARIABLE])
        else:  # run by hand under torchrun: rank 0 makes the data, everyone uses it
            holder = [tempfile.mkdtemp(prefix="datapipes-ddp-") if dist.get_rank() == 0 else None]
            if dist.get_rank() == 0:
                write_data(Path(holder[0]))
            dist.broadcast_object_list(holder, src=0)
            folder = Path(holder[0])
        trained = train_ddp(folder)
        result = {
            "ddp": {k: trained[k] for k in ("steps", "drops", "params")},
            "uneven": read_uneven(folder, trained),
            "mesh": train_tensor_parallel(folder),
        }
        checkpoint_and_resume(folder, trained)
        result["eval"] = evaluate_on_rank_0(folder, trained["model"])
        result["dispatch"] = dynamic_dispatch()
        result["leases"] = frozen_rank()
        out = folder / "out"
        out.mkdir(exist_ok=True)
        (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
        dist.barrier()
        if not launched and dist.get_rank() == 0:
            try:
                check_job(folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        dist.destroy_process_group()


def check_job(folder: Path) -> None:
    """The cross-rank checks, once, on what every rank wrote."""
    ranks = [json.loads((folder / "out" / f"rank{r}.json").read_text()) for r in range(NPROC)]
    dataset = sorted(
        json.loads(line)["id"]
        for path in (folder / "data").glob("train-*.jsonl")
        for line in path.read_text().splitlines()
    )
    check_ddp(ranks, dataset)
    check_mesh(ranks, dataset)
    assert ranks[0]["eval"] == {"seen": EVAL_SIZE} and all(r["eval"] is None for r in ranks[1:])
    timing = ranks[0]["dispatch"]
    print(
        f"a slow rank: the job took {timing['static']['seconds']:.2f} s with static shares, "
        f"{timing['dynamic']['seconds']:.2f} s with dynamic dispatch"
    )
    print(f"all checks passed across {NPROC} ranks")


# %% [markdown]
# The launcher. As a script, it runs `python -m torch.distributed.run`
# (that is `torchrun`) on this very file; `--standalone` starts a rendezvous
# on a free local port. The children get a clean environment (no
# `RANK`/`MASTER_PORT` from an outer job) and `OMP_NUM_THREADS=1` (four
# processes on a small machine: one intra-op thread each). A job that does
# not finish in time is stopped: torchrun starts every rank in a session of
# its own, so it is asked to stop them (SIGTERM), and whatever is left is
# killed. In a notebook there is no file to hand to torchrun, so the four
# ranks are forked from the kernel instead, with the environment torchrun
# would give them; the 60 s collective timeout bounds a hang there.


# %%
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


def run_torchrun(script: str, folder: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={NPROC}", script]
    print("launching:", shlex.join(command), flush=True)
    outer = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in outer}
    env = {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC_")}
    env.update({"OMP_NUM_THREADS": "1", FOLDER_VARIABLE: str(folder)})
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


def forked_rank(rank: int, folder: str, port: int) -> None:
    """One rank forked from a notebook, with the environment torchrun would set."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(NPROC), MASTER_ADDR="127.0.0.1"
    )
    os.environ.update({"MASTER_PORT": str(port), FOLDER_VARIABLE: folder})
    torch.set_num_threads(1)
    run_rank()


def run_forked(folder: Path) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    print(f"forking {NPROC} ranks (a notebook has no file for torchrun)", flush=True)
    mp.start_processes(forked_rank, args=(str(folder), port), nprocs=NPROC, start_method="fork")


def launch() -> None:
    folder = Path(tempfile.mkdtemp(prefix="datapipes-ddp-"))
    try:
        write_data(folder)
        as_script = "__file__" in globals()
        if as_script:
            run_torchrun(str(Path(__file__).resolve()), folder)
        else:
            run_forked(folder)
        check_job(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if "RANK" in os.environ:  # one process of a torchrun job
        run_rank()
    else:
        launch()
