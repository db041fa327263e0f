"""The Loader's options: every argument checked in one place, into one frozen record."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from datapipes.loader.progress import progress_bar_class
from datapipes.pipe import DataPipe
from datapipes.resume import JobSetup
from datapipes.topology import Topology, resolve_topology
from nodes.workers.bundles import AUTO, bundled, check_items_per_transfer

DISPATCH_MODES = ("static", "dynamic")
#: Positions per unit of a random-access source (files: one file or file part per unit).
DEFAULT_UNIT_ITEMS = 1024
_DATALOADER_OPTIONS = frozenset(
    {
        "prefetch_factor",
        "timeout",
        "multiprocessing_context",
        "worker_init_fn",
        "snapshot_every_n_steps",
        "persistent_workers",
    }
)


@dataclass(frozen=True)
class DispatchOptions:
    """How a Loader with ``dispatch="dynamic"`` hands out units (see :mod:`datapipes.dispatch`).

    ``store``: the ``torch.distributed.Store`` every rank reaches (``None``: the
    process group's, or a private one on one rank); ``unit_items``: positions
    per unit; ``lease_seconds``: a rank silent that long is taken over.
    """

    store: Any
    unit_items: int
    lease_seconds: float | None

    @property
    def takes_over(self) -> bool:
        """Whether ranks hold leases (and so may take over a stalled rank's units)."""
        return self.lease_seconds is not None


@dataclass(frozen=True)
class LoaderOptions:
    """A Loader's options, checked together (:meth:`check`): the one record its parts read.

    >>> import datapipes as dp
    >>> options = LoaderOptions.check(dp.range(4), seed=3, num_workers=2)
    >>> options.seed, options.num_workers, options.items_per_transfer, options.dispatch
    (3, 2, 'auto', None)
    >>> LoaderOptions.check(dp.range(4), num_workers=-1)
    Traceback (most recent call last):
    ...
    ValueError: num_workers must be an int >= 0, got -1
    """

    seed: int
    topology: Topology
    num_workers: int
    #: The argument as given: ``None`` decides by the topology (see :mod:`~.even_batches`).
    even_batches: bool | None
    pin_memory: bool
    device: Any
    stats: bool
    progress: bool
    items_per_transfer: int | str
    dataloader_options: Mapping[str, Any]
    #: ``None``: static dealing.
    dispatch: DispatchOptions | None

    @classmethod
    def check(
        cls,
        pipe: Any,
        seed: int = 0,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        mesh: Any = None,
        mesh_dims: Sequence[str] | str | None = None,
        num_workers: int = 0,
        even_batches: bool | None = None,
        pin_memory: bool = False,
        device: Any = None,
        stats: bool = False,
        progress: bool = False,
        dispatch: str = "static",
        store: Any = None,
        dispatch_unit_items: int = DEFAULT_UNIT_ITEMS,
        dispatch_lease_seconds: float | None = None,
        items_per_transfer: int | str = AUTO,
        dataloader_options: Mapping[str, Any] | None = None,
    ) -> LoaderOptions:
        """The options of ``Loader(pipe, seed, ...)``, or the error saying what to pass instead."""
        options = dict(dataloader_options or {})
        _check_recipe_and_workers(pipe, num_workers, options)
        if items_per_transfer == AUTO and dispatch_lease_seconds is not None:
            items_per_transfer = 1  # leases count a rank's items in transfers (see below)
        per_transfer = check_items_per_transfer(items_per_transfer, num_workers)
        if bundled(per_transfer) and dispatch_lease_seconds is not None:
            raise ValueError(
                "dispatch_lease_seconds counts a taken-over rank's delivered items in "
                "DataLoader transfers, which items_per_transfer > 1 groups: use one or the other"
            )
        dynamic = _check_dispatch(
            dispatch, options, store, dispatch_unit_items, dispatch_lease_seconds, even_batches
        )
        topology = resolve_topology(rank, world_size, mesh=mesh, mesh_dims=mesh_dims)
        topology.check_against_torch_distributed()
        if progress:
            progress_bar_class()  # a missing tqdm is an error now, not at the first epoch
        return cls(
            seed=int(seed),
            topology=topology,
            num_workers=num_workers,
            even_batches=even_batches,
            pin_memory=bool(pin_memory),
            device=device,
            stats=bool(stats),
            progress=bool(progress),
            items_per_transfer=per_transfer,
            dataloader_options=MappingProxyType(options),
            dispatch=dynamic,
        )

    def recipe(self, pipe: DataPipe[Any]) -> DataPipe[Any]:
        """``pipe`` with the ``pin_memory``/``device`` steps these options append."""
        if self.pin_memory:
            pipe = pipe.pin_memory()
        if self.device is not None:
            pipe = pipe.to_device(self.device)
        return pipe

    @property
    def takeovers(self) -> bool:
        """Whether ranks take over a stalled rank's units: leases on more than one rank."""
        return (
            self.dispatch is not None and self.dispatch.takes_over and self.topology.world_size > 1
        )

    def setup(self, even_batches: bool) -> JobSetup:
        """The job setup a checkpoint records, with ``even_batches`` as decided."""
        return JobSetup(
            self.topology.world_size,
            self.num_workers,
            self.seed,
            even_batches,
            self.items_per_transfer,
        )


def _check_recipe_and_workers(pipe: Any, num_workers: Any, options: dict[str, Any]) -> None:
    if not isinstance(pipe, DataPipe):
        raise TypeError(
            f"Loader takes a DataPipe recipe, got {type(pipe).__name__}; build one with "
            "dp.from_sequence(...), dp.range(...) or dp.from_iterable(...)"
        )
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
    unknown = set(options) - _DATALOADER_OPTIONS
    if unknown:
        raise TypeError(
            f"Loader got unexpected arguments {sorted(unknown)}; DataLoader options it "
            f"passes on are {sorted(_DATALOADER_OPTIONS)}"
        )
    if options and num_workers == 0:
        raise ValueError(f"{sorted(options)} configure worker processes: set num_workers > 0")
    prefetch_factor = options.get("prefetch_factor", 2)
    if not isinstance(prefetch_factor, int) or prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be an int >= 1, got {prefetch_factor!r}")


def _check_dispatch(
    dispatch: Any,
    options: dict[str, Any],
    store: Any,
    unit_items: Any,
    lease_seconds: Any,
    even_batches: bool | None,
) -> DispatchOptions | None:
    if dispatch not in DISPATCH_MODES:
        raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
    if dispatch != "dynamic":
        if store is not None or lease_seconds is not None:
            which = "store=" if store is not None else "dispatch_lease_seconds="
            raise ValueError(f"{which} is for dispatch='dynamic'; static dealing has no claims")
        return None
    if options.get("persistent_workers"):
        raise ValueError(
            "dispatch='dynamic' starts each epoch's workers with that epoch's units; "
            "persistent_workers=True would keep the first epoch's: leave it off"
        )
    if isinstance(unit_items, bool) or not isinstance(unit_items, int) or unit_items < 1:
        raise ValueError(f"dispatch_unit_items must be an int >= 1, got {unit_items!r}")
    if lease_seconds is not None:
        check_lease_seconds(lease_seconds, even_batches)
        lease_seconds = float(lease_seconds)
    return DispatchOptions(store, unit_items, lease_seconds)


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


class InexactResumeWarning(UserWarning):
    """A step of the recipe cannot resume exactly (said when the Loader is made, with the fix)."""
