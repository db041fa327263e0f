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
        """Refuse to run as one rank of one when ``torch.distributed`` says there are more.

        That happens when the pipeline was set up before ``init_process_group``:
        every rank would then read all the data, silently duplicating it.
        """
        if self.origin != "single process":
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise RuntimeError(
                f"this pipeline was set up as a single process, but torch.distributed now "
                f"runs {dist.get_world_size()} ranks: every rank would read all the data. "
                "Create the Loader (or as_torch_dataset()) after init_process_group, or pass "
                "rank= and world_size= explicitly."
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
    4. the ``RANK`` and ``WORLD_SIZE`` environment variables (set by ``torchrun``);
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
        try:
            env_rank = int(os.environ.get("RANK", "0"))
            env_world = int(os.environ.get("WORLD_SIZE", "1"))
        except ValueError as error:
            raise ValueError(f"RANK/WORLD_SIZE must be integers: {error}") from None
        return _checked(env_rank, env_world, "RANK/WORLD_SIZE")
    return Topology(0, 1, "single process")


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
