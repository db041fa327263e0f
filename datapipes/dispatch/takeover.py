"""A stalled or dead rank's units, taken over by the others within the running epoch.

``dp.Loader(..., dispatch="dynamic", dispatch_lease_seconds=s)`` gives every
rank a lease on what it claimed (:mod:`nodes.dispatch.lease`): its position is
written ahead of each item it delivers, and its claims can be sealed (a rank's
consumers claim through one list that a taker seals, see
:func:`nodes.dispatch.dispatcher.sealable_claim`). A rank that has delivered
everything it claimed does not end its epoch at once: it waits until every
other rank is done too. A lease that stays the same for ``s`` seconds is
stale: the waiting rank takes it over (``compare_set``, so only one does),
works out what that rank had not delivered (its published position, replayed
like a checkpoint, plus its claimed units it had not reached) and publishes
it as a *takeover phase*. Every waiting rank reads the phase's units, claimed
one at a time as usual, in its own process (no DataLoader workers: a takeover
is the rare path). The stalled rank, if it wakes, finds its lease gone at its
next item: that item is dropped, its epoch ends, and it warns.

A taker is a rank like the others: if it dies or stops after winning a lease
and before publishing the work, its own lease goes stale and the waiting ranks
take the first rank over again (:meth:`Takeovers._published_work`); if it dies
while reading a phase, the units it claimed there are in its published
position, and its own taker publishes them as a phase of their own.

Without a checkpoint, nothing is repeated: every item is delivered once, by
the rank that held its lease when it was delivered. A fenced rank ends its
epoch once the other ranks are through with it (its units among theirs); if
one of them died too and no rank is left to take it over, it raises
:class:`UnfinishedEpochError` instead, and the last checkpoint resumes the
job exactly. An item counts as delivered when its position is written ahead,
just before the training loop receives it: a rank killed between the two
(one item at most) loses that item for this run; a stopped rank, which wakes
to hold it, delivers it once. A checkpoint of a
rank that is reading a takeover phase is refused (its position spans another
rank's work); the ranks' next epoch checkpoints as usual.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from datapipes.dispatch import owed
from datapipes.resume import JobSetup, rank_state
from datapipes.resume.records import at_epoch_start
from nodes import elastic as el
from nodes.dispatch import Dispatcher, DispatchSpec
from nodes.dispatch import lease as lease_module
from nodes.dispatch.lease import (
    DONE,
    TAKEN,
    Lease,
    LeaseLost,
    LeaseWatch,
    decode,
    lease_key,
    takeover_key,
)

if TYPE_CHECKING:
    from datapipes.dispatch.dynamic import DynamicDispatch
    from datapipes.loader.options import LoaderOptions
    from datapipes.placement import RecipePlan

#: Seconds between looks at the other ranks' leases while waiting at an epoch's end.
POLL_SECONDS = 0.05


class LeaseTakenWarning(RuntimeWarning):
    """This rank's lease was taken over: another rank delivered the rest of its units."""


class UnfinishedEpochError(RuntimeError):
    """A rank holding units of the epoch went stale and no rank is left to take it over."""


class TakeoverCheckpointError(RuntimeError):
    """A checkpoint was asked for while this rank read a stalled rank's units."""


class RankPosition(Protocol):
    """What takeovers read of the Loader whose rank they serve (its checkpoints part)."""

    @property
    def epoch(self) -> int:
        """The epoch that runs."""

    @property
    def setup(self) -> JobSetup:
        """The job setup its checkpoints record."""

    def position(self) -> dict[str, Any]:
        """Its ``state_dict()`` now, without the takeover checks."""

    def listings(self) -> Any:
        """The job's file listings."""


class Takeovers:
    """A Loader's leases and takeovers (see the module doc): one per Loader."""

    def __init__(
        self,
        options: LoaderOptions,
        recipe: RecipePlan,
        dispatch: DynamicDispatch,
        position: RankPosition,
    ) -> None:
        assert options.dispatch is not None and options.dispatch.lease_seconds is not None
        self.lease_seconds = options.dispatch.lease_seconds
        self._rank = options.topology.rank
        self._recipe = recipe
        self._dispatch = dispatch
        self._position = position
        self.lease: Lease | None = None
        self.reading_phase: int | None = None  # the taken rank whose units this rank reads
        self.fenced = False  # the last epoch ended because the lease was taken over
        self._report = self._new_report()

    @staticmethod
    def _new_report() -> dict[str, Any]:
        return {"wait_seconds": 0.0, "took_over": [], "items_taken_over": 0, "fenced": False}

    def report(self) -> dict[str, Any]:
        """This epoch's lease statistics (see :class:`datapipes.PipelineStats`)."""
        return {**self._report, "took_over": list(self._report["took_over"])}

    @property
    def client(self) -> Any:
        return self._dispatch.client

    def _taken_from_me(self, lease: Lease) -> bool:
        """Whether ``lease`` was taken over with units still to deliver (one store read)."""
        if lease.lost:
            return True
        value = decode(self.client.get_or_none(lease.key), lease.key)
        if value is None or value["status"] != TAKEN or value.get("by") == self._rank:
            return False
        was = value.get("was")
        return not (isinstance(was, dict) and was.get("status") == DONE)

    # ----- the rank's own units -------------------------------------------------------------
    def deliver(self, items: Iterator[Any], spec: DispatchSpec) -> Iterator[Any]:
        """``items`` with the lease written ahead of each; ends (dropping the item) when the
        lease was taken over. Then, when ``items`` ended, the takeover phases."""
        self.fenced = False
        lease = self.lease
        if lease is None or lease.key != lease_key(spec.key, self._rank):
            self._report = self._new_report()  # a new epoch (not one continued after close())
            lease = None
        if lease is None or lease.lost:
            lease = self.lease = Lease(self.client, spec.key, self._rank, self.lease_seconds)
        try:
            start = self._position.position()
            lease.start(owed.lease_text(start))
            yield from self._written_ahead(items, self._position.position, self._at_start(start))
            yield from self._after(spec)
        except LeaseLost as lost:
            self.fenced = self._report["fenced"] = True
            warnings.warn(
                f"{lost}; this rank ends epoch {spec.epoch} here (what it had not delivered, "
                "the item it was about to deliver included, goes to that rank)",
                LeaseTakenWarning,
                stacklevel=2,
            )
            self._until_the_others_end(spec)
        finally:
            lease.close()
            self.reading_phase = None

    def _written_ahead(
        self,
        items: Iterable[Any],
        state: Callable[[], dict[str, Any]],
        at_start: bool,
        *,
        phase: int | None = None,
    ) -> Iterator[Any]:
        """``items``, each written ahead in the lease: ``since`` + 1, or a full ``state()``
        every so often and while the last one published was an epoch's start (a taker
        cannot replay items after a DataLoader that had not started)."""
        lease = self.lease
        assert lease is not None
        for item in lease.pulled_from(items):
            if at_start or lease.due():
                current = state()
                lease.publish_state(owed.lease_text(current), phase=phase)
                at_start = self._at_start(current)
            else:
                lease.delivered()
            yield item

    def _at_start(self, state: dict[str, Any]) -> bool:
        return at_epoch_start(state, self._rank)  # its own state: no need to parse it

    # ----- at the end: wait for the others, take over the stalled ------------------------------
    def _after(self, spec: DispatchSpec) -> Iterator[Any]:
        lease = self.lease
        assert lease is not None
        world_size = self._position.setup.world_size
        watch = LeaseWatch(self.client, spec.key, self._rank, world_size, self.lease_seconds)
        read: set[int] = set()  # the taken ranks whose units this rank read
        seen: tuple[int, int] | None = None
        scanned_at = 0.0
        while True:
            looked = time.perf_counter()  # the look at the leases is part of the wait
            # One small request per look; every lease only when it may tell something
            # new (see nodes.dispatch.lease.changes_key).
            changes, now = watch.changes(), lease_module.clock()
            takeover = seen is None or changes[0] != seen[0]
            may_be_over = changes != seen and sum(changes) >= world_size - 1
            if not (takeover or may_be_over or now - scanned_at >= self.lease_seconds / 4):
                time.sleep(POLL_SECONDS)
                self._report["wait_seconds"] += time.perf_counter() - looked
                continue
            seen, scanned_at = changes, now
            leases = watch.scan()
            new = [
                r
                for r, (_, value) in sorted(leases.items())
                if value and value["status"] == TAKEN and r not in read
            ]
            for r in new:
                yield from self._phase(spec, watch, r)
                read.add(r)
            if not lease.is_done(len(read)):  # it delivered all it claimed (or took over)
                lease.finish(len(read))
            if new:
                continue
            waiting, stale = watch.pending(leases, len(read))
            if not waiting:
                return
            for rank, raw in stale:
                self._take(spec, watch, rank, raw)
            time.sleep(POLL_SECONDS)
            self._report["wait_seconds"] += time.perf_counter() - looked

    def _until_the_others_end(self, spec: DispatchSpec) -> None:
        """A fenced rank's end of the epoch: once every other rank is through (done, having
        read every takeover, or taken over itself), so that its units, which another rank
        delivers, are not lost in silence if that rank dies too with nobody left to take
        it over: a rank that stays stale for two leases is an :class:`UnfinishedEpochError`
        (the job resumes from its last checkpoint, exactly)."""
        world_size = self._position.setup.world_size
        patience = 2 * self.lease_seconds
        watch = LeaseWatch(self.client, spec.key, self._rank, world_size, patience)
        while True:
            leases = watch.scan()
            # This rank's lease is taken, so every rank still delivering reads one takeover
            # more than the taken leases it sees.
            phases = 1 + sum(1 for _, v in leases.values() if v and v["status"] == TAKEN)
            waiting, stale = watch.pending(leases, phases)
            if not waiting:
                return
            if stale:
                ranks = ", ".join(str(rank) for rank, _ in stale)
                raise UnfinishedEpochError(
                    f"epoch {spec.epoch} cannot end: rank(s) {ranks} of dynamic dispatch "
                    f"stopped renewing their lease {patience:g} s ago with units still to "
                    f"deliver (some of them rank {self._rank}'s, which was taken over), "
                    "and no rank is left to take them over. The items they held were "
                    "delivered by nobody: resume the job from its last checkpoint (on any "
                    "number of ranks), which delivers each of them exactly once"
                )
            time.sleep(POLL_SECONDS)

    def _take(self, spec: DispatchSpec, watch: LeaseWatch, rank: int, raw: bytes) -> bool:
        """Take ``rank``'s lease over (if it still holds ``raw``) and publish its work;
        whether this rank took it.

        Between winning the lease and publishing the work, this rank alone knows of that
        work. If it dies or stops there, its lease goes stale like any other (it is made
        active first), and the ranks waiting for the work take ``rank`` over again from
        the position the taken lease carries (:meth:`_published_work`): the work is the
        same whoever works it out (``rank``'s published position and its sealed claims),
        so a taker that wakes late and publishes too writes what is there already."""
        lease = self.lease
        assert lease is not None
        lease.publish_state(owed.lease_text(self._position.position()))
        was = watch.take(rank, raw)
        if was is None:  # another rank was first, or it woke up
            return False
        work: el.Work = {}
        if was["status"] != DONE:
            work = owed.work_of(
                self._recipe,
                watch,
                rank,
                was,
                self.client,
                self._position.listings(),
                self._start_state,
            )
        lease.renew()  # LeaseLost if this rank was taken over meanwhile: its taker publishes
        self.client.set(takeover_key(spec.key, rank), json.dumps(work))
        self._report["took_over"].append(rank)
        return True

    def _published_work(self, spec: DispatchSpec, watch: LeaseWatch, taken: int) -> el.Work:
        """The work of ``taken``'s takeover phase, once its taker published it; taken over
        again (see :meth:`_take`) when that taker was taken over itself or stalled first."""
        key = takeover_key(spec.key, taken)
        while True:
            raw = self.client.get_or_none(key)
            if raw is not None:
                return json.loads(raw)
            lease_raw, value = watch.read(taken)
            assert value is not None and value["status"] == TAKEN  # taken leases stay taken
            taker = value.get("by")
            taker_raw, taker_value = watch.read(taker) if isinstance(taker, int) else (b"", None)
            gone = taker_value is None or taker_value["status"] == TAKEN
            if gone or watch.unchanged_for_a_lease(taker, taker_raw):
                self._take(spec, watch, taken, lease_raw)
                continue
            time.sleep(POLL_SECONDS)

    def _start_state(self, rank: int) -> dict[str, Any]:
        """A state of the job at the start of the running epoch with ``rank``'s entry (a
        rank taken over before it published its own)."""
        setup, epoch = self._position.setup, self._position.epoch
        return rank_state(
            fingerprint=self._recipe.fingerprint,
            steps=list(self._recipe.steps),
            setup=setup,
            rank=rank,
            epoch=epoch,
            node=None,
            dispatch=self._dispatch.record(epoch, setup.consumers_of(rank)),
        )

    def _phase(self, spec: DispatchSpec, watch: LeaseWatch, taken: int) -> Iterator[Any]:
        """Read (with the other waiting ranks) the units of ``taken``'s takeover phase."""
        work = self._published_work(spec, watch, taken)
        if not work:
            return
        # A phase is read in this process, one consumer per rank (no DataLoader workers).
        setup = dataclasses.replace(self._position.setup, num_workers=0, items_per_transfer=1)
        phase = DispatchSpec(
            self.client, f"{spec.key}/x{taken}", spec.epoch, setup.world_size,
            spec.unit_items, work, sealable_per_rank=1,
        )  # fmt: skip
        work_here = Dispatcher(phase, self._rank)
        listings = self._position.listings()
        ctx = setup.context(self._rank, 0, spec.epoch, listings=listings, work=work_here)
        root = self._recipe.recipe.build(ctx)
        lease = self.lease
        assert lease is not None
        self.reading_phase = taken
        try:
            state_of = owed.phase_state(self._recipe, self._position.setup, self._rank, phase, root)
            # Active at the phase's start before the reset claims its first unit: a taker
            # of this rank then replays every unit it claimed in the phase.
            lease.publish_state(owed.lease_text(state_of(start=True)), phase=taken)
            root.reset(None)
            for item in self._written_ahead(root, state_of, True, phase=taken):
                self._report["items_taken_over"] += 1
                yield item
        finally:
            self.reading_phase = None
            root.close()

    def check_checkpoint(self) -> None:
        """Refuse a checkpoint while this rank reads a taken-over rank's units, or while
        its own lease is taken over but its epoch has not ended yet (it ends at the next
        item): its position then names units its taker delivers."""
        lease = self.lease
        if lease is not None and not self.fenced and self._taken_from_me(lease):
            raise TakeoverCheckpointError(
                f"rank {self._rank}'s dispatch lease was taken over (it went longer "
                "than dispatch_lease_seconds without renewing it): the rank that took it "
                "delivers the rest of this rank's units, so this rank's position is no "
                "longer its share. Its epoch ends at its next item (a LeaseTakenWarning): "
                "checkpoint after that, or from the other ranks"
            )
        if self.reading_phase is not None:
            raise TakeoverCheckpointError(
                f"rank {self._rank} is reading the units it took over from stalled rank "
                f"{self.reading_phase} (dispatch_lease_seconds): a checkpoint now would have "
                "to hold that rank's position too. Checkpoint before the epoch's end, or "
                "after it: the next epoch's states are ordinary"
            )
