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

from nodes.rounds import plan_rounds, round_is_fresh


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
        unit claimed yet, or its own share)."""
        raise NotImplementedError

    def rounds_of(self, base: str) -> list[int]:
        """The rounds of the source at ``base`` (under a ``repeat``) that this work holds,
        in order (see :mod:`nodes.rounds`); none: it reads every round afresh."""
        return []


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

    def plan_for(self, place: str) -> list[Any] | None:
        plan = self.plans.get(place)
        if plan is not None:
            return plan
        # A round of a repeat past the rounds dealt: a fresh round, the consumer's own share.
        return None if round_is_fresh(self.plans, place) else []

    def rounds_of(self, base: str) -> list[int]:
        """The rounds of the source at ``base`` (under a ``repeat``) that this work holds."""
        return plan_rounds(self.plans, base)

    def __repr__(self) -> str:
        return f"DealtWork(epoch={self._epoch}, places={sorted(self.plans)})"
