"""A Loader as a trainer's training data: the trainer's own checkpoint resumes it exactly.

Trainers meet a data loader in three ways that a plain :class:`datapipes.Loader`
does not expect, and :class:`TrainerLoader` answers each:

- they **fetch ahead**: Lightning's fetcher holds one batch it has not used yet
  when it saves a checkpoint, so the Loader's own position counts one batch too
  many and a resume would skip it. ``fetched_ahead=1`` keeps the state of the
  batches the trainer used.
- they **call** ``iter()`` **to look**: Lightning calls it once while setting up,
  and throws the iterator away. Here nothing starts (no epoch, no workers)
  until the first batch is asked for.
- they **save rank 0's checkpoint** and load it on every rank. Under a process
  group of several ranks, ``state_dict()`` gathers every rank's state (a
  collective: every rank calls it at the same step, as trainers do) and returns
  the merged state, which every rank loads, and which resumes on another number
  of ranks too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from datapipes.loader.loader import Loader
from datapipes.resume import merge_states


class TrainerLoader:
    """``loader`` as a trainer's training data (see the module doc).

    ``fetched_ahead``: the batches the trainer fetches before it uses them (1 for
    PyTorch Lightning; 0 for a plain loop, Accelerate and the HF ``Trainer``).
    ``gather``: whether ``state_dict()`` gathers every rank's state (default:
    when ``torch.distributed`` runs several ranks).

    >>> import datapipes as dp
    >>> data = dp.TrainerLoader(dp.Loader(dp.range(6).batch(2)), fetched_ahead=1)
    >>> batches = iter(data)
    >>> first, second = next(batches), next(batches)  # the trainer used the first only
    >>> resumed = dp.TrainerLoader(dp.Loader(dp.range(6).batch(2)))
    >>> resumed.load_state_dict(data.state_dict())
    >>> [b.tolist() for b in resumed]
    [[2, 3], [4, 5]]
    """

    def __init__(
        self, loader: Loader, *, fetched_ahead: int = 0, gather: bool | None = None
    ) -> None:
        if not isinstance(loader, Loader):
            raise TypeError(f"TrainerLoader takes a dp.Loader, got {type(loader).__name__}")
        if isinstance(fetched_ahead, bool) or not isinstance(fetched_ahead, int):
            raise TypeError(f"fetched_ahead must be an int >= 0, got {fetched_ahead!r}")
        if fetched_ahead < 0:
            raise ValueError(f"fetched_ahead must be >= 0, got {fetched_ahead}")
        self.loader = loader
        self.fetched_ahead = fetched_ahead
        self.gather = gather
        self._run: _Run | None = None

    def __iter__(self) -> Iterator[Any]:
        self._run = _Run(self.loader, self.fetched_ahead)
        return self._run

    def state_dict(self) -> dict[str, Any]:
        """The position after the batches the trainer used; under several ranks (with
        ``gather``) every rank's, merged. Collective then: call it on every rank."""
        run = self._run
        state = self.loader.state_dict() if run is None else run.used_state()
        if not self._gathers():
            return state
        import torch.distributed as dist

        states: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(states, state)
        return merge_states(states)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (this rank's, or every rank's merged)."""
        self.loader.load_state_dict(state)
        self._run = None

    def _gathers(self) -> bool:
        if self.gather is not None:
            return self.gather
        import torch.distributed as dist

        return (
            dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
            and self.loader.world_size > 1
        )

    def close(self) -> None:
        """Close the Loader (its workers, files and threads)."""
        self.loader.close()

    def __repr__(self) -> str:
        return f"TrainerLoader({self.loader!r}, fetched_ahead={self.fetched_ahead})"


class _Run:
    """One epoch's batches, started at the first ``next``, with the states of the last few."""

    def __init__(self, loader: Loader, ahead: int) -> None:
        self._loader = loader
        self._ahead = ahead
        self._it: Iterator[Any] | None = None
        self._states: deque[Any] = deque(maxlen=ahead + 1)  # after 0, 1, ... batches
        self._ended = False

    def __iter__(self) -> _Run:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self._it = iter(self._loader)
            if self._ahead:
                self._states.append(self._loader.state_dict())
        try:
            batch = next(self._it)
        except StopIteration:
            self._ended = True
            raise
        if self._ahead:
            self._states.append(self._loader.state_dict())
        return batch

    def used_state(self) -> Any:
        """The state after the batches used: all fetched but the last ``ahead``, or
        every one once the epoch has ended (the trainer has used them all by then)."""
        if self._ended or not self._ahead or self._it is None:
            return self._loader.state_dict()
        return self._states[0]
