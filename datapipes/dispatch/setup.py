"""A Loader's dynamic dispatch and leases, made from its arguments (or refused, saying why)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from datapipes.dispatch.dynamic import DynamicDispatch
from datapipes.dispatch.takeover import TakeoverHost, Takeovers
from nodes.dispatch import Dispatcher, DispatchSpec

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe
    from datapipes.topology import Topology


def make_dispatch(
    pipe: DataPipe[Any],
    topology: Topology,
    num_workers: int,
    seed: int,
    *,
    dispatch: str,
    store: Any,
    unit_items: int,
    lease_seconds: float | None,
    even_batches: bool | None,
    host: Callable[[DynamicDispatch], TakeoverHost],
) -> tuple[DynamicDispatch | None, Takeovers | None]:
    """``(dynamic dispatch or None, takeovers or None)`` of a Loader's arguments.

    ``host(dynamic)`` gives what the takeovers need of the Loader. Leases on one
    rank make no takeovers: there is nobody to take over.
    """
    if dispatch != "dynamic":
        if store is not None or lease_seconds is not None:
            which = "store=" if store is not None else "dispatch_lease_seconds="
            raise ValueError(f"{which} is for dispatch='dynamic'; static dealing has no claims")
        return None, None
    dynamic = DynamicDispatch(pipe, topology, num_workers, seed, store=store, unit_items=unit_items)
    if lease_seconds is None:
        return dynamic, None
    check_lease_seconds(lease_seconds, even_batches)
    if topology.world_size == 1:
        return dynamic, None
    dynamic.sealable_claims = True
    return dynamic, Takeovers(host(dynamic), float(lease_seconds))


def placeholder_dispatcher(rank: int) -> Dispatcher:
    """The dispatcher of a Loader's own consumer (no workers) until its first epoch's spec."""
    return Dispatcher(DispatchSpec(None, "", -1, 1, 1), rank)


def check_lease_seconds(seconds: Any, even_batches: bool | None) -> None:
    """Refuse a ``dispatch_lease_seconds`` the Loader cannot run with, saying why."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(f"dispatch_lease_seconds must be a number > 0, got {seconds!r}")
    if even_batches:
        raise ValueError(
            "dispatch_lease_seconds is for ranks that run no collectives (inference, "
            "evaluation, data processing): in a DDP job a stalled rank stalls every rank "
            "in its all_reduce, and a dead one ends the job, so the last checkpoint is what "
            "resumes it (even_batches is on by default under torch.distributed). Pass "
            "even_batches=False, or leave dispatch_lease_seconds unset"
        )
