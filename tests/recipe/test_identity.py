"""A recipe's identity is its structure, not its display: what moves random orders and what not."""

from __future__ import annotations

import json
from itertools import islice

import pytest
from helpers import SeededDraws

import datapipes as dp
from datapipes.pipe import DataPipe


def double(x):
    return 2 * x


def twice(x):  # double under another name
    return 2 * x


def keep(x):
    return x % 3 != 0


def kept(x):  # keep under another name
    return x % 3 != 0


def take_two_epochs(pipe):
    loader = dp.Loader(pipe, seed=3)
    return [list(loader), list(loader)]


class Renamed(SeededDraws):
    """SeededDraws under another name."""


RENAMED = [
    pytest.param(lambda fn, pred: dp.range(30).map(fn).shuffle(), id="global shuffle after a map"),
    pytest.param(
        lambda fn, pred: dp.range(60).map(fn).filter(pred).shuffle(buffer_size=7),
        id="buffer shuffle after map and filter",
    ),
    pytest.param(
        lambda fn, pred: dp.mix([dp.range(20).map(fn), dp.range(5).filter(pred)], [0.5, 0.5]),
        id="mix of mapped and filtered branches",
    ),
    pytest.param(
        lambda fn, pred: dp.zip(dp.range(9).map(fn).shuffle(), dp.range(9).shuffle()),
        id="zip branches",
    ),
    pytest.param(
        lambda fn, pred: dp.range(6).map(fn).shuffle().repeat(2).filter(pred),
        id="repeat rounds",
    ),
]


@pytest.mark.parametrize("make", RENAMED)
def test_renaming_a_function_leaves_every_shuffle_order_unchanged(make):
    before, after = make(double, keep), make(twice, kept)
    assert take_two_epochs(after) == take_two_epochs(before)
    assert after.fingerprint() != before.fingerprint()  # a checkpoint still names its functions


def test_renaming_a_custom_node_class_leaves_its_random_stream_unchanged():
    before = take_two_epochs(dp.range(5).apply_node(SeededDraws))
    assert take_two_epochs(dp.range(5).apply_node(Renamed)) == before
    assert before[0] != before[1]  # and it does draw anew each epoch


def test_the_display_is_not_the_identity(monkeypatch):
    pipe = dp.range(50).filter(keep).shuffle(buffer_size=5).batch(3)
    orders, fingerprint = take_two_epochs(pipe), pipe.fingerprint()
    monkeypatch.setattr(DataPipe, "describe_step", lambda self: "renamed()")
    assert "renamed()" in repr(pipe)  # the display changed ...
    assert pipe.fingerprint() == fingerprint  # ... and neither identity nor orders did
    assert [[b.tolist() for b in epoch] for epoch in take_two_epochs(pipe)] == [
        [b.tolist() for b in epoch] for epoch in orders
    ]


def base_recipe():
    return dp.range(40).map(double).shuffle(buffer_size=8).batch(4)


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(lambda: dp.range(40).map(double).shuffle(buffer_size=9).batch(4), id="param"),
        pytest.param(
            lambda: dp.range(40).map(double).shuffle(buffer_size=8, seed=1).batch(4), id="seed"
        ),
        pytest.param(
            lambda: dp.range(40).map(double).filter(keep).shuffle(buffer_size=8).batch(4),
            id="an extra step",
        ),
        pytest.param(
            lambda: dp.range(40).shuffle(buffer_size=8).map(double).batch(4), id="reordered"
        ),
        pytest.param(lambda: dp.range(41).map(double).shuffle(buffer_size=8).batch(4), id="data"),
        pytest.param(lambda: dp.range(40).map(twice).shuffle(buffer_size=8).batch(4), id="name"),
    ],
)
def test_the_fingerprint_refuses_a_checkpoint_of_another_structure(other):
    loader = dp.Loader(base_recipe(), seed=0)
    list(islice(loader, 3))
    state = loader.state_dict()
    with pytest.raises(dp.StateMismatchError, match="different recipe"):
        dp.Loader(other(), seed=0).load_state_dict(state)
    resumed = dp.Loader(base_recipe(), seed=0)
    resumed.load_state_dict(state)  # while the same structure resumes
    assert len(list(resumed)) == 10 - 3


def test_data_counts_by_type_and_length_not_contents():
    a = dp.from_sequence(["x", "y", "z"]).shuffle()
    assert a.fingerprint() == dp.from_sequence(["p", "q", "r"]).shuffle().fingerprint()
    assert a.fingerprint() != dp.from_sequence(["x", "y"]).shuffle().fingerprint()
    assert a.fingerprint() != dp.from_sequence(("x", "y", "z")).shuffle().fingerprint()


def test_every_step_kind_and_branch_place_counts():
    keys = {
        dp.range(9).map(keep).shuffle(buffer_size=2)._key(),
        dp.range(9).filter(keep).shuffle(buffer_size=2)._key(),
        dp.range(9).flat_map(keep).shuffle(buffer_size=2)._key(),
        dp.zip(dp.range(9), dp.range(3)).shuffle(buffer_size=2)._key(),
        dp.zip(dp.range(3), dp.range(9)).shuffle(buffer_size=2)._key(),
    }
    assert len(keys) == 5


def test_the_identity_is_plain_data_that_round_trips_through_json():
    pipe = dp.mix(
        [dp.files("memory://a/*.jsonl", token="hunter2").read_jsonl(), dp.range(3)],
        [1, 2],
        seed=4,
    ).batch(2, collate_fn=dp.no_collate)
    identity = pipe.identity()
    assert json.loads(json.dumps(identity)) == identity
    assert "hunter2" not in json.dumps(identity)  # credentials are masked
    assert identity["kwargs"]["collate_fn"] == {"fn": "no_collate"}
    assert pipe.identity(names=False)["kwargs"]["collate_fn"] == "fn"


def test_equal_recipes_hash_equal():
    assert hash(base_recipe()) == hash(base_recipe())
    assert base_recipe() == base_recipe()
    assert len({base_recipe(), base_recipe(), dp.range(3)}) == 2
