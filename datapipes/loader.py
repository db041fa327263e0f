"""The Loader: epochs, seeds, and checkpoints of a whole pipeline."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from itertools import chain
from typing import Any

from datapipes.pipe import DataPipe
from datapipes.topology import resolve_rank
from nodes import Context, Node
from nodes.errors import ErrorPolicy

STATE_VERSION = 1


class StateMismatchError(ValueError):
    """A checkpoint does not belong to this Loader's recipe or topology."""


class Loader:
    """Runs a recipe epoch by epoch, with checkpoints that resume exactly.

    Iterating the Loader runs one epoch; iterating it again runs the next,
    with a new shuffle. ``state_dict()`` may be taken at any point;
    ``load_state_dict()`` on a fresh Loader over the same recipe (in this or
    another process) continues the interrupted epoch item for item, and the
    epochs after it follow as they would have. The Loader satisfies the
    ``torch.distributed.checkpoint`` ``Stateful`` protocol.

    >>> import datapipes as dp
    >>> loader = dp.Loader(dp.range(6).shuffle().batch(2), seed=0)
    >>> first = [b.tolist() for b in loader]     # epoch 0
    >>> second = [b.tolist() for b in loader]    # epoch 1: another order
    >>> sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(6))
    True

    ``rank``/``world_size`` default to ``torch.distributed`` when it is
    initialized, else to the ``RANK``/``WORLD_SIZE`` environment variables;
    each rank then reads its own share of the data.
    """

    def __init__(
        self,
        pipe: DataPipe[Any],
        seed: int = 0,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int = 0,
    ) -> None:
        if not isinstance(pipe, DataPipe):
            raise TypeError(
                f"Loader takes a DataPipe recipe, got {type(pipe).__name__}; build one with "
                "dp.from_sequence(...), dp.range(...) or dp.from_iterable(...)"
            )
        if num_workers != 0:
            raise NotImplementedError(
                "worker processes are not available yet: use num_workers=0 (the pipeline "
                "runs in this process)"
            )
        self.pipe = pipe
        self._fingerprint = pipe.fingerprint()
        self._steps = pipe.steps()
        self.seed = int(seed)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.num_workers = num_workers
        self._context = Context(rank=self.rank, world_size=self.world_size, seed=self.seed)
        self._root: Node[Any] | None = None
        self._next_epoch = 0
        self._pending: dict[str, Any] | None = None
        self._running_epoch: int | None = None
        self._run_id = 0

    # ----- iteration -----------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch that is running, or the one the next iteration will run."""
        return self._next_epoch if self._running_epoch is None else self._running_epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its start."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._next_epoch = int(epoch)
        self._pending = None
        self._running_epoch = None

    def __iter__(self) -> Iterator[Any]:
        root = self._root
        if root is None:
            root = self._root = self.pipe.build(self._context)
        epoch = self._next_epoch
        self._context.epoch = epoch
        root.reset(self._pending)
        self._pending = None
        self._running_epoch = epoch
        self._next_epoch = epoch + 1
        self._run_id += 1
        return self._run(root, self._run_id)

    def _run(self, root: Node[Any], run_id: int) -> Iterator[Any]:
        items = iter(root)
        if hasattr(items, "close"):
            # `yield from` forwards close() to an iterator that has one. When an abandoned
            # iterator of an earlier epoch is collected, that would close the graph the
            # current epoch is reading; so only this run's own exit closes it, below.
            items = chain(items)  # the same items, through an iterator that has no close()
        try:
            yield from items
        except GeneratorExit:
            if self._run_id == run_id:  # abandoned mid-epoch: free threads and files now
                root.close()
            raise
        if self._run_id == run_id:
            self._running_epoch = None

    def skipped(self) -> dict[str, int]:
        """Bad records skipped so far in this epoch, per step with ``on_error="skip"``.

        Keys are the steps (as in the recipe's ``repr``); counts survive a
        checkpoint and resume, and start again at 0 with each epoch.

        >>> import datapipes as dp
        >>> loader = dp.Loader(dp.from_sequence([{"cls": b"1"}, {"cls": b"x"}])
        ...                    .decode(on_error="skip"))
        >>> import warnings; warnings.simplefilter("ignore")
        >>> list(loader), loader.skipped()
        ([{'cls': 1}], {"dp.from_sequence(<list of 2>).decode(on_error='skip')": 1})
        """
        counts: dict[str, int] = {}
        for node in _walk(self._root):
            policy = getattr(node, "errors", None)
            if isinstance(policy, ErrorPolicy) and policy.skip:
                counts[policy.step] = counts.get(policy.step, 0) + policy.count
        return counts

    def close(self) -> None:
        """Stop background threads and release resources; the Loader can be iterated again.

        A mid-epoch position survives: ``state_dict()`` after ``close()`` is the
        state before it, and the next iteration continues the interrupted epoch.
        """
        if self._root is not None:
            if self._running_epoch is not None:
                self._pending = self._root.state_dict()
                self._next_epoch = self._running_epoch
            self._root.close()
            self._root = None
        self._running_epoch = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- checkpoints ---------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position of the whole pipeline: plain data (json / ``weights_only`` safe)."""
        running = self._running_epoch is not None and self._root is not None
        # Loaded but not iterated yet: the loaded position is still the position.
        node = self._root.state_dict() if running else self._pending  # type: ignore[union-attr]
        return {
            "version": STATE_VERSION,
            "fingerprint": self._fingerprint,
            "steps": list(self._steps),
            "topology": {
                "rank": self.rank,
                "world_size": self.world_size,
                "num_workers": self.num_workers,
            },
            "seed": self.seed,
            "epoch": self._running_epoch if running else self._next_epoch,
            "node": node,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration resumes the saved epoch where it stopped."""
        self._check(state)
        self._next_epoch = int(state["epoch"])
        self._pending = state["node"]
        self._running_epoch = None

    def _check(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise StateMismatchError(
                f"not a datapipes Loader state of version {STATE_VERSION} (found {found!r})"
            )
        if state["fingerprint"] != self._fingerprint:
            raise StateMismatchError(
                "this checkpoint was taken with a different recipe:\n"
                + _explain_difference(list(state["steps"]), self._steps)
            )
        topology = state["topology"]
        ours = {"rank": self.rank, "world_size": self.world_size, "num_workers": self.num_workers}
        if topology != ours:
            raise StateMismatchError(
                f"this checkpoint was taken with topology {topology}, but this Loader runs "
                f"{ours}; resume with the same rank, world size and number of workers"
            )
        if state["seed"] != self.seed:
            raise StateMismatchError(
                f"this checkpoint was taken with seed={state['seed']}, this Loader has "
                f"seed={self.seed}; the resumed order would differ. Pass seed={state['seed']}."
            )


def _walk(node: Node[Any] | None) -> Iterator[Node[Any]]:
    """Every node of a built graph, upstream ones included."""
    if node is not None:
        yield node
        for upstream in node.inputs:
            yield from _walk(upstream)


def _explain_difference(saved: list[str], current: list[str]) -> str:
    lines = []
    for line in difflib.unified_diff(saved, current, "checkpoint recipe", "this recipe", n=1):
        if not line.startswith("@@"):
            lines.append("  " + line.rstrip("\n"))
    return "\n".join(lines)
