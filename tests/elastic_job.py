"""One rank of a real ``torch.distributed`` job that stops or resumes on another topology.

Started by ``torchrun`` from test_elastic_distributed.py: ``python -m torch.distributed.run
--standalone --nproc_per_node=N tests/elastic_job.py CONFIG.json``. The model, the training
step and the record format are distributed_job.py's (imported from there). The config
(JSON) holds what the phases share (``data``: a glob of JSONL files with records
``{"id", "x", "y"}``; ``seed``, ``batch``, ``buffer``: the stream shuffle's buffer,
``epochs``; ``out``: a folder for ``rank<R>.json``) and ``phases``, run one after the
other, each with a fresh DDP model and Loader (``workers`` DataLoader worker processes):

* ``stop``: train until step ``stop_step`` of epoch ``stop_epoch``, then save the position
  twice: per rank with ``dp.save_checkpoint`` (``ckpt``/``rank<R>.pt``: model, optimizer,
  Loader state) and as one ``torch.distributed.checkpoint`` (``dcp``) that every rank
  saves with the Loader itself as the ``"data"`` entry. At step 2 rank 0 alone takes a
  Loader state (as a log would): that must not hang the others.
* ``resume_files``: a new job of another world size or worker count. Every rank loads
  every old rank's file in ``ckpt``, merges their Loader states (``dp.merge_states``)
  and loads the result; the model and optimizer come from rank 0's file.
* ``resume_dcp``: the same from the DCP folder ``dcp``: ``load_dcp_states`` for the
  Loader (rank 0 reads it once more alone first: it runs no collective), ``dcp.load``
  for the model and optimizer.

A resume trains to the end of the last epoch. Then, without ``even_batches`` (no
collective, so uneven ranks cannot hang), it reads the same merged state once more, and
the epoch after it fresh, to show what even_batches dropped. Every rank writes the sample
ids it consumed, per epoch and step; warnings go to stderr tagged ``[phase name]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from distributed_job import (
    dcp_entries,
    ids,
    new_model,
    params,
    run_rank,
    tag_warnings,
    to_tensors,
    train_step,
)

import datapipes as dp
from datapipes.checkpoint.dcp import load_dcp_states


def recipe(config: dict[str, Any]) -> dp.DataPipe[Any]:
    # Whole files dealt to ranks, and a stream shuffle: at a checkpoint items wait in its
    # buffer and in a partial batch, read but not delivered.
    pipe = dp.files(config["data"]).shuffle().read_jsonl().shuffle(buffer_size=config["buffer"])
    return pipe.map(to_tensors).batch(config["batch"])


def make_loader(config: dict[str, Any], workers: int, **options: Any) -> dp.Loader:
    return dp.Loader(recipe(config), seed=config["seed"], num_workers=workers, **options)


def resume(phase: dict[str, Any], model: Any, optimizer: Any) -> dict[str, Any]:
    """The merged Loader state of the stopped job; loads its model and optimizer too."""
    if phase["mode"] == "resume_files":
        files = sorted(Path(phase["ckpt"]).glob("rank*.pt"))
        saved = [dp.load_checkpoint(path) for path in files]  # every old rank's file
        model.module.load_state_dict(saved[0]["model"])  # DDP kept the replicas identical
        optimizer.load_state_dict(saved[0]["optimizer"])
        return dp.merge_states([s["loader"] for s in saved])
    if dist.get_rank() == 0:  # alone: if reading ran a collective, this would hang
        load_dcp_states(phase["dcp"], key="data")
    state = load_dcp_states(phase["dcp"], key="data")
    # Not the Loader: dcp.load would give it only this rank's saved position.
    entries = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    dcp.load(entries, checkpoint_id=phase["dcp"])
    model.load_state_dict(entries["model"])
    optimizer.load_state_dict(entries["optim"])
    return state


def run_phase(config: dict[str, Any], phase: dict[str, Any]) -> dict[str, Any]:
    mode, workers, rank = phase["mode"], phase["workers"], dist.get_rank()
    tag_warnings(phase["name"])
    model, optimizer = new_model()
    loader = make_loader(config, workers)
    state = None if mode == "stop" else resume(phase, model, optimizer)
    if state is not None:
        loader.load_state_dict(state)
    first_epoch = loader.epoch
    result: dict[str, Any] = {"first_epoch": first_epoch}
    consumed: dict[str, list[list[int]]] = {}
    for epoch in range(first_epoch, config["epochs"]):
        steps = consumed[str(epoch)] = []
        stop_here = mode == "stop" and epoch == phase["stop_epoch"]
        for batch in loader:
            train_step(model, optimizer, batch)
            steps.append(ids(batch))
            if stop_here and len(steps) == 2 and rank == 0:
                result["rank_0_alone_took_a_state"] = loader.state_dict()["ranks"]["0"]["epoch"]
            if stop_here and len(steps) == phase["stop_step"]:
                break
        if stop_here:
            folder = Path(phase["ckpt"])
            folder.mkdir(parents=True, exist_ok=True)
            saved = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "loader": loader.state_dict(),
            }
            dp.save_checkpoint(saved, folder / f"rank{rank}.pt")
            dcp.save(dcp_entries(model, optimizer, loader), checkpoint_id=phase["dcp"])
            break
    loader.close()
    result.update(
        topology=[loader.rank, loader.world_size],
        even_batches=loader.even_batches,
        epochs=consumed,
        params=params(model),
    )
    if state is not None:
        result["uneven"] = read_uneven(config, workers, state, first_epoch)
    return result


def read_uneven(
    config: dict[str, Any], workers: int, state: dict[str, Any], epoch: int
) -> dict[str, Any]:
    """The resumed epoch and the next one without even_batches: nothing dropped."""
    tag_warnings("uneven")
    loader = make_loader(config, workers, even_batches=False)
    try:
        loader.load_state_dict(state)
    except dp.StateMismatchError as error:  # said in the result: the test names it
        return {"refused": f"{type(error).__name__}: {error}"}
    found = {str(epoch): [ids(b) for b in loader]}
    loader.close()
    if epoch + 1 < config["epochs"]:
        fresh = make_loader(config, workers, even_batches=False)
        fresh.set_epoch(epoch + 1)
        found[str(epoch + 1)] = [ids(b) for b in fresh]
        fresh.close()
    return found


def run_phases(config: dict[str, Any]) -> dict[str, Any]:
    """Every phase of the config, one after the other, by name."""
    return {phase["name"]: run_phase(config, phase) for phase in config["phases"]}


def main() -> None:
    run_rank(run_phases)


if __name__ == "__main__":
    main()
