"""The context a graph of nodes is bound to: its consumer slot, epoch and seed, and scopes of it.

A floor module: it imports nothing of ``nodes`` but :mod:`nodes.consumer_work`, and that
for type checking only.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nodes.consumer_work import ConsumerWork


class Context:
    """Where a graph of nodes runs: its consumer slot, epoch and seed.

    A *consumer* is one (rank, worker) pair; data is dealt across
    ``world_size * num_workers`` consumers. ``epoch`` is mutable: the owner of
    a graph (usually a :class:`datapipes.Loader`) sets it before ``reset``.
    ``stats=True`` builds every step with per-step statistics
    (:class:`nodes.observe.stats.StatsNode`). ``listings`` (a :class:`nodes.sources.files.Listings`,
    set by the owner) holds the file listings its file lists share instead of each
    listing the files itself.

    >>> ctx = Context(rank=1, world_size=2, epoch=3, seed=7)
    >>> ctx.consumer_index, ctx.num_consumers
    (1, 2)
    """

    # The fields of a context, every one annotated here: a ScopedContext reads each of them
    # from the context it scopes, through a property made from its annotation.
    rank: int
    world_size: int
    worker_id: int
    num_workers: int
    epoch: int
    seed: int
    stats: bool
    #: The file listings this graph reads (a :class:`nodes.sources.files.Listings`; ``None``:
    #: each file list lists for itself).
    listings: Any
    #: What this consumer reads instead of its own share (see :mod:`nodes.consumer_work`).
    work: ConsumerWork | None
    #: In a graph built before a ``shard()``: the context of the consumer the shard runs
    #: for (this one then reads the whole stream); ``None`` otherwise.
    shard_ctx: Any = None
    #: While a trace runs (``Loader.trace``): the :class:`nodes.observe.trace.SpanRecorder` every
    #: step's statistics node notes its spans in; it builds them even without ``stats``.
    trace: Any = None

    def plan_for(self, place: str | None) -> list[Any] | None:
        """The pieces the source at ``place`` reads this epoch, or ``None``: its own share."""
        work = self.work
        if work is None or place is None or work.epoch != self.epoch:
            return None
        return work.plan_for(place)

    def rounds_planned(self, base: str) -> list[int]:
        """The rounds of the source at ``base`` (under a ``repeat``) this epoch's dealt work
        holds (see :mod:`nodes.rounds`); none: every round is read afresh."""
        work = self.work
        if work is None or work.epoch != self.epoch:
            return []
        return work.rounds_of(base)

    @property
    def dispatch(self) -> Any:
        """This consumer's :class:`nodes.dispatch.Dispatcher` under dynamic dispatch (its
        ``work`` claims units on demand), else ``None``."""
        work = self.work
        return work if work is not None and work.claims_on_demand else None

    def place_of(self, key: int) -> str:
        """A source's place in the recipe: its step's key within the combinator branches
        and ``repeat`` rounds it sits in (the same on every topology and epoch)."""
        return "/".join(str(part) for part in self.random_key(key)[2:])

    def __init__(
        self,
        *,
        rank: int = 0,
        world_size: int = 1,
        worker_id: int = 0,
        num_workers: int = 1,
        epoch: int = 0,
        seed: int = 0,
        stats: bool = False,
        listings: Any = None,
        work: ConsumerWork | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if not 0 <= worker_id < num_workers:
            raise ValueError(
                f"worker_id must be in [0, num_workers={num_workers}), got {worker_id}"
            )
        self.rank = rank
        self.world_size = world_size
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.epoch = epoch
        self.seed = seed
        self.stats = stats
        self.listings = listings
        self.work = work

    @property
    def consumer_index(self) -> int:
        """This consumer's index among all ``num_consumers`` (rank-major)."""
        return self.rank * self.num_workers + self.worker_id

    @property
    def num_consumers(self) -> int:
        """How many consumers share the data: ``world_size * num_workers``."""
        return self.world_size * self.num_workers

    def random_key(self, *parts: int, seed: int | None = None) -> list[int]:
        """Entropy for an RNG: (seed, epoch, *parts). Never touches global RNGs."""
        return [self.seed if seed is None else seed, self.epoch, *parts]

    def __repr__(self) -> str:
        return (
            f"Context(rank={self.rank}, world_size={self.world_size}, "
            f"worker_id={self.worker_id}, num_workers={self.num_workers}, "
            f"epoch={self.epoch}, seed={self.seed})"
        )


def every_consumer(
    world_size: int, num_workers: int, *, epoch: int = 0, seed: int = 0
) -> list[Context]:
    """The contexts of all ``world_size * num_workers`` consumers, rank-major.

    >>> [c.consumer_index for c in every_consumer(2, 2)]
    [0, 1, 2, 3]
    """
    return [
        Context(
            rank=rank,
            world_size=world_size,
            worker_id=worker,
            num_workers=num_workers,
            epoch=epoch,
            seed=seed,
        )
        for rank in range(world_size)
        for worker in range(num_workers)
    ]


class ScopedContext(Context):
    """A view of a parent context that adds ``tag`` to every RNG key.

    Places in a graph that must draw different random streams get their own
    scope: each branch of a combinator (so ``dp.zip(a.shuffle(), a.shuffle())``
    shuffles its two branches independently), and each round of a
    ``repeat()`` (the node bumps ``tag`` per round). Everything else is the
    parent's, read when asked (a later ``epoch`` or ``trace`` shows through):
    each field of :class:`Context`, the names it annotates, is a read-only
    property made from that annotation, so a field added to :class:`Context`
    reaches every scope without being declared here. The methods of
    :class:`Context` run on the scope, so what they build on ``random_key``
    (``place_of``) includes the tag. (No ``__getattr__``: a class with one is
    slower at every attribute read, ``tag`` and ``_parent`` included.)

    >>> scope = ScopedContext(Context(seed=7, epoch=2), tag=1)
    >>> scope.seed, scope.random_key(5), scope.place_of(5)
    (7, [7, 2, 1, 5], '1/5')
    """

    def __init__(self, parent: Context, tag: int = 0) -> None:
        self._parent = parent
        self.tag = tag

    def random_key(self, *parts: int, seed: int | None = None) -> list[int]:
        return self._parent.random_key(self.tag, *parts, seed=seed)


for _field in Context.__annotations__:
    setattr(
        ScopedContext,
        _field,
        property(attrgetter(f"_parent.{_field}"), doc=f"The parent context's ``{_field}``."),
    )
del _field
