"""A Loader state as typed, frozen records: the job's setup, each rank's entry, what is owed.

Every record is built in this package (:mod:`datapipes.resume.parse` from a
saved state, :mod:`datapipes.resume.records` for a new one) and checked there;
the rest of the library reads these attributes, never the raw dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodes import Context
from nodes.consumer_work import ConsumerWork

Counts = Mapping[str, int]


@dataclass(frozen=True)
class JobSetup:
    """What every rank of a job shares: its size, workers, seed and policies.

    >>> setup = JobSetup(world_size=2, num_workers=3, seed=0)
    >>> setup.num_consumers, list(setup.consumers_of(1))
    (6, [3, 4, 5])
    >>> JobSetup(world_size=2, num_workers=0, seed=0).consumers_per_rank
    1
    """

    world_size: int
    num_workers: int
    seed: int
    even_batches: bool = False
    #: Items a DataLoader worker sends per transfer (only with workers): ``K`` or ``"auto"``.
    items_per_transfer: int | str = 1

    @property
    def consumers_per_rank(self) -> int:
        """A rank's consumers: its DataLoader workers, or the rank itself without any."""
        return max(self.num_workers, 1)

    @property
    def num_consumers(self) -> int:
        return self.world_size * self.consumers_per_rank

    def consumers_of(self, rank: int) -> range:
        """The consumer indices of ``rank`` (rank-major, as :class:`nodes.Context` counts)."""
        per_rank = self.consumers_per_rank
        return range(rank * per_rank, (rank + 1) * per_rank)

    def same_topology(self, other: JobSetup) -> bool:
        """Whether ``other`` splits the data the same way (so positions carry over as saved)."""
        return (self.world_size, self.num_workers, self.items_per_transfer) == (
            other.world_size,
            other.num_workers,
            other.items_per_transfer,
        )

    def loader_arguments(self) -> dict[str, Any]:
        """The ``dp.Loader`` arguments of this setup (but the rank).

        >>> JobSetup(2, 1, 3).loader_arguments()
        {'seed': 3, 'world_size': 2, 'num_workers': 1, 'even_batches': False}
        """
        arguments: dict[str, Any] = {
            "seed": self.seed,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "even_batches": self.even_batches,
        }
        if self.items_per_transfer != 1:
            arguments["items_per_transfer"] = self.items_per_transfer
        return arguments

    def topology(self) -> dict[str, Any]:
        """The ``"topology"`` a state records (``items_per_transfer`` only when not 1).

        >>> JobSetup(2, 4, 0, True).topology()
        {'world_size': 2, 'num_workers': 4, 'even_batches': True}
        """
        record: dict[str, Any] = {
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "even_batches": self.even_batches,
        }
        if self.items_per_transfer != 1:
            record["items_per_transfer"] = self.items_per_transfer
        return record

    def context(
        self,
        rank: int,
        worker: int = 0,
        epoch: int = 0,
        *,
        listings: Any = None,
        work: ConsumerWork | None = None,
        stats: bool = False,
    ) -> Context:
        """The context of consumer (``rank``, ``worker``): the one place one is built."""
        return Context(
            rank=rank,
            world_size=self.world_size,
            worker_id=worker,
            num_workers=self.consumers_per_rank,
            epoch=epoch,
            seed=self.seed,
            stats=stats,
            listings=listings,
            work=work,
        )


@dataclass(frozen=True)
class Plans:
    """A rank's consumers' shares of ``epoch`` after a resume on another topology."""

    epoch: int
    #: One plan per consumer of the rank: ``{source place: [pieces]}``.
    consumers: tuple[dict[str, list[Any]], ...]


@dataclass(frozen=True)
class Drops:
    """Items a rank dropped (``batch(drop_last=True)``, ``even_batches``) in ``epoch``."""

    epoch: int
    counts: Counts
    #: The part of ``counts`` made before a resume on another topology.
    carried: Counts = field(default_factory=dict)

    def of(self, epoch: int, carried: bool = False) -> dict[str, int]:
        """The counts (or the carried ones) if they are of ``epoch``, else none."""
        if self.epoch != epoch:
            return {}
        return dict(self.carried if carried else self.counts)


@dataclass(frozen=True)
class DispatchRecord:
    """The units each of a rank's consumers claimed in a dynamically dispatched epoch."""

    epoch: int
    #: The epoch's namespace in the store (run, epoch, attempt).
    key: str
    consumers: int
    unit_items: int
    #: The work handed out: ``None`` for the epoch's whole work (worked out again).
    work: Any
    #: ``{consumer index: {source place: [unit indices]}}``, in claim order.
    claims: Mapping[int, Mapping[str, list[int]]]


@dataclass(frozen=True)
class RankEntry:
    """One rank's position: its epoch, its graph's node state (``None``: the epoch's start),
    and what a resume on this or another topology needs besides."""

    rank: int
    epoch: int
    node: dict[str, Any] | None = None
    #: The JSON text of the shape of the rank's graph (for ``inspect``), if recorded.
    graph: str | None = None
    plans: Plans | None = None
    dispatch: DispatchRecord | None = None
    dropped: Drops | None = None

    def plans_of(self, epoch: int) -> list[dict[str, list[Any]]] | None:
        """The consumers' plans held for ``epoch``, or ``None``."""
        if self.plans is None or self.plans.epoch != epoch:
            return None
        return list(self.plans.consumers)

    def drops_of(self, epoch: int, carried: bool = False) -> dict[str, int]:
        return {} if self.dropped is None else self.dropped.of(epoch, carried)

    @property
    def is_idle(self) -> bool:
        """At an epoch's start with nothing else to say (kept as a range in merged states)."""
        return (
            self.node is None
            and self.graph is None
            and self.plans is None
            and self.dispatch is None
            and self.dropped is None
        )


@dataclass(frozen=True)
class Remaining:
    """What a merged job state still owes of its interrupted epoch (worked out once)."""

    epoch: int
    #: The remaining work per source place (see :mod:`nodes.elastic`); ``None``: the whole.
    work: Any
    #: What the saved job's ended DataLoader workers had dropped.
    dropped: Counts


@dataclass(frozen=True)
class JobState:
    """A parsed, checked Loader state: one job's setup, the ranks it holds, what it owes."""

    fingerprint: str
    steps: tuple[str, ...]
    setup: JobSetup
    #: The ranks' entries, by rank (idle ranges written out).
    ranks: Mapping[int, RankEntry]
    remaining: Remaining | None = None

    @property
    def covers_job(self) -> bool:
        """Whether it holds every rank of the job that saved it."""
        return len(self.ranks) == self.setup.world_size

    @property
    def was_dispatched(self) -> bool:
        """Whether its epoch was handed out by dynamic dispatch on some rank."""
        return any(entry.dispatch is not None for entry in self.ranks.values())

    def only(self, rank: int) -> JobState:
        """The same state holding ``rank``'s entry only (what that rank saved)."""
        return JobState(self.fingerprint, self.steps, self.setup, {rank: self.ranks[rank]})
