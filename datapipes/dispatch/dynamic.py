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
- :class:`datapipes.resume.claims.ReplayDispatch` reads those records back
  when a checkpoint is resumed.
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

from datapipes.loader.listings import check_same_listings
from datapipes.resume.claims import epoch_work
from datapipes.resume.records import dispatch_record
from nodes import Context
from nodes import elastic as el
from nodes.dispatch import Dispatcher, DispatchSpec
from nodes.dispatch.dispatcher import epoch_keys, recorded_claims
from nodes.dispatch.lease import changes_key, lease_key, state_key, takeover_key
from nodes.dispatch.store import StoreAddress, StoreClient
from nodes.errors import StateMismatchError

if TYPE_CHECKING:
    from datapipes.loader.options import LoaderOptions
    from datapipes.placement import RecipePlan
    from datapipes.topology import Topology

#: Seconds a store operation may take before the store counts as gone.
DEFAULT_STORE_TIMEOUT = 60.0


class DynamicDispatch:
    """A Loader's dynamic dispatch (see the module doc)."""

    def __init__(self, recipe: RecipePlan, options: LoaderOptions) -> None:
        assert options.dispatch is not None, "a Loader with dispatch='dynamic' only"
        topology, num_workers, seed = options.topology, options.num_workers, options.seed
        store, unit_items = options.dispatch.store, options.dispatch.unit_items
        self._pipe = recipe.consumer_part(num_workers)
        self._seed = seed
        self._rank, self._world_size = topology.rank, topology.world_size
        self._listings_checked = False
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
            f"{recipe.fingerprint} seed={seed} unit_items={unit_items} consumers={self.consumers}"
        )
        theirs = self.client.compare_set(f"{self.run}/recipe", "", mine).decode()
        if theirs != mine:
            raise StateMismatchError(
                f"dispatch='dynamic': Loader {made} of rank {topology.rank} has recipe {mine}, "
                f"but another rank's Loader {made} of this job has {theirs}. The ranks pair "
                "their Loaders by the order they make them, and must make the same ones (the "
                "same recipe, seed and dispatch_unit_items) in the same order."
            )
        #: Claims go through claim lists a taker can seal (leases, see datapipes.dispatch.takeover).
        self.sealable_claims = options.takeovers
        self._attempts: dict[int, int] = {}
        #: The source places of each epoch run here, until its keys are removed.
        self._places: dict[int, list[str]] = {}
        self._base: tuple[int, el.Work] | None = None
        self.spec: DispatchSpec | None = None

    def _client(self, store: Any, topology: Topology, num_workers: int) -> StoreClient:
        """The store's client, bounded by the store's own timeout (the process group's, or
        the one the store passed was made with; a store of our own: 60 s), never changed:
        under torch.distributed it is the process group's too."""
        if store is None and dist.is_available() and dist.is_initialized():
            from nodes.adapters.torch import default_store

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
        if not self._listings_checked and listings is not None and len(listings):
            # Claims are of units cut from each rank's own listing: they must be one.
            check_same_listings(
                self.client.compare_set, f"{self.run}/listings", listings, f"rank {self._rank}"
            )
            self._listings_checked = True
        attempt = self._attempts[epoch] = self._attempts.get(epoch, 0) + 1
        base = self._base
        if base is not None and base[0] == epoch:
            work = base[1]
        else:
            work = epoch_work(self._pipe, Context(epoch=epoch, seed=self._seed, listings=listings))
        self._places[epoch] = sorted(set(self._places.get(epoch, [])) | set(work))
        self.spec = DispatchSpec(
            self.client,
            f"{self.run}/{epoch}/{attempt}",
            epoch,
            self.consumers,
            self.unit_items,
            work,
            sealable_per_rank=self.consumers // self._world_size if self.sealable_claims else 0,
        )
        return self.spec

    def end_epoch(self, epoch: int) -> None:
        """This rank delivered the last item of ``epoch``. The rank that ends it last for
        the job removes the keys of the epochs before it: every rank has left them (their
        claims, leases and takeovers), and no checkpoint taken since resumes them, so the
        store's key count stays bounded over any number of epochs. (A rank that dies
        never ends its epoch: its job's keys of that epoch stay, until the job ends.)"""
        ended = self.client.add(f"{self.run}/{epoch}/ended", 1)
        if ended < self._world_size:
            return
        for old in sorted(e for e in self._places if e < epoch):
            self.client.delete(self._epoch_keys(old))
            del self._places[old]

    def _epoch_keys(self, epoch: int) -> list[str]:
        """Every key a job's ranks made for ``epoch`` (see :mod:`nodes.dispatch`)."""
        places, consumers, ranks = self._places[epoch], self.consumers, self._world_size
        keys = [f"{self.run}/{epoch}/ended"]
        for attempt in range(1, self._attempts.get(epoch, 0) + 1):
            key = f"{self.run}/{epoch}/{attempt}"
            keys += epoch_keys(key, places, consumers)
            keys.append(changes_key(key))
            for rank in range(ranks):
                lease = lease_key(key, rank)
                keys += [lease, state_key(lease, 0), state_key(lease, 1)]
            taken = [takeover_key(key, rank) for rank in range(ranks)]
            for rank, work in zip(range(ranks), self.client.get_all_or_none(taken)):
                if work is not None:  # rank was taken over: its phase's keys too
                    keys += [taken[rank], *epoch_keys(f"{key}/x{rank}", places, ranks)]
        return keys

    # ----- checkpoints -------------------------------------------------------------------------
    def record(self, epoch: int, consumers: Iterable[int]) -> dict[str, Any] | None:
        """The checkpoint's record of ``epoch`` (or of the one before, which a rank at the
        start of the next still tells): every unit each of ``consumers`` claimed."""
        spec, base = self.spec, self._base
        if base is not None and base[0] == epoch and (spec is None or spec.epoch != epoch):
            # Resumed, not iterated yet: the checkpoint's remaining work, none of it claimed
            # (without this record the state would read as the epoch's start).
            return dispatch_record(
                epoch=epoch,
                key=f"{self.run}/{epoch}/0",
                consumers=self.consumers,
                unit_items=self.unit_items,
                work=base[1],
                claims={c: {place: [] for place in base[1]} for c in consumers},
            )
        if spec is None or spec.epoch not in (epoch, epoch - 1):
            return None
        resumed = base is not None and base[0] == spec.epoch
        return dispatch_record(
            epoch=spec.epoch,
            key=spec.key,
            consumers=spec.consumers,
            unit_items=spec.unit_items,
            work=spec.work if resumed else None,
            claims={
                c: {place: recorded_claims(self.client, spec.key, place, c) for place in spec.work}
                for c in consumers
            },
        )


def placeholder_dispatcher(rank: int) -> Dispatcher:
    """The dispatcher of a Loader's own consumer (no workers) until its first epoch's spec."""
    return Dispatcher(DispatchSpec(None, "", -1, 1, 1), rank)


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


__all__ = [
    "DynamicDispatch",
    "StoreAddress",
    "placeholder_dispatcher",
]
