"""Conformance kit: checks that any node keeps the node contract.

Run it on your own node the way the test suite runs it on every built-in one::

    from nodes.testing import check_node

    def make(ctx):
        return AddOne(SequenceNode(range(50), ctx))

    check_node(make)          # raises AssertionError naming what broke

It checks exact resume at every position (or a spread of positions for long
outputs) in two epochs, including a resume that then runs into the next
epoch; that states are plain (``json`` and ``torch.load(weights_only=True)``
round trips); that ``reset(None)`` restarts the epoch; that an exhausted node
keeps raising ``StopIteration`` without moving its state; that ``close()`` leaves no thread behind,
keeps the position readable and allows a later ``reset``.
"""

from __future__ import annotations

import io
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np
import torch

from nodes.base import Node
from nodes.context import Context
from nodes.errors import InvalidStateError

NodeFactory = Callable[[Context], Node]


@dataclass
class ConformanceReport:
    """What :func:`check_node` exercised: items per epoch and the positions resumed from."""

    items_per_epoch: list[int] = field(default_factory=list)
    positions_checked: int = 0


def same(a: Any, b: Any) -> bool:
    """Deep equality that understands tensors, numpy arrays, NaN, dicts and sequences."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and (torch.equal(a, b) or (a.is_floating_point() and _equal_with_nan(a, b)))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _equal_with_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())


def read_epoch(node: Node) -> list[Any]:
    """All items of one epoch of a freshly built ``node``, which is then closed.

    >>> from nodes import SequenceNode
    >>> read_epoch(SequenceNode(range(3), Context()))
    [0, 1, 2]
    """
    node.reset(None)
    try:
        return list(node)
    finally:
        node.close()


def check_plain_state(state: Any, path: str = "state") -> None:
    """Fail unless ``state`` is nested dicts (str keys) and lists of str/int/float/bool/None."""
    if state is None or type(state) in (str, int, float, bool):
        return
    if type(state) is dict:
        for key, value in state.items():
            if type(key) is not str:
                raise AssertionError(f"{path} has a non-str key {key!r}: states must be plain")
            check_plain_state(value, f"{path}[{key!r}]")
        return
    if type(state) is list:
        for i, value in enumerate(state):
            check_plain_state(value, f"{path}[{i}]")
        return
    raise AssertionError(
        f"{path} is a {type(state).__name__} ({state!r:.80}); a state may only hold dicts, "
        "lists, str, int, float, bool and None (convert numpy scalars with int()/float())"
    )


def roundtrip_state(state: Any) -> Any:
    """Check ``state`` is plain, send it through json and torch (weights_only); return the copy."""
    check_plain_state(state)
    via_json = json.loads(json.dumps(state))
    if via_json != state:
        raise AssertionError("state changed in a json round trip")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    via_torch = torch.load(buffer, weights_only=True)
    if via_torch != state:
        raise AssertionError("state changed in a torch.save + torch.load(weights_only=True) trip")
    return via_json


def _first_difference(expected: Sequence[Any], got: Sequence[Any]) -> str:
    for i, (a, b) in enumerate(zip(expected, got)):
        if not same(a, b):
            return f"item {i}: expected {a!r:.120}, got {b!r:.120}"
    return f"expected {len(expected)} items, got {len(got)}"


def _spread(length: int, limit: int) -> list[int]:
    if length + 1 <= limit:
        return list(range(length + 1))
    picks = {0, 1, 2, length - 1, length}
    picks.update(round(i * length / (limit - 5)) for i in range(limit - 5))
    return sorted(p for p in picks if 0 <= p <= length)


#: Process-wide threads that libraries start once and keep (not leaks of a node):
#: fsspec runs one event loop thread for all its async filesystems (HTTP, S3, ...).
SHARED_LIBRARY_THREADS = frozenset({"fsspecIO"})


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    # Free when the threads end on time; 10 s holds for a thread on a loaded machine.
    deadline = time.monotonic() + 10.0
    while True:
        alive = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and t.name not in SHARED_LIBRARY_THREADS
        ]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def check_node(
    factory: NodeFactory,
    *,
    context: Callable[[int], Context] | None = None,
    epochs: int = 2,
    positions: Iterable[int] | None = None,
    max_positions: int = 40,
    max_items: int = 100_000,
) -> ConformanceReport:
    """Check that the nodes ``factory(ctx)`` builds keep the node contract.

    ``factory`` builds a fresh node graph for a context; ``context(epoch)``
    makes that context (default: one consumer, seed 0). ``positions`` picks the
    resume points (default: all of them, or ``max_positions`` spread out).
    Raises ``AssertionError`` naming the epoch, position and first wrong item.
    """
    make_context = context or (lambda epoch: Context(epoch=epoch))
    report = ConformanceReport()
    threads_before = set(threading.enumerate())

    contexts: dict[int, Context] = {}

    def fresh(epoch: int) -> Node:
        ctx = make_context(epoch)
        node = factory(ctx)
        contexts[id(node)] = ctx
        return node

    def set_epoch(node: Node, epoch: int) -> None:
        contexts[id(node)].epoch = epoch

    def run(node: Node, limit: int = max_items) -> list[Any]:
        return list(islice(node, limit))

    references: list[list[Any]] = []
    node = fresh(0)
    for epoch in range(epochs):
        set_epoch(node, epoch)
        node.reset(None)
        references.append(run(node))
        if len(references[-1]) < max_items:
            ended = node.state_dict()
            if next(node, _MISSING) is not _MISSING:
                raise AssertionError(f"epoch {epoch}: the node yielded again after StopIteration")
            if node.state_dict() != ended:
                raise AssertionError(
                    f"epoch {epoch}: asking an exhausted node again changed its state (it "
                    "read its input again); an ended epoch must stay where it ended"
                )
    node.close()
    report.items_per_epoch = [len(r) for r in references]

    again = fresh(0)
    again.reset(None)
    if not _all_same(references[0], run(again)):
        raise AssertionError("two fresh nodes with the same context yielded different items")
    again.reset(None)
    if not _all_same(references[0], run(again)):
        raise AssertionError("reset(None) after a full epoch did not restart the epoch")
    again.close()

    for epoch in range(epochs):
        reference = references[epoch]
        picks = _spread(len(reference), max_positions) if positions is None else list(positions)
        for k in picks:
            if k > len(reference):
                continue
            first = fresh(epoch)
            first.reset(None)
            head = run(first, k)
            state = first.state_dict()
            if not _all_same(reference[:k], head):
                raise AssertionError(f"epoch {epoch}: first {k} items differ from the first run")
            restored = roundtrip_state(state)
            first.close()
            if roundtrip_state(first.state_dict()) != restored:
                raise AssertionError(f"epoch {epoch}: close() after {k} items changed the state")
            if k and k < len(reference):
                first.reset(None)
                if not _all_same(reference[: min(len(reference), 3)], run(first, 3)):
                    raise AssertionError(f"epoch {epoch}: reset(None) after {k} items: no restart")
                first.close()

            second = fresh(epoch)
            second.reset(restored)
            tail = run(second, len(reference) - k)
            if not _all_same(reference[k:], tail):
                raise AssertionError(
                    f"epoch {epoch}: resume after {k} items is not exact: "
                    + _first_difference(reference[k:], tail)
                )
            if len(reference) < max_items and next(second, _MISSING) is not _MISSING:
                raise AssertionError(f"epoch {epoch}: resume after {k} items yielded extra items")
            if epoch + 1 < epochs:
                set_epoch(second, epoch + 1)
                second.reset(None)
                if not _all_same(references[epoch + 1], run(second)):
                    raise AssertionError(
                        f"the epoch after a resume (at {k} in epoch {epoch}) differs from "
                        "the uninterrupted run"
                    )
            second.close()
            report.positions_checked += 1

    check_hostile_states(lambda: fresh(0), len(references[0]) // 2)

    reopened = fresh(0)
    reopened.reset(None)
    run(reopened, 3)
    reopened.close()
    reopened.reset(None)
    if not _all_same(references[0], run(reopened)):
        raise AssertionError("reset(None) after close() did not restart the epoch")
    reopened.close()

    leftover = _new_threads(threads_before)
    if leftover:
        raise AssertionError(f"close() left threads running: {[t.name for t in leftover]}")
    return report


_MISSING = object()

#: What each top-level int field of a state is set to; the ones marked ``True`` are always
#: wrong, the others (a huge count) may be a valid position of some nodes (draws, rounds).
_HOSTILE_INTS: list[tuple[Any, bool]] = [
    (-1, True),
    ("x", True),
    (None, True),
    (1.5, True),
    (True, True),
    (10**12, False),
]


def check_hostile_states(make: Callable[[], Node], k: int) -> int:
    """Check that the node ``make()`` builds refuses obviously hostile states.

    The state taken after ``k`` items is mutated: each top-level int field set
    to -1, ``"x"``, ``None``, 1.5 or ``True``, each key removed, an unknown
    key added. :meth:`nodes.Node.validate_state` must raise
    :class:`nodes.errors.InvalidStateError` for each (naming the field), or,
    for a huge count (``10**12``), refuse or resume without any other error.
    Nodes that keep the default hook (a custom node's state is opaque) are
    only checked not to fail with another exception. Returns the cases tried.
    """
    node = make()
    node.reset(None)
    list(islice(node, k))
    state = node.state_dict()
    node.close()
    if not isinstance(state, dict):
        return 0
    strict = _owner_of(node, state)
    cases: list[tuple[str, Any, bool]] = []
    for key, value in state.items():
        if type(value) is int:
            cases += [(f"{key}={bad!r}", {**state, key: bad}, sure) for bad, sure in _HOSTILE_INTS]
        cases.append((f"without {key!r}", {k: v for k, v in state.items() if k != key}, True))
    cases.append(("an unknown key", {**state, "unknown key": 1}, True))
    for what, hostile, sure in cases:
        checked = make()
        try:
            checked.validate_state(hostile, "state")
        except InvalidStateError as error:
            if error.path not in str(error):
                raise AssertionError(f"{what}: the error does not name the path: {error}") from None
            continue
        except Exception as error:
            raise AssertionError(
                f"validate_state of a state with {what} raised {type(error).__name__}: {error}; "
                "raise nodes.errors.InvalidStateError (see nodes.state_checks)"
            ) from error
        finally:
            checked.close()
        if strict and sure:
            raise AssertionError(
                f"{type(strict).__name__}.validate_state accepted a state with {what}: "
                f"{hostile!r:.200}"
            )
        if strict:  # accepted: then the resume refuses it or works
            _resume_a_little(make, hostile, what)
    return len(cases)


def _owner_of(node: Node, state: dict[str, Any]) -> Node | None:
    """The node whose own fields ``state``'s top level holds, if it checks them (overrides
    ``validate_state``); transparent nodes (a state that is their input's) are looked through."""
    while node.inputs:
        found = type(node).upstream_states(state)
        if len(found) != 1 or found[0][1] is not state:
            break
        node = node.inputs[0]
    return node if type(node).validate_state is not Node.validate_state else None


def _resume_a_little(make: Callable[[], Node], state: dict[str, Any], what: str) -> None:
    node = make()
    try:
        node.reset(state)
        list(islice(node, 3))
    except InvalidStateError:
        pass
    except Exception as error:
        raise AssertionError(
            f"a state with {what} passed validate_state, then the resume raised "
            f"{type(error).__name__}: {error}"
        ) from error
    finally:
        node.close()


def _all_same(expected: Sequence[Any], got: Sequence[Any]) -> bool:
    return len(expected) == len(got) and all(same(a, b) for a, b in zip(expected, got))
