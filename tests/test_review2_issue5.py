"""Second adversarial review of issue 5 (fixes 4e091dd and c12aa67).

Most tests here were bugs confirmed when this file was written (each failed then) and
now guard the fixes; the others guard behaviour the review checked and found right.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any

import pytest
import torch

import datapipes as dp
import nodes.stats
from nodes import Context
from nodes.handover import inline_small_tensors
from nodes.stats import StatsNode

# ----- module-level helpers (DataLoader workers pickle them) ---------------------------------

calls: list[int] = []


def counted(x: int) -> int:
    calls.append(x)
    return x


class Tagged(tuple):
    """A tuple subclass that carries an attribute (pickle keeps it: it has a ``__dict__``)."""


class Pair(tuple):
    """A tuple subclass built from its elements as separate arguments."""

    def __new__(cls, *items: Any) -> Pair:
        return super().__new__(cls, items)


class AttrDict(dict):
    """A dict subclass with an attribute."""


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    n: int = 0


def awkward_item(i: int) -> dict[str, Any]:
    tagged = Tagged((torch.full((4,), float(i)), i))
    tagged.source = f"file-{i}"
    gray_chw = torch.arange(12, dtype=torch.uint8).reshape(1, 3, 4) + i
    return {
        "tagged": tagged,
        "pair": Pair(torch.full((3,), float(i)), torch.full((2,), float(i))),
        "hwc": gray_chw.permute(1, 2, 0),  # (3, 4, 1) with strides (4, 1, 12): a plain view
    }


@pytest.fixture(scope="module")
def through_workers() -> tuple[list[Any], list[Any]]:
    """The same items from ``num_workers=0`` and from ``num_workers=2`` (one run each)."""
    pipe = dp.range(4).map(awkward_item)
    return list(dp.Loader(pipe, num_workers=0)), list(dp.Loader(pipe, num_workers=2))


# ----- statistics: counts and states ------------------------------------------------------------


def zip_long_first() -> dp.DataPipe:
    # > 256 items, so the statistics reach their sampled phase (islice runs of 15 items)
    return dp.zip(dp.range(500).map(counted), dp.range(300))


def test_stats_do_not_pull_an_extra_item_from_the_longer_zip_branch() -> None:
    pulled = {}
    for stats in (False, True):
        calls.clear()
        loader = dp.Loader(zip_long_first(), stats=stats)
        assert len(list(loader)) == 300
        pulled[stats] = len(calls)
    assert pulled[True] == pulled[False]  # statistics must not change what the pipeline reads
    rows = {row.step: row.items for row in loader.stats().steps}
    assert rows["map(counted)"] == pulled[False]


def test_checkpoints_are_the_same_with_stats_on_and_off() -> None:
    def pipe() -> dp.DataPipe:
        return dp.mix([dp.zip(dp.range(500), dp.range(300)), dp.range(100)], weights=[3, 1])

    runs = {}
    for stats in (False, True):
        loader = dp.Loader(pipe(), stats=stats)
        items, states = [], []
        for item in loader:
            items.append(item)
            states.append(json.loads(loader.state_dict()["ranks"]["0"]["node"]))
        runs[stats] = items, states
    assert runs[True][0] == runs[False][0]  # the items agree (this part holds)
    differ = [i for i, (a, b) in enumerate(zip(runs[False][1], runs[True][1])) if a != b]
    assert differ == []


def test_stats_node_clear_mid_pass_counts_the_items_after_it() -> None:
    node = StatsNode(dp.range(100).build(Context()), "k", "range(100)")
    node.reset(None)
    assert [next(node) for _ in range(10)] == list(range(10))
    assert node.items == 10
    node.clear()
    assert [next(node) for _ in range(7)] == list(range(10, 17))
    assert node.items == 7


# ----- statistics: sampled seconds -----------------------------------------------------------


class VirtualClock:
    """Stands in for ``perf_counter`` in nodes.stats: time moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_sampled_seconds_are_not_aliased_by_a_power_of_two_fan_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = VirtualClock()

    def expand(x: int) -> list[int]:
        clock.now += 1.0  # one virtual second of work per input item
        return [x] * 16

    monkeypatch.setattr(nodes.stats, "perf_counter", clock)
    loader = dp.Loader(dp.range(1000).flat_map(expand), stats=True)
    assert sum(1 for _ in loader) == 16_000
    stats = loader.stats()
    assert stats.loader_wait_seconds == pytest.approx(1000.0)  # the Loader row times every item
    flat_map = next(s for s in stats.steps if s.step.startswith("flat_map"))
    assert flat_map.items == 16_000
    # The step's own time is all of the work; an unbiased 1-in-16 estimate is close to it.
    assert flat_map.self_seconds == pytest.approx(clock.now, rel=0.5)


# ----- items through DataLoader workers (inline small tensors) ---------------------------------


def test_tuple_subclass_keeps_its_attributes_through_workers(
    through_workers: tuple[list[Any], list[Any]],
) -> None:
    plain, workers = through_workers
    assert [x["tagged"].source for x in plain] == [f"file-{i}" for i in range(4)]
    assert [getattr(x["tagged"], "source", None) for x in workers] == [
        x["tagged"].source for x in plain
    ]


def test_tuple_subclass_with_varargs_new_keeps_its_structure() -> None:
    """apply_to_tensors (to_device, the inline hand-over) builds it with tuple.__new__.

    (Sent to another process, such a class also needs ``__getnewargs__``: plain
    pickle rebuilds a tuple subclass as ``cls.__new__(cls, tuple(self))``, which
    this ``__new__`` would wrap once more. That is the class's pickling, not ours.)
    """
    pair = Pair(torch.zeros(3), torch.ones(2))
    moved = dp.Loader(dp.from_sequence([pair]).map(lambda p: p).to_device("cpu"))
    (got,) = list(moved)
    assert type(got) is Pair and len(got) == 2
    assert torch.equal(got[0], pair[0]) and torch.equal(got[1], pair[1])
    packed = inline_small_tensors(pair)
    assert type(packed) is Pair and len(packed) == 2


def test_inline_tensors_keep_strides_of_size_one_dims(
    through_workers: tuple[list[Any], list[Any]],
) -> None:
    plain, workers = through_workers
    for a, b in zip(plain, workers):
        assert torch.equal(a["hwc"], b["hwc"]) and a["hwc"].dtype == b["hwc"].dtype
        assert b["hwc"].stride() == a["hwc"].stride()


def test_to_device_keeps_dict_subclasses_and_frozen_dataclasses() -> None:
    # Checked and held: the containers the fix names keep type, extras and keys.
    def item(i: int) -> dict[str, Any]:
        extra = AttrDict(x=torch.zeros(2) + i)
        extra.note = "kept"
        default = collections.defaultdict(list, x=torch.zeros(2))
        return {
            "attr": extra,
            "default": default,
            "ordered": collections.OrderedDict([("b", torch.ones(1)), ("a", torch.zeros(1))]),
            "frozen": Frozen(torch.ones(3), 5),
        }

    (moved,) = list(dp.Loader(dp.range(1).map(item).to_device("meta")))
    assert type(moved["attr"]) is AttrDict and moved["attr"].note == "kept"
    assert moved["attr"]["x"].is_meta
    assert type(moved["default"]) is collections.defaultdict
    assert moved["default"].default_factory is list and moved["default"]["x"].is_meta
    assert list(moved["ordered"]) == ["b", "a"] and moved["ordered"]["a"].is_meta
    assert type(moved["frozen"]) is Frozen and moved["frozen"].n == 5 and moved["frozen"].x.is_meta
