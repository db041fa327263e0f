"""Every leaf of whole-job states mutated: an exact resume or a clear error, never other data.

States of several job shapes (one rank, merged ranks, a merged state that holds its
remaining work, a state taken after a resume on another topology, dynamic dispatch,
DataLoader workers with ``items_per_transfer``) are walked leaf by leaf, JSON text
fields (node states, plans, remaining work) included with their digests recomputed,
as a hostile writer would. Each leaf is replaced by values of other types and
ranges; entries are dropped, duplicated and reordered. Every mutated state must be
refused with a :class:`datapipes.StateMismatchError` (an ``InvalidStateError``
naming the place included), or load and deliver, for the rest of the epoch, items of
that epoch that the state had not delivered, each at most once (a position moved
within its range cannot be told from a real one: it resumes as edited). Never a raw
exception, a foreign or repeated item, or a hang (each case runs under a bound).
"""

from __future__ import annotations

import copy
import json
import random
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import datapipes as dp
from datapipes.resume.schema import node_digest

#: Fields that hold JSON text with a digest beside them: (the text's key, the digest's key).
TEXTS = {"node": "digest", "text": "digest"}


def _ids(batch: Any) -> list[int]:
    return [int(x) for x in (batch.tolist() if hasattr(batch, "tolist") else [batch])]


def _take(loader: dp.Loader, count: int) -> list[int]:
    got: list[int] = []
    iterator = iter(loader)
    while len(got) < count:
        got += _ids(next(iterator))
    return got


class Shape:
    """A job shape: how its state is made, and what Loader resumes it."""

    def __init__(self, name: str, pipe: dp.DataPipe, make: Callable[[], tuple[dict, set[int]]],
                 resume: dict[str, Any]) -> None:  # fmt: skip
        self.name, self.pipe, self.make, self.resume = name, pipe, make, resume


def _one_rank(pipe: dp.DataPipe, count: int, **options: Any) -> tuple[dict, set[int]]:
    loader = dp.Loader(pipe, **options)
    delivered = set(_take(loader, count))
    state = loader.state_dict()
    loader.close()
    return state, delivered


def _ranks(pipe: dp.DataPipe, count: int, world: int, **options: Any) -> tuple[list, set[int]]:
    states, delivered = [], set()
    for rank in range(world):
        state, got = _one_rank(pipe, count, rank=rank, world_size=world, **options)
        states.append(state)
        delivered |= got
    return states, delivered


def shapes() -> list[Shape]:
    pipe = dp.range(96).shuffle(buffer_size=8).batch(3)
    flat = dp.range(80).map(abs).shuffle(buffer_size=5)

    def merged() -> tuple[dict, set[int]]:
        states, delivered = _ranks(pipe, 9, 2)
        return dp.merge_states(states), delivered

    def merged_with_remaining() -> tuple[dict, set[int]]:
        states, delivered = _ranks(pipe, 9, 3)
        return dp.merge_states(states, pipe), delivered

    def after_elastic() -> tuple[dict, set[int]]:
        states, delivered = _ranks(flat, 7, 2)
        resumed = dp.Loader(flat, rank=0, world_size=1)
        resumed.load_state_dict(dp.merge_states(states))
        delivered |= set(_take(resumed, 5))
        state = resumed.state_dict()
        resumed.close()
        return state, delivered

    def dynamic() -> tuple[dict, set[int]]:
        return _one_rank(flat, 13, dispatch="dynamic", dispatch_unit_items=6)

    return [
        Shape("one rank", pipe, lambda: _one_rank(pipe, 12), {}),
        Shape("merged ranks", pipe, merged, {"rank": 0, "world_size": 1}),
        Shape("merged with remaining", pipe, merged_with_remaining, {"rank": 0, "world_size": 1}),
        Shape("after an elastic resume", flat, after_elastic, {}),
        Shape("dynamic dispatch", flat, dynamic, {"dispatch": "dynamic", "dispatch_unit_items": 6}),
        Shape("global shuffle, seed", dp.range(64).shuffle().batch(4),
              lambda: _one_rank(dp.range(64).shuffle().batch(4), 20, seed=7), {"seed": 7}),
    ]  # fmt: skip


# ----- mutations ------------------------------------------------------------------------------


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """``(path, leaf)`` of a state; JSON text fields are walked inside (path step "@json")."""
    if isinstance(value, dict):
        for key, child in value.items():
            if key in TEXTS and isinstance(child, str):
                yield from _leaves(json.loads(child), (*path, key, "@json"))
            else:
                yield from _leaves(child, (*path, key))
        if not value:
            yield path, value
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _leaves(child, (*path, index))
        if not value:
            yield path, value
    else:
        yield path, value


def _replaced(state: Any, path: tuple, new: Any, drop: bool = False) -> Any:
    """A copy of ``state`` with the leaf at ``path`` replaced (or dropped), digests redone."""
    state = copy.deepcopy(state)

    def go(value: Any, rest: tuple) -> Any:
        head, tail = rest[0], rest[1:]
        if tail and tail[0] == "@json":
            inner = json.loads(value[head])
            inner = go_inner(inner, tail[1:])
            value[head] = json.dumps(inner, separators=(",", ":"))
            digest = TEXTS[head]
            if digest in value:
                value[digest] = node_digest(value[head])
            return value
        if not tail:
            if drop and isinstance(value, dict):
                value.pop(head, None)
            elif drop and isinstance(value, list):
                value.pop(head)
            else:
                value[head] = new
            return value
        value[head] = go(value[head], tail)
        return value

    def go_inner(value: Any, rest: tuple) -> Any:
        return new if not rest else go(value, rest)

    return go(state, path)


def _values_for(leaf: Any) -> list[Any]:
    if isinstance(leaf, bool):
        return [not leaf, 1, None]
    if isinstance(leaf, int):
        return [leaf + 1, -1, 10**15, str(leaf), None, 1.5]
    if isinstance(leaf, float):
        return [-leaf, float("nan"), None]
    if isinstance(leaf, str):
        return [leaf + "x", "", 7, None]
    if leaf is None:
        return [0, {}, "x"]
    return [None, 3]


def mutations(state: dict, rng: random.Random, limit: int) -> Iterator[tuple[str, Any]]:
    """``(what, mutated state)``: every leaf's values (sampled down to ``limit``), dropped
    keys, duplicated and reordered rank entries."""
    cases = []
    for path, leaf in _leaves(state):
        for new in _values_for(leaf):
            cases.append((f"{path} = {new!r}", path, new, False))
        if path and not isinstance(path[-1], str) or (path and path[-1] != "@json"):
            cases.append((f"drop {path}", path, None, True))
    rng.shuffle(cases)
    for what, path, new, drop in cases[:limit]:
        yield what, _replaced(state, path, new, drop)
    ranks = state.get("ranks", {})
    if len(ranks) > 1:
        first, second = sorted(ranks)[:2]
        duplicated = copy.deepcopy(state)
        duplicated["ranks"][second] = copy.deepcopy(ranks[first])
        yield "rank entry duplicated", duplicated
        reordered = copy.deepcopy(state)
        reordered["ranks"] = dict(reversed(list(ranks.items())))
        yield "rank entries reordered", reordered
    yield "no ranks", {**copy.deepcopy(state), "ranks": {}}
    yield "the state twice, nested", {"data": state, "other": state}


# ----- the verdict ----------------------------------------------------------------------------


#: Where a state holds positions: an edit there that stays within range makes another
#: consistent position, which no check can tell from a real one without replaying the
#: epoch from its start (see tests/test_hostile_states.py): it resumes as edited, with no
#: foreign item. Everywhere else (the setup, epochs, record shapes) an edit is refused or
#: harmless.
POSITIONS = ("node", "text", "claims", "work", "epoch")


def _is_position(what: str) -> bool:
    # A rank's entry replaced by another's is its node state moved to another position.
    return what == "rank entry duplicated" or any(f"'{field}'" in what for field in POSITIONS)


def verdict(
    shape: Shape, state: Any, delivered: set[int], everything: set[int], position: bool
) -> str:
    """``"refused"`` or ``"resumed"``; raises (fails the case) on anything else."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = dp.Loader(shape.pipe, **shape.resume)
        try:
            loader.load_state_dict(state)
        except dp.StateMismatchError:
            return "refused"
        try:
            got: list[int] = []
            for batch in loader:
                got += _ids(batch)
                assert len(got) <= len(everything), "more items than the epoch holds: a hang?"
        except dp.StateMismatchError:
            return "refused"  # found while resuming (e.g. replaying past the data)
        finally:
            loader.close()
    assert not set(got) - everything, f"items not of this data: {sorted(set(got) - everything)}"
    if position:
        return "resumed as edited"
    repeated = [item for item, n in Counter(got).items() if n > 1]
    assert not repeated, f"items delivered twice after the resume: {repeated}"
    again = sorted(set(got) & delivered)
    assert not again, f"items delivered before the checkpoint and again after it: {again}"
    return "resumed"


TALLY: Counter[tuple[str, str]] = Counter()


@pytest.mark.parametrize("shape", shapes(), ids=lambda shape: shape.name)
def test_a_sample_of_mutations_of_a_job_state_resumes_or_is_refused(shape: Shape) -> None:
    import os

    _check_mutations(shape, int(os.environ.get("STATE_MUTATIONS", "120")))


@pytest.mark.slow
@pytest.mark.parametrize("shape", shapes(), ids=lambda shape: shape.name)
def test_every_mutation_of_a_job_state_resumes_or_is_refused(shape: Shape) -> None:
    _check_mutations(shape, 1 << 30)


def _check_mutations(shape: Shape, limit: int) -> None:
    state, delivered = shape.make()
    everything = set(range(96 if "merged" in shape.name or shape.name == "one rank" else 80))
    if shape.name.startswith("global"):
        everything = set(range(64))
    rng = random.Random(sum(map(ord, shape.name)))
    for what, mutated in mutations(state, rng, limit):
        try:
            outcome = verdict(shape, mutated, delivered, everything, _is_position(what))
        except AssertionError as error:
            raise AssertionError(f"{shape.name}: {what}: {error}") from None
        except Exception as error:  # noqa: BLE001 - the point: never a raw error
            raise AssertionError(
                f"{shape.name}: {what}: a raw {type(error).__name__}: {error}"
            ) from error
        TALLY[(shape.name, outcome)] += 1
    assert TALLY[(shape.name, "refused")] > 0


def test_zz_tally_of_the_mutations_tried() -> None:
    """Shown with ``-s``: how many mutated states each shape had, and their outcomes."""
    for (shape, outcome), count in sorted(TALLY.items()):
        print(f"{shape}: {outcome}: {count}")
    if TALLY:
        assert sum(n for (_, outcome), n in TALLY.items() if outcome == "refused") > 0
