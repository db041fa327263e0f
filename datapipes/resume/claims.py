"""A dynamically dispatched epoch's work, and its checkpoint's claims replayed.

:func:`epoch_work` is an epoch's whole work per source place (what dynamic
dispatch cuts into units, and what a record without its work stands for).
:class:`ReplayDispatch` reads the ranks' dispatch records back when a
checkpoint is resumed (:func:`datapipes.resume.remaining_work`): each old
consumer's graph replays its own claims, and the units nobody reached are
added to the remaining work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datapipes.placement import worker_part
from nodes import Context
from nodes import elastic as el
from nodes.base import walk_graph
from nodes.consumer_work import DealtWork
from nodes.dispatch import Dispatcher, DispatchSpec
from nodes.errors import InvalidStateError

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe
    from datapipes.resume.model import DispatchRecord, JobSetup


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
        for node in walk_graph(root):
            if hasattr(node, "rounds_ahead"):
                raise el.refuse(
                    node,
                    "reads its input again in rounds that each consumer reaches at its own "
                    "pace; dynamic dispatch hands out one pass of the data: use "
                    "dispatch='static' for it",
                )
        return work
    finally:
        root.close()


def whole_epoch(pipe: DataPipe[Any], setup: JobSetup, epoch: int, listings: Any = None) -> el.Work:
    """The whole work of ``epoch`` of a job of ``setup`` running ``pipe`` (what a dispatch
    record without its work stands for): :func:`epoch_work` of the part a consumer runs."""
    ctx = Context(epoch=epoch, seed=setup.seed, listings=listings)
    return epoch_work(worker_part(pipe, setup.num_workers), ctx)


def check_work_bounds(
    pipe: DataPipe[Any], setup: JobSetup, epoch: int, work: el.Work, listings: Any, path: str
) -> None:
    """Refuse (:class:`InvalidStateError` naming the place) an epoch's work, as a state holds
    it (a dispatch record's, a merged state's remaining work), that the recipe's sources
    could not read: a source it does not have or of another kind, positions past the data,
    files past the listing. Its shapes were checked when the state was parsed
    (:func:`datapipes.resume.schema.check_work`); cut into units or dealt unchecked, a
    position past the data would be read as an item of another, or forever."""
    if not work:
        return
    plan = {place: entry["pieces"] for place, entry in work.items()}
    ctx = setup.context(0, 0, epoch, listings=listings, work=DealtWork(epoch, plan))
    root = worker_part(pipe, setup.num_workers).build(ctx)
    try:
        dealt, unknown = el.dealt_sources(root, work, path)
        for node, place in dealt:
            where = f"{path}[{place!r}]"
            if work[place]["kind"] != node.elastic_kind:
                expected = f"{node.elastic_kind!r} (the kind of the recipe's source there)"
                raise InvalidStateError(f"{where}.kind", expected, work[place]["kind"])
            node.validate_plan(plan[place], f"{where}.pieces")
        if unknown:
            raise InvalidStateError(path, "the work of this recipe's sources", sorted(unknown))
    finally:
        root.close()


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

    def __init__(self, records: list[DispatchRecord], whole_epoch: el.Work | None) -> None:
        first = records[0]
        for record in records[1:]:
            for name in ("key", "consumers", "unit_items", "work"):
                if getattr(record, name) != getattr(first, name):
                    raise InvalidStateError(
                        f"ranks[...].dispatch.{name}",
                        "the same value in every rank's record of the epoch",
                        getattr(record, name),
                    )
        self.spec = DispatchSpec(
            None,
            first.key,
            first.epoch,
            first.consumers,
            first.unit_items,
            first.work if first.work is not None else whole_epoch,
        )
        self._recorded: dict[int, dict[str, list[int]]] = {}
        for record in records:
            for consumer, claims in record.claims.items():
                if consumer in self._recorded:
                    raise InvalidStateError(
                        f"ranks[...].dispatch.claims[{str(consumer)!r}]",
                        "each consumer's claims in one rank's record",
                        "a second record",
                    )
                self._recorded[consumer] = dict(claims)
        self._check_claims()
        self._dispatchers: dict[int, Dispatcher] = {}
        self._finished: set[int] = set()
        #: Whether any unit was claimed, or the epoch was a resumed one's rest (then its
        #: remaining work is not simply a fresh epoch's).
        self.started = first.work is not None or any(
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
        :mod:`datapipes.dispatch.takeover`).
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
