"""Where this process sits in a distributed job: rank and world size."""

from __future__ import annotations

import os


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size from the arguments, else ``torch.distributed``, else the env.

    The environment variables are ``RANK`` and ``WORLD_SIZE`` (as ``torchrun``
    sets them). With none of these, the job has one rank.
    """
    if (rank is None) != (world_size is None):
        raise ValueError(
            "pass both rank and world_size, or neither (then they come from "
            "torch.distributed or the RANK/WORLD_SIZE environment variables)"
        )
    if rank is not None and world_size is not None:
        return _checked(rank, world_size, "the arguments")
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
    return 0, 1


def _checked(rank: int, world_size: int, origin: str) -> tuple[int, int]:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"invalid rank {rank} for world size {world_size} (from {origin})")
    return rank, world_size
