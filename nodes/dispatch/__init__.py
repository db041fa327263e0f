"""Dynamic dispatch: an epoch's units of work claimed on demand through a torch store.

With static dealing every consumer (rank x worker) reads a fixed share, so the
slowest one sets the epoch's pace. With dynamic dispatch an epoch's work (see
:mod:`nodes.elastic`: positions of a random-access source, records of files
and file parts) is cut into *units*, the same list in every process
(:func:`units_of`), and each consumer claims the next unclaimed unit whenever
it runs out (:class:`Dispatcher`, through a ``torch.distributed.Store``:
one atomic ``add`` per claim, so no unit is handed out twice).

A source takes part through :class:`DispatchedSourceNode`, which wraps it:
it claims a unit, points the source at it (the source reads its plan as after
an elastic resume) and claims the next when the source runs dry. Its state is
the list of units it claimed and the source's position in the last one, so a
checkpoint says exactly which items were delivered; every claim is also
recorded in the store, where a Loader finds the claims its DataLoader workers
made after their last snapshot. Nothing in the store marks a unit done: a
unit is done when a checkpoint shows its last item delivered, so a resume
(:func:`datapipes.resume.remaining_work`) hands out again exactly the items
no consumer delivered.

May import: nodes.base, nodes.errors, nodes.state_checks, nodes.consumer_work,
nodes.elastic.
"""

from nodes.dispatch.dispatcher import Dispatcher, DispatchSpec
from nodes.dispatch.node import DispatchedSourceNode
from nodes.dispatch.store import DispatchStoreError, StoreAddress
from nodes.dispatch.units import units_of

__all__ = [
    "DispatchSpec",
    "DispatchStoreError",
    "DispatchedSourceNode",
    "Dispatcher",
    "StoreAddress",
    "units_of",
]
