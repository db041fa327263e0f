"""Where this process sits in a distributed job: its data-parallel rank and world size."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Topology:
    """This process's data-parallel ``rank`` among ``world_size``, and where that came from.

    ``origin`` is ``"arguments"``, ``"device mesh"``, ``"torch.distributed"``,
    ``"RANK/WORLD_SIZE"`` or ``"single process"``.
    """

    rank: int
    world_size: int
    origin: str

    def check_against_torch_distributed(self) -> None:
        """Refuse to run as another rank than the process group's, when one was set up
        after the pipeline was (from the environment, or as one process).

        Set up before ``init_process_group`` as one process, every rank would read all
        the data; from environment variables that a launcher set partly or otherwise,
        ranks would read the same share or none. The process group is the truth.
        """
        if self.origin not in ("single process", "RANK/WORLD_SIZE"):
            return  # given explicitly (arguments, a device mesh) or by the group itself
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        group = (dist.get_rank(), dist.get_world_size())
        if group == (self.rank, self.world_size):
            return
        if self.origin == "single process":
            raise RuntimeError(
                f"this pipeline was set up as a single process, but torch.distributed now "
                f"runs {group[1]} ranks: every rank would read all the data. Create the Loader "
                "(or as_torch_dataset()) after init_process_group (in Lightning: in "
                "train_dataloader()), or pass rank= and world_size= explicitly."
            )
        raise RuntimeError(
            f"this pipeline was set up as rank {self.rank} of {self.world_size} (from "
            f"{self.origin}), but torch.distributed now runs this process as rank {group[0]} "
            f"of {group[1]}: ranks would read overlapping shares or miss some. Create the "
            "Loader (or as_torch_dataset()) after init_process_group (in Lightning: in "
            "train_dataloader()), or pass rank= and world_size= explicitly."
        )


def resolve_topology(
    rank: int | None = None,
    world_size: int | None = None,
    *,
    mesh: Any = None,
    mesh_dims: Sequence[str] | str | None = None,
) -> Topology:
    """Data-parallel rank and world size from, in order of precedence:

    1. ``rank`` and ``world_size`` (a data-parallel rank you computed yourself);
    2. ``mesh``, a ``torch.distributed.device_mesh.DeviceMesh``, with
       ``mesh_dims`` naming its data-parallel dimensions: ranks that differ only
       in the other (tensor-, pipeline-parallel) dimensions read the same data.
       With several dimensions (hybrid sharding: ``("replicate", "shard")``) the
       data-parallel size is their product;
    3. ``torch.distributed`` when it is initialized;
    4. the ``RANK`` and ``WORLD_SIZE`` environment variables (set by ``torchrun``): one
       without the other is refused, never guessed (``WORLD_SIZE=1`` alone is one
       process); a process group started later must agree (checked at ``iter``);
    5. one process.
    """
    if (rank is None) != (world_size is None):
        raise ValueError(
            "pass both rank and world_size, or neither (then they come from a device mesh, "
            "torch.distributed or the RANK/WORLD_SIZE environment variables)"
        )
    if rank is not None and world_size is not None:
        if mesh is not None:
            raise ValueError("pass either rank/world_size or mesh, not both")
        return _checked(rank, world_size, "arguments")
    if mesh is not None:
        return _from_mesh(mesh, mesh_dims)
    if mesh_dims is not None:
        raise ValueError("mesh_dims names dimensions of a DeviceMesh: pass mesh= as well")
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return _checked(dist.get_rank(), dist.get_world_size(), "torch.distributed")
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return _from_environment(os.environ.get("RANK"), os.environ.get("WORLD_SIZE"))
    return Topology(0, 1, "single process")


def _from_environment(rank: str | None, world_size: str | None) -> Topology:
    """``RANK`` and ``WORLD_SIZE`` as a launcher set them; one without the other is refused
    (never guessed: a rank taken as 0 on every process reads one share twice, and misses
    the others), except ``WORLD_SIZE=1`` alone."""
    try:
        world = None if world_size is None else int(world_size)
        own = None if rank is None else int(rank)
    except ValueError as error:
        raise ValueError(f"RANK/WORLD_SIZE must be integers: {error}") from None
    if own is None and world == 1:
        return _checked(0, 1, "RANK/WORLD_SIZE")
    if own is None or world is None:
        given, missing = ("WORLD_SIZE", "RANK") if own is None else ("RANK", "WORLD_SIZE")
        raise ValueError(
            f"the environment sets {given}={os.environ.get(given)} but not {missing}, so this "
            "process's data-parallel rank is unknown (some launchers, such as Lightning's DDP "
            "launcher, set WORLD_SIZE and LOCAL_RANK only, and RANK once the process group "
            "starts). Create the Loader after init_process_group (in Lightning: in "
            "train_dataloader()), or pass rank= and world_size= explicitly."
        )
    return _checked(own, world, "RANK/WORLD_SIZE")


def _from_mesh(mesh: Any, mesh_dims: Sequence[str] | str | None) -> Topology:
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if mesh_dims is None:
        raise ValueError(
            f"with mesh= pass mesh_dims= naming its data-parallel dimensions (this mesh has "
            f"{names or 'no names'}); e.g. mesh_dims=('dp',) or ('replicate', 'shard')"
        )
    dims = (mesh_dims,) if isinstance(mesh_dims, str) else tuple(mesh_dims)
    if not dims:
        raise ValueError("mesh_dims must name at least one data-parallel dimension")
    unknown = [d for d in dims if d not in names]
    if unknown:
        raise ValueError(f"mesh_dims {unknown} are not dimensions of this mesh {names}")
    rank, world_size = 0, 1
    for dim in dims:  # row-major over the data-parallel dimensions, in the order given
        size = mesh.size(names.index(dim))
        rank = rank * size + mesh.get_local_rank(dim)
        world_size *= size
    return _checked(rank, world_size, "device mesh")


def _checked(rank: int, world_size: int, origin: str) -> Topology:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"invalid rank {rank} for world size {world_size} (from {origin})")
    return Topology(int(rank), int(world_size), origin)
