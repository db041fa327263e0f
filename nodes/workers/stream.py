"""Items computed in DataLoader worker processes, as a node of the main-process graph."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from nodes.adapters import torchdata
from nodes.base import Node, NotReset, State
from nodes.errors import InvalidStateError
from nodes.exit_close import close_at_exit, closed
from nodes.origins import OriginReader, reads_ahead
from nodes.workers.bundles import FailedInBundle, bundled
from nodes.workers.dataloader import (
    SNAPSHOT_EVERY,
    WorkerDiedError,
    died_as_they_started,
    signal_name,
    start_method,
    stateful_dataloader,
    without_stats,
)
from nodes.workers.states import validate_workers_state


class WorkerStreamNode(Node):
    """Runs a dataset in ``num_workers`` processes through torchdata's ``StatefulDataLoader``.

    ``dataset`` is a :class:`datapipes.TorchDataset` (an ``IterableDataset``
    that shards itself by worker and resumes exactly); ``epoch()`` gives the
    epoch to run at each ``reset``. Workers take turns: item ``k`` comes from
    worker ``k mod num_workers`` while all of them have items, then from the
    ones that still do, the same order every run.

    State: the ``StatefulDataLoader`` state: every worker's dataset state as
    of the last snapshot (taken every ``SNAPSHOT_EVERY`` items), which worker
    is next, and how many items were returned since the snapshot; a resume
    restores the snapshot and replays those items, so it continues exactly
    after the last item *returned* here (items the workers had computed ahead
    are computed again). Errors in a worker are raised here with the worker's
    traceback; a worker that dies ends the epoch with an error naming it.

    ``dataset_for_epoch(epoch)``: the dataset new workers start with for an
    epoch (default: ``dataset`` each time), for what they read that differs by
    epoch (a Loader's units, a resumed epoch's shares).

    ``items_per_transfer=K > 1`` or ``"auto"``: the dataset sends lists of up
    to ``K`` items (``"auto"``: up to 16, fewer when they are big; see
    :mod:`nodes.workers.bundles`), dealt out here one by one, so the
    DataLoader's steps count bundles and the order is runs of a bundle per
    worker in turn. The state adds ``"taken"``: items of the current bundle
    already returned, with the DataLoader's state as of *before* that bundle
    (a resume computes the bundle again and skips them); ``0`` with the state
    after the last bundle when it was used up; and ``"items_per_transfer"``:
    ``K`` or ``"auto"`` (states saved without it are read as before).
    """

    kind = "workers"

    #: its input runs elsewhere (a thread, worker processes): see nodes.observe.stats
    upstream_in_background = True

    def __init__(
        self,
        dataset: Any,
        num_workers: int,
        epoch: Callable[[], int],
        *,
        items_per_transfer: int | str = 1,
        dataset_for_epoch: Callable[[int], Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if num_workers < 1:
            raise ValueError(f"WorkerStreamNode needs num_workers >= 1, got {num_workers}")
        self._per_transfer = items_per_transfer
        self._bundles = bundled(items_per_transfer)
        # With bundles: the current one, how many of its items were returned, the
        # DataLoader's state before it, and items to skip in the first one after a resume.
        self._bundle: list[Any] | None = None
        self._taken = 0
        self._before: Any = None
        self._skip = 0
        self._dataset = dataset
        # What new workers start with for an epoch (what they read may differ by epoch).
        self._dataset_for_epoch = dataset_for_epoch
        self._num_workers = num_workers
        self._epoch = epoch
        self._options = options
        self._persistent = bool(options.get("persistent_workers"))
        self._loader: Any = None
        self._it: Iterator[Any] = NotReset(self)
        self._workers: Any = None  # the DataLoader iterator that owns the worker processes
        self._finished_epoch: int | None = None
        self._ended = False
        self._closed_state: State | None = None
        self._final_states: list[Any] = []
        self._died_idle = ""  # persistent workers found dead at reset, reported at next()
        self._exits_seen = 0  # torchdata.child_exits when the workers were last checked
        self._returned = 0  # items returned in this epoch (a resume counts the ones before)
        self._last_good: State | None = None  # the DataLoader's state at a multiple of that

    def reset(self, state: State | None = None) -> None:
        epoch = self._epoch()
        self._start_or_reuse_workers(epoch, state)
        self._finished_epoch = None
        self._closed_state = None
        self._final_states = []
        self._ended = state is not None and bool(state.get("ended"))
        if state is not None and not self._ended:
            self._loader.load_state_dict(state["dataloader"])
        self._begin_iteration(epoch, state)
        self._restore_counts(state)

    def _start_or_reuse_workers(self, epoch: int, state: State | None) -> None:
        # Persistent workers go on to the next epoch by themselves (each copy of the dataset
        # counts its passes); a resume or any other epoch needs fresh ones.
        reuse = state is None and self._workers is not None and self._finished_epoch == epoch - 1
        # A persistent worker killed while it waited is reported at the first next(); the
        # epoch starts in fresh workers, so the state then is this epoch's start.
        self._died_idle = self._dead_workers() if reuse else ""
        if reuse and not self._died_idle:
            return
        self._stop_workers()
        if self._dataset_for_epoch is not None:
            self._dataset = self._dataset_for_epoch(epoch)
        self._dataset.set_epoch(epoch)
        self._loader = stateful_dataloader(self._dataset, self._num_workers, epoch, **self._options)

    def _begin_iteration(self, epoch: int, state: State | None) -> None:
        try:
            self._it = iter(()) if self._ended else iter(self._loader)
        except BaseException as error:
            # Raised as the DataLoader started: a worker resumed at ``state`` refused it (a
            # position its data does not have), or a persistent worker died just as the
            # epoch began. The node keeps the position it was given: its close() and
            # state_dict() start no workers (torch would fast-forward new ones to raise
            # the same again).
            self._loader = None
            if state is not None:
                self._closed_state = dict(state)
            dead = self._dead_workers() if isinstance(error, RuntimeError) else ""
            if not dead and isinstance(error, RuntimeError):  # the new workers torch started
                dead = died_as_they_started(str(error))
            self._stop_workers()
            torchdata.shutdown_failed_start(error)
            if not dead:
                raise
            method = start_method(self._options.get("multiprocessing_context"))
            main_module = (
                ""
                if method == "fork"
                else f" Workers started with {method!r} first import the script's main "
                "module: if their output above says 'An attempt has been made to start a new "
                "process before the current process has finished its bootstrapping phase', "
                "run the Loader under `if __name__ == '__main__':`."
            )
            raise WorkerDiedError(
                f"DataLoader {dead} died as epoch {epoch} began, before it read anything; "
                "nothing was lost: iterate again to run the epoch in new workers." + main_module
            ) from error
        if not self._ended:
            self._workers = self._it
            close_at_exit(self)
            torchdata.watch_deaths(self._it)  # reported by __next__, never from user code
        self._exits_seen = torchdata.child_exits

    def _restore_counts(self, state: State | None) -> None:
        """The counts of items returned and of the bundle in hand, as of ``state``."""
        self._last_good = None
        self._returned = 0
        self._bundle, self._taken, self._before, self._skip = None, 0, None, 0
        if state is None or self._ended:
            return
        if state.get("taken"):
            self._before, self._skip = state["dataloader"], state["taken"]
        summary = torchdata.snapshot_summary(state["dataloader"])
        self._returned = summary["snapshot_step"] + summary["steps_since"]

    def __next__(self) -> Any:
        if self._bundles:
            return self._next_of_bundle()
        return self._next_transfer()

    def _next_of_bundle(self) -> Any:
        """The next item of the current bundle, or of the next one the workers send."""
        if self._bundle is None or self._taken >= len(self._bundle):
            self._bundle = None
            if self._skip:  # resumed inside a bundle: it is computed again, its head skipped
                before, taken = self._before, self._skip
            else:
                before = None if self._ended else self._loader.state_dict()
                taken = 0
            try:
                bundle = self._next_transfer()
            except StopIteration:
                if self._skip:
                    raise self._past_the_data() from None
                raise
            self._skip = 0
            if taken >= len(bundle):
                raise self._past_the_data(len(bundle))
            self._bundle, self._before, self._taken = bundle, before, taken
        item = self._bundle[self._taken]
        if isinstance(item, FailedInBundle):  # the worker raised after the items before it
            position = self._position()  # a resume computes the bundle again: raised again
            self._bundle = None
            self._stop_workers()
            self._closed_state = position
            raise item.error
        self._taken += 1
        return item

    def _past_the_data(self, size: int = 0) -> InvalidStateError:
        taken, self._skip = self._skip, 0
        self._closed_state = {"ended": False, "dataloader": self._before, **self._bundled(taken)}
        self._stop_workers()
        return InvalidStateError(
            "taken",
            f"fewer items than the resumed bundle holds ({size})",
            taken,
            note="the workers sent fewer items after the saved position than it says were "
            "taken; the state does not belong to this recipe and data",
        )

    def _next_transfer(self) -> Any:
        if self._exits_seen != torchdata.child_exits or self._died_idle:
            self._check_workers()  # a child process ended since the last look: ours?
        if not self._returned % SNAPSHOT_EVERY and not self._ended:
            self._last_good = self._loader.state_dict()  # where a resume could restart
        try:
            item = next(self._it)
        except StopIteration:
            if not self._ended:  # the first time only; an ended epoch stays ended
                self._end_epoch()
            raise
        except BaseException as error:
            self._fail(error, self._dead_workers() if isinstance(error, RuntimeError) else "")
        self._returned += 1  # nothing between here and the return can raise or run a handler
        return item

    def _check_workers(self) -> None:
        self._exits_seen = torchdata.child_exits
        dead = self._died_idle or self._dead_workers()
        if dead and not self._ended:
            self._fail(None, dead)

    def _fail(self, error: BaseException | None, dead: str) -> NoReturn:
        """End the epoch after ``error`` (or workers found ``dead``): keep the position of
        the last item returned, stop the workers now rather than at garbage collection."""
        idle, self._died_idle = self._died_idle, ""
        self._closed_state = self._position()
        self._stop_workers()
        if not dead:
            assert error is not None
            raise error
        if idle:
            raise WorkerDiedError(
                f"DataLoader {dead} died while waiting between epochs (persistent_workers="
                f"True), before epoch {self._epoch()} read anything; nothing was lost. "
                "Common causes: the machine ran out of memory (the kernel's OOM killer sends "
                "SIGKILL), or something killed it. Load the Loader's state_dict() (taken "
                f"now, it restarts epoch {self._epoch()}) or the last checkpoint to go on."
            ) from error
        raise WorkerDiedError(
            f"DataLoader {dead} died during epoch {self._epoch()}; the epoch cannot "
            "continue. Common causes: the machine ran out of memory (the kernel's OOM "
            "killer sends SIGKILL), or native code crashed. Resume from the last checkpoint."
        ) from error

    def _position(self) -> State:
        """The state as of the last item this node returned.

        torch counts an item before it reaches the caller; an exception in between (a
        signal, Ctrl-C) would leave the DataLoader's state one item ahead: then the
        state is rebuilt from its snapshot, or the one ``SNAPSHOT_EVERY`` items back.
        """
        if self._ended or self._loader is None:
            return self.state_dict()
        inside = self._inside_bundle()
        if inside is not None:
            return inside
        taken = self._bundled(0) if self._bundles else {}
        for state in (self._loader.state_dict(), self._last_good):
            at = torchdata.at_step(state, self._returned)
            if at is not None:
                return {"ended": False, "dataloader": without_stats(at), **taken}
        return self.state_dict()

    def _inside_bundle(self) -> State | None:
        """The state in the middle of a bundle: the DataLoader's before it, items taken."""
        if self._skip:
            return {"ended": False, "dataloader": self._before, **self._bundled(self._skip)}
        if self._bundle is not None and self._taken < len(self._bundle):
            before = without_stats(self._before)
            return {"ended": False, "dataloader": before, **self._bundled(self._taken)}
        return None

    def _bundled(self, taken: int) -> State:
        """What a state adds where transfers hold several items: those of the current one
        taken, and how many one holds (so a state whose topology was edited is refused)."""
        return {"taken": taken, "items_per_transfer": self._per_transfer}

    def _end_epoch(self) -> None:
        self._ended = True
        self._final_states = self._received_states(self._it) or []
        if self._persistent:  # the workers wait for the next epoch
            self._finished_epoch = self._epoch()
            self._it = iter(())
        else:
            self._stop_workers()

    def _dead_workers(self) -> str:
        """``"worker 1 (pid 123, killed by SIGKILL)"`` for each worker process that has died."""
        found = []
        for worker_id, process in enumerate(torchdata.worker_processes(self._workers)):
            code = process.exitcode
            if code is None or code == 0:
                continue
            how = f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"
            found.append(f"worker {worker_id} (pid {process.pid}, {how})")
        return ", ".join(found)

    def state_dict(self) -> State:
        if self._closed_state is not None:
            return dict(self._closed_state)
        if self._ended or self._loader is None:
            return {"ended": self._ended}
        state = {"ended": False, "dataloader": without_stats(self._loader.state_dict())}
        if self._bundles:
            return self._inside_bundle() or {**state, **self._bundled(0)}
        return state

    @property
    def dataset(self) -> Any:
        """The dataset the workers run (a :class:`datapipes.TorchDataset`)."""
        return self._dataset

    @property
    def num_workers(self) -> int:
        """How many worker processes run it."""
        return self._num_workers

    @property
    def items_per_transfer(self) -> int | str:
        """How many items a worker sends per DataLoader transfer (1: one at a time; ``K``:
        up to ``K``; ``"auto"``: see :mod:`nodes.workers.bundles`)."""
        return self._per_transfer

    def worker_states(self) -> list[Any]:
        """The latest dataset state each worker sent (``None`` for a worker that sent none).

        Workers send their state near every snapshot and when they run out, so
        mid-epoch this may lag the items returned by up to ``SNAPSHOT_EVERY``;
        after the epoch it is complete.
        """
        received = self._received_states(self._it)
        return received if received is not None else self._final_states

    def _received_states(self, it: Any) -> list[Any] | None:
        return torchdata.latest_worker_states(it, self._num_workers)

    def _stop_workers(self) -> None:
        if self._workers is not None:  # else no module global is used (see nodes.exit_close)
            torchdata.shutdown_workers(self._workers)
            closed(self)
        self._workers = None
        self._finished_epoch = None
        self._it = iter(())

    def validate_state(self, state: Any, path: str = "node") -> None:
        """Refuse a state the workers could not resume: every worker's snapshot is checked
        against the graph that worker builds (in this process, before any worker starts)."""
        every = self._options.get("snapshot_every_n_steps", SNAPSHOT_EVERY)
        epoch = self._epoch()
        dataset = self._dataset
        if self._dataset_for_epoch is not None:  # the one the workers of a resume start with
            dataset = self._dataset_for_epoch(epoch)
        validate_workers_state(
            dataset,
            self._num_workers,
            epoch,
            state,
            path,
            snapshot_every=every,
            max_replay=SNAPSHOT_EVERY - 1,  # a state rebuilt from the last good one (_position)
            items_per_transfer=self._per_transfer,
        )

    def origin_reader(self) -> OriginReader:
        raise reads_ahead(self)

    def close(self) -> None:
        if self._closed_state is None and self._loader is not None:
            self._closed_state = self._position()
            # The workers' last reports (skips, drops, statistics) outlive their processes.
            self._final_states = self._received_states(self._it) or self._final_states
        self._stop_workers()
