"""What one consumer reads of an epoch when it does not read its own share: one declared type.

A consumer's sources read their own share of the epoch (dealt by rank and
worker) unless the consumer's :class:`nodes.Context` carries a
:class:`ConsumerWork`. There are two kinds, and a source asks both the same
question, :meth:`ConsumerWork.plan_for`:

- :class:`DealtWork`: after a resume on another topology, the pieces this
  consumer was dealt of the interrupted epoch's remaining work (see
  :mod:`nodes.elastic`), fixed for the epoch;
- :class:`nodes.dispatch.Dispatcher`: under dynamic dispatch, the unit the
  source claimed last through the store (``claims_on_demand``: the graph
  wraps its sources to claim the next unit when one runs dry).
"""

from __future__ import annotations

from typing import Any


class ConsumerWork:
    """The work a consumer reads instead of its own share in one epoch (see the module doc)."""

    #: Whether sources claim their units one by one (dynamic dispatch) rather than read
    #: pieces fixed in advance.
    claims_on_demand = False

    @property
    def epoch(self) -> int:
        """The epoch this work belongs to: in any other, the consumer reads its own share."""
        raise NotImplementedError

    def plan_for(self, place: str) -> list[Any] | None:
        """The pieces the source at ``place`` reads now (``[]``: nothing; ``None``: no
        unit claimed yet)."""
        raise NotImplementedError


class DealtWork(ConsumerWork):
    """A consumer's share of a resumed epoch's remaining work, by source place.

    >>> work = DealtWork(3, {"0": [[0, 10]]})
    >>> work.plan_for("0"), work.plan_for("1"), work.epoch
    ([[0, 10]], [], 3)
    """

    __slots__ = ("_epoch", "plans")

    def __init__(self, epoch: int, plans: dict[str, list[Any]]) -> None:
        self._epoch = epoch
        self.plans = plans

    @property
    def epoch(self) -> int:
        return self._epoch

    def plan_for(self, place: str) -> list[Any]:
        return self.plans.get(place, [])

    def __repr__(self) -> str:
        return f"DealtWork(epoch={self._epoch}, places={sorted(self.plans)})"
