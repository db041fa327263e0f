"""A Loader's epoch runs: each begun on its graph, its items delivered, its end recorded.

An iteration of a :class:`datapipes.Loader` is one run of an epoch: the graph
(kept, or built now) is reset to the epoch's start or to the position a resume
left; under dynamic dispatch the consumers get the epoch's units; the items go
through the takeovers' leases, the statistics and the progress bar; the run's
own end (not an abandoned iterator of an earlier epoch) finishes the epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import TYPE_CHECKING, Any

from datapipes.loader.progress import ProgressBar, progress_bar_class
from datapipes.resume.graph_record import node_path
from nodes import Node
from nodes.credentials import scrub_error, scrubbing
from nodes.errors import InvalidStateError
from nodes.exit_close import close_at_exit

if TYPE_CHECKING:
    from datapipes.dispatch.dynamic import DynamicDispatch
    from datapipes.dispatch.takeover import Takeovers
    from datapipes.loader.checkpoints import LoaderCheckpoints
    from datapipes.loader.consumers import RankConsumers
    from datapipes.loader.epoch_stats import LoaderStats
    from datapipes.loader.epochs import EpochCursor, EpochRun
    from datapipes.loader.graph import LoaderGraph
    from datapipes.loader.listings import JobListings
    from datapipes.loader.options import LoaderOptions
    from datapipes.placement import RecipePlan


class EpochRuns:
    """Starts and runs a Loader's epochs (see the module doc)."""

    def __init__(
        self,
        options: LoaderOptions,
        recipe: RecipePlan,
        *,
        graph: LoaderGraph,
        cursor: EpochCursor,
        stats: LoaderStats,
        consumers: RankConsumers,
        listings: JobListings,
        dispatch: DynamicDispatch | None,
        takeovers: Takeovers | None,
        checkpoints: LoaderCheckpoints,
    ) -> None:
        self._options, self._recipe = options, recipe
        self._graph, self._cursor, self._stats = graph, cursor, stats
        self._consumers, self._listings = consumers, listings
        self._dispatch, self._takeovers = dispatch, takeovers
        self._checkpoints = checkpoints

    @scrubbing  # a listing, a store or a file that fails names no URL's password or signature
    def start(self) -> Iterator[Any]:
        """The next epoch's run, begun: what iterating the Loader returns."""
        topology = self._options.topology
        topology.check_against_torch_distributed()  # set up before init_process_group?
        if self._graph.traced_otherwise:
            self._graph.close(self._cursor)  # a trace began or ended: built with (or without) spans
        root = self._graph.current()
        context = self._graph.context
        run = self._cursor.next_run()
        context.epoch = run.epoch
        if self._dispatch is not None:  # this epoch's units, for the rank's consumers
            listings = self._listings.get(context)
            continuing = run.resume_from is not None
            spec = self._dispatch.begin_epoch(run.epoch, listings, continuing=continuing)
            self._consumers.hand_units(spec, context)
        self._stats.new_epoch(root)
        try:
            root.reset(run.resume_from)
        except StopIteration as error:  # a resume replaying past the data (never raw)
            raise InvalidStateError(
                node_path(topology.rank),
                "a position within the epoch's data",
                "?",
                note="resuming it ran out of items",
            ) from error
        self._cursor.begin(run)  # only now: a position the graph refused stays pending
        fresh = None if run.resume_from is not None else root.state_dict()
        self._checkpoints.started(run.epoch, fresh)
        body = self._run(root, run)
        close_at_exit(body)  # an abandoned run held by a global ends before the teardown
        return self._cursor.watch(body)

    def _run(self, root: Node[Any], run: EpochRun) -> Iterator[Any]:
        items = iter(root)
        if hasattr(items, "close"):
            # `yield from` forwards close() to an iterator that has one. When an abandoned
            # iterator of an earlier epoch is collected, that would close the graph the
            # current epoch is reading; so only this run's own exit closes it, below.
            items = chain(items)  # the same items, through an iterator that has no close()
        if self._takeovers is not None:
            assert self._dispatch is not None and self._dispatch.spec is not None
            items = self._takeovers.deliver(items, self._dispatch.spec)
        self._stats.clock.start()
        if self._stats.enabled:
            items = self._stats.timed(items, root, run.epoch)
        bar = None
        if self._options.progress:
            bar = ProgressBar(run.epoch, self._recipe.recipe, progress_bar_class())
            items = bar.wrap(items)
        try:
            yield from items
        except GeneratorExit:
            if self._cursor.is_current(run):  # abandoned mid-epoch: free threads and files now
                root.close()
            raise
        except BaseException as error:
            scrub_error(error)  # what reaches the user names no URL's password or signature
            raise
        finally:
            if self._cursor.is_current(run):  # not an abandoned iterator of an earlier epoch
                self._stats.clock.stop()
            if bar is not None:
                bar.close()
        if self._takeovers is not None and self._takeovers.fenced and root is self._graph.root:
            self._graph.let_go(run.epoch)  # another rank delivers the rest: free it now
        if self._dispatch is not None and self._cursor.is_current(run):
            self._dispatch.end_epoch(run.epoch)
        self._cursor.finish(run)
