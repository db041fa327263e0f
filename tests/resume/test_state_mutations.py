"""Every leaf of whole-job states mutated: an exact resume or a clear error, never other data.

States of several job shapes (see :func:`shapes`: one rank, merged ranks, a merged state
that holds its remaining work, states taken after a resume on another topology, static
and dynamic; dynamic dispatch, with leases too (merged, one rank's own); the epoch of a
takeover, the one after it, and a rank's own state while another's lease is taken;
DataLoader workers with ``items_per_transfer``) are walked leaf by leaf, JSON text fields
(node states, plans, remaining work) included with their digests recomputed, as a
hostile writer would. Each leaf is replaced by values of other types and ranges; entries
are dropped, duplicated and reordered. Every mutated state must be refused with a
:class:`datapipes.StateMismatchError` (an ``InvalidStateError`` naming the place
included), or load and deliver the rest of its epoch exactly: every item of the epoch
the state had not delivered, once. A position moved within its range (node states,
claims, work, epochs) cannot be told from a real one: it resumes as edited, still with
no item twice or foreign. Never a raw exception or a hang (each case runs under a
bound). The last section holds the cases the mutations found, as regression tests.
"""

from __future__ import annotations

import copy
import json
import os
import random
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lease_helpers import LEASE, LIVE_LEASE, stall

import datapipes as dp
from datapipes.dispatch.dynamic import private_file_store
from datapipes.dispatch.takeover import LeaseTakenWarning
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


#: Mutated states tried per shape by the sampled (fast) test; ``STATE_MUTATIONS`` sets it
#: for every shape.
SAMPLE = 120
#: Seconds one case (its load and the rest of its epoch) may take: past it, a hang.
CASE_SECONDS = 60


class Shape:
    """A job shape: how its state is made, what Loader resumes it, and the epoch's items.

    ``resume`` is the resuming Loader's options, or a function that makes them for each
    case (a dynamic job's own fresh store, so a resumed epoch's keys meet no other's).
    ``make`` returns the state and the items delivered of the epoch it resumes. ``own``:
    one rank's own state of a dynamic job of several, which no Loader takes as made (every
    rank's claims count: ``dp.merge_states``).
    """

    def __init__(self, name: str, pipe: dp.DataPipe, make: Callable[[], tuple[dict, set[int]]],
                 resume: dict[str, Any] | Callable[[], dict[str, Any]], everything: range,
                 sample: int = SAMPLE, own: bool = False) -> None:  # fmt: skip
        self.name, self.pipe, self.make, self.resume = name, pipe, make, resume
        self.everything, self.sample, self.own = set(everything), sample, own

    def loader(self) -> dp.Loader:
        options = self.resume() if callable(self.resume) else self.resume
        return dp.Loader(self.pipe, **options)


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


def _interleaved(ranks: list[dp.Loader], counts: list[int]) -> tuple[list[dict], set[int]]:
    """Each rank's state after ``counts[rank]`` items, the ranks read in turn (one thread:
    none reaches its epoch's end, where it would wait for the others)."""
    iterators = [iter(rank) for rank in ranks]
    got: list[list[int]] = [[] for _ in ranks]
    while any(len(mine) < count for mine, count in zip(got, counts)):
        for mine, count, iterator in zip(got, counts, iterators):
            if len(mine) < count:
                mine += _ids(next(iterator))
    return [rank.state_dict() for rank in ranks], {i for mine in got for i in mine}


def _close(ranks: list[dp.Loader]) -> None:
    for rank in ranks:
        rank.close()


# ----- dynamic dispatch with leases ------------------------------------------------------------
#: What the ranks of a job with leases share (and its resumes: a state of dynamic dispatch
#: resumes under dynamic dispatch with the same units).
LEASED = {"seed": 3, "dispatch": "dynamic", "dispatch_unit_items": 10, "even_batches": False}


def _leased_ranks(pipe: dp.DataPipe, world: int, lease: float) -> list[dp.Loader]:
    """The ``world`` in-process ranks of one job with leases, on a store of their own."""
    store = private_file_store()
    return [
        dp.Loader(
            pipe, rank=rank, world_size=world, store=store, dispatch_lease_seconds=lease, **LEASED
        )  # fmt: skip
        for rank in range(world)
    ]


def _leased_resume(rank: int = 0, world: int = 1) -> Callable[[], dict[str, Any]]:
    """The resuming Loader's options: leases, on a fresh store for each case. A rank of
    several whose state was wrongly taken would take the absent others over after
    ``LEASE`` and read their shares: it ends, and its items are checked."""

    def options() -> dict[str, Any]:
        return {**LEASED, "rank": rank, "world_size": world, "store": private_file_store(),
                "dispatch_lease_seconds": LEASE}  # fmt: skip

    return options


def _a_takeover(pipe: dp.DataPipe) -> list[dp.Loader]:
    """Two ranks after an epoch in which rank 1 stalled and rank 0 took it over (rank 1
    woke up fenced); both are at the next epoch's start."""
    first, second = ranks = _leased_ranks(pipe, 2, LEASE)
    stalled = iter(second)
    for _ in range(12):
        next(stalled)
    stall(second)
    list(first)  # its own units, then (after LEASE) rank 1's rest
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeaseTakenWarning)
        assert list(stalled) == []  # fenced: its late item dropped
    assert first._takeovers is not None and second._takeovers is not None
    assert first._takeovers.report()["took_over"] == [1] and second._takeovers.fenced
    return ranks


def _own_state_while_a_lease_is_taken(pipe: dp.DataPipe) -> tuple[dict, set[int]]:
    """Rank 1's own state of three, taken mid-epoch while rank 0 holds stalled rank 2's
    lease (taken over); then the epoch is read to its end by ranks 0 and 1."""
    ranks = _leased_ranks(pipe, 3, LEASE)
    stalled = iter(ranks[2])
    for _ in range(8):
        next(stalled)
    stall(ranks[2])
    mine = iter(ranks[1])
    delivered = {i for _ in range(5) for i in _ids(next(mine))}
    reader = threading.Thread(target=lambda: list(ranks[0]), daemon=True)
    reader.start()
    takeovers = ranks[0]._takeovers
    assert takeovers is not None
    deadline = time.monotonic() + CASE_SECONDS
    while 2 not in takeovers.report()["took_over"]:  # published: rank 2's lease is taken
        assert reader.is_alive() and time.monotonic() < deadline, "rank 2 never taken over"
        time.sleep(0.01)
    state = ranks[1].state_dict()
    list(mine)  # its units, then with rank 0 what rank 2 had not delivered
    reader.join(CASE_SECONDS)
    assert not reader.is_alive(), "rank 0 hung"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeaseTakenWarning)
        assert list(stalled) == []
    _close(ranks)
    return state, delivered


def shapes() -> list[Shape]:
    pipe = dp.range(96).shuffle(buffer_size=8).batch(3)
    flat = dp.range(80).map(abs).shuffle(buffer_size=5)
    leased = dp.range(120).shuffle().map(abs).shuffle(buffer_size=4)
    workers = dp.range(60).shuffle(buffer_size=4).batch(2)
    with_workers = {"num_workers": 2, "items_per_transfer": 3, "snapshot_every_n_steps": 2,
                    "timeout": CASE_SECONDS}  # fmt: skip

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

    def dynamic_after_elastic() -> tuple[dict, set[int]]:
        store = private_file_store()
        ranks = [
            dp.Loader(
                flat,
                rank=rank,
                world_size=2,
                dispatch="dynamic",
                store=store,
                dispatch_unit_items=6,
            )  # fmt: skip
            for rank in range(2)
        ]
        states, delivered = _interleaved(ranks, [11, 5])
        _close(ranks)
        resumed = dp.Loader(flat, dispatch="dynamic", dispatch_unit_items=6)
        resumed.load_state_dict(dp.merge_states(states))
        delivered |= set(_take(resumed, 9))
        state = resumed.state_dict()
        resumed.close()
        return state, delivered

    def leases(rank: int | None) -> Callable[[], tuple[dict, set[int]]]:
        def make() -> tuple[dict, set[int]]:
            ranks = _leased_ranks(leased, 2, LIVE_LEASE)  # nobody is taken over
            states, delivered = _interleaved(ranks, [17, 9])
            _close(ranks)
            return (dp.merge_states(states) if rank is None else states[rank]), delivered

        return make

    def takeover_epoch_end() -> tuple[dict, set[int]]:
        ranks = _a_takeover(leased)
        state = dp.merge_states([rank.state_dict() for rank in ranks])
        _close(ranks)
        return state, set()  # it resumes the next epoch from its start

    def epoch_after_takeover() -> tuple[dict, set[int]]:
        ranks = _a_takeover(leased)
        states, delivered = _interleaved(ranks, [14, 6])
        _close(ranks)
        return dp.merge_states(states), delivered

    return [
        Shape("one rank", pipe, lambda: _one_rank(pipe, 12), {}, range(96)),
        Shape("merged ranks", pipe, merged, {"rank": 0, "world_size": 1}, range(96)),
        Shape("merged with remaining", pipe, merged_with_remaining, {"rank": 0, "world_size": 1},
              range(96)),
        Shape("after an elastic resume", flat, after_elastic, {}, range(80)),
        Shape("dynamic dispatch", flat, dynamic, {"dispatch": "dynamic", "dispatch_unit_items": 6},
              range(80)),
        Shape("dynamic, after an elastic resume", flat, dynamic_after_elastic,
              {"dispatch": "dynamic", "dispatch_unit_items": 6}, range(80)),
        Shape("global shuffle, seed", dp.range(64).shuffle().batch(4),
              lambda: _one_rank(dp.range(64).shuffle().batch(4), 20, seed=7), {"seed": 7},
              range(64)),
        Shape("workers, items_per_transfer", workers,
              lambda: _one_rank(workers, 18, **with_workers), with_workers, range(60), sample=40),
        Shape("leases, merged ranks", leased, leases(None), _leased_resume(), range(120)),
        Shape("leases, one rank's own", leased, leases(1), _leased_resume(1, 2), range(120),
              sample=60, own=True),
        Shape("takeover, merged at the epoch's end", leased, takeover_epoch_end, _leased_resume(),
              range(120)),
        Shape("takeover, the epoch after, merged", leased, epoch_after_takeover,
              _leased_resume(), range(120)),
        Shape("takeover, one rank's own while another's lease is taken", leased,
              lambda: _own_state_while_a_lease_is_taken(leased), _leased_resume(1, 3), range(120),
              sample=60, own=True),
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
#: epoch from its start (see tests/resume/test_hostile_states.py): it resumes as edited, with no
#: foreign item. Everywhere else (the setup, epochs, record shapes) an edit is refused or
#: harmless.
POSITIONS = ("node", "text", "claims", "work", "epoch")


def _is_position(what: str) -> bool:
    # A rank's entry replaced by another's is its node state moved to another position.
    return what == "rank entry duplicated" or any(f"'{field}'" in what for field in POSITIONS)


def _resumed(shape: Shape, state: Any) -> list[int] | None:
    """The items a Loader of ``shape`` delivers for the rest of the epoch after loading
    ``state``; ``None`` when it refused the state (on load, or while resuming, e.g.
    replaying past the data)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = shape.loader()
        try:
            loader.load_state_dict(state)
        except dp.StateMismatchError:
            return None
        try:
            got: list[int] = []
            for batch in loader:
                got += _ids(batch)
                assert len(got) <= len(shape.everything), "more items than the epoch holds"
        except dp.StateMismatchError:
            return None
        finally:
            loader.close()
    return got


def _bounded(shape: Shape, state: Any) -> list[int] | None:
    """:func:`_resumed` on a thread of its own, given ``CASE_SECONDS``: past that, a hang."""
    result: list[list[int] | None] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(_resumed(shape, state))
        except BaseException as failed:  # noqa: BLE001 - raised in the test's thread
            error.append(failed)

    thread = threading.Thread(target=run, name="state-mutations-case", daemon=True)
    thread.start()
    thread.join(CASE_SECONDS)
    if thread.is_alive():
        raise AssertionError(f"no verdict within {CASE_SECONDS} s: a hang")
    if error:
        raise error[0]
    return result[0]


def verdict(shape: Shape, state: Any, delivered: set[int], position: bool) -> str:
    """``"refused"``, ``"resumed"`` or ``"resumed as edited"``; raises (fails the case) on
    anything else."""
    got = _bounded(shape, state)
    if got is None:
        return "refused"
    foreign = sorted(set(got) - shape.everything)
    assert not foreign, f"items not of this data: {foreign}"
    repeated = [item for item, n in Counter(got).items() if n > 1]
    assert not repeated, f"items delivered twice after the resume: {repeated}"
    if position:
        return "resumed as edited"
    again = sorted(set(got) & delivered)
    assert not again, f"items delivered before the checkpoint and again after it: {again}"
    lost = sorted(shape.everything - delivered - set(got))
    assert not lost, f"items of the epoch never delivered: {lost}"
    return "resumed"


TALLY: Counter[tuple[str, str]] = Counter()
#: Seconds each shape's cases took, the making of its state included.
SECONDS: Counter[str] = Counter()


def _marked(shape: Shape) -> Any:
    """A shape whose Loader starts DataLoader worker processes runs with the slow tests."""
    workers = not callable(shape.resume) and shape.resume.get("num_workers", 0) > 0
    return pytest.param(shape, marks=pytest.mark.slow) if workers else shape


@pytest.mark.parametrize("shape", [_marked(s) for s in shapes()], ids=lambda shape: shape.name)
def test_a_sample_of_mutations_of_a_job_state_resumes_or_is_refused(shape: Shape) -> None:
    _check_mutations(shape, int(os.environ.get("STATE_MUTATIONS", shape.sample)))


@pytest.mark.slow
@pytest.mark.parametrize("shape", shapes(), ids=lambda shape: shape.name)
def test_every_mutation_of_a_job_state_resumes_or_is_refused(shape: Shape) -> None:
    _check_mutations(shape, 1 << 30)


def _check_mutations(shape: Shape, limit: int) -> None:
    started = time.monotonic()
    state, delivered = shape.make()
    # As made, the state resumes with exactly what its epoch had not delivered (or, a
    # rank's own state of a dynamic job, is refused: every rank's claims count).
    got = _bounded(shape, state)
    if shape.own:
        assert got is None, f"{shape.name}: a rank's own state of a dynamic job was taken"
    else:
        assert got is not None, f"{shape.name}: the state as made was refused"
        assert sorted(got) == sorted(shape.everything - delivered), f"{shape.name}: as made"
    rng = random.Random(sum(map(ord, shape.name)))
    for what, mutated in mutations(state, rng, limit):
        try:
            outcome = verdict(shape, mutated, delivered, _is_position(what))
        except AssertionError as error:
            raise AssertionError(f"{shape.name}: {what}: {error}") from None
        except Exception as error:  # noqa: BLE001 - the point: never a raw error
            raise AssertionError(
                f"{shape.name}: {what}: a raw {type(error).__name__}: {error}"
            ) from error
        TALLY[(shape.name, outcome)] += 1
    SECONDS[shape.name] += time.monotonic() - started
    assert TALLY[(shape.name, "refused")] > 0


def test_zz_tally_of_the_mutations_tried() -> None:
    """Shown with ``-s``: how many mutated states each shape had, and their outcomes."""
    for (shape, outcome), count in sorted(TALLY.items()):
        print(f"{shape}: {outcome}: {count}")
    for shape, seconds in sorted(SECONDS.items()):
        print(f"{shape}: {seconds:.1f} s")
    if TALLY:
        assert sum(n for (_, outcome), n in TALLY.items() if outcome == "refused") > 0


# ----- cases the mutations found ----------------------------------------------------------------


def _shape(name: str) -> Shape:
    return next(shape for shape in shapes() if shape.name == name)


def _edit_text(state: dict, holder: tuple, change: Callable[[Any], None]) -> dict:
    """A copy of ``state`` whose JSON text at ``holder`` (its "text" or "node") is changed
    by ``change`` and its digest redone, as a hostile writer would."""
    state = copy.deepcopy(state)
    record = state
    for step in holder[:-1]:
        record = record[step]
    value = json.loads(record[holder[-1]])
    change(value)
    record[holder[-1]] = json.dumps(value, separators=(",", ":"))
    record["digest"] = node_digest(record[holder[-1]])
    return state


def _load_raises(shape: Shape, state: dict, match: str) -> None:
    loader = shape.loader()
    try:
        with pytest.raises(dp.InvalidStateError, match=match):
            loader.load_state_dict(state)
    finally:
        loader.close()


def test_overlapping_pieces_of_a_merged_states_remaining_work_are_refused() -> None:
    # One piece's stop moved into the next: the position between was read twice.
    shape = _shape("merged with remaining")
    state, _ = shape.make()

    def overlap(value: Any) -> None:
        pieces = next(iter(value["work"].values()))["pieces"]
        pieces[0]["range"][1] = pieces[1]["range"][0] + 1

    damaged = _edit_text(state, ("remaining", "text"), overlap)
    _load_raises(shape, damaged, r"remaining\.text\.work.*no other piece holds")


def test_overlapping_pieces_of_a_ranks_plans_are_refused() -> None:
    shape = _shape("after an elastic resume")
    state, _ = shape.make()

    def overlap(value: Any) -> None:
        pieces = next(iter(value["consumers"][0].values()))
        pieces.append(copy.deepcopy(pieces[-1]))

    damaged = _edit_text(state, ("ranks", "0", "plans", "text"), overlap)
    _load_raises(shape, damaged, r"plans.*no other piece holds")


@pytest.mark.parametrize("stop", [81, 10**15])
def test_a_dispatch_records_work_past_the_data_is_refused(stop: int) -> None:
    # Was: position 80 of dp.range(80) delivered as an item (81), and a hang cutting
    # 10**15 positions into units.
    shape = _shape("dynamic, after an elastic resume")
    state, _ = shape.make()
    damaged = copy.deepcopy(state)
    work = damaged["ranks"]["0"]["dispatch"]["work"]
    next(iter(work.values()))["pieces"][-1]["range"][1] = stop
    _load_raises(shape, damaged, r"ranks\[\"0\"\]\.dispatch\.work")


def test_a_merged_states_remaining_work_past_the_data_is_refused_by_a_dynamic_resume() -> None:
    shape = _shape("merged with remaining")
    state, _ = shape.make()

    def past(value: Any) -> None:
        next(iter(value["work"].values()))["pieces"][-1]["range"][1] = 10**15

    damaged = _edit_text(state, ("remaining", "text"), past)
    dynamic = Shape("dynamic", shape.pipe, shape.make, {"dispatch": "dynamic"}, range(96))
    _load_raises(dynamic, damaged, r"remaining\.text\.work")
    _load_raises(shape, damaged, r"remaining\.text\.work")


@pytest.mark.parametrize("workers", [1, 10**15])
def test_workers_in_the_topology_of_a_state_taken_without_any_are_refused(workers: int) -> None:
    # Was: resumed as another topology, the rank's position read as no worker's: items lost.
    shape = _shape("one rank")
    state, _ = shape.make()
    damaged = copy.deepcopy(state)
    damaged["topology"]["num_workers"] = workers
    _load_raises(shape, damaged, r"dataloader: expected the DataLoader's state")


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("transfer", [None, 2, 4, 10**15])
def test_another_items_per_transfer_in_the_topology_is_refused(transfer: int | None) -> None:
    # Was: the workers' transfers replayed at the edited size: items lost or repeated.
    shape = _shape("workers, items_per_transfer")
    state, _ = shape.make()
    damaged = copy.deepcopy(state)
    if transfer is None:
        del damaged["topology"]["items_per_transfer"]
    else:
        damaged["topology"]["items_per_transfer"] = transfer
    _load_raises(shape, damaged, r"(taken|items_per_transfer): expected")


@pytest.mark.slow  # DataLoader worker processes
def test_a_resume_the_workers_refuse_leaves_close_and_state_dict_quiet() -> None:
    # A worker position refused inside the workers, as the DataLoader starts them: the
    # error is raised by the iteration; close() raised it again, after starting new
    # workers to take the DataLoader's state.
    shape = _shape("workers, items_per_transfer")
    state, _ = shape.make()
    path = ("ranks", "0", "node", "@json", "dataloader", "_snapshot", "_worker_snapshots",
            "worker_0", "dataset_state", "node", "exhausted")  # fmt: skip
    damaged = _replaced(state, path, True)
    loader = shape.loader()
    loader.load_state_dict(damaged)
    with pytest.raises(dp.InvalidStateError, match="exhausted"):
        list(loader)
    assert loader.state_dict()["ranks"]["0"]["node"] == damaged["ranks"]["0"]["node"]
    loader.close()


def test_positions_pieces_overlap_exactly_when_they_share_a_position() -> None:
    from nodes.elastic.pieces import check_disjoint, positions

    rng = random.Random(5)
    for _ in range(2000):
        pieces = []
        for _ in range(rng.randrange(1, 6)):
            start, step = rng.randrange(60), rng.choice([1, 1, 2, 3, 5, 7])
            count = rng.choice([1, 2, rng.randrange(1, 50)])
            piece = positions(start, start + count * step, step)
            if rng.random() < 0.1:
                piece = {"range": [start, None, step]}  # an open stream tail
            if rng.random() < 0.2:
                piece["outputs"] = sorted(rng.sample(range(4), rng.randrange(1, 3)))
            pieces.append(piece)
        shared = False
        seen: dict[int, list[Any]] = {}
        for piece in pieces:
            # Open tails up to 500: past any finite piece's last position (< 410), and two
            # tails that ever meet do so before 60 + 35 (the largest lcm of two steps).
            start, stop, step = piece["range"]
            for position in range(start, 500 if stop is None else stop, step):
                for other in seen.get(position, []):
                    apart = "outputs" in piece and "outputs" in other
                    shared |= not (apart and not set(piece["outputs"]) & set(other["outputs"]))
                seen.setdefault(position, []).append(piece)
        try:
            check_disjoint(pieces, "plan")
            refused = False
        except dp.InvalidStateError:
            refused = True
        assert refused == shared, pieces


def test_a_stalled_ranks_state_taken_after_its_takeover_resumes_nothing_twice() -> None:
    pipe = dp.range(120).shuffle().map(abs).shuffle(buffer_size=4)
    first, second = _leased_ranks(pipe, 2, LEASE)
    stalled = iter(second)
    early = {i for _ in range(12) for i in _ids(next(stalled))}
    stall(second)
    survivor = {i for batch in first for i in _ids(batch)}  # took rank 1 over
    assert survivor | early == set(range(120))
    try:
        with pytest.raises(dp.TakeoverCheckpointError, match="lease was taken over"):
            second.state_dict()  # its position names units its taker delivered
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert list(stalled) == []  # its next item: the fence, the epoch's end
        assert [type(w.message) for w in caught] == [dp.LeaseTakenWarning]
        state = dp.merge_states([first.state_dict(), second.state_dict()])
    finally:
        _close([first, second])
    assert {entry["epoch"] for entry in state["ranks"].values()} == {1}  # epoch 0 is over
    shape = Shape("stale", pipe, lambda: (state, set()), _leased_resume(), range(120))
    assert sorted(_bounded(shape, state) or []) == list(range(120))  # epoch 1, whole, once
