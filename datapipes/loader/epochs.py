"""Which epoch a Loader runs next, which one is running, and the position it resumes from."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

#: A graph's position (``Node.state_dict()``): plain data, ``None`` at the start of an epoch.
Position = dict[str, Any] | None


class EpochRun(NamedTuple):
    """One iteration of a Loader: the epoch it runs, where it resumes from, and its id."""

    epoch: int
    resume_from: Position
    id: int


class EpochCursor:
    """The Loader's epoch state machine.

    Between epochs the cursor holds the epoch the next iteration runs and,
    after ``load_state_dict()`` or a ``close()`` mid-epoch, the position that
    epoch resumes from (``None``: from its start). An iteration is an
    :class:`EpochRun`: :meth:`next_run` says what it would be, :meth:`begin`
    makes it the running one once the graph took its position. Each run has
    its own id, so an abandoned iterator of an earlier epoch, when it is
    closed or collected late, can tell (:meth:`is_current`) that it no longer
    owns the graph and leaves the current epoch alone.

    >>> cursor = EpochCursor()
    >>> run = cursor.next_run()
    >>> cursor.begin(run)
    >>> cursor.epoch, cursor.position(lambda: {"at": 3})
    (0, (0, {'at': 3}))
    >>> cursor.finish(run)
    >>> cursor.epoch, cursor.position(lambda: {"at": 3})
    (1, (1, None))
    """

    __slots__ = ("_next", "_running", "_last", "_pending", "_run_id", "_live_run")

    def __init__(self) -> None:
        self._next = 0  # the epoch the next iteration runs
        self._running: int | None = None  # the epoch being iterated, if one is
        self._last = 0  # the epoch that ran last (or runs now): what statistics describe
        self._pending: Position = None  # where the next iteration resumes
        self._run_id = 0  # the id of the current (latest) run
        self._live_run: weakref.ref[Iterator[Any]] | None = None

    @property
    def epoch(self) -> int:
        """The epoch that is running, or the one the next iteration will run."""
        return self._next if self._running is None else self._running

    @property
    def last(self) -> int:
        """The epoch that ran last, or runs now (0 before any)."""
        return self._last

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its start."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._next = int(epoch)
        self._pending = None
        self._running = None

    def restore(self, epoch: int, position: Position) -> None:
        """Make the next iteration resume ``epoch`` at ``position`` (a loaded checkpoint)."""
        self._next = epoch
        self._pending = position
        self._running = None

    def position(self, graph_state: Callable[[], Position] | None) -> tuple[int, Position]:
        """``(epoch, position)`` a checkpoint saves now.

        Mid-epoch that is the running epoch at ``graph_state()`` (the built
        graph's state; ``None`` when there is no graph). Otherwise it is the
        epoch the next iteration runs, at its pending position: a checkpoint
        loaded but not iterated yet is still the position.
        """
        if self._running is not None and graph_state is not None:
            return self._running, graph_state()
        return self._next, self._pending

    def next_run(self) -> EpochRun:
        """The run the next iteration makes; nothing changes until :meth:`begin`."""
        return EpochRun(self._next, self._pending, self._run_id + 1)

    def begin(self, run: EpochRun) -> None:
        """``run`` (from :meth:`next_run`) is now the running epoch; the next one follows it."""
        self._pending = None
        self._running = self._last = run.epoch
        self._next = run.epoch + 1
        self._run_id = run.id

    def watch(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """Remember the current run's iterator (weakly), so :meth:`suspend` can end it."""
        self._live_run = weakref.ref(iterator)
        return iterator

    @property
    def in_use(self) -> bool:
        """Whether an epoch runs and its iterator is still held (a loop is reading it)."""
        live = self._live_run() if self._live_run is not None else None
        return self._running is not None and live is not None

    def is_current(self, run: EpochRun) -> bool:
        """Whether ``run`` is the latest run (not an abandoned iterator of an earlier one)."""
        return run.id == self._run_id

    def finish(self, run: EpochRun) -> None:
        """``run`` went through its epoch to the end; a stale run's end changes nothing."""
        if run.id == self._run_id:
            self._running = None

    def suspend(self, graph_state: Callable[[], Position]) -> None:
        """The graph is closing: keep a mid-epoch position to resume from, end the live iterator.

        The next iteration then continues the interrupted epoch, and an
        iterator kept from before ends instead of going on.
        """
        if self._running is not None:
            self._pending = graph_state()
            self._next = self._running
        run = self._live_run() if self._live_run is not None else None
        if run is not None:
            run.close()
        self._running = None
