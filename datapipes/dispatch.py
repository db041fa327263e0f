"""A Loader's dynamic dispatch: its store, its run's keys, each epoch's units, checkpoints.

``dp.Loader(pipe, dispatch="dynamic")`` hands an epoch's units (see
:mod:`nodes.dispatch`) to whichever consumer needs more work. This module is
the Loader's side of it:

- :class:`DynamicDispatch` resolves the store (the one passed, else the
  default process group's, else a ``FileStore`` of its own for a one-rank
  job), names the run's keys, works out each epoch's work (the whole epoch,
  or what a resumed checkpoint left), and writes the checkpoint's record:
  the units each of this rank's consumers claimed, as the store recorded
  them (DataLoader workers' claims since their last snapshot included).
- :class:`ReplayDispatch` reads those records back when a checkpoint is
  resumed (:func:`datapipes.elastic.remaining_work`): each old consumer's
  graph replays its own claims, and the units nobody reached are added to
  the remaining work.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from datapipes.placement import split_main_steps
from nodes import Context
from nodes import elastic as el
from nodes.dispatch import Dispatcher, DispatchSpec
from nodes.dispatch.dispatcher import recorded_claims
from nodes.dispatch.store import StoreAddress, StoreClient
from nodes.errors import InvalidStateError, StateMismatchError

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe
    from datapipes.topology import Topology

DISPATCH_MODES = ("static", "dynamic")
#: Positions per unit of a random-access source (files: one file or file part per unit).
DEFAULT_UNIT_ITEMS = 1024
#: Seconds a store operation may take before the store counts as gone.
DEFAULT_STORE_TIMEOUT = 60.0


def check_dispatch(dispatch: Any, options: dict[str, Any]) -> None:
    """Refuse a ``dispatch`` argument, or options it cannot run with, saying what works."""
    if dispatch not in DISPATCH_MODES:
        raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
    if dispatch == "dynamic" and options.get("persistent_workers"):
        raise ValueError(
            "dispatch='dynamic' starts each epoch's workers with that epoch's units; "
            "persistent_workers=True would keep the first epoch's: leave it off"
        )


def epoch_work(pipe: DataPipe[Any], ctx: Context) -> el.Work:
    """The whole work of ``ctx``'s epoch per source place, as one consumer would read it.

    Also refuses (:class:`datapipes.ElasticResumeError`) a recipe with a step
    that dynamic dispatch cannot hand out exactly: the steps an elastic resume
    refuses, and ``shard()`` streams (every consumer reads them whole).
    """
    root = pipe.build(ctx)
    try:
        el.check_graph(root)
        work: el.Work = {}
        for node in el.sources_and_nodes(root):
            if node.elastic != "source":
                continue
            if node.elastic_kind == el.STREAM:
                raise el.refuse(
                    node,
                    "is read whole by every consumer and split afterwards (shard()): there "
                    "is nothing to hand out on demand; use dispatch='static' for it, or a "
                    "source that deals itself (dp.from_sequence, dp.files)",
                )
            el.add_work(work, node.place, node.elastic_kind, node.untouched())
        return work
    finally:
        root.close()


class DynamicDispatch:
    """A Loader's dynamic dispatch (see the module doc)."""

    def __init__(
        self,
        pipe: DataPipe[Any],
        topology: Topology,
        num_workers: int,
        seed: int,
        *,
        store: Any = None,
        unit_items: int = DEFAULT_UNIT_ITEMS,
    ) -> None:
        if not isinstance(unit_items, int) or unit_items < 1:
            raise ValueError(f"dispatch_unit_items must be an int >= 1, got {unit_items!r}")
        self._pipe = split_main_steps(pipe)[0] if num_workers else pipe
        self._seed = seed
        self._world_size = topology.world_size
        self.consumers = topology.world_size * max(num_workers, 1)
        self.unit_items = unit_items
        epoch_work(self._pipe, Context(seed=seed))  # refusals now, not at the first epoch
        self._own_store = None
        self.client = self._client(store, topology, num_workers)
        # Each rank counts the dynamic Loaders of this world size it made: ranks that make
        # their Loaders in the same order (the usual SPMD program) agree on the run's number
        # without talking, however fast each rank gets there, and Loaders of another world
        # size (a rank-0-only one, a job simulated in one process) do not shift it. Counted
        # in the store, so a job restarted on a store that outlived it gets new keys.
        jobs = f"datapipes/dispatch/{topology.world_size}x"
        made = self.client.add(f"{jobs}/loaders/{topology.rank}", 1)
        self.run = f"{jobs}/{made - 1}"
        # The ranks of one run must hand out the same units: the same recipe, seed, unit
        # size and consumers. The first rank there writes them; the others must match, or
        # (with keys of their own) every item would be read once per recipe, silently.
        mine = (
            f"{pipe.fingerprint()} seed={seed} unit_items={unit_items} consumers={self.consumers}"
        )
        theirs = self.client.compare_set(f"{self.run}/recipe", "", mine).decode()
        if theirs != mine:
            raise StateMismatchError(
                f"dispatch='dynamic': Loader {made} of rank {topology.rank} has recipe {mine}, "
                f"but another rank's Loader {made} of this job has {theirs}. The ranks pair "
                "their Loaders by the order they make them, and must make the same ones (the "
                "same recipe, seed and dispatch_unit_items) in the same order."
            )
        #: Claims go through fenced claim lists (leases, see datapipes.takeover).
        self.fenced = False
        self._attempts: dict[int, int] = {}
        self._base: tuple[int, el.Work] | None = None
        self.spec: DispatchSpec | None = None

    def _client(self, store: Any, topology: Topology, num_workers: int) -> StoreClient:
        """The store's client, bounded by the store's own timeout (the process group's, or
        the one the store passed was made with; a store of our own: 60 s), never changed:
        under torch.distributed it is the process group's too."""
        if store is None and dist.is_available() and dist.is_initialized():
            from nodes.torch_adapter import default_store

            store = default_store()
        if store is None:
            if topology.world_size > 1:
                raise ValueError(
                    f"dispatch='dynamic' on {topology.world_size} ranks needs a store every "
                    "rank reaches: initialize torch.distributed (its store is used), or pass "
                    "store=torch.distributed.TCPStore(host, port, ...) (rank 0 hosting it)"
                )
            store = self._own_store = private_file_store()
        timeout = store.timeout.total_seconds() if hasattr(store, "timeout") else None
        client = StoreClient(store, timeout or DEFAULT_STORE_TIMEOUT)
        if client.address is None and num_workers:
            raise ValueError(
                f"dispatch='dynamic' with DataLoader workers needs a store they can reach: "
                f"a TCPStore or FileStore, not a {type(store).__name__}"
            )
        return client

    # ----- epochs ----------------------------------------------------------------------------
    def set_base(self, epoch: int, work: el.Work | None) -> None:
        """A resumed epoch hands out ``work`` (what its checkpoint left), not the whole epoch."""
        self._base = None if work is None else (epoch, work)

    def begin_epoch(self, epoch: int, listings: Any, *, continuing: bool) -> DispatchSpec:
        """This epoch's spec: the running one when ``continuing`` it (after ``close()``),
        else a new attempt at ``epoch`` with its own keys in the store."""
        if continuing and self.spec is not None and self.spec.epoch == epoch:
            return self.spec
        attempt = self._attempts[epoch] = self._attempts.get(epoch, 0) + 1
        base = self._base
        if base is not None and base[0] == epoch:
            work = base[1]
        else:
            ctx = Context(epoch=epoch, seed=self._seed)
            ctx.listings = listings
            work = epoch_work(self._pipe, ctx)
        self.spec = DispatchSpec(
            self.client,
            f"{self.run}/{epoch}/{attempt}",
            epoch,
            self.consumers,
            self.unit_items,
            work,
            fenced_per_rank=self.consumers // self._world_size if self.fenced else 0,
        )
        return self.spec

    # ----- checkpoints -------------------------------------------------------------------------
    def record(self, epoch: int, consumers: Iterable[int]) -> dict[str, Any] | None:
        """The checkpoint's record of ``epoch`` (or of the one before, which a rank at the
        start of the next still tells): every unit each of ``consumers`` claimed."""
        spec, base = self.spec, self._base
        if base is not None and base[0] == epoch and (spec is None or spec.epoch != epoch):
            # Resumed, not iterated yet: the checkpoint's remaining work, none of it claimed
            # (without this record the state would read as the epoch's start).
            return {
                "epoch": epoch,
                "key": f"{self.run}/{epoch}/0",
                "consumers": self.consumers,
                "unit_items": self.unit_items,
                "work": base[1],
                "claims": {str(c): {place: [] for place in base[1]} for c in consumers},
            }
        if spec is None or spec.epoch not in (epoch, epoch - 1):
            return None
        resumed = base is not None and base[0] == spec.epoch
        return {
            "epoch": spec.epoch,
            "key": spec.key,
            "consumers": spec.consumers,
            "unit_items": spec.unit_items,
            "work": spec.work if resumed else None,
            "claims": {
                str(c): {
                    place: recorded_claims(self.client, spec.key, place, c) for place in spec.work
                }
                for c in consumers
            },
        }


def private_file_store() -> Any:
    """A one-rank job's own store (and, in tests, in-process ranks'): a ``FileStore`` in a
    temporary folder, removed with it.

    DataLoader workers reach it by its path. Not a ``TCPStore`` hosted here: its
    server thread resolves the name of each client that connects, and a worker forked at
    that moment inherits glibc's lookup lock held, and hangs connecting (1 fork in ~200).
    A file store has no thread, and a claim costs about 7 us instead of 16.
    """
    folder = tempfile.mkdtemp(prefix="datapipes-dispatch-")
    store = dist.FileStore(os.path.join(folder, "store"), -1)
    store.set_timeout(timedelta(seconds=DEFAULT_STORE_TIMEOUT))
    weakref.finalize(store, shutil.rmtree, folder, True)
    return store


class ReplayDispatch:
    """The claims of a dynamic epoch's checkpoint, handed out again to its old consumers.

    ``records``: every rank's record of the epoch (``None`` for a rank that has
    none). Each consumer's graph gets a :class:`nodes.dispatch.Dispatcher` that
    replays its recorded claims; afterwards :meth:`unreached` is the work of
    the units no consumer reached. Records that disagree, name units or places
    the epoch does not have, or hand one unit to two consumers are refused
    (:class:`InvalidStateError` naming the field): a replay of them would
    deliver items twice or never.
    """

    def __init__(self, records: list[dict[str, Any]], whole_epoch: el.Work) -> None:
        first = records[0]
        setup = ("key", "consumers", "unit_items", "work")
        for record in records[1:]:
            for name in setup:
                if record[name] != first[name]:
                    raise InvalidStateError(
                        f"ranks[...].dispatch.{name}",
                        "the same value in every rank's record of the epoch",
                        record[name],
                    )
        self.spec = DispatchSpec(
            None,
            first["key"],
            first["epoch"],
            first["consumers"],
            first["unit_items"],
            first["work"] if first["work"] is not None else whole_epoch,
        )
        self._recorded: dict[int, dict[str, list[int]]] = {}
        for record in records:
            for consumer, claims in record["claims"].items():
                if int(consumer) in self._recorded:
                    raise InvalidStateError(
                        f"ranks[...].dispatch.claims[{consumer!r}]",
                        "each consumer's claims in one rank's record",
                        "a second record",
                    )
                self._recorded[int(consumer)] = claims
        self._check_claims()
        self._dispatchers: dict[int, Dispatcher] = {}
        self._finished: set[int] = set()
        #: Whether any unit was claimed, or the epoch was a resumed one's rest (then its
        #: remaining work is not simply a fresh epoch's).
        self.started = first["work"] is not None or any(
            units for claims in self._recorded.values() for units in claims.values()
        )

    def _check_claims(self) -> None:
        """Every claim names a unit of the epoch's work, and no unit is claimed twice."""
        owner: dict[tuple[str, int], int] = {}
        for consumer, claims in sorted(self._recorded.items()):
            for place, units in claims.items():
                where = f"ranks[...].dispatch.claims[{str(consumer)!r}][{place!r}]"
                if place not in self.spec.work:
                    raise InvalidStateError(where, "a source of the epoch's work", place)
                try:
                    count = len(self.spec.units(place))
                except (KeyError, TypeError, ValueError, IndexError) as error:
                    raise InvalidStateError(
                        "ranks[...].dispatch.work", "the epoch's work by source", "?",
                        note=f"cutting it into units failed: {type(error).__name__}: {error}",
                    ) from error  # fmt: skip
                if len(set(units)) != len(units):
                    raise InvalidStateError(where, "units claimed once in the epoch", units)
                for unit in units:
                    if not 0 <= unit < count:
                        raise InvalidStateError(where, f"units in [0, {count})", unit)
                    if owner.setdefault((place, unit), consumer) != consumer:
                        raise InvalidStateError(where, "units claimed once in the epoch", unit)

    def for_consumer(self, consumer: int) -> Dispatcher:
        dispatcher = Dispatcher(self.spec, consumer, recorded=self._recorded.get(consumer, {}))
        self._dispatchers[consumer] = dispatcher
        return dispatcher

    def finished(self, consumer: int) -> None:
        """``consumer`` delivered everything it claimed (its share had ended)."""
        self._finished.add(consumer)

    def unreached(self, *, claimed_only: bool = False) -> el.Work:
        """The units no consumer reached: the epoch's work that was never handed out.

        ``claimed_only``: only units the recorded consumers had claimed (the work of a
        rank taken over while the others still hand out the rest, see
        :mod:`datapipes.takeover`).
        """
        claimed: dict[str, set[int]] = {}
        for claims in self._recorded.values():
            for place, units in claims.items():
                claimed.setdefault(place, set()).update(units)
        work: el.Work = {}
        for place, left in self.unreached_units().items():
            if claimed_only:
                left = [index for index in left if index in claimed.get(place, ())]
            units = self.spec.units(place)
            pieces = [piece for index in left for piece in units[index]]
            el.add_work(work, place, self.spec.work[place]["kind"], pieces)
        return work

    def unreached_units(self) -> dict[str, list[int]]:
        """The indices of the units no consumer reached, per source place (after the replay)."""
        reached: dict[str, set[int]] = {}
        for consumer, claims in self._recorded.items():
            if consumer in self._finished or consumer not in self._dispatchers:
                for place, units in claims.items():
                    reached.setdefault(place, set()).update(units)
        for consumer, dispatcher in self._dispatchers.items():
            if consumer in self._finished:
                continue
            for place, units in self._recorded.get(consumer, {}).items():
                if place in dispatcher.live:  # what its state had reached
                    reached.setdefault(place, set()).update(dispatcher.reached.get(place, []))
                else:  # an input its graph had finished (a concat's earlier one): read whole
                    reached.setdefault(place, set()).update(units)
        left: dict[str, list[int]] = {}
        for place in self.spec.work:
            done = reached.get(place, set())
            left[place] = [i for i in range(len(self.spec.units(place))) if i not in done]
        return left


__all__ = [
    "DEFAULT_UNIT_ITEMS",
    "DISPATCH_MODES",
    "DynamicDispatch",
    "ReplayDispatch",
    "StoreAddress",
    "check_dispatch",
    "epoch_work",
]
