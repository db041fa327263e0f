"""Combinators: several pipes into one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from datapipes.pipe import DataPipe
from nodes import ConcatNode, Context, MixNode, Node, ScopedContext, ZipNode
from nodes.steps.combine import check_mix_args


def _pipes(name: str, pipes: Sequence[Any]) -> tuple[DataPipe[Any], ...]:
    if not pipes:
        raise ValueError(f"{name}() needs at least one pipe")
    for pipe in pipes:
        if not isinstance(pipe, DataPipe):
            raise TypeError(
                f"{name}() takes DataPipes, got {type(pipe).__name__}; wrap data with "
                "dp.from_sequence(...) or dp.from_iterable(...)"
            )
    return tuple(pipes)


def _build_branches(pipes: Sequence[DataPipe[Any]], ctx: Context) -> list[Node[Any]]:
    # Each branch draws its own random stream, even when two branches are the same recipe.
    return [pipe.build(ScopedContext(ctx, branch)) for branch, pipe in enumerate(pipes)]


class Concat(DataPipe[Any]):
    """All items of the first pipe, then of the second, ..."""

    name = "concat"

    def describe_step(self) -> str:
        return f"concat({len(self.inputs)} pipes)"

    def consumer_length(self, ctx: Context) -> int | None:
        lengths = [pipe.consumer_length(ctx) for pipe in self.inputs]
        return None if None in lengths else sum(lengths)  # type: ignore[arg-type]

    def _build(self, ctx: Context) -> Node[Any]:
        return ConcatNode(_build_branches(self.inputs, ctx))


class Zip(DataPipe[Any]):
    """Tuples with one item of each pipe; ends with the shortest."""

    name = "zip"

    def describe_step(self) -> str:
        return f"zip({len(self.inputs)} pipes)"

    def consumer_length(self, ctx: Context) -> int | None:
        lengths = [pipe.consumer_length(ctx) for pipe in self.inputs]
        return None if None in lengths else min(lengths)  # type: ignore[type-var]

    def _build(self, ctx: Context) -> Node[Any]:
        return ZipNode(_build_branches(self.inputs, ctx))


class Mix(DataPipe[Any]):
    """Items drawn at random from several pipes with given weights."""

    name = "mix"

    def describe_step(self) -> str:
        return f"mix({len(self.inputs)} pipes, {self._own_args()})"

    def __repr__(self) -> str:
        pipes = ", ".join(repr(pipe) for pipe in self.inputs)
        return f"dp.mix([{pipes}], {self._own_args()})"

    def _build(self, ctx: Context) -> Node[Any]:
        return MixNode(
            _build_branches(self.inputs, ctx),
            self.kwargs["weights"],
            ctx,
            self._key(),
            seed=self.kwargs.get("seed"),
            stop=self.kwargs["stop"],
        )


def concat(*pipes: DataPipe[Any]) -> DataPipe[Any]:
    """Chain pipes end to end: ``dp.concat(dp.range(2), dp.range(1))`` yields 0, 1, 0."""
    return Concat(*_pipes("concat", pipes))


def zip(*pipes: DataPipe[Any]) -> DataPipe[tuple[Any, ...]]:  # noqa: A001
    """Pair items up: ``dp.zip(dp.range(2), dp.from_sequence("ab"))`` yields (0, 'a'), (1, 'b').

    Ends when the shortest pipe ends.
    """
    return Zip(*_pipes("zip", pipes))


def mix(
    pipes: Sequence[DataPipe[Any]],
    weights: Sequence[float],
    seed: int | None = None,
    *,
    stop: str = "all_exhausted",
) -> DataPipe[Any]:
    """Interleave pipes by drawing each next item from pipe i with probability ~ weights[i].

    Stop rule (``stop``):

    * ``"all_exhausted"`` (default): a pipe that runs out leaves the draw and
      the others' weights are renormalized; the mix ends when every pipe is
      exhausted, so each item of each pipe appears exactly once.
    * ``"first_exhausted"``: the mix ends as soon as a drawn pipe is empty,
      keeping the proportions exact.

    The draws are seeded by (``seed`` or the Loader's seed, epoch): new every epoch.

    >>> import datapipes as dp
    >>> mixed = dp.mix([dp.range(100), dp.range(100, 110)], weights=[0.9, 0.1])
    """
    pipes = _pipes("mix", pipes)
    weights = check_mix_args(len(pipes), weights, stop)
    kwargs: dict[str, Any] = {"weights": weights, "stop": stop}
    if seed is not None:
        kwargs["seed"] = seed
    return Mix(*pipes, **kwargs)
