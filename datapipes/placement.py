"""Which steps run in worker processes and which in the main process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe


def runs_in_main_process(pipe: DataPipe[Any]) -> bool:
    """Whether a step must run in the main process (``pin_memory``, ``to_device``)."""
    return pipe.main_process_only


def split_main_steps(pipe: DataPipe[Any]) -> tuple[DataPipe[Any], list[DataPipe[Any]]]:
    """``(worker_part, main_steps)``: the recipe below the first main-process step, and the rest.

    The first main-process step on the recipe's chain and every step after it
    run in the main process (``main_steps``, upstream first); the recipe below
    it runs in the workers. A main-process step inside a branch of ``zip``,
    ``mix`` or ``concat`` is an error, since a branch runs in the workers.
    """
    spine = [pipe]
    while len(spine[-1].inputs) == 1:
        spine.append(spine[-1].inputs[0])
    main_at = [i for i, step in enumerate(spine) if runs_in_main_process(step)]
    if not main_at:
        check_no_main_steps(pipe)
        return pipe, []
    first = max(main_at)
    worker_part = spine[first].inputs[0]
    check_no_main_steps(worker_part)
    main_steps = spine[first::-1]
    _check_no_thread_after_copy(main_steps)
    repeats = [step for step in main_steps if step.name == "repeat"]
    if repeats:
        raise ValueError(
            f".{repeats[0].describe_step()} after .pin_memory()/.to_device() would rerun the "
            "worker processes for every round with the same shuffles; put repeat() before them"
        )
    return worker_part, main_steps


def _check_no_thread_after_copy(main_steps: Sequence[DataPipe[Any]]) -> None:
    names = [step.name for step in main_steps]
    if "to_device" in names and "prefetch" in names[names.index("to_device") :]:
        raise ValueError(
            ".prefetch() after .to_device() would issue the copies from a background thread, "
            "where CUDA orders them before that thread's work, not the training loop's. Put "
            "prefetch() before pin_memory()/to_device(): the copy itself is asynchronous."
        )


def check_no_main_steps(pipe: DataPipe[Any]) -> None:
    """Refuse a recipe that has a main-process step where workers would run it."""
    stack = [pipe]
    while stack:
        step = stack.pop()
        if runs_in_main_process(step):
            raise ValueError(
                f".{step.describe_step()} must run in the main process, but here it sits where "
                "worker processes would run it (inside a zip/mix/concat branch, or in a recipe "
                "given to as_torch_dataset()). Apply it last, to the combined pipe; with your "
                "own DataLoader use its pin_memory=True and move batches in the training loop."
            )
        stack.extend(step.inputs)


@dataclass(frozen=True)
class RecipePlan:
    """A recipe split once into the part its consumers run and the main-process steps.

    Made where the recipe is given (a Loader, once), checked there (replay
    order, main-process steps), and passed to whoever needs the recipe, its
    parts or its identity, so nothing splits or fingerprints it again.

    >>> import datapipes as dp
    >>> plan = RecipePlan.of(dp.range(4).map(abs).pin_memory(), num_workers=2)
    >>> plan.worker_part, [step.name for step in plan.main_steps]
    (dp.range(4).map(abs), ['pin_memory'])
    >>> plan.consumer_part(0) is plan.recipe
    True
    """

    recipe: DataPipe[Any]
    num_workers: int
    worker_part: DataPipe[Any]
    main_steps: tuple[DataPipe[Any], ...]
    fingerprint: str
    steps: tuple[str, ...]

    @classmethod
    def of(cls, recipe: DataPipe[Any], num_workers: int) -> RecipePlan:
        """Split and check ``recipe`` for a Loader with ``num_workers`` DataLoader workers."""
        worker, main_steps = split_main_steps(recipe)
        _check_replay_order(recipe, worker, num_workers)
        return cls(
            recipe, num_workers, worker, tuple(main_steps), recipe.fingerprint(),
            tuple(recipe.steps()),
        )  # fmt: skip

    def consumer_part(self, num_workers: int) -> DataPipe[Any]:
        """What one consumer of a job with ``num_workers`` workers per rank runs: the whole
        recipe without workers, the worker part with them (a saved job's may differ)."""
        return self.worker_part if num_workers else self.recipe


def worker_part(pipe: DataPipe[Any], num_workers: int) -> DataPipe[Any]:
    """The part of ``pipe`` a consumer runs: all of it without DataLoader workers, the part
    below the main-process steps (:func:`split_main_steps`) with them."""
    return split_main_steps(pipe)[0] if num_workers else pipe


def rebuild_on(base: DataPipe[Any], steps: Sequence[DataPipe[Any]]) -> DataPipe[Any]:
    """The chain of single-input ``steps`` (upstream first) re-applied on top of ``base``."""
    for step in steps:
        base = step._with_inputs(base)
    return base


#: Why a recipe's output may be replayed from outside it.
WORKERS_REPLAY = "the DataLoader workers re-read them when they resume from their last snapshot"


def check_replay_order(
    pipe: DataPipe[Any], num_workers: int, *, in_torch_dataset: bool = False
) -> None:
    """Refuse an unordered parallel map whose output a later step resumes by replaying.

    ``map(..., ordered=False)`` yields results in the order they finish, so a
    second pass from the same state may order them differently. A step that
    resumes by re-reading its input (a buffer shuffle, ``flat_map``,
    ``unbatch``, ``shard``, a parallel map) and the DataLoader workers (which
    replay the items since their last snapshot) would then skip the wrong
    items: some would be lost and others repeated. Also refuses
    ``method="process"`` where a Loader's workers would run it.
    ``in_torch_dataset``: the whole recipe is a ``TorchDataset``, which a
    ``StatefulDataLoader``'s workers may replay.
    """

    if in_torch_dataset:
        _walk_replays(pipe, WORKERS_REPLAY, in_workers=False)
        return
    _check_replay_order(pipe, split_main_steps(pipe)[0], num_workers)


def _check_replay_order(pipe: DataPipe[Any], worker: DataPipe[Any], num_workers: int) -> None:
    _walk_replays(pipe, None, in_workers=False)
    if num_workers:
        _walk_replays(worker, WORKERS_REPLAY, in_workers=True)


def _walk_replays(step: DataPipe[Any], replayed_by: str | None, in_workers: bool) -> None:
    if step.unordered and replayed_by is not None:
        raise ValueError(
            f".{step.describe_step()} yields items in the order they finish, but "
            f"{replayed_by}, so a resume would lose some items and repeat others. Use "
            "ordered=True (the default), or put the unordered map after the steps that "
            "replay, with no DataLoader workers."
        )
    if in_workers and step.name == "map" and step.kwargs.get("method") == "process":
        raise ValueError(
            f".{step.describe_step()} would start processes inside DataLoader workers, "
            "which may not have children. Use method='thread' there, or drop the map's "
            "num_workers and raise the Loader's num_workers instead."
        )
    if step.replays_input:
        replayed_by = f".{step.describe_step()} {step.replay_note}"
    for upstream in step.inputs:
        _walk_replays(upstream, replayed_by, in_workers)
