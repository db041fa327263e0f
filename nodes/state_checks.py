"""Small checks for node states, so each node's ``validate_state`` is a few lines.

Every check raises :class:`nodes.errors.InvalidStateError` naming the path
inside the state (``ranks["0"].node.upstream.slots[3]``) and what a valid
state holds there. Types are strict: an ``int`` field refuses ``bool``,
``float`` and ``str`` (``True``, ``40.5`` and ``"3"`` would resume elsewhere).

>>> state = {"position": 3}
>>> expect_keys(state, "node", {"position"})
>>> expect_int(state, "position", "node", 0, 10)
3
>>> expect_int({"position": 11}, "position", "node", 0, 10)
Traceback (most recent call last):
...
nodes.errors.InvalidStateError: invalid state at node.position: expected an int in [0, 10], ...
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from nodes.errors import MISSING, InvalidStateError


def at(path: str, key: str | int) -> str:
    """The path of ``key`` inside the value at ``path``.

    >>> at("node", "slots"), at("node.slots", 3)
    ('node.slots', 'node.slots[3]')
    """
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key  # "" is the top level: its keys are bare


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def expect_dict(state: Any, path: str) -> dict[str, Any]:
    """``state`` itself, refused unless it is a dict."""
    if not isinstance(state, dict):
        raise InvalidStateError(path, "a dict (a node state)", state)
    return state


def expect_keys(
    state: Any, path: str, required: Collection[str], optional: Collection[str] = ()
) -> None:
    """Refuse ``state`` unless it is a dict with every ``required`` key and no unknown key.

    An unknown key means a state of another node or version: its meaning is not ours.
    """
    expect_dict(state, path)
    for key in required:
        if key not in state:
            raise InvalidStateError(at(path, key), "a value (the key is required)", MISSING)
    allowed = set(required) | set(optional)
    for key in state:
        if key not in allowed:
            raise InvalidStateError(
                at(path, str(key)),
                f"no such key (this node's state has {sorted(allowed)})",
                state[key],
                note="the state belongs to another node or version",
            )


def expect_int(state: Any, key: str, path: str, lo: int = 0, hi: int | None = None) -> int:
    """``state[key]``, refused unless it is an int in ``[lo, hi]`` (``hi=None``: no bound)."""
    value = state.get(key, MISSING) if isinstance(state, dict) else MISSING
    return check_int(value, at(path, key), lo, hi)


def check_int(value: Any, path: str, lo: int = 0, hi: int | None = None) -> int:
    """``value``, refused unless it is an int in ``[lo, hi]``."""
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise InvalidStateError(path, f"an int {'in ' if hi is not None else ''}{bound}", value)
    return value


def expect_bool(state: Any, key: str, path: str) -> bool:
    """``state[key]``, refused unless it is a bool."""
    value = state.get(key, MISSING) if isinstance(state, dict) else MISSING
    if not isinstance(value, bool):
        raise InvalidStateError(at(path, key), "true or false", value)
    return value


def expect_list(state: Any, key: str, path: str, length: int | None = None) -> list[Any]:
    """``state[key]``, refused unless it is a list (of ``length`` items when given)."""
    value = state.get(key, MISSING) if isinstance(state, dict) else MISSING
    if not isinstance(value, list) or (length is not None and len(value) != length):
        what = "a list" if length is None else f"a list of {length}"
        raise InvalidStateError(at(path, key), what, value)
    return value


def expect_ints(
    state: Any, key: str, path: str, lo: int = 0, hi: int | None = None, *, unique: bool = False
) -> list[int]:
    """``state[key]``, refused unless it is a list of ints in ``[lo, hi]`` (distinct if
    ``unique``)."""
    values = expect_list(state, key, path)
    seen: set[int] = set()
    for i, value in enumerate(values):
        check_int(value, at(at(path, key), i), lo, hi)
        if unique and value in seen:
            raise InvalidStateError(at(at(path, key), i), "a value not repeated in the list", value)
        seen.add(value)
    return values


def expect_equal(state: Any, key: str, path: str, expected: Any, what: str) -> None:
    """Refuse ``state[key]`` unless it equals ``expected`` (``what`` says what it is)."""
    value = state.get(key, MISSING) if isinstance(state, dict) else MISSING
    if type(value) is not type(expected) or value != expected:
        raise InvalidStateError(at(path, key), f"{expected!r} ({what})", value)


def expect_none(state: Any, key: str, path: str, why: str) -> None:
    """Refuse ``state[key]`` unless it is ``None`` (``why``: why nothing belongs there)."""
    value = state.get(key, MISSING) if isinstance(state, dict) else MISSING
    if value is not None:
        raise InvalidStateError(at(path, key), f"null ({why})", value)
