"""Positions of built-in list and range iterators, set and read in O(1).

A node that hands out the items of a list keeps its position in the C
iterator itself (no counter on the hot path) and reads it only for a state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def positioned_iterator(values: list[Any], offset: int) -> Iterator[Any]:
    """A list iterator over ``values`` that has already yielded ``offset`` items (O(1))."""
    it = iter(values)
    if offset:
        it.__setstate__(offset)
    return it


def list_iterator_position(it: Iterator[Any], length: int) -> int:
    """How many items a list (or range) iterator has yielded, read in O(1).

    Built-in list and range iterators expose their index through ``__reduce__``;
    an exhausted list iterator drops it, and then the answer is ``length``.
    From Python 3.12 a range iterator reduces to the *remaining* range with no
    index, so its position is ``length`` minus what remains.
    """
    reduced = it.__reduce__()
    if len(reduced) > 2 and reduced[2] is not None:
        return reduced[2]
    if len(reduced) > 2 and isinstance(reduced[1][0], range):
        return length - len(reduced[1][0])
    return length
