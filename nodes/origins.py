"""An item's origin, from which ``random_map`` seeds it, and the refusal where none is known.

An origin is where in the epoch's data an item came from, as canonical plain
values, the same on every topology: its source's place, then its position or
its record. Each node answers for itself (:meth:`nodes.Node.origin_reader`);
this module holds what those answers share. It imports nothing of ``nodes``,
so that the node contract (:mod:`nodes.base`) can use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

Origin = tuple[Any, ...]  # (source place, canonical ints or strings...)
OriginReader = Callable[[], Origin]

#: Keys of a piece that say which outputs of a flat_map remain, not which item it is.
_SELECTION = ("outputs", "from", "upto")


class RandomMapError(ValueError):
    """A ``random_map`` sits where it cannot know which item it is given."""


class _Step(Protocol):
    """A step of a built graph, as a refusal names it (a :class:`nodes.Node`)."""

    @property
    def kind(self) -> str: ...


def source_origin(place: Any, piece: dict[str, Any]) -> Origin:
    """An item's origin from its source's piece: canonical plain values, no selection.

    Positions (sequences, ``shard`` streams) are the position in the epoch.
    Records of files are (file, block cursor, index in the block), plus the
    file's part when the file is split among consumers (fewer files than
    consumers): block boundaries then depend on the parts.

    >>> source_origin("0", {"range": [7, 8, 1], "from": 2})
    ('0', 7)
    """
    bounds = piece.get("range")
    if bounds is not None:
        return place, bounds[0]
    if "file" in piece:
        part, parts = piece["part"]
        cursor = repr(piece["cursor"])
        if parts == 1:
            return place, piece["file"], cursor, piece["index"]
        return place, piece["file"], part, parts, cursor, piece["index"]
    rest = sorted((k, repr(v)) for k, v in piece.items() if k not in _SELECTION)
    return place, repr(rest)


def refuse_random_map(node: _Step, why: str, where: str) -> RandomMapError:
    """The error for a ``random_map`` above ``node``, which cannot say ``why``; ``where``
    says where to put the ``random_map`` instead."""
    return RandomMapError(
        f"random_map seeds each item from where the item sits in the epoch, and the step "
        f"'{node.kind}' below it {why}. Put .random_map(...) {where}; its draws stay the "
        "same there, item by item."
    )


def reads_ahead(node: _Step) -> RandomMapError:
    """The refusal for a step that reads ahead in the background (thread, pool, workers)."""
    return refuse_random_map(
        node,
        "reads ahead in the background (a thread, a pool, DataLoader workers), so the "
        "item it returns is not the one its input read last",
        f"before the {node.kind}",
    )
