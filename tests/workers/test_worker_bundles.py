"""Loader(..., items_per_transfer=K): workers send K items per DataLoader transfer.

The reference order is computed, not written down: each worker's own sequence
(items tagged with the worker that made them, from a run with one item per
transfer) dealt in runs of K, workers in turn, skipping those that ran out.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pytest
import torch

import datapipes as dp
from datapipes.resume.schema import check_envelope, node_digest
from nodes.errors import InvalidStateError
from nodes.workers.bundles import AUTO_BYTES, FailedInBundle, TransferRule, bundles, item_bytes
from nodes.workers.carry import carry
from tests.helpers import file_store

SEED = 5


class Boom(Exception):
    """An exception whose constructor takes two arguments (torch could not rebuild it)."""

    def __init__(self, where: int, why: str) -> None:
        super().__init__(where, why)
        self.where = where


def tag(x: Any) -> tuple[int, Any]:
    """The item with the id of the DataLoader worker that made it."""
    info = torch.utils.data.get_worker_info()
    return (-1 if info is None else info.id, x)


def fail_at_7(x: int) -> int:
    if x == 7:
        raise Boom(x, "seven")
    return x


def plain(value: Any) -> Any:
    """Batches (tensors) as lists, tuples as lists: comparable and hashable via json."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def tagged_pipe(n: int = 53, batch: int = 3) -> dp.DataPipe[Any]:
    # Uneven shares (53 over 2 or 3 workers), a shuffle buffer, a dropped short batch.
    return dp.range(n).shuffle(buffer_size=7).batch(batch, drop_last=True).map(tag)


def runs_of(per_worker: dict[int, list[Any]], workers: int, k: int | str) -> list[Any]:
    """The order transfers give: a transfer's run per worker in turn, skipping ended (a
    transfer of ``k`` items, or as ``"auto"`` closes it: 16 items, or 256 KiB of them)."""
    rule = TransferRule(k)
    queues = {w: list(per_worker.get(w, [])) for w in range(workers)}
    order: list[Any] = []
    while any(queues.values()):
        for w in range(workers):
            count = size = 0
            while queues[w] and not rule.full(count, size):
                item = queues[w].pop(0)
                order.append(item)
                count, size = count + 1, size + item_bytes(item)
    return order


def per_worker(items: list[Any]) -> dict[int, list[Any]]:
    found: dict[int, list[Any]] = {}
    for worker, value in items:
        found.setdefault(worker, []).append((worker, value))
    return found


def run(loader: dp.Loader, limit: int | None = None) -> list[Any]:
    out = []
    for item in loader:
        out.append(plain(item))
        if limit is not None and len(out) == limit:
            break
    return out


# ----- without processes ----------------------------------------------------------------------


def test_bundles_group_items_and_keep_the_short_last_one() -> None:
    assert list(bundles(iter(range(7)), TransferRule(3), 0)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(bundles(iter(range(6)), TransferRule(3), 0)) == [[0, 1, 2], [3, 4, 5]]
    assert list(bundles(iter([]), TransferRule(3), 0)) == []


def test_an_error_mid_bundle_follows_the_items_before_it_and_pickles_as_itself() -> None:
    got = list(bundles(map(fail_at_7, range(10)), TransferRule(4), 1))
    assert [b[:-1] if isinstance(b[-1], FailedInBundle) else b for b in got] == [
        [0, 1, 2, 3],
        [4, 5, 6],
    ]
    mark = got[-1][-1]
    assert isinstance(mark, FailedInBundle)
    # What the main process gets: the worker's exception itself, traceback in its cause.
    again = pickle.loads(pickle.dumps(mark))
    assert isinstance(again.error, Boom) and again.error.where == 7
    assert "DataLoader worker process 1" in str(again.error.__cause__)
    # An error before any item of a bundle is raised as it is (the one-item path).
    with pytest.raises(Boom):
        list(bundles(map(fail_at_7, range(10)), TransferRule(7), 0))


def test_carried_errors_still_rebuild_as_themselves() -> None:
    rebuilt = pickle.loads(pickle.dumps(carry(Boom(3, "x"), 2)))
    assert isinstance(rebuilt, Boom) and rebuilt.args == (3, "x")


def test_bad_values_are_refused_saying_what_to_pass() -> None:
    pipe = dp.range(4)
    for bad in (0, -2):
        with pytest.raises(ValueError, match="items_per_transfer must be an int >= 1"):
            dp.Loader(pipe, num_workers=2, items_per_transfer=bad)
    for bad in (2.0, "4", True, None, "Auto"):
        with pytest.raises(TypeError, match="items_per_transfer must be 'auto' or an int >= 1"):
            dp.Loader(pipe, num_workers=2, items_per_transfer=bad)
    with pytest.raises(ValueError, match="set num_workers > 0"):
        dp.Loader(pipe, items_per_transfer=4)
    leased = {
        "rank": 0,
        "world_size": 2,
        "num_workers": 1,
        "even_batches": False,
        "dispatch": "dynamic",
        "dispatch_lease_seconds": 5,
    }
    with pytest.raises(ValueError, match="dispatch_lease_seconds"):
        dp.Loader(pipe, store=file_store(), items_per_transfer=2, **leased)
    dp.Loader(pipe, items_per_transfer=1)
    assert dp.Loader(pipe).items_per_transfer == 1  # "auto" without workers: one at a time
    assert dp.Loader(pipe, num_workers=2).items_per_transfer == "auto"
    # Leases count a rank's items in transfers: "auto" is one at a time there.
    assert dp.Loader(pipe, store=file_store(), **leased).items_per_transfer == 1


def test_the_topology_records_k_only_when_it_is_not_one() -> None:
    one = dp.Loader(dp.range(4), num_workers=2, items_per_transfer=1).state_dict()
    assert "items_per_transfer" not in one["topology"]
    auto = dp.Loader(dp.range(4), num_workers=2).state_dict()
    assert auto["topology"]["items_per_transfer"] == "auto"
    check_envelope(auto)
    four = dp.Loader(dp.range(4), num_workers=2, items_per_transfer=4).state_dict()
    assert four["topology"]["items_per_transfer"] == 4
    check_envelope(four)
    for bad, workers in ((1, 2), (0, 2), ("4", 2), (4, 0), ("AUTO", 2), ("auto", 0), (4.0, 2)):
        state = json.loads(json.dumps(four))
        state["topology"].update(items_per_transfer=bad, num_workers=workers)
        with pytest.raises(InvalidStateError, match="items_per_transfer"):
            check_envelope(state)


# ----- with worker processes ----------------------------------------------------------------


@pytest.mark.slow
def test_auto_is_16_small_items_a_transfer_and_states_record_it() -> None:
    pipe = tagged_pipe()
    a = dp.Loader(pipe, seed=SEED, num_workers=2)
    b = dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=16)
    assert run(a) == run(b)  # batches of 3 ints: far below 256 KiB in 16
    a, b = dp.Loader(pipe, seed=SEED, num_workers=2), dp.Loader(pipe, seed=SEED, num_workers=2)
    assert run(a, 5) == run(b, 5)
    state = a.state_dict()
    assert state["topology"]["items_per_transfer"] == "auto"
    assert json.dumps(state) == json.dumps(b.state_dict())
    a.close()
    b.close()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_order_is_runs_of_k_per_worker_and_every_item_once(workers: int) -> None:
    pipe = tagged_pipe()
    one = run(dp.Loader(pipe, seed=SEED, num_workers=workers, items_per_transfer=1))
    shares = per_worker([tuple(x) for x in one])
    assert sorted(shares) == list(range(workers))
    for k in (2, 5):
        got = run(dp.Loader(pipe, seed=SEED, num_workers=workers, items_per_transfer=k))
        assert [tuple(x) for x in got] == runs_of(shares, workers, k), k


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("k", [2, 5])
def test_resume_mid_bundle_on_the_same_topology_is_exact(workers: int, k: int) -> None:
    pipe = tagged_pipe()
    options = {"num_workers": workers, "items_per_transfer": k, "snapshot_every_n_steps": 2}
    reference = dp.Loader(pipe, seed=SEED, **options)
    whole = run(reference)
    dropped = reference.dropped()
    assert sum(dropped.values()) == 53 - 3 * len(whole) > 0
    # Offsets 0..k inside a bundle, across the first snapshot, and after a worker ended.
    for stop in sorted({1, k - 1, k, k + 1, 2 * k + 1, len(whole) - 2}):
        loader = dp.Loader(pipe, seed=SEED, **options)
        assert run(loader, stop) == whole[:stop]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        assert state["ranks"]["0"]["node"] is not None
        resumed = dp.Loader(pipe, seed=SEED, **options)
        resumed.load_state_dict(state)
        assert run(resumed) == whole[stop:], (stop, k, workers)
        assert resumed.dropped() == dropped, (stop, k, workers)


def sized(i: int) -> tuple[int, Any]:
    """Item ``i``, tagged with its worker: every 5th holds 100 KiB, every 11th 300 KiB."""
    kib = 300 if i % 11 == 0 else 100 if i % 5 == 0 else 1
    return tag((i, torch.full((kib * 1024,), i % 100, dtype=torch.uint8)))


def digest(item: Any) -> Any:
    worker, (i, pixels) = item
    return [worker, i, int(pixels.numel()), int(pixels[0])]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 3])
def test_auto_closes_transfers_by_the_items_bytes_the_same_in_every_run(workers: int) -> None:
    pipe = dp.range(90).shuffle(buffer_size=6).map(sized)
    one = list(dp.Loader(pipe, seed=SEED, num_workers=workers, items_per_transfer=1))
    expected = [digest(x) for x in runs_of(per_worker(one), workers, "auto")]
    assert expected != [digest(x) for x in one]  # bundles of several items, and of one
    for _ in range(2):
        got = [digest(x) for x in dp.Loader(pipe, seed=SEED, num_workers=workers)]
        assert got == expected


@pytest.mark.slow
def test_auto_resumes_mid_bundle_exactly_and_elsewhere_each_item_once() -> None:
    pipe = dp.range(90).shuffle(buffer_size=6).map(sized)
    options = {"num_workers": 2, "snapshot_every_n_steps": 2}
    whole = [digest(x) for x in dp.Loader(pipe, seed=SEED, **options)]
    for stop in (1, 7, 16, 17, 40, 88):
        loader = dp.Loader(pipe, seed=SEED, **options)
        before = [digest(x) for _, x in zip(range(stop), loader)]
        assert before == whole[:stop]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        resumed = dp.Loader(pipe, seed=SEED, **options)
        resumed.load_state_dict(state)
        assert before + [digest(x) for x in resumed] == whole, stop
        # On another topology: the replayed bundles are closed by the same rule.
        for other in ({"num_workers": 3}, {"num_workers": 0}, {"num_workers": 1}):
            moved = dp.Loader(pipe, seed=SEED, **other)
            moved.load_state_dict(state)
            after = [digest(x)[1] for x in moved]
            assert sorted([d[1] for d in before] + after) == list(range(90)), (stop, other)


@pytest.mark.slow
def test_a_checkpoint_of_one_item_a_transfer_resumes_under_auto_each_item_once() -> None:
    # Saved before "auto" was the default: resumed as on another topology.
    pipe = dp.range(100).shuffle(buffer_size=5).map(tag)
    old = dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=1)
    it = iter(old)
    head = [next(it) for _ in range(10)]
    state = json.loads(json.dumps(old.state_dict()))
    old.close()
    assert "items_per_transfer" not in state["topology"]
    resumed = dp.Loader(pipe, seed=SEED, num_workers=2)
    resumed.load_state_dict(state)
    assert sorted(x for _, x in head + list(resumed)) == list(range(100))
    same = dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=1)
    same.load_state_dict(state)  # the old setting: the old order goes on
    whole = list(dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=1))
    assert head + list(same) == whole


def test_auto_weighs_tensors_arrays_bytes_and_text() -> None:
    rule = TransferRule("auto")
    assert not rule.full(15, AUTO_BYTES - 1) and rule.full(16, 0) and rule.full(1, AUTO_BYTES)
    assert TransferRule(4).full(4, 0) and not TransferRule(4).full(3, 10**9)
    items = [{"x": torch.zeros(40 * 1024, dtype=torch.uint8)} for _ in range(10)]  # 40 KiB
    assert [len(b) for b in bundles(iter(items), rule, 0)] == [7, 3]
    texts = ["a" * 100_000, b"b" * 100_000, bytearray(100_000)]
    assert [len(b) for b in bundles(iter(texts * 2), rule, 0)] == [3, 3]
    assert item_bytes([[[[[torch.zeros(9)]]]]]) == 0  # deeper than 4: not weighed


class Text(str):
    """A str subclass: weighed by the general walk, not the lists-of-text shortcut."""


def weighed_one_by_one(item, depth=4):
    """item_bytes as its docstring states it, entry by entry (the shortcuts must agree)."""
    if isinstance(item, torch.Tensor | np.ndarray):
        return item.nbytes
    if isinstance(item, bytes | bytearray | str | memoryview):
        return len(item)
    if depth <= 0 or not isinstance(item, dict | list | tuple):
        return 0
    values = list(item.values() if isinstance(item, dict) else item)[:1024]
    return sum(weighed_one_by_one(value, depth - 1) for value in values)


@pytest.mark.parametrize(
    "item",
    [
        ["ab", "cde", ""],
        [b"ab", b"c"],
        ("ab", b"cd", 3, None),
        [1, 2.5, True, None],
        [],
        ["x" * 10] * 3000,  # past the first 1,024 entries: not weighed
        [Text("abcd"), "ef"],
        [["ab", "c"], [1, 2], [b"xyz"]],
        {"text": ["ab"] * 256, "id": torch.arange(256), "tags": [["a", "b"]] * 4},
        [np.zeros(3), "ab", bytearray(5)],
    ],
)
def test_item_bytes_shortcuts_weigh_as_the_walk_does(item) -> None:
    # The transfers (and so the order and a resumed run's replay) follow these numbers.
    assert item_bytes(item) == weighed_one_by_one(item)


@pytest.mark.slow
def test_the_next_epoch_and_persistent_workers_keep_the_bundled_order() -> None:
    pipe = tagged_pipe()
    fresh = dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=3)
    kept = dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=3, persistent_workers=True)
    for _ in range(2):
        assert run(fresh) == run(kept)
    fresh.close()
    kept.close()


@pytest.mark.slow
def test_even_batches_over_two_ranks_resume_mid_bundle_exactly() -> None:
    pipe = tagged_pipe(47, 2)
    options = {"world_size": 2, "even_batches": True, "num_workers": 2, "items_per_transfer": 3}
    wholes = [run(dp.Loader(pipe, seed=SEED, rank=r, **options)) for r in (0, 1)]
    assert len(wholes[0]) == len(wholes[1])
    for rank in (0, 1):
        loader = dp.Loader(pipe, seed=SEED, rank=rank, **options)
        assert run(loader, 4) == wholes[rank][:4]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        resumed = dp.Loader(pipe, seed=SEED, rank=rank, **options)
        resumed.load_state_dict(state)
        assert run(resumed) == wholes[rank][4:]


def _items(batches: list[Any]) -> list[int]:
    return sorted(x for _, batch in batches for x in batch)


@pytest.mark.slow
def test_elastic_resume_from_a_bundled_state_delivers_each_item_once() -> None:
    pipe = dp.range(61).shuffle(buffer_size=7).batch(2).map(tag)  # 31 batches, no drop
    everything = list(range(61))
    for stop in (3, 4, 9):  # mid-bundle and on a boundary
        loader = dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=3)
        before = run(loader, stop)
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        assert json.loads(state["ranks"]["0"]["node"])["taken"] == stop % 3
        for workers, k in ((3, 1), (1, 4), (0, 1), (2, 2)):
            resumed = dp.Loader(pipe, seed=SEED, num_workers=workers, items_per_transfer=k)
            resumed.load_state_dict(state)
            after = run(resumed)
            assert _items(before + after) == everything, (stop, workers, k)


@pytest.mark.slow
def test_a_plain_state_resumes_on_bundles_elsewhere_each_item_once() -> None:
    pipe = dp.range(40).shuffle(buffer_size=5).batch(2).map(tag)
    loader = dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=1)
    before = run(loader, 5)
    state = loader.state_dict()
    loader.close()
    resumed = dp.Loader(pipe, seed=SEED, num_workers=3, items_per_transfer=4)
    resumed.load_state_dict(state)
    assert _items(before + run(resumed)) == list(range(40))


@pytest.mark.slow
def test_dynamic_dispatch_with_bundles_is_exactly_once_across_a_resume() -> None:
    pipe = dp.range(90).shuffle(buffer_size=5).batch(2).map(tag)
    everything = list(range(90))
    whole = dp.Loader(
        pipe, seed=SEED, num_workers=2, items_per_transfer=3, dispatch="dynamic",
        store=file_store(), dispatch_unit_items=8,
    )  # fmt: skip
    assert _items(run(whole)) == everything
    whole.close()
    for stop in (4, 7):
        loader = dp.Loader(
            pipe, seed=SEED, num_workers=2, items_per_transfer=3, dispatch="dynamic",
            store=file_store(), dispatch_unit_items=8,
        )  # fmt: skip
        before = run(loader, stop)
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        for options in (
            {"num_workers": 2, "items_per_transfer": 3, "dispatch": "dynamic"},
            {"num_workers": 3, "items_per_transfer": 2, "dispatch": "dynamic"},
            {"num_workers": 1},
        ):
            if options.get("dispatch"):
                options = {**options, "store": file_store(), "dispatch_unit_items": 8}
            resumed = dp.Loader(pipe, seed=SEED, **options)
            resumed.load_state_dict(state)
            assert _items(before + run(resumed)) == everything, (stop, options)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 4])
def test_a_worker_error_mid_bundle_comes_after_the_items_before_it(k: int) -> None:
    pipe = dp.range(12).map(fail_at_7)
    loader = dp.Loader(pipe, num_workers=1, items_per_transfer=k)
    got = []
    with pytest.raises(Boom) as raised:
        for item in loader:
            got.append(item)
    assert got == list(range(7)) and raised.value.where == 7
    assert "DataLoader worker process 0" in str(raised.value.__cause__)
    state = loader.state_dict()
    loader.close()
    # Resumed, the failing item is computed again and fails again: nothing skipped.
    again = dp.Loader(pipe, num_workers=1, items_per_transfer=k)
    again.load_state_dict(state)
    with pytest.raises(Boom):
        next(iter(again))
    again.close()


@pytest.mark.slow
def test_hostile_bundle_positions_are_refused_naming_the_place() -> None:
    pipe = tagged_pipe()
    loader = dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=3)
    run(loader, 4)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    for bad in (3, -1, "1", None):
        broken = json.loads(json.dumps(state))
        node = json.loads(broken["ranks"]["0"]["node"])
        text = json.dumps({**node, "taken": bad})  # as a hostile writer would, digest and all
        broken["ranks"]["0"].update(node=text, digest=node_digest(text))
        with pytest.raises(InvalidStateError, match="taken"):
            dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=3).load_state_dict(broken)
    # A bundled position in a state that says one item per transfer: an unknown key.
    broken = json.loads(json.dumps(state))
    del broken["topology"]["items_per_transfer"]
    with pytest.raises(InvalidStateError, match="taken"):
        dp.Loader(pipe, seed=SEED, num_workers=2).load_state_dict(broken)


@pytest.mark.slow
def test_hostile_auto_positions_are_refused_naming_the_place() -> None:
    pipe = dp.range(90).shuffle(buffer_size=6).map(sized)
    loader = dp.Loader(pipe, seed=SEED, num_workers=2)  # items_per_transfer="auto"
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()

    def edited(**changes: Any) -> dict[str, Any]:
        broken = json.loads(json.dumps(state))
        node = json.loads(broken["ranks"]["0"]["node"])
        text = json.dumps({**node, **changes})  # as a hostile writer would, digest and all
        broken["ranks"]["0"].update(node=text, digest=node_digest(text))
        return broken

    # "auto" holds up to 16 items a transfer: 16 taken is past any transfer.
    for bad in ({"taken": 16}, {"items_per_transfer": 16}, {"items_per_transfer": "AUTO"}):
        with pytest.raises(InvalidStateError, match="taken|items_per_transfer"):
            dp.Loader(pipe, seed=SEED, num_workers=2).load_state_dict(edited(**bad))
    # The topology says K = 4, the position says "auto": refused, never read as either.
    broken = edited()
    broken["topology"]["items_per_transfer"] = 4
    with pytest.raises(InvalidStateError, match="items_per_transfer"):
        dp.Loader(pipe, seed=SEED, num_workers=2, items_per_transfer=4).load_state_dict(broken)
