"""Rounds: a source read several times in one epoch (``repeat``), each round its own work.

Names only (no node): the floor under :mod:`nodes.consumer_work` and :mod:`nodes.elastic`.

A source under a ``repeat`` reads its share again every round, shuffled anew.
Its work is named per round: the place ``"<place>@<round>"``. Consumers go
through the rounds at their own pace, so a checkpoint finds them in different
rounds; the remaining work of round ``r`` is then what the consumers in round
``r`` have not read, plus the whole share of every consumer still in an
earlier round (:meth:`nodes.steps.repeat.RepeatNode.rounds_ahead`, asked up to
the furthest round any consumer reached: :func:`rounds_reached`). A consumer
resumed on another topology reads the rounds its plan holds, from the first;
a round past them it reads as a fresh one, its own share on the new topology
(:func:`round_is_fresh`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_MARK = "@"


def round_place(base: str, round_: int) -> str:
    """The place of ``base``'s work in round ``round_``.

    >>> round_place("3/1", 2)
    '3/1@2'
    """
    return f"{base}{_MARK}{round_}"


def split_round(place: str) -> tuple[str, int | None]:
    """``(base, round)`` of a place (``round`` is ``None`` outside a repeat).

    >>> split_round("3/1@2"), split_round("3/1")
    (('3/1', 2), ('3/1', None))
    """
    base, mark, round_ = place.rpartition(_MARK)
    if not mark or not round_.isdigit():
        return place, None
    return base, int(round_)


def rounds_reached(places: Iterable[str]) -> dict[str, int]:
    """The furthest round of each base among ``places`` (the work of every consumer).

    >>> rounds_reached(["0@1", "0@3", "1", "2@0"])
    {'0': 3, '2': 0}
    """
    out: dict[str, int] = {}
    for place in places:
        base, round_ = split_round(place)
        if round_ is not None:
            out[base] = max(out.get(base, 0), round_)
    return out


def plan_rounds(plans: Mapping[str, Any], base: str) -> list[int]:
    """The rounds of ``base`` that a consumer's plans hold, in order."""
    rounds = []
    for place in plans:
        found, round_ = split_round(place)
        if found == base and round_ is not None:
            rounds.append(round_)
    return sorted(rounds)


def round_is_fresh(plans: Mapping[str, Any], place: str) -> bool:
    """Whether ``place`` is a round past every round of its base in ``plans``: read as a
    fresh round (the consumer's own share), not as nothing."""
    base, round_ = split_round(place)
    if round_ is None or place in plans:
        return False
    held = plan_rounds(plans, base)
    return not held or round_ > held[-1]


def plans_of_source(place: str | None, plans: Iterable[str], rounds: bool) -> list[str]:
    """The places in ``plans`` that name work of the source at ``place``: every round of it
    when it is under a ``repeat`` (``rounds``), else its place alone.

    >>> plans_of_source("0", ["0@0", "0@2", "1@0", "0"], rounds=True)
    ['0@0', '0@2']
    >>> plans_of_source("0", ["0@0", "0"], rounds=False)
    ['0']
    """
    if place is None:
        return []
    if not rounds:
        return [p for p in plans if p == place]
    base = split_round(place)[0]
    return [p for p in plans if _is_round_of(p, base)]


def _is_round_of(place: str, base: str) -> bool:
    found, round_ = split_round(place)
    return round_ is not None and found == base
