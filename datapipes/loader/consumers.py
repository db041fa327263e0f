"""This rank's consumers, and handing them what they read: a resume plan's shares, or units.

Without DataLoader workers the Loader's own graph is the rank's one consumer
(its :class:`nodes.Context`); with workers each worker is one, and they read
what the Loader sets on the dataset it ships to them
(:class:`datapipes.TorchDataset`). This is the one place that knows both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datapipes.resume import JobSetup, ResumePlan
from nodes import Context

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe
    from nodes.dispatch import DispatchSpec


class RankConsumers:
    """Hands this rank's consumers their work (see the module doc)."""

    def __init__(self, runtime_pipe: DataPipe[Any], context: Context, num_workers: int) -> None:
        self._context = context
        self._dataset = _worker_dataset(runtime_pipe) if num_workers else None

    def hand_plan(self, plan: ResumePlan | None, setup: JobSetup, rank: int, ctx: Context) -> None:
        """Give the consumers their share of a dealt epoch (``None``: their own shares);
        ``ctx`` is the context of the graph built in this process."""
        deal = None if plan is None else plan.deal
        if self._dataset is not None:
            mine = setup.consumers_of(rank)
            self._dataset.worker_plans = None if deal is None else deal[1][mine.start : mine.stop]
            self._dataset.plans_epoch = None if deal is None else deal[0]
        else:
            ctx.work = None if plan is None else plan.consumer_work(setup, rank, 0)

    def hand_units(self, spec: DispatchSpec) -> None:
        """Under dynamic dispatch: the epoch's units, which each consumer claims."""
        if self._dataset is not None:
            self._dataset.dispatch_spec = spec
        else:
            self._context.work.use(spec)


def _worker_dataset(runtime_pipe: DataPipe[Any]) -> Any:
    step = runtime_pipe
    while not hasattr(step, "_dataset"):
        step = step.inputs[0]
    return step._dataset
