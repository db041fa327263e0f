"""One rank of a real ``torch.distributed`` job, started by ``torchrun`` from test_distributed.py.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node=N
tests/distributed_job.py CONFIG.json``. The config (JSON) says what to do:

* ``mode``: ``"full+stop"`` first trains a tiny DDP model for ``epochs`` epochs
  uninterrupted ("full"), then trains a fresh model with a fresh Loader and stops after
  ``stop_step`` steps of epoch ``stop_epoch``, saving a checkpoint (model, optimizer,
  loader state) per rank ("stop"); ``"resume"`` (a new job) loads that checkpoint and
  trains to the end; ``"mesh"`` reads through DeviceMesh ranks.
* ``data``: a glob of JSONL files with records ``{"id", "x", "y"}``; ``out``: a folder
  for ``rank<R>.json`` (what this rank consumed); ``ckpt``: a folder for ``ckpt-rank<R>.pt``.
* ``dcp`` (optional): a folder. The stopped run also saves one
  ``torch.distributed.checkpoint`` there, all ranks together, with the Loader itself as
  the ``"data"`` entry (DCP calls its ``state_dict()``); the resume job then resumes a
  second time ("dcp_resume"), from that checkpoint, with a fresh model and Loader that
  ``torch.distributed.checkpoint.load`` fills in (it calls the Loader's
  ``load_state_dict()``).
* ``seed``, ``batch``, ``workers`` (DataLoader worker processes), ``epochs``.

Each rank writes the sample ids it consumed, per epoch and per step. ``full`` also
reads the same epochs again with ``even_batches=False`` (no collective runs
while doing so, so uneven ranks cannot hang) to show what even_batches dropped.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import datapipes as dp

FEATURES = 4


def to_tensors(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": record["id"],
        "x": torch.tensor(record["x"], dtype=torch.float32),
        "y": torch.tensor([record["y"]], dtype=torch.float32),
    }


def recipe(config: dict[str, Any]) -> dp.DataPipe[Any]:
    return dp.files(config["data"]).shuffle().read_jsonl().map(to_tensors).batch(config["batch"])


def make_loader(config: dict[str, Any], **options: Any) -> dp.Loader:
    options.setdefault("num_workers", config["workers"])
    return dp.Loader(recipe(config), seed=config["seed"], **options)


def ids(batch: dict[str, Any]) -> list[int]:
    return [int(i) for i in batch["id"].tolist()]


def new_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
    loss.backward()  # DDP all-reduces the gradients: every rank must take this step
    optimizer.step()


def params(model: torch.nn.Module) -> list[list[float]]:
    return [p.detach().flatten().tolist() for p in model.parameters()]


def tag_warnings(phase: str) -> None:
    """Print warnings as usual, on stderr, with ``[phase]`` in front (two phases share a job)."""

    def show(message: Any, category: Any, filename: str, lineno: int, *args: Any) -> None:
        text = warnings.formatwarning(message, category, filename, lineno)
        sys.stderr.write(f"[{phase}] {text}")  # one write: lines of the ranks do not mix
        sys.stderr.flush()

    warnings.showwarning = show


def dcp_entries(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: dp.Loader
) -> dict[str, Any]:
    """What the DCP checkpoint holds: plain model and optimizer state dicts, the Loader."""
    return {"model": model.state_dict(), "optim": optimizer.state_dict(), "data": loader}


def train(config: dict[str, Any], mode: str) -> dict[str, Any]:
    """DDP training over the Loader's batches, uninterrupted, stopped or resumed."""
    import torch.distributed.checkpoint as dcp

    tag_warnings(mode)
    epochs, rank = config["epochs"], dist.get_rank()
    ckpt = Path(config["ckpt"]) / f"ckpt-rank{rank}.pt"
    model, optimizer = new_model()
    loader = make_loader(config)
    consumed: dict[str, list[list[int]]] = {}
    result: dict[str, Any] = {}
    first_epoch = 0
    if mode == "resume":
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        first_epoch = loader.epoch
    elif mode == "dcp_resume":
        entries = dcp_entries(model, optimizer, loader)
        dcp.load(entries, checkpoint_id=config["dcp"])
        # DCP loads tensors in place, the rest into the dicts given; the Loader it hands
        # its part itself (Stateful), then replaces it in `entries` by that part.
        model.load_state_dict(entries["model"])
        optimizer.load_state_dict(entries["optim"])
        result["loaded_position"] = loader.state_dict()  # before anything ran
        first_epoch = loader.epoch
    for epoch in range(first_epoch, epochs):
        assert loader.epoch == epoch, (loader.epoch, epoch)
        steps = consumed[str(epoch)] = []
        stop_here = mode == "stop" and epoch == config["stop_epoch"]
        for batch in loader:
            train_step(model, optimizer, batch)
            steps.append(ids(batch))
            if stop_here and len(steps) == config["stop_step"]:
                break
        if stop_here:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            state = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "loader": loader.state_dict(),
            }
            torch.save(state, ckpt)
            if config.get("dcp"):  # the same position once more, as one DCP checkpoint
                dcp.save(dcp_entries(model, optimizer, loader), checkpoint_id=config["dcp"])
            break
    loader.close()
    result.update(
        loader_topology=[loader.rank, loader.world_size],
        epochs=consumed,
        params=params(model),
    )
    if mode == "full":
        # The same epochs without even_batches: no collective is involved, so the ranks'
        # different batch counts cannot hang anything.
        tag_warnings("uneven")
        uneven = make_loader(config, even_batches=False)
        result["uneven"] = {str(e): [ids(b) for b in uneven] for e in range(epochs)}
        uneven.close()
    return result


def read_mesh(config: dict[str, Any]) -> dict[str, Any]:
    """Mode mesh (4 ranks): data-parallel ranks from a 2 x 2 DeviceMesh."""
    from torch.distributed.device_mesh import init_device_mesh

    tag_warnings("mesh")
    dp_tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    hybrid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    result: dict[str, Any] = {}
    workers = config["workers"]
    layouts = {  # worker processes in the dp layout only: they cost seconds to start
        "dp": dict(mesh=dp_tp, mesh_dims="dp", num_workers=workers),
        "replicate,shard": dict(mesh=hybrid, mesh_dims=("replicate", "shard"), num_workers=0),
        "shard,replicate": dict(mesh=hybrid, mesh_dims=("shard", "replicate"), num_workers=0),
    }
    result["mesh_coordinates"] = {
        "dp": dp_tp.get_local_rank("dp"),
        "tp": dp_tp.get_local_rank("tp"),
        "replicate": hybrid.get_local_rank("replicate"),
        "shard": hybrid.get_local_rank("shard"),
    }
    for name, options in layouts.items():
        loader = make_loader(config, even_batches=False, **options)
        result[name] = {
            "topology": [loader.rank, loader.world_size],
            "epochs": {str(e): [ids(b) for b in loader] for e in range(config["epochs"])},
        }
        loader.close()
    # even_batches by default (torch.distributed runs 4 ranks): every rank takes part in
    # the agreement, tensor-parallel peers included, and all stop together.
    loader = make_loader(config, mesh=dp_tp, mesh_dims="dp")
    result["dp even"] = {
        "topology": [loader.rank, loader.world_size],
        "epochs": {"0": [ids(b) for b in loader]},
    }
    loader.close()
    return result


def run_rank(work: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """One rank of a job: read the config (argv[1]), join the gloo group, write
    ``rank<R>.json`` with the rank, the world size and what ``work(config)`` returns."""
    config = json.loads(Path(sys.argv[1]).read_text())
    warnings.simplefilter("always", dp.UnevenDataWarning)  # one line per rank and epoch
    dist.init_process_group("gloo", timeout=timedelta(seconds=config.get("collective_s", 60)))
    try:
        result = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), **work(config)}
        (Path(config["out"]) / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_mode(config: dict[str, Any]) -> dict[str, Any]:
    """What this job's ``mode`` runs (see the module doc)."""
    if config["mode"] == "mesh":
        return read_mesh(config)
    if config["mode"] == "full+stop":  # two Loaders and models, one after the other
        return {"full": train(config, "full"), "stop": train(config, "stop")}
    result = {"resume": train(config, "resume")}  # two resumes of the same stopped run
    if config.get("dcp"):
        result["dcp_resume"] = train(config, "dcp_resume")
    return result


def main() -> None:
    run_rank(run_mode)


if __name__ == "__main__":
    main()
