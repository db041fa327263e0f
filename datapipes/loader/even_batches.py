"""A Loader's ``even_batches``: whether every rank yields as many items, and how ranks agree."""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING, Any

from datapipes.pipe import DataPipe
from datapipes.placement import split_main_steps
from datapipes.topology import Topology
from nodes import Context, Node
from nodes.consumer_work import DealtWork
from nodes.context import every_consumer
from nodes.steps.even import CollectiveAgreement, CountedAgreement, EvenBatchesNode, RankAgreement

if TYPE_CHECKING:
    from datapipes.loader.options import LoaderOptions
    from datapipes.placement import RecipePlan


class EvenBatchesPolicy:
    """The ``even_batches`` of one Loader: the decision, when it is pinned, and the agreement.

    The decision has three values while it is open (see :func:`even_batches_on`):
    on, off, or not decidable yet (the default under ``torchrun`` before
    ``init_process_group``). It is pinned the first time it is decidable, or at
    the latest when the first epoch's graph is built (:meth:`wrap`); until then
    a loaded checkpoint's value is adopted (:meth:`adopt`). The ranks'
    agreement is made once per Loader, at the first epoch that needs it:
    under NCCL it makes a gloo group, which every rank must do at the same point.
    """

    __slots__ = (
        "_deal",
        "_requested",
        "_pipe",
        "_topology",
        "_num_workers",
        "_seed",
        "_on",
        "_agreement",
        "_group",
    )

    def __init__(self, options: LoaderOptions, recipe: RecipePlan) -> None:
        self._requested = options.even_batches  # True, False or None (the default)
        self._pipe, self._topology = recipe.recipe, options.topology
        self._num_workers, self._seed = options.num_workers, options.seed
        self._on: bool | None = None  # pinned once decided
        self._agreement: RankAgreement | None = None  # made at the first epoch, then kept
        self._group: Any = _UNSET  # the ranks' process group, made once when first needed
        self._deal: tuple[int, list[Any]] | None = None  # see set_deal

    @property
    def value(self) -> bool:
        """Whether every rank yields the same number of items per epoch (off while undecided)."""
        if self._on is None:
            self._on = even_batches_on(self._requested, self._topology)
        return bool(self._on)

    def adopt(self, saved: object) -> None:
        """Take a loaded checkpoint's ``even_batches`` while the default is undecided.

        Before the process group is up the default follows the checkpoint
        being loaded; a decided value (or a ``saved`` that is no bool) stays.
        """
        undecided = even_batches_on(self._requested, self._topology) is None
        if self._on is None and undecided and isinstance(saved, bool):
            self._on = saved

    def group(self) -> Any:
        """The process group this Loader's ranks talk on, or :data:`NO_GROUP`.

        Ranks talk only when the policy is on under ``torch.distributed`` with
        several ranks: then every rank iterates its Loader, so a collective at
        the first epoch's build cannot hang. ``None`` is the default group (gloo);
        under another backend a gloo group is made, once per Loader (which is
        collective too), and shared by everything the ranks agree on (the
        even epochs, the file listing).
        """
        if not self.value:
            return NO_GROUP
        if self._group is _UNSET:
            self._group = _gloo_group()
        return self._group

    def set_deal(self, deal: tuple[int, list[Any]] | None) -> None:
        """Count the epoch of a resume on another topology from every consumer's plan."""
        self._deal = deal

    def wrap(self, root: Node[Any], epoch: Callable[[], int]) -> Node[Any]:
        """``root`` made even across ranks when the policy is on (``epoch``: the running one).

        Building the first epoch's graph decides for good.
        """
        self._on = self.value
        if not self._on:
            return root
        if self._agreement is None:  # once: under NCCL it makes a gloo group
            self._agreement = even_batches_agreement(
                self._pipe,
                self._topology,
                self._num_workers,
                self._seed,
                self.group(),
                lambda: self._deal,
            )
        return EvenBatchesNode(root, self._agreement, rank=self._topology.rank, epoch=epoch)


def even_batches_on(even_batches: bool | None, topology: Topology) -> bool | None:
    """Whether every rank must yield the same number of items; ``None``: not decidable yet.

    The default (``even_batches=None``) is on when ``torch.distributed`` runs
    more than one rank, which may only be known later than the Loader is
    made: under ``torchrun`` a Loader made before ``init_process_group`` has
    its ranks from ``RANK``/``WORLD_SIZE``. Until the process group is up that
    default is ``None``, and the Loader decides at its first epoch (or takes
    the value of a checkpoint it loads). Ranks given as arguments without a
    process group decide now: off.
    """
    import torch.distributed as dist

    if topology.world_size == 1:
        return False
    if even_batches is not None:
        return bool(even_batches)
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    return None if topology.origin == "RANK/WORLD_SIZE" else False


def even_batches_agreement(
    pipe: DataPipe[Any],
    topology: Topology,
    num_workers: int,
    seed: int,
    group: Any,
    deal: Callable[[], Any] = lambda: None,
) -> RankAgreement:
    """How ranks agree to stop together: on ``group`` (see :meth:`EvenBatchesPolicy.group`),
    else, with :data:`NO_GROUP`, by counting every rank's items (``deal()``: the plans of
    an epoch resumed on another topology)."""
    if group is not NO_GROUP:
        return CollectiveAgreement(group)
    world = topology.world_size
    return CountedAgreement(
        lambda epoch: items_per_rank(pipe, world, num_workers, seed, epoch, deal()),
        topology.rank,
    )


#: The ranks of a Loader do not talk (no ``torch.distributed``, one rank, or the policy off).
NO_GROUP = object()
_UNSET = object()


def _gloo_group() -> Any:
    """The default group under gloo, a new gloo group under another backend, else NO_GROUP."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return NO_GROUP
    # Gloo, so the ranks' few small messages never queue behind NCCL work on the GPU.
    return None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")


_COUNT_PRESERVING = ("map", "shuffle", "prefetch", "pin_memory", "to_device")


def items_per_rank(
    pipe: DataPipe[Any],
    world_size: int,
    num_workers: int,
    seed: int,
    epoch: int,
    deal: tuple[int, list[Any]] | None = None,
) -> list[int]:
    """How many items each rank's Loader yields in ``epoch``, computed without communication.

    From :meth:`DataPipe.consumer_length` when the recipe's counts are known
    (sequences and count-keeping steps: no data is read), else by running
    every consumer's part of the pipeline and counting (a full pass over the
    epoch's data). Used by ``even_batches`` when ranks cannot talk through
    ``torch.distributed``.
    """
    worker_part, main_steps = split_main_steps(pipe)
    changing = [step for step in main_steps if step.name not in _COUNT_PRESERVING]
    if changing:
        raise ValueError(
            f"even_batches without torch.distributed counts items in the workers, but "
            f".{changing[0].describe_step()} runs in the main process and changes the count; "
            "move it before pin_memory()/to_device(), or initialize torch.distributed"
        )
    counts = [0] * world_size
    for index, ctx in enumerate(
        every_consumer(world_size, max(num_workers, 1), epoch=epoch, seed=seed)
    ):
        if deal is not None and deal[0] == epoch:  # a share dealt after a topology change
            if deal[1][index] is None:
                raise ValueError(
                    "even_batches without torch.distributed counts every rank's items, but "
                    "this rank's state holds only its own share of the resumed epoch: load "
                    "the merged state (dp.merge_states) on every rank"
                )
            ctx.work = DealtWork(epoch, deal[1][index])
            counts[ctx.rank] += _count_by_running(worker_part, ctx)
            continue
        known = worker_part.consumer_length(ctx)
        counts[ctx.rank] += _count_by_running(worker_part, ctx) if known is None else known
    return counts


def _count_by_running(pipe: DataPipe[Any], ctx: Context) -> int:
    root = pipe.build(ctx)
    try:
        root.reset(None)
        return sum(1 for _ in chain(root))
    finally:
        root.close()
