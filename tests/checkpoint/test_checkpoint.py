"""datapipes.resume: the Loader state's envelope, its graph record, and reading it back
by what the nodes say their states hold (Node.upstream_states), never by guessing from keys."""

from __future__ import annotations

import json
from itertools import islice
from typing import Any

import pytest

import datapipes as dp
from datapipes.inspect import describe_checkpoint
from datapipes.inspect.tree import RecipeGraph
from datapipes.resume import graph_record as checkpoint  # the graph record and raw readers
from datapipes.resume.parse import STATE_VERSION
from nodes import UPSTREAM, ConcatNode, MapNode, Node, ZipNode


def state_after(pipe: dp.DataPipe[Any], items: int, **options: Any) -> dict[str, Any]:
    loader = dp.Loader(pipe, seed=4, **options)
    list(islice(loader, items))
    state = loader.state_dict()
    loader.close()
    return json.loads(json.dumps(state))  # as a checkpoint file gives it back


def levels(state: dict[str, Any], rank: str = "0") -> list[tuple[int, str, str | None]]:
    """(depth, key, kind) of each level of ``rank``'s node state, by the recorded graph."""
    mine = checkpoint.decode_state(state)["ranks"][rank]
    graph = RecipeGraph(mine["graph"])
    return [(level.depth, level.key, level.kind) for level in graph.levels(mine["node"])]


def is_even(x: int) -> bool:
    return x % 2 == 0


def pair(x: int) -> list[int]:
    return [x, x]


def test_each_rank_entry_holds_epoch_node_and_the_graph_made_once():
    pipe = dp.range(20).shuffle(buffer_size=4).batch(2)
    loader = dp.Loader(pipe, seed=1)
    fresh = loader.state_dict()
    assert fresh["version"] == STATE_VERSION == 5
    unbuilt = {"epoch": 0, "node": None, "digest": None, "graph": None}  # not built yet
    assert fresh["ranks"] == {"0": unbuilt}

    list(islice(loader, 3))
    first, second = loader.state_dict(), loader.state_dict()

    graph = first["ranks"]["0"]["graph"]
    assert second["ranks"]["0"]["graph"] is graph  # recorded once, not per state
    assert json.loads(graph) == {
        "kind": "batch",
        "type": "nodes.steps.batch.BatchNode",
        "step": ".batch(2)",
        "inputs": [
            {
                "kind": "buffer shuffle",
                "type": "nodes.steps.shuffle.BufferShuffleNode",
                "step": ".shuffle(buffer_size=4)",
                "inputs": [
                    {
                        "kind": "sequence source",
                        "type": "nodes.sources.sequence.SequenceNode",
                        "step": "dp.range(20)",
                    }
                ],
            }
        ],
    }
    resumed = dp.Loader(pipe, seed=1)
    resumed.load_state_dict(first)
    assert resumed.state_dict() == first  # loaded, not yet run: the same state, graph included
    loader.close()


def test_the_graph_record_is_the_same_with_statistics_on_or_off():
    pipe = dp.range(30).map(abs).shuffle(buffer_size=5).batch(3)
    graphs = {on: state_after(pipe, 4, stats=on)["ranks"]["0"]["graph"] for on in (False, True)}
    assert graphs[True] == graphs[False]


def test_every_built_in_node_nests_its_inputs_state_where_it_says():
    numbers = dp.from_iterable(lambda: iter(range(60))).shard()
    pipe = (
        dp.concat(
            dp.range(2),
            dp.mix(
                [
                    dp.range(40).shuffle(buffer_size=4).take(30).repeat(2),
                    dp.zip(numbers, dp.range(60).filter(is_even)).flat_map(list),
                ],
                [1, 1],
            ).map(abs, num_workers=2),
            dp.from_sequence([{"cls": b"1"}, {"cls": b"2"}]).decode(),
        )
        .batch(2)
        .prefetch(2)
    )

    state = state_after(pipe, 9)

    assert levels(state) == [
        (0, "", "concat"),
        (1, UPSTREAM, "parallel map"),
        (2, UPSTREAM, "mix"),
        (3, f"{UPSTREAM}[0]", "repeat"),
        (4, UPSTREAM, "take"),
        (5, UPSTREAM, "buffer shuffle"),
        (6, UPSTREAM, "sequence source"),
        (3, f"{UPSTREAM}[1]", "flat_map"),
        (4, UPSTREAM, "zip"),
        (5, f"{UPSTREAM}[0]", "shard"),
        (6, UPSTREAM, "iterable source"),
        (5, f"{UPSTREAM}[1]", "sequence source"),
    ]
    # concat: the running input's state is that input's, whatever its index
    assert ConcatNode.upstream_states({"index": 1, UPSTREAM: {"x": 1}}) == [(1, {"x": 1})]
    assert ConcatNode.upstream_states({"index": 3, UPSTREAM: None}) == []
    both = {UPSTREAM: [{"a": 1}, {"b": 2}]}
    assert ZipNode.upstream_states(both) == [(0, {"a": 1}), (1, {"b": 2})]
    kept = {"position": 3}
    assert MapNode.upstream_states(kept)[0][1] is kept  # its state is its input's


class Opaque(Node):
    """A custom node keeping its input's state under a key of its own choosing."""

    def __init__(self, upstream: Node) -> None:
        super().__init__(upstream)
        self.upstream = upstream

    def reset(self, state=None):
        self.upstream.reset(None if state is None else state["up"])
        self.count = 0 if state is None else state["count"]

    def __next__(self):
        self.count += 1
        return next(self.upstream)

    def state_dict(self):
        return {"up": self.upstream.state_dict(), "count": self.count}


class Nesting(Opaque):
    """The same, with its input's state under nodes.UPSTREAM: its levels are followed."""

    kind = "nesting"

    def reset(self, state=None):
        self.upstream.reset(None if state is None else state[UPSTREAM])
        self.count = 0 if state is None else state["count"]

    def state_dict(self):
        return {UPSTREAM: self.upstream.state_dict(), "count": self.count}


def test_a_custom_node_is_named_by_its_class_and_nested_only_through_upstream():
    opaque = state_after(dp.range(10).shuffle(buffer_size=3).apply_node(Opaque), 4)
    nesting = state_after(dp.range(10).shuffle(buffer_size=3).apply_node(Nesting), 4)

    assert levels(opaque) == [(0, "", "Opaque")]  # one level: nothing guessed from "up"
    assert levels(nesting) == [
        (0, "", "nesting"),
        (1, UPSTREAM, "buffer shuffle"),
        (2, UPSTREAM, "sequence source"),
    ]
    text = describe_checkpoint(opaque)
    assert ".apply_node(Opaque) (Opaque): up={" in text and "count=4" in text


def test_a_recipe_that_builds_another_graph_than_the_recorded_one_is_flagged():
    pipe = dp.range(50).shuffle(buffer_size=6).batch(5)
    state = state_after(pipe, 2)
    assert "! the recipe" not in describe_checkpoint(state, pipe)
    record = json.loads(state["ranks"]["0"]["graph"])
    record["inputs"][0]["kind"] = "something else"  # as if another datapipes had saved it
    state["ranks"]["0"]["graph"] = json.dumps(record)

    text = describe_checkpoint(state, pipe)

    assert (
        "! the recipe has a BufferShuffleNode (buffer shuffle) here, but the checkpoint's state "
        "here was taken by a something else node" in text
    )


def test_an_older_state_is_read_but_marked():
    state = state_after(dp.range(10).batch(2), 1)
    old = {**state, "version": 3}
    text = describe_checkpoint(old)
    assert "! saved by an older datapipes; a version 5 Loader refuses it" in text
    with pytest.raises(dp.StateMismatchError, match="older datapipes"):
        dp.Loader(dp.range(10).batch(2), seed=4).load_state_dict(old)


def test_the_state_errors_are_one_class_by_every_import_path() -> None:
    from datapipes.loader.loader import InvalidStateError, StateMismatchError
    from datapipes.loader.loader import InvalidStateError as FromLoader
    from datapipes.loader.loader import StateMismatchError as MismatchFromLoader
    from nodes.errors import InvalidStateError as FromNodes
    from nodes.errors import StateMismatchError as MismatchFromNodes

    assert dp.InvalidStateError is InvalidStateError is FromLoader is FromNodes
    assert dp.StateMismatchError is StateMismatchError is MismatchFromLoader is MismatchFromNodes
    assert issubclass(dp.InvalidStateError, dp.StateMismatchError)
    assert "InvalidStateError" in dp.__all__
    error = dp.InvalidStateError('ranks["0"].node.position', "an int in [0, 10]", 11)
    assert (error.path, error.expected) == ('ranks["0"].node.position', "an int in [0, 10]")
    assert 'ranks["0"].node.position: expected an int in [0, 10], found 11' in str(error)


def test_the_envelope_is_checked_before_the_recipe_and_the_setup() -> None:
    loader = dp.Loader(dp.range(8))
    next(iter(loader))
    state = loader.state_dict()
    other = dp.Loader(dp.range(9))  # another recipe: a malformed state says what is malformed
    with pytest.raises(dp.InvalidStateError, match=r'ranks\["0"\]\.epoch'):
        other.load_state_dict({**state, "ranks": {"0": {**state["ranks"]["0"], "epoch": "1"}}})
    with pytest.raises(dp.StateMismatchError, match="different recipe") as refused:
        other.load_state_dict(state)
    assert not isinstance(refused.value, dp.InvalidStateError)
    with pytest.raises(dp.StateMismatchError, match="Pass seed=0"):
        dp.Loader(dp.range(8), seed=1).load_state_dict(state)
    assert checkpoint.node_path(3) == 'ranks["3"].node'


def test_a_whole_training_checkpoint_is_refused_pointing_at_the_loaders_entry():
    loader = dp.Loader(dp.range(4))
    whole = {"model": {"w": 1}, "data": loader.state_dict()}
    with pytest.raises(dp.StateMismatchError, match=r"whole checkpoint.*'data'"):
        dp.Loader(dp.range(4)).load_state_dict(whole)
    with pytest.raises(dp.StateMismatchError, match=r"no Loader state in it.*'model'"):
        dp.Loader(dp.range(4)).load_state_dict({"model": {}})
