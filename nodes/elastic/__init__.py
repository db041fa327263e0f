"""Resuming on another topology: an epoch's remaining work in canonical coordinates.

A checkpoint says where each consumer (rank x worker) stood. To resume on
another number of consumers, each consumer's position is turned into *work
that does not depend on the topology*, and that work is dealt again.

- A **source** is a node that deals data to consumers by itself and names its
  place in the recipe (``node.place``, the same on every topology):
  :class:`nodes.SequenceNode` (positions in the epoch's permutation of a
  random-access source), :class:`nodes.FileReaderNode` (records of files and
  file parts), :class:`nodes.FileListNode` (whole files) and
  :class:`nodes.ShardNode` (positions in the stream that every consumer reads).
- A **piece** is a run of one source's remaining work, as plain data:

  * ``{"range": [start, stop, step]}``: positions (``stop`` is ``None`` for
    the open end of a stream);
  * ``{"file": f, "part": [part, parts], "cursor": c, "index": i, "one": b}``:
    records of part ``part`` of ``parts`` of file ``f`` (an index into the
    listing), from the block starting at ``c`` (``None``: the part's start),
    record ``i`` of it; ``one``: only that record.

  A piece of one item may also say which outputs of the ``flat_map`` above
  the source remain (``"outputs": [i, ...]`` or ``"from": k``).
- **Remaining work** is ``{place: {"kind": kind, "pieces": [...]}}``; the
  items read but not delivered (shuffle buffers, a ``flat_map``'s current
  item, a parallel map's tasks) are pieces of one item, first; the untouched
  rest follows, coalesced. Its size grows with those, never with the data.
- A **plan** is one consumer's share of it (:func:`deal`): a source that
  finds a plan for its place in ``ctx.plans`` reads that instead of its own
  share of the epoch.

How a node takes part is its :attr:`nodes.Node.elastic`: ``"source"``;
``"transparent"`` (it holds no item between two ``next`` calls, and its state
is its input's position: map, filter, batch, prefetch); ``"buffer"`` (it holds
items and lists where they came from: :meth:`nodes.Node.in_flight`); ``None``:
no exact answer, and a resume on another topology is refused naming the step.

A source under a ``repeat`` names its work per round, ``"<place>@<round>"``
(see :mod:`nodes.rounds`).

May import: nodes.base, nodes.errors, nodes.state_checks, nodes.rounds.
"""

from nodes.elastic.conversion import (
    check_graph,
    consumer_work,
    dealt_sources,
    live_nodes,
    selections_below,
    sources_and_nodes,
)
from nodes.elastic.pieces import (
    BATCH,
    FILES,
    POSITIONS,
    RECORDS,
    STREAM,
    Origin,
    Piece,
    Work,
    check_positions,
    check_records,
    cut,
    has_selection,
    item_origins,
    piece_length,
    plan_starts,
    position_at,
    positions,
    reranged,
    reranged_record,
    rest_of_plan,
    select,
    selected,
    single,
    stream_targets,
)
from nodes.elastic.work import (
    add_work,
    coalesce,
    count_items,
    deal,
    expand,
    merge_work,
    normalize,
)
from nodes.errors import ElasticResumeError, refuse
from nodes.rounds import (
    round_place,
    rounds_reached,
    split_round,
)

__all__ = [
    "BATCH",
    "FILES",
    "POSITIONS",
    "RECORDS",
    "STREAM",
    "ElasticResumeError",
    "Origin",
    "Piece",
    "Work",
    "add_work",
    "check_graph",
    "check_positions",
    "check_records",
    "coalesce",
    "consumer_work",
    "count_items",
    "cut",
    "dealt_sources",
    "deal",
    "expand",
    "has_selection",
    "item_origins",
    "live_nodes",
    "merge_work",
    "normalize",
    "piece_length",
    "plan_starts",
    "position_at",
    "positions",
    "refuse",
    "reranged",
    "round_place",
    "rounds_reached",
    "reranged_record",
    "rest_of_plan",
    "select",
    "selected",
    "selections_below",
    "single",
    "split_round",
    "sources_and_nodes",
    "stream_targets",
]
