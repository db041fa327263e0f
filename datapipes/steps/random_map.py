"""The recipe step for random transforms that resume exactly: ``pipe.random_map(fn)``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from datapipes.pipe import DataPipe
from nodes import Context, Node
from nodes.steps.random_map import GLOBAL_RNGS, RandomMapNode, global_rngs


class RandomMap(DataPipe[Any]):
    """``fn(item, rng)`` (or ``fn(item)`` under seeded global RNGs) for every item.

    See :meth:`DataPipe.random_map` and :class:`nodes.steps.random_map.RandomMapNode`.
    """

    name = "random_map"
    consumer_length = DataPipe._upstream_length

    def __init__(
        self,
        upstream: DataPipe[Any],
        fn: Callable[..., Any],
        *,
        global_rng: bool | str | Sequence[str] = False,
        seed: int | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"random_map() takes a function, got {type(fn).__name__}")
        names = global_rngs(global_rng)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"random_map seed must be an int, got {seed!r}")
        kwargs: dict[str, Any] = {}
        if names:  # True when it is all of them; else the names, as "torch,numpy"
            kwargs["global_rng"] = True if names == GLOBAL_RNGS else ",".join(names)
        if seed is not None:
            kwargs["seed"] = seed
        super().__init__(upstream, args=(fn,), **kwargs)

    def _build(self, ctx: Context) -> Node[Any]:
        return RandomMapNode(
            self.inputs[0].build(ctx),
            self.args[0],
            ctx,
            self._key(),
            seed=self.kwargs.get("seed"),
            global_rng=self.kwargs.get("global_rng", False),
        )
