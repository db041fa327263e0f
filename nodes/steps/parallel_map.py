"""A map that runs its function on a pool of threads or processes."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import (
    FIRST_COMPLETED,
    Executor,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from time import perf_counter
from typing import Any, NoReturn

from nodes.base import UPSTREAM, Node, NotReset, State
from nodes.errors import InvalidStateError
from nodes.exit_close import close_at_exit, closed
from nodes.origins import OriginReader, reads_ahead
from nodes.state_checks import at, expect_int, expect_ints, expect_keys
from nodes.workers.parent_watch import exit_with_parent

METHODS = ("thread", "process")
_END = object()


#: Upstream's state is snapshotted once per this many reads; a resume re-reads
#: fewer than this many upstream items (plus those an unordered map had returned).
SNAPSHOT_EVERY = 64

#: A task holds enough items for about this much work, so that handing items to
#: the pool (a future, a lock, for processes a pickle round trip) stays a small
#: fraction of the time. Measured on 2 cores: ~20 us per task for threads,
#: ~150 us for processes.
TASK_SECONDS = {"thread": 0.002, "process": 0.01}
MAX_TASK_ITEMS = 256


class TaskFailure:
    """An exception ``fn`` raised in the pool, with its traceback as text (which pickles)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.traceback = "".join(traceback.format_exception(error))

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent from a process pool: an exception that cannot make the round trip (a custom
        # __init__, a lock inside) would break the pool; its type, text and traceback can.
        error = self.error
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:
            error = RuntimeError(
                f"{type(error).__module__}.{type(error).__qualname__}: {_text(error)} (raised "
                "in a map(..., method='process') worker; the exception could not be pickled)"
            )
        return _rebuild_failure, (error, self.traceback)

    def reraise(self) -> NoReturn:
        error = self.error
        if error.__traceback__ is None:  # it came from another process
            error.__cause__ = RemoteTraceback(self.traceback)
        raise error


def _text(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:
        return "<its message could not be formatted>"


def _rebuild_failure(error: BaseException, text: str) -> TaskFailure:
    failure = TaskFailure.__new__(TaskFailure)
    failure.error, failure.traceback = error, text
    return failure


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a parallel map's worker process."""

    def __str__(self) -> str:
        return f"\n{self.args[0]}"


def run_task(
    fn: Callable[[Any], Any], items: list[Any]
) -> tuple[list[Any], float, TaskFailure | None]:
    """``fn`` of each item (up to the first that raises), the seconds it took, and the failure.

    Runs in the pool, so the time is the work alone. The results before a
    failure are returned with it, so they still reach the consumer in order.
    """
    start = perf_counter()
    results: list[Any] = []
    try:
        results.extend(map(fn, items))
    except BaseException as error:  # KeyboardInterrupt in fn too: re-raised in the consumer
        return results, perf_counter() - start, TaskFailure(error)
    return results, perf_counter() - start, None


def check_parallel_map(fn: Callable[[Any], Any], num_workers: int, method: str) -> None:
    """Raise a helpful error for arguments a parallel map cannot run with."""
    if type(num_workers) is not int or num_workers < 1:
        raise ValueError(f"map num_workers must be an int >= 1, got {num_workers!r}")
    if method not in METHODS:
        raise ValueError(f"map method must be 'thread' or 'process', got {method!r}")
    if method == "process":
        try:
            pickle.dumps(fn)
        except Exception as error:
            raise TypeError(
                f"map(..., method='process') sends its function to other processes, but "
                f"{getattr(fn, '__qualname__', fn)!r} cannot be pickled ({error}). Define it at "
                "module level (not a lambda or a nested function), or use method='thread'."
            ) from error


class ParallelMapNode(Node):
    """Applies ``fn`` to every item on ``num_workers`` threads or processes.

    The calling thread reads upstream and hands items to the pool in tasks
    of one or more items (sized from the measured time of ``fn`` so that a
    task is about 2 ms of work for threads, 10 ms for processes), keeping at
    most ``2 * num_workers`` tasks in flight: memory stays bounded however
    slow the consumer.

    * ``ordered=True`` (default): items come out in upstream order, the same
      stream as a plain ``map``; resume is exact.
    * ``ordered=False``: each task's results come out as soon as they are
      ready, so one slow item does not hold up the others. A resume neither
      loses nor repeats an item, but the order after the resume may differ
      from the uninterrupted run's; so a downstream node that resumes by
      re-reading its input would skip the wrong items (the recipe layer
      refuses that: ``datapipes.placement.check_replay_order``).

    State: ``{UPSTREAM: upstream state at a snapshot, "skip": k, "done": [...]}``.
    Upstream's state is snapshotted once every ``SNAPSHOT_EVERY`` reads, not
    per item; a resume restores the snapshot and re-reads the first ``skip``
    items and the ``done`` ones (returned out of order before the checkpoint)
    *without* calling ``fn`` on them: fewer than ``SNAPSHOT_EVERY`` plus the
    items in flight. Errors raised by ``fn`` surface here with their
    traceback, at the item's place in the stream (from a process, an
    exception that cannot be pickled arrives as a ``RuntimeError`` naming its
    type and text).

    ``busy_seconds`` is the time ``fn`` ran, summed over the pool.
    """

    kind = "parallel map"
    elastic = "buffer"

    def __init__(
        self,
        upstream: Node,
        fn: Callable[[Any], Any],
        num_workers: int,
        *,
        method: str = "thread",
        ordered: bool = True,
    ) -> None:
        super().__init__(upstream)
        check_parallel_map(fn, num_workers, method)
        if method == "process" and multiprocessing.current_process().daemon:
            raise RuntimeError(
                "map(..., method='process') cannot start processes inside a DataLoader worker "
                "(daemonic processes may not have children). The Loader's num_workers already "
                "runs the pipeline in several processes: use method='thread' here, or drop "
                "num_workers from the map and raise the Loader's num_workers."
            )
        self._up = upstream
        self._fn = fn
        self._num_workers = num_workers
        self._method = method
        self._ordered = ordered
        self._max_tasks = 2 * num_workers
        self._task_items = 1
        self._pool: Executor | None = None
        self._in_flight: deque[tuple[list[int], Future[Any]]] = deque()
        self._it: Iterator[Any] = NotReset(self)
        self.busy_seconds = 0.0
        self._calls = 0
        self._inline = False  # converting for another topology: no pool, upstream order
        self._held: list[Any] = []

    # ----- positions --------------------------------------------------------------
    def reset(self, state: State | None = None) -> None:
        self._drop_in_flight()
        self._up.reset(None if state is None else state[UPSTREAM])
        self._src = iter(self._up)
        skip = 0 if state is None else int(state["skip"])
        done = set() if state is None else {int(n) for n in state["done"]}
        # Items are numbered by upstream reads since the snapshot at number 0.
        start = self._up.state_dict() if state is None else state[UPSTREAM]
        self._snaps: dict[int, State] = {0: start}
        self._read = 0
        self._already_returned = done  # to re-read without calling fn or returning them
        self._returned = set(done)  # returned numbers above the contiguous prefix
        self._prefix = 0  # every item numbered below this has been returned
        self._exhausted = False
        for _ in range(skip):
            if next(self._src, _END) is _END:  # a valid state never skips past the end
                raise InvalidStateError("skip", f"at most {self._read} (the items left)", skip)
            self._read += 1
        self._prefix = skip
        self._advance_prefix()
        self._it = self._results()
        self._held = []
        if self._inline:
            self._settle()
            self._it = map(self._fn, self._unreturned())

    # ----- elastic resume (nodes.elastic) -------------------------------------------------
    def begin_conversion(self) -> None:
        self._inline = True

    def _settle(self) -> None:
        """Read up to the last item returned out of order; note the ones not returned."""
        last = max(self._already_returned, default=-1)
        while self._read <= last:
            number = self._read
            if next(self._src, _END) is _END:
                raise InvalidStateError("done", f"numbers below {number} (the items left)", last)
            self._read += 1
            if number in self._already_returned:
                self._already_returned.discard(number)
            else:
                self._held.append(self._up.last_origin())

    def _unreturned(self) -> Iterator[Any]:
        for item in self._src:
            number, self._read = self._read, self._read + 1
            if number in self._already_returned:
                self._already_returned.discard(number)
                continue
            yield item

    def last_origin(self) -> Any:
        return self._up.last_origin()  # inline: the item just mapped is upstream's last

    def origin_reader(self) -> OriginReader:
        raise reads_ahead(self)

    def in_flight(self) -> list[Any]:
        """The items after the first one not returned that an unordered map had not returned."""
        return list(self._held)

    def _mark_returned(self, number: int) -> None:
        self._returned.add(number)
        self._advance_prefix()

    def _advance_prefix(self) -> None:
        """Move the prefix past the numbers returned right after it."""
        returned, prefix = self._returned, self._prefix
        while prefix in returned:
            returned.discard(prefix)
            prefix += 1
        self._prefix = prefix

    def state_dict(self) -> State:
        prefix = self._prefix
        base = max(n for n in self._snaps if n <= prefix)
        return {
            UPSTREAM: self._snaps[base],
            "skip": prefix - base,
            "done": sorted(n - base for n in self._returned),
        }

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {UPSTREAM, "skip", "done"})
        skip = expect_int(state, "skip", path)
        # Items returned beyond the contiguous prefix: after it, each once, in order.
        done = expect_ints(state, "done", path, skip + 1, unique=True)
        if done != sorted(done):
            raise InvalidStateError(at(path, "done"), "item numbers in increasing order", done)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))

    # ----- the pool ---------------------------------------------------------------
    def _start_pool(self) -> Executor:
        if self._method == "thread":
            return ThreadPoolExecutor(self._num_workers, thread_name_prefix="datapipes-map")
        # The workers would outlive a killed main process (see nodes.workers.parent_watch). They are
        # forked or spawned by the thread that submits, this one.
        context = multiprocessing.get_context()
        parent = None if context.get_start_method() == "forkserver" else os.getpid()
        main_thread = threading.current_thread() is threading.main_thread()
        return ProcessPoolExecutor(
            self._num_workers,
            mp_context=context,
            initializer=exit_with_parent,
            initargs=(parent, main_thread),
        )

    def _fill(self) -> None:
        """Read upstream and submit tasks until ``2 * num_workers`` are in the pool."""
        pool = self._pool
        if pool is None:
            pool = self._pool = self._start_pool()
            close_at_exit(self)
        in_flight, snaps, src = self._in_flight, self._snaps, self._src
        while len(in_flight) < self._max_tasks and not self._exhausted:
            numbers: list[int] = []
            items: list[Any] = []
            size = self._task_items
            while len(items) < size:
                number = self._read
                if number % SNAPSHOT_EVERY == 0 and number not in snaps:
                    snaps[number] = self._up.state_dict()
                item = next(src, _END)
                if item is _END:
                    self._exhausted = True
                    break
                self._read = number + 1
                if number in self._already_returned:
                    self._already_returned.discard(number)
                    continue
                numbers.append(number)
                items.append(item)
            if items:
                in_flight.append((numbers, pool.submit(run_task, self._fn, items)))

    def _results(self) -> Iterator[Any]:
        in_flight = self._in_flight
        while True:
            self._fill()
            if not in_flight:
                return
            numbers, future = in_flight.popleft() if self._ordered else self._first_done()
            results, seconds, failure = future.result()
            self._learn_task_size(len(results), seconds)
            for number, result in zip(numbers, results):
                self._mark_returned(number)
                yield result
            if failure is not None:
                failure.reraise()
            self._forget_old_snapshots()

    def _learn_task_size(self, count: int, seconds: float) -> None:
        self.busy_seconds += seconds
        self._calls += count
        per_item = self.busy_seconds / self._calls
        target = TASK_SECONDS[self._method]
        self._task_items = max(1, min(MAX_TASK_ITEMS, int(target / per_item) if per_item else 1))

    def _first_done(self) -> tuple[list[int], Future[Any]]:
        in_flight = self._in_flight
        for entry in in_flight:
            if entry[1].done():
                break
        else:
            wait([future for _, future in in_flight], return_when=FIRST_COMPLETED)
            entry = next(e for e in in_flight if e[1].done())
        in_flight.remove(entry)
        return entry

    def _forget_old_snapshots(self) -> None:
        snaps = self._snaps
        if len(snaps) > 2:
            keep = max(n for n in snaps if n <= self._prefix)
            for number in [n for n in snaps if n < keep]:
                del snaps[number]

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def _drop_in_flight(self) -> None:
        for _, future in self._in_flight:
            future.cancel()
        self._in_flight = deque()

    def close(self) -> None:
        if self._in_flight:  # else no module global is used (see nodes.exit_close)
            self._drop_in_flight()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
            closed(self)
        super().close()
